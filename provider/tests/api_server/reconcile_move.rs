//! What `clusterctl move` does to a provisioned machine, as the provider sees
//! it: the objects disappear from the source (paused, finalizers dropped by
//! clusterctl) and are created again on the target with new UIDs, the same
//! names and the same spec, `spec.providerID` included, and without status.
//! The provider on the target must adopt the machine: same domain, same UUID,
//! same address, nothing created, changed or deleted on the host.
//!
//! Here source and target are the same API server: what matters to the
//! provider is the new UID beside the kept providerID.

use capl::api::capi::{Cluster, Machine};
use capl::api::{LibvirtMachine, MACHINE_FINALIZER};
use capl_host::hypervisor::Hypervisor;
use kube::ResourceExt;
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_machine_is_adopted_with_nothing_changed_on_the_host() {
    let w = World::new("rm-move").await;
    let manager = w.start_manager();
    provisioned_cluster(&w, "demo").await;
    ready_machine_objects(&w, "demo", "m0").await;
    let before: LibvirtMachine = w.wait_for("m0", "a Ready machine", machine_ready).await;
    let provider_id = before.spec.provider_id.clone().expect("a provisioned machine has a providerID");
    let domain = domain_of(&w, "m0").await;
    let uuid = domain_uuid(&w, &domain);
    let address = internal_ip(&before);
    let host_before = w.host_objects();

    // The source side of the move: paused, finalizers removed, objects deleted.
    let _: Cluster = w.merge("demo", json!({ "spec": { "paused": true } })).await;
    w.wait_for::<LibvirtMachine>("m0", "Paused", |lm| has(machine_conditions(lm), "Paused", "True", None)).await;
    let _: LibvirtMachine = w.merge("m0", json!({ "metadata": { "finalizers": null } })).await;
    w.delete::<LibvirtMachine>("m0").await;
    w.wait_gone::<LibvirtMachine>("m0").await;
    let _: Machine = w.merge("m0", json!({ "metadata": { "finalizers": null } })).await;
    w.delete::<Machine>("m0").await;
    w.wait_gone::<Machine>("m0").await;
    assert_eq!(w.host_objects(), host_before, "removing the source objects of a paused cluster touched the host");

    // The target side: the same objects with new UIDs and the same spec.
    let calls_before = w.calls();
    let m: Machine = w.apply(machine_json("m0", "demo", "m0", Some("m0-bootstrap"))).await;
    let mut lm = libvirt_machine_json("m0", "demo", Some(("m0", &m.uid().unwrap())));
    lm["spec"]["providerID"] = json!(provider_id);
    let moved: LibvirtMachine = w.apply(lm).await;
    assert_ne!(moved.uid(), before.uid(), "the moved object has a new UID");
    let _: Cluster = w.merge("demo", json!({ "spec": { "paused": false } })).await;

    let after: LibvirtMachine = w.wait_for("m0", "the moved machine Ready", machine_ready).await;
    assert_eq!(after.spec.provider_id.as_deref(), Some(provider_id.as_str()));
    assert_eq!(after.status.as_ref().and_then(|s| s.domain_name.clone()), Some(domain.clone()));
    assert_eq!(internal_ip(&after), address, "the moved machine has another address");
    assert_eq!(domain_uuid(&w, &domain), uuid);
    assert_eq!(w.host_objects(), host_before, "adopting the moved machine changed the host");
    let delta = call_delta(&calls_before, &w.calls());
    for op in [
        "DomainDefine",
        "DomainCreate",
        "DomainDestroy",
        "DomainUndefine",
        "VolumeCreate",
        "VolumeUpload",
        "VolumeDelete",
        "NetworkUpdate",
    ] {
        assert!(!delta.contains_key(op), "adopting a moved machine called {op}: {delta:?}");
    }
    assert!(after.finalizers().contains(&MACHINE_FINALIZER.to_string()));

    // Deleting the moved machine removes everything of it.
    w.delete::<LibvirtMachine>("m0").await;
    w.wait_gone::<LibvirtMachine>("m0").await;
    let objects = w.host_objects();
    assert!(
        !objects.domains.contains(&domain) && objects.volumes.is_empty() && objects.dhcp_hosts.is_empty(),
        "{objects:?}"
    );
    drop(manager);
}

fn internal_ip(lm: &LibvirtMachine) -> String {
    lm.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone())
        .expect("an InternalIP")
}

fn domain_uuid(w: &World, domain: &str) -> String {
    capl_host::domain_xml::parse_domain(&w.inspect().domain_xml(domain).unwrap()).unwrap().uuid
}
