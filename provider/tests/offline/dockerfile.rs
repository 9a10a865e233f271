//! The image carries every shared library the manager loads.
//!
//! No docker engine runs here, so the image is not built; instead the
//! Dockerfile's own library-copying step runs on this machine's build of the
//! manager binary, and the result is compared with what `ldd` says the binary
//! and libvirt.so.0 need.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// sonames `ldd` resolves for a binary (its whole closure).
fn ldd(binary: &Path) -> BTreeSet<String> {
    let output = Command::new("ldd").arg(binary).output().expect("ldd runs (package libc-bin)");
    assert!(output.status.success(), "ldd {}: {}", binary.display(), String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(!text.contains("not found"), "unresolved libraries for {}:\n{text}", binary.display());
    text.lines().filter(|l| l.contains("=> /")).map(|l| l.split_whitespace().next().unwrap().to_string()).collect()
}

/// Libraries gcr.io/distroless/cc-debian13 ships (libc6, libgcc-s1, libstdc++6).
const DISTROLESS_CC: &[&str] = &[
    "ld-linux-x86-64.so.2",
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libresolv.so.2",
    "libutil.so.1",
    "libanl.so.1",
    "libgcc_s.so.1",
    "libstdc++.so.6",
];

#[test]
fn the_image_copies_every_library_the_manager_needs() {
    let manager = PathBuf::from(env!("CARGO_BIN_EXE_cluster-api-provider-libvirt"));
    let needed = ldd(&manager);
    assert!(needed.contains("libvirt.so.0"), "the manager links libvirt.so.0: {needed:?}");

    let out = std::env::temp_dir().join(format!("capl-rootfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let libvirt = std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libvirt.so.0").expect("libvirt.so.0 installed");
    let status = Command::new(repo_root().join("hack/copy-runtime-libs.sh"))
        .arg(&out)
        .arg(&manager)
        .arg(&libvirt)
        .status()
        .unwrap();
    assert!(status.success());

    let mut copied = BTreeSet::new();
    for dir in ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib"] {
        if let Ok(entries) = std::fs::read_dir(out.join(dir)) {
            copied.extend(entries.map(|e| e.unwrap().file_name().to_string_lossy().to_string()));
        }
    }
    let missing: Vec<_> =
        needed.iter().filter(|s| !DISTROLESS_CC.contains(&s.as_str()) && !copied.contains(*s)).collect();
    assert!(missing.is_empty(), "the image would lack {missing:?}");
    assert!(copied.contains("libvirt.so.0"));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_dockerfile_runs_the_copy_step_on_trixie_and_distroless() {
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).unwrap();
    assert!(dockerfile.contains("FROM gcr.io/distroless/cc-debian13:nonroot"));
    assert!(dockerfile.contains("debian:trixie-slim"));
    assert!(dockerfile.contains("/copy-runtime-libs.sh /rootfs /manager"));
    assert!(dockerfile.contains("COPY --from=runtime-libs /rootfs/ /"));
    // Both architectures of the release workflow find their libvirt.so.0.
    assert!(dockerfile.contains("ARG TARGETARCH"));
    for (arch, triplet) in [("amd64", "x86_64-linux-gnu"), ("arm64", "aarch64-linux-gnu")] {
        assert!(dockerfile.contains(&format!("{arch}) triplet={triplet} ;;")), "no libvirt path for {arch}");
    }
    for line in dockerfile.lines().filter(|l| l.starts_with("FROM ")) {
        assert!(line.contains("trixie") || line.contains("debian13"), "every stage is Debian 13: {line}");
    }
}
