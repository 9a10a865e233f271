//! cluster-api-provider-libvirt: a Cluster API infrastructure provider that
//! turns LibvirtMachines into QEMU/KVM domains on a libvirt host.
//!
//! Layers, top to bottom:
//! - [`api`]: the four CRD kinds and their condition constants, from the
//!   `capl-api` crate; [`api_reference`] renders the book's API reference
//!   from their CRDs.
//! - [`controller`]: the reconcilers (gather, decide, act, report); the only
//!   place that maps host failures to condition reasons.
//! - the `capl-host` crate ([`capl_host`]): naming, XML, cloud-init ISO, IP
//!   choice, create/delete ordering, and the `Hypervisor` trait with its real
//!   libvirt and `libvirt-sim` backends. It knows nothing of Kubernetes.

/// The API types live in the `capl-api` crate; the provider names them `crate::api`.
pub use capl_api as api;
pub mod api_reference;
pub mod controller;
pub mod counted_host;
pub mod image;
pub mod manifests;
