//! Everything the provider does to a libvirt host, over the [`Hypervisor`]
//! trait and without Kubernetes types: the controllers map their objects onto
//! [`MachineSpec`] and [`InfraSpec`].
//!
//! - [`naming`]: the names and identity table.
//! - [`infra`]: the LibvirtCluster check (missing vs inactive).
//! - [`machine`]: create / observe / delete of one machine.
//! - [`domain_xml`], [`volume_xml`], [`network_xml`]: the XML written and read.
//! - [`dhcp`]: address choice and the per-network lock.
//! - [`cloud_init`]: the NoCloud seed ISO.
//! - [`error`]: [`HostError`] and its condition reasons.
//!
//! [`Hypervisor`]: crate::hypervisor::Hypervisor

pub mod cloud_init;
pub mod dhcp;
pub mod domain_xml;
pub mod error;
pub mod infra;
pub mod machine;
pub mod naming;
pub mod network_xml;
pub mod volume_xml;
pub mod xml_tree;

pub use domain_xml::DomainTypePreference;
pub use error::{FailureReason, HostError, HostResult, ObjectKind};
pub use infra::{InfraSpec, check_infrastructure};
pub use machine::{
    CreateStep, MachineAddress, MachineReport, MachineSpec, delete_machine, ensure_machine, observe_machine,
    run_create_steps,
};
pub use naming::MachineNames;
