//! What a host offers: domain types, memory, CPUs; and the capabilities XML.

use std::fmt::Write as _;

use crate::domain_capabilities::DomainCapabilities;
use crate::xml_scan::escape;

/// A simulated host's hardware and hypervisor offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    pub arch: String,
    /// Domain types offered, e.g. `["qemu", "kvm"]`.
    pub domain_types: Vec<String>,
    pub memory_kib: u64,
    pub cpus: u32,
    /// Free memory before any domain runs; running domains take their memory from it.
    pub free_memory_bytes: u64,
    pub emulator: String,
    pub machines: Vec<String>,
    /// What a domain on this host can have (CPU modes and models, firmware, TPM).
    pub domain: DomainCapabilities,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            arch: "x86_64".into(),
            domain_types: vec!["qemu".into(), "kvm".into()],
            memory_kib: 16 << 20,
            cpus: 8,
            free_memory_bytes: 15 << 30,
            emulator: "/usr/bin/qemu-system-x86_64".into(),
            machines: vec!["pc".into(), "q35".into()],
            domain: DomainCapabilities::default(),
        }
    }
}

/// `virNodeGetInfo`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfo {
    pub memory_kib: u64,
    pub cpus: u32,
}

impl Capabilities {
    /// The capabilities XML in libvirt's layout (the parts modeled).
    pub fn to_xml(&self, host_uuid: &str) -> String {
        let mut x = String::from("<capabilities>\n\n  <host>\n");
        let _ = writeln!(x, "    <uuid>{host_uuid}</uuid>");
        let _ = writeln!(
            x,
            "    <cpu>\n      <arch>{}</arch>\n      <topology sockets='1' dies='1' clusters='1' cores='{}' threads='1'/>\n    </cpu>",
            escape(&self.arch),
            self.cpus
        );
        let _ = writeln!(
            x,
            "    <topology>\n      <cells num='1'>\n        <cell id='0'>\n          <memory unit='KiB'>{}</memory>",
            self.memory_kib
        );
        let _ = writeln!(x, "          <cpus num='{}'>", self.cpus);
        for i in 0..self.cpus {
            let _ = writeln!(
                x,
                "            <cpu id='{i}' socket_id='0' die_id='0' cluster_id='0' core_id='{i}' siblings='{i}'/>"
            );
        }
        x.push_str("          </cpus>\n        </cell>\n      </cells>\n    </topology>\n  </host>\n\n");
        let _ = writeln!(
            x,
            "  <guest>\n    <os_type>hvm</os_type>\n    <arch name='{}'>\n      <wordsize>64</wordsize>",
            escape(&self.arch)
        );
        let _ = writeln!(x, "      <emulator>{}</emulator>", escape(&self.emulator));
        for m in &self.machines {
            let _ = writeln!(x, "      <machine>{}</machine>", escape(m));
        }
        for t in &self.domain_types {
            let _ = writeln!(x, "      <domain type='{}'/>", escape(t));
        }
        x.push_str("    </arch>\n  </guest>\n\n</capabilities>\n");
        x
    }
}
