//! Host tests only the simulator can do: the libvirt call counts of a create,
//! a steady-state check and a delete, immediate leases, and connection faults.
//! (The host scenarios both backends run are in `host_scenarios.rs`.)

use capl_host::hypervisor::Hypervisor;
use capl_host::hypervisor::sim::SimHypervisor;
use capl_host::{CreateStep, MachineAddress, create_machine, delete_machine, run_create_steps, start_machine};
use capl_host_test_support::host::{Fixture, IMAGE_BYTES, ensure_base_image, spec, user_data};
use libvirt_sim::Host;

const NETWORK_XML: &str = "<network><name>capl-test-net</name><forward mode='nat'/><bridge name='virbr-sim'/>\
    <ip address='192.168.150.1' netmask='255.255.255.0'><dhcp><range start='192.168.150.10' end='192.168.150.250'/></dhcp></ip></network>";
const BASE_POOL_XML: &str =
    "<pool type='dir'><name>capl-test-base</name><target><path>/sim/base</path></target></pool>";
const DISK_POOL_XML: &str =
    "<pool type='dir'><name>capl-test-disks</name><target><path>/sim/disks</path></target></pool>";

/// A fresh simulated host for one test, with the fixture's network, pools and base image.
pub fn sim(test: &str) -> (Host, SimHypervisor, Fixture) {
    let uri = format!("sim:///host-{test}");
    let host = Host::builder(&uri)
        .network(NETWORK_XML, true)
        .pool(BASE_POOL_XML, true)
        .pool(DISK_POOL_XML, true)
        .build()
        .expect("build the simulated host");
    let hv = SimHypervisor::connect(&uri).expect("connect to the simulated host");
    let fx = Fixture {
        network: "capl-test-net".into(),
        base_pool: "capl-test-base".into(),
        domain_pool: "capl-test-disks".into(),
        image: "base.qcow2".into(),
        image_bytes: IMAGE_BYTES,
    };
    ensure_base_image(&hv, &fx);
    (host, hv, fx)
}

/// The simulator hands out leases at once, so the steady state reports the reserved address.
#[test]
fn running_machine_reports_its_leased_address() {
    let (_host, hv, fx) = sim("address");
    let spec = spec(&fx, "sim-addr", "addr-0");
    create_machine(&hv, &spec, &user_data(&spec)).unwrap();
    let reserved = capl_host_test_support::host::our_entry(&hv, &fx, &spec.names()).2;
    let report = start_machine(&hv, &spec).unwrap().expect("the machine exists");
    assert_eq!(
        report.addresses,
        vec![MachineAddress::InternalIp(reserved.parse().unwrap()), MachineAddress::Hostname(spec.name.clone())]
    );
    delete_machine(&hv, &spec).unwrap();
}

/// A guest the provider did not make runs on the network with exactly the
/// MAC a new machine derives from its domain name (it has a lease, no DHCP
/// entry). The machine takes its next MAC candidate, gets an address of its
/// own and finds its lease by its own MAC; delete leaves the other guest, and
/// its lease, alone. (The simulator hands out leases at once; on a real host
/// the test images do not boot, so no guest asks for one.)
#[test]
fn a_running_foreign_guest_with_the_derived_mac_is_avoided() {
    use capl_host::domain_xml::parse_domain;
    use capl_host::hypervisor::DomainState;
    use capl_host::observe_machine;

    let (_host, hv, fx) = sim("foreign-guest");
    let spec = spec(&fx, "sim-fguest", "fguest-0");
    let names = spec.names();
    let derived = names.derived_mac();
    let foreign = "someone-elses-vm";
    hv.domain_define(&format!(
        "<domain type='qemu'><name>{foreign}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>\
         <interface type='network'><mac address='{derived}'/><source network='{}'/></interface></devices></domain>",
        fx.network
    ))
    .unwrap();
    hv.domain_start(foreign).unwrap();
    let leases = hv.network_dhcp_leases(&fx.network).unwrap();
    let foreign_ip = leases.iter().find(|l| l.mac == derived).expect("the foreign guest's lease").ip.clone();

    let report = create_machine(&hv, &spec, &user_data(&spec)).expect("create beside a guest with the derived MAC");
    let next = names.mac_candidates()[1].clone();
    assert_eq!(report.mac.as_ref(), Some(&next));
    capl_host_test_support::host::assert_created_once(&hv, &fx, &spec);
    let (mac, _, reserved) = capl_host_test_support::host::our_entry(&hv, &fx, &names);
    assert_eq!(mac, next);
    assert_ne!(reserved, foreign_ip, "the machine's reservation is the foreign guest's leased address");
    assert_eq!(parse_domain(&hv.domain_xml(&names.domain).unwrap()).unwrap().macs, vec![next.clone()]);

    // The address reported is the machine's lease (by its MAC), not the other guest's.
    let observed = observe_machine(&hv, &spec).unwrap().expect("the machine exists");
    assert_eq!(observed.mac.as_ref(), Some(&next));
    assert_eq!(
        observed.addresses,
        vec![MachineAddress::InternalIp(reserved.parse().unwrap()), MachineAddress::Hostname(spec.name.clone())]
    );

    assert_eq!(delete_machine(&hv, &spec).unwrap(), []);
    assert_eq!(capl_host_test_support::host::leftovers(&hv, &fx, std::slice::from_ref(&spec)), Vec::<String>::new());
    assert_eq!(hv.domain_state(foreign).unwrap(), DomainState::Running, "the foreign guest was touched");
    assert_eq!(parse_domain(&hv.domain_xml(foreign).unwrap()).unwrap().macs, vec![derived.clone()]);
    assert!(hv.network_dhcp_leases(&fx.network).unwrap().iter().any(|l| l.mac == derived && l.ip == foreign_ip));
}

/// Simulator operations (each trait call is one or two libvirt RPCs: the
/// lookup by name and the call itself, as on a real host) for the paths the
/// "Cost on the host" table of the book's design page lists; the table must
/// say the same.
/// CPU and firmware settings cost one call more on create than a machine
/// without them (the domain capabilities, read once by the checks and used
/// again by define), and nothing more on delete.
#[test]
fn guest_hardware_settings_add_one_call_to_a_create() {
    let (host, hv, fx) = sim("hw-counts");
    ensure_base_image(&hv, &fx);
    let plain = spec(&fx, "sim-hw-counts", "plain-0");
    let mut uefi = spec(&fx, "sim-hw-counts", "uefi-0");
    uefi.firmware = Some(capl_host::guest_hardware::FirmwareSettings {
        kind: capl_host::guest_hardware::FirmwareType::Uefi,
        secure_boot: false,
        tpm: true,
    });
    let calls = create_and_delete_calls(&host, &hv, &[&plain, &uefi]);
    assert_eq!(calls[1].0, calls[0].0 + 1, "create calls without and with settings: {calls:?}");
    assert_eq!(calls[1].1, calls[0].1, "delete calls without and with settings: {calls:?}");
}

/// Each data disk costs three calls more on create (lookup, create, read
/// back) and two on delete (read, delete); a pool other than the domain
/// pool adds two to the checks (its XML and whether it is active).
#[test]
fn each_data_disk_adds_three_calls_to_a_create_and_two_to_a_delete() {
    use capl_host::data_disk::{DataDisk, DiskBus, DiskFormat};
    use capl_host_test_support::host::with_data_disk;

    let (host, hv, fx) = sim("data-counts");
    let plain = spec(&fx, "sim-data-counts", "plain-0");
    let one = with_data_disk(spec(&fx, "sim-data-counts", "one-0"), "a");
    let mut two_pools = with_data_disk(spec(&fx, "sim-data-counts", "two-0"), "a");
    two_pools.data_disks.push(DataDisk {
        name: "b".into(),
        size_gib: 1,
        pool: fx.base_pool.clone(),
        format: DiskFormat::Raw,
        bus: DiskBus::Sata,
        device: None,
    });
    let calls = create_and_delete_calls(&host, &hv, &[&plain, &one, &two_pools]);
    let (plain, one, two) = (calls[0], calls[1], calls[2]);
    assert_eq!((one.0 - plain.0, one.1 - plain.1), (3, 2), "one disk, create and delete calls: {calls:?}");
    assert_eq!((two.0 - plain.0, two.1 - plain.1), (3 + 3 + 2, 2 + 2), "two disks, two pools: {calls:?}");
}

/// An Ignition config costs four calls more on create (lookup, create, read
/// back, upload) and two on delete (read, delete), found from the domain's
/// XML with no lookup of its own.
#[test]
fn an_ignition_config_adds_four_calls_to_a_create_and_two_to_a_delete() {
    let (host, hv, fx) = sim("ignition-counts");
    let plain = spec(&fx, "sim-ign-counts", "plain-0");
    let mut ignition = spec(&fx, "sim-ign-counts", "ign-0");
    ignition.bootstrap_format = capl_host::BootstrapFormat::Ignition;
    let calls = create_and_delete_calls(&host, &hv, &[&plain, &ignition]);
    let (plain, ignition) = (calls[0], calls[1]);
    assert_eq!((ignition.0 - plain.0, ignition.1 - plain.1), (4, 2), "create and delete calls: {calls:?}");
}

/// The simulator operations of creating, then deleting, each machine in turn.
fn create_and_delete_calls(host: &Host, hv: &SimHypervisor, specs: &[&capl_host::MachineSpec]) -> Vec<(u64, u64)> {
    let counters = host.counters();
    let mut calls = Vec::new();
    for s in specs {
        let before = counters.total_calls();
        create_machine(hv, s, &user_data(s)).unwrap();
        let create = counters.total_calls() - before;
        let before = counters.total_calls();
        delete_machine(hv, s).unwrap();
        calls.push((create, counters.total_calls() - before));
    }
    calls
}

#[test]
fn libvirt_call_counts_match_the_book() {
    let (host, hv, fx) = sim("counts");
    let spec = spec(&fx, "sim-counts", "count-0");
    let counters = host.counters();

    let seed = user_data(&spec);
    let before = counters.total_calls();
    create_machine(&hv, &spec, &seed).unwrap();
    let create = counters.total_calls() - before;

    let before = counters.total_calls();
    let opened = counters.connections_opened();
    start_machine(&hv, &spec).unwrap().expect("the machine exists");
    let steady = counters.total_calls() - before;
    assert_eq!(counters.connections_opened(), opened, "a steady-state check opened a connection");

    let before = counters.total_calls();
    delete_machine(&hv, &spec).unwrap();
    let delete = counters.total_calls() - before;

    let infra = |domain_pool: &str| {
        let before = counters.total_calls();
        let spec = capl_host::InfraSpec {
            network: fx.network.clone(),
            base_pool: fx.base_pool.clone(),
            domain_pool: domain_pool.to_string(),
        };
        capl_host::check_infrastructure(&hv, &spec).unwrap();
        counters.total_calls() - before
    };
    let (cluster, cluster_one_pool) = (infra(&fx.domain_pool), infra(&fx.base_pool));

    eprintln!("simulator operations: create {create}, steady state {steady}, delete {delete}, cluster {cluster}");
    assert_eq!(book_row("create a new machine"), [create], "design.md: create");
    assert_eq!(book_row("steady-state check"), [steady], "design.md: steady state");
    assert_eq!(book_row("delete a running machine"), [delete], "design.md: delete");
    assert_eq!(book_row("LibvirtCluster host check"), [cluster, cluster_one_pool], "design.md: cluster check");
}

/// The numbers of the row of the design page's cost table whose label starts with `label`.
fn book_row(label: &str) -> Vec<u64> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/design.md")).unwrap();
    let table = cost_table(&page);
    let (_, numbers) = table
        .iter()
        .find(|(l, _)| l.starts_with(label))
        .unwrap_or_else(|| panic!("design.md's cost table has no row {label:?}: {table:?}"));
    numbers.clone()
}

/// A reboot costs what the machine module's docs and the design page's cost
/// table say: a running machine is reset (domain XML, state, reset: 3), a
/// paused one destroyed and started (domain XML, state, destroy, start: 4),
/// a shut-off one started (domain XML, state, start: 3). None opens a
/// connection.
#[test]
fn reboot_call_counts_match_the_book() {
    use capl_host::{RebootMethod, reboot_machine};

    let (host, hv, fx) = sim("reboot-counts");
    let spec = spec(&fx, "sim-reboot-counts", "reboot-0");
    create_machine(&hv, &spec, &user_data(&spec)).unwrap();
    let domain = spec.names().domain;
    let counters = host.counters();
    let opened = counters.connections_opened();
    let reboot = |expected: RebootMethod| {
        let before = counters.total_calls();
        let done = reboot_machine(&hv, &spec).unwrap().expect("the machine exists");
        assert_eq!(done.method, expected, "{}", done.describe());
        counters.total_calls() - before
    };
    let running = reboot(RebootMethod::Reset);
    assert_eq!(host.domain_resets(&domain).unwrap(), 1);
    hv.connection().domain_suspend(&domain).unwrap();
    let paused = reboot(RebootMethod::PowerCycle);
    hv.domain_destroy(&domain).unwrap();
    let shut_off = reboot(RebootMethod::Start);
    assert_eq!(host.domain_resets(&domain).unwrap(), 1, "only the running machine was reset");
    assert_eq!(counters.connections_opened(), opened, "a reboot opened a connection");
    eprintln!("simulator operations of a reboot: running {running}, paused {paused}, shut off {shut_off}");
    assert_eq!((running, paused, shut_off), (3, 4, 3), "reboot: running, paused, shut off");
    assert_eq!(book_row("reboot a running machine"), [running], "design.md: reboot of a running machine");
    assert_eq!(book_row("reboot a paused machine"), [paused], "design.md: reboot of a paused machine");
}

/// A running machine whose reset fails is destroyed and started instead, and
/// says why; a reset that fails because the connection is lost is not (the
/// caller retries on a new connection). A crashed machine is destroyed and
/// started: a reset would leave it paused. Another identity's domain at the
/// machine's name is never touched.
#[test]
fn a_failed_reset_falls_back_to_a_power_cycle() {
    use capl_host::hypervisor::DomainState;
    use capl_host::{FailureKind, RebootMethod, reboot_machine};
    use libvirt_sim::{Error, ErrorCode, Op};

    let (host, hv, fx) = sim("reboot-fallback");
    let spec = spec(&fx, "sim-reboot-fallback", "fallback-0");
    create_machine(&hv, &spec, &user_data(&spec)).unwrap();
    let domain = spec.names().domain;
    let counters = host.counters();

    host.fail_nth(Op::DomainReset, 1, Error::new(ErrorCode::OperationFailed, "injected: QEMU did not answer"));
    let before = counters.total_calls();
    let done = reboot_machine(&hv, &spec).unwrap().expect("the machine exists");
    assert_eq!((done.method, done.was), (RebootMethod::PowerCycle, DomainState::Running));
    assert_eq!(
        done.describe(),
        "destroyed and started after the reset failed: operation failed: injected: QEMU did not answer (libvirt error 9)"
    );
    assert_eq!(counters.total_calls() - before, 5, "domain XML, state, reset, destroy, start");
    assert_eq!(hv.domain_state(&domain).unwrap(), DomainState::Running);
    assert_eq!(host.domain_resets(&domain).unwrap(), 0);

    host.fail_nth(Op::DomainReset, 1, Error::new(ErrorCode::NoConnect, "injected: connection gone"));
    let destroys = counters.calls(Op::DomainDestroy);
    let err = reboot_machine(&hv, &spec).unwrap_err();
    assert_eq!(err.kind(), FailureKind::HostUnreachable, "{err}");
    assert!(err.to_string().contains(&format!("reset domain \"{domain}\"")), "{err}");
    assert_eq!(counters.calls(Op::DomainDestroy), destroys, "a lost connection was answered with a destroy");

    host.crash_domain(&domain).unwrap();
    let done = reboot_machine(&hv, &spec).unwrap().expect("the machine exists");
    assert_eq!(done.describe(), "destroyed and started (was crashed)");
    assert_eq!(hv.domain_state(&domain).unwrap(), DomainState::Running);
    assert_eq!(host.domain_resets(&domain).unwrap(), 0, "a crashed domain was reset");

    host.fail_nth(Op::DomainCreate, 1, Error::new(ErrorCode::InternalError, "injected: qemu exited"));
    hv.domain_destroy(&domain).unwrap();
    let err = reboot_machine(&hv, &spec).unwrap_err();
    assert!(err.to_string().contains(&format!("start domain \"{domain}\"")), "{err}");
    assert_eq!(hv.domain_state(&domain).unwrap(), DomainState::Shutoff);
    delete_machine(&hv, &spec).unwrap();
}

/// The rows of the design page's "Cost on the host" table: (label, the
/// numbers of the second column).
fn cost_table(page: &str) -> Vec<(String, Vec<u64>)> {
    let section = page.split("## Cost on the host").nth(1).expect("design.md has a Cost on the host section");
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let numbers = cells[2]
                .split(|c: char| !c.is_ascii_digit())
                .filter(|n| !n.is_empty())
                .map(|n| n.parse().unwrap())
                .collect();
            (cells[1].to_string(), numbers)
        })
        .collect()
}

/// The step list is what the crash tests iterate over.
#[test]
fn create_steps_cover_the_readme_flow() {
    let (_host, hv, fx) = sim("steps");
    let spec = spec(&fx, "sim-steps", "steps-0");
    run_create_steps(&hv, &spec, &user_data(&spec), &CreateStep::ALL).unwrap();
    capl_host_test_support::host::assert_created_once(&hv, &fx, &spec);
    delete_machine(&hv, &spec).unwrap();
    let _: &dyn Hypervisor = &hv;
}

/// A host operation that fails because the connection is gone returns its
/// `HostError` (HostUnreachable, transient) and the connection handle drops
/// the connection by itself: the next call opens a new one. An error that is
/// not about the connection keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_inside_a_host_operation_is_dropped_by_the_handle() {
    use std::sync::Arc;

    use capl_host::hypervisor::connections::Connections;
    use capl_host::hypervisor::sim::SimConnector;
    use capl_host::{FailureKind, HostError, InfraSpec, check_infrastructure};
    use libvirt_sim::{Error, ErrorCode, Op};

    let (host, _hv, fx) = sim("lost-in-op");
    let cache = Arc::new(Connections::new(Arc::new(SimConnector), 4));
    let handle = cache.host(host.uri());
    let infra = InfraSpec { network: fx.network.clone(), base_pool: fx.base_pool.clone(), domain_pool: fx.domain_pool };
    let check = |infra: &InfraSpec| {
        let infra = infra.clone();
        move |h: &dyn Hypervisor| check_infrastructure(h, &infra)
    };
    handle.call(check(&infra)).await.unwrap();
    let opened = host.counters().connections_opened();

    host.fail_nth(Op::NetworkLookup, 1, Error::new(ErrorCode::NoConnect, "injected: connection gone"));
    let err: HostError = handle.call(check(&infra)).await.unwrap_err();
    assert_eq!(err.kind(), FailureKind::HostUnreachable, "{err}");
    assert!(err.is_transient());
    handle.call(check(&infra)).await.unwrap();
    assert_eq!(host.counters().connections_opened(), opened + 1, "the lost connection was replaced");

    host.fail_nth(Op::NetworkLookup, 1, Error::new(ErrorCode::InternalError, "injected: a driver failure"));
    let err = handle.call(check(&infra)).await.unwrap_err();
    assert_eq!(err.kind(), FailureKind::ProvisioningFailed, "{err}");
    handle.call(check(&infra)).await.unwrap();
    assert_eq!(host.counters().connections_opened(), opened + 1, "a driver failure keeps the connection");
}

/// A host that cannot be connected to is a `HostError` too (HostUnreachable),
/// naming the URI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_host_is_a_host_error_naming_the_uri() {
    use std::sync::Arc;

    use capl_host::hypervisor::connections::Connections;
    use capl_host::hypervisor::sim::SimConnector;
    use capl_host::{FailureKind, HostError, InfraSpec, check_infrastructure};

    let cache = Arc::new(Connections::new(Arc::new(SimConnector), 4));
    let uri = "sim:///nobody-built-this-host";
    let infra = InfraSpec { network: "n".into(), base_pool: "b".into(), domain_pool: "d".into() };
    let err: HostError = cache.host(uri).call(move |h| check_infrastructure(h, &infra)).await.unwrap_err();
    assert!(matches!(&err, HostError::Unreachable { uri: u, .. } if u == uri), "{err:?}");
    assert_eq!(err.kind(), FailureKind::HostUnreachable);
    assert!(err.to_string().contains(uri), "{err}");
}
