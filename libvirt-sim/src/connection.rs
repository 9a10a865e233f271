//! A connection to a simulated host, with calls shaped like libvirt's API. Objects are
//! addressed by name (libvirt's `LookupByName` plus the call, in one step).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard, Weak};

use crate::capabilities::NodeInfo;
use crate::counters::Op;
use crate::domain::{Domain, DomainDef, DomainState, undefine_flags};
use crate::error::{Error, ErrorCode, Result};
use crate::events::{DomainEvent, DomainEventKind, event_detail};
use crate::host::{HostInner, State, lookup, no_host};
use crate::ids::{Mac, Uuid};
use crate::network::{Lease, Network, NetworkDef, UpdateCommand, UpdateSection, update_flags};
use crate::storage::{Pool, PoolDef, Volume, VolumeSpec};

/// Opens a connection to the host registered under `uri` (`virConnectOpen`).
pub fn connect(uri: &str) -> Result<Connection> {
    let host = lookup(uri).ok_or_else(|| no_host(uri))?;
    let inner = host.inner;
    let call = inner.counters.record(Op::Connect);
    if let Some(err) = inner.faults.on_call(Op::Connect, call) {
        return Err(err);
    }
    inner.counters.record_connection();
    let epoch = inner.epoch.load(Ordering::SeqCst);
    Ok(Connection { host: inner, epoch, closed: AtomicBool::new(false) })
}

/// What `virNetworkLookupByName` plus the getters tell about a network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkInfo {
    pub name: String,
    pub uuid: Uuid,
    pub bridge: Option<String>,
    pub active: bool,
    pub persistent: bool,
    pub autostart: bool,
}

/// What `virStoragePoolGetInfo` and friends tell about a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    pub name: String,
    pub uuid: Uuid,
    pub active: bool,
    pub autostart: bool,
    pub capacity: u64,
    pub allocation: u64,
    pub available: u64,
}

/// What `virStorageVolGetInfo` and friends tell about a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub name: String,
    pub path: String,
    pub capacity: u64,
    pub allocation: u64,
    pub format: String,
    pub backing_path: Option<String>,
}

/// What `virDomainGetInfo` and friends tell about a domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainInfo {
    pub name: String,
    pub uuid: Uuid,
    pub id: Option<u32>,
    pub state: DomainState,
    pub reason: i32,
    pub persistent: bool,
    pub autostart: bool,
    pub memory_kib: u64,
    pub vcpus: u32,
    /// MAC addresses of the interfaces, in order.
    pub macs: Vec<String>,
}

/// An open connection. Thread-safe: share it (`Arc`) or open one per thread.
#[derive(Debug)]
pub struct Connection {
    host: Arc<HostInner>,
    epoch: u64,
    closed: AtomicBool,
}

fn active_pool<'a>(state: &'a mut State, name: &str) -> Result<&'a mut Pool> {
    let pool = state.pools.get_mut(name).ok_or_else(|| Error::no_pool(name))?;
    if !pool.active {
        return Err(Error::invalid(format!("storage pool '{name}' is not active")));
    }
    Ok(pool)
}

fn domain_mut<'a>(state: &'a mut State, name: &str) -> Result<&'a mut Domain> {
    state.domains.get_mut(name).ok_or_else(|| Error::no_domain(name))
}

fn network_mut<'a>(state: &'a mut State, name: &str) -> Result<&'a mut Network> {
    state.networks.get_mut(name).ok_or_else(|| Error::no_network(name))
}

impl Connection {
    /// Counts the call, checks the connection and applies planned faults.
    fn begin(&self, op: Op) -> Result<()> {
        let n = self.host.counters.record(op);
        if !self.is_alive() {
            return Err(Error::connection_closed());
        }
        if let Some(err) = self.host.faults.on_call(op, n) {
            return Err(err);
        }
        Ok(())
    }

    /// [`begin`](Self::begin), then locks the host.
    fn call(&self, op: Op) -> Result<MutexGuard<'_, State>> {
        self.begin(op)?;
        Ok(self.host.lock())
    }

    /// The URI the connection was opened with.
    pub fn uri(&self) -> &str {
        &self.host.uri
    }

    /// `virConnectIsAlive`: false after [`close`](Self::close), a dropped connection or a daemon restart.
    pub fn is_alive(&self) -> bool {
        !self.closed.load(Ordering::Relaxed) && self.host.epoch.load(Ordering::SeqCst) == self.epoch
    }

    /// `virConnectClose`.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    // --- host -------------------------------------------------------------

    /// `virConnectGetCapabilities`.
    pub fn get_capabilities(&self) -> Result<String> {
        let _state = self.call(Op::GetCapabilities)?;
        Ok(self.host.capabilities.to_xml(&self.host.uuid.to_string()))
    }

    /// `virConnectGetDomainCapabilities`: what a domain of type `virttype`
    /// (default: the best the host offers) on `machine` (default: `pc`) can
    /// have. Fails, as libvirt does, for an emulator, architecture, machine
    /// or domain type the host does not offer.
    pub fn get_domain_capabilities(
        &self,
        emulator: Option<&str>,
        arch: Option<&str>,
        machine: Option<&str>,
        virttype: Option<&str>,
    ) -> Result<String> {
        let _state = self.call(Op::GetDomainCapabilities)?;
        let caps = &self.host.capabilities;
        let emulator = emulator.unwrap_or(&caps.emulator);
        if emulator != caps.emulator {
            return Err(Error::new(
                ErrorCode::InvalidArg,
                format!("emulator '{emulator}' does not exist on this host"),
            ));
        }
        let arch = arch.unwrap_or(&caps.arch);
        if arch != caps.arch {
            return Err(Error::new(
                ErrorCode::InvalidArg,
                format!("architecture from emulator '{}' doesn't match given architecture '{arch}'", caps.arch),
            ));
        }
        let best = if caps.domain_types.iter().any(|t| t == "kvm") { "kvm" } else { "qemu" };
        let virttype = virttype.unwrap_or(best);
        if !caps.domain_types.iter().any(|t| t == virttype) {
            return Err(Error::new(
                ErrorCode::ConfigUnsupported,
                format!("virttype '{virttype}' is not supported by '{emulator}' on this host"),
            ));
        }
        let machine = machine.unwrap_or("pc");
        if !caps.machines.iter().any(|m| m == machine) {
            return Err(Error::new(
                ErrorCode::InvalidArg,
                format!("the machine '{machine}' is not supported by emulator '{emulator}'"),
            ));
        }
        Ok(caps.domain.to_xml(emulator, arch, machine, virttype))
    }

    /// `virNodeGetInfo`.
    pub fn node_get_info(&self) -> Result<NodeInfo> {
        let _state = self.call(Op::NodeGetInfo)?;
        Ok(NodeInfo { memory_kib: self.host.capabilities.memory_kib, cpus: self.host.capabilities.cpus })
    }

    /// `virNodeGetFreeMemory`: the configured free memory minus what running domains use.
    pub fn node_get_free_memory(&self) -> Result<u64> {
        let state = self.call(Op::NodeGetInfo)?;
        let used: u64 =
            state.domains.values().filter(|d| d.state.is_active()).map(|d| d.def.current_memory_kib * 1024).sum();
        Ok(self.host.capabilities.free_memory_bytes.saturating_sub(used))
    }

    // --- networks ---------------------------------------------------------

    /// `virConnectListAllNetworks`: names, sorted.
    pub fn list_all_networks(&self) -> Result<Vec<String>> {
        Ok(self.call(Op::ListNetworks)?.networks.keys().cloned().collect())
    }

    /// `virNetworkLookupByName` and its getters.
    pub fn network_lookup_by_name(&self, name: &str) -> Result<NetworkInfo> {
        let state = self.call(Op::NetworkLookup)?;
        let n = state.networks.get(name).ok_or_else(|| Error::no_network(name))?;
        Ok(NetworkInfo {
            name: n.def.name.clone(),
            uuid: n.def.uuid,
            bridge: n.def.bridge.clone(),
            active: n.active,
            persistent: n.persistent,
            autostart: n.autostart,
        })
    }

    /// `virNetworkIsActive`.
    pub fn network_is_active(&self, name: &str) -> Result<bool> {
        Ok(self.network_lookup_by_name(name)?.active)
    }

    /// `virInterfaceLookupByName`: the simulated host is a libvirtd without its
    /// interface driver (the host's own interfaces are not modelled), so this
    /// fails with `VIR_ERR_NO_SUPPORT` as such a daemon does.
    pub fn interface_lookup_by_name(&self, name: &str) -> Result<String> {
        let _state = self.call(Op::InterfaceLookup)?;
        let _ = name;
        Err(Error::new(ErrorCode::NoSupport, "virInterfaceLookupByName"))
    }

    /// `virNetworkGetXMLDesc`.
    pub fn network_get_xml_desc(&self, name: &str) -> Result<String> {
        let state = self.call(Op::NetworkGetXml)?;
        Ok(state.networks.get(name).ok_or_else(|| Error::no_network(name))?.def.to_xml())
    }

    fn add_network(state: &mut State, mut def: NetworkDef, persistent: bool, active: bool) -> Result<String> {
        if let Some(existing) = state.networks.get_mut(&def.name) {
            if existing.def.uuid != def.uuid {
                return Err(Error::new(
                    ErrorCode::OperationFailed,
                    format!("network '{}' already exists with uuid {}", def.name, existing.def.uuid),
                ));
            }
            if !persistent && existing.active {
                return Err(Error::invalid(format!("network is already active as '{}'", def.name)));
            }
            // Redefining keeps runtime state; only the config changes.
            existing.def = def.clone();
            existing.persistent |= persistent;
            existing.active |= active;
            return Ok(def.name);
        }
        if let Some(other) = state.networks.values().find(|n| n.def.uuid == def.uuid) {
            return Err(Error::new(
                ErrorCode::OperationFailed,
                format!("network '{}' is already defined with uuid {}", other.def.name, def.uuid),
            ));
        }
        if def.bridge.is_none() {
            let used: Vec<&str> = state.networks.values().filter_map(|n| n.def.bridge.as_deref()).collect();
            let free = (0..).map(|i| format!("virbr{i}")).find(|b| !used.contains(&b.as_str())).unwrap_or_default();
            def.bridge = Some(free);
        }
        let name = def.name.clone();
        state.networks.insert(name.clone(), Network { def, active, persistent, autostart: false, leases: Vec::new() });
        Ok(name)
    }

    /// `virNetworkDefineXML`: a persistent, inactive network (or a new config for an existing one).
    pub fn network_define_xml(&self, xml: &str) -> Result<String> {
        self.begin(Op::NetworkDefine)?;
        let def = NetworkDef::parse(xml)?;
        let mut state = self.host.lock();
        Self::add_network(&mut state, def, true, false)
    }

    /// `virNetworkCreateXML`: a transient, running network.
    pub fn network_create_xml(&self, xml: &str) -> Result<String> {
        self.begin(Op::NetworkCreate)?;
        let def = NetworkDef::parse(xml)?;
        let mut state = self.host.lock();
        Self::add_network(&mut state, def, false, true)
    }

    /// `virNetworkCreate`.
    pub fn network_create(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::NetworkCreate)?;
        let net = network_mut(&mut state, name)?;
        if net.active {
            return Err(Error::invalid("network is already active"));
        }
        net.active = true;
        Ok(())
    }

    /// `virNetworkDestroy`: stops the network (a transient one disappears); its leases go.
    pub fn network_destroy(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::NetworkDestroy)?;
        let net = network_mut(&mut state, name)?;
        if !net.active {
            return Err(Error::invalid(format!("network '{name}' is not active")));
        }
        net.active = false;
        net.leases.clear();
        if !net.persistent {
            state.networks.remove(name);
        }
        state.pending_dhcp.retain(|p| p.network != name);
        Ok(())
    }

    /// `virNetworkUndefine`: an active network becomes transient, an inactive one disappears.
    pub fn network_undefine(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::NetworkUndefine)?;
        let net = network_mut(&mut state, name)?;
        if !net.persistent {
            return Err(Error::invalid("can't undefine transient network"));
        }
        if net.active {
            net.persistent = false;
            net.autostart = false;
        } else {
            state.networks.remove(name);
        }
        Ok(())
    }

    /// `virNetworkSetAutostart`.
    pub fn network_set_autostart(&self, name: &str, autostart: bool) -> Result<()> {
        let mut state = self.call(Op::NetworkSetAutostart)?;
        let net = network_mut(&mut state, name)?;
        if !net.persistent {
            return Err(Error::invalid("cannot set autostart for transient network"));
        }
        net.autostart = autostart;
        Ok(())
    }

    /// `virNetworkUpdate`. The `ip-dhcp-host` section of the first IPv4 `<ip>`
    /// (`parent_index` -1 or 0) and the `dns-host` section are modeled; live and
    /// persistent config are one.
    pub fn network_update(
        &self,
        name: &str,
        command: UpdateCommand,
        section: UpdateSection,
        parent_index: i32,
        xml: &str,
        flags: u32,
    ) -> Result<()> {
        let mut state = self.call(Op::NetworkUpdate)?;
        let net = network_mut(&mut state, name)?;
        if !matches!(section, UpdateSection::IpDhcpHost | UpdateSection::DnsHost) {
            return Err(Error::new(
                ErrorCode::NoSupport,
                format!(
                    "libvirt-sim models only the ip-dhcp-host and dns-host sections of virNetworkUpdate, not {section:?}"
                ),
            ));
        }
        if section == UpdateSection::IpDhcpHost && parent_index > 0 {
            return Err(Error::invalid(format!(
                "couldn't update dhcp host entry - no <ip family='ipv4'> element found at index {parent_index} in network '{name}'"
            )));
        }
        let live = flags & update_flags::AFFECT_LIVE != 0 || (flags == update_flags::AFFECT_CURRENT && net.active);
        let config = flags & update_flags::AFFECT_CONFIG != 0 || (flags == update_flags::AFFECT_CURRENT && !net.active);
        if live && !net.active {
            return Err(Error::invalid("network is not running"));
        }
        if config && !net.persistent {
            return Err(Error::invalid("cannot change persistent config of a transient network"));
        }
        match section {
            UpdateSection::DnsHost => net.def.update_dns_host(command, xml),
            _ => net.def.update_dhcp_host(command, xml),
        }
    }

    /// `virNetworkGetDHCPLeases` (all MACs, or the one given).
    pub fn network_get_dhcp_leases(&self, name: &str, mac: Option<&str>) -> Result<Vec<Lease>> {
        let mut state = self.call(Op::NetworkGetDhcpLeases)?;
        if !state.networks.contains_key(name) {
            return Err(Error::no_network(name));
        }
        self.host.run_dhcp(&mut state);
        let net = &state.networks[name];
        let wanted = mac.and_then(Mac::parse);
        Ok(net.leases.iter().filter(|l| wanted.is_none_or(|m| m == l.mac)).cloned().collect())
    }

    // --- storage pools ----------------------------------------------------

    /// `virConnectListAllStoragePools`: names, sorted.
    pub fn list_all_storage_pools(&self) -> Result<Vec<String>> {
        Ok(self.call(Op::ListPools)?.pools.keys().cloned().collect())
    }

    /// `virStoragePoolLookupByName` and `virStoragePoolGetInfo`.
    pub fn storage_pool_lookup_by_name(&self, name: &str) -> Result<PoolInfo> {
        let state = self.call(Op::PoolLookup)?;
        let p = state.pools.get(name).ok_or_else(|| Error::no_pool(name))?;
        let allocation = p.allocation();
        Ok(PoolInfo {
            name: p.def.name.clone(),
            uuid: p.def.uuid,
            active: p.active,
            autostart: p.autostart,
            capacity: p.def.capacity,
            allocation,
            available: p.def.capacity.saturating_sub(allocation),
        })
    }

    /// `virStoragePoolIsActive`.
    pub fn storage_pool_is_active(&self, name: &str) -> Result<bool> {
        Ok(self.storage_pool_lookup_by_name(name)?.active)
    }

    /// `virStoragePoolGetXMLDesc`.
    pub fn storage_pool_get_xml_desc(&self, name: &str) -> Result<String> {
        let state = self.call(Op::PoolGetXml)?;
        let p = state.pools.get(name).ok_or_else(|| Error::no_pool(name))?;
        Ok(p.def.to_xml(p.allocation()))
    }

    /// `virStoragePoolDefineXML`.
    pub fn storage_pool_define_xml(&self, xml: &str) -> Result<String> {
        self.begin(Op::PoolDefine)?;
        let def = PoolDef::parse(xml)?;
        let mut state = self.host.lock();
        if let Some(existing) = state.pools.get_mut(&def.name) {
            if existing.def.uuid != def.uuid {
                return Err(Error::new(
                    ErrorCode::OperationFailed,
                    format!("pool '{}' already exists with uuid {}", def.name, existing.def.uuid),
                ));
            }
            existing.def = def.clone();
            return Ok(def.name);
        }
        if let Some(other) = state.pools.values().find(|p| p.def.uuid == def.uuid) {
            return Err(Error::new(
                ErrorCode::OperationFailed,
                format!("pool '{}' is already defined with uuid {}", other.def.name, def.uuid),
            ));
        }
        if let Some(other) = state.pools.values().find(|p| p.def.target_path == def.target_path) {
            return Err(Error::new(
                ErrorCode::OperationFailed,
                format!("Storage source conflict with pool: '{}'", other.def.name),
            ));
        }
        let name = def.name.clone();
        state.pools.insert(name.clone(), Pool { def, active: false, autostart: false, volumes: BTreeMap::new() });
        Ok(name)
    }

    /// `virStoragePoolBuild` (the simulator has no directory to create).
    pub fn storage_pool_build(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::PoolBuild)?;
        let pool = state.pools.get_mut(name).ok_or_else(|| Error::no_pool(name))?;
        if pool.active {
            return Err(Error::invalid(format!("storage pool '{name}' is already active")));
        }
        Ok(())
    }

    /// `virStoragePoolCreate`.
    pub fn storage_pool_create(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::PoolCreate)?;
        let pool = state.pools.get_mut(name).ok_or_else(|| Error::no_pool(name))?;
        if pool.active {
            return Err(Error::invalid(format!("storage pool '{name}' is already active")));
        }
        pool.active = true;
        Ok(())
    }

    /// `virStoragePoolDestroy` (volumes stay, like files in the directory).
    pub fn storage_pool_destroy(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::PoolDestroy)?;
        active_pool(&mut state, name)?.active = false;
        Ok(())
    }

    /// `virStoragePoolUndefine`.
    pub fn storage_pool_undefine(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::PoolUndefine)?;
        let pool = state.pools.get(name).ok_or_else(|| Error::no_pool(name))?;
        if pool.active {
            return Err(Error::invalid(format!("storage pool '{name}' is still active")));
        }
        state.pools.remove(name);
        Ok(())
    }

    /// `virStoragePoolRefresh`.
    pub fn storage_pool_refresh(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::PoolRefresh)?;
        active_pool(&mut state, name)?;
        Ok(())
    }

    /// `virStoragePoolSetAutostart`.
    pub fn storage_pool_set_autostart(&self, name: &str, autostart: bool) -> Result<()> {
        let mut state = self.call(Op::PoolSetAutostart)?;
        state.pools.get_mut(name).ok_or_else(|| Error::no_pool(name))?.autostart = autostart;
        Ok(())
    }

    // --- volumes ----------------------------------------------------------

    /// `virStoragePoolListAllVolumes`: names, sorted.
    pub fn storage_pool_list_all_volumes(&self, pool: &str) -> Result<Vec<String>> {
        let mut state = self.call(Op::ListVolumes)?;
        Ok(active_pool(&mut state, pool)?.volumes.keys().cloned().collect())
    }

    fn volume<'a>(state: &'a mut State, pool: &str, name: &str) -> Result<&'a mut Volume> {
        active_pool(state, pool)?.volumes.get_mut(name).ok_or_else(|| Error::no_volume(pool, name))
    }

    /// `virStorageVolLookupByName` and `virStorageVolGetInfo`.
    pub fn storage_vol_lookup_by_name(&self, pool: &str, name: &str) -> Result<VolumeInfo> {
        let mut state = self.call(Op::VolumeLookup)?;
        let v = Self::volume(&mut state, pool, name)?;
        Ok(VolumeInfo {
            name: v.name.clone(),
            path: v.path.clone(),
            capacity: v.capacity,
            allocation: v.allocation,
            format: v.format.clone(),
            backing_path: v.backing.as_ref().map(|b| b.path.clone()),
        })
    }

    /// `virStorageVolLookupByPath`: the (pool, volume) names holding `path`.
    pub fn storage_vol_lookup_by_path(&self, path: &str) -> Result<(String, String)> {
        let state = self.call(Op::VolumeLookup)?;
        state
            .volume_by_path(path)
            .filter(|(p, _)| p.active)
            .map(|(p, v)| (p.def.name.clone(), v.name.clone()))
            .ok_or_else(|| Error::new(ErrorCode::NoStorageVol, format!("no storage vol with matching path '{path}'")))
    }

    /// `virStorageVolGetXMLDesc`.
    pub fn storage_vol_get_xml_desc(&self, pool: &str, name: &str) -> Result<String> {
        let mut state = self.call(Op::VolumeGetXml)?;
        Ok(Self::volume(&mut state, pool, name)?.to_xml())
    }

    /// `virStorageVolCreateXML`: a backing store must be a path the host has.
    pub fn storage_vol_create_xml(&self, pool: &str, xml: &str) -> Result<String> {
        self.begin(Op::VolumeCreate)?;
        let spec = VolumeSpec::parse(xml);
        let mut state = self.host.lock();
        let target_dir = active_pool(&mut state, pool)?.def.target_path.clone();
        let spec = spec?;
        let mut capacity = spec.capacity;
        if let Some(backing) = &spec.backing {
            if spec.format == "raw" {
                return Err(Error::new(ErrorCode::NoSupport, "backing storage not supported for raw volumes"));
            }
            let found = state.volume_by_path(&backing.path).map(|(_, v)| v);
            match found {
                Some(b) => capacity = capacity.or(Some(b.capacity)),
                None => {
                    return Err(Error::with_message(
                        ErrorCode::SystemError,
                        format!("inaccessible backing store volume {}: No such file or directory", backing.path),
                    ));
                }
            }
        }
        let p = active_pool(&mut state, pool)?;
        if p.volumes.contains_key(&spec.name) {
            return Err(Error::new(ErrorCode::StorageVolExist, format!("'{}'", spec.name)));
        }
        let capacity = capacity.unwrap_or(0);
        let allocation = spec.allocation.unwrap_or(if spec.format == "raw" { capacity } else { 0 }).min(capacity);
        let path = format!("{target_dir}/{}", spec.name);
        let volume = Volume {
            name: spec.name.clone(),
            path,
            capacity,
            allocation,
            format: spec.format,
            backing: spec.backing,
            content: Default::default(),
        };
        p.volumes.insert(spec.name.clone(), volume);
        Ok(spec.name)
    }

    /// `virStorageVolUpload` + stream send: writes `bytes` at `offset`.
    pub fn storage_vol_upload(&self, pool: &str, name: &str, offset: u64, bytes: &[u8]) -> Result<()> {
        let mut state = self.call(Op::VolumeUpload)?;
        Self::volume(&mut state, pool, name)?.write(offset, bytes);
        Ok(())
    }

    /// `virStorageVolUpload` with a stream the caller feeds in chunks: the
    /// bytes land at `offset` onwards as they are sent (like a file write, no
    /// truncation; a raw volume grows past its capacity). With a `length`
    /// (not 0), sending past it fails ("cannot write to stream", libvirt's
    /// file stream's own refusal; libvirtd 11 exits instead); finishing
    /// before it was reached is accepted, as libvirtd accepts it.
    pub fn storage_vol_upload_stream(
        &self,
        pool: &str,
        name: &str,
        offset: u64,
        length: u64,
    ) -> Result<VolumeUploadStream<'_>> {
        let mut state = self.call(Op::VolumeUpload)?;
        Self::volume(&mut state, pool, name)?;
        Ok(VolumeUploadStream { conn: self, pool: pool.into(), name: name.into(), offset, length, sent: 0 })
    }

    /// `virStorageVolDownload` + stream receive: `length` bytes from `offset` (0 = to the end).
    pub fn storage_vol_download(&self, pool: &str, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        let mut state = self.call(Op::VolumeDownload)?;
        Ok(Self::volume(&mut state, pool, name)?.read(offset, length))
    }

    /// `virStorageVolDelete`.
    pub fn storage_vol_delete(&self, pool: &str, name: &str) -> Result<()> {
        let mut state = self.call(Op::VolumeDelete)?;
        let p = active_pool(&mut state, pool)?;
        p.volumes.remove(name).ok_or_else(|| Error::no_volume(pool, name))?;
        Ok(())
    }

    // --- domains ----------------------------------------------------------

    /// `virConnectListAllDomains`: names, sorted.
    pub fn list_all_domains(&self) -> Result<Vec<String>> {
        let state = self.call(Op::ListDomains)?;
        let mut names: Vec<String> = state.domains.keys().cloned().collect();
        names.sort_unstable();
        Ok(names)
    }

    /// `virDomainLookupByName` and `virDomainGetInfo`.
    pub fn domain_lookup_by_name(&self, name: &str) -> Result<DomainInfo> {
        let state = self.call(Op::DomainLookup)?;
        let d = state.domains.get(name).ok_or_else(|| Error::no_domain(name))?;
        Ok(DomainInfo {
            name: d.def.name.clone(),
            uuid: d.def.uuid,
            id: d.id,
            state: d.state,
            reason: d.reason,
            persistent: d.persistent,
            autostart: d.autostart,
            memory_kib: d.def.memory_kib,
            vcpus: d.def.vcpus,
            macs: d.def.interfaces.iter().map(|i| i.mac.to_string()).collect(),
        })
    }

    /// `virDomainLookupByUUIDString`: the domain's name.
    pub fn domain_lookup_by_uuid(&self, uuid: &str) -> Result<String> {
        let state = self.call(Op::DomainLookup)?;
        let parsed =
            Uuid::parse(uuid).map_err(|_| Error::new(ErrorCode::InvalidArg, format!("uuid '{uuid}' is malformed")))?;
        state
            .domain_uuids
            .get(&parsed)
            .cloned()
            .ok_or_else(|| Error::new(ErrorCode::NoDomain, format!("no domain with matching uuid '{uuid}'")))
    }

    fn check_new_domain(&self, state: &State, def: &DomainDef) -> Result<Option<String>> {
        if !self.host.capabilities.domain_types.contains(&def.kind) {
            return Err(Error::new(
                ErrorCode::ConfigUnsupported,
                format!("Emulator '{}' does not support virt type '{}'", self.host.capabilities.emulator, def.kind),
            ));
        }
        if let Some(existing) = state.domains.get(&def.name) {
            if existing.def.uuid != def.uuid {
                return Err(Error::new(
                    ErrorCode::OperationFailed,
                    format!("domain '{}' already exists with uuid {}", def.name, existing.def.uuid),
                ));
            }
            return Ok(Some(def.name.clone()));
        }
        if let Some(other) = state.domain_uuids.get(&def.uuid) {
            return Err(Error::new(
                ErrorCode::OperationFailed,
                format!("domain '{other}' is already defined with uuid {}", def.uuid),
            ));
        }
        Ok(None)
    }

    /// `virDomainDefineXML`: a persistent domain (or a new config for an existing one).
    pub fn domain_define_xml(&self, xml: &str) -> Result<String> {
        self.begin(Op::DomainDefine)?;
        let def = DomainDef::parse(xml)?;
        let mut state = self.host.lock();
        if self.check_new_domain(&state, &def)?.is_some() {
            let d = domain_mut(&mut state, &def.name)?;
            d.def = def.clone();
            d.persistent = true;
            self.host.events.emit(&def.name, DomainEventKind::Defined, event_detail::DEFINED_UPDATED);
            return Ok(def.name);
        }
        let name = def.name.clone();
        state.domain_uuids.insert(def.uuid, name.clone());
        state.domains.insert(
            name.clone(),
            Domain {
                def,
                state: DomainState::Shutoff,
                reason: 0,
                id: None,
                persistent: true,
                autostart: false,
                started_at: None,
                resets: 0,
            },
        );
        self.host.events.emit(&name, DomainEventKind::Defined, event_detail::DEFINED_ADDED);
        Ok(name)
    }

    /// Checks what QEMU needs at start: networks exist and run, volume disks exist.
    fn check_resources(state: &State, def: &DomainDef) -> Result<()> {
        for iface in &def.interfaces {
            if let Some(net) = &iface.network {
                let n = state.networks.get(net).ok_or_else(|| Error::no_network(net))?;
                if !n.active {
                    return Err(Error::invalid(format!("network '{net}' is not active")));
                }
            }
        }
        for disk in &def.disks {
            match disk {
                crate::domain::DiskSource::Volume { pool, volume } => {
                    let p = state.pools.get(pool).ok_or_else(|| Error::no_pool(pool))?;
                    if !p.active {
                        return Err(Error::invalid(format!(
                            "storage pool '{pool}' containing volume '{volume}' is not active"
                        )));
                    }
                    if !p.volumes.contains_key(volume) {
                        return Err(Error::no_volume(pool, volume));
                    }
                }
                crate::domain::DiskSource::File(path) => {
                    let in_pool_dir = state.pool_by_dir(path).is_some();
                    let exists = state.volume_by_path(path).is_some();
                    if in_pool_dir && !exists {
                        return Err(Error::with_message(
                            ErrorCode::SystemError,
                            format!("Cannot access storage file '{path}': No such file or directory"),
                        ));
                    }
                }
                crate::domain::DiskSource::Other => {}
            }
        }
        Ok(())
    }

    fn start_locked(&self, state: &mut State, name: &str) -> Result<()> {
        let domain = state.domains.get(name).ok_or_else(|| Error::no_domain(name))?;
        if domain.state.is_active() {
            return Err(Error::invalid("domain is already running"));
        }
        Self::check_resources(state, &domain.def)?;
        let id = state.next_domain_id;
        let now = self.host.now();
        domain_mut(state, name)?.start(id, now)?;
        state.next_domain_id += 1;
        self.host.queue_dhcp(state, name);
        // QEMU starts with its CPUs paused; libvirt reports them resumed (QEMU's RESUME
        // event), then the domain started.
        self.host.events.emit(name, DomainEventKind::Resumed, event_detail::RESUMED_UNPAUSED);
        self.host.events.emit(name, DomainEventKind::Started, event_detail::STARTED_BOOTED);
        Ok(())
    }

    /// `virDomainCreateXML`: a transient domain, started.
    pub fn domain_create_xml(&self, xml: &str) -> Result<String> {
        self.begin(Op::DomainCreateXml)?;
        let def = DomainDef::parse(xml)?;
        let mut state = self.host.lock();
        if self.check_new_domain(&state, &def)?.is_some() {
            return Err(Error::invalid(format!("domain '{}' is already defined", def.name)));
        }
        Self::check_resources(&state, &def)?;
        let name = def.name.clone();
        state.domain_uuids.insert(def.uuid, name.clone());
        state.domains.insert(
            name.clone(),
            Domain {
                def,
                state: DomainState::Shutoff,
                reason: 0,
                id: None,
                persistent: false,
                autostart: false,
                started_at: None,
                resets: 0,
            },
        );
        self.start_locked(&mut state, &name)?;
        Ok(name)
    }

    /// `virDomainCreate`.
    pub fn domain_create(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::DomainCreate)?;
        self.start_locked(&mut state, name)
    }

    fn after_stop(&self, state: &mut State, name: &str) {
        self.host.forget_dhcp(state, name);
        if state.domains.get(name).is_some_and(|d| !d.persistent)
            && let Some(d) = state.domains.remove(name)
        {
            state.domain_uuids.remove(&d.def.uuid);
        }
    }

    /// `virDomainDestroy`: a transient domain disappears.
    pub fn domain_destroy(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::DomainDestroy)?;
        domain_mut(&mut state, name)?.destroy()?;
        // libvirt kills QEMU with SIGTERM first: QEMU reports a host-initiated shutdown,
        // then the process is gone.
        self.host.events.emit(name, DomainEventKind::Shutdown, event_detail::SHUTDOWN_HOST);
        self.host.events.emit(name, DomainEventKind::Stopped, event_detail::STOPPED_DESTROYED);
        self.after_stop(&mut state, name);
        Ok(())
    }

    /// `virDomainReset`: an immediate hardware reset (QEMU's `system_reset`) of an active
    /// domain. Its QEMU process stays: same id, same state (a paused domain stays paused;
    /// a crashed one becomes paused, reason crashed), leases and DHCP requests kept.
    /// libvirt reports it with `VIR_DOMAIN_EVENT_ID_REBOOT` only, no lifecycle event, so
    /// the simulator emits none. [`Host::domain_resets`](crate::Host::domain_resets)
    /// counts the resets.
    pub fn domain_reset(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::DomainReset)?;
        domain_mut(&mut state, name)?.reset()
    }

    /// `virDomainShutdown`: the simulated guest powers off at once.
    pub fn domain_shutdown(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::DomainShutdown)?;
        domain_mut(&mut state, name)?.shutdown()?;
        // QEMU reports the guest's own power-off, then the process ends.
        self.host.events.emit(name, DomainEventKind::Shutdown, event_detail::SHUTDOWN_GUEST);
        self.host.events.emit(name, DomainEventKind::Stopped, event_detail::STOPPED_SHUTDOWN);
        self.after_stop(&mut state, name);
        Ok(())
    }

    /// `virDomainSuspend`.
    pub fn domain_suspend(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::DomainSuspend)?;
        let d = domain_mut(&mut state, name)?;
        let was_running = d.state == DomainState::Running;
        d.suspend()?;
        if was_running {
            self.host.events.emit(name, DomainEventKind::Suspended, event_detail::SUSPENDED_PAUSED);
        }
        Ok(())
    }

    /// `virDomainResume`.
    pub fn domain_resume(&self, name: &str) -> Result<()> {
        let mut state = self.call(Op::DomainResume)?;
        let d = domain_mut(&mut state, name)?;
        let was_paused = d.state == DomainState::Paused;
        d.resume()?;
        if was_paused {
            self.host.events.emit(name, DomainEventKind::Resumed, event_detail::RESUMED_UNPAUSED);
        }
        Ok(())
    }

    /// `virDomainUndefineFlags` (flags from [`undefine_flags`]): a running domain becomes transient.
    pub fn domain_undefine_flags(&self, name: &str, flags: u32) -> Result<()> {
        let mut state = self.call(Op::DomainUndefine)?;
        let d = domain_mut(&mut state, name)?;
        if !d.persistent {
            return Err(Error::invalid("cannot undefine transient domain"));
        }
        if d.def.has_nvram && flags & (undefine_flags::NVRAM | undefine_flags::KEEP_NVRAM) == 0 {
            return Err(Error::invalid("cannot undefine domain with nvram"));
        }
        if d.state.is_active() {
            d.persistent = false;
            d.autostart = false;
        } else {
            let uuid = d.def.uuid;
            state.domains.remove(name);
            state.domain_uuids.remove(&uuid);
        }
        self.host.events.emit(name, DomainEventKind::Undefined, event_detail::UNDEFINED_REMOVED);
        Ok(())
    }

    /// `virDomainGetState`: state and reason.
    pub fn domain_get_state(&self, name: &str) -> Result<(DomainState, i32)> {
        let state = self.call(Op::DomainGetState)?;
        let d = state.domains.get(name).ok_or_else(|| Error::no_domain(name))?;
        Ok((d.state, d.reason))
    }

    /// `virDomainGetXMLDesc` (flags 0).
    pub fn domain_get_xml_desc(&self, name: &str) -> Result<String> {
        let state = self.call(Op::DomainGetXml)?;
        let d = state.domains.get(name).ok_or_else(|| Error::no_domain(name))?;
        Ok(d.def.to_xml(d.id))
    }

    /// `virDomainGetAutostart`.
    pub fn domain_get_autostart(&self, name: &str) -> Result<bool> {
        let state = self.call(Op::DomainGetAutostart)?;
        Ok(state.domains.get(name).ok_or_else(|| Error::no_domain(name))?.autostart)
    }

    /// `virDomainSetAutostart`.
    pub fn domain_set_autostart(&self, name: &str, autostart: bool) -> Result<()> {
        let mut state = self.call(Op::DomainSetAutostart)?;
        let d = domain_mut(&mut state, name)?;
        if !d.persistent {
            return Err(Error::invalid("cannot set autostart for transient domain"));
        }
        d.autostart = autostart;
        Ok(())
    }

    // --- events -----------------------------------------------------------

    /// `virConnectDomainEventRegisterAny(VIR_DOMAIN_EVENT_ID_LIFECYCLE)` for all domains:
    /// `callback` runs on the host's dispatcher thread for every lifecycle event from now
    /// on, until [`domain_event_deregister`](Self::domain_event_deregister) or until this
    /// connection breaks (a dropped connection delivers no more events, as in libvirt).
    /// Returns the callback id.
    pub fn domain_event_register(&self, callback: impl Fn(&DomainEvent) + Send + Sync + 'static) -> Result<u64> {
        self.begin(Op::DomainEventRegister)?;
        let host: Weak<HostInner> = Arc::downgrade(&self.host);
        let epoch = self.epoch;
        let id = self.host.events.subscribe(Arc::new(move |event: &DomainEvent| {
            let alive = host.upgrade().is_some_and(|h| h.epoch.load(Ordering::SeqCst) == epoch);
            if alive {
                callback(event);
            }
        }));
        Ok(id)
    }

    /// `virConnectDomainEventDeregisterAny`: no more calls of that callback once this returns
    /// (one already running may finish). An unknown id is `VIR_ERR_INVALID_ARG`, as in libvirt.
    /// On a broken connection the callback is removed all the same (libvirt frees a closed
    /// connection's callbacks) and the call reports the broken connection.
    pub fn domain_event_deregister(&self, id: u64) -> Result<()> {
        let removed = self.host.events.unsubscribe(id);
        self.begin(Op::DomainEventDeregister)?;
        if removed {
            Ok(())
        } else {
            Err(Error::new(ErrorCode::InvalidArg, format!("could not find event callback {id} for deletion")))
        }
    }
}

/// An upload begun by [`Connection::storage_vol_upload_stream`]: `send` the
/// bytes, then `finish` (or `abort`, which keeps what was written, as libvirt
/// does).
#[derive(Debug)]
pub struct VolumeUploadStream<'c> {
    conn: &'c Connection,
    pool: String,
    name: String,
    offset: u64,
    length: u64,
    sent: u64,
}

impl VolumeUploadStream<'_> {
    /// `virStreamSend`: writes what fits before `length` and says how much
    /// that was; nothing fits once `length` bytes were sent.
    pub fn send(&mut self, bytes: &[u8]) -> Result<usize> {
        if !self.conn.is_alive() {
            return Err(Error::connection_closed());
        }
        let room = if self.length == 0 { bytes.len() as u64 } else { self.length - self.sent };
        if room == 0 && !bytes.is_empty() {
            return Err(Error::with_message(ErrorCode::SystemError, "cannot write to stream: No space left on device"));
        }
        let take = (bytes.len() as u64).min(room) as usize;
        let mut state = self.conn.host.lock();
        Connection::volume(&mut state, &self.pool, &self.name)?.write(self.offset + self.sent, &bytes[..take]);
        self.sent += take as u64;
        Ok(take)
    }

    /// `virStreamFinish`: like libvirtd's file streams, it does not check
    /// that `length` bytes were sent.
    pub fn finish(self) -> Result<()> {
        if !self.conn.is_alive() {
            return Err(Error::connection_closed());
        }
        Ok(())
    }

    /// `virStreamAbort`.
    pub fn abort(self) {}
}
