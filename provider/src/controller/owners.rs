//! Where an object of ours stands among CAPI's: its owner of a kind, the
//! Cluster it belongs to, and whether its reconciliation is paused. Read by
//! every reconciler.

use kube::ResourceExt;

use crate::api::LibvirtCluster;
use crate::api::capi::{CLUSTER_NAME_LABEL, Cluster, PAUSED_ANNOTATION};

/// The name of the owner of `kind` (a CAPI kind) in the object's ownerReferences, if any.
pub(crate) fn owner_name(object: &impl ResourceExt, kind: &str) -> Option<String> {
    object
        .owner_references()
        .iter()
        .find(|o| o.kind == kind && o.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|o| o.name.clone())
}

/// Why reconciliation is paused, if it is.
pub(crate) fn paused_reason(object: &impl ResourceExt, cluster: Option<&Cluster>) -> Option<String> {
    if let Some(cluster) = cluster
        && cluster.spec.paused == Some(true)
    {
        return Some(format!("Cluster {} has spec.paused set", cluster.name_any()));
    }
    object
        .annotations()
        .contains_key(PAUSED_ANNOTATION)
        .then(|| format!("the object has the {PAUSED_ANNOTATION} annotation"))
}

/// The name of the Cluster this LibvirtCluster belongs to: CAPI's label, else the owner reference.
pub(crate) fn cluster_name_of(object: &LibvirtCluster) -> Option<String> {
    object.labels().get(CLUSTER_NAME_LABEL).cloned().or_else(|| owner_name(object, "Cluster"))
}
