//! The one seam between the provider and a libvirt host.
//!
//! [`Hypervisor`] speaks at libvirt's own level: look objects up by name, pass
//! XML documents in, read XML documents back, move bytes through streams. It
//! is deliberately synchronous: libvirt's API is blocking, so callers on an
//! async runtime run these methods through `tokio::task::spawn_blocking`
//! (see [`connections::HostHandle`]), never on a runtime worker.
//!
//! [`HostAdmin`] holds the calls only tests and host set-up make (network
//! and pool lifecycle, listing), so that the production trait stays the
//! provider's real surface.
//!
//! Two implementations exist: `libvirt::LibvirtHypervisor` over the `virt`
//! crate (real hosts, `test:///default`) and `sim::SimHypervisor` over the
//! `libvirt-sim` crate. Everything above this trait is shared, so a test on
//! the simulator runs the code that runs in production.

pub mod connections;
pub mod error;
pub mod events;
pub mod libvirt;
pub mod observed;
#[cfg(any(test, feature = "sim"))]
pub mod sim;

pub use error::{ErrorKind, HypervisorError, Result, kind_of};

/// Domain states as `virDomainGetState` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DomainState {
    NoState,
    Running,
    Blocked,
    Paused,
    Shutdown,
    Shutoff,
    Crashed,
    PmSuspended,
}

impl DomainState {
    pub fn as_str(&self) -> &'static str {
        match self {
            DomainState::NoState => "nostate",
            DomainState::Running => "running",
            DomainState::Blocked => "blocked",
            DomainState::Paused => "paused",
            DomainState::Shutdown => "shutdown",
            DomainState::Shutoff => "shutoff",
            DomainState::Crashed => "crashed",
            DomainState::PmSuspended => "pmsuspended",
        }
    }
}

/// `virDomainEventType`: what a lifecycle event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DomainEventKind {
    /// VIR_DOMAIN_EVENT_DEFINED (0)
    Defined,
    /// VIR_DOMAIN_EVENT_UNDEFINED (1)
    Undefined,
    /// VIR_DOMAIN_EVENT_STARTED (2)
    Started,
    /// VIR_DOMAIN_EVENT_SUSPENDED (3)
    Suspended,
    /// VIR_DOMAIN_EVENT_RESUMED (4)
    Resumed,
    /// VIR_DOMAIN_EVENT_STOPPED (5)
    Stopped,
    /// VIR_DOMAIN_EVENT_SHUTDOWN (6)
    Shutdown,
    /// VIR_DOMAIN_EVENT_PMSUSPENDED (7)
    PmSuspended,
    /// VIR_DOMAIN_EVENT_CRASHED (8)
    Crashed,
}

impl DomainEventKind {
    /// The kind for libvirt's `virDomainEventType` number; `None` for a number this
    /// libvirt client does not know (a newer daemon's).
    pub fn from_raw(raw: i32) -> Option<Self> {
        Some(match raw {
            0 => Self::Defined,
            1 => Self::Undefined,
            2 => Self::Started,
            3 => Self::Suspended,
            4 => Self::Resumed,
            5 => Self::Stopped,
            6 => Self::Shutdown,
            7 => Self::PmSuspended,
            8 => Self::Crashed,
            _ => return None,
        })
    }

    /// libvirt's number for this kind.
    pub fn raw(self) -> i32 {
        self as i32
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Defined => "defined",
            Self::Undefined => "undefined",
            Self::Started => "started",
            Self::Suspended => "suspended",
            Self::Resumed => "resumed",
            Self::Stopped => "stopped",
            Self::Shutdown => "shutdown",
            Self::PmSuspended => "pmsuspended",
            Self::Crashed => "crashed",
        }
    }
}

/// One domain lifecycle event (`VIR_DOMAIN_EVENT_ID_LIFECYCLE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainEvent {
    /// The domain's name.
    pub domain: String,
    pub kind: DomainEventKind,
    /// libvirt's detail code for the kind (`virDomainEvent<Kind>DetailType`), e.g.
    /// `VIR_DOMAIN_EVENT_STOPPED_DESTROYED` (2) for a `Stopped` event after a destroy.
    pub detail: i32,
}

/// Receives the lifecycle events of a subscription. It runs on the backend's event
/// thread (libvirt's `libvirt-events` loop, the simulator's dispatcher), one event at a
/// time in the order the host reported them: it must be quick and must not block (hand
/// the event on, e.g. into a channel).
pub type DomainEventCallback = Box<dyn Fn(DomainEvent) + Send + Sync + 'static>;

/// A registered lifecycle-event callback; dropping it deregisters the callback
/// (after the drop returns, at most a call already under way finishes).
#[must_use = "dropping the subscription deregisters the callback at once"]
pub struct EventSubscription {
    cancel: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl EventSubscription {
    /// A subscription that runs `cancel` when dropped.
    pub fn new(cancel: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self { cancel: Some(Box::new(cancel)) }
    }
}

impl Drop for EventSubscription {
    fn drop(&mut self) {
        if let Some(cancel) = self.cancel.take() {
            cancel();
        }
    }
}

impl std::fmt::Debug for EventSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSubscription").finish_non_exhaustive()
    }
}

/// `virNetworkUpdateCommand` values the provider uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkUpdateCommand {
    /// VIR_NETWORK_UPDATE_COMMAND_MODIFY (1)
    Modify,
    /// VIR_NETWORK_UPDATE_COMMAND_DELETE (2)
    Delete,
    /// VIR_NETWORK_UPDATE_COMMAND_ADD_LAST (3)
    AddLast,
    /// VIR_NETWORK_UPDATE_COMMAND_ADD_FIRST (4)
    AddFirst,
}

/// One DHCP lease as `virNetworkGetDHCPLeases` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpLease {
    pub mac: String,
    pub ip: String,
    pub prefix: u32,
    pub hostname: Option<String>,
    /// Seconds since the epoch.
    pub expiry_time: i64,
}

/// Flags for [`Hypervisor::domain_undefine`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UndefineFlags {
    /// VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
    pub managed_save: bool,
    /// VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
    pub snapshots_metadata: bool,
    /// VIR_DOMAIN_UNDEFINE_NVRAM
    pub nvram: bool,
}

impl UndefineFlags {
    /// Everything the provider wants gone with a domain it created.
    pub fn all() -> Self {
        Self { managed_save: true, snapshots_metadata: true, nvram: true }
    }
}

/// What a host has in memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeMemory {
    /// The host's memory (`virNodeGetInfo`).
    pub total: u64,
    /// The memory nothing uses now (`virNodeGetFreeMemory`).
    pub free: u64,
    /// The maximum memory of every domain defined on the host, running or not.
    pub committed: u64,
}

impl NodeMemory {
    /// What one more domain can take without overcommitting the host: no
    /// more than is free now, and no more than the defined domains leave of
    /// the total (a stopped domain takes its share when it starts; a running
    /// one may not have touched all of it yet).
    pub fn available(&self) -> u64 {
        self.free.min(self.total.saturating_sub(self.committed))
    }
}

/// A connection to one libvirt host: the calls the provider makes in
/// production, and nothing else.
///
/// All methods block. Object arguments are names, as libvirt's `LookupByName`
/// calls take them; XML in and out is libvirt's own format. Setting a host
/// up (networks, pools) and listing its objects are [`HostAdmin`]'s.
pub trait Hypervisor: Send + Sync {
    /// The URI this connection was opened with.
    fn uri(&self) -> &str;

    /// `virConnectGetCapabilities`: the host capabilities XML.
    fn capabilities_xml(&self) -> Result<String>;

    /// `virConnectGetDomainCapabilities`: what a domain of type `virttype`
    /// (`kvm`, `qemu`) for `arch` on `machine` (`pc`, `q35`; `None`: the
    /// emulator's default) can have: CPU modes and models, firmware, TPM.
    /// The emulator is the host's default for `arch`.
    fn domain_capabilities_xml(&self, arch: &str, machine: Option<&str>, virttype: &str) -> Result<String>;

    /// Whether a trivial call succeeds on this connection (`virConnectIsAlive`).
    fn is_alive(&self) -> bool;

    /// The host's total and free memory and what its defined domains may
    /// take (`virNodeGetInfo`, `virNodeGetFreeMemory`, and
    /// `virConnectListAllDomains` with each domain's maximum memory).
    fn node_memory(&self) -> Result<NodeMemory>;

    // --- networks ---------------------------------------------------------

    /// `virNetworkGetXMLDesc` (live config).
    fn network_xml(&self, name: &str) -> Result<String>;
    fn network_is_active(&self, name: &str) -> Result<bool>;
    /// `virNetworkUpdate` on the `ip-dhcp-host` section of the first IPv4
    /// `<ip>` element, applied live and to the persistent config.
    fn network_update_dhcp_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()>;
    /// `virNetworkUpdate` on the `dns-host` section (`<host ip=..><hostname>..</hostname></host>`),
    /// applied live and to the persistent config.
    fn network_update_dns_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()>;
    /// `virNetworkGetDHCPLeases` for all MACs.
    fn network_dhcp_leases(&self, network: &str) -> Result<Vec<DhcpLease>>;

    // --- host interfaces --------------------------------------------------

    /// `virInterfaceLookupByName` + `virInterfaceGetXMLDesc` (flags 0): a host
    /// interface (e.g. the Linux bridge a network in forward mode bridge names).
    /// `NoInterface` when the host has none of that name; `NoSupport` from a
    /// libvirtd without its interface driver, which cannot tell.
    fn interface_xml(&self, name: &str) -> Result<String>;

    // --- storage pools ----------------------------------------------------

    fn pool_is_active(&self, name: &str) -> Result<bool>;
    /// `virStoragePoolGetXMLDesc` (flags 0): the pool's type and paths.
    fn pool_xml(&self, name: &str) -> Result<String>;

    // --- volumes ----------------------------------------------------------

    /// `virStorageVolGetXMLDesc`
    fn volume_xml(&self, pool: &str, name: &str) -> Result<String>;
    /// `virStorageVolCreateXML` (flags 0); returns the volume name.
    fn volume_create(&self, pool: &str, xml: &str) -> Result<String>;
    /// `virStorageVolUpload` through a stream, replacing the volume's content
    /// from offset 0.
    fn volume_upload(&self, pool: &str, name: &str, bytes: &[u8]) -> Result<()>;
    /// `virStorageVolUpload` of `length` bytes from offset 0 through a
    /// stream, sent in chunks as `source` yields them until it is at its end
    /// (never all in memory). The stream is finished only when `source` gave
    /// exactly `length` bytes; otherwise it is aborted and the call fails
    /// (kind `Other`, code 0): a `source` that fails (the message starts
    /// "reading the upload's source"), ends short of `length` (libvirtd
    /// would finish such a stream without a word) or goes on past it (what
    /// goes past is never sent: libvirtd 11 exits on it). Bytes already
    /// sent stay in the volume. Like libvirt, an upload larger than the
    /// volume's capacity grows a file-based volume.
    fn volume_upload_from(&self, pool: &str, name: &str, length: u64, source: &mut dyn std::io::Read) -> Result<()>;
    /// `virStorageVolDownload` through a stream: the whole volume.
    fn volume_download(&self, pool: &str, name: &str) -> Result<Vec<u8>>;
    /// `virStorageVolDelete` (flags 0).
    fn volume_delete(&self, pool: &str, name: &str) -> Result<()>;
    /// Every volume (`pool/name`) of every active pool whose backing store
    /// is the file `path`: the overlays that still need it
    /// (`virConnectListAllStoragePools`, then each pool's volumes and their XML).
    fn volumes_backed_by(&self, path: &str) -> Result<Vec<String>>;

    // --- domains ----------------------------------------------------------

    /// All domains, active and inactive (`virConnectListAllDomains`).
    fn domain_list(&self) -> Result<Vec<String>>;
    /// `virDomainDefineXML`; returns the domain name.
    fn domain_define(&self, xml: &str) -> Result<String>;
    /// `virDomainGetXMLDesc` (flags 0).
    fn domain_xml(&self, name: &str) -> Result<String>;
    fn domain_state(&self, name: &str) -> Result<DomainState>;
    /// `virDomainCreate`
    fn domain_start(&self, name: &str) -> Result<()>;
    /// `virDomainDestroy`
    fn domain_destroy(&self, name: &str) -> Result<()>;
    /// `virDomainReset`: an immediate hardware reset of an active domain, as
    /// the reset button of a PC does. The guest OS is not asked and gets no
    /// chance to flush anything: its disks are left as after a power cut. The
    /// QEMU process stays (same domain id, same console log), and the domain
    /// keeps its state: a paused domain stays paused. libvirt reports no
    /// lifecycle event for it (only `VIR_DOMAIN_EVENT_ID_REBOOT`).
    /// `OperationInvalid` (55, "domain is not running") on a shut-off domain.
    fn domain_reset(&self, name: &str) -> Result<()>;
    /// `virDomainUndefineFlags`
    fn domain_undefine(&self, name: &str, flags: UndefineFlags) -> Result<()>;
    fn domain_autostart(&self, name: &str) -> Result<bool>;
    fn domain_set_autostart(&self, name: &str, autostart: bool) -> Result<()>;

    // --- events -----------------------------------------------------------

    /// `virConnectDomainEventRegisterAny(VIR_DOMAIN_EVENT_ID_LIFECYCLE)` for every
    /// domain of this connection: `callback` gets each lifecycle event from now until
    /// the returned [`EventSubscription`] is dropped or the connection breaks (a new
    /// connection needs a new subscription). Events arrive asynchronously: a call
    /// such as [`domain_start`](Self::domain_start) may return before its event is
    /// delivered.
    fn subscribe_domain_events(&self, callback: DomainEventCallback) -> Result<EventSubscription>;
}

/// [`Hypervisor::volumes_backed_by`] through the listing calls of [`HostAdmin`],
/// which both backends have. A volume that vanishes while it is read is skipped.
pub fn volumes_backed_by(hv: &dyn HostAdmin, path: &str) -> Result<Vec<String>> {
    let mut users = Vec::new();
    for pool in hv.pool_list()? {
        if !hv.pool_is_active(&pool)? {
            continue;
        }
        for volume in hv.volume_list(&pool)? {
            let xml = match hv.volume_xml(&pool, &volume) {
                Ok(xml) => xml,
                Err(e) if e.kind == ErrorKind::NoStorageVol => continue,
                Err(e) => return Err(e),
            };
            let backing = crate::volume_xml::parse_volume(&xml).ok().and_then(|v| v.backing);
            if backing.is_some_and(|b| b.path == path) {
                users.push(format!("{pool}/{volume}"));
            }
        }
    }
    Ok(users)
}

/// The bytes of an upload stream's message: libvirt's client sends at most 256 KiB at once.
pub const STREAM_CHUNK: usize = 256 * 1024;

/// Reads `source` in chunks of at most [`STREAM_CHUNK`] and hands each to
/// `send` with its offset, exactly `length` bytes in all: the shared half of
/// [`Hypervisor::volume_upload_from`]. Errs, sending nothing more, when the
/// source fails, ends short of `length` or goes past it.
pub fn stream_source(
    pool: &str,
    name: &str,
    length: u64,
    source: &mut dyn std::io::Read,
    send: &mut dyn FnMut(&[u8], u64) -> Result<()>,
) -> Result<()> {
    let mut buf = vec![0u8; STREAM_CHUNK];
    let mut offset = 0u64;
    loop {
        let n = match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HypervisorError::upload_source_failed(pool, name, offset, e)),
        };
        if offset + n as u64 > length {
            return Err(HypervisorError::upload_length_mismatch(pool, name, length, offset + n as u64, true));
        }
        send(&buf[..n], offset)?;
        offset += n as u64;
    }
    if offset < length {
        return Err(HypervisorError::upload_length_mismatch(pool, name, length, offset, false));
    }
    Ok(())
}

/// Opens a new connection to a host: one implementation per backend
/// ([`libvirt::LibvirtConnector`], and the simulator's `sim::SimConnector`).
pub trait Connector: Send + Sync {
    fn connect(&self, uri: &str) -> Result<std::sync::Arc<dyn Hypervisor>>;
}

/// The calls the provider never makes but tests, benchmarks and host set-up
/// do: network and pool lifecycle, and listing a host's objects. Both
/// backends implement it; the conformance suite pins them alike.
pub trait HostAdmin: Hypervisor {
    fn network_list(&self) -> Result<Vec<String>>;
    /// `virNetworkDefineXML`; returns the network name.
    fn network_define(&self, xml: &str) -> Result<String>;
    /// `virNetworkCreate`
    fn network_start(&self, name: &str) -> Result<()>;
    /// `virNetworkDestroy`
    fn network_stop(&self, name: &str) -> Result<()>;
    /// `virNetworkUndefine`
    fn network_undefine(&self, name: &str) -> Result<()>;

    fn pool_list(&self) -> Result<Vec<String>>;
    /// `virStoragePoolDefineXML`; returns the pool name.
    fn pool_define(&self, xml: &str) -> Result<String>;
    /// `virStoragePoolBuild` (flags 0).
    fn pool_build(&self, name: &str) -> Result<()>;
    /// `virStoragePoolCreate`
    fn pool_start(&self, name: &str) -> Result<()>;
    /// `virStoragePoolDestroy`
    fn pool_stop(&self, name: &str) -> Result<()>;
    /// `virStoragePoolUndefine`
    fn pool_undefine(&self, name: &str) -> Result<()>;
    /// `virStoragePoolRefresh`
    fn pool_refresh(&self, name: &str) -> Result<()>;

    fn volume_list(&self, pool: &str) -> Result<Vec<String>>;

    /// `virDomainShutdown`: asks the guest to power off (ACPI power button on QEMU);
    /// returns once asked, not once the guest is off.
    fn domain_shutdown(&self, name: &str) -> Result<()>;

    /// `virDomainSuspend`: pauses the domain's vCPUs (QEMU's process stays);
    /// a paused domain stays paused.
    fn domain_suspend(&self, name: &str) -> Result<()>;
}
