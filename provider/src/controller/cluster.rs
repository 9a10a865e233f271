//! The LibvirtCluster reconciler: gather, decide ([`super::cluster_decision`]), act, report.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};

use super::cluster_decision::{ClusterAction, ClusterPlan, ClusterSnapshot, InfraCheck, decide};
use super::condition_list::{self, Status};
use super::{Context, Error, credentials, object_patch};
use crate::api::capi::{CLUSTER_NAME_LABEL, Cluster, MANAGED_BY_ANNOTATION, PAUSED_ANNOTATION};
use crate::api::conditions::INFRASTRUCTURE_READY;
use crate::api::{CLUSTER_FINALIZER, Initialization, LibvirtCluster, LibvirtClusterStatus, LibvirtMachine};
use capl_host::infra::{InfraSpec, check_infrastructure};

/// The owner Cluster named in the object's ownerReferences, if any.
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

pub(crate) async fn get_optional<K>(api: &Api<K>, name: &str) -> Result<Option<K>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api.get_opt(name).await?)
}

pub async fn reconcile(object: Arc<LibvirtCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&object, &ctx).await;
    ctx.metrics.reconciled("libvirtcluster", started.elapsed());
    result
}

async fn reconcile_inner(object: &LibvirtCluster, ctx: &Context) -> Result<Action, Error> {
    let ns = object.namespace().ok_or_else(|| Error::NoNamespace(object.name_any()))?;
    let api: Api<LibvirtCluster> = Api::namespaced(ctx.client.clone(), &ns);

    // Gather.
    let owner = match owner_name(object, "Cluster") {
        Some(name) => get_optional(&Api::<Cluster>::namespaced(ctx.client.clone(), &ns), &name).await?,
        None => None,
    };
    let deleting = object.meta().deletion_timestamp.is_some();
    let machines = if deleting { machines_of_cluster(object, ctx, &ns).await? } else { Vec::new() };
    let mut snapshot = ClusterSnapshot {
        deleting,
        has_finalizer: object.finalizers().iter().any(|f| f == CLUSTER_FINALIZER),
        externally_managed: object.annotations().contains_key(MANAGED_BY_ANNOTATION),
        paused: paused_reason(object, owner.as_ref()),
        owner_cluster: owner.as_ref().map(|c| (c.name_any(), c.spec.control_plane_endpoint.clone())),
        spec_endpoint: object.spec.control_plane_endpoint.clone(),
        host: InfraCheck::NotChecked,
        machines,
    };

    // Decide and act until the plan has no more steps for this reconcile.
    let plan = loop {
        let plan = decide(&snapshot);
        match plan.action {
            ClusterAction::Nothing => break plan,
            ClusterAction::AddFinalizer => {
                object_patch::add_finalizer(&api, object, CLUSTER_FINALIZER).await?;
                snapshot.has_finalizer = true;
            }
            ClusterAction::CheckHost => snapshot.host = check_host(object, ctx).await?,
            ClusterAction::RemoveFinalizer => {
                object_patch::remove_finalizer(&api, object, CLUSTER_FINALIZER).await?;
                return Ok(Action::await_change());
            }
        }
    };

    report(object, ctx, &api, &plan).await?;
    Ok(plan.requeue.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// The name of the Cluster this LibvirtCluster belongs to: CAPI's label, else the owner reference.
pub(crate) fn cluster_name_of(object: &LibvirtCluster) -> Option<String> {
    object.labels().get(CLUSTER_NAME_LABEL).cloned().or_else(|| owner_name(object, "Cluster"))
}

/// The LibvirtMachines of the same Cluster (by CAPI's cluster-name label) that still exist.
async fn machines_of_cluster(object: &LibvirtCluster, ctx: &Context, ns: &str) -> Result<Vec<String>, Error> {
    let Some(cluster) = cluster_name_of(object) else { return Ok(Vec::new()) };
    let api: Api<LibvirtMachine> = Api::namespaced(ctx.client.clone(), ns);
    let list = api.list_metadata(&ListParams::default().labels(&format!("{CLUSTER_NAME_LABEL}={cluster}"))).await?;
    Ok(list.items.into_iter().map(|m| m.name_any()).collect())
}

async fn check_host(object: &LibvirtCluster, ctx: &Context) -> Result<InfraCheck, Error> {
    let spec = InfraSpec {
        network: object.spec.network.clone(),
        base_pool: object.spec.base_pool.clone(),
        domain_pool: object.spec.domain_pool.clone(),
    };
    let uri = &object.spec.uri;
    let ns = object.namespace().unwrap_or_default();
    let owner = format!("LibvirtCluster {}", object.name_any());
    let opened = match credentials::cluster_connection_uri(ctx, &ns, object, &owner).await? {
        Ok(opened) => opened,
        Err(unusable) => {
            return Ok(InfraCheck::Failed {
                reason: unusable.reason,
                message: unusable.message,
                transient: unusable.transient,
            });
        }
    };
    let started = Instant::now();
    let result = ctx.connections.host(&opened).call(move |h| check_infrastructure(h, &spec)).await;
    ctx.metrics.host_operation("check_infrastructure", started.elapsed());
    Ok(match result {
        Ok(()) => InfraCheck::Ready,
        Err(err) => InfraCheck::Failed {
            reason: super::host_failure::cluster_reason(err.kind()),
            message: credentials::as_user_wrote_it(format!("{owner}: {err}"), &opened, uri),
            transient: err.is_transient(),
        },
    })
}

async fn report(
    object: &LibvirtCluster,
    ctx: &Context,
    api: &Api<LibvirtCluster>,
    plan: &ClusterPlan,
) -> Result<(), Error> {
    if plan.conditions.is_empty() {
        return Ok(());
    }
    let old = object.status.clone().unwrap_or_default();
    let mut conditions = old.conditions.clone().unwrap_or_default();
    let before = conditions.clone();
    condition_list::apply(&mut conditions, &plan.conditions, object.meta().generation, Timestamp::now());
    let already = old.initialization.as_ref().and_then(|i| i.provisioned) == Some(true);
    let status = LibvirtClusterStatus {
        initialization: (plan.provisioned || already).then_some(Initialization { provisioned: Some(true) }),
        conditions: Some(conditions.clone()),
        failure_domains: old.failure_domains.clone(),
    };
    if Some(&status) != object.status.as_ref() {
        object_patch::patch_status(api, &object.name_any(), &status).await?;
    }
    // An event for each condition that turned False with a failure reason.
    for update in plan.conditions.iter().filter(|u| u.status == Status::False && u.type_ == INFRASTRUCTURE_READY) {
        let was = before.iter().find(|c| c.type_ == update.type_);
        if was.is_none_or(|c| c.status != "False" || c.message != update.message) {
            ctx.metrics.reconcile_error("libvirtcluster", update.reason);
            ctx.event(object, EventType::Warning, update.reason, "CheckInfrastructure", &update.message).await;
        }
    }
    if plan.provisioned && !already {
        ctx.event(object, EventType::Normal, "Provisioned", "CheckInfrastructure", "network and pools are ready").await;
    }
    Ok(())
}
