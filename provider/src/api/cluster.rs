//! LibvirtCluster: the libvirt host, network and pools a cluster's machines use.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::shared::{ApiEndpoint, FailureDomain, Initialization, SecretReference};

/// Points to a libvirt host and the network and storage pools the machines use.
///
/// The provider only checks that the network and pools exist and are active;
/// it never creates, starts or changes them.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "LibvirtCluster",
    plural = "libvirtclusters",
    namespaced,
    status = "LibvirtClusterStatus",
    shortname = "lvc",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    doc = "LibvirtCluster points to a libvirt host and the network and storage pools the cluster's machines use.",
    derive = "PartialEq",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",
        description = "Cluster this LibvirtCluster belongs to"
    ),
    printcolumn(name = "URI", type_ = "string", json_path = ".spec.uri", description = "libvirt connection URI"),
    printcolumn(name = "Network", type_ = "string", json_path = ".spec.network", description = "libvirt network"),
    printcolumn(
        name = "Provisioned",
        type_ = "boolean",
        json_path = ".status.initialization.provisioned",
        description = "Infrastructure is ready"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Ready condition"
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint.host",
        priority = 1,
        description = "Control plane endpoint"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.controlPlaneEndpoint) || (has(self.controlPlaneEndpoint) && self.controlPlaneEndpoint == oldSelf.controlPlaneEndpoint)").message("controlPlaneEndpoint can be set once and is immutable after that"))]
pub struct LibvirtClusterSpec {
    /// libvirt connection URI of the host, e.g. qemu+tcp://libvirt.lab/system,
    /// qemu+tls://host/system or qemu+libssh://user@host/system. Immutable.
    #[schemars(
        length(min = 1, max = 1024),
        pattern(r"^(qemu|test)(\+(unix|tcp|tls|ssh|libssh|libssh2|ext))?://[^\s/]*/[^\s]*$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("uri is immutable: machines already run on this host; create a new LibvirtCluster instead"))]
    pub uri: String,
    /// Name of an existing libvirt network with IPv4 DHCP. Immutable.
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("network is immutable: machines already hold DHCP reservations on it"))]
    pub network: String,
    /// Name of an existing, active storage pool that holds the base images. Immutable.
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("basePool is immutable: machine disks are overlays on images in it"))]
    pub base_pool: String,
    /// Name of an existing, active storage pool for VM disks and cloud-init ISOs
    /// (may be the same pool as basePool). Immutable.
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("domainPool is immutable: machine disks already live in it"))]
    pub domain_pool: String,
    /// The workload cluster's API endpoint. Optional: when unset, the provider
    /// waits for Cluster.spec.controlPlaneEndpoint. Can be set once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// A Secret in this namespace with the credentials the URI's transport
    /// needs: for qemu+tls:// the keys ca.crt, tls.crt and tls.key (the CA
    /// that signed the host's certificate, and a client certificate and key
    /// the host trusts); for qemu+libssh:// and qemu+libssh2:// the keys
    /// ssh-privatekey and known_hosts (with the host's key). The manager
    /// writes them as private files and names them in the URI; a changed
    /// Secret gives a new connection. Without it, the manager uses what the
    /// URI names or libvirt's defaults (files mounted by the operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
}

/// Observed state of a LibvirtCluster.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtClusterStatus {
    /// Contract field: `provisioned` is true once the host, network and pools
    /// were found ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Standard conditions: Ready, Paused, ControlPlaneEndpointReady, InfrastructureReady.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
    /// Failure domains of the cluster (v1beta2 list form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub failure_domains: Option<Vec<FailureDomain>>,
}
