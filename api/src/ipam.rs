//! The parts of CAPI's `ipam.cluster.x-k8s.io/v1beta2` IPAddressClaim and
//! IPAddress that this provider writes and reads (CAPI's IPAM contract). CAPI
//! installs these CRDs; an IPAM provider (e.g. the in-cluster one) fills the
//! claims.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::shared::PoolReference;

/// An IPAddressClaim: one address wanted from a pool.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "IPAddressClaim",
    namespaced,
    status = "IPAddressClaimStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimSpec {
    pub pool_ref: PoolReference,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_ref: Option<LocalName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// A reference by name in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalName {
    #[serde(default)]
    pub name: String,
}

/// An IPAddress: the address a provider gave a claim.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(group = "ipam.cluster.x-k8s.io", version = "v1beta2", kind = "IPAddress", namespaced, schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct IPAddressSpec {
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub prefix: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default)]
    pub claim_ref: LocalName,
}
