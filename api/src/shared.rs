//! Types shared by several kinds, shaped as the CAPI v1beta2 contract wants them.

use std::collections::BTreeMap;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Where the workload cluster's API server listens.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiEndpoint {
    /// Hostname or IP address of the control plane endpoint, e.g. the address keepalived
    /// holds on the control-plane nodes, outside the network's DHCP range.
    #[schemars(length(min = 1, max = 512))]
    pub host: String,
    /// Port of the control plane endpoint.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// The `status.initialization` block of the v1beta2 contract.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct Initialization {
    /// True once the infrastructure is ready. Set once, never flipped back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// One failure domain, in the v1beta2 list form.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name of the failure domain; Machines refer to it in `spec.failureDomain`.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Whether control plane machines may be placed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes of the failure domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
}

/// An address of a machine, as CAPI's MachineAddress.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Eq)]
pub struct MachineAddress {
    /// One of Hostname, ExternalIP, InternalIP, ExternalDNS, InternalDNS.
    #[serde(rename = "type")]
    #[schemars(extend("enum" = ["Hostname", "ExternalIP", "InternalIP", "ExternalDNS", "InternalDNS"]))]
    pub type_: String,
    /// The address, e.g. 192.168.122.57 or libvirt-xd-0.
    #[schemars(length(min = 1, max = 256))]
    pub address: String,
}

impl MachineAddress {
    pub fn internal_ip(address: impl Into<String>) -> Self {
        Self { type_: "InternalIP".into(), address: address.into() }
    }

    pub fn hostname(address: impl Into<String>) -> Self {
        Self { type_: "Hostname".into(), address: address.into() }
    }
}

/// The metadata a template stamps on the objects cloned from it.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Labels to add to the cloned object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations to add to the cloned object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// A Secret in the same namespace as the object that names it.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretReference {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253), pattern(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
}

/// An IPAM pool (CAPI's IPAM contract), e.g. the in-cluster provider's
/// `InClusterIPPool` or `GlobalInClusterIPPool`.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PoolReference {
    /// API group of the pool, e.g. ipam.cluster.x-k8s.io.
    #[schemars(length(min = 1, max = 253))]
    pub api_group: String,
    /// Kind of the pool, e.g. InClusterIPPool.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// Name of the pool (in the machine's namespace, unless the kind is cluster-wide).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}
