//! What the LibvirtCluster reconciler does next: a pure function of a
//! snapshot, table-tested below.

use std::time::Duration;

use super::condition_list::{ConditionUpdate, summary};
use crate::api::ApiEndpoint;
use crate::api::conditions::{CONTROL_PLANE_ENDPOINT_READY, HOSTS_READY, INFRASTRUCTURE_READY, PAUSED, READY, reasons};

/// The result of checking the network and pools on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfraCheck {
    NotChecked,
    Ready,
    Failed { reason: &'static str, message: String, transient: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSnapshot {
    pub deleting: bool,
    pub has_finalizer: bool,
    /// `cluster.x-k8s.io/managed-by` is set: someone else owns this object.
    pub externally_managed: bool,
    pub paused: Option<String>,
    /// The owner Cluster, once CAPI set the owner reference: its name and
    /// its `spec.controlPlaneEndpoint`.
    pub owner_cluster: Option<(String, Option<ApiEndpoint>)>,
    pub spec_endpoint: Option<ApiEndpoint>,
    pub host: InfraCheck,
    /// Why an endpoint asked for with spec.controlPlaneEndpointFrom is not there
    /// yet (reason, message): its claim waits for an address.
    pub endpoint_waiting: Option<(&'static str, String)>,
    /// The cluster lists hosts (spec.hosts): report HostsReady.
    pub several_hosts: bool,
    /// With several hosts: one message per host whose check failed.
    pub unhealthy_hosts: Vec<String>,
    /// While deleting: the LibvirtMachines of the same Cluster that still exist.
    pub machines: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterAction {
    Nothing,
    AddFinalizer,
    /// Check the network and pools, then decide again.
    CheckHost,
    RemoveFinalizer,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPlan {
    pub action: ClusterAction,
    /// Condition updates; empty means "leave status alone".
    pub conditions: Vec<ConditionUpdate>,
    /// Set `status.initialization.provisioned=true` (never set back to false).
    pub provisioned: bool,
    pub requeue: Option<Duration>,
}

/// How often a provisioned cluster's host is checked again, so that a pool or
/// network that went away shows up on the conditions.
pub const RECHECK_HOST: Duration = Duration::from_secs(120);
pub const RETRY_AFTER_TRANSIENT_FAILURE: Duration = Duration::from_secs(20);
pub const RETRY_AFTER_PERMANENT_FAILURE: Duration = Duration::from_secs(60);
/// While deleting and waiting for LibvirtMachines: a look this often besides
/// the watch on LibvirtMachines.
pub const RECHECK_MACHINES: Duration = Duration::from_secs(60);

const SUMMARIZED: &[&str] = &[CONTROL_PLANE_ENDPOINT_READY, INFRASTRUCTURE_READY];

fn plan(action: ClusterAction, conditions: Vec<ConditionUpdate>) -> ClusterPlan {
    ClusterPlan { action, conditions, provisioned: false, requeue: None }
}

fn with_summary(mut conditions: Vec<ConditionUpdate>) -> Vec<ConditionUpdate> {
    conditions.push(summary(&conditions, SUMMARIZED));
    conditions.push(ConditionUpdate::false_(PAUSED, reasons::NOT_PAUSED, ""));
    conditions
}

/// An endpoint counts when it has a host and a port.
fn usable(endpoint: &Option<ApiEndpoint>) -> Option<&ApiEndpoint> {
    endpoint.as_ref().filter(|e| !e.host.is_empty() && e.port > 0)
}

pub fn decide(s: &ClusterSnapshot) -> ClusterPlan {
    if s.externally_managed {
        return plan(ClusterAction::Nothing, Vec::new());
    }
    if let Some(why) = &s.paused {
        return plan(ClusterAction::Nothing, vec![ConditionUpdate::true_(PAUSED, reasons::PAUSED, why.clone())]);
    }
    if s.deleting {
        if s.has_finalizer && !s.machines.is_empty() {
            // Kept until the machines are gone, so that a machine deleted at the
            // same time (kubectl delete -f of a whole cluster) still finds its host.
            let mut names = s.machines.clone();
            names.sort();
            let message = format!(
                "waiting for {} LibvirtMachine(s) of this cluster to be deleted first, so that they remove their VMs from the host: {}",
                names.len(),
                names.join(", ")
            );
            return ClusterPlan {
                requeue: Some(RECHECK_MACHINES),
                ..plan(ClusterAction::Nothing, vec![ConditionUpdate::false_(READY, reasons::DELETING, message)])
            };
        }
        // Nothing on the host belongs to the cluster: only the finalizer goes.
        let action = if s.has_finalizer { ClusterAction::RemoveFinalizer } else { ClusterAction::Nothing };
        return plan(
            action,
            vec![ConditionUpdate::false_(READY, reasons::DELETING, "deleting; the host is not changed")],
        );
    }
    let Some((cluster, cluster_endpoint)) = &s.owner_cluster else {
        let message = "waiting for CAPI to set the owner Cluster";
        return plan(
            ClusterAction::Nothing,
            with_summary(vec![
                ConditionUpdate::unknown(CONTROL_PLANE_ENDPOINT_READY, reasons::WAITING_FOR_OWNER, message),
                ConditionUpdate::unknown(INFRASTRUCTURE_READY, reasons::WAITING_FOR_OWNER, message),
            ]),
        );
    };
    if !s.has_finalizer {
        return plan(ClusterAction::AddFinalizer, Vec::new());
    }
    let Some(endpoint) = usable(&s.spec_endpoint).or(usable(cluster_endpoint)) else {
        if let Some((reason, message)) = &s.endpoint_waiting {
            return ClusterPlan {
                requeue: Some(RETRY_AFTER_TRANSIENT_FAILURE),
                ..plan(
                    ClusterAction::Nothing,
                    with_summary(vec![
                        ConditionUpdate::false_(CONTROL_PLANE_ENDPOINT_READY, reason, message.clone()),
                        ConditionUpdate::unknown(INFRASTRUCTURE_READY, reason, message.clone()),
                    ]),
                )
            };
        }
        let message = format!(
            "no control plane endpoint: set spec.controlPlaneEndpoint on this LibvirtCluster or on Cluster {cluster}"
        );
        return plan(
            ClusterAction::Nothing,
            with_summary(vec![
                ConditionUpdate::false_(
                    CONTROL_PLANE_ENDPOINT_READY,
                    reasons::WAITING_FOR_CONTROL_PLANE_ENDPOINT,
                    message.clone(),
                ),
                ConditionUpdate::unknown(INFRASTRUCTURE_READY, reasons::WAITING_FOR_CONTROL_PLANE_ENDPOINT, message),
            ]),
        );
    };
    let endpoint_ready = ConditionUpdate::true_(
        CONTROL_PLANE_ENDPOINT_READY,
        reasons::CONTROL_PLANE_ENDPOINT_SET,
        format!("{}:{}", endpoint.host, endpoint.port),
    );
    // Several hosts: which are not ready, beside (not in) the summary, so a
    // host that is down does not block the healthy ones.
    let hosts_ready = s.several_hosts.then(|| {
        if s.unhealthy_hosts.is_empty() {
            ConditionUpdate::true_(HOSTS_READY, reasons::HOSTS_AVAILABLE, "")
        } else {
            ConditionUpdate::false_(HOSTS_READY, reasons::HOSTS_DEGRADED, s.unhealthy_hosts.join("; "))
        }
    });
    let with_hosts = |mut conditions: Vec<ConditionUpdate>| {
        conditions.extend(hosts_ready.clone());
        conditions
    };
    match &s.host {
        InfraCheck::NotChecked => plan(ClusterAction::CheckHost, Vec::new()),
        InfraCheck::Ready => ClusterPlan {
            provisioned: true,
            // A host that is not ready is looked at again soon, like a failed check.
            requeue: Some(if s.unhealthy_hosts.is_empty() { RECHECK_HOST } else { RETRY_AFTER_TRANSIENT_FAILURE }),
            ..plan(
                ClusterAction::Nothing,
                with_hosts(with_summary(vec![
                    endpoint_ready,
                    ConditionUpdate::true_(INFRASTRUCTURE_READY, reasons::INFRASTRUCTURE_AVAILABLE, ""),
                ])),
            )
        },
        InfraCheck::Failed { reason, message, transient } => ClusterPlan {
            requeue: Some(if *transient { RETRY_AFTER_TRANSIENT_FAILURE } else { RETRY_AFTER_PERMANENT_FAILURE }),
            ..plan(
                ClusterAction::Nothing,
                with_hosts(with_summary(vec![
                    endpoint_ready,
                    ConditionUpdate::false_(INFRASTRUCTURE_READY, reason, message.clone()),
                ])),
            )
        },
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::api::conditions::reasons as r;
    use crate::controller::condition_list::Status;

    fn endpoint(host: &str) -> Option<ApiEndpoint> {
        Some(ApiEndpoint { host: host.into(), port: 6443 })
    }

    fn ready_cluster() -> ClusterSnapshot {
        ClusterSnapshot {
            deleting: false,
            has_finalizer: true,
            externally_managed: false,
            paused: None,
            owner_cluster: Some(("c".into(), None)),
            spec_endpoint: endpoint("192.168.122.10"),
            host: InfraCheck::Ready,
            endpoint_waiting: None,
            several_hosts: false,
            unhealthy_hosts: Vec::new(),
            machines: Vec::new(),
        }
    }

    fn condition(p: &ClusterPlan, type_: &str) -> (Status, &'static str) {
        let c = p.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("{type_} not in {p:?}"));
        (c.status, c.reason)
    }

    fn failed(reason: &'static str, transient: bool) -> InfraCheck {
        InfraCheck::Failed { reason, message: "storage pool \"x\" is inactive".into(), transient }
    }

    #[rstest]
    #[case::waits_for_owner(|s: &mut ClusterSnapshot| s.owner_cluster = None, ClusterAction::Nothing, CONTROL_PLANE_ENDPOINT_READY, Status::Unknown, r::WAITING_FOR_OWNER)]
    #[case::adds_finalizer(|s: &mut ClusterSnapshot| s.has_finalizer = false, ClusterAction::AddFinalizer, "", Status::Unknown, "")]
    #[case::waits_for_endpoint(|s: &mut ClusterSnapshot| s.spec_endpoint = None, ClusterAction::Nothing, CONTROL_PLANE_ENDPOINT_READY, Status::False, r::WAITING_FOR_CONTROL_PLANE_ENDPOINT)]
    #[case::empty_endpoint_does_not_count(|s: &mut ClusterSnapshot| s.spec_endpoint = Some(ApiEndpoint { host: String::new(), port: 0 }), ClusterAction::Nothing, CONTROL_PLANE_ENDPOINT_READY, Status::False, r::WAITING_FOR_CONTROL_PLANE_ENDPOINT)]
    #[case::endpoint_from_cluster(|s: &mut ClusterSnapshot| { s.spec_endpoint = None; s.owner_cluster = Some(("c".into(), endpoint("10.0.0.5"))) }, ClusterAction::Nothing, CONTROL_PLANE_ENDPOINT_READY, Status::True, r::CONTROL_PLANE_ENDPOINT_SET)]
    #[case::checks_host(|s: &mut ClusterSnapshot| s.host = InfraCheck::NotChecked, ClusterAction::CheckHost, "", Status::Unknown, "")]
    #[case::ready(|_: &mut ClusterSnapshot| {}, ClusterAction::Nothing, READY, Status::True, r::READY)]
    #[case::missing(|s: &mut ClusterSnapshot| s.host = failed(r::INFRASTRUCTURE_MISSING, false), ClusterAction::Nothing, INFRASTRUCTURE_READY, Status::False, r::INFRASTRUCTURE_MISSING)]
    #[case::inactive(|s: &mut ClusterSnapshot| s.host = failed(r::INFRASTRUCTURE_INACTIVE, false), ClusterAction::Nothing, INFRASTRUCTURE_READY, Status::False, r::INFRASTRUCTURE_INACTIVE)]
    #[case::unreachable(|s: &mut ClusterSnapshot| s.host = failed(r::INFRASTRUCTURE_PROVISIONING_FAILED, true), ClusterAction::Nothing, READY, Status::False, r::NOT_READY)]
    #[case::paused(|s: &mut ClusterSnapshot| s.paused = Some("Cluster c is paused".into()), ClusterAction::Nothing, PAUSED, Status::True, r::PAUSED)]
    #[case::deleting(|s: &mut ClusterSnapshot| s.deleting = true, ClusterAction::RemoveFinalizer, READY, Status::False, r::DELETING)]
    #[case::deleting_without_owner(|s: &mut ClusterSnapshot| { s.deleting = true; s.owner_cluster = None }, ClusterAction::RemoveFinalizer, READY, Status::False, r::DELETING)]
    #[case::deleted(|s: &mut ClusterSnapshot| { s.deleting = true; s.has_finalizer = false }, ClusterAction::Nothing, READY, Status::False, r::DELETING)]
    #[case::deleting_waits_for_machines(|s: &mut ClusterSnapshot| { s.deleting = true; s.machines = vec!["m1".into()] }, ClusterAction::Nothing, READY, Status::False, r::DELETING)]
    #[case::deleting_without_owner_waits_for_machines(|s: &mut ClusterSnapshot| { s.deleting = true; s.owner_cluster = None; s.machines = vec!["m1".into()] }, ClusterAction::Nothing, READY, Status::False, r::DELETING)]
    #[case::deleting_while_paused(|s: &mut ClusterSnapshot| { s.deleting = true; s.paused = Some("p".into()) }, ClusterAction::Nothing, PAUSED, Status::True, r::PAUSED)]
    fn decides(
        #[case] change: fn(&mut ClusterSnapshot),
        #[case] action: ClusterAction,
        #[case] type_: &str,
        #[case] status: Status,
        #[case] reason: &str,
    ) {
        let mut s = ready_cluster();
        change(&mut s);
        let p = decide(&s);
        assert_eq!(p.action, action, "{p:?}");
        if type_.is_empty() {
            assert!(p.conditions.is_empty());
        } else {
            assert_eq!(condition(&p, type_), (status, reason));
        }
    }

    #[test]
    fn externally_managed_clusters_are_left_alone() {
        for deleting in [false, true] {
            let s = ClusterSnapshot { externally_managed: true, deleting, ..ready_cluster() };
            let p = decide(&s);
            assert_eq!(p.action, ClusterAction::Nothing);
            assert!(p.conditions.is_empty(), "status is not touched");
        }
    }

    #[test]
    fn provisioned_only_when_ready_and_rechecked_periodically() {
        let p = decide(&ready_cluster());
        assert!(p.provisioned);
        assert_eq!(p.requeue, Some(RECHECK_HOST));
        let p = decide(&ClusterSnapshot { host: failed(r::INFRASTRUCTURE_MISSING, false), ..ready_cluster() });
        assert!(!p.provisioned);
        assert_eq!(p.requeue, Some(RETRY_AFTER_PERMANENT_FAILURE));
        let p =
            decide(&ClusterSnapshot { host: failed(r::INFRASTRUCTURE_PROVISIONING_FAILED, true), ..ready_cluster() });
        assert_eq!(p.requeue, Some(RETRY_AFTER_TRANSIENT_FAILURE));
    }

    #[test]
    fn an_endpoint_waiting_for_its_address_says_why_and_looks_again() {
        let waiting = Some((r::IP_ADDRESS_POOL_EXHAUSTED, "pool vips has no free address".to_string()));
        let s = ClusterSnapshot { spec_endpoint: None, endpoint_waiting: waiting, ..ready_cluster() };
        let p = decide(&s);
        assert_eq!(p.action, ClusterAction::Nothing, "no host check before the endpoint is known");
        assert_eq!(condition(&p, CONTROL_PLANE_ENDPOINT_READY), (Status::False, r::IP_ADDRESS_POOL_EXHAUSTED));
        assert_eq!(p.requeue, Some(RETRY_AFTER_TRANSIENT_FAILURE));
        assert!(!p.provisioned);
        // Once allocated (in the spec), the wait is over whatever it said.
        let s =
            ClusterSnapshot { endpoint_waiting: Some((r::WAITING_FOR_IP_ADDRESS, String::new())), ..ready_cluster() };
        assert_eq!(condition(&decide(&s), CONTROL_PLANE_ENDPOINT_READY).0, Status::True);
    }

    #[test]
    fn deletion_names_the_machines_it_waits_for_and_looks_again() {
        let s = ClusterSnapshot { deleting: true, machines: vec!["w-1".into(), "cp-0".into()], ..ready_cluster() };
        let p = decide(&s);
        assert_eq!((p.action, p.requeue), (ClusterAction::Nothing, Some(RECHECK_MACHINES)));
        let ready = p.conditions.iter().find(|c| c.type_ == READY).unwrap();
        assert!(
            ready.message.contains("2 LibvirtMachine(s)") && ready.message.ends_with("cp-0, w-1"),
            "{}",
            ready.message
        );
        let done = decide(&ClusterSnapshot { machines: Vec::new(), ..s });
        assert_eq!(done.action, ClusterAction::RemoveFinalizer);
    }

    #[test]
    fn spec_endpoint_wins_over_the_clusters() {
        let s = ClusterSnapshot { owner_cluster: Some(("c".into(), endpoint("10.0.0.5"))), ..ready_cluster() };
        let p = decide(&s);
        let c = p.conditions.iter().find(|c| c.type_ == CONTROL_PLANE_ENDPOINT_READY).unwrap();
        assert_eq!(c.message, "192.168.122.10:6443");
    }
}
