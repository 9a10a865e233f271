//! Typed builders of this API's objects, for the test kits, the e2e suite
//! and the benchmarks: an object is made by its kind's `from_spec`, a spec
//! by the constructors below, and its metadata by the steps of
//! [`ObjectBuilder`].
//!
//! A built object holds exactly the fields it was given: every optional
//! field left out serializes to nothing, so a server-side apply of it owns
//! no more than what was set. (kube's derived `new` is not for this: it adds
//! the CRD's own labels to the object's metadata.)

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::capi::CLUSTER_NAME_LABEL;
use crate::{
    ApiEndpoint, ChecksumType, ImageFormat, ImageUrl, LibvirtCluster, LibvirtClusterSpec, LibvirtClusterTemplate,
    LibvirtClusterTemplateResource, LibvirtClusterTemplateSpec, LibvirtHost, LibvirtMachine, LibvirtMachineSpec,
    LibvirtMachineTemplate, LibvirtMachineTemplateResource, LibvirtMachineTemplateSpec, SecretReference,
};

/// Metadata holding the name only.
fn named(name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() }
}

impl LibvirtCluster {
    /// The LibvirtCluster `name` with `spec`, no status.
    pub fn from_spec(name: &str, spec: LibvirtClusterSpec) -> Self {
        Self { metadata: named(name), spec, status: None }
    }
}

impl LibvirtMachine {
    /// The LibvirtMachine `name` with `spec`, no status.
    pub fn from_spec(name: &str, spec: LibvirtMachineSpec) -> Self {
        Self { metadata: named(name), spec, status: None }
    }
}

impl LibvirtClusterSpec {
    /// The one-host form: the host at `uri`, its network and pools, and
    /// nothing else (no endpoint, no credentials).
    pub fn one_host(uri: &str, network: &str, base_pool: &str, domain_pool: &str) -> Self {
        Self {
            uri: Some(uri.into()),
            hosts: None,
            network: network.into(),
            base_pool: base_pool.into(),
            domain_pool: domain_pool.into(),
            control_plane_endpoint: None,
            control_plane_endpoint_from: None,
            credentials_ref: None,
        }
    }

    /// The several-hosts form: `hosts`, each a failure domain, with the
    /// network and pools every host that names none uses.
    pub fn several_hosts(hosts: Vec<LibvirtHost>, network: &str, base_pool: &str, domain_pool: &str) -> Self {
        Self { uri: None, hosts: Some(hosts), ..Self::one_host("", network, base_pool, domain_pool) }
    }

    /// With `spec.controlPlaneEndpoint` set to `host:port`.
    pub fn with_endpoint(mut self, host: &str, port: i32) -> Self {
        self.control_plane_endpoint = Some(ApiEndpoint { host: host.into(), port });
        self
    }

    /// With `spec.credentialsRef` naming the Secret `secret`.
    pub fn with_credentials(mut self, secret: &str) -> Self {
        self.credentials_ref = Some(SecretReference { name: secret.into() });
        self
    }
}

impl LibvirtHost {
    /// The host `name` at `uri`, with the cluster's defaults for the rest.
    pub fn at(name: &str, uri: &str) -> Self {
        Self {
            name: name.into(),
            uri: uri.into(),
            control_plane: None,
            network: None,
            base_pool: None,
            domain_pool: None,
            credentials_ref: None,
        }
    }
}

impl LibvirtMachineSpec {
    /// A machine of `vcpu` CPUs, `memory_mib` MiB and a `disk_gib` GiB root
    /// disk over `image`, and nothing else (no pools, no extra NICs, no
    /// provider ID).
    pub fn sized(image: &str, vcpu: i32, memory_mib: i32, disk_gib: i32) -> Self {
        Self {
            vcpu,
            memory_mib,
            disk_gib,
            image: Some(image.into()),
            image_url: None,
            addresses_from_pools: None,
            nameservers: None,
            additional_networks: None,
            cpu: None,
            firmware: None,
            data_disks: None,
            provider_id: None,
        }
    }
}

impl LibvirtMachineSpec {
    /// This spec with its base image downloaded from `url` (format qcow2)
    /// instead of a volume of basePool.
    pub fn from_url(mut self, url: &str, checksum_type: ChecksumType, checksum: &str) -> Self {
        self.image = None;
        self.image_url =
            Some(ImageUrl { url: url.into(), checksum: checksum.into(), checksum_type, format: ImageFormat::Qcow2 });
        self
    }
}

impl LibvirtMachineTemplate {
    /// The template `name` that stamps out LibvirtMachines with `spec`.
    pub fn stamping(name: &str, spec: LibvirtMachineSpec) -> Self {
        let spec = LibvirtMachineTemplateSpec { template: LibvirtMachineTemplateResource { metadata: None, spec } };
        Self { metadata: named(name), spec, status: None }
    }
}

impl LibvirtClusterTemplate {
    /// The template `name` that stamps out LibvirtClusters with `spec`.
    pub fn stamping(name: &str, spec: LibvirtClusterSpec) -> Self {
        let spec = LibvirtClusterTemplateSpec { template: LibvirtClusterTemplateResource { metadata: None, spec } };
        Self { metadata: named(name), spec }
    }
}

/// The metadata steps every kind shares (CAPI's mirrored kinds included).
pub trait ObjectBuilder: Resource + Sized {
    /// In namespace `namespace`.
    fn in_namespace(mut self, namespace: &str) -> Self {
        self.meta_mut().namespace = Some(namespace.into());
        self
    }

    /// With label `key: value`.
    fn label(mut self, key: &str, value: &str) -> Self {
        self.meta_mut().labels.get_or_insert_with(BTreeMap::new).insert(key.into(), value.into());
        self
    }

    /// Of the CAPI cluster `cluster`: its cluster-name label, as CAPI sets it.
    fn of_cluster(self, cluster: &str) -> Self {
        self.label(CLUSTER_NAME_LABEL, cluster)
    }

    /// Controlled by the `O` named `name` with UID `uid` (e.g. a
    /// LibvirtMachine by its [`crate::capi::Machine`]), with the owner
    /// reference CAPI would set.
    fn controlled_by<O: Resource<DynamicType = ()>>(mut self, name: &str, uid: &str) -> Self {
        self.meta_mut().owner_references.get_or_insert_with(Vec::new).push(OwnerReference {
            api_version: O::api_version(&()).into_owned(),
            kind: O::kind(&()).into_owned(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        });
        self
    }
}

impl<K: Resource> ObjectBuilder for K {}
