//! One LibvirtMachine on a host: create (each step idempotent and safe to
//! repeat after a crash at any point), start, observe, reboot, delete.
//!
//! Create and start are different verbs: [`create_machine`] takes the
//! bootstrap data (the seed's user-data) and makes everything;
//! [`start_machine`] only starts a domain that exists and never creates.
//! [`reboot_machine`] neither: it resets or power-cycles a domain that exists.
//!
//! The flow lives here; its parts, one file each, are the [`domain`], the
//! root [`disks`] (and the volume calls they share with the seed), the
//! [`data_disks`], the cloud-init [`seed`] ISO, the [`ignition`] config, the
//! DHCP [`reservation`] (and the address read from the leases), the
//! additional [`nics`], and the [`reboot`] of a machine for remediation.
//!
//! # What is ours
//!
//! A **domain** is ours when its `<metadata>` carries our marker
//! ([`METADATA_NAMESPACE`]) with this LibvirtMachine's UID. Any other domain
//! with our name (no marker, or another UID, e.g. a leftover of an older
//! LibvirtMachine with the same name) is a collision: nothing is touched.
//!
//! **Volumes** carry no metadata, so a volume with one of our names is ours
//! only when no foreign domain with our name uses it (a volume it uses is
//! left alone) and, in addition:
//! - the domain is ours and uses the volume (its `<source file>` is the
//!   volume's path), or
//! - root disk: it is a qcow2 whose backing file is `spec.image` of basePool
//!   (the path libvirt reports for that volume, or, when the image is gone,
//!   a backing path whose file name is `spec.image`): exactly what we create;
//! - data disk: it has the disk's format and exactly its size, and no
//!   backing store: exactly what we create;
//! - root and data disks alike: the seed ISO of our domain name, when there
//!   is one, records our identity as its `instance-id` (a disk is never
//!   taken over from another identity; without a seed it has never booted);
//! - cloud-init ISO: it is a raw volume of at most [`MAX_SEED_BYTES`] whose
//!   content is all zeros (created, crashed before the upload) or an ISO 9660
//!   image labelled `cidata`: a seed we wrote. Checking this downloads the
//!   volume, which only happens when recovering from a crash or deleting a
//!   machine whose domain is already gone.
//! - Ignition config: it is a raw volume of at most [`MAX_SEED_BYTES`] with
//!   no backing file, and the seed, when there is one, records our identity.
//!
//! A **DHCP host entry** is ours when its name is our domain name and its MAC
//! one of our MAC candidates ([`crate::naming::mac_candidates`]). An entry
//! with our name and another MAC is a collision. An entry with one of our
//! candidate MACs under another name is not ours and no collision: that MAC
//! is taken, and a new reservation takes the first candidate no other entry
//! and no lease of the network uses. The MAC the machine took is read back
//! from its entry (on delete) and from its domain's interface (the address
//! lookup, the report), never derived again. While a foreign domain with our
//! name has an interface with our entry's MAC, the entry serves that domain
//! and is left alone.
//!
//! Create stops at a collision. Delete removes what is ours and leaves
//! every object that is not ours, returning them ([`LeftOnHost`]): the
//! caller reports them and is done.
//!
//! # Libvirt calls
//!
//! Counted on the simulator and pinned by `libvirt_call_counts_match_the_book` in
//! capl-host/tests/libvirtd/host_sim.rs (against the table of `docs/src/design.md`): [`Hypervisor`] calls this module makes, and the
//! operations libvirt-sim counts for them (its adapter looks the network up
//! before a DHCP update). On a real host each by-name trait call is two RPCs,
//! the lookup and the call itself; none opens a connection.
//!
//! | path                          | trait calls | operations |
//! |-------------------------------|-------------|------------|
//! | create of a new machine       | 19          | 20         |
//! | steady state of a running one | 3           | 3          |
//! | delete of a running machine   | 10          | 11         |
//! | reboot of a running machine   | 3           | 3          |
//! | reboot of a paused machine    | 4           | 4          |
//!
//! Create: domain lookup; checks first (base image read, network XML, leases);
//! base image read; overlay lookup, create, read back;
//! ISO lookup, create, upload, read back; network XML, leases, DHCP update;
//! capabilities, define, autostart, start. Steady state: domain XML (the
//! ownership check), state, leases. Delete: domain XML, state, destroy,
//! undefine; overlay read, delete; ISO read, delete; network XML, DHCP update.
//! Reboot: domain XML (the ownership check), state, then reset (running or
//! blocked), or destroy and start (paused, crashed, ..., or a running one
//! whose reset failed: 5 calls), or start (shut off: 3 calls).
//! A machine with CPU or firmware settings makes one more call on create:
//! its checks read the capabilities and the domain capabilities, and define
//! uses what they read (a create resumed without the checks reads both again).
//! Each data disk adds three calls to a create (lookup, create, read back)
//! and two to a delete (read, delete); each pool a data disk names besides
//! the domain pool adds two to a create's checks (pool XML, active). An
//! Ignition config adds four to a create (lookup, create, read back,
//! upload) and two to a delete (read, delete); a delete whose domain is
//! already gone looks for one (one call).
//!
//! [`METADATA_NAMESPACE`]: crate::domain_xml::METADATA_NAMESPACE

mod data_disks;
mod disks;
mod domain;
mod ignition;
mod nics;
mod reboot;
mod reservation;
mod seed;

use std::net::Ipv4Addr;

use crate::data_disk::DataDisk;
pub use crate::domain_xml::NicAttachment;
use crate::domain_xml::{DomainTypePreference, OwnerMarker};
use crate::error::{HostError, HostResult, ObjectKind};
use crate::guest_hardware::{CpuSettings, FirmwareSettings, check_settings};
use crate::hypervisor::{DomainState, Hypervisor, HypervisorError};
use crate::naming::{MachineNames, NameScheme};
pub use ignition::IGNITION_SEED_USER_DATA;
pub use reboot::{Reboot, RebootMethod, reboot_machine};
pub use seed::MAX_SEED_BYTES;

/// Everything the host layer needs to know about one machine, in plain Rust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSpec {
    pub namespace: String,
    pub name: String,
    /// The machine's identity: the UUID in `spec.providerID` once set, else the
    /// LibvirtMachine UID (see [`crate::naming`]). Domain UUID, instance-id and
    /// every name on the host derive from it.
    pub identity: String,
    /// How long the hash in the machine's names is (see [`crate::naming`]).
    pub name_scheme: NameScheme,
    pub cluster_name: String,
    pub vcpu: u32,
    pub memory_mib: u64,
    pub disk_gib: u64,
    /// The base image volume in `base_pool`.
    pub image: String,
    /// The base image's format when the provider knows it (an image it
    /// downloaded and checked): the root disk's backing format. `None`: the
    /// format libvirt reports for the volume.
    pub image_format: Option<String>,
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
    /// The guest's addresses come from IPAM, not from the network's DHCP: it
    /// gets `static_addresses` from a cloud-init network-config on its seed,
    /// and the network's DHCP is not used (no reservation, no lease lookups).
    pub ipam: bool,
    /// The addresses IPAM gave (needed to create; not to delete).
    pub static_addresses: Vec<crate::cloud_init::StaticAddress>,
    /// Nameservers for the network-config of static addresses.
    pub nameservers: Vec<String>,
    /// NICs after the first, in order (`spec.additionalNetworks`).
    pub additional_nics: Vec<AdditionalNic>,
    /// `spec.cpu`; `None`: host-passthrough on kvm, QEMU's default CPU on qemu.
    pub cpu: Option<CpuSettings>,
    /// `spec.firmware`; `None`: BIOS, no TPM.
    pub firmware: Option<FirmwareSettings>,
    /// `spec.dataDisks`, in order, each with its pool resolved.
    pub data_disks: Vec<DataDisk>,
    /// What the bootstrap data is: cloud-init's user-data (the seed ISO's) or
    /// an Ignition config (a firmware config entry). Only create reads it.
    pub bootstrap_format: BootstrapFormat,
}

/// The format of a machine's bootstrap data (the bootstrap Secret's `format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BootstrapFormat {
    /// cloud-init user-data (`cloud-config`), the seed ISO's user-data.
    #[default]
    CloudConfig,
    /// An Ignition config, handed to the guest in QEMU's firmware config.
    Ignition,
}

impl BootstrapFormat {
    pub fn is_ignition(self) -> bool {
        self == BootstrapFormat::Ignition
    }
}

/// A NIC after the first: where it is plugged in and how the guest addresses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionalNic {
    pub attach: NicAttachment,
    /// Static addresses (from IPAM) the guest configures; empty: the guest
    /// asks DHCP on this NIC (no reservation is made for it).
    pub static_addresses: Vec<crate::cloud_init::StaticAddress>,
}

/// The longest hostname Linux accepts (`HOST_NAME_MAX`).
pub const HOSTNAME_MAX: usize = 64;

impl MachineSpec {
    /// What the guest is told about itself is usable: the hostname (the
    /// LibvirtMachine's name) fits a Linux hostname and every nameserver is an
    /// IP address (it is written into the guest's network-config); its CPU
    /// and firmware settings agree with each other and with its vCPUs; its
    /// data disks can be made ([`crate::data_disk::check`]).
    /// Checked before anything is created.
    pub fn check_guest_settings(&self) -> HostResult<()> {
        check_settings(self.cpu.as_ref(), self.firmware.as_ref(), self.vcpu)
            .map_err(|c| HostError::GuestHardwareContradiction { field: c.field, detail: c.detail })?;
        crate::data_disk::check(&self.data_disks).map_err(|detail| HostError::DataDiskInvalid { detail })?;
        let static_nics = self.ipam || self.additional_nics.iter().any(|nic| !nic.static_addresses.is_empty());
        if self.bootstrap_format.is_ignition() && static_nics {
            return Err(HostError::IgnitionWithStaticAddresses);
        }
        if self.name.chars().count() > HOSTNAME_MAX {
            return Err(HostError::HostnameTooLong {
                hostname: self.name.clone(),
                length: self.name.chars().count(),
                max: HOSTNAME_MAX,
            });
        }
        if let Some(bad) = self.nameservers.iter().find(|n| n.parse::<std::net::IpAddr>().is_err()) {
            return Err(HostError::NameserverNotAnAddress { value: bad.clone() });
        }
        Ok(())
    }

    /// Whether the machine asks for CPU or firmware settings, which are
    /// checked against the host's domain capabilities (without them, nothing
    /// is asked of the host beyond what every domain needs).
    pub fn asks_for_guest_hardware(&self) -> bool {
        self.cpu.is_some() || self.firmware.is_some()
    }

    /// The guest's address comes from IPAM, not from the network's DHCP.
    pub fn is_static(&self) -> bool {
        self.ipam
    }

    /// The machine's names under its scheme ([`NameScheme::Either`] gives the
    /// current ones; the host calls resolve it first).
    pub fn names(&self) -> MachineNames {
        MachineNames::in_scheme(self.name_scheme, &self.namespace, &self.name, &self.identity)
    }

    fn owner(&self) -> OwnerMarker {
        OwnerMarker {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.identity.clone(),
            cluster: self.cluster_name.clone(),
        }
    }
}

/// The create steps, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CreateStep {
    RootDisk,
    DataDisks,
    CloudInitVolume,
    CloudInitUpload,
    IgnitionConfig,
    DhcpReservation,
    Define,
    Autostart,
    Start,
}

impl CreateStep {
    /// A short name for metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            CreateStep::RootDisk => "disk",
            CreateStep::DataDisks => "data_disks",
            CreateStep::CloudInitVolume => "iso_volume",
            CreateStep::CloudInitUpload => "iso_upload",
            CreateStep::IgnitionConfig => "ignition",
            CreateStep::DhcpReservation => "reservation",
            CreateStep::Define => "define",
            CreateStep::Autostart => "autostart",
            CreateStep::Start => "start",
        }
    }

    pub const ALL: [CreateStep; 9] = [
        CreateStep::RootDisk,
        CreateStep::DataDisks,
        CreateStep::CloudInitVolume,
        CreateStep::CloudInitUpload,
        CreateStep::IgnitionConfig,
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
    /// The MAC of the domain's interface on the network, the one its DHCP
    /// entry reserves the address for: the MAC derived from the domain name,
    /// or the next free candidate when that was taken (see [`crate::naming`]).
    /// `None` only for a domain without an interface.
    pub mac: Option<String>,
    /// Where the data disks are, in `spec.dataDisks` order (from the spec:
    /// no call reads them).
    pub data_disks: Vec<DataDiskReport>,
}

/// One data disk as the LibvirtMachine's status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDiskReport {
    pub name: String,
    /// `<pool>/<volume>`.
    pub volume: String,
    /// The target device in the domain (`vdb`, `sdb`, ...).
    pub device: String,
}

/// Creates the machine, seeded with the bootstrap data `user_data` (the
/// cloud-init user-data, or the Ignition config when the spec's
/// [`BootstrapFormat`] says so): root disk, data disks, seed ISO, Ignition config, DHCP reservation, domain,
/// autostart, start ([`CreateStep::ALL`]). Each step first checks whether it
/// is done, so a create after a crash at any point finishes the job. When the
/// domain exists already nothing is created: it is started when stopped, as
/// [`start_machine`] does.
pub fn create_machine(hv: &dyn Hypervisor, spec: &MachineSpec, user_data: &[u8]) -> HostResult<MachineReport> {
    create_machine_timed(hv, spec, user_data, &mut |_, _| {})
}

/// [`create_machine`], telling `took` how long each create step ran (the
/// steps that ran; nothing when the domain existed already). The manager
/// records them as a metric; the benchmarks read it.
pub fn create_machine_timed(
    hv: &dyn Hypervisor,
    spec: &MachineSpec,
    user_data: &[u8],
    took: &mut dyn FnMut(CreateStep, std::time::Duration),
) -> HostResult<MachineReport> {
    let mut run = MachineRun::new(hv, spec)?;
    if let Some(info) = run.owned_domain()? {
        return run.start_existing(&info);
    }
    run.domain_absent = true;
    run.preflight()?;
    for step in CreateStep::ALL {
        let started = std::time::Instant::now();
        run.step(step, user_data)?;
        took(step, started.elapsed());
    }
    let mac = run.mac.clone();
    Ok(run.report(DomainState::Running, true, true, Vec::new(), mac))
}

/// Makes an existing machine run: starts its domain when it is stopped and
/// reads its address when it runs. Never creates anything: `None` when the
/// domain does not exist (that takes [`create_machine`] and the bootstrap data).
pub fn start_machine(hv: &dyn Hypervisor, spec: &MachineSpec) -> HostResult<Option<MachineReport>> {
    let run = MachineRun::new(hv, spec)?;
    let Some(info) = run.owned_domain()? else { return Ok(None) };
    run.start_existing(&info).map(Some)
}

/// Runs the given create steps in order, seeded with `user_data`, each one
/// checking whether it was already done. [`create_machine`] runs all of
/// [`CreateStep::ALL`]; running a prefix of it simulates a crash after that step.
pub fn run_create_steps(
    hv: &dyn Hypervisor,
    spec: &MachineSpec,
    user_data: &[u8],
    steps: &[CreateStep],
) -> HostResult<()> {
    let mut run = MachineRun::new(hv, spec)?;
    for step in steps {
        run.step(*step, user_data)?;
    }
    Ok(())
}

/// Reads the machine's domain without changing anything: `None` when it does not exist.
pub fn observe_machine(hv: &dyn Hypervisor, spec: &MachineSpec) -> HostResult<Option<MachineReport>> {
    let run = MachineRun::new(hv, spec)?;
    let Some(info) = run.owned_domain()? else { return Ok(None) };
    let mac = run.domain_mac(&info);
    let state = run.domain_state()?;
    let addresses = if state == DomainState::Running { run.addresses(mac.as_deref())? } else { Vec::new() };
    Ok(Some(run.report(state, false, false, addresses, mac)))
}

/// Writes the machine's DHCP reservation again, unchanged, for a running
/// guest that has waited long for its lease: libvirt then has the network's
/// dnsmasq reload its hosts, and starts it again if it died (libvirt does not
/// notice a dead dnsmasq by itself; until the next change of the network or a
/// libvirtd restart no guest gets a lease). Returns whether the machine had a
/// reservation to write. Two calls: network XML, DHCP update.
pub fn refresh_reservation(hv: &dyn Hypervisor, spec: &MachineSpec) -> HostResult<bool> {
    MachineRun::new(hv, spec)?.refresh_reservation()
}

/// Removes the domain (destroy, undefine with managed save, snapshot
/// metadata and NVRAM), the root disk, the data disks, the Ignition config,
/// the cloud-init ISO and the DHCP reservation. Each step tolerates "already gone".
///
/// An object at one of our names that is not ours (a foreign domain, a
/// volume or DHCP entry that fails the ownership rules, or a volume or DHCP
/// entry a foreign domain uses) is left untouched and returned, with why:
/// nothing of ours exists under that name, so it is nothing to wait for.
/// Everything else is removed. An empty list means the host holds nothing
/// of the machine any more. A failed call (an unreachable host, an inactive
/// pool) is an error: retry.
pub fn delete_machine(hv: &dyn Hypervisor, spec: &MachineSpec) -> HostResult<Vec<LeftOnHost>> {
    let run = MachineRun::new(hv, spec)?;
    let mut left = Vec::new();
    let (ours, foreign) = match run.domain_at_our_name()? {
        None => (None, None),
        Some(info) => match run.not_ours(&info) {
            None => (Some(info), None),
            Some(why) => {
                left.push(LeftOnHost { kind: ObjectKind::Domain, object: run.names.domain.clone(), why });
                (None, Some(info))
            }
        },
    };
    if ours.is_some() {
        run.remove_domain()?;
    }
    let reservation = if spec.is_static() { Ok(None) } else { run.remove_reservation(foreign.as_ref()) };
    let mut disks = vec![run.remove_overlay(ours.as_ref(), foreign.as_ref())];
    disks.extend(run.remove_data_disks(ours.as_ref(), foreign.as_ref()));
    disks.push(run.remove_ignition(ours.as_ref(), foreign.as_ref()));
    // The seed records whose the disks are: it goes only once every disk is
    // gone (or known not to be ours), never before one.
    let unsettled = disks.iter().any(|d| matches!(d, Err(e) if !matches!(e, HostError::Collision { .. })));
    let seed = if unsettled { Ok(None) } else { run.remove_seed(ours.as_ref(), foreign.as_ref()) };
    let results = disks.into_iter().chain([seed, reservation]);
    let mut failure = None;
    for result in results {
        match result {
            Ok(None) => {}
            Ok(Some(kept)) => left.push(kept),
            Err(HostError::Collision { kind, object, detail, .. }) => {
                left.push(LeftOnHost { kind, object, why: detail })
            }
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(left),
    }
}

/// An object at one of the machine's names that [`delete_machine`] left on
/// the host because it is not the machine's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOnHost {
    pub kind: ObjectKind,
    /// The object: a domain name, `<pool>/<volume>`, or `<network> mac=.. name=..`.
    pub object: String,
    /// Why it is not the machine's.
    pub why: String,
}

impl std::fmt::Display for LeftOnHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} \"{}\" ({})", self.kind, self.object, self.why)
    }
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
    /// The data disks' paths, in order, once this run made or found them.
    data_disk_paths: Option<Vec<String>>,
    /// The Ignition config's path, once this run wrote it.
    ignition_path: Option<String>,
    seed_path: Option<String>,
    /// Set when this run defined the domain (so it is known to be shut off).
    defined_now: bool,
    /// The MAC of our DHCP entry, once this run reserved or read it.
    mac: Option<String>,
    /// The host's architecture, the domain type and the feature nested
    /// virtualisation requires, once this run's checks read and checked
    /// them (define then asks the host again only in a run without checks).
    platform: Option<Platform>,
}

/// What [`MachineRun::preflight`] learned of the host for the domain.
#[derive(Debug, Clone)]
struct Platform {
    arch: String,
    domain_type: &'static str,
    nested_feature: Option<&'static str>,
}

impl<'a> MachineRun<'a> {
    fn new(hv: &'a dyn Hypervisor, spec: &'a MachineSpec) -> HostResult<Self> {
        let mut run = Self {
            hv,
            spec,
            names: spec.names(),
            uri: hv.uri().to_string(),
            domain_absent: false,
            overlay_path: None,
            data_disk_paths: None,
            ignition_path: None,
            seed_path: None,
            defined_now: false,
            mac: None,
            platform: None,
        };
        if spec.name_scheme == NameScheme::Either {
            // One lookup, only until the provider has recorded the domain name.
            let legacy = MachineNames::in_scheme(NameScheme::Legacy, &spec.namespace, &spec.name, &spec.identity);
            if run.domain_named(&legacy.domain)?.is_some_and(|info| run.not_ours(&info).is_none()) {
                run.names = legacy;
            }
        }
        Ok(run)
    }

    fn report(
        &self,
        state: DomainState,
        created: bool,
        started: bool,
        mut ips: Vec<MachineAddress>,
        mac: Option<String>,
    ) -> MachineReport {
        ips.push(MachineAddress::Hostname(self.names.hostname().to_string()));
        let disks = &self.spec.data_disks;
        let data_disks = disks
            .iter()
            .zip(crate::data_disk::targets(disks))
            .map(|(disk, device)| DataDiskReport {
                name: disk.name.clone(),
                volume: format!("{}/{}", disk.pool, self.names.data_volume(&disk.name, disk.format.as_str())),
                device,
            })
            .collect();
        MachineReport {
            domain: self.names.domain.clone(),
            provider_id: self.names.provider_id(),
            state,
            created,
            started,
            addresses: ips,
            mac,
            data_disks,
        }
    }

    /// One create step; only the create flows run these, and they have the
    /// bootstrap data (the seed's user-data, or the Ignition config).
    fn step(&mut self, step: CreateStep, bootstrap: &[u8]) -> HostResult<()> {
        let ignition = self.spec.bootstrap_format.is_ignition();
        let user_data = self.seed_user_data(bootstrap);
        match step {
            CreateStep::RootDisk => self.ensure_root_disk(),
            CreateStep::DataDisks => self.ensure_data_disks(),
            // Once the domain is defined the seed is complete (define comes after the upload),
            // and rewriting a cdrom a guest may be reading is not done.
            CreateStep::CloudInitVolume if self.domain_defined()? => Ok(()),
            CreateStep::CloudInitUpload if self.domain_defined()? => Ok(()),
            CreateStep::CloudInitVolume => self.ensure_seed_volume(user_data),
            CreateStep::CloudInitUpload => self.upload_seed(user_data),
            CreateStep::IgnitionConfig if !ignition || self.domain_defined()? => Ok(()),
            CreateStep::IgnitionConfig => self.ensure_ignition(bootstrap),
            CreateStep::DhcpReservation if self.spec.is_static() => Ok(()),
            CreateStep::DhcpReservation => self.ensure_reservation().map(|_| ()),
            CreateStep::Define => self.ensure_defined(),
            CreateStep::Autostart => self.set_autostart(),
            CreateStep::Start => self.ensure_started(),
        }
    }

    /// What would make a create fail halfway, checked before anything is made:
    /// the base image is usable and the network has an address for us (our
    /// reservation, or a free one); with static addresses, the host has the
    /// bridge of a network onto one (when its libvirtd can say); every
    /// additional NIC's network or bridge is there; the host offers the CPU
    /// and firmware asked for; every data disk's pool can hold it.
    fn preflight(&mut self) -> HostResult<()> {
        self.spec.check_guest_settings()?;
        if self.spec.asks_for_guest_hardware() {
            let (arch, domain_type) = self.host_platform()?;
            let nested_feature = self.checked_guest_hardware(&arch, domain_type)?;
            self.platform = Some(Platform { arch, domain_type, nested_feature });
        }
        self.base_image()?;
        self.data_disk_pools_usable()?;
        if self.spec.is_static() {
            self.host_bridge_present()?
        } else {
            self.address_available()?
        }
        self.additional_nics_attachable()
    }

    /// The domain `info` exists: start it when it is stopped (autostart on
    /// first), then read its address (by its interface's MAC) when it runs.
    fn start_existing(&self, info: &crate::domain_xml::DomainInfo) -> HostResult<MachineReport> {
        let mac = self.domain_mac(info);
        let mut state = self.domain_state()?;
        let mut started = false;
        if matches!(state, DomainState::Shutoff | DomainState::Crashed) {
            self.ensure_autostart_on()?;
            self.start()?;
            state = DomainState::Running;
            started = true;
        }
        let addresses = if state == DomainState::Running { self.addresses(mac.as_deref())? } else { Vec::new() };
        Ok(self.report(state, false, started, addresses, mac))
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest_hardware::{CpuMode, FirmwareType};
    use crate::hypervisor::HostAdmin;
    use crate::hypervisor::sim::SimHypervisor;
    use crate::sim_host;

    fn spec(name: &str) -> MachineSpec {
        MachineSpec {
            namespace: "ns".into(),
            name: name.into(),
            identity: "6a1f0c2e-0000-4000-8000-000000000001".into(),
            name_scheme: NameScheme::Current,
            cluster_name: "c".into(),
            vcpu: 1,
            memory_mib: 128,
            disk_gib: 2,
            image: sim_host::BASE_IMAGE.into(),
            image_format: None,
            network: sim_host::NETWORK.into(),
            base_pool: sim_host::BASE_POOL.into(),
            domain_pool: sim_host::DOMAIN_POOL.into(),
            control_plane_host: None,
            domain_type: DomainTypePreference::Qemu,
            console_log_dir: None,
            ipam: true,
            static_addresses: vec![crate::cloud_init::StaticAddress {
                address: "192.168.122.50".parse().unwrap(),
                prefix: 24,
                gateway: None,
            }],
            nameservers: vec!["192.168.122.1".into()],
            additional_nics: Vec::new(),
            cpu: None,
            firmware: None,
            data_disks: Vec::new(),
            bootstrap_format: BootstrapFormat::CloudConfig,
        }
    }

    /// What the guest is told about itself is checked before anything is
    /// created: a nameserver that is not an address, a hostname Linux would
    /// refuse. Nothing is left on the host.
    #[rstest::rstest]
    #[case::nameserver(
        "worker-0",
        "10.0.0.1\nruncmd: [x]",
        "spec.nameservers has \"10.0.0.1\nruncmd: [x]\", which is not an IP address"
    )]
    #[case::hostname(&"w".repeat(65), "192.168.122.1", "has 65 characters, more than the 64 a Linux hostname may have")]
    fn unusable_guest_settings_are_refused_before_anything_is_created(
        #[case] name: &str,
        #[case] nameserver: &str,
        #[case] why: &str,
    ) {
        let uri = format!("sim:///guest-settings-{}", name.len());
        let _host = sim_host::register(&uri).unwrap();
        let hv = SimHypervisor::connect(&uri).unwrap();
        let mut bad = spec(name);
        bad.nameservers = vec!["192.168.122.1".into(), nameserver.into()];
        let err = create_machine(&hv, &bad, b"#cloud-config\n").unwrap_err();
        assert_eq!(err.kind(), crate::FailureKind::InvalidMachineSpec, "{err}");
        assert!(err.to_string().contains(why), "{err}");
        assert_eq!(hv.domain_list().unwrap(), Vec::<String>::new());
        let volumes = hv.volume_list(sim_host::DOMAIN_POOL).unwrap();
        assert_eq!(volumes, Vec::<String>::new());
    }

    /// CPU and firmware settings that contradict themselves, or that the
    /// host's domain capabilities lack, are refused before anything is
    /// created, with the reason. The default simulated host runs domain type
    /// qemu here (no host-passthrough), offers UEFI, and lists qemu64 but no
    /// Penryn and no vmx or svm.
    #[rstest::rstest]
    #[case::topology(Some(cpu(CpuMode::HostModel, None, Some((2, 2, 1)), false)), None, "2 sockets x 2 cores x 1 threads = 4 vCPUs but spec.vcpu is 1")]
    #[case::passthrough(
        Some(cpu(CpuMode::HostPassthrough, None, None, false)),
        None,
        "spec.cpu.mode host-passthrough is not available on sim:///hw-"
    )]
    #[case::unlisted_model(
        Some(cpu(CpuMode::Custom, Some("Penryn"), None, false)),
        None,
        "spec.cpu.model \"Penryn\" is not available"
    )]
    #[case::nested(Some(cpu(CpuMode::HostModel, None, None, true)), None, "neither vmx nor svm")]
    #[case::secure_boot_bios(None, Some(FirmwareSettings { kind: FirmwareType::Bios, secure_boot: true, tpm: false }), "spec.firmware.secureBoot needs spec.firmware.type uefi")]
    fn refused_cpu_and_firmware_settings_create_nothing(
        #[case] cpu_settings: Option<CpuSettings>,
        #[case] firmware: Option<FirmwareSettings>,
        #[case] why: &str,
    ) {
        let uri = format!("sim:///hw-{}", why.len());
        let _host = sim_host::register(&uri).unwrap();
        let hv = SimHypervisor::connect(&uri).unwrap();
        let mut bad = spec("worker-0");
        bad.cpu = cpu_settings;
        bad.firmware = firmware;
        let err = create_machine(&hv, &bad, b"#cloud-config\n").unwrap_err();
        assert_eq!(err.kind(), crate::FailureKind::InvalidMachineSpec, "{err}");
        assert!(err.to_string().contains(why), "{err}");
        assert_eq!(hv.domain_list().unwrap(), Vec::<String>::new());
        assert_eq!(hv.volume_list(sim_host::DOMAIN_POOL).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn settings_the_host_offers_make_a_domain_with_them() {
        let uri = "sim:///hw-offered";
        let _host = sim_host::register(uri).unwrap();
        let hv = SimHypervisor::connect(uri).unwrap();
        let mut fine = spec("worker-0");
        fine.vcpu = 2;
        fine.cpu = Some(cpu(CpuMode::Custom, Some("qemu64"), Some((1, 2, 1)), false));
        fine.firmware = Some(FirmwareSettings { kind: FirmwareType::Uefi, secure_boot: true, tpm: true });
        let report = create_machine(&hv, &fine, b"#cloud-config\n").unwrap();
        let xml = hv.domain_xml(&report.domain).unwrap();
        for part in [
            "<model fallback='forbid'>qemu64</model>",
            "<topology sockets='1' dies='1' cores='2' threads='1'/>",
            "<os firmware='efi'>",
            "machine='q35'",
            "<feature enabled='yes' name='secure-boot'/>",
            "<smm state='on'/>",
            "<backend type='emulator' version='2.0'/>",
        ] {
            assert!(xml.contains(part), "{part} missing from {xml}");
        }
    }

    fn cpu(mode: CpuMode, model: Option<&str>, topology: Option<(u32, u32, u32)>, nested: bool) -> CpuSettings {
        CpuSettings {
            mode,
            model: model.map(str::to_string),
            topology: topology.map(|(sockets, cores, threads)| crate::guest_hardware::CpuTopology {
                sockets,
                cores,
                threads,
            }),
            nested_virtualization: nested,
        }
    }

    /// Ignition does not read the seed's network-config, so a machine with
    /// static addresses cannot get them from an Ignition config: refused
    /// before anything is created.
    #[test]
    fn ignition_with_static_addresses_is_refused_before_anything_is_created() {
        let uri = "sim:///ignition-static";
        let _host = sim_host::register(uri).unwrap();
        let hv = SimHypervisor::connect(uri).unwrap();
        let mut bad = spec("worker-0");
        bad.bootstrap_format = BootstrapFormat::Ignition;
        let err = create_machine(&hv, &bad, b"{}").unwrap_err();
        assert_eq!(err, HostError::IgnitionWithStaticAddresses);
        assert_eq!(err.kind(), crate::FailureKind::InvalidMachineSpec);
        assert!(err.to_string().contains("spec.addressesFromPools"), "{err}");
        assert_eq!(hv.domain_list().unwrap(), Vec::<String>::new());
        assert_eq!(hv.volume_list(sim_host::DOMAIN_POOL).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_hostname_of_64_characters_and_ipv6_nameservers_are_fine() {
        let mut fine = spec(&"w".repeat(64));
        fine.nameservers = vec!["fd00::1".into(), "192.168.122.1".into()];
        assert_eq!(fine.check_guest_settings(), Ok(()));
    }
}
