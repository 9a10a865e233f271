//! The host objects a test uses, the machine specs it makes and what it checks
//! of them, generic over the backend (libvirt-sim, `test:///default`, a real
//! libvirtd).

use std::collections::HashSet;
use std::net::Ipv4Addr;

use capl_host::cloud_init::{meta_data, nocloud_iso};
use capl_host::hypervisor::{DomainState, ErrorKind, HostAdmin};
use capl_host::network_xml::parse_network;
use capl_host::{DomainTypePreference, MachineNames, MachineSpec, delete_machine};
use sha2::{Digest, Sha256};

/// The host objects a scenario uses.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub network: String,
    pub base_pool: String,
    pub domain_pool: String,
    pub image: String,
    /// Virtual size of the base image.
    pub image_bytes: u64,
}

pub const IMAGE_BYTES: u64 = 64 * 1024 * 1024;

/// Creates the base image (a small empty qcow2; it need not boot) when absent.
pub fn ensure_base_image(hv: &dyn HostAdmin, fx: &Fixture) {
    let xml = format!(
        "<volume><name>{}</name><capacity unit='bytes'>{}</capacity><target><format type='qcow2'/></target></volume>",
        fx.image, fx.image_bytes
    );
    match hv.volume_create(&fx.base_pool, &xml) {
        Ok(_) => {}
        Err(e) if e.kind == ErrorKind::StorageVolExists || hv.volume_xml(&fx.base_pool, &fx.image).is_ok() => {}
        Err(e) => panic!("cannot create base image {} in pool {}: {e}", fx.image, fx.base_pool),
    }
    // Tests run in parallel: when another test is still creating the image,
    // libvirt already refuses a second create but does not yet answer for the
    // volume. Wait until it does.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while let Err(e) = hv.volume_xml(&fx.base_pool, &fx.image) {
        assert!(
            std::time::Instant::now() < deadline,
            "base image {} in pool {} never became readable: {e}",
            fx.image,
            fx.base_pool
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A UUID-shaped UID derived from the machine's namespace and name.
pub fn uid_for(namespace: &str, name: &str) -> String {
    let d = Sha256::digest(format!("uid:{namespace}/{name}").as_bytes());
    let h: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-4{}-8{}-{}", &h[0..8], &h[8..12], &h[13..16], &h[17..20], &h[20..32])
}

/// The bootstrap data a test machine is seeded with.
pub fn user_data(spec: &MachineSpec) -> Vec<u8> {
    format!("#cloud-config\nhostname: {}\n", spec.name).into_bytes()
}

/// A machine spec whose leftovers from an earlier, interrupted test run are removed first.
pub fn fresh_spec(hv: &dyn HostAdmin, fx: &Fixture, namespace: &str, name: &str) -> MachineSpec {
    let s = spec(fx, namespace, name);
    let _ = delete_machine(hv, &s);
    s
}

/// `spec` with one data disk (1 GiB, qcow2, virtio, in the domain pool) named `disk`.
pub fn with_data_disk(mut spec: MachineSpec, disk: &str) -> MachineSpec {
    spec.data_disks.push(capl_host::data_disk::DataDisk {
        name: disk.into(),
        size_gib: 1,
        pool: spec.domain_pool.clone(),
        format: capl_host::data_disk::DiskFormat::Qcow2,
        bus: capl_host::data_disk::DiskBus::Virtio,
        device: None,
    });
    spec
}

pub fn spec(fx: &Fixture, namespace: &str, name: &str) -> MachineSpec {
    MachineSpec {
        namespace: namespace.into(),
        name: name.into(),
        identity: uid_for(namespace, name),
        name_scheme: capl_host::naming::NameScheme::Current,
        cluster_name: "host-tests".into(),
        vcpu: 1,
        memory_mib: 128,
        disk_gib: 1,
        image: fx.image.clone(),
        image_format: None,
        network: fx.network.clone(),
        base_pool: fx.base_pool.clone(),
        domain_pool: fx.domain_pool.clone(),
        control_plane_host: None,
        // KVM does not work on the test machines: always TCG.
        domain_type: DomainTypePreference::Qemu,
        console_log_dir: None,
        ipam: false,
        static_addresses: Vec::new(),
        nameservers: Vec::new(),
        additional_nics: Vec::new(),
        cpu: None,
        firmware: None,
        data_disks: Vec::new(),
        bootstrap_format: capl_host::BootstrapFormat::CloudConfig,
    }
}

/// Everything of these machines still on the host: domains, volumes, DHCP entries.
pub fn leftovers(hv: &dyn HostAdmin, fx: &Fixture, specs: &[MachineSpec]) -> Vec<String> {
    let domains: HashSet<String> = hv.domain_list().expect("list domains").into_iter().collect();
    let volumes: HashSet<String> = hv.volume_list(&fx.domain_pool).expect("list volumes").into_iter().collect();
    let hosts = dhcp_hosts(hv, fx);
    let mut left = Vec::new();
    for spec in specs {
        let names = spec.names();
        if domains.contains(&names.domain) {
            left.push(format!("domain {}", names.domain));
        }
        for volume in [names.overlay_volume(), names.cloud_init_volume(), names.ignition_volume()] {
            if volumes.contains(&volume) {
                left.push(format!("volume {volume}"));
            }
        }
        for disk in &spec.data_disks {
            let volume = names.data_volume(&disk.name, disk.format.as_str());
            let in_pool = if disk.pool == fx.domain_pool {
                volumes.contains(&volume)
            } else {
                hv.volume_list(&disk.pool).is_ok_and(|list| list.contains(&volume))
            };
            if in_pool {
                left.push(format!("volume {}/{volume}", disk.pool));
            }
        }
        for (mac, name, ip) in &hosts {
            // The machine's entry is named after its domain, whichever of its MACs it took.
            if *name == names.domain {
                left.push(format!("DHCP host {mac} {name} {ip}"));
            }
        }
    }
    left
}

/// The network's DHCP host entries as (mac, name, ip).
pub fn dhcp_hosts(hv: &dyn HostAdmin, fx: &Fixture) -> Vec<(String, String, String)> {
    let net = parse_network(&hv.network_xml(&fx.network).expect("network XML")).expect("parse network XML");
    net.ipv4
        .map(|v4| {
            v4.hosts
                .into_iter()
                .map(|h| {
                    (
                        h.mac.unwrap_or_default(),
                        h.name.unwrap_or_default(),
                        h.ip.map(|ip| ip.to_string()).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts the machine exists exactly once, with both volumes and one DHCP entry.
pub fn assert_created_once(hv: &dyn HostAdmin, fx: &Fixture, spec: &MachineSpec) {
    let names = spec.names();
    let domains = hv.domain_list().unwrap();
    assert_eq!(domains.iter().filter(|d| **d == names.domain).count(), 1, "domain {} in {domains:?}", names.domain);
    assert_eq!(hv.domain_state(&names.domain).unwrap(), DomainState::Running);
    assert!(hv.domain_autostart(&names.domain).unwrap(), "autostart of {}", names.domain);
    let volumes = hv.volume_list(&fx.domain_pool).unwrap();
    for volume in [names.overlay_volume(), names.cloud_init_volume()] {
        assert_eq!(volumes.iter().filter(|v| **v == volume).count(), 1, "{volume} in {volumes:?}");
    }
    let domain = capl_host::domain_xml::parse_domain(&hv.domain_xml(&names.domain).unwrap()).unwrap();
    for disk in &spec.data_disks {
        let volume = names.data_volume(&disk.name, disk.format.as_str());
        let xml = hv.volume_xml(&disk.pool, &volume).unwrap_or_else(|e| panic!("data disk {volume}: {e}"));
        let info = capl_host::volume_xml::parse_volume(&xml).unwrap();
        assert_eq!(info.capacity, disk.size_gib * capl_host::volume_xml::GIB, "size of {volume}");
        assert_eq!(info.format.as_deref(), Some(disk.format.as_str()), "format of {volume}");
        assert!(domain.writable_disk_paths.contains(&info.path), "{volume} is not a disk of {}", names.domain);
    }
    let ours: Vec<_> = dhcp_hosts(hv, fx).into_iter().filter(|(_, name, _)| *name == names.domain).collect();
    assert_eq!(ours.len(), 1, "DHCP entries for {}: {ours:?}", names.domain);
    assert!(names.mac_candidates().contains(&ours[0].0), "the entry's MAC is not one of the machine's: {ours:?}");
    // The domain's NIC has the MAC its address is reserved for.
    assert_eq!(domain.macs, vec![ours[0].0.clone()]);
    // The seed in the volume is exactly the ISO we build.
    let seed = hv.volume_download(&fx.domain_pool, &names.cloud_init_volume()).unwrap();
    let expected = nocloud_iso(&user_data(spec), meta_data(names.instance_id(), names.hostname()).as_bytes());
    assert!(seed.len() >= expected.len() && seed[..expected.len()] == expected[..], "seed content differs");
    assert!(seed[expected.len()..].iter().all(|b| *b == 0));
}

/// The machine's DHCP entry: (mac, name, ip).
pub fn our_entry(hv: &dyn HostAdmin, fx: &Fixture, names: &MachineNames) -> (String, String, String) {
    dhcp_hosts(hv, fx).into_iter().find(|(_, name, _)| *name == names.domain).expect("our DHCP entry")
}

/// The address the machine's DHCP entry reserves.
pub fn reserved_ip(hv: &dyn HostAdmin, fx: &Fixture, names: &MachineNames) -> Ipv4Addr {
    our_entry(hv, fx, names).2.parse().unwrap()
}

/// The id of the running domain `domain` (`<domain ... id='N'>` of its XML):
/// the same for as long as its QEMU process lives, a new one after each
/// start; `None` when it is not running.
pub fn domain_id(hv: &dyn HostAdmin, domain: &str) -> Option<u32> {
    let xml = hv.domain_xml(domain).unwrap_or_else(|e| panic!("domain XML of {domain}: {e}"));
    let head = &xml[..xml.find('>')?];
    let (_, rest) = head.split_once(" id='")?;
    rest.split('\'').next()?.parse().ok()
}
