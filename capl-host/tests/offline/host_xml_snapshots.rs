//! Snapshots of the XML the provider writes: domain, volumes, DHCP host.

use std::net::Ipv4Addr;

use capl_host::MachineNames;
use capl_host::data_disk::{DataDiskDevice, DiskBus, DiskFormat};
use capl_host::dhcp::dhcp_host_xml;
use capl_host::domain_xml::{DomainDefinition, NicAttachment, NicDevice, OwnerMarker, domain_xml, parse_domain};
use capl_host::guest_hardware::{CpuMode, CpuSettings, CpuTopology, FirmwareSettings, FirmwareType};
use capl_host::volume_xml::{BackingStore, GIB, data_volume_xml, iso_volume_xml, overlay_volume_xml, parse_volume};

fn names() -> MachineNames {
    MachineNames::new("default", "libvirt-xd-0", "5d0f6c2e-8a47-4c1b-9a53-0c2d7e4b8f10")
}

fn definition(domain_type: &str, console_log_path: Option<String>) -> DomainDefinition {
    let names = names();
    DomainDefinition {
        name: names.domain.clone(),
        uuid: names.identity.clone(),
        domain_type: domain_type.into(),
        arch: "x86_64".into(),
        vcpu: 2,
        memory_mib: 2048,
        overlay_path: format!("/var/lib/libvirt/capi/disks/{}", names.overlay_volume()),
        iso_path: format!("/var/lib/libvirt/capi/disks/{}", names.cloud_init_volume()),
        network: "libvirt-lab".into(),
        mac: names.derived_mac(),
        additional_nics: Vec::new(),
        console_log_path,
        owner: OwnerMarker {
            namespace: names.namespace.clone(),
            name: names.name.clone(),
            uid: names.identity.clone(),
            cluster: "libvirt-xd".into(),
        },
        cpu: None,
        nested_feature: None,
        firmware: None,
        data_disks: Vec::new(),
        ignition_path: None,
    }
}

#[test]
fn domain_xml_with_additional_nics_on_a_network_and_a_host_bridge() {
    let names = names();
    let mut d = definition("qemu", None);
    d.additional_nics = vec![
        NicDevice { attach: NicAttachment::Network("storage-net".into()), mac: names.additional_mac(1) },
        NicDevice { attach: NicAttachment::Bridge("br-lan".into()), mac: names.additional_mac(2) },
    ];
    insta::assert_snapshot!(domain_xml(&d));
}

#[test]
fn domain_xml_custom_cpu_model_and_topology() {
    let mut d = definition("qemu", None);
    d.cpu = Some(CpuSettings {
        mode: CpuMode::Custom,
        model: Some("qemu64".into()),
        topology: Some(CpuTopology { sockets: 1, cores: 2, threads: 1 }),
        nested_virtualization: false,
    });
    insta::assert_snapshot!(domain_xml(&d));
}

#[test]
fn domain_xml_host_model_with_nested_virtualization() {
    let mut d = definition("kvm", None);
    d.cpu = Some(CpuSettings {
        mode: CpuMode::HostModel,
        model: None,
        topology: Some(CpuTopology { sockets: 2, cores: 1, threads: 1 }),
        nested_virtualization: true,
    });
    d.nested_feature = Some("vmx".into());
    insta::assert_snapshot!(domain_xml(&d));
}

#[test]
fn domain_xml_host_passthrough_without_topology_is_the_kvm_default() {
    let mut d = definition("kvm", None);
    d.cpu =
        Some(CpuSettings { mode: CpuMode::HostPassthrough, model: None, topology: None, nested_virtualization: false });
    assert_eq!(domain_xml(&d), domain_xml(&definition("kvm", None)));
}

#[test]
fn domain_xml_uefi_with_tpm_on_q35() {
    let mut d = definition("qemu", None);
    d.firmware = Some(FirmwareSettings { kind: FirmwareType::Uefi, secure_boot: false, tpm: true });
    insta::assert_snapshot!(domain_xml(&d));
}

#[test]
fn domain_xml_uefi_secure_boot_on_q35() {
    let mut d = definition("kvm", None);
    d.firmware = Some(FirmwareSettings { kind: FirmwareType::Uefi, secure_boot: true, tpm: false });
    insta::assert_snapshot!(domain_xml(&d));
}

#[test]
fn domain_xml_with_cpu_and_firmware_reads_back_with_our_marker_and_disks() {
    let mut d = definition("qemu", None);
    d.firmware = Some(FirmwareSettings { kind: FirmwareType::Uefi, secure_boot: true, tpm: true });
    let info = parse_domain(&domain_xml(&d)).unwrap();
    assert_eq!(info.owner, Some(d.owner.clone()));
    assert_eq!(info.disk_paths, vec![d.overlay_path.clone(), d.iso_path.clone()]);
    assert_eq!(info.writable_disk_paths, vec![d.overlay_path.clone()]);
}

/// Data disks follow the root disk, each with its serial; a disk on bus
/// scsi brings a virtio-scsi controller; all of them read back as writable.
#[test]
fn domain_xml_with_data_disks_on_each_bus() {
    let names = names();
    let mut d = definition("qemu", None);
    let disk = |name: &str, format, bus, target: &str| DataDiskDevice {
        path: format!("/var/lib/libvirt/capi/disks/{}", names.data_volume(name, DiskFormat::as_str(format))),
        format,
        bus,
        target: target.into(),
        serial: name.into(),
    };
    d.data_disks = vec![
        disk("etcd", DiskFormat::Qcow2, DiskBus::Virtio, "vdb"),
        disk("images", DiskFormat::Raw, DiskBus::Sata, "sdb"),
        disk("logs", DiskFormat::Qcow2, DiskBus::Scsi, "sdc"),
    ];
    let xml = domain_xml(&d);
    let info = parse_domain(&xml).unwrap();
    let data: Vec<String> = d.data_disks.iter().map(|x| x.path.clone()).collect();
    assert_eq!(info.writable_disk_paths, [vec![d.overlay_path.clone()], data].concat());
    insta::assert_snapshot!(xml);
}

/// An Ignition config is a file the domain reads (named in two firmware
/// config entries), not a disk the guest writes.
#[test]
fn domain_xml_with_an_ignition_config() {
    let mut d = definition("qemu", None);
    let path = format!("/var/lib/libvirt/capi/disks/{}", names().ignition_volume());
    d.ignition_path = Some(path.clone());
    let xml = domain_xml(&d);
    let info = parse_domain(&xml).unwrap();
    assert_eq!(info.disk_paths, vec![d.overlay_path.clone(), d.iso_path.clone(), path]);
    assert_eq!(info.writable_disk_paths, vec![d.overlay_path.clone()]);
    insta::assert_snapshot!(xml);
}

#[test]
fn data_volume_snapshot() {
    let name = names().data_volume("etcd", "qcow2");
    insta::assert_snapshot!(data_volume_xml(&name, 10 * GIB, "qcow2"));
}

#[test]
fn domain_xml_qemu() {
    insta::assert_snapshot!(domain_xml(&definition("qemu", None)));
}

#[test]
fn domain_xml_kvm_with_console_log() {
    let log = format!("/var/log/libvirt/qemu/{}-console.log", names().domain);
    insta::assert_snapshot!(domain_xml(&definition("kvm", Some(log))));
}

#[test]
fn domain_xml_reads_back_with_our_marker() {
    let d = definition("qemu", None);
    let info = parse_domain(&domain_xml(&d)).unwrap();
    assert_eq!(info.name, d.name);
    assert_eq!(info.uuid, d.uuid);
    assert_eq!(info.owner, Some(d.owner.clone()));
    assert_eq!(info.disk_paths, vec![d.overlay_path.clone(), d.iso_path.clone()]);
    assert_eq!(info.macs, vec![d.mac.clone()]);
}

#[test]
fn a_domain_without_our_namespace_has_no_owner() {
    let xml = "<domain type='qemu'><name>x</name><metadata><m:machine xmlns:m='urn:other'><m:uid>u</m:uid></m:machine></metadata></domain>";
    assert_eq!(parse_domain(xml).unwrap().owner, None);
}

#[test]
fn overlay_volume_snapshot() {
    let backing = BackingStore {
        path: "/var/lib/libvirt/capi/base/ubuntu-noble-base.qcow2".into(),
        format: Some("qcow2".into()),
    };
    let xml = overlay_volume_xml(&names().overlay_volume(), 20 * GIB, &backing);
    let parsed = parse_volume(&xml).unwrap();
    assert_eq!(parsed.capacity, 20 * GIB);
    assert_eq!(parsed.backing, Some(backing));
    insta::assert_snapshot!(xml);
}

#[test]
fn cloud_init_volume_snapshot() {
    insta::assert_snapshot!(iso_volume_xml(&names().cloud_init_volume(), 55296));
}

#[test]
fn dhcp_host_snapshot() {
    let names = names();
    insta::assert_snapshot!(dhcp_host_xml(&names.derived_mac(), &names.domain, Ipv4Addr::new(192, 168, 122, 57)));
}
