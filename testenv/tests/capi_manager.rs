//! The CAPI core manager runs against the test API server and reconciles a v1beta2 Cluster.
//!
//! Needs `cargo xtask control-plane build` (it builds `capi-manager` and copies CAPI's CRDs).

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
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": "reconciled"},
        "spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}}},
    }))?;
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
    // Without infrastructure and control plane the Cluster cannot go further than Pending.
    assert_eq!(reconciled.data["status"]["phase"], json!("Pending"), "{reconciled:?}");
    Ok(())
}
