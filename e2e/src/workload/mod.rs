//! A real Kubernetes cluster on libvirt VMs, as a user makes one: what the
//! `workload` scenarios and `cargo xtask demo` share.
//!
//! - [`render`]: `clusterctl generate cluster` from the release's flavors with
//!   the variables the flavors page documents, and `kubectl apply`;
//! - [`formation`]: the steps that form and grow the cluster (the
//!   control-plane VM, `kubeadm init`, the control plane Available while it is
//!   the only guest, then one worker), each with a bound, each failing with
//!   the step named and what the cluster showed;
//! - [`service`]: a Service served across the cluster's nodes, found by name;
//! - [`client`]: the workload cluster's client and what is read from it
//!   (Nodes, the Machines behind them, providerIDs);
//! - [`diagnose`]: what a stuck or failed cluster shows (machine phases, the
//!   KubeadmControlPlane's conditions, the guests' kubeadm lines);
//! - [`cluster`]: the cluster's name, its KubeadmControlPlane and its domains
//!   on the host, which all of them read.

pub(crate) mod client;
pub(crate) mod cluster;
pub(crate) mod diagnose;
pub(crate) mod emulation;
pub(crate) mod formation;
pub(crate) mod render;
pub(crate) mod service;
