//! Domains: the definition read from domain XML (the modeled parts typed, everything else
//! kept as written), the XML libvirt gives back, and the state machine.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, ErrorCode, Result};
use crate::ids::{Mac, Uuid};
use crate::size_units::{Scaled, to_bytes};
use crate::xml_scan::{RawElement, check_document, children_raw, escape, serde_error};

#[derive(Deserialize)]
struct DomainDoc {
    #[serde(rename = "@type")]
    kind: Option<String>,
    name: Option<String>,
    uuid: Option<String>,
    title: Option<String>,
    description: Option<String>,
    memory: Option<Scaled>,
    #[serde(rename = "currentMemory")]
    current_memory: Option<Scaled>,
    vcpu: Option<Scaled>,
    os: Option<OsEl>,
    devices: Option<DevicesEl>,
}

#[derive(Deserialize)]
struct OsEl {
    nvram: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct DevicesEl {
    #[serde(default)]
    disk: Vec<DiskEl>,
    #[serde(default)]
    interface: Vec<InterfaceEl>,
}

#[derive(Deserialize)]
struct DiskEl {
    #[serde(rename = "@type")]
    kind: Option<String>,
    source: Option<DiskSourceEl>,
}

#[derive(Deserialize)]
struct DiskSourceEl {
    #[serde(rename = "@file")]
    file: Option<String>,
    #[serde(rename = "@pool")]
    pool: Option<String>,
    #[serde(rename = "@volume")]
    volume: Option<String>,
}

#[derive(Deserialize)]
struct InterfaceEl {
    #[serde(rename = "@type")]
    kind: Option<String>,
    source: Option<InterfaceSourceEl>,
    mac: Option<MacEl>,
}

#[derive(Deserialize)]
struct InterfaceSourceEl {
    #[serde(rename = "@network")]
    network: Option<String>,
}

#[derive(Deserialize)]
struct MacEl {
    #[serde(rename = "@address")]
    address: Option<String>,
}

/// A disk's source, as far as the simulator checks it at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskSource {
    File(String),
    Volume { pool: String, volume: String },
    Other,
}

/// A network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub mac: Mac,
    /// `<source network=...>` for `type='network'` interfaces.
    pub network: Option<String>,
}

/// A domain definition as the simulator keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainDef {
    pub name: String,
    pub uuid: Uuid,
    pub kind: String,
    pub title: Option<String>,
    pub description: Option<String>,
    pub memory_kib: u64,
    pub current_memory_kib: u64,
    pub vcpus: u32,
    pub interfaces: Vec<Interface>,
    pub disks: Vec<DiskSource>,
    pub has_nvram: bool,
    /// The children of `<metadata>`, as written.
    pub metadata: Vec<String>,
    /// Top-level elements the simulator does not interpret (os, features, cpu, clock...), as written.
    pub other: Vec<RawElement>,
    /// The children of `<devices>`, as written (interfaces get a `<mac>` when they had none).
    pub devices: Vec<RawElement>,
}

const GENERATED: &[&str] =
    &["name", "uuid", "title", "description", "metadata", "memory", "currentMemory", "vcpu", "devices"];

fn inject_mac(raw: &str, mac: Mac) -> String {
    let tag = format!("<mac address='{mac}'/>");
    let Some(close) = raw.find('>') else {
        return raw.to_string();
    };
    if raw[..close].ends_with('/') {
        format!("{}>{tag}</interface>", &raw[..close - 1].trim_end())
    } else {
        format!("{}{tag}{}", &raw[..=close], &raw[close + 1..])
    }
}

impl DomainDef {
    /// Parses domain XML as `virDomainDefineXML` does (UUID and MACs generated when absent).
    pub fn parse(xml: &str) -> Result<Self> {
        check_document(xml, "domain")?;
        let doc: DomainDoc = quick_xml::de::from_str(xml).map_err(|e| serde_error("domain", e))?;
        let kind = doc.kind.ok_or_else(|| Error::xml("missing domain type attribute"))?;
        let name = doc
            .name
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| Error::with_message(ErrorCode::NoName, "missing name information"))?;
        if name.contains('/') {
            return Err(Error::xml(format!("name {name} cannot contain '/'")));
        }
        let uuid = match doc.uuid {
            Some(u) => Uuid::parse(&u)?,
            None => Uuid::generate(),
        };
        let memory = doc
            .memory
            .ok_or_else(|| Error::xml("Memory size must be specified via <memory> or in the <numa> configuration"))?;
        let memory_kib = to_bytes(&memory.value, memory.unit.as_deref(), 1024, "memory")? / 1024;
        let current_memory_kib = match doc.current_memory {
            Some(c) => (to_bytes(&c.value, c.unit.as_deref(), 1024, "currentMemory")? / 1024).min(memory_kib),
            None => memory_kib,
        };
        let vcpus =
            match doc.vcpu {
                Some(v) => v.value.trim().parse().map_err(|_| {
                    Error::xml(format!("maximum vcpus count must be an integer, not '{}'", v.value.trim()))
                })?,
                None => 1,
            };
        let devices = doc.devices.unwrap_or(DevicesEl { disk: Vec::new(), interface: Vec::new() });
        let mut interfaces = Vec::new();
        for iface in &devices.interface {
            let mac = match iface.mac.as_ref().and_then(|m| m.address.as_deref()) {
                Some(text) => {
                    Mac::parse(text).ok_or_else(|| Error::xml(format!("unable to parse mac address '{text}'")))?
                }
                None => Mac::generate(),
            };
            let network = if iface.kind.as_deref() == Some("network") {
                iface.source.as_ref().and_then(|s| s.network.clone())
            } else {
                None
            };
            interfaces.push(Interface { mac, network });
        }
        let disks = devices
            .disk
            .iter()
            .map(|d| match (d.kind.as_deref(), &d.source) {
                (Some("file"), Some(DiskSourceEl { file: Some(f), .. })) => DiskSource::File(f.clone()),
                (Some("volume"), Some(DiskSourceEl { pool: Some(p), volume: Some(v), .. })) => {
                    DiskSource::Volume { pool: p.clone(), volume: v.clone() }
                }
                _ => DiskSource::Other,
            })
            .collect();
        let mut raw_devices = children_raw(xml, &["domain", "devices"]);
        let raw_interfaces = raw_devices.iter_mut().filter(|d| d.name == "interface");
        for (iface_index, dev) in raw_interfaces.enumerate() {
            let had_mac = devices
                .interface
                .get(iface_index)
                .is_some_and(|i| i.mac.as_ref().and_then(|m| m.address.as_ref()).is_some());
            if let (false, Some(iface)) = (had_mac, interfaces.get(iface_index)) {
                dev.raw = inject_mac(&dev.raw, iface.mac);
            }
        }
        let metadata = children_raw(xml, &["domain", "metadata"]).into_iter().map(|e| e.raw).collect();
        let other =
            children_raw(xml, &["domain"]).into_iter().filter(|e| !GENERATED.contains(&e.name.as_str())).collect();
        Ok(DomainDef {
            name,
            uuid,
            kind,
            title: doc.title,
            description: doc.description,
            memory_kib,
            current_memory_kib,
            vcpus,
            interfaces,
            disks,
            has_nvram: doc.os.is_some_and(|o| o.nvram.is_some()),
            metadata,
            other,
            devices: raw_devices,
        })
    }

    /// The domain XML in libvirt's layout; `id` is given for a running domain.
    pub fn to_xml(&self, id: Option<u32>) -> String {
        let mut x = String::new();
        match id {
            Some(id) => {
                let _ = writeln!(x, "<domain type='{}' id='{id}'>", escape(&self.kind));
            }
            None => {
                let _ = writeln!(x, "<domain type='{}'>", escape(&self.kind));
            }
        }
        let _ = writeln!(x, "  <name>{}</name>", escape(&self.name));
        let _ = writeln!(x, "  <uuid>{}</uuid>", self.uuid);
        if let Some(t) = &self.title {
            let _ = writeln!(x, "  <title>{}</title>", escape(t));
        }
        if let Some(d) = &self.description {
            let _ = writeln!(x, "  <description>{}</description>", escape(d));
        }
        if !self.metadata.is_empty() {
            x.push_str("  <metadata>\n");
            for m in &self.metadata {
                let _ = writeln!(x, "    {m}");
            }
            x.push_str("  </metadata>\n");
        }
        let _ = writeln!(x, "  <memory unit='KiB'>{}</memory>", self.memory_kib);
        let _ = writeln!(x, "  <currentMemory unit='KiB'>{}</currentMemory>", self.current_memory_kib);
        let _ = writeln!(x, "  <vcpu placement='static'>{}</vcpu>", self.vcpus);
        for e in &self.other {
            let _ = writeln!(x, "  {}", e.raw);
        }
        if self.devices.is_empty() {
            x.push_str("  <devices/>\n");
        } else {
            x.push_str("  <devices>\n");
            for d in &self.devices {
                let _ = writeln!(x, "    {}", d.raw);
            }
            x.push_str("  </devices>\n");
        }
        x.push_str("</domain>\n");
        x
    }
}

/// `virDomainState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DomainState {
    NoState = 0,
    Running = 1,
    Blocked = 2,
    Paused = 3,
    Shutdown = 4,
    Shutoff = 5,
    Crashed = 6,
    PmSuspended = 7,
}

impl DomainState {
    /// Whether libvirt counts a domain in this state as active (it has a QEMU process).
    pub fn is_active(self) -> bool {
        !matches!(self, DomainState::Shutoff)
    }
}

/// `virDomainUndefineFlagsValues`.
pub mod undefine_flags {
    pub const MANAGED_SAVE: u32 = 1;
    pub const SNAPSHOTS_METADATA: u32 = 2;
    pub const NVRAM: u32 = 4;
    pub const KEEP_NVRAM: u32 = 8;
    pub const CHECKPOINTS_METADATA: u32 = 16;
    pub const TPM: u32 = 32;
    pub const KEEP_TPM: u32 = 64;
}

/// A domain on a host: definition and runtime state.
#[derive(Debug, Clone)]
pub(crate) struct Domain {
    pub def: DomainDef,
    pub state: DomainState,
    pub reason: i32,
    pub id: Option<u32>,
    pub persistent: bool,
    pub autostart: bool,
    /// Host clock reading when the domain last started (drives the DHCP delay).
    pub started_at: Option<Duration>,
    /// How many times the domain was reset (`virDomainReset`) since it was defined.
    pub resets: u64,
}

impl Domain {
    /// `virDomainCreate`: shutoff -> running.
    pub fn start(&mut self, id: u32, now: Duration) -> Result<()> {
        if self.state.is_active() {
            return Err(Error::invalid("domain is already running"));
        }
        self.state = DomainState::Running;
        self.reason = 1; // VIR_DOMAIN_RUNNING_BOOTED
        self.id = Some(id);
        self.started_at = Some(now);
        Ok(())
    }

    /// `virDomainDestroy`: any active state -> shutoff.
    pub fn destroy(&mut self) -> Result<()> {
        if !self.state.is_active() {
            return Err(Error::invalid("domain is not running"));
        }
        self.stop(2); // VIR_DOMAIN_SHUTOFF_DESTROYED
        Ok(())
    }

    /// `virDomainReset`: QEMU's `system_reset` in the same process, so the id stays and
    /// so does the state (a paused domain stays paused). Only a crashed domain changes:
    /// libvirt's QEMU driver marks it paused (reason crashed) after the reset.
    pub fn reset(&mut self) -> Result<()> {
        if !self.state.is_active() {
            return Err(Error::invalid("domain is not running"));
        }
        if self.state == DomainState::Crashed {
            self.state = DomainState::Paused;
            self.reason = 10; // VIR_DOMAIN_PAUSED_CRASHED
        }
        self.resets += 1;
        Ok(())
    }

    /// `virDomainShutdown`: the guest powers off (the simulated guest always obeys).
    pub fn shutdown(&mut self) -> Result<()> {
        if self.state != DomainState::Running {
            return Err(Error::invalid("domain is not running"));
        }
        self.stop(1); // VIR_DOMAIN_SHUTOFF_SHUTDOWN
        Ok(())
    }

    pub fn stop(&mut self, reason: i32) {
        self.state = DomainState::Shutoff;
        self.reason = reason;
        self.id = None;
        self.started_at = None;
    }

    /// `virDomainSuspend`: running -> paused (paused stays paused).
    pub fn suspend(&mut self) -> Result<()> {
        match self.state {
            DomainState::Running | DomainState::Paused => {
                self.state = DomainState::Paused;
                self.reason = 1; // VIR_DOMAIN_PAUSED_USER
                Ok(())
            }
            DomainState::Shutoff => Err(Error::invalid("domain is not running")),
            _ => Err(Error::invalid(format!("domain '{}' is not in a state that can be suspended", self.def.name))),
        }
    }

    /// `virDomainResume`: paused -> running (running stays running).
    pub fn resume(&mut self) -> Result<()> {
        match self.state {
            DomainState::Paused | DomainState::Running => {
                self.state = DomainState::Running;
                self.reason = 5; // VIR_DOMAIN_RUNNING_UNPAUSED
                Ok(())
            }
            DomainState::Shutoff => Err(Error::invalid("domain is not running")),
            _ => Err(Error::invalid("domain is pmsuspended")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = "<domain type='qemu'><name>d</name><memory unit='MiB'>64</memory>\
        <metadata><c:m xmlns:c='urn:x'>v</c:m></metadata><os><type arch='x86_64'>hvm</type></os><foo bar='1'/>\
        <devices><disk type='file' device='disk'><source file='/p/d.qcow2'/></disk>\
        <interface type='network'><source network='n'/></interface><interface type='network'><mac address='52:54:00:00:00:07'/><source network='n'/></interface></devices></domain>";

    #[test]
    fn keeps_metadata_unknown_elements_and_fills_in_macs() {
        let def = DomainDef::parse(XML).unwrap();
        assert_eq!(def.memory_kib, 65536);
        assert_eq!(def.metadata, ["<c:m xmlns:c='urn:x'>v</c:m>"]);
        assert_eq!(def.disks, [DiskSource::File("/p/d.qcow2".into())]);
        assert_eq!(def.interfaces[1].mac.to_string(), "52:54:00:00:00:07");
        let xml = def.to_xml(None);
        assert!(xml.contains("<foo bar='1'/>"), "{xml}");
        assert!(xml.contains(&format!("<mac address='{}'/>", def.interfaces[0].mac)), "{xml}");
        let again = DomainDef::parse(&xml).unwrap();
        assert_eq!(again.interfaces, def.interfaces);
        assert_eq!(again.uuid, def.uuid);
        assert_eq!(again.metadata, def.metadata);
    }

    #[test]
    fn missing_name_and_type_are_refused() {
        assert_eq!(
            DomainDef::parse("<domain type='qemu'><memory>1</memory></domain>").unwrap_err().code(),
            ErrorCode::NoName
        );
        assert_eq!(
            DomainDef::parse("<domain><name>x</name><memory>1</memory></domain>").unwrap_err().code(),
            ErrorCode::XmlError
        );
    }

    #[test]
    fn state_machine_follows_libvirt() {
        let mut d = Domain {
            def: DomainDef::parse(XML).unwrap(),
            state: DomainState::Shutoff,
            reason: 0,
            id: None,
            persistent: true,
            autostart: false,
            started_at: None,
            resets: 0,
        };
        assert_eq!(d.destroy().unwrap_err().code(), ErrorCode::OperationInvalid);
        assert_eq!(d.suspend().unwrap_err().code(), ErrorCode::OperationInvalid);
        assert_eq!(d.reset().unwrap_err().code(), ErrorCode::OperationInvalid);
        d.start(1, Duration::ZERO).unwrap();
        assert_eq!(d.start(2, Duration::ZERO).unwrap_err().code(), ErrorCode::OperationInvalid);
        d.reset().unwrap();
        assert_eq!((d.state, d.reason, d.id, d.resets), (DomainState::Running, 1, Some(1), 1));
        d.suspend().unwrap();
        assert_eq!(d.state, DomainState::Paused);
        d.reset().unwrap();
        assert_eq!((d.state, d.reason, d.resets), (DomainState::Paused, 1, 2), "a reset keeps a paused domain paused");
        assert_eq!(d.start(2, Duration::ZERO).unwrap_err().code(), ErrorCode::OperationInvalid);
        d.resume().unwrap();
        d.shutdown().unwrap();
        assert_eq!((d.state, d.reason), (DomainState::Shutoff, 1));
        d.start(3, Duration::ZERO).unwrap();
        d.destroy().unwrap();
        assert_eq!((d.state, d.id), (DomainState::Shutoff, None));
    }
}
