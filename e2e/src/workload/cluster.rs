//! The workload cluster every step reads: its name, its KubeadmControlPlane
//! and its domains on the host.

use anyhow::Result;
use kube::api::{ApiResource, GroupVersionKind};

use crate::harness::stack::Stack;

/// The workload cluster's name.
pub(crate) const CLUSTER: &str = "wl";

/// CAPI's KubeadmControlPlane, read as a dynamic object.
pub(crate) fn kubeadm_control_plane() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("controlplane.cluster.x-k8s.io", "v1beta2", "KubeadmControlPlane"),
        "kubeadmcontrolplanes",
    )
}

/// The domains of the namespace on the host.
pub(crate) fn domains(stack: &Stack, ns: &str) -> Result<Vec<String>> {
    stack.libvirt()?.domains_with_prefix(ns)
}
