//! Container images built on this machine, with no registry: the
//! containerized libvirtd of the tests (`cargo xtask libvirtd-image`) and the
//! manager image without base images to pull (`cargo xtask docker-build
//! --offline`), and the checks every manager image must pass.
//!
//! # The containerized libvirtd
//! `hack/libvirtd-image/rootfs.sh` makes a Debian bookworm root filesystem
//! with mmdebstrap (libvirt and QEMU from bookworm-backports, the versions the
//! private host daemon runs), with the configuration and start script of
//! `hack/libvirtd-image` and the `qemu.conf` of every private libvirtd
//! ([`private_libvirtd::QEMU_CONF`]), and `docker import` turns it into
//! [`LIBVIRTD_IMAGE_NAME`]`:<key>`, where the key hashes that `qemu.conf` and
//! every file of that directory: a change rebuilds it, and an image already in
//! the engine is reused. The tests start it with testcontainers
//! (`testenv::container_libvirtd`).
//!
//! # The manager image, offline
//! The online `Dockerfile` starts from `rust`, `debian` and distroless images
//! a registry serves. Offline, the build stage is this machine (the pinned
//! toolchain builds the release binary), and the runtime image is assembled
//! from files, the same set distroless/cc gives plus what libvirt loads: the
//! binary as `/manager`, every shared library it loads as this machine's
//! loader resolves them (`hack/copy-runtime-libs.sh --all`, glibc and the
//! loader included), CA certificates, `passwd`/`group` entries for root and
//! `nonroot` (65532), a `/tmp` and the `nonroot` home; `docker import` sets
//! `USER 65532:65532` and `ENTRYPOINT ["/manager"]` as the Dockerfile does.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use crate::{docker_engine, repo_root, short_hash, target_dir};

use capl_testbed::control_plane_versions as versions;
use capl_testbed::private_libvirtd;
use versions::{CAPI_RELEASE_REGISTRY, CAPI_VERSION};

/// The repository (name) of the containerized libvirtd image; its tag is the key of its inputs.
pub const LIBVIRTD_IMAGE_NAME: &str = "capl.local/libvirtd";
/// The manager image `cargo xtask test` builds offline and checks.
pub const TEST_MANAGER_IMAGE: &str = "capl.local/cluster-api-provider-libvirt:test";

/// `cargo xtask libvirtd-image`: builds the image when the engine lacks it; prints its name.
pub fn libvirtd_image_command() -> Result<()> {
    docker_engine::up()?;
    println!("{}", libvirtd_image()?);
    Ok(())
}

/// The containerized libvirtd's image, built unless the engine has it (needs an engine).
pub fn libvirtd_image() -> Result<String> {
    let hack = repo_root().join("hack/libvirtd-image");
    let image = format!("{LIBVIRTD_IMAGE_NAME}:{}", dir_key(&hack, &[private_libvirtd::QEMU_CONF])?);
    let sh = Shell::new()?;
    if image_exists(&sh, &image) {
        eprintln!("libvirtd-image: {image} is in the engine");
        return Ok(image);
    }
    let started = Instant::now();
    let work = target_dir().join("tmp/libvirtd-image");
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let tar = work.join("rootfs.tar");
    let log = work.join("mmdebstrap.log");
    let qemu_conf = work.join("qemu.conf");
    fs::write(&qemu_conf, private_libvirtd::QEMU_CONF).with_context(|| format!("writing {}", qemu_conf.display()))?;
    let script = hack.join("rootfs.sh");
    eprintln!("libvirtd-image: building {image} with mmdebstrap (log {})", log.display());
    let out = cmd!(sh, "sh {script} {hack} {qemu_conf} {tar}").quiet().ignore_status().output()?;
    fs::write(&log, [out.stdout.as_slice(), out.stderr.as_slice()].concat())?;
    if !out.status.success() {
        let text = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = text.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
        bail!("mmdebstrap failed for {image} ({}); the end of {}:\n{}", out.status, log.display(), tail.join("\n"));
    }
    let entrypoint = r#"ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/capl-libvirtd-start"]"#;
    import(&sh, &tar, &image, &[entrypoint])?;
    fs::remove_file(&tar)?;
    eprintln!("libvirtd-image: built {image} in {:.0?}", started.elapsed());
    Ok(image)
}

/// `docker import` of a root filesystem tarball as `image`, with Dockerfile
/// instructions; the image that had that name before is removed (when no
/// container uses it), so rebuilds leave no unnamed images behind.
fn import(sh: &Shell, tar: &Path, image: &str, changes: &[&str]) -> Result<()> {
    let format = "{{.Id}}";
    let before = cmd!(sh, "docker image inspect --format {format} {image}").quiet().ignore_stderr().read().ok();
    let changes: Vec<String> = changes.iter().flat_map(|c| ["--change".to_string(), (*c).to_string()]).collect();
    cmd!(sh, "docker import {changes...} {tar} {image}")
        .quiet()
        .ignore_stdout()
        .run()
        .with_context(|| format!("docker import of {} as {image}", tar.display()))?;
    let after = cmd!(sh, "docker image inspect --format {format} {image}").quiet().read()?;
    if let Some(old) = before.filter(|old| *old != after) {
        let _ = cmd!(sh, "docker rmi {old}").quiet().ignore_stdout().ignore_stderr().run();
    }
    Ok(())
}

/// The cache key of an image made from the files of `dir` (names and
/// contents, in name order) and `extras` (versions), which come first.
pub fn dir_key(dir: &Path, extras: &[&str]) -> Result<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    let mut inputs: Vec<String> = extras.iter().map(|e| (*e).to_string()).collect();
    for name in names {
        let text = fs::read_to_string(dir.join(&name)).with_context(|| format!("reading {}/{name}", dir.display()))?;
        inputs.push(name);
        inputs.push(text);
    }
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    Ok(short_hash(&refs))
}

/// Whether the engine has `image`.
pub fn image_exists(sh: &Shell, image: &str) -> bool {
    cmd!(sh, "docker image inspect {image}").quiet().ignore_stdout().ignore_stderr().run().is_ok()
}

/// `cargo xtask docker-build --offline`: the manager image from this machine's build and files.
pub fn build_provider_offline(image: &str) -> Result<()> {
    let started = Instant::now();
    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    cmd!(sh, "cargo build --release --locked -p cluster-api-provider-libvirt --bin cluster-api-provider-libvirt")
        .run()
        .context("building the release manager")?;
    let binary = target_dir().join("release/cluster-api-provider-libvirt");
    let libvirt = libvirt_client_library()?;
    manager_image(&sh, &binary, &[libvirt.as_path()], image, "provider-image", &[])?;
    check_provider_image(image)?;
    eprintln!("docker-build --offline: built and checked {image} in {:.0?}", started.elapsed());
    Ok(())
}

/// The libvirt client library the manager links, resolved to its file.
fn libvirt_client_library() -> Result<PathBuf> {
    fs::canonicalize("/usr/lib/x86_64-linux-gnu/libvirt.so.0")
        .context("libvirt.so.0 is not installed here: run `cargo xtask host deps`")
}

/// The value of label `key` on `image`, if the engine has the image.
fn image_label(sh: &Shell, image: &str, key: &str) -> Option<String> {
    let format = format!("{{{{index .Config.Labels \"{key}\"}}}}");
    let have = cmd!(sh, "docker image inspect --format {format} {image}").quiet().ignore_stderr().read().ok()?;
    Some(have.trim().to_string())
}

/// The previous release's manager image, made from its manager `binary`
/// like the current one and checked the same way; rebuilt only when the
/// image's label names another commit.
pub fn previous_manager_image(binary: &Path, image: &str, commit: &str) -> Result<()> {
    let sh = Shell::new()?;
    if image_label(&sh, image, "io.capl.commit").as_deref() == Some(commit) {
        return Ok(());
    }
    let libvirt = libvirt_client_library()?;
    let label = format!("LABEL io.capl.commit={commit}");
    manager_image(&sh, binary, &[libvirt.as_path()], image, "previous-provider-image", &[&label])?;
    check_provider_image(image)
}

/// An image of one static program `binary` (no shared libraries), named `image`.
pub fn binary_image(binary: &Path, image: &str) -> Result<()> {
    let sh = Shell::new()?;
    let work_name = format!("binary-image-{}", short_hash(&[image]));
    manager_image(&sh, binary, &[], image, &work_name, &[])
}

/// CAPI core's and the kubeadm providers' images, made the same way from the
/// managers `cargo xtask control-plane build` built, under the names their
/// release components use (`registry.k8s.io/cluster-api/<image>:<version>`), so
/// `clusterctl init` in a kind cluster finds them loaded. Returns their names.
pub fn capi_images(control_plane_dir: &Path) -> Result<Vec<String>> {
    let sh = Shell::new()?;
    let mut names = Vec::new();
    for (provider_image, binary) in [
        ("cluster-api-controller", "capi-manager"),
        ("kubeadm-bootstrap-controller", "capi-kubeadm-bootstrap-manager"),
        ("kubeadm-control-plane-controller", "capi-kubeadm-control-plane-manager"),
    ] {
        let binary = control_plane_dir.join(binary);
        let stamp = fs::metadata(&binary)
            .and_then(|m| m.modified())
            .with_context(|| format!("{} is missing: run `cargo xtask control-plane build`", binary.display()))?;
        let image = format!("{CAPI_RELEASE_REGISTRY}/{provider_image}:{CAPI_VERSION}");
        // Rebuilt when the binary's mtime differs from what the image's label says.
        let secs = stamp.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0).to_string();
        if image_label(&sh, &image, "io.capl.binary-mtime").as_deref() != Some(secs.as_str()) {
            let label = format!("LABEL io.capl.binary-mtime={secs}");
            manager_image(&sh, &binary, &[], &image, "capi-image", &[&label])?;
        }
        names.push(image);
    }
    Ok(names)
}

/// An image of one manager binary with no base: `/manager`, every shared
/// library it (and `extra_libs`) load, CA certificates, `passwd`/`group`
/// with `nonroot` (65532), `/tmp`; `USER 65532:65532`, `ENTRYPOINT ["/manager"]`.
fn manager_image(
    sh: &Shell,
    binary: &Path,
    extra_libs: &[&Path],
    image: &str,
    work_name: &str,
    more_changes: &[&str],
) -> Result<()> {
    let work = target_dir().join("tmp").join(work_name);
    let root = work.join("rootfs");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    fs::create_dir_all(root.join("etc/ssl/certs"))?;
    fs::copy(binary, root.join("manager")).with_context(|| format!("copying {}", binary.display()))?;
    let copy = repo_root().join("hack/copy-runtime-libs.sh");
    let copied = cmd!(sh, "sh {copy} --all {root} {binary} {extra_libs...}")
        .quiet()
        .read()
        .context("copying shared libraries")?;
    eprintln!("{image}: {} shared libraries", copied.lines().count());
    fs::copy("/etc/ssl/certs/ca-certificates.crt", root.join("etc/ssl/certs/ca-certificates.crt"))
        .context("copying /etc/ssl/certs/ca-certificates.crt (install ca-certificates)")?;
    fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )?;
    fs::write(root.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n")?;
    for dir in ["tmp", "home/nonroot"] {
        fs::create_dir_all(root.join(dir))?;
    }
    let (scratch, home) = (root.join("tmp"), root.join("home/nonroot"));
    cmd!(sh, "chmod 1777 {scratch}").run()?;
    cmd!(sh, "chown 65532:65532 {home}").run()?;
    let tar = work.join("rootfs.tar");
    cmd!(sh, "tar --numeric-owner -C {root} -cf {tar} .").run()?;
    docker_engine::up()?;
    let mut changes = vec!["USER 65532:65532", r#"ENTRYPOINT ["/manager"]"#];
    changes.extend_from_slice(more_changes);
    import(sh, &tar, image, &changes)?;
    fs::remove_dir_all(&work)?;
    Ok(())
}

/// What every manager image must do, however it was built: run as nonroot
/// (65532), start and answer `--help` on a read-only root filesystem, and
/// link libvirt.so.0 with every library it needs inside the image.
pub fn check_provider_image(image: &str) -> Result<()> {
    let sh = Shell::new()?;
    let format = "{{.Config.User}}";
    let user = cmd!(sh, "docker image inspect --format {format} {image}").quiet().read()?;
    if user.trim() != "65532:65532" {
        bail!("{image} runs as user {:?}, not nonroot (65532:65532)", user.trim());
    }
    let help = cmd!(sh, "docker run --rm --read-only --network none {image} --help")
        .quiet()
        .read()
        .with_context(|| format!("{image} did not start with --help"))?;
    if !help.contains("Cluster API infrastructure provider for libvirt") {
        bail!("{image} --help did not print the manager's usage:\n{help}");
    }
    let id = cmd!(sh, "docker run --rm --read-only --network none --entrypoint /manager {image} --version")
        .quiet()
        .read()?;
    // The loader inside the image lists what the manager loads and where from.
    let loader = "/lib64/ld-linux-x86-64.so.2";
    let libs = cmd!(sh, "docker run --rm --network none --entrypoint {loader} {image} --list /manager")
        .quiet()
        .read()
        .with_context(|| format!("listing the manager's libraries with {loader} inside {image}"))?;
    if libs.contains("not found") || !libs.contains("libvirt.so.0 => ") {
        bail!("{image}: the manager does not find every library (libvirt.so.0 among them):\n{libs}");
    }
    eprintln!(
        "image check: {image} runs as 65532:65532, starts read-only ({}), loads libvirt.so.0 and {} libraries in all",
        id.trim(),
        libs.lines().count()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use xshell::{Shell, cmd};

    use crate::repo_root;

    /// The packages the manager's normal dependencies pull in, with `features`.
    fn manager_dependencies(features: &[&str]) -> String {
        let sh = Shell::new().expect("a shell");
        sh.change_dir(repo_root());
        let features: Vec<String> = features.iter().map(|f| format!("--features={f}")).collect();
        cmd!(sh, "cargo tree --offline --locked -p cluster-api-provider-libvirt -e normal --prefix none {features...}")
            .quiet()
            .read()
            .expect("cargo tree of the manager")
    }

    /// The release build (the manager image: `cargo build --release` with no
    /// features) links no simulated host; the `sim` feature of the demo, the
    /// benchmarks and the tests does.
    #[test]
    fn the_release_manager_has_no_simulator() {
        let release = manager_dependencies(&[]);
        assert!(release.contains("capl-host"), "{release}");
        assert!(!release.contains("libvirt-sim"), "the release manager depends on libvirt-sim:\n{release}");
        assert!(manager_dependencies(&["sim"]).contains("libvirt-sim"), "the sim feature must add the simulator");
    }
}
