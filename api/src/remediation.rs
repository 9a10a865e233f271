//! LibvirtRemediation and LibvirtRemediationTemplate: remediation by reboot
//! for CAPI's MachineHealthCheck (`spec.remediation.templateRef`).
//!
//! The MachineHealthCheck clones the template into a LibvirtRemediation
//! named after the unhealthy Machine, owned by it. The provider reboots the
//! Machine's domain and waits `timeoutSeconds` for the Machine to be healthy
//! again; the MachineHealthCheck deletes the LibvirtRemediation once it is.
//! After `retryLimit` reboots that did not help, the provider gives up: it
//! sets the Machine's `OwnerRemediated` condition to False, and the Machine's
//! owner (MachineSet or KubeadmControlPlane) deletes and replaces it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::shared::ObjectMeta;

/// How a Machine is remediated by rebooting its domain.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "LibvirtRemediation",
    plural = "libvirtremediations",
    namespaced,
    status = "LibvirtRemediationStatus",
    shortname = "lvr",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "LibvirtRemediation reboots the domain of the unhealthy Machine it is named after, for a MachineHealthCheck.",
    derive = "PartialEq",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", description = "Waiting or Failed"),
    printcolumn(name = "Reboots", type_ = "integer", json_path = ".status.retryCount", description = "Reboots done"),
    printcolumn(
        name = "Last",
        type_ = "date",
        json_path = ".status.lastRemediated",
        description = "When the domain was last rebooted"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtRemediationSpec {
    /// How many times the domain is rebooted before the provider gives up
    /// and hands the Machine to its owner for replacement. Default 1.
    #[serde(default = "default_retry_limit")]
    #[schemars(range(min = 1, max = 10))]
    pub retry_limit: i32,
    /// How long, in seconds, the Machine has after each reboot to become
    /// healthy again (its Node Ready, as the MachineHealthCheck judges it)
    /// before the next reboot or giving up. Default 600.
    #[serde(default = "default_timeout_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: i32,
}

fn default_retry_limit() -> i32 {
    1
}

fn default_timeout_seconds() -> i32 {
    600
}

impl Default for LibvirtRemediationSpec {
    fn default() -> Self {
        Self { retry_limit: default_retry_limit(), timeout_seconds: default_timeout_seconds() }
    }
}

/// What the provider did for the Machine.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtRemediationStatus {
    /// `Waiting` after a reboot, while the Machine has time to become
    /// healthy; `Failed` once the provider gave up and handed the Machine to
    /// its owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// How many reboots were attempted, the failed ones included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<i32>,
    /// When the last reboot was attempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_remediated: Option<Time>,
    /// `Rebooted`: True after a reboot (reason `Reset`, `PowerCycled` or
    /// `Started`); False when the host call failed (`RebootFailed`), the
    /// machine cannot be found (`MachineNotFound`, `DomainNotFound`), or the
    /// provider gave up (`RetriesExhausted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
}

/// A template for LibvirtRemediations, named by a MachineHealthCheck's
/// `spec.remediation.templateRef`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "LibvirtRemediationTemplate",
    plural = "libvirtremediationtemplates",
    namespaced,
    shortname = "lvrt",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "LibvirtRemediationTemplate is what a MachineHealthCheck clones into a LibvirtRemediation per unhealthy Machine.",
    derive = "PartialEq",
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
pub struct LibvirtRemediationTemplateSpec {
    pub template: LibvirtRemediationTemplateResource,
}

/// What a LibvirtRemediationTemplate stamps out.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
pub struct LibvirtRemediationTemplateResource {
    /// Labels and annotations for the new LibvirtRemediation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// The new LibvirtRemediation's spec.
    pub spec: LibvirtRemediationSpec,
}
