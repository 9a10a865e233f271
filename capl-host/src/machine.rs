//! One LibvirtMachine on a host: create (each step idempotent and safe to
//! repeat after a crash at any point), observe, delete.
//!
//! # What is ours
//!
//! A **domain** is ours when its `<metadata>` carries our marker
//! ([`METADATA_NAMESPACE`]) with this LibvirtMachine's UID. Any other domain
//! with our name (no marker, or another UID, e.g. a leftover of an older
//! LibvirtMachine with the same name) is a collision: nothing is touched.
//!
//! **Volumes** carry no metadata, so a volume with one of our names is ours
//! only when the domain with our name is ours or absent (if the domain is
//! foreign, its volumes are left alone) and, in addition:
//! - the domain is ours and uses the volume (its `<source file>` is the
//!   volume's path), or
//! - root disk: it is a qcow2 whose backing file is `spec.image` of basePool
//!   (the path libvirt reports for that volume, or, when the image is gone,
//!   a backing path whose file name is `spec.image`): exactly what we create;
//! - cloud-init ISO: it is a raw volume of at most [`MAX_SEED_BYTES`] whose
//!   content is all zeros (created, crashed before the upload) or an ISO 9660
//!   image labelled `cidata`: a seed we wrote. Checking this downloads the
//!   volume, which only happens when recovering from a crash or deleting a
//!   machine whose domain is already gone.
//!
//! A **DHCP host entry** is ours when both its MAC and its name (the domain
//! name) are ours. An entry with our MAC or our name but not both is a
//! collision.
//!
//! # Libvirt calls
//!
//! Counted on the simulator and pinned by `libvirt_call_counts` in
//! tests/host_machine_sim.rs: [`Hypervisor`] calls this module makes, and the
//! operations libvirt-sim counts for them (its adapter looks the network up
//! before a DHCP update). On a real host each by-name trait call is two RPCs,
//! the lookup and the call itself; none opens a connection.
//!
//! | path                          | trait calls | operations |
//! |-------------------------------|-------------|------------|
//! | create of a new machine       | 16          | 17         |
//! | steady state of a running one | 3           | 3          |
//! | delete of a running machine   | 10          | 11         |
//!
//! Create: domain lookup; base image read; overlay lookup, create, read back;
//! ISO lookup, create, upload, read back; network XML, leases, DHCP update;
//! capabilities, define, autostart, start. Steady state: domain XML (the
//! ownership check), state, leases. Delete: domain XML, state, destroy,
//! undefine; overlay read, delete; ISO read, delete; network XML, DHCP update.
//!
//! [`METADATA_NAMESPACE`]: super::domain_xml::METADATA_NAMESPACE

use std::net::Ipv4Addr;

use super::cloud_init::{iso_volume_label, meta_data, nocloud_iso};
use super::dhcp::{address_ranges, choose_address, describe_ranges, dhcp_host_xml, network_lock};
use super::domain_xml::{
    DomainDefinition, DomainInfo, DomainTypePreference, OwnerMarker, choose_domain_type, domain_xml, host_kvm_support,
    parse_domain,
};
use super::error::{HostError, HostResult, ObjectKind};
use super::naming::MachineNames;
use super::network_xml::{DhcpHost, parse_network};
use super::volume_xml::{BackingStore, GIB, VolumeInfo, iso_volume_xml, overlay_volume_xml, parse_volume};
use crate::hypervisor::{DomainState, ErrorKind, Hypervisor, HypervisorError, NetworkUpdateCommand, UndefineFlags};

/// The largest cloud-init ISO the provider creates (a Secret holds at most 1 MiB).
pub const MAX_SEED_BYTES: u64 = 4 * 1024 * 1024;
/// How often a DHCP reservation is re-read and retried when libvirt refuses it
/// (another writer took the address between our read and our update).
const DHCP_ATTEMPTS: usize = 3;

/// Everything the host layer needs to know about one machine, in plain Rust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSpec {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub cluster_name: String,
    pub vcpu: u32,
    pub memory_mib: u64,
    pub disk_gib: u64,
    /// The base image volume in `base_pool`.
    pub image: String,
    /// The bootstrap Secret's `value`, written as `user-data`.
    pub user_data: Vec<u8>,
    pub network: String,
    pub base_pool: String,
    pub domain_pool: String,
    /// The cluster's control-plane endpoint host; never handed out when it is an IPv4 address.
    pub control_plane_host: Option<String>,
    pub domain_type: DomainTypePreference,
    /// When set, the serial console is also logged to `<dir>/<domain>-console.log` on the host
    /// (not `<domain>.log`: in libvirt's `/var/log/libvirt/qemu` that is QEMU's own log, held
    /// open by virtlogd, and the start would fail with "Device or resource busy").
    pub console_log_dir: Option<String>,
}

impl MachineSpec {
    pub fn names(&self) -> MachineNames {
        MachineNames::new(&self.namespace, &self.name, &self.uid)
    }

    fn owner(&self) -> OwnerMarker {
        OwnerMarker {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            cluster: self.cluster_name.clone(),
        }
    }
}

/// The create steps, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CreateStep {
    RootDisk,
    CloudInitVolume,
    CloudInitUpload,
    DhcpReservation,
    Define,
    Autostart,
    Start,
}

impl CreateStep {
    pub const ALL: [CreateStep; 7] = [
        CreateStep::RootDisk,
        CreateStep::CloudInitVolume,
        CreateStep::CloudInitUpload,
        CreateStep::DhcpReservation,
        CreateStep::Define,
        CreateStep::Autostart,
        CreateStep::Start,
    ];
}

/// A machine address as CAPI reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineAddress {
    InternalIp(Ipv4Addr),
    Hostname(String),
}

/// What a reconcile learned about the machine's domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineReport {
    pub domain: String,
    pub provider_id: String,
    pub state: DomainState,
    /// The domain did not exist and was created by this call.
    pub created: bool,
    /// The domain was stopped and was started by this call.
    pub started: bool,
    /// The InternalIP from the network's leases (only while running), then the hostname.
    pub addresses: Vec<MachineAddress>,
}

/// Brings the machine to "defined and running": creates everything when the
/// domain does not exist, starts it when it is stopped, and reads its address
/// when it runs.
pub fn ensure_machine(hv: &dyn Hypervisor, spec: &MachineSpec) -> HostResult<MachineReport> {
    let mut run = MachineRun::new(hv, spec);
    match run.owned_domain()? {
        None => {
            run.domain_absent = true;
            for step in CreateStep::ALL {
                run.step(step)?;
            }
            Ok(run.report(DomainState::Running, true, true, Vec::new()))
        }
        Some(_) => {
            let mut state = run.domain_state()?;
            let mut started = false;
            if matches!(state, DomainState::Shutoff | DomainState::Crashed) {
                run.ensure_autostart_on()?;
                run.start()?;
                state = DomainState::Running;
                started = true;
            }
            let addresses = if state == DomainState::Running { run.addresses()? } else { Vec::new() };
            Ok(run.report(state, false, started, addresses))
        }
    }
}

/// Runs the given create steps in order, each one checking whether it was
/// already done. [`ensure_machine`] runs all of [`CreateStep::ALL`]; running a
/// prefix of it simulates a crash after that step.
pub fn run_create_steps(hv: &dyn Hypervisor, spec: &MachineSpec, steps: &[CreateStep]) -> HostResult<()> {
    let mut run = MachineRun::new(hv, spec);
    for step in steps {
        run.step(*step)?;
    }
    Ok(())
}

/// Reads the machine's domain without changing anything: `None` when it does not exist.
pub fn observe_machine(hv: &dyn Hypervisor, spec: &MachineSpec) -> HostResult<Option<MachineReport>> {
    let run = MachineRun::new(hv, spec);
    if run.owned_domain()?.is_none() {
        return Ok(None);
    }
    let state = run.domain_state()?;
    let addresses = if state == DomainState::Running { run.addresses()? } else { Vec::new() };
    Ok(Some(run.report(state, false, false, addresses)))
}

/// Removes the domain (destroy, undefine with managed save, snapshot
/// metadata and NVRAM), the root disk, the cloud-init ISO and the DHCP
/// reservation. Each step tolerates "already gone". A foreign domain with our
/// name stops the delete before anything is touched; a foreign volume or DHCP
/// entry is left alone and reported after the other steps ran.
pub fn delete_machine(hv: &dyn Hypervisor, spec: &MachineSpec) -> HostResult<()> {
    let run = MachineRun::new(hv, spec);
    let domain = run.owned_domain()?;
    if domain.is_some() {
        run.remove_domain()?;
    }
    let results = [run.remove_overlay(domain.as_ref()), run.remove_seed(domain.as_ref()), run.remove_reservation()];
    results.into_iter().collect::<HostResult<Vec<()>>>().map(|_| ())
}

/// One reconcile's view of one machine: the spec, the names, and what
/// earlier steps of this run learned (so later steps need not ask again).
struct MachineRun<'a> {
    hv: &'a dyn Hypervisor,
    spec: &'a MachineSpec,
    names: MachineNames,
    uri: String,
    /// Set when this run saw that the domain does not exist.
    domain_absent: bool,
    overlay_path: Option<String>,
    seed_path: Option<String>,
    /// Set when this run defined the domain (so it is known to be shut off).
    defined_now: bool,
}

impl<'a> MachineRun<'a> {
    fn new(hv: &'a dyn Hypervisor, spec: &'a MachineSpec) -> Self {
        Self {
            hv,
            spec,
            names: spec.names(),
            uri: hv.uri().to_string(),
            domain_absent: false,
            overlay_path: None,
            seed_path: None,
            defined_now: false,
        }
    }

    fn report(&self, state: DomainState, created: bool, started: bool, mut ips: Vec<MachineAddress>) -> MachineReport {
        ips.push(MachineAddress::Hostname(self.names.hostname().to_string()));
        MachineReport {
            domain: self.names.domain.clone(),
            provider_id: self.names.provider_id(),
            state,
            created,
            started,
            addresses: ips,
        }
    }

    fn step(&mut self, step: CreateStep) -> HostResult<()> {
        match step {
            CreateStep::RootDisk => self.ensure_root_disk(),
            // Once the domain is defined the seed is complete (define comes after the upload),
            // and rewriting a cdrom a guest may be reading is not done.
            CreateStep::CloudInitVolume if self.domain_defined()? => Ok(()),
            CreateStep::CloudInitUpload if self.domain_defined()? => Ok(()),
            CreateStep::CloudInitVolume => self.ensure_seed_volume(),
            CreateStep::CloudInitUpload => self.upload_seed(),
            CreateStep::DhcpReservation => self.ensure_reservation().map(|_| ()),
            CreateStep::Define => self.ensure_defined(),
            CreateStep::Autostart => self.set_autostart(),
            CreateStep::Start => self.ensure_started(),
        }
    }

    fn error(&self, action: &'static str, kind: ObjectKind, object: &str, source: HypervisorError) -> HostError {
        HostError::Libvirt { action, kind, object: object.to_string(), uri: self.uri.clone(), source }
    }

    fn unreadable(&self, kind: ObjectKind, object: &str, detail: String) -> HostError {
        HostError::UnreadableXml { kind, object: object.to_string(), uri: self.uri.clone(), detail }
    }

    fn collision(&self, kind: ObjectKind, object: &str, detail: String) -> HostError {
        HostError::Collision { kind, object: object.to_string(), uri: self.uri.clone(), detail }
    }

    // --- domain -------------------------------------------------------------

    /// The domain with our name: `None` when absent, an error when it is not ours.
    fn owned_domain(&self) -> HostResult<Option<DomainInfo>> {
        let domain = &self.names.domain;
        let xml = match self.hv.domain_xml(domain) {
            Ok(xml) => xml,
            Err(e) if e.kind == ErrorKind::NoDomain => return Ok(None),
            Err(e) => return Err(self.error("read", ObjectKind::Domain, domain, e)),
        };
        let info = parse_domain(&xml).map_err(|e| self.unreadable(ObjectKind::Domain, domain, e))?;
        match &info.owner {
            Some(owner) if owner.uid == self.spec.uid => Ok(Some(info)),
            Some(owner) => Err(self.collision(
                ObjectKind::Domain,
                domain,
                format!(
                    "its metadata names LibvirtMachine {}/{} with UID {}, not UID {}",
                    owner.namespace, owner.name, owner.uid, self.spec.uid
                ),
            )),
            None => Err(self.collision(
                ObjectKind::Domain,
                domain,
                "it carries no cluster-api-provider-libvirt metadata".into(),
            )),
        }
    }

    /// Whether our domain is defined; remembers "absent" so later steps need not ask again.
    fn domain_defined(&mut self) -> HostResult<bool> {
        if self.domain_absent {
            return Ok(false);
        }
        let defined = self.owned_domain()?.is_some();
        self.domain_absent = !defined;
        Ok(defined)
    }

    fn domain_state(&self) -> HostResult<DomainState> {
        self.hv
            .domain_state(&self.names.domain)
            .map_err(|e| self.error("read the state of", ObjectKind::Domain, &self.names.domain, e))
    }

    fn ensure_defined(&mut self) -> HostResult<()> {
        if self.domain_defined()? {
            return Ok(());
        }
        let (arch, kvm) = match self.hv.capabilities_xml() {
            Ok(xml) => host_kvm_support(&xml).map_err(|e| self.unreadable(ObjectKind::Host, &self.uri, e))?,
            Err(e) => return Err(self.error("read the capabilities of", ObjectKind::Host, &self.uri.clone(), e)),
        };
        let definition = DomainDefinition {
            name: self.names.domain.clone(),
            uuid: self.spec.uid.clone(),
            domain_type: choose_domain_type(self.spec.domain_type, kvm).to_string(),
            arch,
            vcpu: self.spec.vcpu,
            memory_mib: self.spec.memory_mib,
            overlay_path: self.overlay_path()?,
            iso_path: self.seed_path()?,
            network: self.spec.network.clone(),
            mac: self.names.mac(),
            console_log_path: self
                .spec
                .console_log_dir
                .as_ref()
                .map(|dir| format!("{dir}/{}-console.log", self.names.domain)),
            owner: self.spec.owner(),
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
                format!("libvirt refused to define it with UUID {}: {}", self.spec.uid, e.message),
            )),
            Err(e) => Err(self
                .console_log_error(&e)
                .unwrap_or_else(|| self.error("define", ObjectKind::Domain, &self.names.domain, e))),
        }
    }

    /// A define or start that failed because the console log directory does
    /// not exist on the host. libvirt (virtlogd) says "Unable to open file:
    /// <dir>/<domain>-console.log: No such file or directory".
    fn console_log_error(&self, e: &HypervisorError) -> Option<HostError> {
        let dir = self.spec.console_log_dir.as_ref()?;
        e.is_missing_file_in(dir).then(|| HostError::ConsoleLogDirMissing {
            dir: dir.clone(),
            uri: self.uri.clone(),
            detail: e.to_string(),
        })
    }

    fn set_autostart(&self) -> HostResult<()> {
        self.hv
            .domain_set_autostart(&self.names.domain, true)
            .map_err(|e| self.error("turn on autostart of", ObjectKind::Domain, &self.names.domain, e))
    }

    fn ensure_autostart_on(&self) -> HostResult<()> {
        let on = self
            .hv
            .domain_autostart(&self.names.domain)
            .map_err(|e| self.error("read autostart of", ObjectKind::Domain, &self.names.domain, e))?;
        if on { Ok(()) } else { self.set_autostart() }
    }

    fn ensure_started(&self) -> HostResult<()> {
        if !self.defined_now {
            let state = self.domain_state()?;
            if !matches!(state, DomainState::Shutoff | DomainState::Crashed) {
                return Ok(());
            }
        }
        self.start()
    }

    fn start(&self) -> HostResult<()> {
        match self.hv.domain_start(&self.names.domain) {
            Ok(()) => Ok(()),
            // Started by someone else between our state read and this call.
            Err(e) if e.is_already_running() => Ok(()),
            Err(e) => Err(self
                .console_log_error(&e)
                .unwrap_or_else(|| self.error("start", ObjectKind::Domain, &self.names.domain, e))),
        }
    }

    fn remove_domain(&self) -> HostResult<()> {
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

    // --- volumes ------------------------------------------------------------

    /// A volume's XML: `None` when the volume is absent.
    fn lookup_volume(&self, pool: &str, name: &str) -> HostResult<Option<VolumeInfo>> {
        match self.hv.volume_xml(pool, name) {
            Ok(xml) => parse_volume(&xml).map(Some).map_err(|e| self.unreadable(ObjectKind::Volume, name, e)),
            Err(e) if e.kind == ErrorKind::NoStorageVol => Ok(None),
            Err(e) => Err(self.pool_error("read", ObjectKind::Volume, pool, name, e)),
        }
    }

    /// Maps errors of a call on a volume, recognising a missing or inactive pool.
    fn pool_error(
        &self,
        action: &'static str,
        kind: ObjectKind,
        pool: &str,
        name: &str,
        e: HypervisorError,
    ) -> HostError {
        match e.kind {
            ErrorKind::NoStoragePool => HostError::PoolMissing { pool: pool.to_string(), uri: self.uri.clone() },
            ErrorKind::OperationInvalid if e.is_pool_inactive() => {
                HostError::PoolInactive { pool: pool.to_string(), uri: self.uri.clone() }
            }
            _ => self.error(action, kind, &format!("{pool}/{name}"), e),
        }
    }

    fn base_image(&self) -> HostResult<VolumeInfo> {
        let spec = self.spec;
        self.lookup_volume(&spec.base_pool, &spec.image)?.ok_or_else(|| HostError::ImageMissing {
            image: spec.image.clone(),
            pool: spec.base_pool.clone(),
            uri: self.uri.clone(),
        })
    }

    fn ensure_root_disk(&mut self) -> HostResult<()> {
        let spec = self.spec;
        let base = self.base_image()?;
        let capacity = spec.disk_gib.saturating_mul(GIB);
        if capacity < base.capacity {
            return Err(HostError::DiskTooSmall {
                machine: format!("{}/{}", spec.namespace, spec.name),
                disk_gib: spec.disk_gib,
                image: spec.image.clone(),
                image_bytes: base.capacity,
                min_gib: base.capacity.div_ceil(GIB),
            });
        }
        let name = self.names.overlay_volume();
        if let Some(existing) = self.lookup_volume(&spec.domain_pool, &name)? {
            self.check_overlay_is_ours(&existing, Some(&base))?;
            self.overlay_path = Some(existing.path);
            return Ok(());
        }
        let backing = BackingStore {
            path: base.path.clone(),
            format: Some(base.format.clone().unwrap_or_else(|| "qcow2".into())),
        };
        let created = self.create_volume(&spec.domain_pool, &name, &overlay_volume_xml(&name, capacity, &backing))?;
        self.check_overlay_is_ours(&created, Some(&base))?;
        self.overlay_path = Some(created.path);
        Ok(())
    }

    /// A root disk is ours when it is a qcow2 overlay on our base image.
    fn check_overlay_is_ours(&self, volume: &VolumeInfo, base: Option<&VolumeInfo>) -> HostResult<()> {
        let backing_matches = volume.backing.as_ref().is_some_and(|backing| match base {
            Some(base) => backing.path == base.path,
            None => backing.path.rsplit('/').next() == Some(self.spec.image.as_str()),
        });
        if volume.format.as_deref() == Some("qcow2") && backing_matches {
            return Ok(());
        }
        Err(self.collision(
            ObjectKind::Volume,
            &format!("{}/{}", self.spec.domain_pool, volume.name),
            format!(
                "it is format {} backed by {}, not a qcow2 overlay on base image \"{}\"",
                volume.format.as_deref().unwrap_or("unknown"),
                volume.backing.as_ref().map(|b| b.path.as_str()).unwrap_or("nothing"),
                self.spec.image
            ),
        ))
    }

    fn overlay_path(&mut self) -> HostResult<String> {
        if let Some(path) = &self.overlay_path {
            return Ok(path.clone());
        }
        let path = self.created_volume_path(&self.names.overlay_volume(), "the root disk")?;
        self.overlay_path = Some(path.clone());
        Ok(path)
    }

    /// Creates volume `name` in `pool` from `xml` and reads it back. A volume
    /// created concurrently under the same name is read back too; the caller
    /// checks that it is ours.
    fn create_volume(&self, pool: &str, name: &str, xml: &str) -> HostResult<VolumeInfo> {
        match self.hv.volume_create(pool, xml) {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::StorageVolExists => {}
            Err(e) => return Err(self.pool_error("create", ObjectKind::Volume, pool, name, e)),
        }
        self.lookup_volume(pool, name)?.ok_or_else(|| {
            self.error(
                "read back",
                ObjectKind::Volume,
                name,
                HypervisorError::new(ErrorKind::NoStorageVol, 50, "volume vanished after create"),
            )
        })
    }

    /// The path of a volume an earlier step created in domainPool, for the domain XML.
    fn created_volume_path(&self, name: &str, what: &str) -> HostResult<String> {
        let volume = self.lookup_volume(&self.spec.domain_pool, name)?.ok_or_else(|| {
            self.error(
                "find",
                ObjectKind::Volume,
                name,
                HypervisorError::new(
                    ErrorKind::NoStorageVol,
                    50,
                    format!("{what} must be created before the domain is defined"),
                ),
            )
        })?;
        Ok(volume.path)
    }

    fn seed_bytes(&self) -> Vec<u8> {
        let meta = meta_data(self.names.instance_id(), self.names.hostname());
        nocloud_iso(&self.spec.user_data, meta.as_bytes())
    }

    fn ensure_seed_volume(&mut self) -> HostResult<()> {
        let pool = self.spec.domain_pool.clone();
        let name = self.names.cloud_init_volume();
        let size = self.seed_bytes().len() as u64;
        if let Some(existing) = self.lookup_volume(&pool, &name)? {
            self.check_seed_is_ours(&existing)?;
            if existing.capacity == size {
                self.seed_path = Some(existing.path);
                return Ok(());
            }
            // Ours, but sized for other user-data: replace it.
            self.delete_volume(&pool, &name)?;
        }
        let created = self.create_volume(&pool, &name, &iso_volume_xml(&name, size))?;
        self.seed_path = Some(created.path);
        Ok(())
    }

    /// Writes the seed into its volume. Always rewritten while the domain is
    /// not yet defined: a crash between creating the volume and uploading
    /// leaves it empty, and the upload is cheap.
    fn upload_seed(&self) -> HostResult<()> {
        let pool = &self.spec.domain_pool;
        let name = self.names.cloud_init_volume();
        self.hv
            .volume_upload(pool, &name, &self.seed_bytes())
            .map_err(|e| self.pool_error("upload", ObjectKind::Volume, pool, &name, e))
    }

    /// A seed volume is ours when it is small, raw, and either empty (zeros) or a `cidata` ISO.
    fn check_seed_is_ours(&self, volume: &VolumeInfo) -> HostResult<()> {
        let pool = &self.spec.domain_pool;
        let object = format!("{pool}/{}", volume.name);
        let format_ok = matches!(volume.format.as_deref(), None | Some("raw") | Some("iso"));
        if !format_ok || volume.capacity > MAX_SEED_BYTES {
            return Err(self.collision(
                ObjectKind::Volume,
                &object,
                format!(
                    "it is format {} and {} bytes, not a raw cloud-init seed of at most {MAX_SEED_BYTES} bytes",
                    volume.format.as_deref().unwrap_or("unknown"),
                    volume.capacity
                ),
            ));
        }
        let content = self
            .hv
            .volume_download(pool, &volume.name)
            .map_err(|e| self.pool_error("download", ObjectKind::Volume, pool, &volume.name, e))?;
        if content.iter().all(|b| *b == 0)
            || iso_volume_label(&content).as_deref() == Some(super::cloud_init::VOLUME_LABEL)
        {
            return Ok(());
        }
        Err(self.collision(ObjectKind::Volume, &object, "its content is neither empty nor a cidata ISO".into()))
    }

    fn seed_path(&mut self) -> HostResult<String> {
        if let Some(path) = &self.seed_path {
            return Ok(path.clone());
        }
        let path = self.created_volume_path(&self.names.cloud_init_volume(), "the cloud-init ISO")?;
        self.seed_path = Some(path.clone());
        Ok(path)
    }

    fn delete_volume(&self, pool: &str, name: &str) -> HostResult<()> {
        match self.hv.volume_delete(pool, name) {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(self.pool_error("delete", ObjectKind::Volume, pool, name, e)),
        }
    }

    /// A volume lookup for delete: a missing pool means nothing to delete.
    fn lookup_volume_for_delete(&self, name: &str) -> HostResult<Option<VolumeInfo>> {
        match self.lookup_volume(&self.spec.domain_pool, name) {
            Err(HostError::PoolMissing { .. }) => Ok(None),
            other => other,
        }
    }

    fn remove_overlay(&self, domain: Option<&DomainInfo>) -> HostResult<()> {
        let name = self.names.overlay_volume();
        let Some(volume) = self.lookup_volume_for_delete(&name)? else { return Ok(()) };
        let used_by_our_domain = domain.is_some_and(|d| d.disk_paths.contains(&volume.path));
        if !used_by_our_domain {
            let base = match self.lookup_volume(&self.spec.base_pool, &self.spec.image) {
                Ok(base) => base,
                Err(HostError::PoolMissing { .. }) => None,
                Err(e) => return Err(e),
            };
            self.check_overlay_is_ours(&volume, base.as_ref())?;
        }
        self.delete_volume(&self.spec.domain_pool, &name)
    }

    fn remove_seed(&self, domain: Option<&DomainInfo>) -> HostResult<()> {
        let name = self.names.cloud_init_volume();
        let Some(volume) = self.lookup_volume_for_delete(&name)? else { return Ok(()) };
        if !domain.is_some_and(|d| d.disk_paths.contains(&volume.path)) {
            self.check_seed_is_ours(&volume)?;
        }
        self.delete_volume(&self.spec.domain_pool, &name)
    }

    // --- DHCP -----------------------------------------------------------------

    fn network_hosts(&self) -> HostResult<(super::network_xml::Ipv4Subnet, Option<DhcpHost>)> {
        let network = &self.spec.network;
        let xml = self.hv.network_xml(network).map_err(|e| match e.kind {
            ErrorKind::NoNetwork => HostError::NetworkMissing { network: network.clone(), uri: self.uri.clone() },
            _ => self.error("read", ObjectKind::Network, network, e),
        })?;
        let info = parse_network(&xml).map_err(|e| self.unreadable(ObjectKind::Network, network, e))?;
        let subnet = info.ipv4.ok_or_else(|| HostError::NoIpv4 { network: network.clone(), uri: self.uri.clone() })?;
        let mine = self.our_dhcp_host(&subnet.hosts)?;
        Ok((subnet, mine))
    }

    /// Our entry among the network's hosts; an error when our MAC or name is used by a different entry.
    fn our_dhcp_host(&self, hosts: &[DhcpHost]) -> HostResult<Option<DhcpHost>> {
        let mac = self.names.mac();
        let domain = &self.names.domain;
        for host in hosts {
            let mac_matches = host.mac.as_deref() == Some(mac.as_str());
            let name_matches = host.name.as_deref() == Some(domain.as_str());
            match (mac_matches, name_matches) {
                (true, true) => return Ok(Some(host.clone())),
                (false, false) => {}
                _ => {
                    return Err(self.collision(
                        ObjectKind::DhcpHost,
                        &format!(
                            "{} mac={} name={}",
                            self.spec.network,
                            host.mac.as_deref().unwrap_or("-"),
                            host.name.as_deref().unwrap_or("-")
                        ),
                        format!("the provider's entry for domain {domain} would be mac={mac} name={domain}"),
                    ));
                }
            }
        }
        Ok(None)
    }

    /// The reserved address: the existing entry for our MAC, or a new one.
    fn ensure_reservation(&self) -> HostResult<Ipv4Addr> {
        let lock = network_lock(&self.uri, &self.spec.network);
        let _guard = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mac = self.names.mac();
        let avoid: Vec<Ipv4Addr> = self.spec.control_plane_host.iter().filter_map(|h| h.parse().ok()).collect();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (subnet, mine) = self.network_hosts()?;
            if let Some(ip) = mine.and_then(|host| host.ip) {
                return Ok(ip);
            }
            let leases = self
                .hv
                .network_dhcp_leases(&self.spec.network)
                .map_err(|e| self.error("read the DHCP leases of", ObjectKind::Network, &self.spec.network, e))?;
            let ip = choose_address(&subnet, &leases, &mac, &avoid).ok_or_else(|| HostError::NoFreeAddress {
                network: self.spec.network.clone(),
                uri: self.uri.clone(),
                pool_description: describe_ranges(&address_ranges(&subnet)),
            })?;
            let host = dhcp_host_xml(&mac, &self.names.domain, ip);
            match self.hv.network_update_dhcp_host(&self.spec.network, NetworkUpdateCommand::AddLast, &host) {
                Ok(()) => return Ok(ip),
                // Another writer took the address (or added our entry) meanwhile: read again.
                Err(e)
                    if attempt < DHCP_ATTEMPTS
                        && !matches!(e.kind, ErrorKind::ConnectionLost | ErrorKind::NoNetwork) =>
                {
                    continue;
                }
                Err(e) => return Err(self.error("add a DHCP host to", ObjectKind::Network, &self.spec.network, e)),
            }
        }
    }

    fn remove_reservation(&self) -> HostResult<()> {
        let lock = network_lock(&self.uri, &self.spec.network);
        let _guard = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (_, mine) = match self.network_hosts() {
            Ok(found) => found,
            Err(HostError::NetworkMissing { .. } | HostError::NoIpv4 { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let Some(host) = mine else { return Ok(()) };
        let xml = match host.ip {
            Some(ip) => dhcp_host_xml(&self.names.mac(), &self.names.domain, ip),
            None => format!("<host mac='{}' name='{}'/>", self.names.mac(), self.names.domain),
        };
        match self.hv.network_update_dhcp_host(&self.spec.network, NetworkUpdateCommand::Delete, &xml) {
            Ok(()) => Ok(()),
            Err(e) if e.kind == ErrorKind::NoNetwork => Ok(()),
            Err(e) => Err(self.error("remove a DHCP host from", ObjectKind::Network, &self.spec.network, e)),
        }
    }

    // --- addresses --------------------------------------------------------------

    /// The InternalIP from the network's leases, matched by our MAC (the newest lease wins).
    fn addresses(&self) -> HostResult<Vec<MachineAddress>> {
        let mac = self.names.mac();
        let leases = self
            .hv
            .network_dhcp_leases(&self.spec.network)
            .map_err(|e| self.error("read the DHCP leases of", ObjectKind::Network, &self.spec.network, e))?;
        let ip = leases
            .iter()
            .filter(|lease| lease.mac.eq_ignore_ascii_case(&mac))
            .max_by_key(|lease| lease.expiry_time)
            .and_then(|lease| lease.ip.parse::<Ipv4Addr>().ok());
        Ok(ip.map(MachineAddress::InternalIp).into_iter().collect())
    }
}
