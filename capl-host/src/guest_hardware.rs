//! The CPU and firmware a machine asks for (`spec.cpu`, `spec.firmware`):
//! the settings, the checks that need no host, and the checks against the
//! host's domain capabilities. Both run before anything is created.

use crate::domain_capabilities::DomainCapabilities;

/// `spec.cpu.mode`: how the guest CPU is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuMode {
    /// The host CPU as it is (KVM only).
    HostPassthrough,
    /// The named model closest to the host CPU, plus its extra features.
    HostModel,
    /// A named model (`spec.cpu.model`), exactly.
    Custom,
}

impl CpuMode {
    /// libvirt's name of the mode, which is also the API's.
    pub fn as_str(self) -> &'static str {
        match self {
            CpuMode::HostPassthrough => "host-passthrough",
            CpuMode::HostModel => "host-model",
            CpuMode::Custom => "custom",
        }
    }
}

/// `spec.cpu.topology`: how the vCPUs are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTopology {
    pub sockets: u32,
    pub cores: u32,
    pub threads: u32,
}

impl CpuTopology {
    pub fn vcpus(&self) -> u64 {
        u64::from(self.sockets) * u64::from(self.cores) * u64::from(self.threads)
    }
}

/// `spec.cpu`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSettings {
    pub mode: CpuMode,
    /// The model of [`CpuMode::Custom`], e.g. `qemu64`, `Skylake-Client`.
    pub model: Option<String>,
    pub topology: Option<CpuTopology>,
    /// The guest may run guests of its own (the host CPU's vmx or svm).
    pub nested_virtualization: bool,
}

/// `spec.firmware.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FirmwareType {
    #[default]
    Bios,
    Uefi,
}

impl FirmwareType {
    pub fn as_str(self) -> &'static str {
        match self {
            FirmwareType::Bios => "bios",
            FirmwareType::Uefi => "uefi",
        }
    }
}

/// `spec.firmware`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FirmwareSettings {
    pub kind: FirmwareType,
    /// UEFI Secure Boot with the usual keys enrolled (needs a q35 machine and SMM).
    pub secure_boot: bool,
    /// An emulated TPM 2.0 (swtpm on the host).
    pub tpm: bool,
}

impl FirmwareSettings {
    pub fn uefi(&self) -> bool {
        self.kind == FirmwareType::Uefi
    }
}

/// The QEMU machine type of a domain: on x86 with BIOS `pc` (i440fx), so
/// the seed ISO can be an IDE cdrom every guest kernel finds; with UEFI
/// `q35` (the seed is then a SATA cdrom), which Secure Boot needs, and
/// without which OVMF leaves the i440fx IDE controller in a state where
/// Linux's ata_piix never finds the cdrom; elsewhere the emulator's default.
pub fn machine_type(arch: &str, firmware: Option<&FirmwareSettings>) -> Option<&'static str> {
    if !matches!(arch, "x86_64" | "i686") {
        return None;
    }
    Some(if firmware.is_some_and(|f| f.uefi()) { "q35" } else { "pc" })
}

/// A setting that contradicts itself or `spec.vcpu`: the field, and what is
/// wrong with it and how to put it right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contradiction {
    pub field: &'static str,
    pub detail: String,
}

/// The checks that need no host: a custom mode has a model and only a
/// custom mode has one, the topology makes `vcpu` vCPUs, nested
/// virtualisation comes with a mode that carries the host's vmx or svm,
/// Secure Boot comes with UEFI.
pub fn check_settings(
    cpu: Option<&CpuSettings>,
    firmware: Option<&FirmwareSettings>,
    vcpu: u32,
) -> Result<(), Contradiction> {
    if let Some(cpu) = cpu {
        match (cpu.mode, &cpu.model) {
            (CpuMode::Custom, None) => {
                return Err(Contradiction {
                    field: "spec.cpu.model",
                    detail: "is required with spec.cpu.mode custom: name a CPU model the host lists (virsh domcapabilities shows them under <mode name='custom'>), e.g. qemu64".into(),
                });
            }
            (mode, Some(model)) if mode != CpuMode::Custom => {
                return Err(Contradiction {
                    field: "spec.cpu.model",
                    detail: format!(
                        "is \"{model}\" but spec.cpu.mode is {}, which takes no model: set mode custom to use the model, or drop the model",
                        mode.as_str()
                    ),
                });
            }
            _ => {}
        }
        if let Some(t) = cpu.topology {
            if t.sockets == 0 || t.cores == 0 || t.threads == 0 {
                return Err(Contradiction {
                    field: "spec.cpu.topology",
                    detail: format!(
                        "has {} sockets, {} cores and {} threads: each must be at least 1",
                        t.sockets, t.cores, t.threads
                    ),
                });
            }
            if t.vcpus() != u64::from(vcpu) {
                return Err(Contradiction {
                    field: "spec.cpu.topology",
                    detail: format!(
                        "{} sockets x {} cores x {} threads = {} vCPUs but spec.vcpu is {vcpu}: make them equal",
                        t.sockets,
                        t.cores,
                        t.threads,
                        t.vcpus()
                    ),
                });
            }
        }
        if cpu.nested_virtualization && cpu.mode == CpuMode::Custom {
            return Err(Contradiction {
                field: "spec.cpu.nestedVirtualization",
                detail: "needs spec.cpu.mode host-passthrough or host-model (which carry the host CPU's vmx or svm), not custom".into(),
            });
        }
    }
    if let Some(fw) = firmware
        && fw.secure_boot
        && !fw.uefi()
    {
        return Err(Contradiction {
            field: "spec.firmware.secureBoot",
            detail: format!(
                "needs spec.firmware.type uefi, not {}: set type uefi or drop secureBoot",
                fw.kind.as_str()
            ),
        });
    }
    Ok(())
}

/// A setting the host cannot give: the setting and its value, the reason
/// from the host's domain capabilities, and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    pub setting: String,
    pub reason: String,
    pub fix: &'static str,
}

/// The checks against the host's domain capabilities for the domain type
/// and machine the domain would have. `Ok` carries the feature nested
/// virtualisation requires (`vmx` or `svm`), when asked for.
pub fn check_host(
    caps: &DomainCapabilities,
    cpu: Option<&CpuSettings>,
    firmware: Option<&FirmwareSettings>,
) -> Result<Option<&'static str>, Unavailable> {
    let mut nested = None;
    if let Some(cpu) = cpu {
        let mode = cpu.mode.as_str();
        if !caps.cpu_mode_supported(mode) {
            let reason = if cpu.mode == CpuMode::HostPassthrough && caps.domain_type != "kvm" {
                format!(
                    "the host's domain capabilities list <mode name='{mode}' supported='no'> for domain type {} (no KVM: QEMU emulates the CPU and has no host CPU to pass through)",
                    caps.domain_type
                )
            } else {
                format!(
                    "the host's domain capabilities do not list <mode name='{mode}' supported='yes'> for domain type {}",
                    caps.domain_type
                )
            };
            return Err(Unavailable {
                setting: format!("spec.cpu.mode {mode}"),
                reason,
                fix: "use a mode the host supports (host-model, or custom with a model it lists), or a host with KVM",
            });
        }
        if let (CpuMode::Custom, Some(model)) = (cpu.mode, &cpu.model) {
            let reason = match caps.custom_model_usable(model) {
                Some(true) => None,
                Some(false) => Some(format!(
                    "the host lists it with usable='no' for domain type {}: the host CPU (or QEMU's emulation) lacks some of its features",
                    caps.domain_type
                )),
                None => Some(format!(
                    "the host does not list it among the models of <mode name='custom'> for domain type {}",
                    caps.domain_type
                )),
            };
            if let Some(reason) = reason {
                return Err(Unavailable {
                    setting: format!("spec.cpu.model \"{model}\""),
                    reason,
                    fix: "name a model the host lists as usable (virsh domcapabilities shows them)",
                });
            }
        }
        if cpu.nested_virtualization {
            nested = caps.nested_feature();
            if nested.is_none() {
                return Err(Unavailable {
                    setting: "spec.cpu.nestedVirtualization true".into(),
                    reason: format!(
                        "the host CPU as domain type {} offers it has neither vmx nor svm (the features of <mode name='host-model'>)",
                        caps.domain_type
                    ),
                    fix: "use a host with KVM whose CPU has vmx (Intel) or svm (AMD) and nested virtualisation on (the kvm_intel or kvm_amd module's nested parameter), or drop nestedVirtualization",
                });
            }
        }
    }
    if let Some(fw) = firmware {
        if fw.uefi() && (!caps.firmware.iter().any(|f| f == "efi") || caps.loaders.is_empty()) {
            return Err(Unavailable {
                setting: "spec.firmware.type uefi".into(),
                reason: format!(
                    "the host's domain capabilities for machine {} offer no EFI firmware (<os><enum name='firmware'> lists {}, and {} loader images)",
                    caps.machine,
                    listed(&caps.firmware),
                    caps.loaders.len()
                ),
                fix: "install OVMF on the host (Debian and Ubuntu: apt-get install ovmf) and restart libvirtd, or use type bios",
            });
        }
        if fw.secure_boot && !caps.secure.iter().any(|s| s == "yes") {
            return Err(Unavailable {
                setting: "spec.firmware.secureBoot true".into(),
                reason: format!(
                    "the host's domain capabilities for machine {} offer no Secure Boot loader (<loader><enum name='secure'> lists {})",
                    caps.machine,
                    listed(&caps.secure)
                ),
                fix: "install OVMF with its Secure Boot images on the host (Debian and Ubuntu: the ovmf package) and restart libvirtd, or drop secureBoot",
            });
        }
        if fw.tpm {
            let reason = if !caps.tpm_supported {
                Some("the host's domain capabilities say <tpm supported='no'>".to_string())
            } else if !caps.tpm_backends.iter().any(|b| b == "emulator") {
                Some(format!(
                    "the host offers no emulated TPM (<tpm><enum name='backendModel'> lists {})",
                    listed(&caps.tpm_backends)
                ))
            } else if !caps.tpm_models.iter().any(|m| m == "tpm-crb") {
                Some(format!(
                    "the host offers no tpm-crb model (<tpm><enum name='model'> lists {})",
                    listed(&caps.tpm_models)
                ))
            } else if !caps.tpm_versions.is_empty() && !caps.tpm_versions.iter().any(|v| v == "2.0") {
                Some(format!(
                    "the host offers no TPM 2.0 (<tpm><enum name='backendVersion'> lists {})",
                    listed(&caps.tpm_versions)
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(Unavailable {
                    setting: "spec.firmware.tpm true".into(),
                    reason,
                    fix: "install swtpm and swtpm-tools on the host and restart libvirtd, or drop tpm",
                });
            }
        }
    }
    Ok(nested)
}

fn listed(values: &[String]) -> String {
    if values.is_empty() { "nothing".into() } else { values.join(", ") }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn cpu(mode: CpuMode, model: Option<&str>, topology: Option<(u32, u32, u32)>, nested: bool) -> CpuSettings {
        CpuSettings {
            mode,
            model: model.map(str::to_string),
            topology: topology.map(|(sockets, cores, threads)| CpuTopology { sockets, cores, threads }),
            nested_virtualization: nested,
        }
    }

    fn firmware(kind: FirmwareType, secure_boot: bool, tpm: bool) -> FirmwareSettings {
        FirmwareSettings { kind, secure_boot, tpm }
    }

    #[rstest]
    #[case::custom_without_model(
        Some(cpu(CpuMode::Custom, None, None, false)),
        None,
        1,
        "spec.cpu.model",
        "is required with spec.cpu.mode custom"
    )]
    #[case::model_without_custom(
        Some(cpu(CpuMode::HostModel, Some("qemu64"), None, false)),
        None,
        1,
        "spec.cpu.model",
        "is \"qemu64\" but spec.cpu.mode is host-model, which takes no model"
    )]
    #[case::topology_too_small(Some(cpu(CpuMode::HostModel, None, Some((2, 2, 1)), false)), None, 2, "spec.cpu.topology", "2 sockets x 2 cores x 1 threads = 4 vCPUs but spec.vcpu is 2: make them equal")]
    #[case::topology_zero(Some(cpu(CpuMode::HostModel, None, Some((0, 2, 1)), false)), None, 2, "spec.cpu.topology", "each must be at least 1")]
    #[case::nested_custom(
        Some(cpu(CpuMode::Custom, Some("qemu64"), None, true)),
        None,
        1,
        "spec.cpu.nestedVirtualization",
        "needs spec.cpu.mode host-passthrough or host-model"
    )]
    #[case::secure_boot_bios(
        None,
        Some(firmware(FirmwareType::Bios, true, false)),
        1,
        "spec.firmware.secureBoot",
        "needs spec.firmware.type uefi, not bios"
    )]
    fn contradictions_are_refused(
        #[case] cpu: Option<CpuSettings>,
        #[case] fw: Option<FirmwareSettings>,
        #[case] vcpu: u32,
        #[case] field: &str,
        #[case] detail: &str,
    ) {
        let err = check_settings(cpu.as_ref(), fw.as_ref(), vcpu).unwrap_err();
        assert_eq!(err.field, field);
        assert!(err.detail.contains(detail), "{}", err.detail);
    }

    #[rstest]
    #[case::nothing(None, None, 1)]
    #[case::custom_with_topology(Some(cpu(CpuMode::Custom, Some("qemu64"), Some((2, 2, 1)), false)), None, 4)]
    #[case::nested_host_model(Some(cpu(CpuMode::HostModel, None, None, true)), None, 1)]
    #[case::nested_passthrough(Some(cpu(CpuMode::HostPassthrough, None, Some((1, 2, 2)), true)), None, 4)]
    #[case::secure_boot_uefi(None, Some(firmware(FirmwareType::Uefi, true, true)), 1)]
    #[case::tpm_with_bios(None, Some(firmware(FirmwareType::Bios, false, true)), 1)]
    fn consistent_settings_pass(
        #[case] cpu: Option<CpuSettings>,
        #[case] fw: Option<FirmwareSettings>,
        #[case] vcpu: u32,
    ) {
        assert_eq!(check_settings(cpu.as_ref(), fw.as_ref(), vcpu), Ok(()));
    }

    /// What QEMU under TCG on x86_64 offers with OVMF and swtpm (machine q35).
    fn tcg() -> DomainCapabilities {
        DomainCapabilities {
            domain_type: "qemu".into(),
            machine: "pc-q35-10.0".into(),
            cpu_modes: vec![("host-passthrough".into(), false), ("host-model".into(), true), ("custom".into(), true)],
            custom_models: vec![("qemu64".into(), true), ("Skylake-Client".into(), false)],
            host_model_features: vec!["x2apic".into()],
            firmware: vec!["bios".into(), "efi".into()],
            loaders: vec!["/usr/share/OVMF/OVMF_CODE_4M.fd".into()],
            secure: vec!["yes".into(), "no".into()],
            tpm_supported: true,
            tpm_models: vec!["tpm-tis".into(), "tpm-crb".into()],
            tpm_backends: vec!["passthrough".into(), "emulator".into()],
            tpm_versions: vec!["2.0".into()],
        }
    }

    #[rstest]
    #[case::passthrough_without_kvm(|_: &mut DomainCapabilities| {}, Some(cpu(CpuMode::HostPassthrough, None, None, false)), None, "spec.cpu.mode host-passthrough", "supported='no'> for domain type qemu (no KVM")]
    #[case::unlisted_model(|_: &mut DomainCapabilities| {}, Some(cpu(CpuMode::Custom, Some("Penryn"), None, false)), None, "spec.cpu.model \"Penryn\"", "does not list it among the models")]
    #[case::unusable_model(|_: &mut DomainCapabilities| {}, Some(cpu(CpuMode::Custom, Some("Skylake-Client"), None, false)), None, "spec.cpu.model \"Skylake-Client\"", "usable='no'")]
    #[case::nested_without_vmx(|_: &mut DomainCapabilities| {}, Some(cpu(CpuMode::HostModel, None, None, true)), None, "spec.cpu.nestedVirtualization true", "neither vmx nor svm")]
    #[case::no_efi(|c: &mut DomainCapabilities| c.firmware = vec!["bios".into()], None, Some(firmware(FirmwareType::Uefi, false, false)), "spec.firmware.type uefi", "lists bios")]
    #[case::no_loader(|c: &mut DomainCapabilities| c.loaders.clear(), None, Some(firmware(FirmwareType::Uefi, false, false)), "spec.firmware.type uefi", "and 0 loader images")]
    #[case::no_secure_loader(|c: &mut DomainCapabilities| c.secure = vec!["no".into()], None, Some(firmware(FirmwareType::Uefi, true, false)), "spec.firmware.secureBoot true", "<loader><enum name='secure'> lists no")]
    #[case::tpm_unsupported(|c: &mut DomainCapabilities| c.tpm_supported = false, None, Some(firmware(FirmwareType::Bios, false, true)), "spec.firmware.tpm true", "<tpm supported='no'>")]
    #[case::no_swtpm(|c: &mut DomainCapabilities| c.tpm_backends = vec!["passthrough".into()], None, Some(firmware(FirmwareType::Uefi, false, true)), "spec.firmware.tpm true", "no emulated TPM")]
    fn what_the_host_cannot_do_is_refused_with_its_reason(
        #[case] change: fn(&mut DomainCapabilities),
        #[case] cpu: Option<CpuSettings>,
        #[case] fw: Option<FirmwareSettings>,
        #[case] setting: &str,
        #[case] reason: &str,
    ) {
        let mut caps = tcg();
        change(&mut caps);
        let err = check_host(&caps, cpu.as_ref(), fw.as_ref()).unwrap_err();
        assert_eq!(err.setting, setting);
        assert!(err.reason.contains(reason), "{}", err.reason);
    }

    #[test]
    fn what_the_host_offers_passes_and_nested_takes_its_feature() {
        let mut caps = tcg();
        let custom = cpu(CpuMode::Custom, Some("qemu64"), Some((1, 2, 1)), false);
        let uefi = firmware(FirmwareType::Uefi, true, true);
        assert_eq!(check_host(&caps, Some(&custom), Some(&uefi)), Ok(None));
        caps.host_model_features.push("vmx".into());
        let nested = cpu(CpuMode::HostModel, None, None, true);
        assert_eq!(check_host(&caps, Some(&nested), None), Ok(Some("vmx")));
    }

    #[test]
    fn q35_only_for_secure_boot_on_x86() {
        let secure = firmware(FirmwareType::Uefi, true, false);
        let uefi = firmware(FirmwareType::Uefi, false, true);
        assert_eq!(machine_type("x86_64", None), Some("pc"));
        assert_eq!(machine_type("x86_64", Some(&uefi)), Some("q35"));
        assert_eq!(machine_type("x86_64", Some(&secure)), Some("q35"));
        assert_eq!(machine_type("aarch64", Some(&secure)), None);
    }
}
