//! The NoCloud seed read back by independent readers: xorriso and blkid
//! from Debian (`apt-get install xorriso util-linux`).

use std::path::{Path, PathBuf};
use std::process::Command;

use capl_host::cloud_init::{meta_data, nocloud_iso};

const USER_DATA: &[u8] = b"#cloud-config\nruncmd:\n  - [ sh, -c, 'echo \"hello\" > /tmp/x' ]\n";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("capl-host-iso-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}): install it with apt-get install xorriso util-linux"));
    assert!(output.status.success(), "{program} {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

fn write_iso(dir: &Path, user_data: &[u8], meta: &str) -> PathBuf {
    let path = dir.join("seed.iso");
    std::fs::write(&path, nocloud_iso(user_data, meta.as_bytes())).unwrap();
    path
}

#[test]
fn xorriso_lists_exactly_the_two_files_with_exact_names() {
    let dir = scratch("list");
    let iso = write_iso(&dir, USER_DATA, &meta_data("5d0f6c2e-8a47-4c1b-9a53-0c2d7e4b8f10", "worker-0"));
    let listing = run("xorriso", &["-indev", iso.to_str().unwrap(), "-find", "/", "-type", "f"]);
    let mut files: Vec<&str> = listing.lines().filter(|l| l.starts_with("'/")).collect();
    files.sort();
    assert_eq!(files, vec!["'/meta-data'", "'/user-data'"], "xorriso said:\n{listing}");
    // xorriso loads the image without complaint: no WARNING, SORRY, FAILURE or FATAL messages.
    let complaints: Vec<&str> = listing
        .lines()
        .filter(|l| ["WARNING", "SORRY", "FAILURE", "FATAL", "MISHAP"].iter().any(|s| l.contains(&format!(": {s} :"))))
        .collect();
    assert!(complaints.is_empty(), "xorriso complained:\n{listing}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn xorriso_reads_label_and_exact_content() {
    let dir = scratch("content");
    let meta = meta_data("5d0f6c2e-8a47-4c1b-9a53-0c2d7e4b8f10", "worker-0");
    let iso = write_iso(&dir, USER_DATA, &meta);
    let pvd = run("xorriso", &["-indev", iso.to_str().unwrap(), "-pvd_info"]);
    assert!(pvd.lines().any(|l| l.starts_with("Volume Id") && l.trim_end().ends_with(": cidata")), "{pvd}");
    let out = dir.join("out");
    run("xorriso", &["-osirrox", "on", "-indev", iso.to_str().unwrap(), "-extract", "/", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out.join("user-data")).unwrap(), USER_DATA);
    assert_eq!(std::fs::read_to_string(out.join("meta-data")).unwrap(), meta);
    let mut extracted: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    extracted.sort();
    assert_eq!(extracted, vec!["meta-data", "user-data"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn blkid_sees_an_iso9660_labelled_cidata() {
    let dir = scratch("blkid");
    let iso = write_iso(&dir, USER_DATA, &meta_data("u", "worker-0"));
    let probe = run("blkid", &["-p", "-o", "export", iso.to_str().unwrap()]);
    assert!(probe.lines().any(|l| l == "TYPE=iso9660"), "{probe}");
    assert!(probe.lines().any(|l| l == "LABEL=cidata"), "{probe}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn large_and_empty_user_data_round_trip() {
    let dir = scratch("sizes");
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    for (label, user_data) in [("big", big.as_slice()), ("empty", &b""[..])] {
        let iso = write_iso(&dir, user_data, "instance-id: i\n");
        let out = dir.join(label);
        run("xorriso", &["-osirrox", "on", "-indev", iso.to_str().unwrap(), "-extract", "/", out.to_str().unwrap()]);
        assert_eq!(std::fs::read(out.join("user-data")).unwrap(), user_data, "{label}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
