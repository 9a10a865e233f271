//! The host's domain capabilities (`virConnectGetDomainCapabilities`), read
//! into what the CPU and firmware checks need.

use crate::xml_tree::XmlElement;

/// What a domain of one type and machine can have on a host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainCapabilities {
    /// `kvm` or `qemu`, as the document says.
    pub domain_type: String,
    /// The machine type the document is for, e.g. `pc-i440fx-10.0`.
    pub machine: String,
    /// The CPU modes (`host-passthrough`, `host-model`, `custom`, ...) and
    /// whether each is supported.
    pub cpu_modes: Vec<(String, bool)>,
    /// The models of custom mode and whether each is usable on this host.
    pub custom_models: Vec<(String, bool)>,
    /// The features host-model requires on top of its model (`vmx`, `svm`, ...).
    pub host_model_features: Vec<String>,
    /// `<os><enum name='firmware'>`: `bios`, `efi`.
    pub firmware: Vec<String>,
    /// The firmware images the host has (`<loader><value>`).
    pub loaders: Vec<String>,
    /// `<loader><enum name='secure'>`: `yes` when a Secure Boot loader exists.
    pub secure: Vec<String>,
    /// `<tpm supported='yes'>`.
    pub tpm_supported: bool,
    /// `<tpm><enum name='model'>`: `tpm-tis`, `tpm-crb`.
    pub tpm_models: Vec<String>,
    /// `<tpm><enum name='backendModel'>`: `passthrough`, `emulator`, `external`.
    pub tpm_backends: Vec<String>,
    /// `<tpm><enum name='backendVersion'>`: `1.2`, `2.0`; empty when not listed.
    pub tpm_versions: Vec<String>,
}

impl DomainCapabilities {
    /// Parses `virConnectGetDomainCapabilities` output.
    pub fn parse(xml: &str) -> Result<Self, String> {
        let root = XmlElement::parse(xml)?;
        if root.name != "domainCapabilities" {
            return Err(format!("expected <domainCapabilities>, found <{}>", root.name));
        }
        let modes: Vec<&XmlElement> = root.child("cpu").into_iter().flat_map(|c| c.children_named("mode")).collect();
        let mode = |name: &str| modes.iter().copied().find(|m| m.attr("name") == Some(name));
        let models = |mode: Option<&XmlElement>| -> Vec<(String, bool)> {
            mode.into_iter()
                .flat_map(|m| m.children_named("model"))
                .map(|m| (m.text.trim().to_string(), m.attr("usable") != Some("no")))
                .collect()
        };
        let os = root.child("os");
        let loader = os.and_then(|os| os.child("loader"));
        let tpm = root.path(&["devices", "tpm"]);
        Ok(Self {
            domain_type: root.path_text(&["domain"]).unwrap_or_default().trim().to_string(),
            machine: root.path_text(&["machine"]).unwrap_or_default().trim().to_string(),
            cpu_modes: modes
                .iter()
                .filter_map(|m| Some((m.attr("name")?.to_string(), m.attr("supported") == Some("yes"))))
                .collect(),
            custom_models: models(mode("custom")),
            host_model_features: mode("host-model")
                .into_iter()
                .flat_map(|m| m.children_named("feature"))
                .filter(|f| f.attr("policy") != Some("disable") && f.attr("policy") != Some("forbid"))
                .filter_map(|f| f.attr("name").map(str::to_string))
                .collect(),
            firmware: enum_values(os, "firmware"),
            loaders: loader
                .filter(|l| l.attr("supported") != Some("no"))
                .into_iter()
                .flat_map(|l| l.children_named("value"))
                .map(|v| v.text.trim().to_string())
                .collect(),
            secure: enum_values(loader, "secure"),
            tpm_supported: tpm.is_some_and(|t| t.attr("supported") == Some("yes")),
            tpm_models: enum_values(tpm, "model"),
            tpm_backends: enum_values(tpm, "backendModel"),
            tpm_versions: enum_values(tpm, "backendVersion"),
        })
    }

    /// Whether the CPU mode is listed and supported.
    pub fn cpu_mode_supported(&self, mode: &str) -> bool {
        self.cpu_modes.iter().any(|(m, supported)| m == mode && *supported)
    }

    /// The custom model `name`: `None` when not listed, else whether it is usable.
    pub fn custom_model_usable(&self, name: &str) -> Option<bool> {
        self.custom_models.iter().find(|(m, _)| m == name).map(|(_, usable)| *usable)
    }

    /// The host CPU's virtualisation feature a nested guest needs: `vmx`
    /// (Intel) or `svm` (AMD), when host-model offers one.
    pub fn nested_feature(&self) -> Option<&'static str> {
        ["vmx", "svm"].into_iter().find(|f| self.host_model_features.iter().any(|h| h == f))
    }
}

/// The values of `<enum name='NAME'>` under `parent`.
fn enum_values(parent: Option<&XmlElement>, name: &str) -> Vec<String> {
    parent
        .into_iter()
        .flat_map(|p| p.children_named("enum"))
        .filter(|e| e.attr("name") == Some(name))
        .flat_map(|e| e.children_named("value"))
        .map(|v| v.text.trim().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trimmed from libvirt 11.3 with QEMU 10.0 on an x86_64 host without
    /// KVM (domain type qemu, machine q35), OVMF and swtpm installed.
    const TCG_Q35: &str = "<domainCapabilities>
  <path>/usr/bin/qemu-system-x86_64</path>
  <domain>qemu</domain>
  <machine>pc-q35-10.0</machine>
  <arch>x86_64</arch>
  <vcpu max='4096'/>
  <os supported='yes'>
    <enum name='firmware'><value>bios</value><value>efi</value></enum>
    <loader supported='yes'>
      <value>/usr/share/OVMF/OVMF_CODE_4M.ms.fd</value>
      <value>/usr/share/OVMF/OVMF_CODE_4M.fd</value>
      <enum name='type'><value>rom</value><value>pflash</value></enum>
      <enum name='readonly'><value>yes</value><value>no</value></enum>
      <enum name='secure'><value>yes</value><value>no</value></enum>
    </loader>
  </os>
  <cpu>
    <mode name='host-passthrough' supported='no'/>
    <mode name='maximum' supported='yes'>
      <enum name='maximumMigratable'><value>on</value><value>off</value></enum>
    </mode>
    <mode name='host-model' supported='yes'>
      <model fallback='forbid'>EPYC-Milan</model>
      <vendor>AMD</vendor>
      <feature policy='require' name='x2apic'/>
      <feature policy='require' name='svm'/>
      <feature policy='disable' name='vmx'/>
    </mode>
    <mode name='custom' supported='yes'>
      <model usable='yes' vendor='unknown' canonical='qemu64'>qemu64</model>
      <model usable='no' vendor='Intel' canonical='Skylake-Client-v1'>Skylake-Client</model>
      <blockers model='Skylake-Client'><feature name='hle'/></blockers>
    </mode>
  </cpu>
  <devices>
    <tpm supported='yes'>
      <enum name='model'><value>tpm-tis</value><value>tpm-crb</value></enum>
      <enum name='backendModel'><value>passthrough</value><value>emulator</value><value>external</value></enum>
      <enum name='backendVersion'><value>2.0</value></enum>
    </tpm>
  </devices>
</domainCapabilities>";

    #[test]
    fn reads_modes_models_firmware_and_tpm() {
        let caps = DomainCapabilities::parse(TCG_Q35).unwrap();
        assert_eq!(caps.domain_type, "qemu");
        assert_eq!(caps.machine, "pc-q35-10.0");
        assert!(!caps.cpu_mode_supported("host-passthrough"));
        assert!(caps.cpu_mode_supported("host-model"));
        assert!(caps.cpu_mode_supported("custom"));
        assert_eq!(caps.custom_model_usable("qemu64"), Some(true));
        assert_eq!(caps.custom_model_usable("Skylake-Client"), Some(false));
        assert_eq!(caps.custom_model_usable("Penryn"), None);
        assert_eq!(caps.host_model_features, ["x2apic", "svm"]);
        assert_eq!(caps.nested_feature(), Some("svm"));
        assert_eq!(caps.firmware, ["bios", "efi"]);
        assert_eq!(caps.loaders.len(), 2);
        assert_eq!(caps.secure, ["yes", "no"]);
        assert!(caps.tpm_supported);
        assert_eq!(caps.tpm_models, ["tpm-tis", "tpm-crb"]);
        assert_eq!(caps.tpm_backends, ["passthrough", "emulator", "external"]);
        assert_eq!(caps.tpm_versions, ["2.0"]);
    }

    #[test]
    fn a_host_without_ovmf_or_swtpm_offers_neither() {
        let xml = "<domainCapabilities><domain>kvm</domain><os supported='yes'>
            <enum name='firmware'><value>bios</value></enum><loader supported='no'/></os>
            <cpu><mode name='host-passthrough' supported='yes'/></cpu>
            <devices><tpm supported='no'/></devices></domainCapabilities>";
        let caps = DomainCapabilities::parse(xml).unwrap();
        assert!(caps.cpu_mode_supported("host-passthrough"));
        assert_eq!(caps.firmware, ["bios"]);
        assert!(caps.loaders.is_empty());
        assert!(!caps.tpm_supported);
        assert_eq!(caps.nested_feature(), None);
    }

    #[test]
    fn another_document_is_refused() {
        assert!(DomainCapabilities::parse("<capabilities/>").is_err());
    }
}
