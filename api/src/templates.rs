//! LibvirtClusterTemplate and LibvirtMachineTemplate, for ClusterClass and
//! MachineDeployments. CAPI clones `spec.template` into a new object.
//!
//! Template immutability is not a CRD rule: CAPI's topology controller sends
//! server-side-apply dry runs carrying `topology.cluster.x-k8s.io/dry-run`
//! that must pass, and CRD CEL rules cannot see the annotation or the dry-run
//! flag. It is enforced by the ValidatingAdmissionPolicy in
//! `config/rbac`-adjacent manifests instead (see `manifests::template_policy`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::cluster::LibvirtClusterSpec;
use super::machine::LibvirtMachineSpec;
use super::shared::ObjectMeta;

/// A template for LibvirtClusters, used by ClusterClass.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "LibvirtClusterTemplate",
    plural = "libvirtclustertemplates",
    namespaced,
    shortname = "lvct",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "LibvirtClusterTemplate is a template for LibvirtClusters, used by ClusterClass.",
    derive = "PartialEq",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct LibvirtClusterTemplateSpec {
    pub template: LibvirtClusterTemplateResource,
}

/// What a LibvirtClusterTemplate stamps out.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
pub struct LibvirtClusterTemplateResource {
    /// Labels and annotations for the new LibvirtCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// The new LibvirtCluster's spec.
    pub spec: LibvirtClusterSpec,
}

/// A template for LibvirtMachines, used by MachineDeployments,
/// KubeadmControlPlanes and ClusterClass.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "LibvirtMachineTemplate",
    plural = "libvirtmachinetemplates",
    namespaced,
    status = "LibvirtMachineTemplateStatus",
    shortname = "lvmt",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "LibvirtMachineTemplate is an immutable template for LibvirtMachines.",
    derive = "PartialEq",
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.template.spec.image", description = "Base image"),
    printcolumn(name = "vCPU", type_ = "integer", json_path = ".spec.template.spec.vcpu"),
    printcolumn(name = "MemoryMiB", type_ = "integer", json_path = ".spec.template.spec.memoryMiB"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct LibvirtMachineTemplateSpec {
    pub template: LibvirtMachineTemplateResource,
}

/// What a LibvirtMachineTemplate stamps out.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
pub struct LibvirtMachineTemplateResource {
    /// Labels and annotations for the new LibvirtMachine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// The new LibvirtMachine's spec.
    pub spec: LibvirtMachineSpec,
}

/// Optional status for autoscaling from zero: what a machine from this
/// template offers.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtMachineTemplateStatus {
    /// Resources a machine from this template has: `cpu` and `memory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<BTreeMap<String, Quantity>>,
    /// Architecture and operating system of the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
}

/// Node facts for autoscaling from zero.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    /// e.g. amd64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// e.g. linux.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<String>,
}
