//! A provisioned machine whose domain vanished from the host, on the real
//! kube-apiserver with a simulated host: the provider reports it (Ready=False
//! with reason DomainLost, a Warning event) and never creates the domain
//! again, since that would run the bootstrap data a second time (for the first
//! control-plane machine: `kubeadm init` of a second cluster). Deleting such a
//! machine still removes what is left of it on the host.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::*;
use capl::api::LibvirtMachine;
use capl::api::capi::Machine;
use capl_host::hypervisor::{DomainState, Hypervisor, UndefineFlags};
use kube::ResourceExt;
use libvirt_sim::Op;
use serde_json::json;

/// The libvirt operations that create or start something on the host.
const CREATING_OPS: &[&str] = &["DomainDefine", "DomainCreate", "VolumeCreate", "VolumeUpload", "NetworkUpdate"];

/// The creating calls among `calls`.
fn creating(calls: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    calls.iter().filter(|(op, _)| CREATING_OPS.contains(&op.as_str())).map(|(op, n)| (op.clone(), *n)).collect()
}

/// Changes a label on the Machine: a watch event, so the LibvirtMachine is reconciled.
async fn touch_machine(w: &World, name: &str, value: &str) {
    let _: Machine = w.merge(name, json!({ "metadata": { "labels": { "touched": value } } })).await;
}

/// Waits until no LibvirtMachine reconcile has run for 3 s.
async fn settle(manager: &Manager) {
    let mut reconciles = manager.reconciles("libvirtmachine");
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = manager.reconciles("libvirtmachine");
        if now == reconciles {
            return;
        }
        reconciles = now;
    }
}

fn is_lost(lm: &LibvirtMachine) -> bool {
    has(machine_conditions(lm), "Ready", "False", Some("DomainLost"))
}

/// Checks what the user sees on a machine whose domain is lost, and returns the Ready message.
fn assert_reported_lost(w: &World, lm: &LibvirtMachine, domain: &str) -> String {
    let conditions = machine_conditions(lm);
    let ready = condition(conditions, "Ready").unwrap().message.clone();
    for needle in [domain, w.uri.as_str(), "not created again", "MachineHealthCheck", "delete the Machine"] {
        assert!(ready.contains(needle), "the Ready message does not say {needle:?}: {ready}");
    }
    for type_ in ["MachineCreated", "DomainRunning"] {
        assert!(has(conditions, type_, "False", Some("DomainLost")), "{type_}: {conditions:#?}");
    }
    // Provisioned stays set and the providerID stays (the contract: never flipped back).
    let status = lm.status.as_ref().unwrap();
    assert_eq!(status.initialization.as_ref().and_then(|i| i.provisioned), Some(true));
    assert_eq!(lm.spec.provider_id.as_deref(), Some(format!("libvirt://{}", lm.uid().unwrap()).as_str()));
    assert_eq!(status.state, None, "a lost domain has no libvirt state");
    ready
}

async fn lost_events(w: &World, name: &str) -> usize {
    w.events(name).await.iter().filter(|(t, r, _)| t == "Warning" && r == "DomainLost").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_domain_is_reported_never_recreated_and_the_machine_still_deletes() {
    let w = World::new("rc-lost").await;
    let manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    ready_machine_objects(&w, "demo", "worker-0").await;
    w.wait_for::<LibvirtMachine>("worker-0", "a Ready machine", machine_ready).await;
    let domain = domain_of(&w, "worker-0").await;
    settle(&manager).await;

    // Behind the provider's back the domain goes; its disk, seed ISO and DHCP
    // reservation stay. Undefined first, so that the domain's events never
    // show the provider a stopped domain it would start.
    let before = w.calls();
    let hv = w.inspect();
    hv.domain_undefine(&domain, UndefineFlags::all()).unwrap();
    hv.domain_destroy(&domain).unwrap();
    let left = w.host_objects();
    assert_eq!((left.domains.len(), left.volumes.len(), left.dhcp_hosts.len()), (0, 2, 1), "{left:?}");

    // The domain's events reconcile the machine; nothing touches the objects.
    let lm = w.wait_for::<LibvirtMachine>("worker-0", "Ready=False with reason DomainLost", is_lost).await;
    let message = assert_reported_lost(&w, &lm, &domain);
    w.wait_event("worker-0", "Warning", "DomainLost", &message).await;

    // More reconciles (the status write above was one watch event, this is another):
    // still nothing created, and no second event for the same loss.
    let reconciles = manager.reconciles("libvirtmachine");
    touch_machine(&w, "worker-0", "2").await;
    let started = Instant::now();
    while manager.reconciles("libvirtmachine") == reconciles {
        assert!(started.elapsed() < WAIT, "no reconcile after the Machine changed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    settle(&manager).await;
    let delta = call_delta(&before, &w.calls());
    assert_eq!(creating(&delta), BTreeMap::new(), "libvirt calls after the domain was lost: {delta:?}");
    assert_eq!(w.host_objects(), left, "the host changed after the domain was lost");
    assert_eq!(lost_events(&w, "worker-0").await, 1, "{:#?}", w.events("worker-0").await);
    let again: LibvirtMachine = w.api().get("worker-0").await.unwrap();
    assert!(is_lost(&again), "{:#?}", again.status);

    // Deleting the machine (what CAPI does when a MachineHealthCheck or the
    // user replaces it) removes what is left on the host, then the finalizer.
    w.delete::<LibvirtMachine>("worker-0").await;
    w.wait_gone::<LibvirtMachine>("worker-0").await;
    assert_eq!(w.host_objects(), HostObjects { domains: vec![], volumes: vec![], dhcp_hosts: vec![] });
    // The one network update is the reservation's removal.
    let delta = call_delta(&before, &w.calls());
    assert_eq!(
        creating(&delta),
        BTreeMap::from([("NetworkUpdate".to_string(), 1)]),
        "libvirt calls while deleting a lost machine: {delta:?}"
    );
}

/// The reconciler saw the domain stopped and decided to start it; between
/// that look and the start the domain is undefined. The start creates
/// nothing (it has no bootstrap data, and must not fetch it): the machine is
/// reported lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_that_vanishes_before_its_start_is_not_created() {
    let w = World::new("rc-lost-start").await;
    let manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    ready_machine_objects(&w, "demo", "worker-0").await;
    w.wait_for::<LibvirtMachine>("worker-0", "a Ready machine", machine_ready).await;
    let domain = domain_of(&w, "worker-0").await;
    settle(&manager).await;

    let hv = w.inspect();
    let before = w.calls();
    // Each domain XML read (the ownership check) waits 2 s: the look reads it
    // once, the start a second time. The test reads no domain XML itself.
    // Set before the destroy, whose event reconciles the machine at once.
    let reads = w.host.counters().calls(Op::DomainGetXml);
    w.host.faults().set_latency(Op::DomainGetXml, Duration::from_secs(2));
    hv.domain_destroy(&domain).unwrap();

    let started = Instant::now();
    while w.host.counters().calls(Op::DomainGetXml) < reads + 2 {
        assert!(started.elapsed() < WAIT, "the reconciler did not look at the domain and start it");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The start's read has begun and waits: the domain goes now.
    hv.domain_undefine(&domain, UndefineFlags::all()).unwrap();
    w.host.faults().set_latency(Op::DomainGetXml, Duration::ZERO);

    let lm = w.wait_for::<LibvirtMachine>("worker-0", "Ready=False with reason DomainLost", is_lost).await;
    let message = assert_reported_lost(&w, &lm, &domain);
    w.wait_event("worker-0", "Warning", "DomainLost", &message).await;
    settle(&manager).await;
    let delta = call_delta(&before, &w.calls());
    assert_eq!(creating(&delta), BTreeMap::new(), "libvirt calls after the domain was lost: {delta:?}");
    assert_eq!(w.host_objects().domains, Vec::<String>::new());
}

/// The other side: a stopped domain that still exists is started, and the
/// start is the only thing that changes on the host (no define, no volume,
/// no DHCP update).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_a_stopped_domain_creates_nothing() {
    let w = World::new("rc-lost-stopped").await;
    let manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    ready_machine_objects(&w, "demo", "worker-0").await;
    w.wait_for::<LibvirtMachine>("worker-0", "a Ready machine", machine_ready).await;
    let domain = domain_of(&w, "worker-0").await;
    settle(&manager).await;
    let hv = w.inspect();
    let left = w.host_objects();
    let before = w.calls();
    // The destroy's event reconciles the machine; nothing touches the objects.
    hv.domain_destroy(&domain).unwrap();

    w.wait_event("worker-0", "Normal", "DomainStarted", &format!("started domain {domain} on {}", w.uri)).await;
    w.wait_for::<LibvirtMachine>("worker-0", "Ready again", machine_ready).await;
    settle(&manager).await;
    assert_eq!(hv.domain_state(&domain).unwrap(), DomainState::Running);
    let delta = call_delta(&before, &w.calls());
    assert_eq!(
        creating(&delta),
        BTreeMap::from([("DomainCreate".to_string(), 1)]),
        "libvirt calls of the start: {delta:?}"
    );
    assert_eq!(w.host_objects(), left);
}
