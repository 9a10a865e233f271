//! The parts of CAPI's `cluster.x-k8s.io/v1beta2` Cluster and Machine that
//! this provider reads. CAPI installs these CRDs; we never generate them.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::shared::ApiEndpoint;

/// Label CAPI puts on every object of a cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Presence pauses reconciliation of the annotated object.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// Presence means the LibvirtCluster is managed by something else.
pub const MANAGED_BY_ANNOTATION: &str = "cluster.x-k8s.io/managed-by";
/// CAPI's topology controller marks its dry-run requests with this.
pub const TOPOLOGY_DRY_RUN_ANNOTATION: &str = "topology.cluster.x-k8s.io/dry-run";

/// A reference to another object in the same namespace (v1beta2 ContractVersionedObjectReference).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    #[serde(default)]
    pub api_group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

/// The slice of Cluster.spec we read.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ObjectReference>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

/// The slice of Machine.spec we read.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(group = "cluster.x-k8s.io", version = "v1beta2", kind = "Machine", namespaced, schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    #[serde(default)]
    pub cluster_name: String,
    #[serde(default)]
    pub bootstrap: Bootstrap,
    #[serde(default)]
    pub infrastructure_ref: ObjectReference,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Bootstrap {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
}
