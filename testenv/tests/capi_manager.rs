//! The CAPI core manager runs against the test API server, validates Clusters with its
//! webhook and reconciles a v1beta2 Cluster.
//!
//! Needs `cargo xtask control-plane build` (it builds `capi-manager` and copies CAPI's CRDs
//! and webhook manifests).

use std::time::Duration;

use anyhow::{Context, Result};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::json;
use testenv::TestEnv;

/// The finalizer CAPI's Cluster controller puts on every Cluster it reconciles.
const CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";
const WAIT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn capi_manager_reconciles_a_v1beta2_cluster() -> Result<()> {
    let env = TestEnv::start().await?;
    let manager = env.start_capi_manager().await?;
    let namespace = env.unique_namespace("capi-manager").await?;
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster");
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(env.client(), &namespace, &ApiResource::from_gvk_with_plural(&gvk, "clusters"));
    // CAPI's validating webhook is served: a Cluster that references nothing is refused.
    let mut cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": "reconciled"},
        "spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}}},
    });
    match clusters.create(&PostParams::default(), &serde_json::from_value(cluster.clone())?).await {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("validation.cluster.cluster.x-k8s.io")
                && status.message.contains("one of spec.controlPlaneRef, spec.infrastructureRef or spec.topology"),
            "{status:?}"
        ),
        other => panic!("a Cluster without references must be refused by CAPI's webhook: {other:?}"),
    }
    cluster["spec"]["infrastructureRef"] =
        json!({"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtCluster", "name": "reconciled"});
    let cluster: DynamicObject = serde_json::from_value(cluster)?;
    clusters.create(&PostParams::default(), &cluster).await?;

    let reconciled = |object: Option<&DynamicObject>| {
        object.is_some_and(|cluster| {
            let has_finalizer = cluster.metadata.finalizers.iter().flatten().any(|f| f == CLUSTER_FINALIZER);
            has_finalizer && cluster.data["status"]["phase"].is_string()
        })
    };
    let reconciled = tokio::time::timeout(WAIT, await_condition(clusters.clone(), "reconciled", reconciled))
        .await
        .with_context(|| {
            format!(
                "CAPI did not add its finalizer and a phase to the Cluster within {WAIT:?}; manager log:\n{}",
                manager.log_tail(30)
            )
        })??
        .context("the Cluster vanished")?;
    manager.ensure_running()?;
    // The infrastructure it references does not exist: the Cluster cannot get further.
    assert_eq!(reconciled.data["status"]["phase"], json!("Provisioning"), "{reconciled:?}");
    Ok(())
}
