//! Domain XML: the document a LibvirtMachine's domain is defined from, the
//! `<metadata>` marker that makes a domain ours, and reading both back.

use super::data_disk::{DataDiskDevice, devices_xml};
use super::guest_hardware::{CpuMode, CpuSettings, FirmwareSettings, machine_type};
use super::xml_tree::{XmlElement, escape};

/// The namespace URI of our `<metadata>` element. A domain carrying it was
/// created by this provider; its content says for which LibvirtMachine.
pub const METADATA_NAMESPACE: &str = "https://infrastructure.cluster.x-k8s.io/libvirt/machine/v1alpha1";
/// The prefix written with it (libvirt keeps whatever prefix it is given).
pub const METADATA_PREFIX: &str = "capl";

/// The domain type to define: `kvm` (hardware virtualisation) or `qemu` (TCG).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DomainTypePreference {
    /// kvm when the host capabilities offer it for the host architecture, else qemu.
    #[default]
    Auto,
    Kvm,
    Qemu,
}

impl DomainTypePreference {
    /// Parses `auto`, `kvm` or `qemu` (the value of a setting).
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(Self::Auto),
            "kvm" => Ok(Self::Kvm),
            "qemu" | "tcg" => Ok(Self::Qemu),
            other => Err(format!("domain type \"{other}\" is not one of auto, kvm, qemu")),
        }
    }
}

/// The `<metadata>` marker: which LibvirtMachine a domain belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerMarker {
    pub namespace: String,
    pub name: String,
    /// The machine's identity (element `uid`: the LibvirtMachine UID, or the
    /// UUID of its `spec.providerID` once set; see [`crate::naming`]).
    pub uid: String,
    pub cluster: String,
}

/// What a NIC is plugged into on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicAttachment {
    /// A libvirt network (`<interface type='network'>`).
    Network(String),
    /// A Linux bridge of the host that libvirt does not manage
    /// (`<interface type='bridge'>`).
    Bridge(String),
}

impl NicAttachment {
    /// As messages name it: `network "x"` or `host bridge "y"`.
    pub fn describe(&self) -> String {
        match self {
            NicAttachment::Network(n) => format!("network \"{n}\""),
            NicAttachment::Bridge(b) => format!("host bridge \"{b}\""),
        }
    }
}

/// A NIC after the first one: where it is plugged in, and its MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicDevice {
    pub attach: NicAttachment,
    pub mac: String,
}

/// Everything a domain definition needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainDefinition {
    pub name: String,
    pub uuid: String,
    /// `kvm` or `qemu`.
    pub domain_type: String,
    /// The guest architecture, e.g. `x86_64`.
    pub arch: String,
    pub vcpu: u32,
    pub memory_mib: u64,
    pub overlay_path: String,
    pub iso_path: String,
    pub network: String,
    pub mac: String,
    /// Further NICs, in order after the first.
    pub additional_nics: Vec<NicDevice>,
    /// When set, the serial console is also logged to this file on the host.
    pub console_log_path: Option<String>,
    pub owner: OwnerMarker,
    /// `spec.cpu`; `None`: host-passthrough on kvm, QEMU's default CPU on qemu.
    pub cpu: Option<CpuSettings>,
    /// The host CPU feature nested virtualisation requires with host-model
    /// (`vmx` or `svm`, from the host's domain capabilities).
    pub nested_feature: Option<String>,
    /// `spec.firmware`; `None`: BIOS, no TPM.
    pub firmware: Option<FirmwareSettings>,
    /// The data disks, after the root disk (with a virtio-scsi controller
    /// when one is on bus scsi).
    pub data_disks: Vec<DataDiskDevice>,
    /// The Ignition config's file on the host, for a machine whose bootstrap
    /// data is Ignition: QEMU hands it to the guest as the firmware config
    /// entries Ignition reads ([`IGNITION_FW_CFG_NAMES`]).
    pub ignition_path: Option<String>,
}

/// The firmware config entries Ignition's QEMU platform reads its config
/// from: Fedora CoreOS and upstream Ignition, then Flatcar's.
pub const IGNITION_FW_CFG_NAMES: [&str; 2] = ["opt/com.coreos/config", "opt/org.flatcar-linux/config"];

/// The domain XML for [`DomainDefinition`].
///
/// Machine type `pc` (i440fx) on x86 with BIOS so the cloud-init ISO can be
/// an IDE cdrom, which every guest kernel finds (`q35` with a SATA cdrom with
/// UEFI, see [`machine_type`]; SMM too with Secure Boot); the root disk is virtio, the data
/// disks follow it with their serials; a virtio
/// NIC on the network with the reserved MAC, then one per additional NIC
/// (on a network or straight on a host bridge); a pty serial console. UEFI
/// firmware is chosen by libvirt's firmware auto-selection from what the
/// host has installed; a TPM is an emulated TPM 2.0 (swtpm).
pub fn domain_xml(d: &DomainDefinition) -> String {
    let firmware = d.firmware.as_ref();
    let machine_type = machine_type(&d.arch, firmware);
    let machine = machine_type.map(|m| format!(" machine='{m}'")).unwrap_or_default();
    let cpu = match &d.cpu {
        Some(cpu) => cpu_xml(cpu, d.nested_feature.as_deref()),
        None if d.domain_type == "kvm" => "  <cpu mode='host-passthrough'/>\n".to_string(),
        None => String::new(),
    };
    let uefi = firmware.filter(|f| f.uefi());
    let os_firmware = if uefi.is_some() { " firmware='efi'" } else { "" };
    let firmware_features = match uefi {
        Some(f) => {
            let on = if f.secure_boot { "yes" } else { "no" };
            format!(
                "    <firmware>\n      <feature enabled='{on}' name='enrolled-keys'/>\n      <feature enabled='{on}' name='secure-boot'/>\n    </firmware>\n"
            )
        }
        None => String::new(),
    };
    let smm = if firmware.is_some_and(|f| f.secure_boot) { "    <smm state='on'/>\n" } else { "" };
    let cdrom_target = if machine_type == Some("q35") { "dev='sda' bus='sata'" } else { "dev='hdc' bus='ide'" };
    let tpm = if firmware.is_some_and(|f| f.tpm) {
        "    <tpm model='tpm-crb'>\n      <backend type='emulator' version='2.0'/>\n    </tpm>\n"
    } else {
        ""
    };
    let extra: String = d
        .additional_nics
        .iter()
        .map(|nic| {
            let (kind, source) = match &nic.attach {
                NicAttachment::Network(n) => ("network", format!("network='{}'", escape(n))),
                NicAttachment::Bridge(b) => ("bridge", format!("bridge='{}'", escape(b))),
            };
            format!(
                "    <interface type='{kind}'>\n      <source {source}/>\n      <mac address='{}'/>\n      <model type='virtio'/>\n    </interface>\n",
                escape(&nic.mac)
            )
        })
        .collect();
    let sysinfo = match &d.ignition_path {
        Some(path) => {
            let entries: String = IGNITION_FW_CFG_NAMES
                .iter()
                .map(|name| format!("    <entry name='{name}' file='{}'/>\n", escape(path)))
                .collect();
            format!("  <sysinfo type='fwcfg'>\n{entries}  </sysinfo>\n")
        }
        None => String::new(),
    };
    let log = match &d.console_log_path {
        Some(path) => format!("\n      <log file='{}' append='on'/>", escape(path)),
        None => String::new(),
    };
    format!(
        r#"<domain type='{domain_type}'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <metadata>
    <{p}:machine xmlns:{p}='{ns}'>
      <{p}:namespace>{owner_ns}</{p}:namespace>
      <{p}:name>{owner_name}</{p}:name>
      <{p}:uid>{owner_uid}</{p}:uid>
      <{p}:cluster>{owner_cluster}</{p}:cluster>
    </{p}:machine>
  </metadata>
  <memory unit='MiB'>{memory}</memory>
  <currentMemory unit='MiB'>{memory}</currentMemory>
  <vcpu placement='static'>{vcpu}</vcpu>
{sysinfo}  <os{os_firmware}>
    <type arch='{arch}'{machine}>hvm</type>
{firmware_features}    <boot dev='hd'/>
  </os>
  <features>
    <acpi/>
    <apic/>
{smm}  </features>
{cpu}  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{overlay}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
{data_disks}    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source file='{iso}'/>
      <target {cdrom_target}/>
      <readonly/>
    </disk>
    <interface type='network'>
      <source network='{network}'/>
      <mac address='{mac}'/>
      <model type='virtio'/>
    </interface>
{extra}    <serial type='pty'>
      <target port='0'/>{log}
    </serial>
    <console type='pty'>
      <target type='serial' port='0'/>
    </console>
{tpm}  </devices>
</domain>
"#,
        domain_type = escape(&d.domain_type),
        name = escape(&d.name),
        uuid = escape(&d.uuid),
        p = METADATA_PREFIX,
        ns = METADATA_NAMESPACE,
        owner_ns = escape(&d.owner.namespace),
        owner_name = escape(&d.owner.name),
        owner_uid = escape(&d.owner.uid),
        owner_cluster = escape(&d.owner.cluster),
        memory = d.memory_mib,
        vcpu = d.vcpu,
        arch = escape(&d.arch),
        overlay = escape(&d.overlay_path),
        data_disks = devices_xml(&d.data_disks),
        iso = escape(&d.iso_path),
        network = escape(&d.network),
        mac = escape(&d.mac),
    )
}

/// The `<cpu>` element for `spec.cpu`: the mode, a custom model (exactly
/// that model, no fallback to another), the topology, and for nested
/// virtualisation with host-model the host's vmx or svm (host-passthrough
/// passes them through as they are).
fn cpu_xml(cpu: &CpuSettings, nested_feature: Option<&str>) -> String {
    let mut inner = String::new();
    if let (CpuMode::Custom, Some(model)) = (cpu.mode, &cpu.model) {
        inner.push_str(&format!("    <model fallback='forbid'>{}</model>\n", escape(model)));
    }
    if let Some(t) = cpu.topology {
        inner.push_str(&format!(
            "    <topology sockets='{}' dies='1' cores='{}' threads='{}'/>\n",
            t.sockets, t.cores, t.threads
        ));
    }
    if let (true, CpuMode::HostModel, Some(feature)) = (cpu.nested_virtualization, cpu.mode, nested_feature) {
        inner.push_str(&format!("    <feature policy='require' name='{}'/>\n", escape(feature)));
    }
    let open = match cpu.mode {
        CpuMode::Custom => "<cpu mode='custom' match='exact'".to_string(),
        mode => format!("<cpu mode='{}'", mode.as_str()),
    };
    if inner.is_empty() { format!("  {open}/>\n") } else { format!("  {open}>\n{inner}  </cpu>\n") }
}

/// What the provider reads back from a defined domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainInfo {
    pub name: String,
    pub uuid: String,
    /// Our marker, when the domain carries one.
    pub owner: Option<OwnerMarker>,
    /// The files the domain reads: `<source file=..>` of every disk and
    /// cdrom, and the file of every firmware config entry (`<sysinfo
    /// type='fwcfg'>`).
    pub disk_paths: Vec<String>,
    /// The same of the disks the guest can write: neither a cdrom nor
    /// marked `<readonly/>`.
    pub writable_disk_paths: Vec<String>,
    /// `<mac address=..>` of every interface, lower case.
    pub macs: Vec<String>,
}

/// Parses `virDomainGetXMLDesc` output.
pub fn parse_domain(xml: &str) -> Result<DomainInfo, String> {
    let root = XmlElement::parse(xml)?;
    if root.name != "domain" {
        return Err(format!("expected <domain>, found <{}>", root.name));
    }
    let owner = root
        .child("metadata")
        .and_then(|m| m.children.iter().find(|c| c.namespace.as_deref() == Some(METADATA_NAMESPACE)))
        .map(|marker| OwnerMarker {
            namespace: marker.path_text(&["namespace"]).unwrap_or_default().to_string(),
            name: marker.path_text(&["name"]).unwrap_or_default().to_string(),
            uid: marker.path_text(&["uid"]).unwrap_or_default().to_string(),
            cluster: marker.path_text(&["cluster"]).unwrap_or_default().to_string(),
        });
    let devices = root.child("devices");
    let file_disks: Vec<(&XmlElement, String)> = devices
        .into_iter()
        .flat_map(|d| d.children_named("disk"))
        .filter_map(|disk| disk.child("source").and_then(|s| s.attr("file")).map(|path| (disk, path.to_string())))
        .collect();
    let writable_disk_paths = file_disks
        .iter()
        .filter(|(disk, _)| disk.attr("device") != Some("cdrom") && disk.child("readonly").is_none())
        .map(|(_, path)| path.clone())
        .collect();
    let fw_cfg_files = root
        .children_named("sysinfo")
        .filter(|s| s.attr("type") == Some("fwcfg"))
        .flat_map(|s| s.children_named("entry"))
        .filter_map(|entry| entry.attr("file").map(str::to_string));
    let mut disk_paths: Vec<String> = file_disks.into_iter().map(|(_, path)| path).collect();
    for file in fw_cfg_files {
        if !disk_paths.contains(&file) {
            disk_paths.push(file);
        }
    }
    let macs = devices
        .into_iter()
        .flat_map(|d| d.children_named("interface"))
        .filter_map(|nic| nic.child("mac").and_then(|m| m.attr("address")).map(str::to_ascii_lowercase))
        .collect();
    Ok(DomainInfo {
        name: root.path_text(&["name"]).unwrap_or_default().to_string(),
        uuid: root.path_text(&["uuid"]).unwrap_or_default().to_ascii_lowercase(),
        owner,
        disk_paths,
        writable_disk_paths,
        macs,
    })
}

/// The host architecture and whether the capabilities offer a kvm domain for it.
pub fn host_kvm_support(capabilities_xml: &str) -> Result<(String, bool), String> {
    let root = XmlElement::parse(capabilities_xml)?;
    let arch = root.path_text(&["host", "cpu", "arch"]).unwrap_or("x86_64").to_string();
    let kvm = root.children_named("guest").any(|guest| {
        guest.path_text(&["os_type"]) == Some("hvm")
            && guest.child("arch").is_some_and(|a| {
                a.attr("name") == Some(arch.as_str())
                    && a.children_named("domain").any(|domain| domain.attr("type") == Some("kvm"))
            })
    });
    Ok((arch, kvm))
}

/// The domain type to use given the preference and the host capabilities.
pub fn choose_domain_type(preference: DomainTypePreference, kvm_offered: bool) -> &'static str {
    match preference {
        DomainTypePreference::Kvm => "kvm",
        DomainTypePreference::Qemu => "qemu",
        DomainTypePreference::Auto if kvm_offered => "kvm",
        DomainTypePreference::Auto => "qemu",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: &str = "<capabilities><host><cpu><arch>x86_64</arch></cpu></host>
        <guest><os_type>hvm</os_type><arch name='i686'><domain type='qemu'/><domain type='kvm'/></arch></guest>
        <guest><os_type>hvm</os_type><arch name='x86_64'><domain type='qemu'/>KVM_HERE</arch></guest></capabilities>";

    #[test]
    fn kvm_is_offered_only_when_listed_for_the_host_arch() {
        let with = CAPS.replace("KVM_HERE", "<domain type='kvm'/>");
        assert_eq!(host_kvm_support(&with).unwrap(), ("x86_64".to_string(), true));
        let without = CAPS.replace("KVM_HERE", "");
        assert_eq!(host_kvm_support(&without).unwrap(), ("x86_64".to_string(), false));
    }

    #[test]
    fn writable_disks_are_those_neither_readonly_nor_cdrom() {
        let xml = "<domain type='qemu'><name>db</name><uuid>U</uuid><devices>
            <disk type='file' device='disk'><source file='/p/db.qcow2'/><target dev='vda'/></disk>
            <disk type='file' device='disk'><source file='/p/shared.raw'/><readonly/><target dev='vdb'/></disk>
            <disk type='file' device='cdrom'><source file='/p/seed.iso'/><target dev='sda'/></disk>
            <disk type='file' device='floppy'><source file='/p/a.img'/><target dev='fda'/></disk>
            <disk type='network' device='disk'><source protocol='nbd' name='x'/><target dev='vdc'/></disk>
            </devices></domain>";
        let info = parse_domain(xml).unwrap();
        assert_eq!(info.disk_paths, ["/p/db.qcow2", "/p/shared.raw", "/p/seed.iso", "/p/a.img"]);
        assert_eq!(info.writable_disk_paths, ["/p/db.qcow2", "/p/a.img"]);
    }

    #[test]
    fn domain_type_follows_preference_then_capabilities() {
        assert_eq!(choose_domain_type(DomainTypePreference::Auto, true), "kvm");
        assert_eq!(choose_domain_type(DomainTypePreference::Auto, false), "qemu");
        assert_eq!(choose_domain_type(DomainTypePreference::Qemu, true), "qemu");
        assert_eq!(choose_domain_type(DomainTypePreference::Kvm, false), "kvm");
        assert_eq!(DomainTypePreference::parse("QEMU").unwrap(), DomainTypePreference::Qemu);
        assert!(DomainTypePreference::parse("xen").is_err());
    }
}
