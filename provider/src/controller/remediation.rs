//! The LibvirtRemediation reconciler: remediation by reboot for a
//! MachineHealthCheck whose `spec.remediation.templateRef` names a
//! LibvirtRemediationTemplate.
//!
//! The MachineHealthCheck creates a LibvirtRemediation named after the
//! unhealthy Machine and deletes it once the Machine is healthy again. In
//! between, each reconcile decides ([`decide`]) from the spec, the status and
//! the Machine's `HealthCheckSucceeded` condition:
//! - reboot the Machine's domain (reset a running one; destroy and start a
//!   paused or crashed one, or one whose reset failed; start a stopped one),
//!   count the attempt and give the Machine `timeoutSeconds` to be healthy;
//! - wait, while that time runs (a failed attempt waits at most
//!   [`RETRY_AFTER_FAILURE`]), or while the Machine is healthy (the
//!   MachineHealthCheck is about to delete the LibvirtRemediation);
//! - give up after `retryLimit` attempts, or at once when the domain is not
//!   on its host: set the Machine's `OwnerRemediated` condition to False,
//!   which is what its owner (MachineSet or KubeadmControlPlane) waits for to
//!   delete and replace it.
//!
//! Each attempt shows on the LibvirtRemediation (`Rebooted` condition,
//! `retryCount`, `lastRemediated`), as an event, and on the Machine's
//! `ExternallyRemediated` condition, which the MachineHealthCheck leaves to
//! the remediation controller.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::condition_list::{self, ConditionUpdate, Status};
use super::context::{CONTROLLER_NAME, Context, cached_or_get};
use super::credentials;
use super::error::Error;
use super::machine::recorded_machine;
use super::object_patch;
use super::owners::{owner_name, paused_reason};
use crate::api::capi::{Cluster, Machine};
use crate::api::conditions::{REBOOTED, reasons};
use crate::api::{LibvirtCluster, LibvirtMachine, LibvirtRemediation, LibvirtRemediationStatus};
use capl_host::machine::{self as host_machine, RebootMethod};

/// After a reboot that failed (the host refused or did not answer), the next
/// attempt comes after this much, or after `timeoutSeconds` when shorter.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(30);
/// While the Machine is healthy again, look this often: the
/// MachineHealthCheck deletes the LibvirtRemediation on its next pass.
pub const HEALTHY_RECHECK: Duration = Duration::from_secs(30);
/// While the owner Machine or its LibvirtMachine cannot be found, look this often.
const MISSING_RECHECK: Duration = Duration::from_secs(60);

/// `status.phase` after a reboot.
pub const PHASE_WAITING: &str = "Waiting";
/// `status.phase` once the provider gave up.
pub const PHASE_FAILED: &str = "Failed";

/// The Machine condition the owner of the Machine acts on.
const OWNER_REMEDIATED: &str = "OwnerRemediated";
/// The Machine condition the MachineHealthCheck leaves to us.
const EXTERNALLY_REMEDIATED: &str = "ExternallyRemediated";
/// CAPI's reason for a Machine waiting for its owner to remediate it.
const WAITING_FOR_REMEDIATION: &str = "WaitingForRemediation";

/// What the reconcile does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Reboot; this is attempt `attempt` (1-based).
    Reboot { attempt: i32 },
    /// Look again after this long.
    Wait(Duration),
    /// Hand the Machine to its owner.
    GiveUp,
    /// Nothing more to do (the provider gave up before).
    Done,
}

/// What the reconcile knows, for [`decide`].
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    pub retry_limit: i32,
    pub timeout: Duration,
    pub retry_count: i32,
    /// How long ago the last attempt was.
    pub since_last: Option<Duration>,
    /// Whether the last attempt failed.
    pub last_failed: bool,
    /// The Machine's `HealthCheckSucceeded` condition: `Some(true)` when True.
    pub healthy: Option<bool>,
    pub failed_before: bool,
}

/// The next step from `facts`: a pure function, tested without a host.
pub fn decide(facts: &Facts) -> Next {
    if facts.failed_before {
        return Next::Done;
    }
    let wait = if facts.last_failed { facts.timeout.min(RETRY_AFTER_FAILURE) } else { facts.timeout };
    if let Some(since) = facts.since_last
        && since < wait
    {
        return Next::Wait(wait - since);
    }
    if facts.healthy == Some(true) {
        // Healthy now: never reboot a healthy machine; the MachineHealthCheck
        // deletes this object when it sees it.
        return Next::Wait(HEALTHY_RECHECK);
    }
    if facts.retry_count >= facts.retry_limit {
        return Next::GiveUp;
    }
    Next::Reboot { attempt: facts.retry_count + 1 }
}

pub async fn reconcile(object: Arc<LibvirtRemediation>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&object, &ctx).await;
    ctx.metrics.reconciled("libvirtremediation", started.elapsed());
    result
}

/// A Machine with the parts of its status this reconciler reads.
struct OwnerMachine {
    typed: Machine,
    healthy: Option<bool>,
    deleting: bool,
}

async fn owner_machine(ctx: &Context, ns: &str, name: &str) -> Result<Option<OwnerMachine>, Error> {
    let resource = ApiResource::erase::<Machine>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &resource);
    let Some(found) = api.get_opt(name).await? else { return Ok(None) };
    let healthy = found.data["status"]["conditions"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["type"] == "HealthCheckSucceeded"))
        .and_then(|c| c["status"].as_str())
        .map(|status| status == "True");
    let deleting = found.metadata.deletion_timestamp.is_some();
    let typed: Machine = serde_json::to_value(&found)
        .and_then(serde_json::from_value)
        .map_err(|e| Error::Kube(kube::Error::SerdeError(e)))?;
    Ok(Some(OwnerMachine { typed, healthy, deleting }))
}

async fn reconcile_inner(object: &LibvirtRemediation, ctx: &Context) -> Result<Action, Error> {
    let ns = object.namespace().ok_or_else(|| Error::NoNamespace(object.name_any()))?;
    if object.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let status = object.status.clone().unwrap_or_default();
    let Some(machine_name) = owner_name(object, "Machine") else {
        let message = format!(
            "LibvirtRemediation {}/{} has no owner Machine: a MachineHealthCheck creates it with one; nothing to reboot",
            ns,
            object.name_any()
        );
        return not_found(object, ctx, &ns, status, reasons::MACHINE_NOT_FOUND, message).await;
    };
    let Some(machine) = owner_machine(ctx, &ns, &machine_name).await? else {
        let message = format!("Machine {ns}/{machine_name} does not exist (yet)");
        return not_found(object, ctx, &ns, status, reasons::MACHINE_NOT_FOUND, message).await;
    };
    if machine.deleting {
        return Ok(Action::await_change());
    }
    let caches = ctx.inputs();
    let cluster = match machine.typed.spec.cluster_name.as_str() {
        "" => None,
        name => {
            let api = Api::<Cluster>::namespaced(ctx.client.clone(), &ns);
            cached_or_get(caches.map(|c| &c.clusters), &api, &ns, name).await?
        }
    };
    if let Some(why) = paused_reason(object, cluster.as_ref()).or_else(|| paused_reason(&machine.typed, None)) {
        tracing::debug!(remediation = %object.name_any(), %why, "paused");
        return Ok(Action::await_change());
    }
    let since_last = status
        .last_remediated
        .as_ref()
        .map(|t| Duration::try_from(Timestamp::now().duration_since(t.0)).unwrap_or_default());
    let last_failed = condition(&status).is_some_and(|c| c.reason == reasons::REBOOT_FAILED);
    let facts = Facts {
        retry_limit: object.spec.retry_limit.max(1),
        timeout: Duration::from_secs(object.spec.timeout_seconds.max(1) as u64),
        retry_count: status.retry_count.unwrap_or(0),
        since_last,
        last_failed,
        healthy: machine.healthy,
        failed_before: status.phase.as_deref() == Some(PHASE_FAILED),
    };
    match decide(&facts) {
        Next::Done => Ok(Action::await_change()),
        Next::Wait(after) => Ok(Action::requeue(after)),
        Next::GiveUp => {
            let message = format!(
                "{} reboot(s) of Machine {ns}/{machine_name} did not make it healthy within {}s each: it is handed \
                 to its owner for replacement",
                facts.retry_count,
                facts.timeout.as_secs()
            );
            give_up(object, ctx, &ns, &machine_name, status, reasons::RETRIES_EXHAUSTED, message).await
        }
        Next::Reboot { attempt } => {
            reboot(object, ctx, &ns, &machine, cluster.as_ref(), status, attempt, facts.retry_limit, facts.timeout)
                .await
        }
    }
}

fn condition(status: &LibvirtRemediationStatus) -> Option<&Condition> {
    status.conditions.as_ref()?.iter().find(|c| c.type_ == REBOOTED)
}

/// Sets the `Rebooted` condition through the reconcilers' shared condition list.
fn set_condition(
    status: &mut LibvirtRemediationStatus,
    generation: Option<i64>,
    ok: bool,
    reason: &'static str,
    message: &str,
) {
    let update = ConditionUpdate::new(REBOOTED, Status::from_bool(ok), reason, message);
    condition_list::apply(status.conditions.get_or_insert_with(Vec::new), &[update], generation, Timestamp::now());
}

/// The owner Machine, or what a reboot needs, cannot be found: said on the
/// condition (once), and looked at again later.
async fn not_found(
    object: &LibvirtRemediation,
    ctx: &Context,
    ns: &str,
    mut status: LibvirtRemediationStatus,
    reason: &'static str,
    message: String,
) -> Result<Action, Error> {
    if condition(&status).is_none_or(|c| c.reason != reason || c.message != message) {
        set_condition(&mut status, object.meta().generation, false, reason, &message);
        let api: Api<LibvirtRemediation> = Api::namespaced(ctx.client.clone(), ns);
        object_patch::patch_status(&api, &object.name_any(), &status).await?;
        ctx.event(object, EventType::Warning, reason, "Reboot", &message).await;
    }
    Ok(Action::requeue(MISSING_RECHECK))
}

/// One reboot attempt, recorded before the reconcile ends whatever its outcome.
#[allow(clippy::too_many_arguments)]
async fn reboot(
    object: &LibvirtRemediation,
    ctx: &Context,
    ns: &str,
    machine: &OwnerMachine,
    cluster: Option<&Cluster>,
    mut status: LibvirtRemediationStatus,
    attempt: i32,
    limit: i32,
    timeout: Duration,
) -> Result<Action, Error> {
    let machine_name = machine.typed.name_any();
    let infra = &machine.typed.spec.infrastructure_ref;
    let lm = match infra.kind.as_str() {
        "LibvirtMachine" => Api::<LibvirtMachine>::namespaced(ctx.client.clone(), ns).get_opt(&infra.name).await?,
        _ => None,
    };
    let Some(lm) = lm else {
        let message = format!(
            "Machine {ns}/{machine_name}'s infrastructureRef names no LibvirtMachine that exists ({} {:?})",
            infra.kind, infra.name
        );
        return not_found(object, ctx, ns, status, reasons::MACHINE_NOT_FOUND, message).await;
    };
    let libvirt_cluster = match cluster.and_then(|c| c.spec.infrastructure_ref.as_ref()) {
        Some(r) if r.kind == "LibvirtCluster" => {
            let api = Api::<LibvirtCluster>::namespaced(ctx.client.clone(), ns);
            cached_or_get(ctx.inputs().map(|c| &c.libvirt_clusters), &api, ns, &r.name).await?
        }
        _ => None,
    };
    let recorded = match recorded_machine(&lm, libvirt_cluster.as_ref(), ctx) {
        Ok(Some(recorded)) => recorded,
        Ok(None) => {
            let message = format!(
                "LibvirtMachine {ns}/{} records no host: its domain was never created, and a reboot cannot help; \
                 the Machine is handed to its owner for replacement",
                lm.name_any()
            );
            return give_up(object, ctx, ns, &machine_name, status, reasons::DOMAIN_NOT_FOUND, message).await;
        }
        Err(message) => return not_found(object, ctx, ns, status, reasons::MACHINE_NOT_FOUND, message).await,
    };
    let domain = recorded.spec.names().domain;
    let owner = format!("LibvirtRemediation {}", object.name_any());
    let opened = match ctx.settings.uri_policy.check(&recorded.uri, ns) {
        Err(message) => Err(message),
        Ok(()) => {
            match credentials::connection_uri(ctx, ns, &recorded.uri, recorded.credentials.as_deref(), &owner, false)
                .await?
            {
                Ok(opened) => Ok(opened),
                Err(unusable) => Err(unusable.message),
            }
        }
    };
    let outcome = match opened {
        Err(message) => Err(message),
        Ok(opened) => {
            let spec = recorded.spec.clone();
            ctx.connections
                .host(&opened)
                .call(move |h| host_machine::reboot_machine(h, &spec))
                .await
                .map_err(|e| credentials::as_user_wrote_it(e.to_string(), &opened, &recorded.uri))
        }
    };
    let (reason, message, ok) = match outcome {
        Ok(None) => {
            let message = format!(
                "domain {domain} of Machine {ns}/{machine_name} is not on {}: a reboot cannot help; the Machine is \
                 handed to its owner for replacement",
                recorded.uri
            );
            return give_up(object, ctx, ns, &machine_name, status, reasons::DOMAIN_NOT_FOUND, message).await;
        }
        Ok(Some(done)) => {
            let reason = match done.method {
                RebootMethod::Reset => reasons::RESET,
                RebootMethod::PowerCycle => reasons::POWER_CYCLED,
                RebootMethod::Start => reasons::STARTED,
            };
            let message = format!(
                "reboot {attempt} of {limit}: domain {domain} on {}: {}; Machine {ns}/{machine_name} has {}s to \
                 become healthy",
                recorded.uri,
                done.describe(),
                timeout.as_secs()
            );
            (reason, message, true)
        }
        Err(error) => {
            let message = format!(
                "reboot {attempt} of {limit} of domain {domain} on {} failed: {error}; retried within {}s",
                recorded.uri,
                timeout.min(RETRY_AFTER_FAILURE).as_secs()
            );
            (reasons::REBOOT_FAILED, message, false)
        }
    };
    status.retry_count = Some(attempt);
    status.last_remediated = Some(Time(Timestamp::now()));
    status.phase = Some(PHASE_WAITING.into());
    set_condition(&mut status, object.meta().generation, ok, reason, &message);
    let api: Api<LibvirtRemediation> = Api::namespaced(ctx.client.clone(), ns);
    object_patch::patch_status(&api, &object.name_any(), &status).await?;
    let event_type = if ok { EventType::Normal } else { EventType::Warning };
    let event_reason = if ok { "Rebooted" } else { reasons::REBOOT_FAILED };
    ctx.event(object, event_type, event_reason, "Reboot", &message).await;
    set_machine_conditions(ctx, ns, &machine_name, &[(EXTERNALLY_REMEDIATED, reason, &message)]).await?;
    let wait = if ok { timeout } else { timeout.min(RETRY_AFTER_FAILURE) };
    Ok(Action::requeue(wait))
}

/// Hands the Machine to its owner: its `OwnerRemediated` condition False,
/// then the LibvirtRemediation's phase Failed.
async fn give_up(
    object: &LibvirtRemediation,
    ctx: &Context,
    ns: &str,
    machine_name: &str,
    mut status: LibvirtRemediationStatus,
    reason: &'static str,
    message: String,
) -> Result<Action, Error> {
    set_machine_conditions(
        ctx,
        ns,
        machine_name,
        &[(OWNER_REMEDIATED, WAITING_FOR_REMEDIATION, &message), (EXTERNALLY_REMEDIATED, reason, &message)],
    )
    .await?;
    status.phase = Some(PHASE_FAILED.into());
    set_condition(&mut status, object.meta().generation, false, reason, &message);
    let api: Api<LibvirtRemediation> = Api::namespaced(ctx.client.clone(), ns);
    object_patch::patch_status(&api, &object.name_any(), &status).await?;
    ctx.event(object, EventType::Warning, reason, "Remediate", &message).await;
    Ok(Action::await_change())
}

/// Sets `conditions` (type, reason, message), all False, on the Machine's
/// status by server-side apply: the Machine's conditions are a map keyed by
/// type, so only these entries are ours and every other stays as it is.
async fn set_machine_conditions(
    ctx: &Context,
    ns: &str,
    machine_name: &str,
    conditions: &[(&str, &str, &str)],
) -> Result<(), Error> {
    let now = Time(Timestamp::now());
    let entries: Vec<serde_json::Value> = conditions
        .iter()
        .map(|(type_, reason, message)| {
            json!({ "type": type_, "status": "False", "reason": reason, "message": message, "lastTransitionTime": now })
        })
        .collect();
    let patch = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": { "name": machine_name },
        "status": { "conditions": entries },
    });
    let api: Api<Machine> = Api::namespaced(ctx.client.clone(), ns);
    let params = PatchParams::apply(&format!("{CONTROLLER_NAME}-remediation")).force();
    api.patch_status(machine_name, &params, &Patch::Apply(&patch)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            retry_limit: 2,
            timeout: Duration::from_secs(600),
            retry_count: 0,
            since_last: None,
            last_failed: false,
            healthy: Some(false),
            failed_before: false,
        }
    }

    #[test]
    fn an_unhealthy_machine_is_rebooted_then_given_time_then_rebooted_again_then_given_up() {
        assert_eq!(decide(&facts()), Next::Reboot { attempt: 1 });
        let waiting = Facts { retry_count: 1, since_last: Some(Duration::from_secs(100)), ..facts() };
        assert_eq!(decide(&waiting), Next::Wait(Duration::from_secs(500)));
        let again = Facts { retry_count: 1, since_last: Some(Duration::from_secs(600)), ..facts() };
        assert_eq!(decide(&again), Next::Reboot { attempt: 2 });
        let spent = Facts { retry_count: 2, since_last: Some(Duration::from_secs(601)), ..facts() };
        assert_eq!(decide(&spent), Next::GiveUp);
        let spent_waiting = Facts { retry_count: 2, since_last: Some(Duration::from_secs(10)), ..facts() };
        assert_eq!(decide(&spent_waiting), Next::Wait(Duration::from_secs(590)));
        assert_eq!(decide(&Facts { failed_before: true, ..spent }), Next::Done);
    }

    #[test]
    fn a_healthy_machine_is_never_rebooted() {
        let healthy = Facts { healthy: Some(true), ..facts() };
        assert_eq!(decide(&healthy), Next::Wait(HEALTHY_RECHECK));
        let after_time = Facts { retry_count: 2, since_last: Some(Duration::from_secs(700)), ..healthy };
        assert_eq!(decide(&after_time), Next::Wait(HEALTHY_RECHECK));
    }

    #[test]
    fn a_failed_attempt_is_retried_sooner_and_counts() {
        let failed = Facts { retry_count: 1, since_last: Some(Duration::from_secs(5)), last_failed: true, ..facts() };
        assert_eq!(decide(&failed), Next::Wait(RETRY_AFTER_FAILURE - Duration::from_secs(5)));
        let later = Facts { since_last: Some(RETRY_AFTER_FAILURE), ..failed.clone() };
        assert_eq!(decide(&later), Next::Reboot { attempt: 2 });
        let short = Facts { timeout: Duration::from_secs(3), since_last: Some(Duration::from_secs(1)), ..failed };
        assert_eq!(decide(&short), Next::Wait(Duration::from_secs(2)));
    }
}
