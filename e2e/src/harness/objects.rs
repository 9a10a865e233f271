//! The Kubernetes objects the scenarios create, complete (the local control
//! plane runs no CAPI webhooks, so nothing defaults them): ours typed, from
//! capl-api's builders; CAPI's own kinds, which have no Rust types, as
//! v1beta2 documents. And small typed-less API helpers.

use anyhow::{Context, Result};
use capl_api::builders::ObjectBuilder;
use capl_api::{LibvirtCluster, LibvirtClusterSpec, LibvirtMachine, LibvirtMachineSpec, LibvirtMachineTemplate};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde::Serialize;
use serde_json::{Value, json};

pub use capl_api::GROUP as INFRA_GROUP;
pub use capl_api::capi::CLUSTER_NAME_LABEL;

pub const CAPI_GROUP: &str = "cluster.x-k8s.io";

/// The kinds the scenarios use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Cluster,
    Machine,
    MachineDeployment,
    LibvirtCluster,
    LibvirtMachine,
    LibvirtMachineTemplate,
    Secret,
}

impl Kind {
    pub fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Kind::Cluster => (CAPI_GROUP, "v1beta2", "Cluster", "clusters"),
            Kind::Machine => (CAPI_GROUP, "v1beta2", "Machine", "machines"),
            Kind::MachineDeployment => (CAPI_GROUP, "v1beta2", "MachineDeployment", "machinedeployments"),
            Kind::LibvirtCluster => (INFRA_GROUP, "v1alpha1", "LibvirtCluster", "libvirtclusters"),
            Kind::LibvirtMachine => (INFRA_GROUP, "v1alpha1", "LibvirtMachine", "libvirtmachines"),
            Kind::LibvirtMachineTemplate => {
                (INFRA_GROUP, "v1alpha1", "LibvirtMachineTemplate", "libvirtmachinetemplates")
            }
            Kind::Secret => ("", "v1", "Secret", "secrets"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    pub fn api(self, client: &Client, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), namespace, &self.resource())
    }
}

/// Creates `object` (complete with apiVersion and kind: a typed object or a document).
pub async fn create(client: &Client, namespace: &str, kind: Kind, object: impl Serialize) -> Result<DynamicObject> {
    let object = document(&object)?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let object: DynamicObject = serde_json::from_value(object)?;
    kind.api(client, namespace)
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {kind:?} {namespace}/{name}"))
}

pub async fn get(client: &Client, namespace: &str, kind: Kind, name: &str) -> Result<Option<DynamicObject>> {
    kind.api(client, namespace).get_opt(name).await.with_context(|| format!("reading {kind:?} {namespace}/{name}"))
}

pub async fn list(client: &Client, namespace: &str, kind: Kind) -> Result<Vec<DynamicObject>> {
    Ok(kind
        .api(client, namespace)
        .list(&ListParams::default())
        .await
        .with_context(|| format!("listing {kind:?} in {namespace}"))?
        .items)
}

/// A JSON merge patch of the object's spec (or anything else in `patch`).
pub async fn merge_patch(client: &Client, namespace: &str, kind: Kind, name: &str, patch: Value) -> Result<()> {
    kind.api(client, namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("patching {kind:?} {namespace}/{name} with {patch}"))?;
    Ok(())
}

/// Deletes the object (background propagation); a missing object is fine.
pub async fn delete(client: &Client, namespace: &str, kind: Kind, name: &str) -> Result<()> {
    match kind.api(client, namespace).delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err).with_context(|| format!("deleting {kind:?} {namespace}/{name}")),
    }
}

/// Where the machines of a cluster go: the LibvirtCluster's spec and the image.
#[derive(Debug, Clone)]
pub struct Placement {
    pub uri: String,
    pub network: String,
    pub base_pool: String,
    pub domain_pool: String,
    pub image: String,
    /// A free address outside the DHCP range for the (unused) control plane endpoint.
    pub endpoint_host: String,
    /// The Secret (in the Cluster's namespace) with the host's credentials, if it needs any.
    pub credentials: Option<String>,
}

pub fn cluster(namespace: &str, name: &str, paused: bool) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "paused": paused,
            "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "LibvirtCluster", "name": name},
        },
    })
}

/// `object` as the JSON document it is sent as.
pub fn document(object: &impl Serialize) -> Result<Value> {
    serde_json::to_value(object).context("serializing an object")
}

pub fn libvirt_cluster(namespace: &str, name: &str, placement: &Placement) -> LibvirtCluster {
    let mut spec =
        LibvirtClusterSpec::one_host(&placement.uri, &placement.network, &placement.base_pool, &placement.domain_pool)
            .with_endpoint(&placement.endpoint_host, 6443);
    if let Some(secret) = &placement.credentials {
        spec = spec.with_credentials(secret);
    }
    LibvirtCluster::from_spec(name, spec).in_namespace(namespace).of_cluster(name)
}

/// A bootstrap data Secret as a bootstrap provider would write it.
pub fn bootstrap_secret(namespace: &str, name: &str, cluster: &str, user_data: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {CLUSTER_NAME_LABEL: cluster}},
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"format": "cloud-config", "value": user_data},
    })
}

/// The cloud-config every scenario's machines get.
pub fn user_data(cluster: &str) -> String {
    format!("#cloud-config\nruncmd:\n- echo \"hello from {cluster}\"\n")
}

pub fn machine(namespace: &str, name: &str, cluster: &str, secret: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": namespace, "labels": {CLUSTER_NAME_LABEL: cluster}},
        "spec": {
            "clusterName": cluster,
            "bootstrap": {"dataSecretName": secret},
            "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "LibvirtMachine", "name": name},
        },
    })
}

/// A small machine: 1 vCPU, 256 MiB, a 2 GiB disk (the root disk may not be
/// smaller than the base image: the simulator's is 2 GiB; the overlay is sparse).
fn machine_spec(image: &str) -> LibvirtMachineSpec {
    LibvirtMachineSpec::sized(image, 1, 256, 2)
}

/// A LibvirtMachine; with `owner` (Machine name and UID) it carries the owner
/// reference CAPI would set, so the provider does not depend on CAPI for it.
pub fn libvirt_machine(
    namespace: &str,
    name: &str,
    cluster: &str,
    image: &str,
    owner: Option<(&str, &str)>,
) -> LibvirtMachine {
    let object = LibvirtMachine::from_spec(name, machine_spec(image)).in_namespace(namespace).of_cluster(cluster);
    match owner {
        Some((machine, uid)) => object.controlled_by::<capl_api::capi::Machine>(machine, uid),
        None => object,
    }
}

pub fn libvirt_machine_template(namespace: &str, name: &str, cluster: &str, image: &str) -> LibvirtMachineTemplate {
    LibvirtMachineTemplate::stamping(name, machine_spec(image)).in_namespace(namespace).of_cluster(cluster)
}

/// A MachineDeployment whose Machines use a bootstrap Secret by name (no
/// bootstrap provider) and LibvirtMachines from `template`.
pub fn machine_deployment(
    namespace: &str,
    name: &str,
    cluster: &str,
    replicas: i64,
    template: &str,
    secret: &str,
) -> Value {
    let labels = json!({CLUSTER_NAME_LABEL: cluster, "cluster.x-k8s.io/deployment-name": name});
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": namespace, "labels": {CLUSTER_NAME_LABEL: cluster}},
        "spec": {
            "clusterName": cluster,
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            // What CAPI's defaulting webhook would fill in (no webhooks run here).
            "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
            "deletion": {"order": "Random"},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "clusterName": cluster,
                    "bootstrap": {"dataSecretName": secret},
                    "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": "LibvirtMachineTemplate", "name": template},
                },
            },
        },
    })
}

/// `object.data[path...]` as a string, if present.
pub fn str_at<'a>(object: &'a DynamicObject, path: &[&str]) -> Option<&'a str> {
    value_at(&object.data, path).and_then(Value::as_str)
}

pub fn value_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, key| v.get(*key))
}

/// The status of condition `type_` in `object.status.conditions`.
pub fn condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<(&'a str, &'a str)> {
    condition_entry(object, type_).map(|c| (c["status"].as_str().unwrap_or(""), c["reason"].as_str().unwrap_or("")))
}

/// The entry of type `type_` in `status.conditions`.
pub fn condition_entry<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    value_at(&object.data, &["status", "conditions"])?.as_array()?.iter().find(|c| c["type"] == type_)
}

/// The first `InternalIP` of `status.addresses`.
pub fn internal_ip(object: &DynamicObject) -> Option<String> {
    value_at(&object.data, &["status", "addresses"])?
        .as_array()?
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .map(str::to_string)
}

pub fn uid(object: &DynamicObject) -> String {
    object.metadata.uid.clone().unwrap_or_default()
}

pub fn name(object: &DynamicObject) -> String {
    object.metadata.name.clone().unwrap_or_default()
}
