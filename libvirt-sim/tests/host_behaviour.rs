//! The simulator's own behaviour beyond what the conformance suite compares with
//! libvirt: DHCP timing, faults, restarts, counters, concurrency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use libvirt_sim::{
    Connection, DomainState, Error, ErrorCode, Host, Op, UpdateCommand, UpdateSection, connect, update_flags,
};

const NET: &str = "<network><name>net</name><bridge name='virbr7'/><ip address='10.7.0.1' prefix='24'>\
    <dhcp><range start='10.7.0.100' end='10.7.0.102'/></dhcp></ip></network>";
const POOL: &str = "<pool type='dir'><name>disks</name><target><path>/sim/disks</path></target></pool>";

fn host(uri: &str) -> Host {
    Host::builder(uri)
        .network(NET, true)
        .pool(POOL, true)
        .manual_clock()
        .dhcp_delay(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn domain(name: &str, mac: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><os><type>hvm</type></os>\
         <devices><interface type='network'><mac address='{mac}'/><source network='net'/></interface></devices></domain>"
    )
}

fn reserve(conn: &Connection, mac: &str, name: &str, ip: &str) {
    let xml = format!("<host mac='{mac}' name='{name}' ip='{ip}'/>");
    conn.network_update(
        "net",
        UpdateCommand::AddLast,
        UpdateSection::IpDhcpHost,
        -1,
        &xml,
        update_flags::AFFECT_LIVE | update_flags::AFFECT_CONFIG,
    )
    .unwrap();
}

fn leases(conn: &Connection) -> Vec<(String, String, Option<String>)> {
    conn.network_get_dhcp_leases("net", None)
        .unwrap()
        .into_iter()
        .map(|l| (l.mac.to_string(), l.ip.to_string(), l.hostname))
        .collect()
}

/// The simulated host models no host interfaces: it answers interface lookups as a
/// libvirtd without its interface driver does, and counts the call.
#[test]
fn interface_lookups_are_not_supported_like_a_daemon_without_the_interface_driver() {
    let host = host("sim://iface");
    let conn = connect("sim://iface").unwrap();
    let err = conn.interface_lookup_by_name("br0").unwrap_err();
    assert_eq!((err.code(), err.number()), (ErrorCode::NoSupport, 3));
    assert_eq!(err.message(), "this function is not supported by the connection driver: virInterfaceLookupByName");
    assert_eq!(host.counters().calls(Op::InterfaceLookup), 1);
}

/// Domain capabilities follow the domain type and machine asked for, as
/// QEMU's do: host-passthrough only with KVM, Secure Boot only on q35; and
/// what the host lacks fails as libvirt does.
#[test]
fn domain_capabilities_follow_the_domain_type_and_machine() {
    let host = host("sim://domcaps");
    let conn = connect(host.uri()).unwrap();
    let tcg_pc = conn.get_domain_capabilities(None, Some("x86_64"), Some("pc"), Some("qemu")).unwrap();
    assert!(tcg_pc.contains("<mode name='host-passthrough' supported='no'/>"), "{tcg_pc}");
    assert!(tcg_pc.contains(">qemu64</model>") && tcg_pc.contains("<value>efi</value>"), "{tcg_pc}");
    assert!(tcg_pc.contains("<enum name='secure'>\n        <value>no</value>\n      </enum>"), "{tcg_pc}");
    let kvm_q35 = conn.get_domain_capabilities(None, None, Some("q35"), Some("kvm")).unwrap();
    assert!(kvm_q35.contains("<mode name='host-passthrough' supported='yes'/>"), "{kvm_q35}");
    assert!(kvm_q35.contains("<enum name='secure'>\n        <value>yes</value>"), "{kvm_q35}");
    assert!(kvm_q35.contains("<value>emulator</value>"), "{kvm_q35}");
    assert_eq!(
        conn.get_domain_capabilities(None, None, None, Some("xen")).unwrap_err().code(),
        ErrorCode::ConfigUnsupported
    );
    assert_eq!(
        conn.get_domain_capabilities(None, Some("aarch64"), None, None).unwrap_err().code(),
        ErrorCode::InvalidArg
    );
    assert_eq!(host.counters().calls(Op::GetDomainCapabilities), 4);
}

#[test]
fn guests_ask_for_dhcp_after_the_delay_reserved_ip_first() {
    let host = host("sim:///behaviour-dhcp");
    let conn = connect(host.uri()).unwrap();
    reserve(&conn, "52:54:00:00:00:01", "reserved", "10.7.0.101");
    conn.domain_define_xml(&domain("a", "52:54:00:00:00:01")).unwrap();
    conn.domain_define_xml(&domain("b", "52:54:00:00:00:02")).unwrap();
    conn.domain_create("a").unwrap();
    conn.domain_create("b").unwrap();
    assert!(leases(&conn).is_empty(), "no lease before the DHCP delay");
    host.advance_clock(Duration::from_secs(5));
    let mut got = leases(&conn);
    got.sort();
    assert_eq!(
        got,
        [
            ("52:54:00:00:00:01".to_string(), "10.7.0.101".to_string(), Some("reserved".to_string())),
            ("52:54:00:00:00:02".to_string(), "10.7.0.100".to_string(), Some("b".to_string())),
        ]
    );
    conn.domain_destroy("b").unwrap();
    assert_eq!(leases(&conn).len(), 1, "a stopped domain's lease goes");
}

#[test]
fn leases_can_outlive_their_domain_and_the_range_can_run_out() {
    let host = Host::builder("sim:///behaviour-keep").network(NET, true).release_leases_on_stop(false).build().unwrap();
    let conn = connect(host.uri()).unwrap();
    for i in 1..=4 {
        conn.domain_define_xml(&domain(&format!("d{i}"), &format!("52:54:00:00:01:0{i}"))).unwrap();
        conn.domain_create(&format!("d{i}")).unwrap();
    }
    assert_eq!(leases(&conn).len(), 3, "the range has three addresses; the fourth guest gets none");
    conn.domain_destroy("d1").unwrap();
    assert_eq!(leases(&conn).len(), 3, "leases stay until expiry when release_leases_on_stop(false)");
}

#[test]
fn a_guest_without_an_address_keeps_asking() {
    let host = Host::builder("sim:///behaviour-full").network(NET, true).build().unwrap();
    let conn = connect(host.uri()).unwrap();
    for i in 1..=4 {
        conn.domain_define_xml(&domain(&format!("d{i}"), &format!("52:54:00:00:01:0{i}"))).unwrap();
        conn.domain_create(&format!("d{i}")).unwrap();
    }
    assert_eq!(leases(&conn).len(), 3);
    conn.domain_destroy("d1").unwrap();
    let got = leases(&conn);
    assert!(
        got.iter().any(|l| l.0 == "52:54:00:00:01:04" && l.1 == "10.7.0.100"),
        "the waiting guest gets the freed address: {got:?}"
    );
}

#[test]
fn a_silent_guest_never_gets_a_lease() {
    let host = Host::builder("sim:///behaviour-silent").network(NET, true).build().unwrap();
    let conn = connect(host.uri()).unwrap();
    host.faults().guest_never_asks_dhcp("52:54:00:00:02:01");
    conn.domain_define_xml(&domain("quiet", "52:54:00:00:02:01")).unwrap();
    conn.domain_define_xml(&domain("chatty", "52:54:00:00:02:02")).unwrap();
    conn.domain_create("quiet").unwrap();
    conn.domain_create("chatty").unwrap();
    let macs: Vec<String> = leases(&conn).into_iter().map(|l| l.0).collect();
    assert_eq!(macs, ["52:54:00:00:02:02"]);
}

#[test]
fn the_nth_call_fails_with_the_planned_error() {
    let host = host("sim:///behaviour-fail");
    let conn = connect(host.uri()).unwrap();
    host.fail_nth(Op::DomainDefine, 2, Error::new(ErrorCode::OperationFailed, "injected"));
    conn.domain_define_xml(&domain("one", "52:54:00:00:03:01")).unwrap();
    let err = conn.domain_define_xml(&domain("two", "52:54:00:00:03:02")).unwrap_err();
    assert_eq!((err.code(), err.message()), (ErrorCode::OperationFailed, "operation failed: injected"));
    conn.domain_define_xml(&domain("two", "52:54:00:00:03:02")).unwrap();
    assert_eq!(host.counters().calls(Op::DomainDefine), 3);
    assert_eq!(conn.list_all_domains().unwrap(), ["one", "two"]);
}

/// About the given share of calls fails, the same ones for the same seed, and
/// connect is never among them.
#[test]
fn random_failures_hit_the_given_share_repeatably() {
    let failing = |seed: u64| -> Vec<usize> {
        let host = host(&format!("sim:///behaviour-random-{seed}"));
        host.faults().fail_randomly(0.05, seed, Error::new(ErrorCode::OperationFailed, "injected"));
        let conn = connect(host.uri()).expect("connect is never failed at random");
        let failed = (0..4000).filter(|_| conn.list_all_domains().is_err()).collect::<Vec<_>>();
        host.faults().clear();
        assert!(conn.list_all_domains().is_ok(), "clear ends the failures");
        host.unregister();
        failed
    };
    let (a, b, c) = (failing(7), failing(7), failing(8));
    assert!((120..=280).contains(&a.len()), "{} of 4000 calls failed at 5%", a.len());
    assert_eq!(a, b, "the same seed fails the same calls");
    assert_ne!(a, c, "another seed fails other calls");
}

#[test]
fn latency_delays_the_call() {
    let host = host("sim:///behaviour-latency");
    let conn = connect(host.uri()).unwrap();
    host.faults().set_latency(Op::ListDomains, Duration::from_millis(30));
    let start = Instant::now();
    conn.list_all_domains().unwrap();
    // A lower bound only: sleeping never returns early.
    assert!(start.elapsed() >= Duration::from_millis(30));
    host.faults().clear();
}

/// A hung operation blocks its callers until released (other operations go on
/// meanwhile); a hang with a duration ends by itself; a hung connect blocks `connect`.
#[test]
fn a_hung_call_waits_until_released_or_for_its_duration() {
    let host = host("sim:///behaviour-hang");
    let conn = connect(host.uri()).unwrap();
    host.faults().hang(Op::ListDomains, None);
    let (tx, rx) = std::sync::mpsc::channel();
    let caller = {
        let conn = connect(host.uri()).unwrap();
        std::thread::spawn(move || tx.send(conn.list_all_domains().map(|d| d.len())).unwrap())
    };
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "the hung call returned");
    assert!(conn.network_is_active("net").unwrap(), "another operation is not hung");
    host.faults().release(Op::ListDomains);
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).expect("released call returns").unwrap(), 0);
    caller.join().unwrap();

    host.faults().hang(Op::Connect, Some(Duration::from_millis(200)));
    let started = Instant::now();
    connect(host.uri()).unwrap();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(5), "connect waited {waited:?}");
    connect(host.uri()).unwrap();
    host.unregister();
}

#[test]
fn dropped_connections_fail_like_a_closed_socket_and_reconnect() {
    let host = host("sim:///behaviour-drop");
    let conn = connect(host.uri()).unwrap();
    host.drop_connections();
    assert!(!conn.is_alive());
    let err = conn.list_all_networks().unwrap_err();
    assert_eq!((err.code(), err.message()), (ErrorCode::InternalError, "internal error: client socket is closed"));
    let again = connect(host.uri()).unwrap();
    assert_eq!(again.list_all_networks().unwrap(), ["net"]);
    assert_eq!(host.counters().connections_opened(), 2);
    let err = connect("sim:///nobody-here").unwrap_err();
    assert_eq!(err.code(), ErrorCode::NoConnect);
}

#[test]
fn a_daemon_restart_keeps_what_libvirtd_keeps() {
    let host = host("sim:///behaviour-restart");
    let conn = connect(host.uri()).unwrap();
    conn.domain_define_xml(&domain("keep", "52:54:00:00:04:01")).unwrap();
    conn.domain_create("keep").unwrap();
    host.advance_clock(Duration::from_secs(5));
    assert_eq!(leases(&conn).len(), 1);
    host.restart_daemon();
    assert!(conn.list_all_domains().is_err(), "the old connection died with the daemon");
    let conn = connect(host.uri()).unwrap();
    assert_eq!(conn.domain_get_state("keep").unwrap().0, DomainState::Running);
    assert_eq!(leases(&conn).len(), 1);
    assert!(conn.network_is_active("net").unwrap());
}

#[test]
fn a_reboot_stops_domains_and_starts_autostart_ones() {
    let host = host("sim:///behaviour-reboot");
    let conn = connect(host.uri()).unwrap();
    for (name, mac) in [("auto", "52:54:00:00:05:01"), ("manual", "52:54:00:00:05:02")] {
        conn.domain_define_xml(&domain(name, mac)).unwrap();
        conn.domain_create(name).unwrap();
    }
    conn.domain_set_autostart("auto", true).unwrap();
    conn.network_set_autostart("net", true).unwrap();
    conn.storage_pool_set_autostart("disks", true).unwrap();
    conn.domain_create_xml(&domain("transient", "52:54:00:00:05:03")).unwrap();
    host.reboot();
    let conn = connect(host.uri()).unwrap();
    assert_eq!(conn.list_all_domains().unwrap(), ["auto", "manual"], "the transient domain is gone");
    assert_eq!(conn.domain_get_state("auto").unwrap().0, DomainState::Running);
    assert_eq!(conn.domain_get_state("manual").unwrap().0, DomainState::Shutoff);
}

#[test]
fn crash_suspend_resume_and_shutdown() {
    let host = host("sim:///behaviour-states");
    let conn = connect(host.uri()).unwrap();
    conn.domain_define_xml(&domain("d", "52:54:00:00:06:01")).unwrap();
    conn.domain_create("d").unwrap();
    conn.domain_suspend("d").unwrap();
    assert_eq!(conn.domain_get_state("d").unwrap(), (DomainState::Paused, 1));
    conn.domain_resume("d").unwrap();
    host.crash_domain("d").unwrap();
    assert_eq!(conn.domain_get_state("d").unwrap().0, DomainState::Crashed);
    assert_eq!(conn.domain_create("d").unwrap_err().code(), ErrorCode::OperationInvalid);
    conn.domain_destroy("d").unwrap();
    conn.domain_create("d").unwrap();
    conn.domain_shutdown("d").unwrap();
    assert_eq!(conn.domain_get_state("d").unwrap(), (DomainState::Shutoff, 1));
}

/// A reset restarts the guest in the same QEMU process: the domain keeps its id, its
/// state (a paused one stays paused) and its lease, no lifecycle event is emitted, and
/// the host counts it. A crashed domain becomes paused; a shut-off one cannot be reset.
#[test]
fn a_reset_keeps_the_domain_its_state_and_its_lease() {
    let host = host("sim:///behaviour-reset");
    let conn = connect(host.uri()).unwrap();
    conn.domain_define_xml(&domain("r", "52:54:00:00:07:01")).unwrap();
    assert_eq!(
        conn.domain_reset("r").unwrap_err().to_string(),
        "Requested operation is not valid: domain is not running (libvirt error 55)"
    );
    conn.domain_create("r").unwrap();
    host.advance_clock(Duration::from_secs(5));
    let leased = leases(&conn);
    assert_eq!(leased.len(), 1);
    let id = conn.domain_lookup_by_name("r").unwrap().id;
    let (tx, rx) = std::sync::mpsc::channel();
    let _events = conn.domain_event_register(move |e| tx.send(e.clone()).unwrap()).unwrap();

    conn.domain_reset("r").unwrap();
    assert_eq!(conn.domain_get_state("r").unwrap(), (DomainState::Running, 1));
    assert_eq!(conn.domain_lookup_by_name("r").unwrap().id, id, "a reset keeps the QEMU process");
    assert_eq!(leases(&conn), leased);
    conn.domain_suspend("r").unwrap();
    conn.domain_reset("r").unwrap();
    assert_eq!(conn.domain_get_state("r").unwrap(), (DomainState::Paused, 1), "a reset keeps a paused domain paused");
    conn.domain_resume("r").unwrap();
    host.crash_domain("r").unwrap();
    conn.domain_reset("r").unwrap();
    assert_eq!(conn.domain_get_state("r").unwrap(), (DomainState::Paused, 10), "VIR_DOMAIN_PAUSED_CRASHED");
    assert_eq!(host.domain_resets("r").unwrap(), 3);
    assert_eq!(host.counters().calls(Op::DomainReset), 4);
    let kinds: Vec<_> =
        std::iter::from_fn(|| rx.recv_timeout(Duration::from_millis(300)).ok()).map(|e| e.kind).collect();
    use libvirt_sim::DomainEventKind as K;
    assert_eq!(kinds, [K::Suspended, K::Resumed, K::Crashed], "the resets emitted lifecycle events");

    assert_eq!(conn.domain_reset("absent").unwrap_err().code(), ErrorCode::NoDomain);
    assert_eq!(host.domain_resets("absent").unwrap_err().code(), ErrorCode::NoDomain);
}

#[test]
fn volumes_keep_uploaded_bytes_and_check_backing_stores() {
    let host = host("sim:///behaviour-volumes");
    let conn = connect(host.uri()).unwrap();
    conn.storage_vol_create_xml("disks", "<volume><name>seed.iso</name><capacity>5</capacity></volume>").unwrap();
    conn.storage_vol_upload("disks", "seed.iso", 0, b"hello").unwrap();
    assert_eq!(conn.storage_vol_download("disks", "seed.iso", 0, 0).unwrap(), b"hello");
    assert_eq!(
        conn.storage_vol_lookup_by_path("/sim/disks/seed.iso").unwrap(),
        ("disks".to_string(), "seed.iso".to_string())
    );
    let overlay = "<volume><name>o.qcow2</name><target><format type='qcow2'/></target>\
        <backingStore><path>/sim/disks/missing.qcow2</path><format type='qcow2'/></backingStore></volume>";
    let err = conn.storage_vol_create_xml("disks", overlay).unwrap_err();
    assert_eq!(err.code(), ErrorCode::SystemError, "{err}");
    conn.storage_vol_create_xml("disks", "<volume><name>missing.qcow2</name><capacity unit='GiB'>2</capacity><target><format type='qcow2'/></target></volume>").unwrap();
    conn.storage_vol_create_xml("disks", overlay).unwrap();
    assert_eq!(
        conn.storage_vol_lookup_by_name("disks", "o.qcow2").unwrap().capacity,
        2 << 30,
        "capacity comes from the backing volume"
    );
}

#[test]
fn free_memory_shrinks_with_running_domains() {
    let host = host("sim:///behaviour-memory");
    let conn = connect(host.uri()).unwrap();
    let before = conn.node_get_free_memory().unwrap();
    conn.domain_define_xml(&domain("m", "52:54:00:00:07:01")).unwrap();
    conn.domain_create("m").unwrap();
    assert_eq!(before - conn.node_get_free_memory().unwrap(), 64 << 20);
    assert!(conn.get_capabilities().unwrap().contains("<domain type='kvm'/>"));
}

#[test]
fn concurrent_callers_define_and_start_thousands() {
    let host = Host::builder("sim:///behaviour-concurrent").network(NET, true).build().unwrap();
    let conn = Arc::new(connect(host.uri()).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let conn = Arc::clone(&conn);
            std::thread::spawn(move || {
                for i in 0..250 {
                    let name = format!("c{t}-{i}");
                    let xml = format!("<domain type='qemu'><name>{name}</name><memory unit='MiB'>1</memory></domain>");
                    conn.domain_define_xml(&xml).unwrap();
                    conn.domain_create(&name).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(host.domain_count(), 2000);
    assert_eq!(host.counters().calls(Op::DomainCreate), 2000);
    assert_eq!(conn.domain_get_state("c7-249").unwrap().0, DomainState::Running);
}

#[test]
fn nvram_needs_its_undefine_flag_and_transient_domains_vanish() {
    let host = host("sim:///behaviour-nvram");
    let conn = connect(host.uri()).unwrap();
    let uefi = "<domain type='qemu'><name>uefi</name><memory unit='MiB'>64</memory>\
        <os><type>hvm</type><loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE.fd</loader>\
        <nvram>/var/lib/libvirt/qemu/nvram/uefi_VARS.fd</nvram></os></domain>";
    conn.domain_define_xml(uefi).unwrap();
    let err = conn.domain_undefine_flags("uefi", 0).unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (ErrorCode::OperationInvalid, "Requested operation is not valid: cannot undefine domain with nvram")
    );
    conn.domain_undefine_flags("uefi", libvirt_sim::undefine_flags::NVRAM).unwrap();
    assert_eq!(conn.domain_lookup_by_name("uefi").unwrap_err().code(), ErrorCode::NoDomain);

    conn.domain_create_xml(&domain("eph", "52:54:00:00:08:01")).unwrap();
    let info = conn.domain_lookup_by_name("eph").unwrap();
    assert!(!info.persistent && info.state == DomainState::Running && info.id.is_some());
    assert_eq!(conn.domain_undefine_flags("eph", 0).unwrap_err().code(), ErrorCode::OperationInvalid);
    conn.domain_destroy("eph").unwrap();
    assert_eq!(conn.domain_lookup_by_uuid(&info.uuid.to_string()).unwrap_err().code(), ErrorCode::NoDomain);
}

#[test]
fn an_upload_stream_writes_as_it_goes_and_stops_at_its_length() {
    let host = host("sim:///behaviour-upload-stream");
    let conn = connect(host.uri()).unwrap();
    conn.storage_vol_create_xml("disks", "<volume><name>img.raw</name><capacity>4</capacity></volume>").unwrap();
    let mut stream = conn.storage_vol_upload_stream("disks", "img.raw", 0, 10).unwrap();
    assert_eq!(stream.send(b"hello ").unwrap(), 6);
    assert_eq!(conn.storage_vol_download("disks", "img.raw", 0, 0).unwrap(), b"hello ", "bytes land as they are sent");
    assert_eq!(stream.send(b"world!").unwrap(), 4, "only what fits before the length is taken");
    let err = stream.send(b"!").unwrap_err();
    assert_eq!(err.code(), ErrorCode::SystemError, "{err}");
    assert_eq!(err.message(), "cannot write to stream: No space left on device");
    stream.finish().unwrap();
    assert_eq!(conn.storage_vol_lookup_by_name("disks", "img.raw").unwrap().capacity, 10, "a raw volume grows");

    // A finish short of the length is accepted, as libvirtd accepts it.
    let mut short = conn.storage_vol_upload_stream("disks", "img.raw", 0, 100).unwrap();
    short.send(b"HELLO").unwrap();
    short.finish().unwrap();
    assert_eq!(conn.storage_vol_download("disks", "img.raw", 0, 0).unwrap(), b"HELLO worl");
    assert_eq!(host.counters().calls(Op::VolumeUpload), 2);
    assert_eq!(conn.storage_vol_upload_stream("disks", "none.raw", 0, 1).unwrap_err().code(), ErrorCode::NoStorageVol);
}
