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
use super::context::{Context, get_optional};
use super::error::Error;
use super::owners::{cluster_name_of, owner_name, paused_reason};
use super::{credentials, object_patch};
use crate::api::capi::{CLUSTER_NAME_LABEL, Cluster, MANAGED_BY_ANNOTATION};
use crate::api::conditions::{INFRASTRUCTURE_READY, reasons};
use crate::api::{
    CLUSTER_FINALIZER, ClusterHost, ENDPOINT_DNS_HOST_ANNOTATION, FailureDomain, Initialization, LibvirtCluster,
    LibvirtClusterStatus, LibvirtMachine, SKIP_HOST_CLEANUP_ANNOTATION,
};
use capl_host::infra::{InfraSpec, check_infrastructure};

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
        // An endpoint from IPAM or from the libvirt network, then written into the spec (set once).
        let allocated = match (&from.pool, &from.network) {
            (Some(pool), _) => endpoint_from_pool(ctx, object, &ns, pool, cluster).await?,
            (None, Some(_)) => endpoint_from_network(ctx, object, &api, &ns).await?,
            (None, None) => Allocated::Waiting(
                reasons::INVALID_HOSTS,
                format!(
                    "LibvirtCluster {}: controlPlaneEndpointFrom names neither pool nor network",
                    object.name_any()
                ),
            ),
        };
        match allocated {
            Allocated::Address { host, note } => {
                let endpoint = crate::api::ApiEndpoint { host, port: from.port.unwrap_or(6443) };
                object_patch::patch_spec(
                    &api,
                    &object.name_any(),
                    serde_json::json!({ "controlPlaneEndpoint": endpoint }),
                )
                .await?;
                let note = format!("{}:{} {note}", endpoint.host, endpoint.port);
                ctx.event(object, EventType::Normal, "EndpointAllocated", "AllocateEndpoint", &note).await;
                snapshot.spec_endpoint = Some(endpoint);
            }
            Allocated::Waiting(reason, message) => snapshot.endpoint_waiting = Some((reason, message)),
            Allocated::NotYet => {}
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
                if let Some(from) = &object.spec.control_plane_endpoint_from {
                    // The allocated endpoint's address goes back to its pool, or to the network.
                    if from.pool.is_some() {
                        let owner = ClaimOwner::of(object);
                        addresses::release_one(ctx, &ns, &owner, &endpoint_claim_name(&object.name_any())).await?;
                    }
                    if from.network.is_some()
                        && let Some(requeue) = release_network_endpoint(ctx, object, &ns).await?
                    {
                        return Ok(requeue);
                    }
                }
                object_patch::remove_finalizer(&api, object, CLUSTER_FINALIZER).await?;
                return Ok(Action::await_change());
            }
        }
    };

    report(object, ctx, &api, &plan, failure_domains).await?;
    Ok(plan.requeue.map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// What an allocation of the control-plane endpoint came to in this reconcile.
enum Allocated {
    /// The address, and where it came from (for the event).
    Address { host: String, note: String },
    /// Not yet, or not possible: the condition's reason and message.
    Waiting(&'static str, String),
    /// Nothing to report (the claim has no address yet and said nothing).
    NotYet,
}

async fn endpoint_from_pool(
    ctx: &Context,
    object: &LibvirtCluster,
    ns: &str,
    pool: &crate::api::PoolReference,
    cluster: &str,
) -> Result<Allocated, Error> {
    let owner = ClaimOwner::of(object);
    let claim = endpoint_claim_name(&object.name_any());
    Ok(match addresses::claim_one(ctx, ns, &owner, &claim, pool, Some(cluster)).await? {
        Claimed::Ready(found) if !found.is_empty() => Allocated::Address {
            host: found[0].address.to_string(),
            note: format!("from {} {} (IPAddressClaim {claim})", pool.kind, pool.name),
        },
        Claimed::Ready(_) => Allocated::NotYet,
        Claimed::Waiting { reason, message } | Claimed::Failed { reason, message } => {
            Allocated::Waiting(reason, message)
        }
    })
}

/// The DNS host name of this LibvirtCluster's endpoint entry: recorded in an annotation
/// before the entry is made (so it survives `clusterctl move`, which gives the object a
/// new UID), derived from the UID the first time.
async fn endpoint_dns_name(object: &LibvirtCluster, api: &Api<LibvirtCluster>) -> Result<String, Error> {
    if let Some(name) = object.annotations().get(ENDPOINT_DNS_HOST_ANNOTATION) {
        return Ok(name.clone());
    }
    let name = capl_host::endpoint::endpoint_hostname(&object.uid().unwrap_or_default());
    let patch = serde_json::json!({ "metadata": { "annotations": { ENDPOINT_DNS_HOST_ANNOTATION: name } } });
    api.patch(&object.name_any(), &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await?;
    Ok(name)
}

async fn endpoint_from_network(
    ctx: &Context,
    object: &LibvirtCluster,
    api: &Api<LibvirtCluster>,
    ns: &str,
) -> Result<Allocated, Error> {
    let owner = format!("LibvirtCluster {}", object.name_any());
    let hosts = object.spec.hosts();
    let [host] = hosts.as_slice() else {
        return Ok(Allocated::Waiting(
            reasons::INVALID_HOSTS,
            format!(
                "{owner}: an endpoint from the libvirt network needs the one-host form (spec.uri); take it from an IPAM pool (controlPlaneEndpointFrom.pool)"
            ),
        ));
    };
    let opened = match credentials::host_connection_uri(ctx, ns, host, &owner, false).await? {
        Ok(opened) => opened,
        Err(unusable) => return Ok(Allocated::Waiting(unusable.reason, unusable.message)),
    };
    let hostname = endpoint_dns_name(object, api).await?;
    let (network, name) = (host.network.clone(), hostname.clone());
    let started = Instant::now();
    let result =
        ctx.connections.host(&opened).call(move |h| capl_host::endpoint::allocate_endpoint(h, &network, &name)).await;
    ctx.metrics.host_operation("allocate_endpoint", started.elapsed());
    Ok(match result {
        Ok(ip) => Allocated::Address {
            host: ip.to_string(),
            note: format!("from libvirt network {} on {} (DNS host entry {hostname})", host.network, host.uri),
        },
        Err(err) => Allocated::Waiting(
            super::host_failure::cluster_reason(err.kind()),
            credentials::as_user_wrote_it(format!("{owner}: {err}"), &opened, &host.uri),
        ),
    })
}

/// Deletes the endpoint's DNS host entry from the network (only the entry of this
/// LibvirtCluster's name). `Some(action)` when it must be tried again (the host did not
/// answer, said in a Warning event); with the skip-host-cleanup annotation the entry is
/// left, said in a Warning event.
async fn release_network_endpoint(ctx: &Context, object: &LibvirtCluster, ns: &str) -> Result<Option<Action>, Error> {
    let Some(hostname) = object.annotations().get(ENDPOINT_DNS_HOST_ANNOTATION).cloned() else { return Ok(None) };
    let hosts = object.spec.hosts();
    let [host] = hosts.as_slice() else { return Ok(None) };
    let owner = format!("LibvirtCluster {}", object.name_any());
    if object.annotations().contains_key(SKIP_HOST_CLEANUP_ANNOTATION) {
        let note = format!(
            "{SKIP_HOST_CLEANUP_ANNOTATION} is set: the DNS host entry {hostname} of the endpoint stays on network {} on {}",
            host.network, host.uri
        );
        ctx.event(object, EventType::Warning, "HostCleanupSkipped", "Delete", &note).await;
        return Ok(None);
    }
    let failed = |message: String| async move {
        ctx.event(object, EventType::Warning, "EndpointReleaseFailed", "Delete", &message).await;
        Ok(Some(Action::requeue(std::time::Duration::from_secs(20))))
    };
    let opened = match credentials::host_connection_uri(ctx, ns, host, &owner, true).await? {
        Ok(opened) => opened,
        Err(unusable) => return failed(unusable.message).await,
    };
    let (network, name) = (host.network.clone(), hostname.clone());
    let result =
        ctx.connections.host(&opened).call(move |h| capl_host::endpoint::release_endpoint(h, &network, &name)).await;
    match result {
        Ok(Some(ip)) => {
            let note = format!("released {ip} (DNS host entry {hostname}) on network {} on {}", host.network, host.uri);
            ctx.event(object, EventType::Normal, "EndpointReleased", "Delete", &note).await;
            Ok(None)
        }
        Ok(None) => Ok(None),
        Err(err) => {
            let message = credentials::as_user_wrote_it(
                format!(
                    "{owner}: {err}; the endpoint's DNS host entry {hostname} is released once the host answers (or set {SKIP_HOST_CLEANUP_ANNOTATION} to leave it)"
                ),
                &opened,
                &host.uri,
            );
            failed(message).await
        }
    }
}

/// The IPAddressClaim of an allocated control-plane endpoint.
pub fn endpoint_claim_name(libvirt_cluster: &str) -> String {
    format!("{libvirt_cluster}-endpoint")
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
    let opened = match credentials::host_connection_uri(ctx, &ns, host, &owner, false).await? {
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
