//! The machine's domain: ours or a collision, define, autostart, start, remove.

use crate::domain_capabilities::DomainCapabilities;
use crate::domain_xml::{DomainDefinition, DomainInfo, choose_domain_type, domain_xml, host_kvm_support, parse_domain};
use crate::error::{HostError, HostResult, ObjectKind};
use crate::guest_hardware::{check_host, machine_type};
use crate::hypervisor::{DomainState, ErrorKind, HypervisorError, UndefineFlags};

use super::{MachineRun, Platform};

impl MachineRun<'_> {
    /// The domain with our name: `None` when absent, an error when it is not ours.
    pub(super) fn owned_domain(&self) -> HostResult<Option<DomainInfo>> {
        let Some(info) = self.domain_at_our_name()? else { return Ok(None) };
        match self.not_ours(&info) {
            None => Ok(Some(info)),
            Some(why) => Err(self.collision(ObjectKind::Domain, &self.names.domain, why)),
        }
    }

    /// The domain with our name, ours or not: `None` when absent.
    pub(super) fn domain_at_our_name(&self) -> HostResult<Option<DomainInfo>> {
        self.domain_named(&self.names.domain)
    }

    /// The domain `domain`, whoever's it is: `None` when it does not exist.
    pub(super) fn domain_named(&self, domain: &str) -> HostResult<Option<DomainInfo>> {
        let xml = match self.hv.domain_xml(domain) {
            Ok(xml) => xml,
            Err(e) if e.kind == ErrorKind::NoDomain => return Ok(None),
            Err(e) => return Err(self.error("read", ObjectKind::Domain, domain, e)),
        };
        parse_domain(&xml).map(Some).map_err(|e| self.unreadable(ObjectKind::Domain, domain, e))
    }

    /// Why the domain `info` (at our name) is not this machine's; `None` when it is.
    pub(super) fn not_ours(&self, info: &DomainInfo) -> Option<String> {
        match &info.owner {
            Some(owner) if owner.uid == self.spec.identity => None,
            Some(owner) => Some(format!(
                "its metadata names LibvirtMachine {}/{} with identity {}, not {}",
                owner.namespace, owner.name, owner.uid, self.spec.identity
            )),
            None => Some("it carries no cluster-api-provider-libvirt metadata".into()),
        }
    }

    /// The MAC of the domain's interface: the one of our MAC candidates it
    /// has (the one it reserved its address with), else its first interface's.
    pub(super) fn domain_mac(&self, info: &DomainInfo) -> Option<String> {
        let candidates = self.names.mac_candidates();
        info.macs.iter().find(|mac| candidates.contains(mac)).or(info.macs.first()).cloned()
    }

    /// Whether our domain is defined; remembers "absent" so later steps need not ask again.
    pub(super) fn domain_defined(&mut self) -> HostResult<bool> {
        if self.domain_absent {
            return Ok(false);
        }
        let defined = self.owned_domain()?.is_some();
        self.domain_absent = !defined;
        Ok(defined)
    }

    pub(super) fn domain_state(&self) -> HostResult<DomainState> {
        self.hv
            .domain_state(&self.names.domain)
            .map_err(|e| self.error("read the state of", ObjectKind::Domain, &self.names.domain, e))
    }

    pub(super) fn ensure_defined(&mut self) -> HostResult<()> {
        if self.domain_defined()? {
            return Ok(());
        }
        let mac = self.reserved_mac()?;
        let Platform { arch, domain_type, nested_feature } = match self.platform.take() {
            Some(known) => known,
            None => {
                let (arch, domain_type) = self.host_platform()?;
                let nested_feature = self.checked_guest_hardware(&arch, domain_type)?;
                Platform { arch, domain_type, nested_feature }
            }
        };
        let definition = DomainDefinition {
            name: self.names.domain.clone(),
            uuid: self.spec.identity.clone(),
            domain_type: domain_type.to_string(),
            arch,
            vcpu: self.spec.vcpu,
            memory_mib: self.spec.memory_mib,
            overlay_path: self.overlay_path()?,
            iso_path: self.seed_path()?,
            network: self.spec.network.clone(),
            mac,
            additional_nics: self.additional_devices(),
            console_log_path: self
                .spec
                .console_log_dir
                .as_ref()
                .map(|dir| format!("{dir}/{}-console.log", self.names.domain)),
            owner: self.spec.owner(),
            cpu: self.spec.cpu.clone(),
            nested_feature: nested_feature.map(str::to_string),
            firmware: self.spec.firmware,
            data_disks: self.data_disk_devices()?,
            ignition_path: self.ignition_path()?,
        };
        match self.hv.domain_define(&domain_xml(&definition)) {
            Ok(_) => {
                self.defined_now = true;
                self.domain_absent = false;
                Ok(())
            }
            // A domain with our UUID under another name (libvirt: "domain 'x' already exists with uuid ...").
            Err(e) if e.is_domain_exists() => Err(self.collision(
                ObjectKind::Domain,
                &self.names.domain,
                format!("libvirt refused to define it with UUID {}: {}", self.spec.identity, e.message),
            )),
            Err(e) => Err(self
                .console_log_error(&e)
                .unwrap_or_else(|| self.error("define", ObjectKind::Domain, &self.names.domain, e))),
        }
    }

    /// The host architecture and the domain type the domain gets there.
    pub(super) fn host_platform(&self) -> HostResult<(String, &'static str)> {
        let (arch, kvm) = match self.hv.capabilities_xml() {
            Ok(xml) => host_kvm_support(&xml).map_err(|e| self.unreadable(ObjectKind::Host, &self.uri, e))?,
            Err(e) => return Err(self.error("read the capabilities of", ObjectKind::Host, &self.uri.clone(), e)),
        };
        Ok((arch, choose_domain_type(self.spec.domain_type, kvm)))
    }

    /// Whether the host offers the CPU and firmware the machine asks for,
    /// by its domain capabilities for the domain's type and machine type;
    /// the feature nested virtualisation requires, when asked for. Without
    /// such settings nothing is asked of the host.
    pub(super) fn checked_guest_hardware(&self, arch: &str, domain_type: &str) -> HostResult<Option<&'static str>> {
        if !self.spec.asks_for_guest_hardware() {
            return Ok(None);
        }
        let machine = machine_type(arch, self.spec.firmware.as_ref());
        let xml = self
            .hv
            .domain_capabilities_xml(arch, machine, domain_type)
            .map_err(|e| self.error("read the domain capabilities of", ObjectKind::Host, &self.uri.clone(), e))?;
        let caps = DomainCapabilities::parse(&xml).map_err(|e| self.unreadable(ObjectKind::Host, &self.uri, e))?;
        check_host(&caps, self.spec.cpu.as_ref(), self.spec.firmware.as_ref()).map_err(|u| {
            HostError::GuestHardwareUnavailable {
                setting: u.setting,
                uri: self.uri.clone(),
                reason: u.reason,
                fix: u.fix,
            }
        })
    }

    /// A define or start that failed because the console log directory does
    /// not exist on the host. libvirt (virtlogd) says "Unable to open file:
    /// <dir>/<domain>-console.log: No such file or directory".
    pub(super) fn console_log_error(&self, e: &HypervisorError) -> Option<HostError> {
        let dir = self.spec.console_log_dir.as_ref()?;
        e.is_missing_file_in(dir).then(|| HostError::ConsoleLogDirMissing {
            dir: dir.clone(),
            uri: self.uri.clone(),
            detail: e.to_string(),
        })
    }

    pub(super) fn set_autostart(&self) -> HostResult<()> {
        self.hv
            .domain_set_autostart(&self.names.domain, true)
            .map_err(|e| self.error("turn on autostart of", ObjectKind::Domain, &self.names.domain, e))
    }

    pub(super) fn ensure_autostart_on(&self) -> HostResult<()> {
        let on = self
            .hv
            .domain_autostart(&self.names.domain)
            .map_err(|e| self.error("read autostart of", ObjectKind::Domain, &self.names.domain, e))?;
        if on { Ok(()) } else { self.set_autostart() }
    }

    pub(super) fn ensure_started(&self) -> HostResult<()> {
        if !self.defined_now {
            let state = self.domain_state()?;
            if !matches!(state, DomainState::Shutoff | DomainState::Crashed) {
                return Ok(());
            }
        }
        self.start()
    }

    pub(super) fn start(&self) -> HostResult<()> {
        match self.hv.domain_start(&self.names.domain) {
            Ok(()) => Ok(()),
            // Started by someone else between our state read and this call.
            Err(e) if e.is_already_running() => Ok(()),
            Err(e) => Err(self.start_failed(e)),
        }
    }

    /// What a failed start of our domain means: the network's missing bridge
    /// or the missing console log directory, named; else libvirt's error.
    pub(super) fn start_failed(&self, e: HypervisorError) -> HostError {
        if let Some(device) = e.missing_device() {
            return HostError::BridgeMissing {
                network: self.spec.network.clone(),
                device: device.to_string(),
                uri: self.uri.clone(),
                detail: e.to_string(),
            };
        }
        self.console_log_error(&e).unwrap_or_else(|| self.error("start", ObjectKind::Domain, &self.names.domain, e))
    }

    pub(super) fn remove_domain(&self) -> HostResult<()> {
        let domain = &self.names.domain;
        let state = match self.hv.domain_state(domain) {
            Ok(state) => state,
            Err(e) if e.kind == ErrorKind::NoDomain => return Ok(()),
            Err(e) => return Err(self.error("read the state of", ObjectKind::Domain, domain, e)),
        };
        if state != DomainState::Shutoff {
            match self.hv.domain_destroy(domain) {
                Ok(()) => {}
                Err(e) if e.kind == ErrorKind::NoDomain => return Ok(()),
                // Stopped on its own between our state read and this call.
                Err(e) if e.kind == ErrorKind::OperationInvalid => {}
                Err(e) => return Err(self.error("destroy", ObjectKind::Domain, domain, e)),
            }
        }
        match self.hv.domain_undefine(domain, UndefineFlags::all()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind == ErrorKind::NoDomain => Ok(()),
            Err(e) => Err(self.error("undefine", ObjectKind::Domain, domain, e)),
        }
    }
}
