//! The LibvirtCluster reconciler: gather, decide ([`super::cluster_decision`]), act, report.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};

use super::addresses::{self, ClaimOwner, Claimed};
use super::cluster_decision::{ClusterAction, ClusterPlan, ClusterSnapshot, InfraCheck, decide};
use super::condition_list::{self, Status};
use super::{Context, Error, credentials, object_patch};
use crate::api::capi::{CLUSTER_NAME_LABEL, Cluster, MANAGED_BY_ANNOTATION, PAUSED_ANNOTATION};
use crate::api::conditions::{INFRASTRUCTURE_READY, reasons};
use crate::api::{
    CLUSTER_FINALIZER, ClusterHost, FailureDomain, Initialization, LibvirtCluster, LibvirtClusterStatus, LibvirtMachine,
};
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
        endpoint_waiting: None,
        several_hosts: false,
        unhealthy_hosts: Vec::new(),
        machines,
    };

    let no_endpoint = |e: &Option<crate::api::ApiEndpoint>| e.as_ref().is_none_or(|e| e.host.is_empty());
    if let Some(from) = &object.spec.control_plane_endpoint_from
        && !deleting
        && snapshot.has_finalizer
        && snapshot.paused.is_none()
        && no_endpoint(&snapshot.spec_endpoint)
        && let Some((cluster, cluster_endpoint)) = &snapshot.owner_cluster
        && no_endpoint(cluster_endpoint)
    {
        // An endpoint from IPAM: claimed, then written into the spec (set once).
        let owner = ClaimOwner::of(object);
        let claim = endpoint_claim_name(&object.name_any());
        match addresses::claim_one(ctx, &ns, &owner, &claim, &from.pool, Some(cluster)).await? {
            Claimed::Ready(found) if !found.is_empty() => {
                let endpoint =
                    crate::api::ApiEndpoint { host: found[0].address.to_string(), port: from.port.unwrap_or(6443) };
                object_patch::patch_spec(
                    &api,
                    &object.name_any(),
                    serde_json::json!({ "controlPlaneEndpoint": endpoint }),
                )
                .await?;
                let note = format!(
                    "{}:{} from {} {} (IPAddressClaim {claim})",
                    endpoint.host, endpoint.port, from.pool.kind, from.pool.name
                );
                ctx.event(object, EventType::Normal, "EndpointAllocated", "AllocateEndpoint", &note).await;
                snapshot.spec_endpoint = Some(endpoint);
            }
            Claimed::Ready(_) => {}
            Claimed::Waiting { reason, message } | Claimed::Failed { reason, message } => {
                snapshot.endpoint_waiting = Some((reason, message));
            }
        }
    }

    // Decide and act until the plan has no more steps for this reconcile.
    let mut failure_domains = None;
    let plan = loop {
        let plan = decide(&snapshot);
        match plan.action {
            ClusterAction::Nothing => break plan,
            ClusterAction::AddFinalizer => {
                object_patch::add_finalizer(&api, object, CLUSTER_FINALIZER).await?;
                snapshot.has_finalizer = true;
            }
            ClusterAction::CheckHost => {
                let checked = check_hosts(object, ctx).await?;
                snapshot.host = checked.check.unwrap_or(InfraCheck::NotChecked);
                snapshot.several_hosts = object.spec.hosts.is_some();
                snapshot.unhealthy_hosts = checked.unhealthy;
                failure_domains = checked.failure_domains;
            }
            ClusterAction::RemoveFinalizer => {
                if object.spec.control_plane_endpoint_from.is_some() {
                    // The allocated endpoint's address goes back to its pool.
                    let owner = ClaimOwner::of(object);
                    addresses::release_one(ctx, &ns, &owner, &endpoint_claim_name(&object.name_any())).await?;
                }
                object_patch::remove_finalizer(&api, object, CLUSTER_FINALIZER).await?;
                return Ok(Action::await_change());
            }
        }
    };

    report(object, ctx, &api, &plan, failure_domains).await?;
    Ok(plan.requeue.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// The IPAddressClaim of an allocated control-plane endpoint.
pub fn endpoint_claim_name(libvirt_cluster: &str) -> String {
    format!("{libvirt_cluster}-endpoint")
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

/// The outcome of checking every host of a LibvirtCluster.
#[derive(Debug, Default)]
struct HostsChecked {
    /// The summary decide works with: Ready when some host can run control-plane machines.
    check: Option<InfraCheck>,
    /// One message per host that failed its check (only when the cluster lists hosts).
    unhealthy: Vec<String>,
    /// The failure domains to report: the healthy hosts (only when the cluster lists hosts).
    failure_domains: Option<Vec<FailureDomain>>,
}

async fn check_hosts(object: &LibvirtCluster, ctx: &Context) -> Result<HostsChecked, Error> {
    let owner = format!("LibvirtCluster {}", object.name_any());
    if let Some(problem) = object.spec.host_list_problem() {
        let check = InfraCheck::Failed {
            reason: reasons::INVALID_HOSTS,
            message: format!("{owner}: {problem}"),
            transient: false,
        };
        return Ok(HostsChecked { check: Some(check), ..Default::default() });
    }
    let hosts = object.spec.hosts();
    let checks = futures::future::join_all(hosts.iter().map(|h| check_host(object, h, ctx))).await;
    let mut results = Vec::new();
    for (host, check) in hosts.iter().zip(checks) {
        results.push((host, check?));
    }
    if object.spec.hosts.is_none() {
        // The one-host form: its check is the cluster's, and it has no failure domains.
        let check = results.pop().map(|(_, c)| c);
        return Ok(HostsChecked { check, ..Default::default() });
    }
    let unhealthy: Vec<String> = results
        .iter()
        .filter_map(|(h, c)| match c {
            InfraCheck::Failed { message, .. } => Some(format!("{}: {message}", h.describe())),
            _ => None,
        })
        .collect();
    let healthy: Vec<&ClusterHost> = results.iter().filter(|(_, c)| *c == InfraCheck::Ready).map(|(h, _)| *h).collect();
    let check = if healthy.iter().any(|h| h.control_plane) {
        InfraCheck::Ready
    } else {
        let first = results.iter().find_map(|(_, c)| match c {
            InfraCheck::Failed { reason, .. } => Some(*reason),
            _ => None,
        });
        let transient = results.iter().any(|(_, c)| matches!(c, InfraCheck::Failed { transient: true, .. }));
        let message = if unhealthy.is_empty() {
            format!(
                "{owner}: no host may run control-plane machines: set controlPlane: true on at least one of spec.hosts"
            )
        } else {
            format!("{owner}: no host that may run control-plane machines is ready: {}", unhealthy.join("; "))
        };
        InfraCheck::Failed { reason: first.unwrap_or(reasons::INVALID_HOSTS), message, transient }
    };
    let failure_domains = healthy
        .iter()
        .map(|h| FailureDomain {
            name: h.name.clone(),
            control_plane: Some(h.control_plane),
            attributes: Some([("uri".to_string(), h.uri.clone())].into()),
        })
        .collect();
    Ok(HostsChecked { check: Some(check), unhealthy, failure_domains: Some(failure_domains) })
}

/// Checks one host's network and pools.
async fn check_host(object: &LibvirtCluster, host: &ClusterHost, ctx: &Context) -> Result<InfraCheck, Error> {
    let spec = InfraSpec {
        network: host.network.clone(),
        base_pool: host.base_pool.clone(),
        domain_pool: host.domain_pool.clone(),
    };
    let uri = &host.uri;
    let ns = object.namespace().unwrap_or_default();
    let owner = format!("LibvirtCluster {}", object.name_any());
    let opened = match credentials::host_connection_uri(ctx, &ns, host, &owner).await? {
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
    failure_domains: Option<Vec<FailureDomain>>,
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
        // The healthy hosts when they were checked; else what was reported last.
        failure_domains: failure_domains.or_else(|| old.failure_domains.clone()),
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
