//! The private test libvirtd (`cargo xtask host up`; the contract is
//! `capl_testbed::test_host`) as the tests of capl-host and of the provider
//! use it: the checked connection and fixture, what the daemon holds of a
//! test, the clean-up of a failed run, and the bootable guest image.

use std::path::{Path, PathBuf};
use std::process::Command;

use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::hypervisor::{ErrorKind, HostAdmin, Hypervisor, NetworkUpdateCommand, UndefineFlags};
use capl_host::{InfraSpec, check_infrastructure};
use capl_testbed::env::GUEST_IMAGE;
use capl_testbed::test_host;

use crate::host::{Fixture, IMAGE_BYTES, dhcp_hosts};

/// A connection to the private libvirtd, whose network and pools are checked;
/// fails naming `cargo xtask host up` when it is not there.
pub fn connect_checked() -> (String, LibvirtHypervisor) {
    let uri = test_host::uri_or_panic();
    let hv = LibvirtHypervisor::connect(&uri).unwrap_or_else(|e| {
        panic!("cannot connect to the test libvirtd at {uri}: {e}: is `{}` running?", test_host::UP_COMMAND)
    });
    let infra = InfraSpec {
        network: test_host::NETWORK.into(),
        base_pool: test_host::BASE_POOL.into(),
        domain_pool: test_host::DISK_POOL.into(),
    };
    if let Err(e) = check_infrastructure(&hv, &infra) {
        panic!("the test libvirtd at {uri} is not set up ({e}): run `{}`", test_host::UP_COMMAND);
    }
    (uri, hv)
}

/// The test host's network and pools with base image `image`.
pub fn fixture(image: &str) -> Fixture {
    Fixture {
        network: test_host::NETWORK.into(),
        base_pool: test_host::BASE_POOL.into(),
        domain_pool: test_host::DISK_POOL.into(),
        image: image.into(),
        image_bytes: IMAGE_BYTES,
    }
}

/// What the daemon holds whose name contains `tag` (the test's namespace):
/// domains, volumes of the disk pool, DHCP host entries of the network.
pub fn ours_on_host(hv: &dyn HostAdmin, fx: &Fixture, tag: &str) -> Vec<String> {
    let mut found = Vec::new();
    for domain in hv.domain_list().expect("list domains") {
        if domain.contains(tag) {
            found.push(format!("domain {domain}"));
        }
    }
    for volume in hv.volume_list(&fx.domain_pool).expect("list volumes") {
        if volume.contains(tag) {
            found.push(format!("volume {volume}"));
        }
    }
    for (mac, name, ip) in dhcp_hosts(hv, fx) {
        if name.contains(tag) {
            found.push(format!("DHCP host {mac} {name} {ip}"));
        }
    }
    found
}

/// The `<host>` entries of the network's persistent config (`virsh
/// net-dumpxml --inactive`, what the network has after a restart) whose
/// name contains `tag`.
pub fn persistent_dhcp_hosts(uri: &str, network: &str, tag: &str) -> Vec<String> {
    let out = Command::new("virsh")
        .args(["-q", "-c", uri, "net-dumpxml", "--inactive", network])
        .output()
        .unwrap_or_else(|e| panic!("running virsh net-dumpxml --inactive {network}: {e}"));
    assert!(out.status.success(), "virsh net-dumpxml --inactive {network}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("<host ") && l.contains(tag))
        .map(str::to_string)
        .collect()
}

/// Removes whatever a failed run left on the daemon (best effort), through a
/// connection opened when it runs (a test may have restarted the daemon).
pub struct CleanUp {
    pub uri: String,
    pub fx: Fixture,
    /// What the names of the test's objects contain (its namespace).
    pub tags: Vec<String>,
}

impl Drop for CleanUp {
    fn drop(&mut self) {
        let Ok(hv) = LibvirtHypervisor::connect(&self.uri) else { return };
        let fx = &self.fx;
        let ours = |name: &str| self.tags.iter().any(|t| name.contains(t.as_str()));
        for domain in hv.domain_list().unwrap_or_default().into_iter().filter(|d| ours(d)) {
            let _ = hv.domain_destroy(&domain);
            let _ = hv.domain_undefine(&domain, UndefineFlags::all());
        }
        for volume in hv.volume_list(&fx.domain_pool).unwrap_or_default().into_iter().filter(|v| ours(v)) {
            let _ = hv.volume_delete(&fx.domain_pool, &volume);
        }
        for (mac, name, ip) in dhcp_hosts(&hv, fx).into_iter().filter(|(_, n, _)| ours(n)) {
            let xml = format!("<host mac='{mac}' name='{name}' ip='{ip}'/>");
            let _ = hv.network_update_dhcp_host(&fx.network, NetworkUpdateCommand::Delete, &xml);
        }
    }
}

/// The bootable test guest (`cargo xtask guest-image`) as a volume of the
/// test host's base pool: see [`guest_image_volume_in`].
pub fn guest_image_volume(hv: &dyn HostAdmin) -> String {
    guest_image_volume_in(hv, test_host::BASE_POOL)
}

/// The bootable test guest as a volume of `pool`: `capl-test-guest-<key>.qcow2`,
/// `<key>` being the image's cache directory (kernel and scripts), uploaded
/// unless it is there. The image is [`GUEST_IMAGE`], or what the built
/// xtask's `guest-image` prints.
pub fn guest_image_volume_in(hv: &dyn HostAdmin, pool: &str) -> String {
    let image = guest_image_path();
    let key = image.parent().and_then(Path::file_name).map_or("image".into(), |n| n.to_string_lossy().into_owned());
    let volume = format!("capl-test-guest-{key}.qcow2");
    if hv.volume_xml(pool, &volume).is_ok() {
        return volume;
    }
    let bytes = std::fs::read(&image)
        .unwrap_or_else(|e| panic!("reading the guest image {}: {e}: run `cargo xtask guest-image`", image.display()));
    let xml = format!(
        "<volume><name>{volume}</name><capacity unit='bytes'>{}</capacity><target><format type='qcow2'/></target></volume>",
        bytes.len()
    );
    match hv.volume_create(pool, &xml) {
        Ok(_) => {}
        Err(e) if e.kind == ErrorKind::StorageVolExists => return volume,
        Err(e) => panic!("creating {volume} in {pool}: {e}"),
    }
    if let Err(e) = hv.volume_upload(pool, &volume, &bytes) {
        let _ = hv.volume_delete(pool, &volume);
        panic!("uploading {} into {pool}/{volume}: {e}", image.display());
    }
    // libvirt learns the format and virtual size of the uploaded file on a refresh.
    hv.pool_refresh(pool).unwrap_or_else(|e| panic!("refreshing pool {pool}: {e}"));
    volume
}

fn guest_image_path() -> PathBuf {
    if let Some(path) = std::env::var_os(GUEST_IMAGE).filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    // The test binary is target/<profile>/deps/<name>; `cargo xtask` leaves
    // target/<profile>/xtask. Running cargo from here would deadlock on the
    // lock of the `cargo test` that runs us.
    let exe = std::env::current_exe().expect("the test binary's path");
    let xtask =
        exe.ancestors().skip(1).take(2).map(|dir| dir.join("xtask")).find(|p| p.is_file()).unwrap_or_else(|| {
            panic!(
                "no guest image: set {GUEST_IMAGE} to the path `cargo xtask guest-image` prints \
                 (`cargo xtask test` does both)"
            )
        });
    let out = Command::new(&xtask)
        .arg("guest-image")
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .output()
        .unwrap_or_else(|e| panic!("running {} guest-image: {e}", xtask.display()));
    assert!(out.status.success(), "`{} guest-image` failed: {}", xtask.display(), String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
