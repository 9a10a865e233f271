//! cluster-api-provider-libvirt: a Cluster API infrastructure provider that
//! turns LibvirtMachines into QEMU/KVM domains on a libvirt host.
//!
//! Layers, top to bottom:
//! - [`api`]: the four CRD kinds and their condition constants.
//! - `controller`: the reconcilers (gather, decide, act, report).
//! - `host`: naming, XML, cloud-init ISO, IP choice, create/delete ordering.
//! - [`hypervisor`]: the one seam to a host, with a real libvirt
//!   implementation and one over `libvirt-sim`.

pub mod api;
pub mod controller;
pub mod host;
pub mod hypervisor;
pub mod manifests;
pub mod sim_host;
