//! `LibvirtHypervisor` and the connection cache against libvirt's in-process
//! `test:///default` driver (no daemon needed).
//!
//! `test:///default` is one shared host per process, so every test uses its
//! own object names. The driver starts with network `default` (active,
//! 192.168.122.0/24), pool `default-pool` (active) and domain `test`
//! (running). It does not implement volume upload/download or DHCP leases;
//! the tests pin that (VIR_ERR_NO_SUPPORT) so a change in libvirt shows up.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use capl_host::hypervisor::connections::Connections;
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::hypervisor::libvirt::{KeepAlive, LibvirtConnector};
use capl_host::hypervisor::{DomainState, ErrorKind, HostAdmin, Hypervisor, NetworkUpdateCommand, UndefineFlags};

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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_errors_keep_the_connection() {
    let connector = Arc::new(LibvirtConnector::default());
    let cache = Arc::new(Connections::new(connector.clone(), 4));
    let host = cache.host(URI);
    let e = host.call(|h| h.domain_state("capl-td-missing")).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoDomain);
    host.call(|h| h.domain_state("test")).await.unwrap();
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
                let r = h.domain_state("test");
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

// A lost connection and a connection that is no longer alive are replaced on
// the next call: pinned on the simulator, where they can be injected, in
// capl-host (hypervisor::connections::tests).
