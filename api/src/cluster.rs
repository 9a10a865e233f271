//! LibvirtCluster: the libvirt host, network and pools a cluster's machines use.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::shared::{ApiEndpoint, FailureDomain, Initialization, PoolReference, SecretReference};

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
#[x_kube(validation = Rule::new("has(self.uri) != has(self.hosts)").message("set either uri (one host) or hosts (several hosts, each a failure domain), not both and not neither"))]
#[x_kube(validation = Rule::new("!has(self.controlPlaneEndpointFrom) || !has(self.controlPlaneEndpointFrom.network) || has(self.uri)").message("an endpoint from the libvirt network needs the one-host form (uri): with hosts, each host's network is its own; take the endpoint from an IPAM pool (controlPlaneEndpointFrom.pool)"))]
pub struct LibvirtClusterSpec {
    /// libvirt connection URI of the one host, e.g. qemu+tcp://libvirt.lab/system,
    /// qemu+tls://host/system or qemu+libssh://user@host/system. Immutable.
    /// Set either this or `hosts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 1024),
        pattern(r"^(qemu|test)(\+(unix|tcp|tls|ssh|libssh|libssh2|ext))?://[^\s/]*/[^\s]*$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("uri is immutable: machines already run on this host; create a new LibvirtCluster instead"))]
    pub uri: Option<String>,
    /// Several libvirt hosts, each one failure domain named after it. A
    /// Machine with spec.failureDomain goes to that host; one without goes to
    /// the host with the most memory available. Hosts can be added and
    /// removed; a host's uri cannot change. Set either this or `uri`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = Rule::new("self.all(h, self.exists_one(o, o.uri == h.uri))").message("two hosts have the same uri: a libvirt daemon is one host; list it once"))]
    #[x_kube(validation = Rule::new("oldSelf.all(o, !self.exists(h, h.name == o.name) || self.exists(h, h.name == o.name && h.uri == o.uri))").message("a host's uri is immutable: machines already run on it; add a host with a new name instead"))]
    pub hosts: Option<Vec<LibvirtHost>>,
    /// Name of an existing libvirt network with IPv4 DHCP (for `hosts`: the
    /// network of every host that names none). Immutable.
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("network is immutable: machines already hold DHCP reservations on it"))]
    pub network: String,
    /// Name of an existing, active storage pool that holds the base images
    /// (for `hosts`: of every host that names none). Immutable.
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("basePool is immutable: machine disks are overlays on images in it"))]
    pub base_pool: String,
    /// Name of an existing, active storage pool for VM disks and cloud-init ISOs
    /// (may be the same pool as basePool; for `hosts`: of every host that
    /// names none). Immutable.
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("domainPool is immutable: machine disks already live in it"))]
    pub domain_pool: String,
    /// The workload cluster's API endpoint. Optional: when unset, the provider
    /// waits for Cluster.spec.controlPlaneEndpoint. Can be set once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// Allocate the control-plane endpoint when neither this LibvirtCluster nor
    /// its Cluster names one, from an IPAM pool (the provider claims an address,
    /// IPAddressClaim `<name>-endpoint` owned by this LibvirtCluster; pick a pool
    /// the machines' pools do not hand out, outside any DHCP range) or from the
    /// libvirt network (one host only); the provider sets
    /// spec.controlPlaneEndpoint to it and releases the address when the
    /// LibvirtCluster is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint_from: Option<EndpointSource>,
    /// A Secret in this namespace with the credentials the URI's transport
    /// needs: for qemu+tls:// the keys ca.crt, tls.crt and tls.key (the CA
    /// that signed the host's certificate, and a client certificate and key
    /// the host trusts); for qemu+libssh:// and qemu+libssh2:// the keys
    /// ssh-privatekey and known_hosts (with the host's key). The manager
    /// writes them as private files and names them in the URI; a changed
    /// Secret gives a new connection. Without it, the manager uses what the
    /// URI names or libvirt's defaults (files mounted by the operator). For
    /// `hosts`: the credentials of every host that names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
}

/// Where an allocated control-plane endpoint comes from: an IPAM pool or the libvirt network.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.pool) != has(self.network)").message("set pool (an IPAM pool) or network (the cluster's libvirt network), not both and not neither"))]
pub struct EndpointSource {
    /// The IPAM pool (CAPI's IPAM contract) to claim the address from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolReference>,
    /// Take the address from the cluster's libvirt network on its one host
    /// (spec.uri): the highest free address of the network's IPv4 subnet
    /// outside the guests' DHCP ranges, recorded on the host as a DNS host
    /// entry `capl-endpoint-<LibvirtCluster UID>` (guests on the network
    /// resolve that name); deleted when the LibvirtCluster is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkEndpoint>,
    /// The port of the endpoint (default 6443).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
}

/// An endpoint from the libvirt network (no options yet).
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq, Default)]
pub struct NetworkEndpoint {}

/// One libvirt host of a LibvirtCluster, and the failure domain of its machines.
#[derive(Serialize, Deserialize, KubeSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtHost {
    /// Name of the host, and of its failure domain (Machine spec.failureDomain).
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// libvirt connection URI of the host (as spec.uri).
    #[schemars(
        length(min = 1, max = 1024),
        pattern(r"^(qemu|test)(\+(unix|tcp|tls|ssh|libssh|libssh2|ext))?://[^\s/]*/[^\s]*$")
    )]
    pub uri: String,
    /// Whether control-plane machines may run here (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// The host's network, if not spec.network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    pub network: Option<String>,
    /// The host's pool of base images, if not spec.basePool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    pub base_pool: Option<String>,
    /// The host's pool for disks and cloud-init ISOs, if not spec.domainPool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255), pattern(r"^[^/\s]+$"))]
    pub domain_pool: Option<String>,
    /// The Secret with this host's credentials, if not spec.credentialsRef
    /// (same keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<SecretReference>,
}

/// A host of a LibvirtCluster with the cluster's defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterHost {
    /// The host's name and failure domain; empty for the single `uri` form,
    /// which has no failure domains.
    pub name: String,
    pub uri: String,
    pub control_plane: bool,
    pub network: String,
    pub base_pool: String,
    pub domain_pool: String,
    pub credentials: Option<String>,
}

impl ClusterHost {
    /// The failure domain of the host's machines, if the cluster names its hosts.
    pub fn failure_domain(&self) -> Option<&str> {
        (!self.name.is_empty()).then_some(self.name.as_str())
    }

    /// How the host is named in messages.
    pub fn describe(&self) -> String {
        if self.name.is_empty() { self.uri.clone() } else { format!("host {} ({})", self.name, self.uri) }
    }
}

impl LibvirtClusterSpec {
    /// Every host, in the order written: `hosts`, or the one `uri`.
    pub fn hosts(&self) -> Vec<ClusterHost> {
        let credentials = self.credentials_ref.as_ref().map(|r| r.name.clone());
        match (&self.hosts, &self.uri) {
            (Some(hosts), _) => hosts
                .iter()
                .map(|h| ClusterHost {
                    name: h.name.clone(),
                    uri: h.uri.clone(),
                    control_plane: h.control_plane.unwrap_or(true),
                    network: h.network.clone().unwrap_or_else(|| self.network.clone()),
                    base_pool: h.base_pool.clone().unwrap_or_else(|| self.base_pool.clone()),
                    domain_pool: h.domain_pool.clone().unwrap_or_else(|| self.domain_pool.clone()),
                    credentials: h.credentials_ref.as_ref().map(|r| r.name.clone()).or_else(|| credentials.clone()),
                })
                .collect(),
            (None, Some(uri)) => vec![ClusterHost {
                name: String::new(),
                uri: uri.clone(),
                control_plane: true,
                network: self.network.clone(),
                base_pool: self.base_pool.clone(),
                domain_pool: self.domain_pool.clone(),
                credentials,
            }],
            (None, None) => Vec::new(),
        }
    }

    /// Why the host list cannot be used (the API server's validation catches
    /// these too; this covers objects stored before it existed): no host, or
    /// two hosts with the same name or URI.
    pub fn host_list_problem(&self) -> Option<String> {
        let hosts = self.hosts();
        if hosts.is_empty() {
            return Some("spec names no host: set spec.uri (one host) or spec.hosts (several)".into());
        }
        for (i, a) in hosts.iter().enumerate() {
            for b in &hosts[..i] {
                if a.name == b.name {
                    return Some(format!("spec.hosts names host {:?} twice: give every host its own name", a.name));
                }
                if a.uri == b.uri {
                    return Some(format!(
                        "spec.hosts lists {} as both host {:?} and host {:?}: a libvirt daemon is one host; list it once",
                        a.uri, b.name, a.name
                    ));
                }
            }
        }
        None
    }
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
