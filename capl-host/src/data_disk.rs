//! Data disks (`spec.dataDisks`): empty volumes made with the machine, beside
//! its root disk, and the devices the guest sees them as.
//!
//! Each disk is a volume `<domain>-data-<name>.<format>` in its pool, with no
//! backing store, exactly its size. The guest finds it by its serial, which
//! is the disk's name: `/dev/disk/by-id/virtio-<name>` on bus virtio. The
//! target device (`vdb`, `sdb`, ...) is libvirt's name for the device; a
//! guest names disks in the order it finds them, so the name inside the
//! guest can differ from it.

use crate::xml_tree::escape;

/// The most data disks a machine has.
pub const MAX_DATA_DISKS: usize = 8;
/// The longest name: a virtio disk's serial holds 20 bytes.
pub const MAX_NAME: usize = 20;

/// How the volume stores its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiskFormat {
    Qcow2,
    Raw,
}

impl DiskFormat {
    /// libvirt's name, also the volume's file extension.
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Qcow2 => "qcow2",
            DiskFormat::Raw => "raw",
        }
    }
}

/// The bus the guest sees the disk on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiskBus {
    Virtio,
    /// SATA (AHCI), which every guest kernel drives.
    Sata,
    /// SCSI on a virtio-scsi controller.
    Scsi,
}

impl DiskBus {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskBus::Virtio => "virtio",
            DiskBus::Sata => "sata",
            DiskBus::Scsi => "scsi",
        }
    }

    /// The prefix of target device names on this bus.
    pub fn device_prefix(self) -> &'static str {
        match self {
            DiskBus::Virtio => "vd",
            DiskBus::Sata | DiskBus::Scsi => "sd",
        }
    }
}

/// One data disk of a machine, with its pool resolved (the domain pool when
/// the LibvirtMachine names none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDisk {
    /// Unique among the machine's data disks; the guest sees it as the serial.
    pub name: String,
    pub size_gib: u64,
    pub pool: String,
    pub format: DiskFormat,
    pub bus: DiskBus,
    /// The target device asked for (`vdc`, `sdb`); `None`: the next free one.
    pub device: Option<String>,
}

/// A data disk's device in the domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDiskDevice {
    pub path: String,
    pub format: DiskFormat,
    pub bus: DiskBus,
    pub target: String,
    pub serial: String,
}

/// Where the disks go, in order: each disk's asked-for device, or else the
/// next free one on its bus prefix. `vda` is the root disk and `sda` is kept
/// for the seed cdrom (a SATA cdrom on q35), so both prefixes start at `b`.
pub fn targets(disks: &[DataDisk]) -> Vec<String> {
    let mut taken: Vec<String> = vec!["vda".into(), "sda".into()];
    taken.extend(disks.iter().filter_map(|d| d.device.clone()));
    disks
        .iter()
        .map(|disk| match &disk.device {
            Some(device) => device.clone(),
            None => {
                let prefix = disk.bus.device_prefix();
                let free = (b'b'..=b'z')
                    .map(|letter| format!("{prefix}{}", letter as char))
                    .find(|name| !taken.contains(name))
                    .expect("at most MAX_DATA_DISKS disks leave letters free");
                taken.push(free.clone());
                free
            }
        })
        .collect()
}

/// What is wrong with the disks, checked before anything is created (the
/// API server refuses the same; this keeps the host safe from an object
/// written around it): names unique, short and usable as a serial, sizes
/// above zero, asked-for devices on their bus's prefix, not the root disk's
/// or the seed's, and not asked for twice.
pub fn check(disks: &[DataDisk]) -> Result<(), String> {
    if disks.len() > MAX_DATA_DISKS {
        return Err(format!("has {} disks, more than the {MAX_DATA_DISKS} a machine may have", disks.len()));
    }
    for (i, disk) in disks.iter().enumerate() {
        let name = &disk.name;
        let usable = !name.is_empty()
            && name.len() <= MAX_NAME
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !usable {
            return Err(format!(
                "has name \"{name}\": a disk's name is its serial in the guest, 1 to {MAX_NAME} lower-case \
                 letters, digits and '-', starting and ending with a letter or digit"
            ));
        }
        if disks[..i].iter().any(|d| d.name == *name) {
            return Err(format!("names \"{name}\" twice: each disk needs its own name"));
        }
        if disk.size_gib == 0 {
            return Err(format!("\"{name}\" has sizeGiB 0: a disk has at least 1 GiB"));
        }
        if let Some(device) = &disk.device {
            let prefix = disk.bus.device_prefix();
            let letters = device.strip_prefix(prefix).unwrap_or("");
            if letters.is_empty() || letters.len() > 2 || !letters.bytes().all(|b| b.is_ascii_lowercase()) {
                return Err(format!(
                    "\"{name}\" asks for device \"{device}\", which is not a {} device: use {prefix}b, {prefix}c, ...",
                    disk.bus.as_str()
                ));
            }
            if letters == "a" {
                return Err(format!(
                    "\"{name}\" asks for device \"{device}\", which the root disk (vda) or the seed cdrom (sda) \
                     has: use {prefix}b or later"
                ));
            }
            if disks[..i].iter().any(|d| d.device.as_deref() == Some(device)) {
                return Err(format!("asks for device \"{device}\" twice: give each disk its own device"));
            }
        }
    }
    Ok(())
}

/// The `<disk>` elements of the data disks, and a virtio-scsi controller
/// when one is on bus scsi (without it libvirt would add its default SCSI
/// controller, which some QEMU builds lack).
pub fn devices_xml(devices: &[DataDiskDevice]) -> String {
    let mut xml: String = devices
        .iter()
        .map(|d| {
            format!(
                "    <disk type='file' device='disk'>\n      <driver name='qemu' type='{}'/>\n      <source file='{}'/>\n      <target dev='{}' bus='{}'/>\n      <serial>{}</serial>\n    </disk>\n",
                d.format.as_str(),
                escape(&d.path),
                escape(&d.target),
                d.bus.as_str(),
                escape(&d.serial),
            )
        })
        .collect();
    if devices.iter().any(|d| d.bus == DiskBus::Scsi) {
        xml.push_str("    <controller type='scsi' index='0' model='virtio-scsi'/>\n");
    }
    xml
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(name: &str, bus: DiskBus, device: Option<&str>) -> DataDisk {
        DataDisk {
            name: name.into(),
            size_gib: 1,
            pool: "p".into(),
            format: DiskFormat::Qcow2,
            bus,
            device: device.map(str::to_string),
        }
    }

    #[test]
    fn devices_follow_the_root_disk_and_the_seed_and_keep_what_was_asked_for() {
        let disks = [
            disk("a", DiskBus::Virtio, None),
            disk("b", DiskBus::Sata, None),
            disk("c", DiskBus::Virtio, Some("vdb")),
            disk("d", DiskBus::Scsi, None),
        ];
        assert_eq!(targets(&disks), ["vdc", "sdb", "vdb", "sdc"]);
    }

    #[rstest::rstest]
    #[case::zero(vec![DataDisk { size_gib: 0, ..disk("logs", DiskBus::Virtio, None) }], "\"logs\" has sizeGiB 0")]
    #[case::twice(vec![disk("x", DiskBus::Virtio, None), disk("x", DiskBus::Sata, None)], "names \"x\" twice")]
    #[case::long(vec![disk(&"x".repeat(21), DiskBus::Virtio, None)], "1 to 20 lower-case")]
    #[case::upper(vec![disk("Data", DiskBus::Virtio, None)], "1 to 20 lower-case")]
    #[case::wrong_bus(vec![disk("x", DiskBus::Sata, Some("vdb"))], "not a sata device")]
    #[case::root(vec![disk("x", DiskBus::Virtio, Some("vda"))], "which the root disk (vda)")]
    #[case::same_device(
        vec![disk("x", DiskBus::Virtio, Some("vdc")), disk("y", DiskBus::Virtio, Some("vdc"))],
        "asks for device \"vdc\" twice"
    )]
    fn disks_that_cannot_be_made_are_refused_with_the_reason(#[case] disks: Vec<DataDisk>, #[case] why: &str) {
        let err = check(&disks).unwrap_err();
        assert!(err.contains(why), "{err}");
    }

    #[test]
    fn a_scsi_disk_brings_its_virtio_scsi_controller() {
        let device = |bus, target: &str| DataDiskDevice {
            path: format!("/p/{target}"),
            format: DiskFormat::Raw,
            bus,
            target: target.into(),
            serial: "s".into(),
        };
        let without = devices_xml(&[device(DiskBus::Virtio, "vdb")]);
        assert!(!without.contains("controller"), "{without}");
        let with = devices_xml(&[device(DiskBus::Virtio, "vdb"), device(DiskBus::Scsi, "sdb")]);
        assert!(with.contains("<controller type='scsi' index='0' model='virtio-scsi'/>"), "{with}");
        assert!(with.contains("<target dev='sdb' bus='scsi'/>\n      <serial>s</serial>"), "{with}");
    }
}
