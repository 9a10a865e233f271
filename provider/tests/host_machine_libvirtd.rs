//! The host scenarios on a real libvirtd: the private test daemon started by
//! `cargo xtask host up`, whose URI is in `CAPL_TEST_LIBVIRT_URI`, with the
//! network `capl-test-net` and the pools `capl-test-base` and `capl-test-disks`.
//! Domains are `type='qemu'` (TCG): KVM does not work on the test machines.
//! The base image `capl-host-tests-base.qcow2` (64 MiB, empty: the guests need
//! not boot) is created in `capl-test-base` on first use and kept.

mod host_support;

use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::{InfraSpec, check_infrastructure};
use host_support::{Fixture, IMAGE_BYTES, ensure_base_image};

const URI_VAR: &str = "CAPL_TEST_LIBVIRT_URI";

fn libvirtd() -> (LibvirtHypervisor, Fixture) {
    let uri = std::env::var(URI_VAR).unwrap_or_else(|_| {
        panic!("{URI_VAR} is not set: start the private test libvirtd with `cargo xtask host up` and export the URI it prints")
    });
    let hv = LibvirtHypervisor::connect(&uri)
        .unwrap_or_else(|e| panic!("cannot connect to {URI_VAR}={uri}: {e}: is `cargo xtask host up` running?"));
    let fx = Fixture {
        network: "capl-test-net".into(),
        base_pool: "capl-test-base".into(),
        domain_pool: "capl-test-disks".into(),
        image: "capl-host-tests-base.qcow2".into(),
        image_bytes: IMAGE_BYTES,
    };
    let infra =
        InfraSpec { network: fx.network.clone(), base_pool: fx.base_pool.clone(), domain_pool: fx.domain_pool.clone() };
    if let Err(e) = check_infrastructure(&hv, &infra) {
        panic!("the test libvirtd at {uri} is not set up ({e}): run `cargo xtask host up`");
    }
    ensure_base_image(&hv, &fx);
    (hv, fx)
}

#[test]
fn full_cycle() {
    let (hv, fx) = libvirtd();
    host_support::full_cycle(&hv, &fx, "real-full");
}

#[test]
fn stopped_machine_is_started() {
    let (hv, fx) = libvirtd();
    host_support::stopped_machine_is_started(&hv, &fx, "real-stopped");
}

#[test]
fn start_never_creates() {
    let (hv, fx) = libvirtd();
    host_support::start_never_creates(&hv, &fx, "real-start");
}

#[test]
fn crash_after_every_step() {
    let (hv, fx) = libvirtd();
    host_support::crash_after_every_step(&hv, &fx, "real-crash");
}

#[test]
fn delete_after_partial_create() {
    let (hv, fx) = libvirtd();
    host_support::delete_after_partial_create(&hv, &fx, "real-partial");
}

#[test]
fn twenty_concurrent_machines() {
    let (hv, fx) = libvirtd();
    host_support::twenty_concurrent_machines(&hv, &fx, "real-par");
}

#[test]
fn foreign_domain_is_left_alone() {
    let (hv, fx) = libvirtd();
    host_support::foreign_domain_is_left_alone(&hv, &fx, "real-foreign");
}

#[test]
fn foreign_volume_is_left_alone() {
    let (hv, fx) = libvirtd();
    host_support::foreign_volume_is_left_alone(&hv, &fx, "real-foreign-vol");
}

#[test]
fn bad_disk_and_missing_image() {
    let (hv, fx) = libvirtd();
    host_support::bad_disk_and_missing_image(&hv, &fx, "real-bad");
}

#[test]
fn endpoint_address_is_avoided() {
    let (hv, fx) = libvirtd();
    host_support::endpoint_address_is_avoided(&hv, &fx, "real-ep");
}

#[test]
fn infra_missing_vs_inactive() {
    let (hv, fx) = libvirtd();
    host_support::infra_missing_vs_inactive(&hv, &fx, "real-infra");
}

/// A directory of this test's own under /tmp, which the private daemon sees
/// as it is (its mount namespace replaces only libvirt's own directories).
/// Removed again when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("capl-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Self(dir)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("temp dir path is UTF-8")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn console_log_file() {
    let (hv, fx) = libvirtd();
    let dir = TempDir::new("console-log");
    host_support::console_log_file(&hv, &fx, "real-log", dir.path());
    let logs: Vec<_> = std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(
        logs.iter().any(|name| name.to_string_lossy().ends_with("-console.log")),
        "virtlogd wrote no console log into {}: {logs:?}",
        dir.path()
    );
}

#[test]
fn console_log_dir_missing_is_named() {
    let (hv, fx) = libvirtd();
    let parent = TempDir::new("console-log-parent");
    let missing = format!("{}/not-created", parent.path());
    host_support::console_log_dir_missing(&hv, &fx, "real-nolog", &missing);
}

#[test]
fn foreign_dhcp_entry_is_left_alone() {
    let (hv, fx) = libvirtd();
    host_support::foreign_dhcp_entry_is_left_alone(&hv, &fx, "real-fdhcp");
}

#[test]
fn older_incarnation_is_reported() {
    let (hv, fx) = libvirtd();
    host_support::older_incarnation_is_reported(&hv, &fx, "real-reborn");
}
