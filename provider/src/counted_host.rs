//! Counting what the manager asks of its hosts: a [`Connector`] that wraps
//! every connection it opens so that each libvirt call (and each connection)
//! is counted in the manager's metrics (`capl_libvirt_calls_total{call}`,
//! `capl_libvirt_connections_opened_total`). The benchmarks and an operator
//! read them to see what a machine costs its host.

use std::sync::Arc;

use capl_host::hypervisor::Connector;
use capl_host::hypervisor::{
    DhcpLease, DomainEventCallback, DomainState, EventSubscription, Hypervisor, NetworkUpdateCommand, NodeMemory,
    Result, UndefineFlags,
};

use crate::controller::metrics::Metrics;

/// Wraps `inner`: the connections it opens count their calls in `metrics`.
pub struct CountingConnector {
    inner: Arc<dyn Connector>,
    metrics: Metrics,
}

impl CountingConnector {
    pub fn new(inner: Arc<dyn Connector>, metrics: Metrics) -> Self {
        Self { inner, metrics }
    }
}

impl Connector for CountingConnector {
    fn connect(&self, uri: &str) -> Result<Arc<dyn Hypervisor>> {
        let inner = self.inner.connect(uri)?;
        self.metrics.connection_opened();
        Ok(Arc::new(Counted { inner, metrics: self.metrics.clone() }))
    }
}

/// One connection whose calls are counted. `is_alive` (no round trip, made
/// before every call) and `uri` are not calls and are not counted.
struct Counted {
    inner: Arc<dyn Hypervisor>,
    metrics: Metrics,
}

impl Counted {
    fn count(&self, call: &'static str) -> &dyn Hypervisor {
        self.metrics.libvirt_call(call);
        self.inner.as_ref()
    }
}

impl Hypervisor for Counted {
    fn uri(&self) -> &str {
        self.inner.uri()
    }
    fn capabilities_xml(&self) -> Result<String> {
        self.count("capabilities").capabilities_xml()
    }
    fn is_alive(&self) -> bool {
        self.inner.is_alive()
    }
    fn node_memory(&self) -> Result<NodeMemory> {
        self.count("node_memory").node_memory()
    }
    fn network_xml(&self, name: &str) -> Result<String> {
        self.count("network_xml").network_xml(name)
    }
    fn network_is_active(&self, name: &str) -> Result<bool> {
        self.count("network_is_active").network_is_active(name)
    }
    fn network_update_dhcp_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()> {
        self.count("network_update").network_update_dhcp_host(network, command, host_xml)
    }
    fn network_update_dns_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()> {
        self.count("network_update").network_update_dns_host(network, command, host_xml)
    }
    fn network_dhcp_leases(&self, network: &str) -> Result<Vec<DhcpLease>> {
        self.count("network_dhcp_leases").network_dhcp_leases(network)
    }
    fn interface_xml(&self, name: &str) -> Result<String> {
        self.count("interface_xml").interface_xml(name)
    }
    fn pool_is_active(&self, name: &str) -> Result<bool> {
        self.count("pool_is_active").pool_is_active(name)
    }
    fn pool_xml(&self, name: &str) -> Result<String> {
        self.count("pool_xml").pool_xml(name)
    }
    fn volume_xml(&self, pool: &str, name: &str) -> Result<String> {
        self.count("volume_xml").volume_xml(pool, name)
    }
    fn volume_create(&self, pool: &str, xml: &str) -> Result<String> {
        self.count("volume_create").volume_create(pool, xml)
    }
    fn volume_upload(&self, pool: &str, name: &str, bytes: &[u8]) -> Result<()> {
        self.count("volume_upload").volume_upload(pool, name, bytes)
    }

    fn volumes_backed_by(&self, path: &str) -> Result<Vec<String>> {
        self.count("volumes_backed_by").volumes_backed_by(path)
    }

    fn volume_upload_from(&self, pool: &str, name: &str, length: u64, source: &mut dyn std::io::Read) -> Result<()> {
        self.count("volume_upload_from").volume_upload_from(pool, name, length, source)
    }
    fn volume_download(&self, pool: &str, name: &str) -> Result<Vec<u8>> {
        self.count("volume_download").volume_download(pool, name)
    }
    fn volume_delete(&self, pool: &str, name: &str) -> Result<()> {
        self.count("volume_delete").volume_delete(pool, name)
    }
    fn domain_define(&self, xml: &str) -> Result<String> {
        self.count("domain_define").domain_define(xml)
    }
    fn domain_list(&self) -> Result<Vec<String>> {
        self.count("domain_list").domain_list()
    }
    fn domain_xml(&self, name: &str) -> Result<String> {
        self.count("domain_xml").domain_xml(name)
    }
    fn domain_state(&self, name: &str) -> Result<DomainState> {
        self.count("domain_state").domain_state(name)
    }
    fn domain_start(&self, name: &str) -> Result<()> {
        self.count("domain_start").domain_start(name)
    }
    fn domain_destroy(&self, name: &str) -> Result<()> {
        self.count("domain_destroy").domain_destroy(name)
    }
    fn domain_undefine(&self, name: &str, flags: UndefineFlags) -> Result<()> {
        self.count("domain_undefine").domain_undefine(name, flags)
    }
    fn domain_autostart(&self, name: &str) -> Result<bool> {
        self.count("domain_autostart").domain_autostart(name)
    }
    fn domain_set_autostart(&self, name: &str, autostart: bool) -> Result<()> {
        self.count("domain_set_autostart").domain_set_autostart(name, autostart)
    }
    fn subscribe_domain_events(&self, callback: DomainEventCallback) -> Result<EventSubscription> {
        self.count("subscribe_domain_events").subscribe_domain_events(callback)
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use super::*;

    #[test]
    fn calls_and_connections_are_counted() {
        let uri = "test:///counted-host";
        let _host = capl_host::sim_host::register(uri).expect("sim host");
        let metrics = Metrics::default();
        let connector = CountingConnector::new(Arc::new(capl_host::hypervisor::sim::SimConnector), metrics.clone());
        let conn = connector.connect(uri).expect("connect");
        assert!(conn.network_is_active(capl_host::sim_host::NETWORK).expect("call"));
        conn.pool_is_active(capl_host::sim_host::BASE_POOL).expect("call");
        conn.pool_is_active(capl_host::sim_host::DOMAIN_POOL).expect("call");
        assert!(conn.is_alive());
        let text = metrics.encode();
        assert!(text.contains("capl_libvirt_calls_total{call=\"network_is_active\"} 1"), "{text}");
        assert!(text.contains("capl_libvirt_calls_total{call=\"pool_is_active\"} 2"), "{text}");
        assert!(text.contains("capl_libvirt_connections_opened_total 1"), "{text}");
    }
}
