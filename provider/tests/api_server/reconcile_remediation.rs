//! Remediation by reboot on the real kube-apiserver with a simulated host:
//! a LibvirtRemediation named after an unhealthy Machine (as a
//! MachineHealthCheck creates it) reboots the Machine's domain, gives it
//! `timeoutSeconds`, reboots again up to `retryLimit`, then hands the Machine
//! to its owner (`OwnerRemediated` False). A healthy Machine is not
//! rebooted; a paused domain is destroyed and started; a domain that is gone
//! is handed over at once. (That a foreign domain at the machine's name is
//! never touched is the host layer's test, on the simulator and a real libvirtd.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::*;
use capl::api::capi::Machine;
use capl::api::{LibvirtMachine, LibvirtRemediation};
use capl_host::hypervisor::{DomainState, Hypervisor, UndefineFlags};
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject};
use serde_json::{Value, json};

/// The libvirt operations that change a domain.
const DOMAIN_OPS: &[&str] = &["DomainReset", "DomainDestroy", "DomainCreate", "DomainDefine", "DomainUndefine"];

fn domain_ops(calls: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    calls.iter().filter(|(op, _)| DOMAIN_OPS.contains(&op.as_str())).map(|(op, n)| (op.clone(), *n)).collect()
}

fn ops(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(op, n)| (op.to_string(), *n)).collect()
}

/// Sets the Machine's `HealthCheckSucceeded` condition, as a MachineHealthCheck would.
async fn set_health(w: &World, machine: &str, healthy: bool) {
    let (status, reason) = if healthy { ("True", "HealthCheckSucceeded") } else { ("False", "UnhealthyNode") };
    let _: Machine = w
        .patch_status(
            machine,
            json!({ "conditions": [{
                "type": "HealthCheckSucceeded", "status": status, "reason": reason, "message": "set by the test",
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            }] }),
        )
        .await;
}

/// A LibvirtRemediation named after `machine` and owned by it, as a
/// MachineHealthCheck clones it from a LibvirtRemediationTemplate.
async fn remediation(w: &World, machine: &str, retry_limit: i32, timeout_seconds: i32) -> LibvirtRemediation {
    let m: Machine = w.api().get(machine).await.unwrap();
    w.apply(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "LibvirtRemediation",
        "metadata": {
            "name": machine,
            "ownerReferences": [{
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": machine, "uid": m.uid().unwrap(),
            }],
        },
        "spec": { "retryLimit": retry_limit, "timeoutSeconds": timeout_seconds },
    }))
    .await
}

fn rebooted(r: &LibvirtRemediation) -> Option<(String, String, String)> {
    let c = r.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Rebooted")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn retry_count(r: &LibvirtRemediation) -> i32 {
    r.status.as_ref().and_then(|s| s.retry_count).unwrap_or(0)
}

fn phase(r: &LibvirtRemediation) -> Option<&str> {
    r.status.as_ref()?.phase.as_deref()
}

/// The Machine's condition `type_` as (status, reason, message).
async fn machine_condition(w: &World, machine: &str, type_: &str) -> Option<(String, String, String)> {
    let resource = ApiResource::erase::<Machine>(&());
    let api: kube::Api<DynamicObject> = kube::Api::namespaced_with(w.client.clone(), &w.ns, &resource);
    let m = api.get(machine).await.unwrap();
    let c = m.data["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)?.clone();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Some((text(&c["status"]), text(&c["reason"]), text(&c["message"])))
}

/// How many times the event `type_`/`reason` regarding a LibvirtRemediation
/// happened: its occurrences, each counted once and a repeat in its series.
async fn remediation_events(w: &World, type_: &str, reason: &str) -> i32 {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = w.api();
    events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("LibvirtRemediation"))
        .filter(|e| e.type_.as_deref() == Some(type_) && e.reason.as_deref() == Some(reason))
        .map(|e| e.series.map(|s| s.count).unwrap_or(1))
        .sum()
}

async fn ready_machine(w: &World, name: &str) -> String {
    ready_machine_objects(w, "demo", name).await;
    w.wait_for::<LibvirtMachine>(name, "a Ready machine", machine_ready).await;
    domain_of(w, name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_machine_is_rebooted_up_to_the_limit_then_handed_to_its_owner() {
    let w = World::new("rr-limit").await;
    let _manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    let domain = ready_machine(&w, "worker-0").await;
    set_health(&w, "worker-0", false).await;
    let before = w.calls();

    remediation(&w, "worker-0", 2, 2).await;
    let first = w.wait_for::<LibvirtRemediation>("worker-0", "the first reboot", |r| retry_count(r) >= 1).await;
    let (status, reason, message) = rebooted(&first).expect("a Rebooted condition");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Reset"), "{message}");
    for needle in ["reboot 1 of 2", domain.as_str(), w.uri.as_str(), "was running", "2s to become healthy"] {
        assert!(message.contains(needle), "the Rebooted message does not say {needle:?}: {message}");
    }
    assert_eq!(phase(&first), Some("Waiting"));
    assert!(first.status.as_ref().unwrap().last_remediated.is_some());
    let (status, reason, _) = machine_condition(&w, "worker-0", "ExternallyRemediated").await.unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Reset"));

    // Still unhealthy after the timeout: a second reboot, then the Machine is handed over.
    let last = w.wait_for::<LibvirtRemediation>("worker-0", "phase Failed", |r| phase(r) == Some("Failed")).await;
    assert_eq!(retry_count(&last), 2);
    let (status, reason, message) = rebooted(&last).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "RetriesExhausted"), "{message}");
    assert!(message.contains("2 reboot(s) of Machine") && message.contains("replacement"), "{message}");
    let (status, reason, owner_message) = machine_condition(&w, "worker-0", "OwnerRemediated").await.unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "WaitingForRemediation"));
    assert_eq!(owner_message, message);
    // The MachineHealthCheck's own condition is left as it was.
    let (status, reason, _) = machine_condition(&w, "worker-0", "HealthCheckSucceeded").await.unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "UnhealthyNode"));

    // Two resets and nothing else done to any domain; the domain runs.
    assert_eq!(domain_ops(&call_delta(&before, &w.calls())), ops(&[("DomainReset", 2)]));
    assert_eq!(w.inspect().domain_state(&domain).unwrap(), DomainState::Running);
    // One event per kind of step; the recorder counts a repeat in the event's series.
    assert_eq!(
        (
            remediation_events(&w, "Normal", "Rebooted").await,
            remediation_events(&w, "Warning", "RetriesExhausted").await
        ),
        (2, 1),
        "{:#?}",
        w.events("worker-0").await
    );

    // Given up: no more reboots however long it stays.
    let calls = w.calls();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(domain_ops(&call_delta(&calls, &w.calls())), BTreeMap::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_paused_gone_and_orphaned_cases_are_each_handled_as_a_user_expects() {
    let w = World::new("rr-cases").await;
    let manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;

    // Healthy: the MachineHealthCheck is about to delete the object; nothing is rebooted.
    let healthy = ready_machine(&w, "healthy").await;
    set_health(&w, "healthy", true).await;
    let before = w.calls();
    let reconciles = manager.reconciles("libvirtremediation");
    remediation(&w, "healthy", 1, 1).await;
    let started = Instant::now();
    while manager.reconciles("libvirtremediation") == reconciles {
        assert!(started.elapsed() < WAIT, "the LibvirtRemediation was not reconciled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r: LibvirtRemediation = w.api().get("healthy").await.unwrap();
    assert_eq!(retry_count(&r), 0, "{:?}", r.status);
    assert_eq!(domain_ops(&call_delta(&before, &w.calls())), BTreeMap::new());
    assert_eq!(w.inspect().domain_state(&healthy).unwrap(), DomainState::Running);

    // Paused: a reset would leave it paused, so it is destroyed and started.
    let paused = ready_machine(&w, "paused").await;
    set_health(&w, "paused", false).await;
    w.inspect().connection().domain_suspend(&paused).unwrap();
    let before = w.calls();
    remediation(&w, "paused", 1, 60).await;
    let r = w.wait_for::<LibvirtRemediation>("paused", "a reboot", |r| retry_count(r) == 1).await;
    let (status, reason, message) = rebooted(&r).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "PowerCycled"), "{message}");
    assert!(message.contains("was paused"), "{message}");
    w.wait_host("the paused domain running again", |hv| hv.domain_state(&paused).ok() == Some(DomainState::Running))
        .await;
    let delta = domain_ops(&call_delta(&before, &w.calls()));
    assert_eq!(delta.get("DomainReset"), None, "{delta:?}");
    assert_eq!(delta.get("DomainDestroy"), Some(&1), "{delta:?}");

    // Gone from the host: a reboot cannot help; handed over at once.
    let gone = ready_machine(&w, "gone").await;
    set_health(&w, "gone", false).await;
    let hv = w.inspect();
    hv.domain_undefine(&gone, UndefineFlags::all()).unwrap();
    hv.domain_destroy(&gone).unwrap();
    remediation(&w, "gone", 3, 600).await;
    let r = w.wait_for::<LibvirtRemediation>("gone", "phase Failed", |r| phase(r) == Some("Failed")).await;
    let (status, reason, message) = rebooted(&r).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "DomainNotFound"), "{message}");
    assert!(message.contains(&gone) && message.contains("cannot help"), "{message}");
    assert_eq!(retry_count(&r), 0);
    let (status, _, _) = machine_condition(&w, "gone", "OwnerRemediated").await.unwrap();
    assert_eq!(status, "False");

    // A Machine without a LibvirtRemediation's owner reference: said, nothing done.
    let before = w.calls();
    let _: LibvirtRemediation = w
        .apply(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "LibvirtRemediation",
            "metadata": { "name": "orphan" }, "spec": {},
        }))
        .await;
    let r = w
        .wait_for::<LibvirtRemediation>("orphan", "MachineNotFound", |r| {
            rebooted(r).is_some_and(|(_, reason, _)| reason == "MachineNotFound")
        })
        .await;
    assert_eq!((r.spec.retry_limit, r.spec.timeout_seconds), (1, 600), "the defaults");
    assert_eq!(domain_ops(&call_delta(&before, &w.calls())), BTreeMap::new());
}
