//! capl-api: the `infrastructure.cluster.x-k8s.io/v1alpha1` API of
//! cluster-api-provider-libvirt: LibvirtCluster, LibvirtMachine, LibvirtRemediation and their
//! templates, their condition types and reasons, plus the slices of CAPI's own
//! `cluster.x-k8s.io/v1beta2` kinds (Cluster, Machine) and
//! `ipam.cluster.x-k8s.io/v1beta2` kinds that the reconcilers read and write.
//!
//! The provider renders its CRDs from these types ([`crds`]); the e2e suite,
//! the benchmarks and the test kits build their objects from them with
//! [`builders`].
//!
//! A program that creates machines builds them with kube's typed API:
//!
//! ```
//! use capl_api::{LibvirtClusterSpec, LibvirtMachine, LibvirtMachineSpec, LibvirtMachineTemplate};
//!
//! let cluster = LibvirtClusterSpec::one_host("qemu+ssh://root@host-a/system", "default", "capi-base-images", "capi-vm-disks");
//! assert_eq!(cluster.network, "default");
//!
//! let spec = LibvirtMachineSpec::sized("noble.qcow2", 2, 4096, 20);
//! let template = LibvirtMachineTemplate::stamping("workers", spec.clone());
//! let machine = LibvirtMachine::from_spec("worker-0", spec);
//! let yaml = serde_json::to_value(&machine).unwrap();
//! assert_eq!(yaml["kind"], "LibvirtMachine");
//! assert_eq!(yaml["apiVersion"], "infrastructure.cluster.x-k8s.io/v1alpha1");
//! assert_eq!(yaml["spec"]["memoryMiB"], 4096);
//! assert_eq!(serde_json::to_value(&template).unwrap()["spec"]["template"]["spec"]["vcpu"], 2);
//! ```
//!
//! Its versions follow the book's "Versions and compatibility" page: the API
//! version (`v1alpha1`) and the crate's semver move together with the provider.

// kube's `printcolumn(...)` attributes repeat `type_ = "string"`, which this
// lint mistakes for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

pub mod builders;
pub mod capi;
mod cluster;
pub mod conditions;
pub mod ipam;
mod machine;
mod remediation;
mod shared;
mod templates;

pub use cluster::{
    ClusterHost, EndpointSource, LibvirtCluster, LibvirtClusterSpec, LibvirtClusterStatus, LibvirtHost, NetworkEndpoint,
};
pub use machine::{
    AdditionalNetwork, ChecksumType, CpuMode, CpuSpec, CpuTopology, DataDisk, DataDiskFormat, DataDiskStatus, DiskBus,
    FirmwareSpec, FirmwareType, ImageFormat, ImageUrl, LibvirtMachine, LibvirtMachineSpec, LibvirtMachineStatus,
};
pub use remediation::{
    LibvirtRemediation, LibvirtRemediationSpec, LibvirtRemediationStatus, LibvirtRemediationTemplate,
    LibvirtRemediationTemplateResource, LibvirtRemediationTemplateSpec,
};
pub use shared::{
    ApiEndpoint, FailureDomain, Initialization, MachineAddress, ObjectMeta as TemplateObjectMeta, PoolReference,
    SecretReference,
};
pub use templates::{
    LibvirtClusterTemplate, LibvirtClusterTemplateResource, LibvirtClusterTemplateSpec, LibvirtMachineTemplate,
    LibvirtMachineTemplateResource, LibvirtMachineTemplateSpec, LibvirtMachineTemplateStatus, NodeInfo,
};

/// The API group of this provider's kinds.
pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
/// The label CAPI reads on each CRD to learn which of our versions speaks
/// its v1beta2 contract.
pub const CONTRACT_LABEL: (&str, &str) = ("cluster.x-k8s.io/v1beta2", "v1alpha1");

/// Finalizer on LibvirtCluster objects.
pub const CLUSTER_FINALIZER: &str = "libvirtcluster.infrastructure.cluster.x-k8s.io";
/// Finalizer on LibvirtMachine objects.
pub const MACHINE_FINALIZER: &str = "libvirtmachine.infrastructure.cluster.x-k8s.io";

/// On a LibvirtMachine being deleted: give up on host cleanup. The provider
/// removes the finalizer without touching the host and emits a Warning
/// event listing what may remain there. Presence is enough (any value).
/// For a host that will never answer again.
pub const SKIP_HOST_CLEANUP_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/libvirt-skip-host-cleanup";

/// On a LibvirtCluster whose endpoint comes from the libvirt network: the name of its
/// DNS host entry on the host (`capl-endpoint-<UID at allocation>`), written before the
/// entry is made; the entry with this name is the one deleted with the LibvirtCluster.
pub const ENDPOINT_DNS_HOST_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/libvirt-endpoint-dns-host";

/// Every CRD this crate defines, in a stable order.
pub fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    use kube::CustomResourceExt;
    vec![
        LibvirtCluster::crd(),
        LibvirtClusterTemplate::crd(),
        LibvirtMachine::crd(),
        LibvirtMachineTemplate::crd(),
        LibvirtRemediation::crd(),
        LibvirtRemediationTemplate::crd(),
    ]
}
