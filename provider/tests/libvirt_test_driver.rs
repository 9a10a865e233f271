//! `LibvirtHypervisor` and the connection cache against libvirt's in-process
//! `test:///default` driver (no daemon needed).
//!
//! `test:///default` is one shared host per process, so every test uses its
//! own object names. The driver starts with network `default` (active,
//! 192.168.122.0/24), pool `default-pool` (active) and domain `test`
//! (running). It does not implement volume upload/download or DHCP leases;
//! the tests pin that (VIR_ERR_NO_SUPPORT) so a change in libvirt shows up.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capl_host::hypervisor::connections::{Connections, Connector, KeepAlive, LibvirtConnector};
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::hypervisor::{
    DhcpLease, DomainState, ErrorKind, Hypervisor, HypervisorError, NetworkUpdateCommand, Result, UndefineFlags,
};

const URI: &str = "test:///default";

fn hv() -> LibvirtHypervisor {
    LibvirtHypervisor::connect(URI).expect("test:///default opens in process")
}

fn network_xml(name: &str, third_octet: u8) -> String {
    format!(
        "<network><name>{name}</name><forward mode='nat'/><bridge name='{name}br'/>\
         <ip address='10.77.{third_octet}.1' netmask='255.255.255.0'><dhcp>\
         <range start='10.77.{third_octet}.2' end='10.77.{third_octet}.99'/></dhcp></ip></network>"
    )
}

fn domain_xml(name: &str, uuid: &str) -> String {
    format!(
        "<domain type='test'><name>{name}</name><uuid>{uuid}</uuid><memory unit='MiB'>64</memory>\
         <vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os></domain>"
    )
}

#[test]
fn connect_reports_uri_capabilities_and_liveness() {
    let h = hv();
    assert_eq!(h.uri(), URI);
    assert!(h.capabilities_xml().unwrap().contains("<capabilities>"));
    assert!(h.is_alive());
    // The test driver has no keepalive: reported, not an error.
    assert!(!h.set_keepalive(5, 3).unwrap());
}

#[test]
fn connect_to_a_bad_uri_names_the_uri() {
    let err = LibvirtHypervisor::connect("bogus-driver:///nothing").err().expect("unknown driver fails");
    assert!(err.message.contains("bogus-driver:///nothing"), "{err}");
    assert_ne!(err.code, 0);
}

#[test]
fn infra_lookups_distinguish_missing_objects() {
    let h = hv();
    assert!(h.network_list().unwrap().contains(&"default".to_string()));
    assert!(h.network_is_active("default").unwrap());
    assert!(h.network_xml("default").unwrap().contains("192.168.122.1"));
    assert!(h.pool_list().unwrap().contains(&"default-pool".to_string()));
    assert!(h.pool_is_active("default-pool").unwrap());

    let e = h.network_is_active("no-such-net").unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::NoNetwork, 43), "{e}");
    assert!(e.is_not_found());
    let e = h.pool_xml("no-such-pool").unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::NoStoragePool, 49), "{e}");
    let e = h.volume_xml("default-pool", "no-such-vol").unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::NoStorageVol, 50), "{e}");
    let e = h.domain_state("no-such-dom").unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::NoDomain, 42), "{e}");
}

#[test]
fn network_lifecycle_and_dhcp_hosts_live_and_inactive() {
    let h = hv();
    let name = "capl-td-net1";
    assert_eq!(h.network_define(&network_xml(name, 1)).unwrap(), name);
    assert!(!h.network_is_active(name).unwrap());

    // Inactive, persistent network: the update goes to the config only.
    let host = "<host mac='52:54:00:aa:00:01' name='vm1' ip='10.77.1.10'/>";
    h.network_update_dhcp_host(name, NetworkUpdateCommand::AddLast, host).unwrap();
    assert!(h.network_xml(name).unwrap().contains("10.77.1.10"));

    h.network_start(name).unwrap();
    assert!(h.network_is_active(name).unwrap());
    assert!(h.network_xml(name).unwrap().contains("10.77.1.10"), "config survives start");
    let host2 = "<host mac='52:54:00:aa:00:02' name='vm2' ip='10.77.1.11'/>";
    h.network_update_dhcp_host(name, NetworkUpdateCommand::AddLast, host2).unwrap();
    h.network_update_dhcp_host(name, NetworkUpdateCommand::Delete, host).unwrap();
    let xml = h.network_xml(name).unwrap();
    assert!(xml.contains("10.77.1.11") && !xml.contains("10.77.1.10"), "{xml}");

    h.network_stop(name).unwrap();
    h.network_undefine(name).unwrap();
    assert_eq!(h.network_is_active(name).unwrap_err().kind, ErrorKind::NoNetwork);
}

#[test]
fn test_driver_has_no_dhcp_leases() {
    let e = hv().network_dhcp_leases("default").unwrap_err();
    assert_eq!(e.code, 3, "VIR_ERR_NO_SUPPORT expected, got {e}");
}

#[test]
fn volume_create_read_back_duplicate_and_delete() {
    let h = hv();
    let vol = "capl-td-vol1.qcow2";
    let xml = format!(
        "<volume><name>{vol}</name><capacity unit='MiB'>16</capacity>\
         <target><format type='qcow2'/></target></volume>"
    );
    assert_eq!(h.volume_create("default-pool", &xml).unwrap(), vol);
    assert!(h.volume_list("default-pool").unwrap().contains(&vol.to_string()));
    assert!(h.volume_xml("default-pool", vol).unwrap().contains(&format!("<name>{vol}</name>")));
    let dup = h.volume_create("default-pool", &xml).unwrap_err();
    // test:/// says VIR_ERR_OPERATION_FAILED; a dir pool on libvirtd says
    // VIR_ERR_STORAGE_VOL_EXIST (see libvirt_real.rs).
    assert_eq!((dup.kind, dup.code), (ErrorKind::OperationFailed, 9), "{dup}");
    h.volume_delete("default-pool", vol).unwrap();
    assert_eq!(h.volume_xml("default-pool", vol).unwrap_err().kind, ErrorKind::NoStorageVol);
}

#[test]
fn test_driver_has_no_volume_streams() {
    let h = hv();
    let vol = "capl-td-stream.raw";
    h.volume_create("default-pool", &format!("<volume><name>{vol}</name><capacity>4096</capacity></volume>")).unwrap();
    assert_eq!(h.volume_upload("default-pool", vol, b"hello").unwrap_err().code, 3);
    assert_eq!(h.volume_download("default-pool", vol).unwrap_err().code, 3);
    h.volume_delete("default-pool", vol).unwrap();
}

#[test]
fn pool_define_build_start_stop_undefine() {
    let h = hv();
    let name = "capl-td-pool1";
    let xml = format!("<pool type='dir'><name>{name}</name><target><path>/capl-td-pool1</path></target></pool>");
    assert_eq!(h.pool_define(&xml).unwrap(), name);
    assert!(!h.pool_is_active(name).unwrap());
    h.pool_build(name).unwrap();
    h.pool_start(name).unwrap();
    assert!(h.pool_is_active(name).unwrap());
    h.pool_refresh(name).unwrap();
    h.pool_stop(name).unwrap();
    h.pool_undefine(name).unwrap();
    assert_eq!(h.pool_is_active(name).unwrap_err().kind, ErrorKind::NoStoragePool);
}

#[test]
fn domain_define_start_twice_destroy_undefine() {
    let h = hv();
    let name = "capl-td-dom1";
    let uuid = "6f2c1b52-1d3a-4c36-9a44-3a7b0c1d0001";
    assert_eq!(h.domain_define(&domain_xml(name, uuid)).unwrap(), name);
    assert!(h.domain_list().unwrap().contains(&name.to_string()));
    assert!(h.domain_xml(name).unwrap().contains(uuid));
    assert_eq!(h.domain_state(name).unwrap(), DomainState::Shutoff);

    // Same name, another UUID: refused.
    let clash = h.domain_define(&domain_xml(name, "6f2c1b52-1d3a-4c36-9a44-3a7b0c1d0002")).unwrap_err();
    assert_eq!((clash.kind, clash.code), (ErrorKind::OperationFailed, 9), "{clash}");
    assert!(clash.message.contains("already exists"), "{clash}");

    assert!(!h.domain_autostart(name).unwrap());
    h.domain_set_autostart(name, true).unwrap();
    assert!(h.domain_autostart(name).unwrap());

    h.domain_start(name).unwrap();
    assert_eq!(h.domain_state(name).unwrap(), DomainState::Running);
    // The test driver reports start-twice as VIR_ERR_INTERNAL_ERROR; the
    // QEMU driver says VIR_ERR_OPERATION_INVALID (see libvirt_real.rs).
    let twice = h.domain_start(name).unwrap_err();
    assert_eq!(twice.code, 1, "{twice}");
    assert!(twice.message.contains("already running"), "{twice}");

    h.domain_destroy(name).unwrap();
    assert_eq!(h.domain_state(name).unwrap(), DomainState::Shutoff);
    h.domain_undefine(name, UndefineFlags { managed_save: true, snapshots_metadata: true, nvram: false }).unwrap();
    assert_eq!(h.domain_state(name).unwrap_err().kind, ErrorKind::NoDomain);
}

#[test]
fn malformed_xml_is_an_xml_error() {
    let e = hv().domain_define("<domain type='test'><name>broken").unwrap_err();
    assert_eq!(e.kind, ErrorKind::XmlError, "{e}");
}

// --- the connection cache ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_calls_reuse_one_connection() {
    let connector = Arc::new(LibvirtConnector::new(KeepAlive::default()));
    let cache = Arc::new(Connections::new(connector.clone(), 4));
    let host = cache.host(URI);
    assert_eq!(connector.connections_opened(), 0, "a handle opens nothing by itself");
    for _ in 0..5 {
        let state = host.call(|h| h.domain_state("test")).await.unwrap();
        assert_eq!(state, DomainState::Running);
    }
    // Another handle on the same URI shares the connection.
    let again = cache.host(URI);
    again.call(|h| h.network_is_active("default")).await.unwrap();
    assert_eq!(connector.connections_opened(), 1);
    assert_eq!(cache.connections_opened(), 1);

    cache.invalidate(URI);
    host.call(|h| h.pool_list()).await.unwrap();
    assert_eq!(connector.connections_opened(), 2, "an invalidated host reconnects on the next call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_errors_keep_the_connection() {
    let connector = Arc::new(LibvirtConnector::default());
    let cache = Arc::new(Connections::new(connector.clone(), 4));
    let host = cache.host(URI);
    let e = host.call(|h| h.domain_state("capl-td-missing")).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoDomain);
    host.call(|h| h.domain_list()).await.unwrap();
    assert_eq!(connector.connections_opened(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_per_host_are_bounded() {
    let cache = Arc::new(Connections::new(Arc::new(LibvirtConnector::default()), 2));
    let host = cache.host(URI);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (host, in_flight, peak) = (host.clone(), in_flight.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            host.call(move |h| {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
                let r = h.domain_list();
                in_flight.fetch_sub(1, Ordering::SeqCst);
                r
            })
            .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!((1..=2).contains(&peak), "at most 2 calls at once on the host, saw {peak}");
}

/// A connection that delegates to test:///default until told to behave like
/// a host whose libvirtd went away.
struct Flaky {
    inner: LibvirtHypervisor,
    lost: Arc<AtomicBool>,
    dead: Arc<AtomicBool>,
}

impl Flaky {
    fn check(&self) -> Result<()> {
        if self.lost.swap(false, Ordering::SeqCst) {
            return Err(HypervisorError::new(ErrorKind::ConnectionLost, 39, "client socket is closed"));
        }
        Ok(())
    }
}

macro_rules! delegate {
    ($( fn $name:ident(&self $(, $arg:ident : $ty:ty)*) -> $ret:ty; )*) => {
        $( fn $name(&self $(, $arg: $ty)*) -> $ret { self.check()?; self.inner.$name($($arg),*) } )*
    };
}

impl Hypervisor for Flaky {
    fn uri(&self) -> &str {
        self.inner.uri()
    }
    fn is_alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst)
    }
    delegate! {
        fn capabilities_xml(&self) -> Result<String>;
        fn network_list(&self) -> Result<Vec<String>>;
        fn network_xml(&self, name: &str) -> Result<String>;
        fn network_is_active(&self, name: &str) -> Result<bool>;
        fn network_define(&self, xml: &str) -> Result<String>;
        fn network_start(&self, name: &str) -> Result<()>;
        fn network_stop(&self, name: &str) -> Result<()>;
        fn network_undefine(&self, name: &str) -> Result<()>;
        fn network_update_dhcp_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()>;
        fn network_dhcp_leases(&self, network: &str) -> Result<Vec<DhcpLease>>;
        fn pool_list(&self) -> Result<Vec<String>>;
        fn pool_xml(&self, name: &str) -> Result<String>;
        fn pool_is_active(&self, name: &str) -> Result<bool>;
        fn pool_define(&self, xml: &str) -> Result<String>;
        fn pool_build(&self, name: &str) -> Result<()>;
        fn pool_start(&self, name: &str) -> Result<()>;
        fn pool_stop(&self, name: &str) -> Result<()>;
        fn pool_undefine(&self, name: &str) -> Result<()>;
        fn pool_refresh(&self, name: &str) -> Result<()>;
        fn volume_list(&self, pool: &str) -> Result<Vec<String>>;
        fn volume_xml(&self, pool: &str, name: &str) -> Result<String>;
        fn volume_create(&self, pool: &str, xml: &str) -> Result<String>;
        fn volume_upload(&self, pool: &str, name: &str, bytes: &[u8]) -> Result<()>;
        fn volume_download(&self, pool: &str, name: &str) -> Result<Vec<u8>>;
        fn volume_delete(&self, pool: &str, name: &str) -> Result<()>;
        fn domain_list(&self) -> Result<Vec<String>>;
        fn domain_define(&self, xml: &str) -> Result<String>;
        fn domain_xml(&self, name: &str) -> Result<String>;
        fn domain_state(&self, name: &str) -> Result<DomainState>;
        fn domain_start(&self, name: &str) -> Result<()>;
        fn domain_destroy(&self, name: &str) -> Result<()>;
        fn domain_undefine(&self, name: &str, flags: UndefineFlags) -> Result<()>;
        fn domain_autostart(&self, name: &str) -> Result<bool>;
        fn domain_set_autostart(&self, name: &str, autostart: bool) -> Result<()>;
    }
}

/// Hands out [`Flaky`] connections; the switches act on the latest one.
#[derive(Default)]
struct FlakyConnector {
    opened: AtomicUsize,
    switches: Mutex<Option<(Arc<AtomicBool>, Arc<AtomicBool>)>>,
}

impl FlakyConnector {
    fn lose_next_call(&self) {
        self.switches.lock().unwrap().as_ref().unwrap().0.store(true, Ordering::SeqCst);
    }
    fn kill(&self) {
        self.switches.lock().unwrap().as_ref().unwrap().1.store(true, Ordering::SeqCst);
    }
}

impl Connector for FlakyConnector {
    fn connect(&self, uri: &str) -> Result<Arc<dyn Hypervisor>> {
        let (lost, dead) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        *self.switches.lock().unwrap() = Some((lost.clone(), dead.clone()));
        self.opened.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(Flaky { inner: LibvirtHypervisor::connect(uri)?, lost, dead }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_is_replaced_on_the_next_call() {
    let connector = Arc::new(FlakyConnector::default());
    let cache = Arc::new(Connections::new(connector.clone(), 4));
    let host = cache.host(URI);
    host.call(|h| h.domain_list()).await.unwrap();
    assert_eq!(connector.opened.load(Ordering::SeqCst), 1);

    connector.lose_next_call();
    let e = host.call(|h| h.domain_list()).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::ConnectionLost, "the error is returned, not retried");
    host.call(|h| h.domain_list()).await.unwrap();
    assert_eq!(connector.opened.load(Ordering::SeqCst), 2, "reconnected after ConnectionLost");

    connector.kill();
    host.call(|h| h.domain_list()).await.unwrap();
    assert_eq!(connector.opened.load(Ordering::SeqCst), 3, "a connection that is not alive is replaced");
    host.call(|h| h.domain_list()).await.unwrap();
    assert_eq!(connector.opened.load(Ordering::SeqCst), 3);
}
