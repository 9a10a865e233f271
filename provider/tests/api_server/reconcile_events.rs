//! Domain lifecycle events instead of polling, on the real kube-apiserver with
//! a simulated host: a domain stopped behind the provider's back brings its
//! LibvirtMachine back through its event (the tests set the resync to hours,
//! so nothing else could), events on other domains cost nothing, a reconnect
//! re-lists the host's machines once, and healthy machines cost the host no
//! call at all. Everything is counted; nothing is timed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::*;
use capl::api::LibvirtMachine;
use capl::controller::Settings;
use capl_host::hypervisor::{DomainState, HostAdmin, Hypervisor, UndefineFlags};

/// Longer than any test: a reconcile of a healthy machine in these tests
/// comes from an event (or a re-list), never from the resync.
const RESYNC_NEVER: Duration = Duration::from_secs(6 * 3600);

/// The libvirt operations a look at, or a start of, a machine makes.
fn machine_ops(calls: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    calls
        .iter()
        .filter(|(op, _)| op.starts_with("Domain") || op.starts_with("Volume") || op.starts_with("NetworkGetDhcp"))
        .filter(|(op, _)| !op.starts_with("DomainEvent"))
        .map(|(op, n)| (op.clone(), *n))
        .collect()
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(op, n)| (op.to_string(), *n)).collect()
}

fn manager_without_resync(w: &World) -> Manager {
    let settings = Settings { resync_interval: RESYNC_NEVER, ..manager_settings(&w.ns) };
    Manager::start_with_settings(w.client.clone(), w.connections(), settings)
}

/// `n` machines of one cluster, all Ready.
async fn ready_machines(w: &World, n: usize) -> Vec<String> {
    provisioned_cluster(w, "demo").await;
    let names: Vec<String> = (0..n).map(|i| format!("worker-{i}")).collect();
    for name in &names {
        ready_machine_objects(w, "demo", name).await;
    }
    for name in &names {
        w.wait_for::<LibvirtMachine>(name, "a Ready machine", machine_ready).await;
    }
    names
}

/// Polls the host's call counts until `op` was called `n` times since `before`.
async fn wait_calls(w: &World, before: &BTreeMap<String, u64>, op: &str, n: u64) {
    let started = Instant::now();
    loop {
        let delta = call_delta(before, &w.calls());
        if delta.get(op).copied().unwrap_or(0) >= n {
            return;
        }
        assert!(started.elapsed() < WAIT, "{op} not called {n} times; calls since: {delta:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `virsh destroy` and a guest that powers itself off, behind the provider's
/// back: each time the domain's events reconcile the machine, which starts
/// the domain again. Nothing touches the Kubernetes objects and the resync
/// is hours away, so only the events can cause those reconciles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_stopped_behind_the_providers_back_is_started_again_because_of_its_event() {
    let w = World::new("rc-ev-stop").await;
    let manager = manager_without_resync(&w);
    ready_machines(&w, 1).await;
    let domain = domain_of(&w, "worker-0").await;
    let reconciles = manager.settle().await;
    let events = manager.domain_events(true);
    let own = manager.own_domain_events();
    let before = w.calls();

    let hv = w.inspect();
    hv.domain_destroy(&domain).unwrap();
    w.wait_event("worker-0", "Normal", "DomainStarted", &format!("started domain {domain} on {}", w.uri)).await;
    wait_calls(&w, &before, "DomainCreate", 1).await;
    w.wait_for::<LibvirtMachine>("worker-0", "Ready again", machine_ready).await;
    assert_eq!(hv.domain_state(&domain).unwrap(), DomainState::Running);

    // The guest powers off by itself (ACPI shutdown): started again too.
    hv.domain_shutdown(&domain).unwrap();
    wait_calls(&w, &before, "DomainCreate", 2).await;
    w.wait_for::<LibvirtMachine>("worker-0", "Ready again", machine_ready).await;
    let after = manager.settle().await;

    let delta = call_delta(&before, &w.calls());
    let runs = after - reconciles;
    println!(
        "destroy and guest shutdown: {runs} reconciles, {} domain events; calls: {delta:?}",
        manager.domain_events(true) - events
    );
    assert_eq!(machine_ops(&delta)["DomainCreate"], 2, "one start per stop: {delta:?}");
    assert_eq!(delta.get("DomainDefine"), None, "nothing is created: {delta:?}");
    // Each stop and each start sends two events (Shutdown and Stopped;
    // Resumed and Started): the stops' 4 reconciled the machine, the starts'
    // 4 were the reconciler's own and reconciled nothing.
    assert!(manager.domain_events(true) - events >= 4, "{} domain events", manager.domain_events(true) - events);
    assert_eq!(manager.own_domain_events() - own, 4, "events of the provider's own starts");
    assert!((2..=16).contains(&runs), "{runs} reconciles for two stops");
    assert_eq!(manager.domain_events(false), 0, "no event of another domain");
    assert_eq!(manager.connections.connections_opened(), 1, "one connection for the whole test");
}

/// Events of domains that are not a LibvirtMachine's reconcile nothing and
/// cost the host nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_other_domains_reconcile_nothing() {
    let w = World::new("rc-ev-foreign").await;
    let manager = manager_without_resync(&w);
    ready_machines(&w, 1).await;
    let reconciles = manager.settle().await;
    let ours = manager.domain_events(true);
    let before = w.calls();

    // Someone else's VM on the same host: defined, started, destroyed, undefined.
    let hv = w.inspect();
    let name = format!("{}-not-a-machine", w.ns);
    hv.domain_define(&format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os></domain>"
    ))
    .unwrap();
    hv.domain_start(&name).unwrap();
    hv.domain_destroy(&name).unwrap();
    hv.domain_undefine(&name, UndefineFlags::all()).unwrap();
    // Defined, Resumed, Started, Shutdown, Stopped, Undefined.
    let started = Instant::now();
    while manager.domain_events(false) < 6 {
        assert!(started.elapsed() < WAIT, "{} of 6 events arrived", manager.domain_events(false));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = manager.settle().await;

    assert_eq!(after, reconciles, "reconciles caused by another domain's events");
    assert_eq!(manager.domain_events(true), ours, "events counted as the machine's");
    assert_eq!(
        machine_ops(&call_delta(&before, &w.calls())),
        counts(&[("DomainCreate", 1), ("DomainDefine", 1), ("DomainDestroy", 1), ("DomainUndefine", 1)]),
        "the test's own calls and nothing else"
    );
}

/// The connection breaks (libvirtd restarted): within a connection check the
/// manager reconnects, subscribes again and reconciles every machine on the
/// host once, since events in between are lost; the new subscription works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_reconciles_every_machine_on_the_host_once() {
    let w = World::new("rc-ev-reconnect").await;
    let manager = manager_without_resync(&w);
    let names = ready_machines(&w, 3).await;
    let reconciles = manager.settle().await;
    let relists = manager.counter("capl_host_relists_total");
    let opened = manager.connections.connections_opened();
    let before = w.calls();

    w.host.restart_daemon();
    let started = Instant::now();
    while manager.counter("capl_host_relists_total") == relists {
        assert!(started.elapsed() < WAIT, "no re-list after the connection broke");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = manager.settle().await;
    let delta = call_delta(&before, &w.calls());
    println!("reconnect: {} reconciles; calls: {delta:?}", after - reconciles);
    assert_eq!(manager.counter("capl_host_relists_total"), relists + 1);
    assert_eq!(manager.connections.connections_opened(), opened + 1, "one reconnect");
    assert_eq!((delta.get("Connect"), delta.get("DomainEventRegister")), (Some(&1), Some(&1)), "{delta:?}");
    assert_eq!(after - reconciles, 3, "one reconcile per machine");
    assert_eq!(
        machine_ops(&delta),
        counts(&[("DomainGetState", 3), ("DomainGetXml", 3), ("NetworkGetDhcpLeases", 3)]),
        "one look at each machine"
    );

    // The new connection's events arrive.
    let domain = domain_of(&w, &names[1]).await;
    let before = w.calls();
    w.inspect().domain_destroy(&domain).unwrap();
    wait_calls(&w, &before, "DomainCreate", 1).await;
    w.wait_for::<LibvirtMachine>(&names[1], "Ready again", machine_ready).await;
}

/// Several running, healthy machines with the default resync (10 minutes):
/// over 20 s no LibvirtMachine is reconciled and the host gets no call for
/// them. (The LibvirtCluster's own check of the network and pools, every 2
/// minutes, is the only thing that may call it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_machines_cost_the_host_no_call() {
    let w = World::new("rc-ev-steady").await;
    let manager = w.start_manager();
    assert_eq!(manager.ctx.settings.resync_interval, capl::controller::DEFAULT_RESYNC_INTERVAL);
    ready_machines(&w, 3).await;
    let reconciles = manager.settle().await;
    let cluster_reconciles = manager.reconciles("libvirtcluster");
    let before = w.calls();

    tokio::time::sleep(Duration::from_secs(20)).await;
    let delta = call_delta(&before, &w.calls());
    let cluster_runs = manager.reconciles("libvirtcluster") - cluster_reconciles;
    println!("20 s of steady state: {cluster_runs} LibvirtCluster reconciles; calls: {delta:?}");
    assert_eq!(manager.reconciles("libvirtmachine"), reconciles, "LibvirtMachine reconciles in 20 s");
    assert_eq!(machine_ops(&delta), BTreeMap::new(), "libvirt calls for the machines in 20 s");
    if cluster_runs == 0 {
        assert_eq!(delta, BTreeMap::new(), "libvirt calls in 20 s");
    }
    assert_eq!(manager.connections.connections_opened(), 1);
}
