//! [`Hypervisor`] over the `libvirt-sim` crate: the simulated hosts that the
//! fast tests, the scale benchmarks and downstream users' tests run on.
//!
//! A [`SimHypervisor`] wraps one `libvirt_sim::Connection` and behaves like
//! [`super::libvirt::LibvirtHypervisor`] does on a real host: the same calls,
//! the same network-update flags, the same error classes and codes
//! (`libvirt_sim::Error` carries libvirt's `virErrorNumber`). A broken
//! simulated connection reports `VIR_ERR_INTERNAL_ERROR` "client socket is
//! closed" like libvirt's remote driver, and is classified
//! [`super::ErrorKind::ConnectionLost`] so the connection cache reconnects.

use std::sync::Arc;

use libvirt_sim::{Connection, UpdateCommand, UpdateSection, update_flags};

use super::Connector;
use super::{
    DhcpLease, DomainEvent, DomainEventCallback, DomainEventKind, DomainState, ErrorKind, EventSubscription, HostAdmin,
    Hypervisor, HypervisorError, NetworkUpdateCommand, NodeMemory, Result, UndefineFlags, kind_of,
};

/// A connection to a simulated host registered with `libvirt_sim::Host::builder(uri)`.
#[derive(Debug)]
pub struct SimHypervisor {
    conn: Arc<Connection>,
}

impl SimHypervisor {
    /// `virConnectOpen(uri)` on the simulator: fails with `VIR_ERR_NO_CONNECT`
    /// when no simulated host is registered under `uri`.
    pub fn connect(uri: &str) -> Result<Self> {
        let conn = libvirt_sim::connect(uri).map_err(|e| {
            let mut err = from_sim(e, true);
            err.message = format!(
                "cannot open simulated libvirt connection to {uri}: {} (build the host with libvirt_sim::Host::builder(\"{uri}\") first)",
                err.message
            );
            err
        })?;
        Ok(Self { conn: Arc::new(conn) })
    }

    /// The underlying simulator connection, for calls the trait does not cover.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    fn err(&self, e: libvirt_sim::Error) -> HypervisorError {
        from_sim(e, self.conn.is_alive())
    }
}

/// Converts a simulator error with the shared table; `alive` tells whether
/// the connection still works (an internal error on a dead connection is a
/// lost connection, as in libvirt's remote driver).
pub fn from_sim(e: libvirt_sim::Error, alive: bool) -> HypervisorError {
    HypervisorError::new(kind_of(e.number(), !alive), e.number(), e.message())
}

/// [`Connector`] for the connection cache: opens [`SimHypervisor`]s.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimConnector;

impl Connector for SimConnector {
    fn connect(&self, uri: &str) -> Result<Arc<dyn Hypervisor>> {
        Ok(Arc::new(SimHypervisor::connect(uri)?))
    }
}

fn state_of(s: libvirt_sim::DomainState) -> DomainState {
    use libvirt_sim::DomainState as S;
    match s {
        S::NoState => DomainState::NoState,
        S::Running => DomainState::Running,
        S::Blocked => DomainState::Blocked,
        S::Paused => DomainState::Paused,
        S::Shutdown => DomainState::Shutdown,
        S::Shutoff => DomainState::Shutoff,
        S::Crashed => DomainState::Crashed,
        S::PmSuspended => DomainState::PmSuspended,
    }
}

impl Hypervisor for SimHypervisor {
    fn domain_list(&self) -> Result<Vec<String>> {
        self.conn.list_all_domains().map_err(|e| self.err(e))
    }

    fn uri(&self) -> &str {
        self.conn.uri()
    }

    fn capabilities_xml(&self) -> Result<String> {
        self.conn.get_capabilities().map_err(|e| self.err(e))
    }

    fn domain_capabilities_xml(&self, arch: &str, machine: Option<&str>, virttype: &str) -> Result<String> {
        self.conn.get_domain_capabilities(None, Some(arch), machine, Some(virttype)).map_err(|e| self.err(e))
    }

    fn node_memory(&self) -> Result<NodeMemory> {
        let total = self.conn.node_get_info().map_err(|e| self.err(e))?.memory_kib * 1024;
        let free = self.conn.node_get_free_memory().map_err(|e| self.err(e))?;
        let mut committed = 0;
        for name in self.conn.list_all_domains().map_err(|e| self.err(e))? {
            match self.conn.domain_lookup_by_name(&name).map_err(|e| self.err(e)) {
                Ok(info) => committed += info.memory_kib * 1024,
                Err(e) if e.kind == ErrorKind::NoDomain => {}
                Err(e) => return Err(e),
            }
        }
        Ok(NodeMemory { total, free, committed })
    }

    fn is_alive(&self) -> bool {
        self.conn.is_alive()
    }

    fn network_xml(&self, name: &str) -> Result<String> {
        self.conn.network_get_xml_desc(name).map_err(|e| self.err(e))
    }

    fn network_is_active(&self, name: &str) -> Result<bool> {
        self.conn.network_is_active(name).map_err(|e| self.err(e))
    }

    fn network_update_dhcp_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()> {
        self.network_update(network, command, UpdateSection::IpDhcpHost, host_xml)
    }

    fn network_update_dns_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()> {
        self.network_update(network, command, UpdateSection::DnsHost, host_xml)
    }

    fn network_dhcp_leases(&self, network: &str) -> Result<Vec<DhcpLease>> {
        let leases = self.conn.network_get_dhcp_leases(network, None).map_err(|e| self.err(e))?;
        Ok(leases
            .into_iter()
            .map(|l| DhcpLease {
                mac: l.mac.to_string(),
                ip: l.ip.to_string(),
                prefix: u32::from(l.prefix),
                hostname: l.hostname,
                expiry_time: l.expiry_time,
            })
            .collect())
    }

    fn interface_xml(&self, name: &str) -> Result<String> {
        self.conn.interface_lookup_by_name(name).map_err(|e| self.err(e))
    }

    fn pool_is_active(&self, name: &str) -> Result<bool> {
        self.conn.storage_pool_is_active(name).map_err(|e| self.err(e))
    }

    fn pool_xml(&self, name: &str) -> Result<String> {
        self.conn.storage_pool_get_xml_desc(name).map_err(|e| self.err(e))
    }

    fn volume_xml(&self, pool: &str, name: &str) -> Result<String> {
        self.conn.storage_vol_get_xml_desc(pool, name).map_err(|e| self.err(e))
    }

    fn volume_create(&self, pool: &str, xml: &str) -> Result<String> {
        self.conn.storage_vol_create_xml(pool, xml).map_err(|e| self.err(e))
    }

    fn volume_upload(&self, pool: &str, name: &str, bytes: &[u8]) -> Result<()> {
        self.conn.storage_vol_upload(pool, name, 0, bytes).map_err(|e| self.err(e))
    }

    fn volume_upload_from(&self, pool: &str, name: &str, length: u64, source: &mut dyn std::io::Read) -> Result<()> {
        let mut stream = self.conn.storage_vol_upload_stream(pool, name, 0, length).map_err(|e| self.err(e))?;
        let mut send = |chunk: &[u8], _offset: u64| -> Result<()> {
            let mut sent = 0;
            while sent < chunk.len() {
                sent += stream.send(&chunk[sent..]).map_err(|e| self.err(e))?;
            }
            Ok(())
        };
        match super::stream_source(pool, name, length, source, &mut send) {
            Ok(()) => stream.finish().map_err(|e| self.err(e)),
            Err(e) => {
                stream.abort();
                Err(e)
            }
        }
    }

    fn volume_download(&self, pool: &str, name: &str) -> Result<Vec<u8>> {
        self.conn.storage_vol_download(pool, name, 0, 0).map_err(|e| self.err(e))
    }

    fn volumes_backed_by(&self, path: &str) -> Result<Vec<String>> {
        super::volumes_backed_by(self, path)
    }

    fn volume_delete(&self, pool: &str, name: &str) -> Result<()> {
        self.conn.storage_vol_delete(pool, name).map_err(|e| self.err(e))
    }

    fn domain_define(&self, xml: &str) -> Result<String> {
        self.conn.domain_define_xml(xml).map_err(|e| self.err(e))
    }

    fn domain_xml(&self, name: &str) -> Result<String> {
        self.conn.domain_get_xml_desc(name).map_err(|e| self.err(e))
    }

    fn domain_state(&self, name: &str) -> Result<DomainState> {
        let (state, _reason) = self.conn.domain_get_state(name).map_err(|e| self.err(e))?;
        Ok(state_of(state))
    }

    fn domain_start(&self, name: &str) -> Result<()> {
        self.conn.domain_create(name).map_err(|e| self.err(e))
    }

    fn domain_destroy(&self, name: &str) -> Result<()> {
        self.conn.domain_destroy(name).map_err(|e| self.err(e))
    }

    fn domain_reset(&self, name: &str) -> Result<()> {
        self.conn.domain_reset(name).map_err(|e| self.err(e))
    }

    fn domain_undefine(&self, name: &str, flags: UndefineFlags) -> Result<()> {
        use libvirt_sim::undefine_flags as f;
        let mut raw = 0;
        if flags.managed_save {
            raw |= f::MANAGED_SAVE;
        }
        if flags.snapshots_metadata {
            raw |= f::SNAPSHOTS_METADATA;
        }
        if flags.nvram {
            raw |= f::NVRAM;
        }
        self.conn.domain_undefine_flags(name, raw).map_err(|e| self.err(e))
    }

    fn domain_autostart(&self, name: &str) -> Result<bool> {
        self.conn.domain_get_autostart(name).map_err(|e| self.err(e))
    }

    fn domain_set_autostart(&self, name: &str, autostart: bool) -> Result<()> {
        self.conn.domain_set_autostart(name, autostart).map_err(|e| self.err(e))
    }

    fn subscribe_domain_events(&self, callback: DomainEventCallback) -> Result<EventSubscription> {
        let id = self
            .conn
            .domain_event_register(move |e: &libvirt_sim::DomainEvent| {
                callback(DomainEvent { domain: e.domain.clone(), kind: event_kind_of(e.kind), detail: e.detail });
            })
            .map_err(|e| self.err(e))?;
        let conn = Arc::clone(&self.conn);
        Ok(EventSubscription::new(move || {
            // Fails only on a broken connection, which has dropped the callback already.
            let _ = conn.domain_event_deregister(id);
        }))
    }
}

fn event_kind_of(k: libvirt_sim::DomainEventKind) -> DomainEventKind {
    use libvirt_sim::DomainEventKind as K;
    match k {
        K::Defined => DomainEventKind::Defined,
        K::Undefined => DomainEventKind::Undefined,
        K::Started => DomainEventKind::Started,
        K::Suspended => DomainEventKind::Suspended,
        K::Resumed => DomainEventKind::Resumed,
        K::Stopped => DomainEventKind::Stopped,
        K::Shutdown => DomainEventKind::Shutdown,
        K::PmSuspended => DomainEventKind::PmSuspended,
        K::Crashed => DomainEventKind::Crashed,
    }
}

impl HostAdmin for SimHypervisor {
    fn network_list(&self) -> Result<Vec<String>> {
        self.conn.list_all_networks().map_err(|e| self.err(e))
    }

    fn network_define(&self, xml: &str) -> Result<String> {
        self.conn.network_define_xml(xml).map_err(|e| self.err(e))
    }

    fn network_start(&self, name: &str) -> Result<()> {
        self.conn.network_create(name).map_err(|e| self.err(e))
    }

    fn network_stop(&self, name: &str) -> Result<()> {
        self.conn.network_destroy(name).map_err(|e| self.err(e))
    }

    fn network_undefine(&self, name: &str) -> Result<()> {
        self.conn.network_undefine(name).map_err(|e| self.err(e))
    }

    fn pool_list(&self) -> Result<Vec<String>> {
        self.conn.list_all_storage_pools().map_err(|e| self.err(e))
    }

    fn pool_define(&self, xml: &str) -> Result<String> {
        self.conn.storage_pool_define_xml(xml).map_err(|e| self.err(e))
    }

    fn pool_build(&self, name: &str) -> Result<()> {
        self.conn.storage_pool_build(name).map_err(|e| self.err(e))
    }

    fn pool_start(&self, name: &str) -> Result<()> {
        self.conn.storage_pool_create(name).map_err(|e| self.err(e))
    }

    fn pool_stop(&self, name: &str) -> Result<()> {
        self.conn.storage_pool_destroy(name).map_err(|e| self.err(e))
    }

    fn pool_undefine(&self, name: &str) -> Result<()> {
        self.conn.storage_pool_undefine(name).map_err(|e| self.err(e))
    }

    fn pool_refresh(&self, name: &str) -> Result<()> {
        self.conn.storage_pool_refresh(name).map_err(|e| self.err(e))
    }

    fn volume_list(&self, pool: &str) -> Result<Vec<String>> {
        self.conn.storage_pool_list_all_volumes(pool).map_err(|e| self.err(e))
    }

    fn domain_shutdown(&self, name: &str) -> Result<()> {
        self.conn.domain_shutdown(name).map_err(|e| self.err(e))
    }

    fn domain_suspend(&self, name: &str) -> Result<()> {
        self.conn.domain_suspend(name).map_err(|e| self.err(e))
    }
}

impl SimHypervisor {
    /// `virNetworkUpdate` of `section` with the same flags as the libvirt implementation:
    /// live when the network runs, config when it is persistent.
    fn network_update(
        &self,
        network: &str,
        command: NetworkUpdateCommand,
        section: UpdateSection,
        host_xml: &str,
    ) -> Result<()> {
        let info = self.conn.network_lookup_by_name(network).map_err(|e| self.err(e))?;
        let mut flags = update_flags::AFFECT_CURRENT;
        if info.active {
            flags |= update_flags::AFFECT_LIVE;
        }
        if info.persistent {
            flags |= update_flags::AFFECT_CONFIG;
        }
        let command = match command {
            NetworkUpdateCommand::Modify => UpdateCommand::Modify,
            NetworkUpdateCommand::Delete => UpdateCommand::Delete,
            NetworkUpdateCommand::AddLast => UpdateCommand::AddLast,
            NetworkUpdateCommand::AddFirst => UpdateCommand::AddFirst,
        };
        self.conn.network_update(network, command, section, -1, host_xml, flags).map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hypervisor::ErrorKind;

    #[test]
    fn a_dropped_connection_is_connection_lost_and_a_reconnect_works() {
        let uri = "sim:///capl-sim-adapter-unit";
        let host = libvirt_sim::Host::builder(uri).build().unwrap();
        let hv = SimHypervisor::connect(uri).unwrap();
        assert!(hv.network_list().unwrap().is_empty());
        host.drop_connections();
        assert!(!hv.is_alive());
        let err = hv.network_list().unwrap_err();
        assert_eq!(err.kind, ErrorKind::ConnectionLost, "{err}");
        let again = SimConnector.connect(uri).unwrap();
        assert!(again.capabilities_xml().is_ok());
        assert_eq!(host.counters().connections_opened(), 2);
        host.unregister();
    }

    const DOMAIN: &str = "<domain type='qemu'><name>ev</name><memory unit='MiB'>32</memory><devices/></domain>";

    fn next(rx: &std::sync::mpsc::Receiver<DomainEvent>) -> (DomainEventKind, i32) {
        let e = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("an event within 10 s");
        assert_eq!(e.domain, "ev");
        (e.kind, e.detail)
    }

    #[test]
    fn lifecycle_events_follow_the_transitions_until_the_subscription_is_dropped() {
        use DomainEventKind as K;
        let uri = "sim:///capl-sim-adapter-events";
        let host = libvirt_sim::Host::builder(uri).build().unwrap();
        let hv = SimHypervisor::connect(uri).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let sub = hv.subscribe_domain_events(Box::new(move |e| tx.send(e).unwrap())).unwrap();
        hv.domain_define(DOMAIN).unwrap();
        assert_eq!(next(&rx), (K::Defined, 0));
        hv.domain_start("ev").unwrap();
        assert_eq!(next(&rx), (K::Resumed, 0), "QEMU's CPUs resumed at start");
        assert_eq!(next(&rx), (K::Started, 0));
        hv.connection().domain_suspend("ev").unwrap();
        assert_eq!(next(&rx), (K::Suspended, 0));
        hv.connection().domain_resume("ev").unwrap();
        assert_eq!(next(&rx), (K::Resumed, 0));
        hv.connection().domain_shutdown("ev").unwrap();
        assert_eq!(next(&rx), (K::Shutdown, 1), "VIR_DOMAIN_EVENT_SHUTDOWN_GUEST");
        assert_eq!(next(&rx), (K::Stopped, 0), "VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN");
        hv.domain_start("ev").unwrap();
        assert_eq!(next(&rx), (K::Resumed, 0));
        assert_eq!(next(&rx), (K::Started, 0));
        host.crash_domain("ev").unwrap();
        assert_eq!(next(&rx), (K::Crashed, 0));
        hv.domain_destroy("ev").unwrap();
        assert_eq!(next(&rx), (K::Shutdown, 2), "VIR_DOMAIN_EVENT_SHUTDOWN_HOST");
        assert_eq!(next(&rx), (K::Stopped, 1), "VIR_DOMAIN_EVENT_STOPPED_DESTROYED");
        drop(sub);
        hv.domain_undefine("ev", UndefineFlags::default()).unwrap();
        assert!(rx.recv_timeout(std::time::Duration::from_millis(300)).is_err(), "an event after the drop");
        assert_eq!(host.counters().calls(libvirt_sim::Op::DomainEventDeregister), 1);
        host.unregister();
    }

    #[test]
    fn a_dropped_connection_delivers_no_more_events() {
        let uri = "sim:///capl-sim-adapter-events-dropped";
        let host = libvirt_sim::Host::builder(uri).build().unwrap();
        let hv = SimHypervisor::connect(uri).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let _sub = hv.subscribe_domain_events(Box::new(move |e| tx.send(e).unwrap())).unwrap();
        host.drop_connections();
        let again = SimHypervisor::connect(uri).unwrap();
        again.domain_define(DOMAIN).unwrap();
        assert!(rx.recv_timeout(std::time::Duration::from_millis(300)).is_err(), "an event on a dropped connection");
        host.unregister();
    }

    #[test]
    fn connecting_to_an_unknown_uri_names_the_fix() {
        let err = SimHypervisor::connect("sim:///nobody-built-this").unwrap_err();
        assert_eq!(err.code, 5);
        assert!(err.message.contains("Host::builder"), "{}", err.message);
    }
}
