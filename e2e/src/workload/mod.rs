//! A real Kubernetes cluster on libvirt VMs, as a user makes one: what the
//! `workload` scenarios and `cargo xtask demo` share.
//!
//! - [`render`]: `clusterctl generate cluster` from the release's flavors with
//!   the variables the flavors page documents, and `kubectl apply`;
//! - [`formation`]: the steps that form and grow the cluster (the
//!   control-plane VM, `kubeadm init`, the control plane Available while it is
//!   the only guest, then one worker), each with a bound, each failing with
//!   the step named and what the cluster showed;
//! - [`client`]: the workload cluster's client and what is read from it
//!   (Nodes, the Machines behind them, providerIDs);
//! - [`diagnose`]: what a stuck or failed cluster shows (machine phases, the
//!   KubeadmControlPlane's conditions, the guests' kubeadm lines).

pub(crate) mod client;
pub(crate) mod diagnose;
pub(crate) mod emulation;
pub(crate) mod formation;
pub(crate) mod render;

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
