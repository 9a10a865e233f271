//! Watching each libvirt call a connection makes: [`Observed`] wraps a
//! [`Hypervisor`] and tells an [`RpcObserver`] when each of its calls begins
//! and (by dropping the guard it returned) when the call ends. The manager's
//! metrics count calls this way, and the connection cache sees from it
//! whether a host whose call slots are all taken still answers.

use std::ops::Deref;

use super::{DhcpLease, DomainEventCallback, DomainState, EventSubscription, Hypervisor, NetworkUpdateCommand};
use super::{NodeMemory, Result, UndefineFlags};

/// One call of the [`Hypervisor`] trait as an observer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rpc {
    /// Its name in metrics and in the book's cost table: `domain_xml`,
    /// `network_update` (for both the DHCP and the DNS section), ...
    pub name: &'static str,
    /// Whether it may take seconds on a healthy host: it starts or stops a
    /// guest, makes, copies or removes a volume's data, or walks every
    /// domain or volume of the host.
    pub lengthy: bool,
}

impl Rpc {
    const fn quick(name: &'static str) -> Self {
        Self { name, lengthy: false }
    }

    const fn lengthy(name: &'static str) -> Self {
        Self { name, lengthy: true }
    }
}

/// Told of each call an [`Observed`] connection makes.
pub trait RpcObserver: Send + Sync {
    /// Held for as long as the call runs; dropped when it returns.
    type Guard;

    /// `rpc` is about to be sent.
    fn begin(&self, rpc: Rpc) -> Self::Guard;
}

/// A connection whose calls `observer` is told of. `uri` and `is_alive` (no
/// round trip, asked before every call) are not calls and are not observed.
pub struct Observed<H, O> {
    pub inner: H,
    pub observer: O,
}

impl<H, O> Observed<H, O>
where
    H: Deref<Target = dyn Hypervisor> + Send + Sync,
    O: RpcObserver,
{
    pub fn new(inner: H, observer: O) -> Self {
        Self { inner, observer }
    }

    fn run<T>(&self, rpc: Rpc, call: impl FnOnce(&dyn Hypervisor) -> T) -> T {
        let _guard = self.observer.begin(rpc);
        call(&*self.inner)
    }
}

impl<H, O> Hypervisor for Observed<H, O>
where
    H: Deref<Target = dyn Hypervisor> + Send + Sync,
    O: RpcObserver,
{
    fn uri(&self) -> &str {
        self.inner.uri()
    }
    fn capabilities_xml(&self) -> Result<String> {
        self.run(Rpc::quick("capabilities"), |h| h.capabilities_xml())
    }
    fn domain_capabilities_xml(&self, arch: &str, machine: Option<&str>, virttype: &str) -> Result<String> {
        // Lengthy: libvirt may probe the emulator for it.
        self.run(Rpc::lengthy("domain_capabilities"), |h| h.domain_capabilities_xml(arch, machine, virttype))
    }
    fn is_alive(&self) -> bool {
        self.inner.is_alive()
    }
    fn node_memory(&self) -> Result<NodeMemory> {
        self.run(Rpc::lengthy("node_memory"), |h| h.node_memory())
    }
    fn network_xml(&self, name: &str) -> Result<String> {
        self.run(Rpc::quick("network_xml"), |h| h.network_xml(name))
    }
    fn network_is_active(&self, name: &str) -> Result<bool> {
        self.run(Rpc::quick("network_is_active"), |h| h.network_is_active(name))
    }
    fn network_update_dhcp_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()> {
        self.run(Rpc::quick("network_update"), |h| h.network_update_dhcp_host(network, command, host_xml))
    }
    fn network_update_dns_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()> {
        self.run(Rpc::quick("network_update"), |h| h.network_update_dns_host(network, command, host_xml))
    }
    fn network_dhcp_leases(&self, network: &str) -> Result<Vec<DhcpLease>> {
        self.run(Rpc::quick("network_dhcp_leases"), |h| h.network_dhcp_leases(network))
    }
    fn interface_xml(&self, name: &str) -> Result<String> {
        self.run(Rpc::quick("interface_xml"), |h| h.interface_xml(name))
    }
    fn pool_is_active(&self, name: &str) -> Result<bool> {
        self.run(Rpc::quick("pool_is_active"), |h| h.pool_is_active(name))
    }
    fn pool_xml(&self, name: &str) -> Result<String> {
        self.run(Rpc::quick("pool_xml"), |h| h.pool_xml(name))
    }
    fn volume_xml(&self, pool: &str, name: &str) -> Result<String> {
        self.run(Rpc::quick("volume_xml"), |h| h.volume_xml(pool, name))
    }
    fn volume_create(&self, pool: &str, xml: &str) -> Result<String> {
        self.run(Rpc::lengthy("volume_create"), |h| h.volume_create(pool, xml))
    }
    fn volume_upload(&self, pool: &str, name: &str, bytes: &[u8]) -> Result<()> {
        self.run(Rpc::lengthy("volume_upload"), |h| h.volume_upload(pool, name, bytes))
    }
    fn volume_upload_from(&self, pool: &str, name: &str, length: u64, source: &mut dyn std::io::Read) -> Result<()> {
        self.run(Rpc::lengthy("volume_upload_from"), |h| h.volume_upload_from(pool, name, length, source))
    }
    fn volume_download(&self, pool: &str, name: &str) -> Result<Vec<u8>> {
        self.run(Rpc::lengthy("volume_download"), |h| h.volume_download(pool, name))
    }
    fn volume_delete(&self, pool: &str, name: &str) -> Result<()> {
        self.run(Rpc::lengthy("volume_delete"), |h| h.volume_delete(pool, name))
    }
    fn volumes_backed_by(&self, path: &str) -> Result<Vec<String>> {
        self.run(Rpc::lengthy("volumes_backed_by"), |h| h.volumes_backed_by(path))
    }
    fn domain_list(&self) -> Result<Vec<String>> {
        self.run(Rpc::lengthy("domain_list"), |h| h.domain_list())
    }
    fn domain_define(&self, xml: &str) -> Result<String> {
        self.run(Rpc::quick("domain_define"), |h| h.domain_define(xml))
    }
    fn domain_xml(&self, name: &str) -> Result<String> {
        self.run(Rpc::quick("domain_xml"), |h| h.domain_xml(name))
    }
    fn domain_state(&self, name: &str) -> Result<DomainState> {
        self.run(Rpc::quick("domain_state"), |h| h.domain_state(name))
    }
    fn domain_start(&self, name: &str) -> Result<()> {
        self.run(Rpc::lengthy("domain_start"), |h| h.domain_start(name))
    }
    fn domain_destroy(&self, name: &str) -> Result<()> {
        self.run(Rpc::lengthy("domain_destroy"), |h| h.domain_destroy(name))
    }
    fn domain_reset(&self, name: &str) -> Result<()> {
        self.run(Rpc::quick("domain_reset"), |h| h.domain_reset(name))
    }
    fn domain_undefine(&self, name: &str, flags: UndefineFlags) -> Result<()> {
        self.run(Rpc::quick("domain_undefine"), |h| h.domain_undefine(name, flags))
    }
    fn domain_autostart(&self, name: &str) -> Result<bool> {
        self.run(Rpc::quick("domain_autostart"), |h| h.domain_autostart(name))
    }
    fn domain_set_autostart(&self, name: &str, autostart: bool) -> Result<()> {
        self.run(Rpc::quick("domain_set_autostart"), |h| h.domain_set_autostart(name, autostart))
    }
    fn subscribe_domain_events(&self, callback: DomainEventCallback) -> Result<EventSubscription> {
        self.run(Rpc::quick("subscribe_domain_events"), |h| h.subscribe_domain_events(callback))
    }
}
