//! The LibvirtCluster flow on the real kube-apiserver with a simulated libvirt host.

use crate::support::*;
use capl::api::capi::Cluster;
use capl::api::{CLUSTER_FINALIZER, LibvirtCluster};
use kube::ResourceExt;
use serde_json::json;

/// Cluster + LibvirtCluster (owned by it); `edit` changes the LibvirtCluster before it is written.
async fn cluster_objects(w: &World, endpoint_on_cluster: bool, edit: impl FnOnce(&mut serde_json::Value)) {
    let c: Cluster = w.apply(cluster_json("demo", "demo", endpoint_on_cluster)).await;
    let mut lc = libvirt_cluster_json("demo", &w.uri, Some(("demo", &c.uid().unwrap())));
    edit(&mut lc);
    let _: LibvirtCluster = w.apply(lc).await;
}

fn condition_message(lc: &LibvirtCluster, type_: &str) -> String {
    condition(cluster_conditions(lc), type_).map(|c| c.message.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_becomes_ready_and_deletion_removes_only_the_finalizer() {
    let w = World::new("rc-cluster").await;
    let _manager = w.start_manager();
    // The endpoint on our own spec (the Cluster has none).
    cluster_objects(&w, false, |lc| {
        lc["spec"]["controlPlaneEndpoint"] = json!({ "host": ENDPOINT_HOST, "port": ENDPOINT_PORT })
    })
    .await;

    let lc = w
        .wait_for::<LibvirtCluster>("demo", "provisioned and Ready", |lc| {
            lc.status.as_ref().and_then(|s| s.initialization.as_ref()).and_then(|i| i.provisioned) == Some(true)
                && has(cluster_conditions(lc), "Ready", "True", None)
        })
        .await;
    assert_eq!(lc.finalizers(), [CLUSTER_FINALIZER.to_string()]);
    let conditions = cluster_conditions(&lc);
    assert!(has(conditions, "ControlPlaneEndpointReady", "True", None), "{conditions:#?}");
    assert!(has(conditions, "InfrastructureReady", "True", None), "{conditions:#?}");
    assert!(has(conditions, "Paused", "False", Some("NotPaused")), "{conditions:#?}");
    assert_eq!(condition_message(&lc, "ControlPlaneEndpointReady"), format!("{ENDPOINT_HOST}:{ENDPOINT_PORT}"));
    for c in conditions.as_ref().unwrap() {
        assert_eq!(c.observed_generation, lc.metadata.generation, "observedGeneration of {}", c.type_);
    }

    // Deletion: only the finalizer goes; the host is not touched.
    let before = w.host_objects();
    let hv = w.inspect();
    use capl_host::hypervisor::{HostAdmin, Hypervisor};
    let networks = hv.network_list().unwrap();
    let pools = hv.pool_list().unwrap();
    let calls_before = w.calls();
    w.delete::<LibvirtCluster>("demo").await;
    w.wait_gone::<LibvirtCluster>("demo").await;
    let changed = call_delta(&calls_before, &w.calls());
    let writes: Vec<_> = changed
        .keys()
        .filter(|op| {
            ["Define", "Create", "Destroy", "Undefine", "Delete", "Update", "Autostart", "Upload", "Build"]
                .iter()
                .any(|w| op.contains(w))
        })
        .collect();
    assert!(writes.is_empty(), "deleting a LibvirtCluster changed the host: {changed:?}");
    assert_eq!(w.host_objects(), before);
    assert_eq!(hv.network_list().unwrap(), networks);
    assert_eq!(hv.pool_list().unwrap(), pools);
    assert!(hv.network_is_active(NETWORK).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_pool_is_reported_with_condition_and_event() {
    let w = World::new("rc-nopool").await;
    let _manager = w.start_manager();
    cluster_objects(&w, true, |lc| lc["spec"]["basePool"] = json!("no-such-pool")).await;

    let lc = w
        .wait_for::<LibvirtCluster>("demo", "InfrastructureReady False/InfrastructureMissing", |lc| {
            has(cluster_conditions(lc), "InfrastructureReady", "False", Some("InfrastructureMissing"))
        })
        .await;
    let message = condition_message(&lc, "InfrastructureReady");
    assert!(message.contains("no-such-pool"), "the message names the pool: {message}");
    assert!(message.contains("demo"), "the message names the LibvirtCluster: {message}");
    assert!(has(cluster_conditions(&lc), "Ready", "False", None), "{:#?}", cluster_conditions(&lc));
    assert_ne!(lc.status.as_ref().and_then(|s| s.initialization.as_ref()).and_then(|i| i.provisioned), Some(true));
    w.wait_event("demo", "Warning", "InfrastructureMissing", &message).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inactive_network_is_reported() {
    let w = World::new("rc-inactive").await;
    libvirt_sim::connect(&w.uri).unwrap().network_destroy(NETWORK).unwrap();
    let _manager = w.start_manager();
    cluster_objects(&w, true, |_| {}).await;

    let lc = w
        .wait_for::<LibvirtCluster>("demo", "InfrastructureReady False/InfrastructureInactive", |lc| {
            has(cluster_conditions(lc), "InfrastructureReady", "False", Some("InfrastructureInactive"))
        })
        .await;
    let message = condition_message(&lc, "InfrastructureReady");
    assert!(message.contains(NETWORK), "the message names the network: {message}");
    w.wait_event("demo", "Warning", "InfrastructureInactive", &message).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoint_anywhere_waits_then_the_clusters_endpoint_is_used() {
    let w = World::new("rc-noendpoint").await;
    let _manager = w.start_manager();
    cluster_objects(&w, false, |_| {}).await;

    let lc = w
        .wait_for::<LibvirtCluster>("demo", "ControlPlaneEndpointReady False", |lc| {
            has(cluster_conditions(lc), "ControlPlaneEndpointReady", "False", None)
        })
        .await;
    let message = condition_message(&lc, "ControlPlaneEndpointReady");
    assert!(message.contains("spec.controlPlaneEndpoint"), "the message says what to set: {message}");
    assert_ne!(lc.status.as_ref().and_then(|s| s.initialization.as_ref()).and_then(|i| i.provisioned), Some(true));

    // The Cluster gets an endpoint (the Cluster watch maps it to us).
    let _: Cluster = w
        .merge("demo", json!({ "spec": { "controlPlaneEndpoint": { "host": ENDPOINT_HOST, "port": ENDPOINT_PORT } } }))
        .await;
    let lc = w
        .wait_for::<LibvirtCluster>("demo", "Ready after the Cluster got an endpoint", |lc| {
            has(cluster_conditions(lc), "Ready", "True", None)
        })
        .await;
    assert!(has(cluster_conditions(&lc), "ControlPlaneEndpointReady", "True", None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_cluster_pauses_its_libvirt_cluster() {
    let w = World::new("rc-cpaused").await;
    let _manager = w.start_manager();
    let mut cluster = cluster_json("demo", "demo", true);
    cluster["spec"]["paused"] = json!(true);
    let c: Cluster = w.apply(cluster).await;
    let _: LibvirtCluster = w.apply(libvirt_cluster_json("demo", &w.uri, Some(("demo", &c.uid().unwrap())))).await;

    let lc = w
        .wait_for::<LibvirtCluster>("demo", "Paused True", |lc| {
            has(cluster_conditions(lc), "Paused", "True", Some("Paused"))
        })
        .await;
    assert!(condition_message(&lc, "Paused").contains("Cluster demo"), "{}", condition_message(&lc, "Paused"));
    assert!(lc.finalizers().is_empty(), "a paused object is not changed: {:?}", lc.finalizers());

    let _: Cluster = w.merge("demo", json!({ "spec": { "paused": false } })).await;
    w.wait_for::<LibvirtCluster>("demo", "Ready and NotPaused after unpausing", |lc| {
        has(cluster_conditions(lc), "Ready", "True", None)
            && has(cluster_conditions(lc), "Paused", "False", Some("NotPaused"))
    })
    .await;
}

/// A network that goes away after provisioning shows up on the conditions at
/// the next reconcile; `status.initialization.provisioned` stays true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_that_went_away_is_reported_and_provisioned_stays() {
    let w = World::new("rc-gone").await;
    let _manager = w.start_manager();
    cluster_objects(&w, true, |_| {}).await;
    w.wait_for::<LibvirtCluster>("demo", "Ready", |lc| has(cluster_conditions(lc), "Ready", "True", None)).await;

    libvirt_sim::connect(&w.uri).unwrap().network_destroy(NETWORK).unwrap();
    // Any change to the Cluster reaches the LibvirtCluster (the periodic recheck would too, later).
    let _: Cluster = w.merge("demo", json!({ "metadata": { "labels": { "touched": "1" } } })).await;
    let lc = w
        .wait_for::<LibvirtCluster>("demo", "InfrastructureReady False/InfrastructureInactive", |lc| {
            has(cluster_conditions(lc), "InfrastructureReady", "False", Some("InfrastructureInactive"))
        })
        .await;
    assert!(has(cluster_conditions(&lc), "Ready", "False", None), "{:#?}", cluster_conditions(&lc));
    assert_eq!(
        lc.status.as_ref().and_then(|s| s.initialization.as_ref()).and_then(|i| i.provisioned),
        Some(true),
        "provisioned is never set back"
    );
}

/// `cluster.x-k8s.io/managed-by`: someone else owns the LibvirtCluster; we
/// neither add a finalizer nor write its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn externally_managed_cluster_is_left_alone() {
    let w = World::new("rc-managed").await;
    let manager = w.start_manager();
    cluster_objects(&w, true, |lc| {
        lc["metadata"]["annotations"] = json!({ "cluster.x-k8s.io/managed-by": "someone-else" })
    })
    .await;

    let started = std::time::Instant::now();
    while manager.reconciles("libvirtcluster") == 0 {
        assert!(started.elapsed() < WAIT, "the LibvirtCluster was never reconciled");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let lc: LibvirtCluster = w.api().get("demo").await.unwrap();
    assert!(lc.finalizers().is_empty(), "{:?}", lc.finalizers());
    assert!(lc.status.is_none(), "status was written: {:?}", lc.status);
}
