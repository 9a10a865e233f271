//! Which of our objects a change to another object concerns.

use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::api::capi::{CLUSTER_NAME_LABEL, Cluster, Machine};
use crate::api::{GROUP, LibvirtCluster, LibvirtMachine};

/// CAPI's bootstrap data Secrets have this type; only they are watched, so
/// the manager does not cache every Secret of the cluster. A Secret of
/// another type is still picked up by the periodic look while waiting.
pub const BOOTSTRAP_SECRET_FIELDS: &str = "type=cluster.x-k8s.io/secret";

fn is_ours(api_group: &str, kind: &str, want: &str) -> bool {
    api_group == GROUP && kind == want
}

/// A Cluster -> its LibvirtCluster, through `spec.infrastructureRef`.
pub fn libvirt_cluster_of_cluster(cluster: Cluster) -> Option<ObjectRef<LibvirtCluster>> {
    let reference = cluster.spec.infrastructure_ref.as_ref()?;
    is_ours(&reference.api_group, &reference.kind, "LibvirtCluster")
        .then(|| ObjectRef::new(&reference.name).within(&cluster.namespace().unwrap_or_default()))
}

/// A Machine -> its LibvirtMachine, through `spec.infrastructureRef`.
pub fn libvirt_machine_of_machine(machine: Machine) -> Option<ObjectRef<LibvirtMachine>> {
    let reference = &machine.spec.infrastructure_ref;
    is_ours(&reference.api_group, &reference.kind, "LibvirtMachine")
        .then(|| ObjectRef::new(&reference.name).within(&machine.namespace().unwrap_or_default()))
}

fn machines_labelled(store: &Store<LibvirtMachine>, namespace: &str, cluster: &str) -> Vec<ObjectRef<LibvirtMachine>> {
    store
        .state()
        .iter()
        .filter(|m| {
            m.namespace().as_deref() == Some(namespace)
                && m.labels().get(CLUSTER_NAME_LABEL).map(String::as_str) == Some(cluster)
        })
        .map(|m| ObjectRef::from_obj(m.as_ref()))
        .collect()
}

/// A Cluster (paused, unpaused, infrastructure provisioned) -> its LibvirtMachines.
pub fn libvirt_machines_of_cluster(store: &Store<LibvirtMachine>, cluster: &Cluster) -> Vec<ObjectRef<LibvirtMachine>> {
    machines_labelled(store, &cluster.namespace().unwrap_or_default(), &cluster.name_any())
}

/// A LibvirtCluster -> the LibvirtMachines of its Cluster.
pub fn libvirt_machines_of_libvirt_cluster(
    store: &Store<LibvirtMachine>,
    cluster: &LibvirtCluster,
) -> Vec<ObjectRef<LibvirtMachine>> {
    match cluster.labels().get(CLUSTER_NAME_LABEL) {
        Some(name) => machines_labelled(store, &cluster.namespace().unwrap_or_default(), name),
        None => Vec::new(),
    }
}

/// A LibvirtMachine (changed or gone) -> the LibvirtCluster of its Cluster,
/// only while that one is being deleted: it waits for its machines to go.
pub fn deleting_libvirt_clusters_of_machine(
    store: &Store<LibvirtCluster>,
    machine: &LibvirtMachine,
) -> Vec<ObjectRef<LibvirtCluster>> {
    let Some(cluster) = machine.labels().get(CLUSTER_NAME_LABEL) else { return Vec::new() };
    let namespace = machine.namespace();
    store
        .state()
        .iter()
        .filter(|lc| lc.meta().deletion_timestamp.is_some() && lc.namespace() == namespace)
        .filter(|lc| super::cluster::cluster_name_of(lc).as_ref() == Some(cluster))
        .map(|lc| ObjectRef::from_obj(lc.as_ref()))
        .collect()
}

/// A bootstrap Secret -> the LibvirtMachines whose Machine names it.
pub fn libvirt_machines_of_secret(machines: &Store<Machine>, secret: &Secret) -> Vec<ObjectRef<LibvirtMachine>> {
    let namespace = secret.namespace().unwrap_or_default();
    let name = secret.name_any();
    machines
        .state()
        .iter()
        .filter(|m| m.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|m| m.spec.bootstrap.data_secret_name.as_deref() == Some(name.as_str()))
        .filter_map(|m| libvirt_machine_of_machine(m.as_ref().clone()))
        .collect()
}

/// A credentials Secret (metadata only) -> the LibvirtClusters whose `credentialsRef` names it.
pub fn libvirt_clusters_of_credentials(
    store: &Store<LibvirtCluster>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<LibvirtCluster>> {
    let (namespace, name) = (secret.namespace(), secret.name_any());
    store
        .state()
        .iter()
        .filter(|lc| lc.namespace() == namespace)
        .filter(|lc| lc.spec.credentials_ref.as_ref().is_some_and(|r| r.name == name))
        .map(|lc| ObjectRef::from_obj(lc.as_ref()))
        .collect()
}

/// A credentials Secret (metadata only) -> the LibvirtMachines that recorded
/// it as their host's credentials (a deletion waiting for it comes back).
pub fn libvirt_machines_of_credentials(
    store: &Store<LibvirtMachine>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<LibvirtMachine>> {
    let (namespace, name) = (secret.namespace(), secret.name_any());
    store
        .state()
        .iter()
        .filter(|lm| lm.namespace() == namespace)
        .filter(|lm| lm.status.as_ref().and_then(|s| s.credentials_ref.as_ref()).is_some_and(|r| r.name == name))
        .map(|lm| ObjectRef::from_obj(lm.as_ref()))
        .collect()
}
