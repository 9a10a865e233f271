//! A simulated libvirt host: its objects, clock, faults and counters, registered under a URI
//! so that [`connect`](crate::connect) finds it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::capabilities::Capabilities;
use crate::counters::{Counters, Op};
use crate::domain::Domain;
use crate::error::{Error, ErrorCode, Result};
use crate::events::{DomainEventKind, Events, event_detail};
use crate::faults::Faults;
use crate::ids::{Mac, Uuid};
use crate::network::{Lease, Network, NetworkDef};
use crate::storage::{Pool, PoolDef};

/// How long a simulated lease lasts (dnsmasq's default under libvirt: one hour).
pub const LEASE_SECONDS: i64 = 3600;

/// Host behaviour that is not an object: DHCP timing, lease release, the clock.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// How long after a domain starts its guest asks for DHCP.
    pub dhcp_delay: Duration,
    /// Whether a domain's leases disappear when it stops (dnsmasq itself keeps them until expiry).
    pub release_leases_on_stop: bool,
    /// A manual clock only moves with [`Host::advance_clock`]; otherwise real time.
    pub manual_clock: bool,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self { dhcp_delay: Duration::ZERO, release_leases_on_stop: true, manual_clock: false }
    }
}

/// A DHCP request a guest will make once its delay has passed.
#[derive(Debug, Clone)]
pub(crate) struct PendingDhcp {
    pub domain: String,
    pub mac: Mac,
    pub network: String,
    pub due: Duration,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub networks: BTreeMap<String, Network>,
    pub pools: BTreeMap<String, Pool>,
    pub domains: HashMap<String, Domain>,
    pub domain_uuids: HashMap<Uuid, String>,
    pub pending_dhcp: Vec<PendingDhcp>,
    pub next_domain_id: u32,
}

#[derive(Debug)]
pub(crate) struct HostInner {
    pub uri: String,
    pub uuid: Uuid,
    pub config: HostConfig,
    pub capabilities: Capabilities,
    pub state: Mutex<State>,
    pub faults: Faults,
    pub counters: Counters,
    /// Lifecycle event subscribers and their dispatcher.
    pub events: Events,
    /// Bumped when connections are dropped; a connection opened earlier is dead.
    pub epoch: AtomicU64,
    started: Instant,
    manual_offset: Mutex<Duration>,
    wall_base: i64,
}

impl HostInner {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host clock: time since the host was built.
    pub fn now(&self) -> Duration {
        if self.config.manual_clock {
            *self.manual_offset.lock().unwrap_or_else(|e| e.into_inner())
        } else {
            self.started.elapsed()
        }
    }

    /// The host clock as seconds since the epoch (for lease expiry).
    pub fn epoch_seconds(&self) -> i64 {
        self.wall_base + self.now().as_secs() as i64
    }

    /// Hands out the leases whose guests have asked by now.
    pub fn run_dhcp(&self, state: &mut State) {
        if state.pending_dhcp.is_empty() {
            return;
        }
        let now = self.now();
        let expiry = self.epoch_seconds() + LEASE_SECONDS;
        let (due, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut state.pending_dhcp).into_iter().partition(|p| p.due <= now);
        state.pending_dhcp = waiting;
        // Per network: addresses taken (leased or reserved) and a scan cursor, built once per batch.
        let mut scans: HashMap<String, (HashSet<Ipv4Addr>, u32)> = HashMap::new();
        let mut leased: HashMap<String, HashSet<Mac>> = HashMap::new();
        let mut retry = Vec::new();
        for request in due {
            if self.faults.is_silent(&request.domain, request.mac) {
                continue;
            }
            let Some(net) = state.networks.get_mut(&request.network) else {
                continue;
            };
            let macs =
                leased.entry(request.network.clone()).or_insert_with(|| net.leases.iter().map(|l| l.mac).collect());
            if !net.active || !macs.insert(request.mac) {
                continue;
            }
            let Some(ip_def) = net.def.ip.as_ref() else {
                continue;
            };
            let prefix = ip_def.prefix;
            let reserved = net.def.reservation_for(request.mac).cloned();
            let ip = match reserved.as_ref().and_then(|h| h.ip) {
                Some(ip) => Some(ip),
                None => {
                    let (taken, cursor) = scans.entry(request.network.clone()).or_insert_with(|| {
                        let taken = net.leases.iter().map(|l| l.ip).chain(net.def.reserved_ips()).collect();
                        (taken, 0)
                    });
                    let ip = net.def.free_address(taken, cursor);
                    if let Some(ip) = ip {
                        taken.insert(ip);
                    }
                    ip
                }
            };
            let Some(ip) = ip else {
                // The range is full: the guest keeps asking.
                macs.remove(&request.mac);
                retry.push(request);
                continue;
            };
            let hostname = reserved.and_then(|h| h.name).or_else(|| Some(request.domain.clone()));
            net.leases.push(Lease { mac: request.mac, ip, prefix, hostname, expiry_time: expiry });
        }
        state.pending_dhcp.extend(retry);
    }

    /// What happens to a domain's DHCP when it starts: one request per network interface.
    pub fn queue_dhcp(&self, state: &mut State, domain: &str) {
        let Some(d) = state.domains.get(domain) else {
            return;
        };
        let due = self.now() + self.config.dhcp_delay;
        let requests: Vec<PendingDhcp> = d
            .def
            .interfaces
            .iter()
            .filter_map(|i| {
                i.network.clone().map(|network| PendingDhcp { domain: domain.to_string(), mac: i.mac, network, due })
            })
            .collect();
        state.pending_dhcp.extend(requests);
    }

    /// What happens to a domain's DHCP when it stops.
    pub fn forget_dhcp(&self, state: &mut State, domain: &str) {
        state.pending_dhcp.retain(|p| p.domain != domain);
        if !self.config.release_leases_on_stop {
            return;
        }
        let Some(d) = state.domains.get(domain) else {
            return;
        };
        let macs: Vec<Mac> = d.def.interfaces.iter().map(|i| i.mac).collect();
        for net in state.networks.values_mut() {
            net.leases.retain(|l| !macs.contains(&l.mac));
        }
    }
}

impl State {
    /// The pool whose target directory holds `path` directly.
    pub fn pool_by_dir(&self, path: &str) -> Option<&Pool> {
        let (dir, _) = path.rsplit_once('/')?;
        self.pools.values().find(|p| p.def.target_path == dir)
    }

    /// The volume at `path` (volumes live at `<pool target>/<name>`), with its pool.
    pub fn volume_by_path(&self, path: &str) -> Option<(&Pool, &crate::storage::Volume)> {
        let (_, name) = path.rsplit_once('/')?;
        let pool = self.pool_by_dir(path)?;
        pool.volumes.get(name).map(|v| (pool, v))
    }
}

fn registry() -> &'static Mutex<HashMap<String, Host>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Host>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

pub(crate) fn lookup(uri: &str) -> Option<Host> {
    registry().lock().unwrap_or_else(|e| e.into_inner()).get(uri).cloned()
}

/// A simulated libvirt host. Cloning gives another handle to the same host.
#[derive(Debug, Clone)]
pub struct Host {
    pub(crate) inner: Arc<HostInner>,
}

/// Builds a [`Host`]: networks, pools and domains it starts with, capabilities, behaviour.
#[derive(Debug)]
pub struct HostBuilder {
    uri: String,
    config: HostConfig,
    capabilities: Capabilities,
    networks: Vec<(String, bool)>,
    pools: Vec<(String, bool)>,
}

impl HostBuilder {
    /// Adds a persistent network from libvirt network XML, started when `active`.
    pub fn network(mut self, xml: &str, active: bool) -> Self {
        self.networks.push((xml.to_string(), active));
        self
    }

    /// Adds a persistent storage pool from libvirt pool XML, started when `active`.
    pub fn pool(mut self, xml: &str, active: bool) -> Self {
        self.pools.push((xml.to_string(), active));
        self
    }

    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// How long after a domain starts its guest asks for DHCP (default: at once).
    pub fn dhcp_delay(mut self, delay: Duration) -> Self {
        self.config.dhcp_delay = delay;
        self
    }

    /// Whether leases disappear when their domain stops (default: yes).
    pub fn release_leases_on_stop(mut self, release: bool) -> Self {
        self.config.release_leases_on_stop = release;
        self
    }

    /// Use a clock that only [`Host::advance_clock`] moves.
    pub fn manual_clock(mut self) -> Self {
        self.config.manual_clock = true;
        self
    }

    /// Builds the host and registers it under its URI, replacing a host registered there before.
    ///
    /// Fails when a network or pool XML is refused (the error says which).
    pub fn build(self) -> Result<Host> {
        let wall_base = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        let mut state = State { next_domain_id: 1, ..State::default() };
        for (xml, active) in &self.networks {
            let def = NetworkDef::parse(xml)?;
            state.networks.insert(
                def.name.clone(),
                Network { def, active: *active, persistent: true, autostart: false, leases: Vec::new() },
            );
        }
        for (xml, active) in &self.pools {
            let def = PoolDef::parse(xml)?;
            state
                .pools
                .insert(def.name.clone(), Pool { def, active: *active, autostart: false, volumes: BTreeMap::new() });
        }
        let host = Host {
            inner: Arc::new(HostInner {
                uri: self.uri.clone(),
                uuid: Uuid::generate(),
                config: self.config,
                capabilities: self.capabilities,
                state: Mutex::new(state),
                faults: Faults::default(),
                counters: Counters::default(),
                events: Events::default(),
                epoch: AtomicU64::new(0),
                started: Instant::now(),
                manual_offset: Mutex::new(Duration::ZERO),
                wall_base,
            }),
        };
        registry().lock().unwrap_or_else(|e| e.into_inner()).insert(self.uri, host.clone());
        Ok(host)
    }
}

impl Host {
    /// Starts building a host reachable at `uri` (any string; `sim:///name` by convention).
    pub fn builder(uri: impl Into<String>) -> HostBuilder {
        HostBuilder {
            uri: uri.into(),
            config: HostConfig::default(),
            capabilities: Capabilities::default(),
            networks: Vec::new(),
            pools: Vec::new(),
        }
    }

    pub fn uri(&self) -> &str {
        &self.inner.uri
    }

    /// Removes the host from the registry: new `connect` calls fail, open connections die.
    pub fn unregister(&self) {
        registry().lock().unwrap_or_else(|e| e.into_inner()).remove(&self.inner.uri);
        self.drop_connections();
    }

    /// Registers the host under its URI again after [`Host::unregister`]: new
    /// `connect` calls reach it, with everything it held.
    pub fn register(&self) {
        registry().lock().unwrap_or_else(|e| e.into_inner()).insert(self.inner.uri.clone(), self.clone());
    }

    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    /// Makes the `n`th call of `op` from now (1 = the next one) fail with `error`.
    pub fn fail_nth(&self, op: Op, n: u64, error: Error) {
        let at = self.inner.counters.calls(op) + n.max(1);
        self.inner.faults.fail_at(op, at, error);
    }

    /// Every open connection breaks: its calls fail like a closed libvirt socket.
    pub fn drop_connections(&self) {
        self.inner.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Restarts the daemon: connections drop; persistent and active objects, running
    /// domains (their QEMU processes outlive libvirtd) and leases survive, as with libvirtd.
    pub fn restart_daemon(&self) {
        self.drop_connections();
    }

    /// Reboots the machine: connections drop, every domain stops (transient ones vanish),
    /// transient networks vanish, leases go; then autostart networks, pools and domains start.
    pub fn reboot(&self) {
        self.drop_connections();
        let inner = &self.inner;
        let mut state = inner.lock();
        state.pending_dhcp.clear();
        state.domains.retain(|_, d| d.persistent);
        let uuids: HashMap<Uuid, String> = state.domains.values().map(|d| (d.def.uuid, d.def.name.clone())).collect();
        state.domain_uuids = uuids;
        for d in state.domains.values_mut() {
            d.stop(0);
        }
        state.networks.retain(|_, n| n.persistent);
        for n in state.networks.values_mut() {
            n.leases.clear();
            n.active = n.autostart;
        }
        for p in state.pools.values_mut() {
            p.active = p.autostart;
        }
        let autostart: Vec<String> =
            state.domains.values().filter(|d| d.autostart).map(|d| d.def.name.clone()).collect();
        for name in autostart {
            let id = state.next_domain_id;
            state.next_domain_id += 1;
            let now = inner.now();
            if let Some(d) = state.domains.get_mut(&name)
                && d.start(id, now).is_ok()
            {
                inner.queue_dhcp(&mut state, &name);
            }
        }
    }

    /// The guest of a running domain crashes (state crashed, reason panicked).
    pub fn crash_domain(&self, name: &str) -> Result<()> {
        let mut state = self.inner.lock();
        let d = state.domains.get_mut(name).ok_or_else(|| Error::no_domain(name))?;
        if d.state != crate::DomainState::Running {
            return Err(Error::invalid("domain is not running"));
        }
        d.state = crate::DomainState::Crashed;
        d.reason = 1;
        self.inner.events.emit(name, DomainEventKind::Crashed, event_detail::CRASHED_PANICKED);
        Ok(())
    }

    /// Moves a manual clock forward (see [`HostBuilder::manual_clock`]).
    pub fn advance_clock(&self, by: Duration) {
        assert!(self.inner.config.manual_clock, "advance_clock needs a host built with HostBuilder::manual_clock()");
        *self.inner.manual_offset.lock().unwrap_or_else(|e| e.into_inner()) += by;
    }

    /// How many domains the host holds (any state).
    pub fn domain_count(&self) -> usize {
        self.inner.lock().domains.len()
    }

    /// How many times the domain `name` was reset
    /// ([`Connection::domain_reset`](crate::Connection::domain_reset)) since it was defined:
    /// how a test sees that a guest was rebooted in place, which no libvirt call tells. Not
    /// a libvirt call: not counted, no faults.
    pub fn domain_resets(&self, name: &str) -> Result<u64> {
        let state = self.inner.lock();
        Ok(state.domains.get(name).ok_or_else(|| Error::no_domain(name))?.resets)
    }
}

/// The error `connect` gives for a URI no host is registered under.
pub(crate) fn no_host(uri: &str) -> Error {
    Error::with_message(ErrorCode::NoConnect, format!("no connection driver available for {uri}"))
}
