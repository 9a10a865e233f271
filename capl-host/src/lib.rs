//! capl-host: everything cluster-api-provider-libvirt does to a libvirt host,
//! without Kubernetes. The provider's controllers map their objects onto
//! [`MachineSpec`] and [`InfraSpec`] and map a [`HostError`]'s
//! [`FailureKind`] onto their condition reasons; nothing here knows the API.
//!
//! - [`hypervisor`]: the [`Hypervisor`] trait, the one seam to a host, with
//!   the real (virt crate) and simulated (libvirt-sim) backends and the
//!   connection cache ([`hypervisor::connections`]).
//! - [`naming`]: the names and identity table.
//! - [`infra`]: the LibvirtCluster check (missing vs inactive).
//! - [`machine`]: create / start / observe / reboot / delete of one machine.
//! - [`domain_xml`], [`volume_xml`], [`network_xml`]: the XML written and read.
//! - [`dhcp`]: address choice and the per-network lock.
//! - [`cloud_init`]: the NoCloud seed ISO.
//! - [`data_disk`]: the data disks' volumes and devices.
//! - [`error`]: [`HostError`] and its [`FailureKind`].
//! - [`sim_host`]: the simulated host behind the provider's `--hypervisor sim`.
//!
//! [`Hypervisor`]: hypervisor::Hypervisor

pub mod cloud_init;
pub mod credentials;
pub mod data_disk;
pub mod dhcp;
pub mod domain_capabilities;
pub mod domain_xml;
pub mod endpoint;
pub mod error;
pub mod guest_hardware;
pub mod hypervisor;
pub mod image;
pub mod infra;
pub mod machine;
pub mod naming;
pub mod network_xml;
#[cfg(any(test, feature = "sim"))]
pub mod sim_host;
pub mod uri_policy;
pub mod volume_xml;
pub mod xml_tree;

pub use domain_xml::DomainTypePreference;
pub use error::{FailureKind, HostError, HostResult, ObjectKind};
pub use infra::{InfraSpec, check_infrastructure};
pub use machine::{
    AdditionalNic, BootstrapFormat, CreateStep, LeftOnHost, MachineAddress, MachineReport, MachineSpec, NicAttachment,
    Reboot, RebootMethod, create_machine, delete_machine, observe_machine, reboot_machine, refresh_reservation,
    run_create_steps, start_machine,
};
pub use naming::MachineNames;
