//! The scenarios, written once against the `Hypervisor` trait. A scenario a backend cannot
//! model says so in its `not_on` list, with the reason (also listed in libvirt-sim/README.md).

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use capl_host::hypervisor::{
    DomainEvent, DomainEventKind, DomainState, ErrorKind, EventSubscription, NetworkUpdateCommand, UndefineFlags,
};

use super::fixtures::{Backend, Ctx, attr_of, domain_xml, expect_err, interface_xml, network_xml, text_of, wait_for};

/// One scenario and the backends that cannot run it (with why).
pub struct Scenario {
    pub name: &'static str,
    pub run: fn(&Ctx),
    pub not_on: &'static [(Backend, &'static str)],
}

const TEST_DRIVER_NO_STREAMS: &str = "the test driver has no virStorageVolUpload/Download (VIR_ERR_NO_SUPPORT)";
const TEST_DRIVER_NO_LEASES: &str = "the test driver has no virNetworkGetDHCPLeases (VIR_ERR_NO_SUPPORT)";
const TEST_DRIVER_NO_BACKING_CHECKS: &str = "the test driver creates a volume without checking its backing store";
const TEST_DRIVER_NO_START_CHECKS: &str = "the test driver starts a domain without checking its networks";
/// Why guest shutdown events are not observed on a real libvirtd.
const NO_GUEST_SHUTDOWN: &str = "virDomainShutdown only presses QEMU's ACPI power button, and the suite's guests (no \
     OS, or the tiny test guest, which has no ACPI handler) never power off: no guest shutdown to observe";

pub const ALL: &[Scenario] = &[
    Scenario {
        name: "capabilities offer qemu domains",
        run: capabilities_offer_qemu,
        not_on: &[(
            Backend::TestDriver,
            "the test driver's capabilities offer only domain type 'test' (it still defines type 'qemu' domains)",
        )],
    },
    Scenario { name: "missing network", run: missing_network, not_on: &[] },
    Scenario { name: "missing pool", run: missing_pool, not_on: &[] },
    Scenario { name: "missing volume", run: missing_volume, not_on: &[] },
    Scenario { name: "missing domain", run: missing_domain, not_on: &[] },
    Scenario { name: "network lifecycle", run: network_lifecycle, not_on: &[] },
    Scenario {
        name: "stopping an inactive network",
        run: network_stop_inactive,
        not_on: &[(Backend::TestDriver, "the test driver destroys an inactive network without an error")],
    },
    Scenario { name: "network duplicate name", run: network_duplicate, not_on: &[] },
    Scenario { name: "network XML read back", run: network_xml_read_back, not_on: &[] },
    Scenario { name: "pool lifecycle and inactive pool", run: pool_lifecycle, not_on: &[] },
    Scenario { name: "pool duplicate name", run: pool_duplicate, not_on: &[] },
    Scenario { name: "volume with backing store read back", run: volume_backing_store, not_on: &[] },
    Scenario {
        name: "volume duplicate name",
        run: volume_duplicate,
        not_on: &[(
            Backend::TestDriver,
            "the test driver reports VIR_ERR_OPERATION_FAILED (9), not VIR_ERR_STORAGE_VOL_EXIST (90)",
        )],
    },
    Scenario {
        name: "volume upload and download",
        run: volume_upload_download,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_STREAMS)],
    },
    Scenario {
        name: "volume streamed upload in chunks",
        run: volume_upload_streamed,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_STREAMS)],
    },
    Scenario {
        name: "volume streamed upload short of its length",
        run: volume_upload_short,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_STREAMS)],
    },
    Scenario {
        name: "volume streamed upload past its length",
        run: volume_upload_past_length,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_STREAMS)],
    },
    Scenario {
        name: "volume streamed upload larger than the volume",
        run: volume_upload_larger_than_volume,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_STREAMS)],
    },
    Scenario {
        name: "volume streamed upload whose source fails",
        run: volume_upload_source_fails,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_STREAMS)],
    },
    Scenario { name: "volume delete", run: volume_delete, not_on: &[] },
    Scenario { name: "dhcp host add", run: dhcp_host_add, not_on: &[] },
    Scenario { name: "dhcp host duplicate", run: dhcp_host_duplicate, not_on: &[] },
    Scenario { name: "dhcp host outside the subnet is accepted", run: dhcp_host_outside_subnet, not_on: &[] },
    Scenario { name: "dhcp host malformed", run: dhcp_host_malformed, not_on: &[] },
    Scenario { name: "dhcp host remove", run: dhcp_host_remove, not_on: &[] },
    Scenario { name: "dhcp host on an inactive network", run: dhcp_host_inactive_network, not_on: &[] },
    Scenario { name: "domain define and read back", run: domain_define_read_back, not_on: &[] },
    Scenario { name: "domain duplicate name or uuid", run: domain_duplicate, not_on: &[] },
    Scenario { name: "domain malformed XML", run: domain_malformed, not_on: &[] },
    Scenario { name: "domain start and destroy", run: domain_start_destroy, not_on: &[] },
    Scenario {
        name: "domain start twice",
        run: domain_start_twice,
        not_on: &[(
            Backend::TestDriver,
            "the test driver reports VIR_ERR_INTERNAL_ERROR (1), not VIR_ERR_OPERATION_INVALID (55)",
        )],
    },
    Scenario { name: "domain undefine (inactive and running)", run: domain_undefine, not_on: &[] },
    Scenario {
        name: "domain undefine with all flags",
        run: domain_undefine_all_flags,
        not_on: &[(Backend::TestDriver, "the test driver refuses VIR_DOMAIN_UNDEFINE_NVRAM: unsupported flags (0x4)")],
    },
    Scenario { name: "domain autostart", run: domain_autostart, not_on: &[] },
    Scenario {
        name: "autostart on a transient domain",
        run: domain_autostart_transient,
        not_on: &[(Backend::TestDriver, "the test driver sets autostart on a transient domain without an error")],
    },
    Scenario { name: "domain redefine keeps identity", run: domain_redefine, not_on: &[] },
    Scenario {
        name: "domain start on an inactive network",
        run: domain_start_inactive_network,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_START_CHECKS)],
    },
    Scenario {
        name: "domain start on a missing network",
        run: domain_start_missing_network,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_START_CHECKS)],
    },
    Scenario { name: "leases of a missing network", run: leases_missing_network, not_on: &[] },
    Scenario {
        name: "network undefine while active",
        run: network_undefine_active,
        not_on: &[(
            Backend::TestDriver,
            "the test driver refuses to undefine a running network (\"is still running\")",
        )],
    },
    Scenario { name: "pool on another pool's directory", run: pool_target_conflict, not_on: &[] },
    Scenario {
        name: "volume with a missing backing store",
        run: volume_missing_backing,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_BACKING_CHECKS)],
    },
    Scenario {
        name: "raw volume with a backing store",
        run: volume_raw_backing,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_BACKING_CHECKS)],
    },
    Scenario {
        name: "domain of a type the host does not offer",
        run: domain_unsupported_type,
        not_on: &[(Backend::TestDriver, "the test driver defines a domain of any type")],
    },
    Scenario {
        name: "domain start with a missing disk volume",
        run: domain_missing_disk,
        not_on: &[(Backend::TestDriver, "the test driver starts a domain without checking its disks")],
    },
    Scenario {
        name: "lease for a reserved MAC",
        run: lease_for_reserved_mac,
        not_on: &[(Backend::TestDriver, TEST_DRIVER_NO_LEASES)],
    },
    Scenario { name: "domain lifecycle events", run: domain_lifecycle_events, not_on: &[] },
    Scenario { name: "domain reset", run: domain_reset, not_on: &[] },
    Scenario { name: "node memory counts defined domains", run: node_memory_counts_defined_domains, not_on: &[] },
    Scenario { name: "dns host entries: one per address, deleted by address and name", run: dns_hosts, not_on: &[] },
    Scenario {
        name: "domain guest shutdown events",
        run: domain_guest_shutdown_events,
        not_on: &[(Backend::RealLibvirtd, NO_GUEST_SHUTDOWN), (Backend::ContainerLibvirtd, NO_GUEST_SHUTDOWN)],
    },
];

fn capabilities_offer_qemu(ctx: &Ctx) {
    let caps = ctx.hv.capabilities_xml().expect("capabilities");
    assert!(caps.contains("<capabilities>"), "{caps}");
    assert!(caps.contains("<domain type='qemu'"), "no qemu domain type in capabilities:\n{caps}");
    assert!(ctx.hv.is_alive());
}

fn missing_network(ctx: &Ctx) {
    let name = ctx.name("nonet");
    let e = expect_err(ctx.hv.network_xml(&name), ErrorKind::NoNetwork, Some(43), "network_xml");
    assert!(e.is_not_found() && e.message.contains(&name), "{e}");
    expect_err(ctx.hv.network_is_active(&name), ErrorKind::NoNetwork, Some(43), "network_is_active");
    expect_err(ctx.hv.network_start(&name), ErrorKind::NoNetwork, Some(43), "network_start");
    expect_err(
        ctx.hv.network_update_dhcp_host(
            &name,
            NetworkUpdateCommand::AddLast,
            "<host mac='52:54:00:00:00:01' ip='10.0.0.2'/>",
        ),
        ErrorKind::NoNetwork,
        Some(43),
        "update",
    );
    assert!(!ctx.hv.network_list().unwrap().contains(&name));
}

fn missing_pool(ctx: &Ctx) {
    let name = ctx.name("nopool");
    let e = expect_err(ctx.hv.pool_xml(&name), ErrorKind::NoStoragePool, Some(49), "pool_xml");
    assert!(e.message.contains(&name), "{e}");
    expect_err(ctx.hv.pool_is_active(&name), ErrorKind::NoStoragePool, Some(49), "pool_is_active");
    expect_err(ctx.hv.volume_list(&name), ErrorKind::NoStoragePool, Some(49), "volume_list");
    expect_err(
        ctx.hv.volume_create(&name, "<volume><name>v</name><capacity>1</capacity></volume>"),
        ErrorKind::NoStoragePool,
        Some(49),
        "volume_create",
    );
}

fn missing_volume(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let e = expect_err(ctx.hv.volume_xml(&pool, "nothing.qcow2"), ErrorKind::NoStorageVol, Some(50), "volume_xml");
    assert!(e.message.contains("nothing.qcow2"), "{e}");
    expect_err(ctx.hv.volume_delete(&pool, "nothing.qcow2"), ErrorKind::NoStorageVol, Some(50), "volume_delete");
    assert!(ctx.hv.volume_list(&pool).unwrap().is_empty());
}

fn missing_domain(ctx: &Ctx) {
    let name = ctx.name("nodom");
    let e = expect_err(ctx.hv.domain_state(&name), ErrorKind::NoDomain, Some(42), "domain_state");
    if ctx.messages_name_objects() {
        assert!(e.message.contains(&name), "{e}");
    }
    expect_err(ctx.hv.domain_xml(&name), ErrorKind::NoDomain, Some(42), "domain_xml");
    expect_err(ctx.hv.domain_start(&name), ErrorKind::NoDomain, Some(42), "domain_start");
    expect_err(ctx.hv.domain_destroy(&name), ErrorKind::NoDomain, Some(42), "domain_destroy");
    expect_err(ctx.hv.domain_undefine(&name, UndefineFlags::all()), ErrorKind::NoDomain, Some(42), "domain_undefine");
    expect_err(ctx.hv.domain_set_autostart(&name, true), ErrorKind::NoDomain, Some(42), "domain_set_autostart");
}

fn network_lifecycle(ctx: &Ctx) {
    let name = ctx.network("net", false);
    assert!(ctx.hv.network_list().unwrap().contains(&name));
    assert!(!ctx.hv.network_is_active(&name).unwrap());
    ctx.hv.network_start(&name).unwrap();
    assert!(ctx.hv.network_is_active(&name).unwrap());
    expect_err(ctx.hv.network_start(&name), ErrorKind::OperationInvalid, Some(55), "start a running network");
    ctx.hv.network_stop(&name).unwrap();
    assert!(!ctx.hv.network_is_active(&name).unwrap());
    ctx.hv.network_undefine(&name).unwrap();
    expect_err(ctx.hv.network_xml(&name), ErrorKind::NoNetwork, Some(43), "undefined network");
}

fn network_stop_inactive(ctx: &Ctx) {
    let name = ctx.network("net", false);
    expect_err(ctx.hv.network_stop(&name), ErrorKind::OperationInvalid, Some(55), "stop an inactive network");
}

fn network_duplicate(ctx: &Ctx) {
    let name = ctx.network("net", false);
    let again = network_xml(&name, &ctx.bridge("other"), ctx.subnet(), None);
    let e = expect_err(ctx.hv.network_define(&again), ErrorKind::OperationFailed, Some(9), "define a network twice");
    assert!(e.message.contains(&name), "{e}");
}

fn network_xml_read_back(ctx: &Ctx) {
    let name = ctx.network("net", true);
    let xml = ctx.hv.network_xml(&name).unwrap();
    let s = ctx.subnet();
    assert_eq!(text_of(&xml, "name").as_deref(), Some(name.as_str()), "{xml}");
    assert_eq!(text_of(&xml, "uuid").map(|u| u.len()), Some(36), "{xml}");
    assert_eq!(attr_of(&xml, "bridge", "name"), Some(ctx.bridge("net")), "{xml}");
    assert_eq!(attr_of(&xml, "ip", "address"), Some(format!("10.231.{s}.1")), "{xml}");
    assert_eq!(attr_of(&xml, "ip", "netmask").as_deref(), Some("255.255.255.0"), "{xml}");
    assert_eq!(attr_of(&xml, "range", "start"), Some(format!("10.231.{s}.100")), "{xml}");
    assert_eq!(attr_of(&xml, "range", "end"), Some(format!("10.231.{s}.200")), "{xml}");
}

fn pool_lifecycle(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    assert!(ctx.hv.pool_list().unwrap().contains(&pool));
    assert!(ctx.hv.pool_is_active(&pool).unwrap());
    expect_err(ctx.hv.pool_start(&pool), ErrorKind::OperationInvalid, Some(55), "start an active pool");
    expect_err(ctx.hv.pool_undefine(&pool), ErrorKind::OperationInvalid, Some(55), "undefine an active pool");
    ctx.hv.pool_refresh(&pool).unwrap();
    let xml = ctx.hv.pool_xml(&pool).unwrap();
    assert_eq!(text_of(&xml, "path"), Some(ctx.pool_dir(&pool)), "{xml}");
    assert_eq!(attr_of(&xml, "pool", "type").as_deref(), Some("dir"), "{xml}");
    ctx.hv.pool_stop(&pool).unwrap();
    assert!(!ctx.hv.pool_is_active(&pool).unwrap());
    let vol =
        "<volume><name>v.raw</name><capacity unit='KiB'>4</capacity><target><format type='raw'/></target></volume>";
    expect_err(
        ctx.hv.volume_create(&pool, vol),
        ErrorKind::OperationInvalid,
        Some(55),
        "create a volume in an inactive pool",
    );
    expect_err(ctx.hv.volume_list(&pool), ErrorKind::OperationInvalid, Some(55), "list volumes of an inactive pool");
    expect_err(ctx.hv.pool_stop(&pool), ErrorKind::OperationInvalid, Some(55), "stop an inactive pool");
    ctx.hv.pool_undefine(&pool).unwrap();
    expect_err(ctx.hv.pool_xml(&pool), ErrorKind::NoStoragePool, Some(49), "undefined pool");
}

fn pool_duplicate(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let other_dir = std::env::temp_dir().join(ctx.name("pool-other"));
    let xml =
        format!("<pool type='dir'><name>{pool}</name><target><path>{}</path></target></pool>", other_dir.display());
    let e = expect_err(ctx.hv.pool_define(&xml), ErrorKind::OperationFailed, Some(9), "define a pool twice");
    assert!(e.message.contains(&pool), "{e}");
}

fn volume_backing_store(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let base = ctx.volume(&pool, "<volume><name>base.qcow2</name><capacity unit='MiB'>16</capacity><target><format type='qcow2'/></target></volume>");
    let base_path = format!("{}/{base}", ctx.pool_dir(&pool));
    let overlay_xml = format!(
        "<volume><name>overlay.qcow2</name><capacity unit='MiB'>32</capacity><target><format type='qcow2'/></target>\
         <backingStore><path>{base_path}</path><format type='qcow2'/></backingStore></volume>"
    );
    let overlay = ctx.volume(&pool, &overlay_xml);
    let mut names = ctx.hv.volume_list(&pool).unwrap();
    names.sort();
    assert_eq!(names, ["base.qcow2", "overlay.qcow2"]);
    let xml = ctx.hv.volume_xml(&pool, &overlay).unwrap();
    assert_eq!(text_of(&xml, "name").as_deref(), Some("overlay.qcow2"), "{xml}");
    assert_eq!(text_of(&xml, "capacity").as_deref(), Some("33554432"), "{xml}");
    assert_eq!(text_of(&xml, "path"), Some(format!("{}/overlay.qcow2", ctx.pool_dir(&pool))), "{xml}");
    assert_eq!(attr_of(&xml, "format", "type").as_deref(), Some("qcow2"), "{xml}");
    let backing = &xml[xml.find("<backingStore").expect("backingStore in volume XML")..];
    assert_eq!(text_of(backing, "path"), Some(base_path), "{xml}");
    assert_eq!(attr_of(backing, "format", "type").as_deref(), Some("qcow2"), "{xml}");
}

fn volume_duplicate(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let xml = "<volume><name>dup.qcow2</name><capacity unit='MiB'>1</capacity><target><format type='qcow2'/></target></volume>";
    ctx.volume(&pool, xml);
    expect_err(ctx.hv.volume_create(&pool, xml), ErrorKind::StorageVolExists, Some(90), "create a volume twice");
}

fn volume_upload_download(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let xml = format!(
        "<volume><name>seed.iso</name><capacity unit='bytes'>{}</capacity><target><format type='raw'/></target></volume>",
        bytes.len()
    );
    let vol = ctx.volume(&pool, &xml);
    ctx.hv.volume_upload(&pool, &vol, &bytes).unwrap();
    let back = ctx.hv.volume_download(&pool, &vol).unwrap();
    assert_eq!(back.len(), bytes.len());
    assert!(back == bytes, "downloaded bytes differ from uploaded ones");
}

/// A source that gives `data` at most `step` bytes a read, then fails with
/// `fail` if set, else ends.
struct Chunked<'a> {
    data: &'a [u8],
    step: usize,
    fail: Option<&'static str>,
}

impl std::io::Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.data.is_empty()
            && let Some(why) = self.fail
        {
            return Err(std::io::Error::other(why));
        }
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn raw_volume_xml(name: &str, bytes: usize) -> String {
    format!(
        "<volume><name>{name}</name><capacity unit='bytes'>{bytes}</capacity><allocation unit='bytes'>0</allocation><target><format type='raw'/></target></volume>"
    )
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()
}

/// A few MiB sent in odd-sized chunks read back byte for byte.
fn volume_upload_streamed(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let bytes = pattern(3 * 1024 * 1024 + 4321);
    let vol = ctx.volume(&pool, &raw_volume_xml("streamed.img", bytes.len()));
    let mut source = Chunked { data: &bytes, step: 100_003, fail: None };
    ctx.hv.volume_upload_from(&pool, &vol, bytes.len() as u64, &mut source).unwrap();
    let back = ctx.hv.volume_download(&pool, &vol).unwrap();
    assert_eq!(back.len(), bytes.len());
    assert!(back == bytes, "downloaded bytes differ from the streamed ones");
}

/// A source that ends before the announced length: the upload fails and the
/// stream is aborted, not finished (libvirtd would finish it without a word).
fn volume_upload_short(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let bytes = pattern(512 * 1024);
    let vol = ctx.volume(&pool, &raw_volume_xml("short.img", 1024 * 1024));
    let mut source = Chunked { data: &bytes, step: 64 * 1024, fail: None };
    let err = ctx.hv.volume_upload_from(&pool, &vol, 1024 * 1024, &mut source).unwrap_err();
    let err = expect_err::<()>(Err(err), ErrorKind::Other, Some(0), "a source short of the stream's length");
    assert!(err.message.contains("524288 of the 1048576 bytes announced"), "{err}");
    ctx.hv.volume_xml(&pool, &vol).unwrap();
}

/// A source that goes on past the announced length: what goes past is never
/// sent (libvirtd 11 exits on it) and the upload fails; the daemon answers.
fn volume_upload_past_length(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let bytes = pattern(256 * 1024);
    let vol = ctx.volume(&pool, &raw_volume_xml("long.img", 256 * 1024));
    let mut source = Chunked { data: &bytes, step: 48 * 1024, fail: None };
    let err = ctx.hv.volume_upload_from(&pool, &vol, 128 * 1024, &mut source).unwrap_err();
    let err = expect_err::<()>(Err(err), ErrorKind::Other, Some(0), "a source past the stream's length");
    assert!(err.message.contains("more than the 131072 bytes announced"), "{err}");
    ctx.hv.volume_xml(&pool, &vol).unwrap();
}

/// An upload larger than the volume is not refused: the file, and so the raw
/// volume's capacity, grows to what was written.
fn volume_upload_larger_than_volume(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let bytes = pattern(64 * 1024);
    let vol = ctx.volume(&pool, &raw_volume_xml("small.img", 4096));
    let mut source = Chunked { data: &bytes, step: 16 * 1024, fail: None };
    ctx.hv.volume_upload_from(&pool, &vol, bytes.len() as u64, &mut source).unwrap();
    let back = ctx.hv.volume_download(&pool, &vol).unwrap();
    assert!(back == bytes, "{} bytes read back, not the {} uploaded", back.len(), bytes.len());
    // libvirtd refreshes the pool when the upload's stream closes, on a thread of its own.
    let grown = wait_for(Duration::from_secs(10), || {
        let xml = ctx.hv.volume_xml(&pool, &vol).unwrap();
        (text_of(&xml, "capacity").as_deref() == Some("65536")).then_some(())
    });
    assert!(grown.is_some(), "{}", ctx.hv.volume_xml(&pool, &vol).unwrap());
}

/// A source that fails aborts the stream: the call fails with the source's error.
fn volume_upload_source_fails(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let bytes = pattern(300 * 1024);
    let vol = ctx.volume(&pool, &raw_volume_xml("failing.img", 1024 * 1024));
    let mut source = Chunked { data: &bytes, step: 64 * 1024, fail: Some("the download broke off") };
    let err = ctx.hv.volume_upload_from(&pool, &vol, 1024 * 1024, &mut source).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Other, "{err}");
    assert!(
        err.message.starts_with("reading the upload's source") && err.message.contains("the download broke off"),
        "{err}"
    );
    // The call returned: the connection still works.
    ctx.hv.volume_xml(&pool, &vol).unwrap();
}

fn volume_delete(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let vol = ctx.hv.volume_create(&pool, "<volume><name>gone.raw</name><capacity unit='KiB'>4</capacity><target><format type='raw'/></target></volume>").unwrap();
    ctx.hv.volume_delete(&pool, &vol).unwrap();
    expect_err(ctx.hv.volume_xml(&pool, &vol), ErrorKind::NoStorageVol, Some(50), "deleted volume");
    assert!(ctx.hv.volume_list(&pool).unwrap().is_empty());
}

fn host(mac: &str, name: &str, ip: &str) -> String {
    format!("<host mac='{mac}' name='{name}' ip='{ip}'/>")
}

fn dhcp_host_add(ctx: &Ctx) {
    let net = ctx.network("net", true);
    let s = ctx.subnet();
    ctx.hv
        .network_update_dhcp_host(
            &net,
            NetworkUpdateCommand::AddLast,
            &host("52:54:00:10:00:01", "m1", &format!("10.231.{s}.150")),
        )
        .unwrap();
    let xml = ctx.hv.network_xml(&net).unwrap();
    assert_eq!(attr_of(&xml, "host", "mac").as_deref(), Some("52:54:00:10:00:01"), "{xml}");
    assert_eq!(attr_of(&xml, "host", "name").as_deref(), Some("m1"), "{xml}");
    assert_eq!(attr_of(&xml, "host", "ip"), Some(format!("10.231.{s}.150")), "{xml}");
}

/// What an endpoint from a libvirt network relies on: an entry per address (a second
/// entry with the same address is refused, one with the same name is not); a delete
/// matches an entry on its address or any of its names and is refused, deleting
/// nothing, when no entry or several match.
fn dns_hosts(ctx: &Ctx) {
    let net = ctx.network("net", true);
    let s = ctx.subnet();
    let entry = |ip: u8, name: &str| format!("<host ip='10.231.{s}.{ip}'><hostname>{name}</hostname></host>");
    let listed = || -> Vec<(String, Vec<String>)> {
        let info = capl_host::network_xml::parse_network(&ctx.hv.network_xml(&net).unwrap()).unwrap();
        info.dns_hosts.iter().map(|h| (h.ip.unwrap().to_string(), h.hostnames.clone())).collect()
    };
    ctx.hv.network_update_dns_host(&net, NetworkUpdateCommand::AddLast, &entry(250, "ours")).unwrap();
    let e = expect_err(
        ctx.hv.network_update_dns_host(&net, NetworkUpdateCommand::AddLast, &entry(250, "theirs")),
        ErrorKind::OperationInvalid,
        Some(55),
        "same address",
    );
    assert!(e.message.contains("matching field") && e.message.contains(&net), "{e}");
    ctx.hv.network_update_dns_host(&net, NetworkUpdateCommand::AddLast, &entry(251, "theirs")).unwrap();
    ctx.hv.network_update_dns_host(&net, NetworkUpdateCommand::AddLast, &entry(252, "theirs")).unwrap();
    let e = expect_err(
        ctx.hv.network_update_dns_host(&net, NetworkUpdateCommand::Delete, &entry(250, "theirs")),
        ErrorKind::OperationInvalid,
        Some(55),
        "address of one entry, name of two others",
    );
    assert!(e.message.contains("multiple matching DNS HOST records"), "{e}");
    let e = expect_err(
        ctx.hv.network_update_dns_host(&net, NetworkUpdateCommand::Delete, &entry(253, "nobody")),
        ErrorKind::OperationInvalid,
        Some(55),
        "no entry",
    );
    assert!(e.message.contains("couldn't locate a matching DNS HOST record"), "{e}");
    assert_eq!(listed().len(), 3, "a refused delete deletes nothing: {:?}", listed());
    ctx.hv.network_update_dns_host(&net, NetworkUpdateCommand::Delete, &entry(250, "ours")).unwrap();
    let theirs = vec!["theirs".to_string()];
    assert_eq!(listed(), vec![(format!("10.231.{s}.251"), theirs.clone()), (format!("10.231.{s}.252"), theirs)]);
}

fn dhcp_host_duplicate(ctx: &Ctx) {
    let net = ctx.network("net", true);
    let s = ctx.subnet();
    ctx.hv
        .network_update_dhcp_host(
            &net,
            NetworkUpdateCommand::AddLast,
            &host("52:54:00:10:00:01", "m1", &format!("10.231.{s}.150")),
        )
        .unwrap();
    let same_mac = host("52:54:00:10:00:01", "m2", &format!("10.231.{s}.151"));
    let e = expect_err(
        ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::AddLast, &same_mac),
        ErrorKind::OperationInvalid,
        Some(55),
        "same MAC",
    );
    assert!(e.message.contains(&net), "{e}");
    let same_ip = host("52:54:00:10:00:02", "m2", &format!("10.231.{s}.150"));
    expect_err(
        ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::AddLast, &same_ip),
        ErrorKind::OperationInvalid,
        Some(55),
        "same IP",
    );
    let same_name = host("52:54:00:10:00:03", "m1", &format!("10.231.{s}.152"));
    expect_err(
        ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::AddLast, &same_name),
        ErrorKind::OperationInvalid,
        Some(55),
        "same name",
    );
}

fn dhcp_host_outside_subnet(ctx: &Ctx) {
    // libvirt does not check a reservation's IP against the network: callers must.
    let net = ctx.network("net", true);
    ctx.hv
        .network_update_dhcp_host(&net, NetworkUpdateCommand::AddLast, &host("52:54:00:10:00:09", "far", "10.99.99.9"))
        .unwrap();
    let xml = ctx.hv.network_xml(&net).unwrap();
    assert_eq!(attr_of(&xml, "host", "ip").as_deref(), Some("10.99.99.9"), "{xml}");
}

fn dhcp_host_malformed(ctx: &Ctx) {
    let net = ctx.network("net", true);
    let s = ctx.subnet();
    let bad_mac = format!("<host mac='zz:54:00' name='m1' ip='10.231.{s}.150'/>");
    expect_err(
        ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::AddLast, &bad_mac),
        ErrorKind::XmlError,
        Some(27),
        "bad MAC",
    );
    let bad_ip = "<host mac='52:54:00:10:00:01' name='m1' ip='10.231.1.999'/>";
    expect_err(
        ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::AddLast, bad_ip),
        ErrorKind::XmlError,
        Some(27),
        "bad IP",
    );
    let no_ip = "<host mac='52:54:00:10:00:01' name='m1'/>";
    expect_err(
        ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::AddLast, no_ip),
        ErrorKind::XmlError,
        Some(27),
        "no IP",
    );
    let broken = "<host mac='52:54:00:10:00:01' ";
    expect_err(
        ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::AddLast, broken),
        ErrorKind::XmlError,
        None,
        "broken XML",
    );
    let xml = ctx.hv.network_xml(&net).unwrap();
    assert!(!xml.contains("<host "), "a refused host was added:\n{xml}");
}

fn dhcp_host_remove(ctx: &Ctx) {
    let net = ctx.network("net", true);
    let s = ctx.subnet();
    let h = host("52:54:00:10:00:01", "m1", &format!("10.231.{s}.150"));
    ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::AddLast, &h).unwrap();
    ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::Delete, &h).unwrap();
    let xml = ctx.hv.network_xml(&net).unwrap();
    assert!(!xml.contains("<host "), "{xml}");
    let e = expect_err(
        ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::Delete, &h),
        ErrorKind::OperationInvalid,
        Some(55),
        "delete twice",
    );
    assert!(e.message.contains(&net), "{e}");
}

fn dhcp_host_inactive_network(ctx: &Ctx) {
    let net = ctx.network("net", false);
    let s = ctx.subnet();
    ctx.hv
        .network_update_dhcp_host(
            &net,
            NetworkUpdateCommand::AddLast,
            &host("52:54:00:10:00:01", "m1", &format!("10.231.{s}.150")),
        )
        .unwrap();
    ctx.hv.network_start(&net).unwrap();
    let xml = ctx.hv.network_xml(&net).unwrap();
    assert_eq!(attr_of(&xml, "host", "mac").as_deref(), Some("52:54:00:10:00:01"), "{xml}");
}

const META: &str = "<capl:machine xmlns:capl=\"https://capl.example/v1\">default/worker-0</capl:machine>";

fn domain_define_read_back(ctx: &Ctx) {
    let name = ctx.name("dom");
    let uuid = "5f0c3c1e-0d7e-4a39-9a6c-0123456789ab";
    ctx.define(&domain_xml(&name, Some(uuid), Some(META), ""));
    assert!(ctx.hv.domain_list().unwrap().contains(&name));
    assert_eq!(ctx.hv.domain_state(&name).unwrap(), DomainState::Shutoff);
    let xml = ctx.hv.domain_xml(&name).unwrap();
    assert_eq!(attr_of(&xml, "domain", "type").as_deref(), Some("qemu"), "{xml}");
    assert_eq!(text_of(&xml, "uuid").as_deref(), Some(uuid), "{xml}");
    assert_eq!(text_of(&xml, "capl:machine").as_deref(), Some("default/worker-0"), "metadata not kept:\n{xml}");
    assert!(xml.contains("https://capl.example/v1"), "metadata namespace not kept:\n{xml}");
    assert_eq!(text_of(&xml, "memory").as_deref(), Some("32768"), "{xml}");
    assert!(!ctx.hv.domain_autostart(&name).unwrap());
}

/// Placement reads this: the host's memory, and the maximum memory of every
/// defined domain (stopped ones too) as committed.
fn node_memory_counts_defined_domains(ctx: &Ctx) {
    const MIB_32: u64 = 32 << 20;
    let m = ctx.hv.node_memory().unwrap();
    assert!(m.total > 0 && m.free > 0 && m.free <= m.total, "{m:?}");
    assert!(m.available() <= m.free, "{m:?}");
    // Other tests may define or undefine domains on a shared daemon at the same
    // time: one of a few attempts must see exactly this domain's 32 MiB come and go.
    let mut seen = Vec::new();
    for attempt in 0..4 {
        let before = ctx.hv.node_memory().unwrap().committed;
        let name = ctx.define(&domain_xml(&ctx.name(&format!("mem{attempt}")), None, None, ""));
        let defined = ctx.hv.node_memory().unwrap().committed;
        ctx.hv.domain_undefine(&name, UndefineFlags::default()).unwrap();
        let after = ctx.hv.node_memory().unwrap().committed;
        if defined.checked_sub(before) == Some(MIB_32) && defined.checked_sub(after) == Some(MIB_32) {
            return;
        }
        seen.push((before, defined, after));
    }
    panic!("a defined 32 MiB domain never showed as 32 MiB more committed memory: (before, defined, after) {seen:?}");
}

fn domain_duplicate(ctx: &Ctx) {
    let name = ctx.name("dom");
    ctx.define(&domain_xml(&name, Some("5f0c3c1e-0d7e-4a39-9a6c-0123456789a1"), None, ""));
    let other_uuid = domain_xml(&name, Some("5f0c3c1e-0d7e-4a39-9a6c-0123456789a2"), None, "");
    let e = expect_err(ctx.hv.domain_define(&other_uuid), ErrorKind::OperationFailed, Some(9), "same name, other uuid");
    assert!(e.message.contains(&name), "{e}");
    let other_name = ctx.name("dom2");
    let same_uuid = domain_xml(&other_name, Some("5f0c3c1e-0d7e-4a39-9a6c-0123456789a1"), None, "");
    let result = ctx.hv.domain_define(&same_uuid);
    if result.is_ok() {
        ctx.forget_domain_later(&other_name);
    }
    expect_err(result, ErrorKind::OperationFailed, Some(9), "same uuid, other name");
}

fn domain_malformed(ctx: &Ctx) {
    let name = ctx.name("dom");
    let broken = format!("<domain type='qemu'><name>{name}</name");
    expect_err(ctx.hv.domain_define(&broken), ErrorKind::XmlError, None, "broken XML");
    let no_name = "<domain type='qemu'><memory unit='MiB'>32</memory><os><type>hvm</type></os></domain>";
    expect_err(ctx.hv.domain_define(no_name), ErrorKind::Other, Some(21), "no name (VIR_ERR_NO_NAME)");
    assert!(!ctx.hv.domain_list().unwrap().contains(&name));
}

fn domain_start_destroy(ctx: &Ctx) {
    let name = ctx.define(&domain_xml(&ctx.name("dom"), None, None, ""));
    ctx.hv.domain_start(&name).unwrap();
    assert_eq!(ctx.hv.domain_state(&name).unwrap(), DomainState::Running);
    ctx.hv.domain_destroy(&name).unwrap();
    assert_eq!(ctx.hv.domain_state(&name).unwrap(), DomainState::Shutoff);
    expect_err(ctx.hv.domain_destroy(&name), ErrorKind::OperationInvalid, Some(55), "destroy a stopped domain");
}

fn domain_start_twice(ctx: &Ctx) {
    let name = ctx.define(&domain_xml(&ctx.name("dom"), None, None, ""));
    ctx.hv.domain_start(&name).unwrap();
    expect_err(ctx.hv.domain_start(&name), ErrorKind::OperationInvalid, Some(55), "start twice");
    assert_eq!(ctx.hv.domain_state(&name).unwrap(), DomainState::Running);
}

fn domain_undefine_all_flags(ctx: &Ctx) {
    let name = ctx.define(&domain_xml(&ctx.name("dom"), None, None, ""));
    ctx.hv.domain_undefine(&name, UndefineFlags::all()).unwrap();
    expect_err(ctx.hv.domain_state(&name), ErrorKind::NoDomain, Some(42), "undefined domain");
}

fn domain_undefine(ctx: &Ctx) {
    let stopped = ctx.define(&domain_xml(&ctx.name("stopped"), None, None, ""));
    ctx.hv.domain_undefine(&stopped, UndefineFlags::default()).unwrap();
    expect_err(ctx.hv.domain_state(&stopped), ErrorKind::NoDomain, Some(42), "undefined domain");
    let running = ctx.define(&domain_xml(&ctx.name("running"), None, None, ""));
    ctx.hv.domain_start(&running).unwrap();
    ctx.hv.domain_undefine(&running, UndefineFlags::default()).unwrap();
    assert_eq!(
        ctx.hv.domain_state(&running).unwrap(),
        DomainState::Running,
        "a running domain survives undefine as transient"
    );
    ctx.hv.domain_destroy(&running).unwrap();
    expect_err(ctx.hv.domain_state(&running), ErrorKind::NoDomain, Some(42), "a destroyed transient domain is gone");
}

fn domain_autostart(ctx: &Ctx) {
    let name = ctx.define(&domain_xml(&ctx.name("dom"), None, None, ""));
    assert!(!ctx.hv.domain_autostart(&name).unwrap());
    ctx.hv.domain_set_autostart(&name, true).unwrap();
    assert!(ctx.hv.domain_autostart(&name).unwrap());
    ctx.hv.domain_set_autostart(&name, false).unwrap();
    assert!(!ctx.hv.domain_autostart(&name).unwrap());
}

fn domain_autostart_transient(ctx: &Ctx) {
    let name = ctx.define(&domain_xml(&ctx.name("dom"), None, None, ""));
    ctx.hv.domain_start(&name).unwrap();
    ctx.hv.domain_undefine(&name, UndefineFlags::default()).unwrap();
    expect_err(
        ctx.hv.domain_set_autostart(&name, true),
        ErrorKind::OperationInvalid,
        Some(55),
        "autostart on a transient domain",
    );
}

fn domain_redefine(ctx: &Ctx) {
    let name = ctx.name("dom");
    let uuid = "5f0c3c1e-0d7e-4a39-9a6c-0123456789b0";
    ctx.define(&domain_xml(&name, Some(uuid), Some(META), ""));
    let changed = META.replace("worker-0", "worker-1");
    assert_eq!(ctx.hv.domain_define(&domain_xml(&name, Some(uuid), Some(&changed), "")).unwrap(), name);
    let xml = ctx.hv.domain_xml(&name).unwrap();
    assert_eq!(text_of(&xml, "capl:machine").as_deref(), Some("default/worker-1"), "{xml}");
    assert_eq!(ctx.hv.domain_list().unwrap().iter().filter(|n| **n == name).count(), 1);
}

fn domain_start_inactive_network(ctx: &Ctx) {
    let net = ctx.network("net", false);
    let name = ctx.define(&domain_xml(&ctx.name("dom"), None, None, &interface_xml(&net, "52:54:00:10:00:21")));
    let e =
        expect_err(ctx.hv.domain_start(&name), ErrorKind::OperationInvalid, Some(55), "start on an inactive network");
    assert!(e.message.contains(&net), "{e}");
    assert_eq!(ctx.hv.domain_state(&name).unwrap(), DomainState::Shutoff);
}

fn domain_start_missing_network(ctx: &Ctx) {
    let net = ctx.name("nonet");
    let name = ctx.define(&domain_xml(&ctx.name("dom"), None, None, &interface_xml(&net, "52:54:00:10:00:22")));
    let e = expect_err(ctx.hv.domain_start(&name), ErrorKind::NoNetwork, Some(43), "start on a missing network");
    assert!(e.message.contains(&net), "{e}");
}

fn leases_missing_network(ctx: &Ctx) {
    expect_err(ctx.hv.network_dhcp_leases(&ctx.name("nonet")), ErrorKind::NoNetwork, Some(43), "leases");
}

fn lease_for_reserved_mac(ctx: &Ctx) {
    let net = ctx.network("net", true);
    let s = ctx.subnet();
    let mac = "52:54:00:10:00:31";
    let ip = format!("10.231.{s}.177");
    ctx.hv.network_update_dhcp_host(&net, NetworkUpdateCommand::AddLast, &host(mac, "guest", &ip)).unwrap();
    // A bootable disk: the tiny guest on a real host (it asks for DHCP once booted).
    let pool = ctx.pool("pool");
    let image = ctx.guest_image();
    let vol = ctx.volume(&pool, &format!("<volume><name>guest.qcow2</name><capacity unit='bytes'>{}</capacity><target><format type='raw'/></target></volume>", image.len()));
    ctx.hv.volume_upload(&pool, &vol, &image).unwrap();
    let vol_xml = ctx.hv.volume_xml(&pool, &vol).unwrap();
    let disk_path = text_of(&vol_xml, "path").expect("volume path");
    let devices = format!(
        "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{disk_path}'/><target dev='vda' bus='virtio'/></disk>{}<serial type='pty'/>",
        interface_xml(&net, mac)
    );
    let xml = domain_xml(&ctx.name("dom"), None, None, &devices)
        .replace("<memory unit='MiB'>32</memory>", "<memory unit='MiB'>256</memory>");
    let name = ctx.define(&xml);
    ctx.hv.domain_start(&name).unwrap();
    // The guest waits up to 20 s for a seed ISO it does not get here, then asks for DHCP.
    let lease = wait_for(Duration::from_secs(180), || {
        ctx.hv.network_dhcp_leases(&net).unwrap().into_iter().find(|l| l.mac == mac)
    })
    .unwrap_or_else(|| panic!("no lease for {mac} on {net} within 180 s"));
    assert_eq!(lease.ip, ip);
    assert_eq!(lease.prefix, 24);
    ctx.hv.domain_destroy(&name).unwrap();
    // dnsmasq keeps a lease until it expires; a destroyed guest releases nothing.
    let after = ctx.hv.network_dhcp_leases(&net).unwrap();
    assert!(after.iter().any(|l| l.mac == mac && l.ip == ip), "the lease outlives the domain: {after:?}");
}

fn network_undefine_active(ctx: &Ctx) {
    let net = ctx.network("net", true);
    ctx.hv.network_undefine(&net).unwrap();
    assert!(ctx.hv.network_is_active(&net).unwrap(), "an active network survives undefine as transient");
    assert!(ctx.hv.network_list().unwrap().contains(&net));
    ctx.hv.network_stop(&net).unwrap();
    expect_err(ctx.hv.network_xml(&net), ErrorKind::NoNetwork, Some(43), "a stopped transient network is gone");
}

fn pool_target_conflict(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let other = ctx.name("other");
    let xml =
        format!("<pool type='dir'><name>{other}</name><target><path>{}</path></target></pool>", ctx.pool_dir(&pool));
    let result = ctx.hv.pool_define(&xml);
    if result.is_ok() {
        let _ = ctx.hv.pool_undefine(&other);
    }
    expect_err(result, ErrorKind::OperationFailed, Some(9), "a second pool on the same directory");
}

fn volume_missing_backing(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let xml = format!(
        "<volume><name>orphan.qcow2</name><capacity unit='MiB'>8</capacity><target><format type='qcow2'/></target>\
         <backingStore><path>{}/absent.qcow2</path><format type='qcow2'/></backingStore></volume>",
        ctx.pool_dir(&pool)
    );
    let result = ctx.hv.volume_create(&pool, &xml);
    if let Ok(v) = &result {
        let _ = ctx.hv.volume_delete(&pool, v);
    }
    let e = expect_err(result, ErrorKind::Other, Some(38), "a backing store that does not exist");
    assert!(e.message.contains("absent.qcow2"), "{e}");
}

fn volume_raw_backing(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let base = ctx.volume(&pool, "<volume><name>base.qcow2</name><capacity unit='MiB'>8</capacity><target><format type='qcow2'/></target></volume>");
    let xml = format!(
        "<volume><name>raw-overlay</name><capacity unit='MiB'>8</capacity><target><format type='raw'/></target>\
         <backingStore><path>{}/{base}</path><format type='qcow2'/></backingStore></volume>",
        ctx.pool_dir(&pool)
    );
    let result = ctx.hv.volume_create(&pool, &xml);
    if let Ok(v) = &result {
        let _ = ctx.hv.volume_delete(&pool, v);
    }
    let e = expect_err(result, ErrorKind::NoSupport, Some(3), "a raw volume with a backing store");
    assert!(e.message.contains("backing storage not supported for raw volumes"), "{e}");
}

fn domain_unsupported_type(ctx: &Ctx) {
    let name = ctx.name("dom");
    let xml = domain_xml(&name, None, None, "").replace("type='qemu'", "type='xen'");
    let result = ctx.hv.domain_define(&xml);
    if result.is_ok() {
        ctx.forget_domain_later(&name);
    }
    expect_err(result, ErrorKind::Other, Some(67), "domain type xen");
}

fn domain_missing_disk(ctx: &Ctx) {
    let pool = ctx.pool("pool");
    let devices = format!(
        "<disk type='volume' device='disk'><driver name='qemu' type='qcow2'/><source pool='{pool}' volume='absent.qcow2'/><target dev='vda' bus='virtio'/></disk>"
    );
    let name = ctx.define(&domain_xml(&ctx.name("dom"), None, None, &devices));
    let e = expect_err(ctx.hv.domain_start(&name), ErrorKind::NoStorageVol, Some(50), "start with a missing volume");
    assert!(e.message.contains("absent.qcow2"), "{e}");
    assert_eq!(ctx.hv.domain_state(&name).unwrap(), DomainState::Shutoff);
}

/// How long one transition's events may take to arrive.
const EVENT_WAIT: Duration = Duration::from_secs(10);
/// How long to listen for events nobody expected after the last transition.
const EVENT_QUIET: Duration = Duration::from_millis(500);

/// Subscribes to the lifecycle events of this scenario's domains only (the real
/// libvirtd is shared with other runs).
fn subscribe_own_events(ctx: &Ctx) -> (EventSubscription, Receiver<DomainEvent>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let own = format!("{}-", ctx.prefix);
    let subscription = ctx
        .hv
        .subscribe_domain_events(Box::new(move |event: DomainEvent| {
            if event.domain.starts_with(&own) {
                let _ = tx.send(event);
            }
        }))
        .unwrap_or_else(|e| panic!("subscribe to lifecycle events: {e}"));
    (subscription, rx)
}

/// Waits (at most [`EVENT_WAIT`]) for as many events as `expected` lists and asserts they
/// are exactly those, in order: (domain, kind, detail).
fn expect_events<D: AsRef<str>>(rx: &Receiver<DomainEvent>, what: &str, expected: &[(D, DomainEventKind, i32)]) {
    let deadline = Instant::now() + EVENT_WAIT;
    let mut got = Vec::new();
    while got.len() < expected.len() {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(event) => got.push(event),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    let got: Vec<(String, DomainEventKind, i32)> = got.into_iter().map(|e| (e.domain, e.kind, e.detail)).collect();
    let expected: Vec<(String, DomainEventKind, i32)> =
        expected.iter().map(|(d, k, n)| (d.as_ref().to_string(), *k, *n)).collect();
    assert_eq!(got, expected, "lifecycle events of {what} (waited at most {EVENT_WAIT:?})");
}

/// Asserts no further event arrives within [`EVENT_QUIET`].
fn expect_no_more_events(rx: &Receiver<DomainEvent>, what: &str) {
    if let Ok(extra) = rx.recv_timeout(EVENT_QUIET) {
        panic!("an unexpected lifecycle event after {what}: {extra:?}");
    }
}

/// libvirt's detail codes (`virDomainEvent<Kind>DetailType` in libvirt-domain.h) the transitions report.
const DEFINED_ADDED: i32 = 0;
const DEFINED_UPDATED: i32 = 1;
const UNDEFINED_REMOVED: i32 = 0;
const STARTED_BOOTED: i32 = 0;
const RESUMED_UNPAUSED: i32 = 0;
const STOPPED_DESTROYED: i32 = 1;
const SHUTDOWN_HOST: i32 = 2;
const SHUTDOWN_GUEST: i32 = 1;
const STOPPED_SHUTDOWN: i32 = 0;
const SUSPENDED_PAUSED: i32 = 0;

/// The events of a start. QEMU starts with its CPUs paused and libvirt reports them
/// resumed (QEMU's RESUME event) before the domain started; the test driver has no
/// CPUs to resume (listed in libvirt-sim/README.md).
fn start_events(ctx: &Ctx, d: &str) -> Vec<(String, DomainEventKind, i32)> {
    let mut events = Vec::new();
    if ctx.backend != Backend::TestDriver {
        events.push((d.to_string(), DomainEventKind::Resumed, RESUMED_UNPAUSED));
    }
    events.push((d.to_string(), DomainEventKind::Started, STARTED_BOOTED));
    events
}

/// The events of a destroy. libvirt kills QEMU with SIGTERM first, and QEMU reports a
/// host-initiated shutdown before it exits; the test driver has no process to signal.
fn destroy_events(ctx: &Ctx, d: &str) -> Vec<(String, DomainEventKind, i32)> {
    let mut events = Vec::new();
    if ctx.backend != Backend::TestDriver {
        events.push((d.to_string(), DomainEventKind::Shutdown, SHUTDOWN_HOST));
    }
    events.push((d.to_string(), DomainEventKind::Stopped, STOPPED_DESTROYED));
    events
}

fn domain_lifecycle_events(ctx: &Ctx) {
    use DomainEventKind::{Defined, Undefined};
    let (subscription, rx) = subscribe_own_events(ctx);
    let name = ctx.define(&domain_xml(&ctx.name("dom"), None, None, ""));
    let d = name.as_str();
    expect_events(&rx, "define", &[(d, Defined, DEFINED_ADDED)]);
    ctx.hv.domain_start(d).unwrap();
    expect_events(&rx, "start", &start_events(ctx, d));
    ctx.hv.domain_destroy(d).unwrap();
    expect_events(&rx, "destroy", &destroy_events(ctx, d));
    ctx.hv.domain_start(d).unwrap();
    expect_events(&rx, "start again", &start_events(ctx, d));
    // Undefining a running domain leaves it running, transient; destroying it then
    // removes it without another Undefined event.
    ctx.hv.domain_undefine(d, UndefineFlags::default()).unwrap();
    expect_events(&rx, "undefine while running", &[(d, Undefined, UNDEFINED_REMOVED)]);
    ctx.hv.domain_destroy(d).unwrap();
    expect_events(&rx, "destroy of the now transient domain", &destroy_events(ctx, d));
    // Define, redefine (an update of the same domain: same name and UUID) and undefine a
    // stopped domain.
    let uuid = "5f0c3c1e-0d7e-4a39-9a6c-0123456789c1";
    let again = ctx.define(&domain_xml(&ctx.name("dom"), Some(uuid), None, ""));
    assert_eq!(again, name);
    expect_events(&rx, "define after removal", &[(d, Defined, DEFINED_ADDED)]);
    let changed = "<c:x xmlns:c='urn:capl:conformance'>1</c:x>";
    assert_eq!(ctx.hv.domain_define(&domain_xml(d, Some(uuid), Some(changed), "")).unwrap(), name);
    expect_events(&rx, "redefine", &[(d, Defined, DEFINED_UPDATED)]);
    ctx.hv.domain_undefine(d, UndefineFlags::default()).unwrap();
    expect_events(&rx, "undefine while stopped", &[(d, Undefined, UNDEFINED_REMOVED)]);
    expect_no_more_events(&rx, "the last transition");
    // After the subscription is dropped, transitions deliver nothing more.
    drop(subscription);
    ctx.define(&domain_xml(&ctx.name("after"), None, None, ""));
    expect_no_more_events(&rx, "dropping the subscription");
}

/// A domain defined and started while subscribed to events, its define and
/// start events already seen: (subscription, receiver, domain name).
fn started_with_events(ctx: &Ctx) -> (EventSubscription, Receiver<DomainEvent>, String) {
    let (subscription, rx) = subscribe_own_events(ctx);
    let name = ctx.define(&domain_xml(&ctx.name("dom"), None, None, ""));
    ctx.hv.domain_start(&name).unwrap();
    let mut expected = vec![(name.clone(), DomainEventKind::Defined, DEFINED_ADDED)];
    expected.extend(start_events(ctx, &name));
    expect_events(&rx, "define and start", &expected);
    (subscription, rx, name)
}

/// A reset (`virDomainReset`) restarts the guest where it is: the domain keeps its
/// state (QEMU's system_reset leaves a paused domain paused), and libvirt reports no
/// lifecycle event for it (only `VIR_DOMAIN_EVENT_ID_REBOOT`). A shut-off domain cannot
/// be reset.
fn domain_reset(ctx: &Ctx) {
    let (_subscription, rx, name) = started_with_events(ctx);
    let d = name.as_str();
    ctx.hv.domain_reset(d).unwrap();
    assert_eq!(ctx.hv.domain_state(d).unwrap(), DomainState::Running);
    expect_no_more_events(&rx, "the reset of a running domain");
    ctx.hv.domain_suspend(d).unwrap();
    expect_events(&rx, "suspend", &[(d, DomainEventKind::Suspended, SUSPENDED_PAUSED)]);
    ctx.hv.domain_reset(d).unwrap();
    assert_eq!(ctx.hv.domain_state(d).unwrap(), DomainState::Paused, "a reset keeps a paused domain paused");
    expect_no_more_events(&rx, "the reset of a paused domain");
    ctx.hv.domain_destroy(d).unwrap();
    expect_events(&rx, "destroy", &destroy_events(ctx, d));
    expect_err(ctx.hv.domain_reset(d), ErrorKind::OperationInvalid, Some(55), "reset a stopped domain");
    assert_eq!(ctx.hv.domain_state(d).unwrap(), DomainState::Shutoff);
    expect_err(ctx.hv.domain_reset(&ctx.name("nodom")), ErrorKind::NoDomain, Some(42), "reset a missing domain");
    expect_no_more_events(&rx, "the refused resets");
}

/// A guest that powers off when asked: QEMU reports the guest's own shutdown, then the
/// process ends (libvirt-sim models QEMU's pair; the test driver reports the stop only).
fn domain_guest_shutdown_events(ctx: &Ctx) {
    let (_subscription, rx, name) = started_with_events(ctx);
    let d = name.as_str();
    ctx.hv.domain_shutdown(d).unwrap();
    let mut expected = Vec::new();
    if ctx.backend != Backend::TestDriver {
        expected.push((d.to_string(), DomainEventKind::Shutdown, SHUTDOWN_GUEST));
    }
    expected.push((d.to_string(), DomainEventKind::Stopped, STOPPED_SHUTDOWN));
    expect_events(&rx, "guest shutdown", &expected);
    assert_eq!(ctx.hv.domain_state(d).unwrap(), DomainState::Shutoff);
    expect_no_more_events(&rx, "the guest shutdown");
}
