//! `LibvirtHypervisor` on a real libvirtd: the private one of `cargo xtask
//! host up` (network `capl-test-net` 10.251.0.0/24, dir pools
//! `capl-test-base` and `capl-test-disks`, QEMU with TCG).
//!
//! Every test fails, naming the command, when that daemon is not running. A
//! short check of the trait on the real thing; the full backend comparison is
//! the conformance suite (conformance.rs).

use std::sync::Arc;
use std::time::Instant;

use capl_host::hypervisor::connections::Connections;
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use capl_host::hypervisor::libvirt::{KeepAlive, LibvirtConnector};
use capl_host::hypervisor::{DomainState, ErrorKind, HostAdmin, Hypervisor, NetworkUpdateCommand, UndefineFlags};

use testenv::test_host::{BASE_POOL, DISK_POOL, NETWORK, UP_COMMAND, uri_or_panic as uri};

fn hv() -> LibvirtHypervisor {
    let uri = uri();
    LibvirtHypervisor::connect(&uri)
        .unwrap_or_else(|e| panic!("cannot connect to {uri}: {e}. Is the private libvirtd running? (`{UP_COMMAND}`)"))
}

/// Runs `f` and prints how long it took (for the record; nothing asserts on it).
fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    eprintln!("{what}: {:.1?}", t.elapsed());
    out
}

fn delete_if_present(h: &LibvirtHypervisor, pool: &str, vol: &str) {
    if let Err(e) = h.volume_delete(pool, vol) {
        assert!(e.is_not_found(), "cleaning up {vol} in {pool}: {e}");
    }
}

#[test]
fn infra_is_there_and_missing_objects_are_classified() {
    let _daemon = crate::share_real_daemon_blocking();
    let h = hv();
    assert!(timed("network_is_active", || h.network_is_active(NETWORK)).unwrap());
    assert!(h.pool_is_active(BASE_POOL).unwrap());
    assert!(h.pool_is_active(DISK_POOL).unwrap());
    assert!(h.network_xml(NETWORK).unwrap().contains("10.251.0.1"));
    let e = h.network_is_active("capl-real-missing").unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::NoNetwork, 43), "{e}");
    let e = h.pool_is_active("capl-real-missing").unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::NoStoragePool, 49), "{e}");
    let e = h.volume_xml(DISK_POOL, "capl-real-missing.qcow2").unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::NoStorageVol, 50), "{e}");
    let e = h.domain_state("capl-real-missing").unwrap_err();
    assert_eq!((e.kind, e.code), (ErrorKind::NoDomain, 42), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_is_supported_by_the_daemon() {
    let _daemon = crate::share_real_daemon().await;
    let connector = LibvirtConnector::new(KeepAlive::default());
    let cache = Arc::new(Connections::new(Arc::new(connector), 4));
    let host = cache.host(&uri());
    host.call(|h| h.capabilities_xml()).await.unwrap();
    // The connector enabled keepalive; doing it again on a fresh connection
    // must report support (Ok(true)), unlike test:///.
    capl_host::hypervisor::libvirt::ensure_event_loop().unwrap();
    assert!(hv().set_keepalive(5, 3).unwrap());
    assert_eq!(cache.connections_opened(), 1);
}

#[test]
fn volume_upload_download_and_overlay_with_backing_store() {
    let _daemon = crate::share_real_daemon_blocking();
    let h = hv();
    let (base, overlay) = ("capl-real-base.raw", "capl-real-overlay.qcow2");
    delete_if_present(&h, DISK_POOL, overlay);
    delete_if_present(&h, BASE_POOL, base);

    let bytes: Vec<u8> = (0..300 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let base_xml = format!(
        "<volume><name>{base}</name><capacity unit='bytes'>{}</capacity>\
         <target><format type='raw'/></target></volume>",
        bytes.len()
    );
    assert_eq!(timed("volume_create raw", || h.volume_create(BASE_POOL, &base_xml)).unwrap(), base);
    timed("volume_upload 300 KiB", || h.volume_upload(BASE_POOL, base, &bytes)).unwrap();
    let back = timed("volume_download 300 KiB", || h.volume_download(BASE_POOL, base)).unwrap();
    assert!(back == bytes, "downloaded {} bytes differ from the {} uploaded", back.len(), bytes.len());

    let dup = h.volume_create(BASE_POOL, &base_xml).unwrap_err();
    assert_eq!((dup.kind, dup.code), (ErrorKind::StorageVolExists, 90), "{dup}");

    let base_path = "/var/lib/capl-libvirt/pools/base/capl-real-base.raw";
    assert!(h.volume_xml(BASE_POOL, base).unwrap().contains(base_path));
    let overlay_xml = format!(
        "<volume><name>{overlay}</name><capacity unit='MiB'>64</capacity>\
         <target><format type='qcow2'/></target>\
         <backingStore><path>{base_path}</path><format type='raw'/></backingStore></volume>"
    );
    assert_eq!(timed("volume_create qcow2 overlay", || h.volume_create(DISK_POOL, &overlay_xml)).unwrap(), overlay);
    let xml = h.volume_xml(DISK_POOL, overlay).unwrap();
    assert!(xml.contains("<backingStore>") && xml.contains(base_path), "{xml}");
    assert!(h.volume_list(DISK_POOL).unwrap().contains(&overlay.to_string()));

    h.volume_delete(DISK_POOL, overlay).unwrap();
    h.volume_delete(BASE_POOL, base).unwrap();
    assert_eq!(h.volume_xml(BASE_POOL, base).unwrap_err().kind, ErrorKind::NoStorageVol);
}

#[test]
fn dhcp_host_add_duplicate_bad_mac_outside_subnet_and_delete() {
    let _daemon = crate::share_real_daemon_blocking();
    let h = hv();
    let host = "<host mac='52:54:00:c0:ff:01' name='capl-real-dhcp' ip='10.251.0.201'/>";
    let outside = "<host mac='52:54:00:c0:ff:02' name='capl-real-out' ip='10.99.0.5'/>";
    // Leftovers of an interrupted run would make the adds duplicates.
    let _ = h.network_update_dhcp_host(NETWORK, NetworkUpdateCommand::Delete, host);
    let _ = h.network_update_dhcp_host(NETWORK, NetworkUpdateCommand::Delete, outside);

    timed("dhcp host add (live+config)", || h.network_update_dhcp_host(NETWORK, NetworkUpdateCommand::AddLast, host))
        .unwrap();
    assert!(h.network_xml(NETWORK).unwrap().contains("10.251.0.201"));

    let add = |xml: &str| h.network_update_dhcp_host(NETWORK, NetworkUpdateCommand::AddLast, xml);
    let dup = add(host).unwrap_err();
    assert_eq!((dup.kind, dup.code), (ErrorKind::OperationInvalid, 55), "{dup}");
    assert!(dup.message.contains("existing dhcp host entry"), "{dup}");

    let bad = add("<host mac='zz' name='capl-real-bad' ip='10.251.0.202'/>").unwrap_err();
    assert_eq!((bad.kind, bad.code), (ErrorKind::XmlError, 27), "{bad}");

    // libvirt 11.3 does NOT check the IP against the network: a host outside
    // the subnet is accepted (the provider must check that itself).
    add(outside).unwrap();
    assert!(h.network_xml(NETWORK).unwrap().contains("10.99.0.5"));
    h.network_update_dhcp_host(NETWORK, NetworkUpdateCommand::Delete, outside).unwrap();

    timed("dhcp host delete (live+config)", || h.network_update_dhcp_host(NETWORK, NetworkUpdateCommand::Delete, host))
        .unwrap();
    assert!(!h.network_xml(NETWORK).unwrap().contains("10.251.0.201"));
    let absent = h.network_update_dhcp_host(NETWORK, NetworkUpdateCommand::Delete, host).unwrap_err();
    assert_eq!((absent.kind, absent.code), (ErrorKind::OperationInvalid, 55), "{absent}");
    // The lease list is readable (empty or not, depending on other guests).
    timed("dhcp leases", || h.network_dhcp_leases(NETWORK)).unwrap();
}

#[test]
fn domain_define_start_twice_destroy_undefine() {
    let _daemon = crate::share_real_daemon_blocking();
    let h = hv();
    let name = "capl-real-dom";
    if h.domain_state(name).is_ok() {
        let _ = h.domain_destroy(name);
        h.domain_undefine(name, UndefineFlags::all()).unwrap();
    }
    let xml = format!(
        "<domain type='qemu'><name>{name}</name><uuid>3b6e7a8c-5f41-4c2a-9d7e-0c1a2b3c4d5e</uuid>\
         <memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os>\
         <devices><interface type='network'><source network='{NETWORK}'/>\
         <mac address='52:54:00:c0:ff:10'/><model type='virtio'/></interface>\
         <serial type='pty'/><console type='pty'/></devices></domain>"
    );
    assert_eq!(timed("domain_define", || h.domain_define(&xml)).unwrap(), name);
    assert_eq!(h.domain_state(name).unwrap(), DomainState::Shutoff);
    h.domain_set_autostart(name, true).unwrap();
    assert!(h.domain_autostart(name).unwrap());

    timed("domain_start (TCG)", || h.domain_start(name)).unwrap();
    assert_eq!(h.domain_state(name).unwrap(), DomainState::Running);
    let twice = h.domain_start(name).unwrap_err();
    assert_eq!((twice.kind, twice.code), (ErrorKind::OperationInvalid, 55), "{twice}");

    timed("domain_destroy", || h.domain_destroy(name)).unwrap();
    assert_eq!(h.domain_state(name).unwrap(), DomainState::Shutoff);
    timed("domain_undefine", || h.domain_undefine(name, UndefineFlags::all())).unwrap();
    assert_eq!(h.domain_state(name).unwrap_err().kind, ErrorKind::NoDomain);
}

/// A unix-socket proxy in front of the daemon's socket whose connections can
/// be cut, to see what a client observes when its libvirtd goes away
/// without disturbing the daemon other tests share.
struct SocketProxy {
    path: std::path::PathBuf,
    streams: Arc<std::sync::Mutex<Vec<std::os::unix::net::UnixStream>>>,
}

impl SocketProxy {
    fn start(upstream: std::path::PathBuf) -> Self {
        use std::os::unix::net::{UnixListener, UnixStream};
        let path = std::env::temp_dir().join(format!("capl-proxy-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("binding the proxy socket");
        let streams: Arc<std::sync::Mutex<Vec<UnixStream>>> = Arc::default();
        let tracked = streams.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let server = UnixStream::connect(&upstream).expect("connecting to the daemon socket");
                let mut list = tracked.lock().unwrap();
                list.push(client.try_clone().unwrap());
                list.push(server.try_clone().unwrap());
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Self { path, streams }
    }

    fn uri(&self) -> String {
        format!("qemu+unix:///system?socket={}", self.path.display())
    }

    /// Closes every proxied connection (new ones are still accepted).
    fn cut(&self) {
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_reported_lost_and_replaced() {
    let _daemon = crate::share_real_daemon().await;
    let uri = uri();
    let socket = uri
        .split("socket=")
        .nth(1)
        .unwrap_or_else(|| panic!("{uri} has no socket= parameter (the URI of `cargo xtask host up` has)"));
    let proxy = SocketProxy::start(socket.split('&').next().unwrap().into());
    let connector = Arc::new(LibvirtConnector::new(KeepAlive::default()));
    let cache = Arc::new(Connections::new(connector.clone(), 4));
    let host = cache.host(&proxy.uri());
    assert!(host.call(|h| h.network_is_active(NETWORK)).await.unwrap());

    // A bare connection sees the cut as ConnectionLost.
    let bare = LibvirtHypervisor::connect(&proxy.uri()).unwrap();
    assert!(bare.network_is_active(NETWORK).unwrap());
    proxy.cut();
    let lost = bare.network_is_active(NETWORK).unwrap_err();
    eprintln!("call on a cut connection: {lost:?}");
    assert_eq!(lost.kind, ErrorKind::ConnectionLost, "{lost}");
    assert!(!bare.is_alive());

    // Through the cache: the event loop may already have marked the
    // connection dead (the call reconnects at once), or the call fails with
    // ConnectionLost and the next one reconnects. Either way, one new
    // connection and no further failure.
    match host.call(|h| h.network_is_active(NETWORK)).await {
        Ok(active) => assert!(active),
        Err(e) => assert_eq!(e.kind, ErrorKind::ConnectionLost, "{e}"),
    }
    assert!(host.call(|h| h.network_is_active(NETWORK)).await.unwrap());
    assert_eq!(connector.connections_opened(), 2, "the cache reconnected once");
}
