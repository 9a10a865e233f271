//! Which of our objects a change to another object concerns.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
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
        .filter(|lc| super::owners::cluster_name_of(lc).as_ref() == Some(cluster))
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
        .filter(|lc| lc.spec.hosts().iter().any(|h| h.credentials.as_deref() == Some(name.as_str())))
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

/// The objects of a watch whose `inputs` changed since the watch last passed
/// them on, and every deleted one.
///
/// A LibvirtMachine's reconcile reads a few fields of its Machine, Cluster and
/// LibvirtCluster; CAPI rewrites the rest of their status all the time (a
/// Cluster's conditions and worker counts change whenever one of its machines
/// does). Passing on every change of a Cluster would reconcile all of its
/// machines on every change of any of them: with hundreds of machines,
/// reconciles without end that starve the ones with work to do.
pub fn when_inputs_change<K, S>(events: S, inputs: fn(&K) -> u64) -> impl Stream<Item = Result<K, watcher::Error>>
where
    K: Resource + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut seen: HashMap<String, u64> = HashMap::new();
    let key = |object: &K| object.meta().uid.clone().unwrap_or_else(|| object.name_any());
    events.filter_map(move |event| {
        let passed = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                let value = inputs(&object);
                (seen.insert(key(&object), value) != Some(value)).then_some(Ok(object))
            }
            Ok(watcher::Event::Delete(object)) => {
                seen.remove(&key(&object));
                Some(Ok(object))
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
            Err(error) => Some(Err(error)),
        };
        futures::future::ready(passed)
    })
}

fn hash_of(value: impl Hash) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// What of an object's metadata any of our reconciles reads: its spec (any
/// change bumps the generation), deletion, labels and annotations (paused).
fn metadata_inputs(meta: &kube::api::ObjectMeta) -> impl Hash + '_ {
    (meta.generation, meta.deletion_timestamp.is_some(), &meta.labels, &meta.annotations)
}

/// What a LibvirtMachine's reconcile reads of a Cluster: [`metadata_inputs`]
/// (spec.paused, the infrastructure reference and the endpoint are spec) and
/// whether its infrastructure is provisioned.
pub fn cluster_inputs(cluster: &Cluster) -> u64 {
    let provisioned =
        cluster.status.as_ref().and_then(|s| s.initialization.as_ref()).and_then(|i| i.infrastructure_provisioned);
    hash_of((metadata_inputs(cluster.meta()), provisioned))
}

/// What a LibvirtMachine's reconcile reads of its Machine: the spec fields
/// bootstrap data Secret, failure domain and cluster name, its deletion,
/// labels and annotations; not the rest of its spec (CAPI copying the
/// LibvirtMachine's providerID into it changes nothing the reconcile reads)
/// and not its status, which CAPI derives from the LibvirtMachine's.
pub fn machine_inputs(machine: &Machine) -> u64 {
    let meta = machine.meta();
    hash_of((
        meta.deletion_timestamp.is_some(),
        &meta.labels,
        &meta.annotations,
        &machine.spec.bootstrap.data_secret_name,
        &machine.spec.failure_domain,
        &machine.spec.cluster_name,
    ))
}

/// An object's spec and [`metadata_inputs`], not its status: what a
/// LibvirtMachine's reconcile reads of its LibvirtCluster (host, network,
/// pools), and what a LibvirtCluster's reads of its owner Cluster
/// (spec.paused, the control plane endpoint), whose status CAPI rewrites
/// whenever one of the cluster's machines changes and would otherwise have
/// the host checked again each time.
pub fn spec_inputs<K: Resource>(object: &K) -> u64 {
    hash_of(metadata_inputs(object.meta()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use serde_json::json;

    /// A Cluster as a watch sees it; every write (CAPI's status updates
    /// included) gives it a new resourceVersion.
    fn cluster(generation: i64, provisioned: bool, version: u32) -> Cluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {
                "name": "c", "namespace": "ns", "uid": "u1",
                "generation": generation, "resourceVersion": version.to_string(),
            },
            "spec": {},
            "status": { "initialization": { "infrastructureProvisioned": provisioned } },
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn only_changes_our_reconciles_read_pass() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let events = [
            Init,
            InitApply(cluster(1, false, 0)),
            InitDone,
            // CAPI rewrites conditions and worker counts all the time: not ours to act on.
            Apply(cluster(1, false, 1)),
            Apply(cluster(1, false, 2)),
            Apply(cluster(1, true, 3)),
            Apply(cluster(2, true, 4)),
            Apply(cluster(2, true, 5)),
            Delete(cluster(2, true, 5)),
        ];
        let passed: Vec<(i64, bool)> = when_inputs_change(stream::iter(events.into_iter().map(Ok)), cluster_inputs)
            .map(|c| {
                let c = c.unwrap();
                let provisioned = c.status.unwrap().initialization.unwrap().infrastructure_provisioned.unwrap();
                (c.metadata.generation.unwrap(), provisioned)
            })
            .collect()
            .await;
        // The first sight, infrastructure provisioned, a spec change, the deletion.
        assert_eq!(passed, [(1, false), (1, true), (2, true), (2, true)]);
    }

    #[tokio::test]
    async fn a_libvirt_cluster_sees_its_clusters_spec_and_deletion_not_its_status() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let events = [
            Init,
            InitApply(cluster(1, false, 0)),
            InitDone,
            Apply(cluster(1, false, 1)),
            Apply(cluster(1, true, 2)),
            Apply(cluster(2, true, 3)),
            Apply(cluster(2, true, 4)),
            Delete(cluster(2, true, 4)),
        ];
        let passed: Vec<(i64, String)> =
            when_inputs_change(stream::iter(events.into_iter().map(Ok)), spec_inputs::<Cluster>)
                .map(|c| {
                    let c = c.unwrap();
                    (c.metadata.generation.unwrap(), c.metadata.resource_version.unwrap())
                })
                .collect()
                .await;
        // The first sight, the spec change, the deletion: none of the status writes.
        assert_eq!(passed, [(1, "0".to_string()), (2, "3".to_string()), (2, "4".to_string())]);
    }

    /// CAPI copying the providerID into the Machine's spec (a new generation)
    /// is not an input; the bootstrap data Secret appearing is.
    #[test]
    fn a_machine_spec_change_counts_only_for_the_fields_we_read() {
        let machine = |secret: Option<&str>, provider_id: Option<&str>, generation: i64| -> Machine {
            serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "kind": "Machine",
                "metadata": { "name": "m", "namespace": "ns", "uid": "u", "generation": generation },
                "spec": { "clusterName": "c", "bootstrap": { "dataSecretName": secret }, "providerID": provider_id,
                          "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "LibvirtMachine", "name": "m" } },
            }))
            .unwrap()
        };
        let waiting = machine_inputs(&machine(None, None, 1));
        let ready = machine_inputs(&machine(Some("m-bootstrap"), None, 2));
        assert_ne!(waiting, ready);
        assert_eq!(ready, machine_inputs(&machine(Some("m-bootstrap"), Some("libvirt://x"), 3)));
    }
}
