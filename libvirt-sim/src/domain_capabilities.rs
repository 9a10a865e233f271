//! What the hypervisor offers a domain of one type and machine: CPU modes and
//! models, firmware, TPM; and the domain capabilities XML
//! (`virConnectGetDomainCapabilities`).

use std::fmt::Write as _;

use crate::xml_scan::escape;

/// A simulated host's domain capabilities. The default is what QEMU 10 on
/// an x86_64 host offers with OVMF and swtpm installed: host-passthrough
/// only for kvm (under TCG, domain type qemu, libvirt reports it
/// `supported='no'`), a host-model without vmx or svm, the usual named
/// models, EFI firmware with Secure Boot on q35, and an emulated TPM 2.0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainCapabilities {
    /// The model host-model expands to.
    pub host_model: String,
    pub host_model_vendor: String,
    /// The features host-model requires on top of its model, e.g. `vmx`
    /// when the host can run nested guests.
    pub host_model_features: Vec<String>,
    /// The models of custom mode and whether each is usable on this host.
    pub custom_models: Vec<(String, bool)>,
    /// The values of `<os><enum name='firmware'>`, e.g. `bios`, `efi`.
    pub firmware: Vec<String>,
    /// The firmware images the host has (`<loader><value>`).
    pub loaders: Vec<String>,
    /// Whether a Secure Boot loader exists (offered for q35 machines only).
    pub secure_boot: bool,
    pub tpm_supported: bool,
    /// The values of `<tpm><enum name='backendModel'>`.
    pub tpm_backends: Vec<String>,
}

impl Default for DomainCapabilities {
    fn default() -> Self {
        let models = [
            ("qemu64", true),
            ("qemu32", true),
            ("kvm64", true),
            ("Nehalem", true),
            ("Westmere", true),
            ("SandyBridge", true),
            ("Haswell", false),
            ("Skylake-Client", false),
            ("EPYC", false),
        ];
        Self {
            host_model: "Westmere".into(),
            host_model_vendor: "Intel".into(),
            host_model_features: vec!["x2apic".into(), "hypervisor".into(), "lahf_lm".into()],
            custom_models: models.iter().map(|(m, usable)| (m.to_string(), *usable)).collect(),
            firmware: vec!["bios".into(), "efi".into()],
            loaders: vec!["/usr/share/OVMF/OVMF_CODE_4M.fd".into(), "/usr/share/OVMF/OVMF_CODE_4M.ms.fd".into()],
            secure_boot: true,
            tpm_supported: true,
            tpm_backends: vec!["passthrough".into(), "emulator".into()],
        }
    }
}

impl DomainCapabilities {
    /// The domain capabilities XML in libvirt's layout (the parts modeled)
    /// for a domain of type `virttype` on `machine` (`pc`, `q35`, ...).
    pub fn to_xml(&self, emulator: &str, arch: &str, machine: &str, virttype: &str) -> String {
        let mut x = String::from("<domainCapabilities>\n");
        let _ = writeln!(x, "  <path>{}</path>", escape(emulator));
        let _ = writeln!(x, "  <domain>{}</domain>", escape(virttype));
        let _ = writeln!(x, "  <machine>{}</machine>", escape(machine));
        let _ = writeln!(x, "  <arch>{}</arch>", escape(arch));
        x.push_str("  <vcpu max='255'/>\n  <iothreads supported='yes'/>\n  <os supported='yes'>\n");
        enum_xml(&mut x, "    ", "firmware", &self.firmware);
        let supported = yes_no(!self.loaders.is_empty());
        let _ = writeln!(x, "    <loader supported='{supported}'>");
        for loader in &self.loaders {
            let _ = writeln!(x, "      <value>{}</value>", escape(loader));
        }
        enum_xml(&mut x, "      ", "type", &["rom", "pflash"]);
        enum_xml(&mut x, "      ", "readonly", &["yes", "no"]);
        let secure: &[&str] = if self.secure_boot && machine.contains("q35") { &["yes", "no"] } else { &["no"] };
        enum_xml(&mut x, "      ", "secure", secure);
        x.push_str("    </loader>\n  </os>\n  <cpu>\n");
        let _ = writeln!(x, "    <mode name='host-passthrough' supported='{}'/>", yes_no(virttype == "kvm"));
        x.push_str("    <mode name='host-model' supported='yes'>\n");
        let _ = writeln!(x, "      <model fallback='forbid'>{}</model>", escape(&self.host_model));
        let _ = writeln!(x, "      <vendor>{}</vendor>", escape(&self.host_model_vendor));
        for feature in &self.host_model_features {
            let _ = writeln!(x, "      <feature policy='require' name='{}'/>", escape(feature));
        }
        x.push_str("    </mode>\n    <mode name='custom' supported='yes'>\n");
        for (model, usable) in &self.custom_models {
            let _ = writeln!(
                x,
                "      <model usable='{}' vendor='unknown' canonical='{m}'>{m}</model>",
                yes_no(*usable),
                m = escape(model)
            );
        }
        x.push_str("    </mode>\n  </cpu>\n  <devices>\n");
        let _ = writeln!(x, "    <tpm supported='{}'>", yes_no(self.tpm_supported));
        if self.tpm_supported {
            enum_xml(&mut x, "      ", "model", &["tpm-tis", "tpm-crb"]);
            enum_xml(&mut x, "      ", "backendModel", &self.tpm_backends);
            enum_xml(&mut x, "      ", "backendVersion", &["2.0"]);
        }
        x.push_str("    </tpm>\n  </devices>\n  <features>\n");
        let _ = writeln!(x, "    <smm supported='{}'/>", yes_no(machine.contains("q35")));
        x.push_str("  </features>\n</domainCapabilities>\n");
        x
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn enum_xml(x: &mut String, indent: &str, name: &str, values: &[impl AsRef<str>]) {
    let _ = writeln!(x, "{indent}<enum name='{name}'>");
    for value in values {
        let _ = writeln!(x, "{indent}  <value>{}</value>", escape(value.as_ref()));
    }
    let _ = writeln!(x, "{indent}</enum>");
}
