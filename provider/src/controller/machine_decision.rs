//! What the LibvirtMachine reconciler does next: a pure function of a
//! snapshot of the Kubernetes objects and the host, table-tested below.

use std::time::Duration;

use super::condition_list::{ConditionUpdate, summary};
use crate::api::SKIP_HOST_CLEANUP_ANNOTATION;
use crate::api::conditions::{
    DOMAIN_PROVISIONING_READY, DOMAIN_RUNNING, INFRASTRUCTURE_READY, MACHINE_CREATED, PAUSED, READY, reasons,
};
use capl_host::hypervisor::DomainState;

/// The bootstrap data, as far as the reconciler could find it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bootstrap {
    /// `Machine.spec.bootstrap.dataSecretName` is not set yet.
    NotSet,
    /// The named Secret does not exist (yet).
    SecretMissing(String),
    /// The Secret exists but cannot be used; the message says why and how to fix it.
    Invalid(String),
    /// The Secret's `value` is at hand.
    Ready,
}

/// What the reconciler knows about the machine's domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// Not looked at yet in this reconcile.
    NotObserved,
    /// No domain of ours exists.
    Absent,
    /// Our domain exists.
    Present { state: DomainState, has_address: bool },
    /// The host could not be read or changed.
    Failed { reason: &'static str, message: String, transient: bool },
}

/// The facts one reconcile decides on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSnapshot {
    pub deleting: bool,
    pub has_finalizer: bool,
    /// Why reconciliation is paused, when it is.
    pub paused: Option<String>,
    /// The owner Machine's name, once CAPI set the owner reference and the Machine exists.
    pub owner_machine: Option<String>,
    /// The Cluster's name and whether its infrastructure is provisioned, once found.
    pub cluster: Option<(String, bool)>,
    /// Whether the LibvirtCluster (which says which host to use) was found.
    pub libvirt_cluster_found: bool,
    /// The status records the host, network and pools the LibvirtCluster names
    /// (written before anything is created, so deletion does not need the LibvirtCluster).
    pub location_recorded: bool,
    /// Deletion knows the host: from the status, or else from the LibvirtCluster.
    pub host_known: bool,
    /// The object carries [`SKIP_HOST_CLEANUP_ANNOTATION`].
    pub skip_host_cleanup: bool,
    /// How long the object has been deleting (zero when it is not).
    pub deleting_for: Duration,
    pub bootstrap: Bootstrap,
    pub host: Host,
    /// The machine was provisioned: `status.initialization.provisioned` or
    /// `spec.providerID` is set (the latter survives `clusterctl move`), or
    /// its domain was seen in this reconcile. Its guest has run the bootstrap
    /// data, so a missing domain is lost, never created again.
    pub provisioned: bool,
    /// The guest has waited at least [`LEASE_REFRESH_AFTER`] for its DHCP
    /// lease and this reconcile has not yet written its reservation again.
    pub lease_refresh_due: bool,
    /// The domain's name and the host's URI, for messages.
    pub domain: String,
    pub host_uri: String,
}

/// The one next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineAction {
    /// Report and stop.
    Nothing,
    AddFinalizer,
    /// Read the domain's state from the host, then decide again.
    ObserveHost,
    /// Create the disk, the seed ISO, the DHCP reservation and the domain, and start it.
    Create,
    /// Start the stopped domain.
    Start,
    /// Remove everything from the host, then the finalizer.
    Delete,
    /// Drop the finalizer without touching the host (nothing left to find there).
    RemoveFinalizer,
    /// Drop the finalizer without touching the host, as the user asked; say what may remain there.
    SkipHostCleanup,
    /// Write the host, network and pools into the status, then decide again.
    RecordHost,
    /// Write the DHCP reservation of a guest that waits long for its lease
    /// again (libvirt restarts a dead dnsmasq on it), then decide again.
    RefreshReservation,
}

/// When to look again, besides watch events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Only on a watch event.
    Never,
    /// The guest has no DHCP lease yet: back off between looks.
    WaitingForAddress,
    /// Running and healthy: nothing to wait for. The domain's lifecycle
    /// events bring the machine back when the domain changes on the host; a
    /// long resync (`Settings::resync_interval`) covers events that were lost.
    Resync,
    After(Duration),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachinePlan {
    pub action: MachineAction,
    /// Condition updates; empty means "leave status alone".
    pub conditions: Vec<ConditionUpdate>,
    /// Set `status.initialization.provisioned` and `spec.providerID`.
    pub provisioned: bool,
    pub requeue: Requeue,
}

/// How long to wait before retrying a host failure that a person must fix.
pub const RETRY_AFTER_PERMANENT_FAILURE: Duration = Duration::from_secs(300);
/// How long to wait before retrying a broken connection.
pub const RETRY_AFTER_TRANSIENT_FAILURE: Duration = Duration::from_secs(20);
/// How often to look at a domain in a state we do not act on (paused, ...).
pub const RECHECK_ODD_STATE: Duration = Duration::from_secs(60);
/// How often to look for a lost domain (one lookup): an admin who restores
/// it on the host (e.g. `virsh define` from a backup) sees the machine
/// recover without touching the objects.
pub const RECHECK_LOST: Duration = Duration::from_secs(300);
/// How long a running guest waits for its lease before its reservation is
/// written again, and how often that happens per network while guests wait:
/// a dnsmasq that died (killed, crashed, OOM) is not restarted by libvirt
/// until the network's DHCP hosts change or libvirtd restarts, and until then
/// no guest gets a lease. A guest normally has one seconds after it starts.
pub const LEASE_REFRESH_AFTER: Duration = Duration::from_secs(60);

/// The condition types the Ready summary is made of.
pub const SUMMARIZED: &[&str] = &[INFRASTRUCTURE_READY, DOMAIN_PROVISIONING_READY, MACHINE_CREATED, DOMAIN_RUNNING];

fn plan(action: MachineAction, conditions: Vec<ConditionUpdate>) -> MachinePlan {
    MachinePlan { action, conditions, provisioned: false, requeue: Requeue::Never }
}

fn with_summary(mut conditions: Vec<ConditionUpdate>) -> Vec<ConditionUpdate> {
    conditions.push(summary(&conditions, SUMMARIZED));
    conditions.push(ConditionUpdate::false_(PAUSED, reasons::NOT_PAUSED, ""));
    conditions
}

fn waiting(message: &str, reason: &'static str) -> Vec<ConditionUpdate> {
    vec![
        ConditionUpdate::unknown(DOMAIN_PROVISIONING_READY, reason, message),
        ConditionUpdate::unknown(MACHINE_CREATED, reason, message),
        ConditionUpdate::unknown(DOMAIN_RUNNING, reason, message),
    ]
}

pub fn decide(s: &MachineSnapshot) -> MachinePlan {
    // Paused comes first, deletion included: clusterctl move pauses a cluster
    // and then deletes the moved objects from the source cluster; the VMs
    // they describe live on and belong to the target cluster now.
    if let Some(why) = &s.paused {
        return plan(MachineAction::Nothing, vec![ConditionUpdate::true_(PAUSED, reasons::PAUSED, why.clone())]);
    }
    if s.deleting {
        return decide_deletion(s);
    }
    let Some(_machine) = &s.owner_machine else {
        let message = "waiting for CAPI to set the owner Machine";
        let mut conditions = waiting(message, reasons::WAITING_FOR_OWNER);
        conditions.insert(0, ConditionUpdate::unknown(INFRASTRUCTURE_READY, reasons::WAITING_FOR_OWNER, message));
        return plan(MachineAction::Nothing, with_summary(conditions));
    };
    if !s.has_finalizer {
        return plan(MachineAction::AddFinalizer, Vec::new());
    }
    let infrastructure = match &s.cluster {
        None => Some("waiting for the owner Machine's Cluster to exist".to_string()),
        Some((name, false)) => Some(format!("waiting for Cluster {name} to have its infrastructure provisioned")),
        Some((name, true)) if !s.libvirt_cluster_found => {
            Some(format!("waiting for the LibvirtCluster of Cluster {name}"))
        }
        Some(_) => None,
    };
    if let Some(message) = infrastructure {
        let mut conditions = waiting(&message, reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE_READY);
        conditions.insert(
            0,
            ConditionUpdate::false_(INFRASTRUCTURE_READY, reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE_READY, message),
        );
        return plan(MachineAction::Nothing, with_summary(conditions));
    }
    // A machine no host can take (placement failed) records none: the failure is reported below.
    if !s.location_recorded && !matches!(s.host, Host::Failed { .. }) {
        return plan(MachineAction::RecordHost, Vec::new());
    }
    let infra_ready = ConditionUpdate::true_(INFRASTRUCTURE_READY, reasons::PROVISIONED, "");
    match &s.host {
        Host::NotObserved => plan(MachineAction::ObserveHost, Vec::new()),
        Host::Failed { reason, message, transient } => {
            let conditions = vec![
                infra_ready,
                ConditionUpdate::false_(DOMAIN_PROVISIONING_READY, reason, message.clone()),
                ConditionUpdate::unknown(MACHINE_CREATED, reason, message.clone()),
                ConditionUpdate::unknown(DOMAIN_RUNNING, reason, message.clone()),
            ];
            let retry = if *transient { RETRY_AFTER_TRANSIENT_FAILURE } else { RETRY_AFTER_PERMANENT_FAILURE };
            MachinePlan { requeue: Requeue::After(retry), ..plan(MachineAction::Nothing, with_summary(conditions)) }
        }
        Host::Absent if s.provisioned => decide_lost(s, infra_ready),
        Host::Absent => decide_creation(s, infra_ready),
        Host::Present { state, has_address } => decide_running(*state, *has_address, s.lease_refresh_due, infra_ready),
    }
}

fn decide_creation(s: &MachineSnapshot, infra_ready: ConditionUpdate) -> MachinePlan {
    let not_created =
        ConditionUpdate::false_(MACHINE_CREATED, reasons::DOMAIN_NOT_CREATED, "the domain does not exist yet");
    let not_running =
        ConditionUpdate::false_(DOMAIN_RUNNING, reasons::DOMAIN_NOT_RUNNING, "the domain does not exist yet");
    let (action, provisioning) = match &s.bootstrap {
        Bootstrap::NotSet => (
            MachineAction::Nothing,
            ConditionUpdate::false_(
                DOMAIN_PROVISIONING_READY,
                reasons::WAITING_FOR_BOOTSTRAP_DATA,
                "waiting for the Machine's spec.bootstrap.dataSecretName",
            ),
        ),
        Bootstrap::SecretMissing(name) => (
            MachineAction::Nothing,
            ConditionUpdate::false_(
                DOMAIN_PROVISIONING_READY,
                reasons::WAITING_FOR_BOOTSTRAP_DATA,
                format!("waiting for bootstrap data Secret {name}"),
            ),
        ),
        Bootstrap::Invalid(message) => (
            MachineAction::Nothing,
            ConditionUpdate::false_(DOMAIN_PROVISIONING_READY, reasons::INVALID_BOOTSTRAP_DATA, message.clone()),
        ),
        Bootstrap::Ready => (
            MachineAction::Create,
            ConditionUpdate::false_(DOMAIN_PROVISIONING_READY, reasons::DOMAIN_PROVISIONING, "creating the domain"),
        ),
    };
    plan(action, with_summary(vec![infra_ready, provisioning, not_created, not_running]))
}

/// The domain of a provisioned machine is gone. Creating it again would run
/// the bootstrap data a second time (for the first control-plane machine that
/// is `kubeadm init`: a second cluster), so nothing is created, as CAPI's
/// reference providers do: the machine reports the loss and CAPI replaces it
/// (a MachineHealthCheck, or the user deleting the Machine).
fn decide_lost(s: &MachineSnapshot, infra_ready: ConditionUpdate) -> MachinePlan {
    let message = format!(
        "domain {} no longer exists on {} although this machine was provisioned; it is not created again, because that would run the bootstrap data a second time. A MachineHealthCheck replaces the Machine, or delete the Machine to replace it",
        s.domain, s.host_uri
    );
    let mut conditions = with_summary(vec![
        infra_ready,
        ConditionUpdate::true_(DOMAIN_PROVISIONING_READY, reasons::DOMAIN_PROVISIONED, ""),
        ConditionUpdate::false_(MACHINE_CREATED, reasons::DOMAIN_LOST, message.clone()),
        ConditionUpdate::false_(DOMAIN_RUNNING, reasons::DOMAIN_LOST, message),
    ]);
    // Ready names the loss itself (the summary would say NotReady), so that
    // CAPI's Machine, which mirrors it, shows why.
    for c in conditions.iter_mut().filter(|c| c.type_ == READY) {
        c.reason = reasons::DOMAIN_LOST;
    }
    MachinePlan { requeue: Requeue::After(RECHECK_LOST), ..plan(MachineAction::Nothing, conditions) }
}

fn decide_running(
    state: DomainState,
    has_address: bool,
    lease_refresh_due: bool,
    infra_ready: ConditionUpdate,
) -> MachinePlan {
    let provisioned = ConditionUpdate::true_(DOMAIN_PROVISIONING_READY, reasons::DOMAIN_PROVISIONED, "");
    let created = ConditionUpdate::true_(MACHINE_CREATED, reasons::DOMAIN_CREATED, "");
    let (action, running, requeue) = match state {
        DomainState::Running | DomainState::Blocked => {
            let requeue = if has_address { Requeue::Resync } else { Requeue::WaitingForAddress };
            let message = if has_address { "" } else { "waiting for the guest's DHCP lease" };
            let action = if !has_address && lease_refresh_due {
                MachineAction::RefreshReservation
            } else {
                MachineAction::Nothing
            };
            (action, ConditionUpdate::true_(DOMAIN_RUNNING, reasons::DOMAIN_RUNNING, message), requeue)
        }
        DomainState::Shutoff | DomainState::Crashed => (
            MachineAction::Start,
            ConditionUpdate::false_(
                DOMAIN_RUNNING,
                reasons::DOMAIN_NOT_RUNNING,
                format!("the domain is {}; starting it", state.as_str()),
            ),
            Requeue::Never,
        ),
        other => (
            MachineAction::Nothing,
            ConditionUpdate::false_(
                DOMAIN_RUNNING,
                reasons::DOMAIN_NOT_RUNNING,
                format!(
                    "the domain is {}; resume it on the host (virsh resume) if that was not intended",
                    other.as_str()
                ),
            ),
            Requeue::After(RECHECK_ODD_STATE),
        ),
    };
    MachinePlan {
        action,
        conditions: with_summary(vec![infra_ready, provisioned, created, running]),
        provisioned: true,
        requeue,
    }
}

/// How long to wait before retrying a failed host cleanup, after the object
/// has been deleting for `deleting_for`: half of that, between 10 seconds
/// and 5 minutes. It grows with the time waited, not with the number of
/// reconciles, so our own status writes do not shorten it.
pub fn deletion_retry(deleting_for: Duration) -> Duration {
    (deleting_for / 2).clamp(DELETION_RETRY_MIN, DELETION_RETRY_MAX)
}
pub const DELETION_RETRY_MIN: Duration = Duration::from_secs(10);
pub const DELETION_RETRY_MAX: Duration = Duration::from_secs(300);

fn decide_deletion(s: &MachineSnapshot) -> MachinePlan {
    let deleting = |message: &str| ConditionUpdate::false_(READY, reasons::DELETING, message);
    if !s.has_finalizer {
        return plan(MachineAction::Nothing, Vec::new());
    }
    if s.skip_host_cleanup {
        return plan(
            MachineAction::SkipHostCleanup,
            vec![deleting(&format!("{SKIP_HOST_CLEANUP_ANNOTATION} is set: the host is not cleaned up"))],
        );
    }
    if !s.host_known {
        // Neither the status nor a LibvirtCluster names a host: the machine
        // never got as far as recording one, so it created nothing.
        return plan(
            MachineAction::RemoveFinalizer,
            vec![deleting(
                "no host is recorded in the status, so nothing was created on a host; nothing on a host was removed",
            )],
        );
    }
    match &s.host {
        Host::Failed { reason, message, .. } => {
            let retry = deletion_retry(s.deleting_for);
            // The message stays the same from one retry to the next: a status
            // write is a watch event, and a changing message would retry at once.
            let ready = ConditionUpdate::false_(
                READY,
                reasons::DELETION_RETRYING,
                format!(
                    "cannot remove the machine from the host yet, retrying every {} s to {} s (half the time deleting so far): {message}. If the host will never answer again, annotate this LibvirtMachine with {SKIP_HOST_CLEANUP_ANNOTATION} to give up on host cleanup",
                    DELETION_RETRY_MIN.as_secs(),
                    DELETION_RETRY_MAX.as_secs()
                ),
            );
            MachinePlan {
                requeue: Requeue::After(retry),
                ..plan(
                    MachineAction::Nothing,
                    vec![ready, ConditionUpdate::false_(DOMAIN_PROVISIONING_READY, reason, message.clone())],
                )
            }
        }
        _ => plan(MachineAction::Delete, vec![deleting("removing the domain, its volumes and its DHCP reservation")]),
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::api::conditions::reasons as r;
    use crate::controller::condition_list::Status;

    fn ready_machine() -> MachineSnapshot {
        MachineSnapshot {
            deleting: false,
            has_finalizer: true,
            paused: None,
            owner_machine: Some("m".into()),
            cluster: Some(("c".into(), true)),
            libvirt_cluster_found: true,
            location_recorded: true,
            host_known: true,
            skip_host_cleanup: false,
            deleting_for: Duration::ZERO,
            bootstrap: Bootstrap::Ready,
            host: Host::NotObserved,
            provisioned: false,
            lease_refresh_due: false,
            domain: "ns-m-abc123".into(),
            host_uri: "qemu+tcp://kvm1/system".into(),
        }
    }

    fn condition(p: &MachinePlan, type_: &str) -> (Status, &'static str) {
        let c = p.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("{type_} not set in {p:?}"));
        (c.status, c.reason)
    }

    fn failed(transient: bool) -> Host {
        Host::Failed { reason: "InfrastructureMissing", message: "base image gone".into(), transient }
    }

    #[rstest]
    #[case::waits_for_owner(|s: &mut MachineSnapshot| s.owner_machine = None, MachineAction::Nothing, INFRASTRUCTURE_READY, Status::Unknown, r::WAITING_FOR_OWNER)]
    #[case::adds_finalizer(|s: &mut MachineSnapshot| s.has_finalizer = false, MachineAction::AddFinalizer, "", Status::Unknown, "")]
    #[case::waits_for_cluster(|s: &mut MachineSnapshot| s.cluster = None, MachineAction::Nothing, INFRASTRUCTURE_READY, Status::False, r::WAITING_FOR_CLUSTER_INFRASTRUCTURE_READY)]
    #[case::waits_for_infrastructure(|s: &mut MachineSnapshot| s.cluster = Some(("c".into(), false)), MachineAction::Nothing, INFRASTRUCTURE_READY, Status::False, r::WAITING_FOR_CLUSTER_INFRASTRUCTURE_READY)]
    #[case::waits_for_libvirt_cluster(|s: &mut MachineSnapshot| s.libvirt_cluster_found = false, MachineAction::Nothing, INFRASTRUCTURE_READY, Status::False, r::WAITING_FOR_CLUSTER_INFRASTRUCTURE_READY)]
    #[case::observes_the_host_first(|_: &mut MachineSnapshot| {}, MachineAction::ObserveHost, "", Status::Unknown, "")]
    #[case::waits_for_data_secret_name(|s: &mut MachineSnapshot| { s.host = Host::Absent; s.bootstrap = Bootstrap::NotSet }, MachineAction::Nothing, DOMAIN_PROVISIONING_READY, Status::False, r::WAITING_FOR_BOOTSTRAP_DATA)]
    #[case::waits_for_secret(|s: &mut MachineSnapshot| { s.host = Host::Absent; s.bootstrap = Bootstrap::SecretMissing("b".into()) }, MachineAction::Nothing, DOMAIN_PROVISIONING_READY, Status::False, r::WAITING_FOR_BOOTSTRAP_DATA)]
    #[case::secret_without_value(|s: &mut MachineSnapshot| { s.host = Host::Absent; s.bootstrap = Bootstrap::Invalid("no value".into()) }, MachineAction::Nothing, DOMAIN_PROVISIONING_READY, Status::False, r::INVALID_BOOTSTRAP_DATA)]
    #[case::creates(|s: &mut MachineSnapshot| s.host = Host::Absent, MachineAction::Create, DOMAIN_PROVISIONING_READY, Status::False, r::DOMAIN_PROVISIONING)]
    #[case::starts_a_stopped_domain(|s: &mut MachineSnapshot| s.host = Host::Present { state: DomainState::Shutoff, has_address: false }, MachineAction::Start, DOMAIN_RUNNING, Status::False, r::DOMAIN_NOT_RUNNING)]
    #[case::starts_a_crashed_domain(|s: &mut MachineSnapshot| s.host = Host::Present { state: DomainState::Crashed, has_address: false }, MachineAction::Start, DOMAIN_RUNNING, Status::False, r::DOMAIN_NOT_RUNNING)]
    #[case::leaves_a_paused_domain(|s: &mut MachineSnapshot| s.host = Host::Present { state: DomainState::Paused, has_address: true }, MachineAction::Nothing, DOMAIN_RUNNING, Status::False, r::DOMAIN_NOT_RUNNING)]
    #[case::running(|s: &mut MachineSnapshot| s.host = Host::Present { state: DomainState::Running, has_address: true }, MachineAction::Nothing, READY, Status::True, r::READY)]
    #[case::host_failure(|s: &mut MachineSnapshot| s.host = failed(false), MachineAction::Nothing, DOMAIN_PROVISIONING_READY, Status::False, "InfrastructureMissing")]
    #[case::bootstrap_is_not_needed_once_created(|s: &mut MachineSnapshot| { s.bootstrap = Bootstrap::SecretMissing("b".into()); s.host = Host::Present { state: DomainState::Running, has_address: true } }, MachineAction::Nothing, MACHINE_CREATED, Status::True, r::DOMAIN_CREATED)]
    #[case::a_provisioned_machine_lost_its_domain(|s: &mut MachineSnapshot| { s.provisioned = true; s.host = Host::Absent }, MachineAction::Nothing, READY, Status::False, r::DOMAIN_LOST)]
    #[case::a_lost_domain_is_not_created(|s: &mut MachineSnapshot| { s.provisioned = true; s.host = Host::Absent }, MachineAction::Nothing, MACHINE_CREATED, Status::False, r::DOMAIN_LOST)]
    #[case::a_lost_domain_is_not_running(|s: &mut MachineSnapshot| { s.provisioned = true; s.host = Host::Absent }, MachineAction::Nothing, DOMAIN_RUNNING, Status::False, r::DOMAIN_LOST)]
    #[case::a_lost_domain_needs_no_bootstrap_data(|s: &mut MachineSnapshot| { s.provisioned = true; s.host = Host::Absent; s.bootstrap = Bootstrap::NotSet }, MachineAction::Nothing, READY, Status::False, r::DOMAIN_LOST)]
    #[case::a_provisioned_stopped_domain_is_started(|s: &mut MachineSnapshot| { s.provisioned = true; s.host = Host::Present { state: DomainState::Shutoff, has_address: false } }, MachineAction::Start, DOMAIN_RUNNING, Status::False, r::DOMAIN_NOT_RUNNING)]
    #[case::paused(|s: &mut MachineSnapshot| s.paused = Some("Cluster c is paused".into()), MachineAction::Nothing, PAUSED, Status::True, r::PAUSED)]
    #[case::paused_even_when_deletable(|s: &mut MachineSnapshot| { s.paused = Some("annotation".into()); s.host = Host::Absent }, MachineAction::Nothing, PAUSED, Status::True, r::PAUSED)]
    fn decides(
        #[case] change: fn(&mut MachineSnapshot),
        #[case] action: MachineAction,
        #[case] type_: &str,
        #[case] status: Status,
        #[case] reason: &str,
    ) {
        let mut s = ready_machine();
        change(&mut s);
        let p = decide(&s);
        assert_eq!(p.action, action, "{p:?}");
        if !type_.is_empty() {
            assert_eq!(condition(&p, type_), (status, reason));
        } else {
            assert!(p.conditions.is_empty(), "intermediate steps report nothing: {p:?}");
        }
    }

    #[rstest]
    #[case::before_anything(Host::NotObserved, true, MachineAction::Delete, r::DELETING)]
    #[case::while_absent(Host::Absent, true, MachineAction::Delete, r::DELETING)]
    #[case::while_running(Host::Present { state: DomainState::Running, has_address: true }, true, MachineAction::Delete, r::DELETING)]
    #[case::after_a_failure(failed(true), true, MachineAction::Nothing, r::DELETION_RETRYING)]
    #[case::after_a_permanent_failure(failed(false), true, MachineAction::Nothing, r::DELETION_RETRYING)]
    #[case::without_a_known_host(Host::NotObserved, false, MachineAction::RemoveFinalizer, r::DELETING)]
    fn deletes_in_every_phase(
        #[case] host: Host,
        #[case] host_known: bool,
        #[case] action: MachineAction,
        #[case] reason: &str,
    ) {
        for owner in [None, Some("m".to_string())] {
            for libvirt_cluster_found in [false, true] {
                let s = MachineSnapshot {
                    deleting: true,
                    host: host.clone(),
                    host_known,
                    libvirt_cluster_found,
                    location_recorded: false,
                    owner_machine: owner.clone(),
                    cluster: None,
                    ..ready_machine()
                };
                let p = decide(&s);
                assert_eq!(p.action, action, "{s:?}");
                assert_eq!(condition(&p, READY), (Status::False, reason));
            }
        }
        let gone = MachineSnapshot { deleting: true, has_finalizer: false, ..ready_machine() };
        assert_eq!(decide(&gone).action, MachineAction::Nothing);
    }

    #[test]
    fn a_failed_cleanup_is_retried_with_a_growing_interval_and_says_how_to_give_up() {
        let at = |secs: u64| {
            let s = MachineSnapshot {
                deleting: true,
                host: failed(true),
                deleting_for: Duration::from_secs(secs),
                ..ready_machine()
            };
            decide(&s)
        };
        let retries: Vec<Requeue> = [0, 30, 120, 3600].into_iter().map(|t| at(t).requeue).collect();
        let secs = |n| Requeue::After(Duration::from_secs(n));
        assert_eq!(retries, [secs(10), secs(15), secs(60), secs(300)]);
        let p = at(120);
        assert_eq!(p.conditions, at(30).conditions, "the conditions do not change between retries");
        let ready = p.conditions.iter().find(|c| c.type_ == READY).unwrap();
        for needle in ["retrying every 10 s to 300 s", "base image gone", SKIP_HOST_CLEANUP_ANNOTATION] {
            assert!(ready.message.contains(needle), "Ready message lacks {needle:?}: {}", ready.message);
        }
    }

    #[test]
    fn the_annotation_gives_up_on_the_host_in_any_phase_but_paused() {
        for host in [Host::NotObserved, failed(true), Host::Absent] {
            for host_known in [false, true] {
                let s = MachineSnapshot {
                    deleting: true,
                    skip_host_cleanup: true,
                    host: host.clone(),
                    host_known,
                    ..ready_machine()
                };
                assert_eq!(decide(&s).action, MachineAction::SkipHostCleanup, "{s:?}");
            }
        }
        let not_deleting = MachineSnapshot { skip_host_cleanup: true, ..ready_machine() };
        assert_eq!(decide(&not_deleting).action, MachineAction::ObserveHost, "the annotation only matters on delete");
        let paused =
            MachineSnapshot { deleting: true, skip_host_cleanup: true, paused: Some("p".into()), ..ready_machine() };
        assert_eq!(decide(&paused).action, MachineAction::Nothing);
    }

    #[test]
    fn the_host_is_recorded_before_it_is_looked_at() {
        let s = MachineSnapshot { location_recorded: false, host: Host::NotObserved, ..ready_machine() };
        let p = decide(&s);
        assert_eq!(p.action, MachineAction::RecordHost);
        assert!(p.conditions.is_empty());
        // Nothing is recorded before the LibvirtCluster is there to say what.
        let s = MachineSnapshot { location_recorded: false, libvirt_cluster_found: false, ..ready_machine() };
        assert_eq!(decide(&s).action, MachineAction::Nothing);
    }

    #[test]
    fn a_paused_machine_is_not_deleted_from_the_host() {
        let s = MachineSnapshot { deleting: true, paused: Some("p".into()), ..ready_machine() };
        assert_eq!(decide(&s).action, MachineAction::Nothing);
        let s = MachineSnapshot { deleting: true, paused: None, ..ready_machine() };
        assert_eq!(decide(&s).action, MachineAction::Delete);
    }

    #[test]
    fn provisioned_once_the_domain_exists_and_backs_off_for_the_lease() {
        let s = MachineSnapshot {
            host: Host::Present { state: DomainState::Running, has_address: false },
            ..ready_machine()
        };
        let p = decide(&s);
        assert!(p.provisioned);
        assert_eq!(p.requeue, Requeue::WaitingForAddress);
        let absent = decide(&MachineSnapshot { host: Host::Absent, ..ready_machine() });
        assert!(!absent.provisioned);
        let addressed = MachineSnapshot {
            host: Host::Present { state: DomainState::Running, has_address: true },
            ..ready_machine()
        };
        assert_eq!(
            decide(&addressed).requeue,
            Requeue::Resync,
            "a healthy machine waits for its domain's events and the long resync"
        );
    }

    #[test]
    fn a_guest_that_waits_long_for_its_lease_has_its_reservation_written_again() {
        let waiting = |state, has_address| MachineSnapshot {
            host: Host::Present { state, has_address },
            lease_refresh_due: true,
            ..ready_machine()
        };
        let p = decide(&waiting(DomainState::Running, false));
        assert_eq!(p.action, MachineAction::RefreshReservation);
        assert_eq!(p.requeue, Requeue::WaitingForAddress);
        assert_eq!(condition(&p, DOMAIN_RUNNING), (Status::True, r::DOMAIN_RUNNING));
        let refreshed = MachineSnapshot { lease_refresh_due: false, ..waiting(DomainState::Running, false) };
        assert_eq!(decide(&refreshed).action, MachineAction::Nothing, "once per reconcile");
        assert_eq!(decide(&refreshed).conditions, p.conditions);
        // Only a running guest without an address waits for a lease.
        assert_eq!(decide(&waiting(DomainState::Running, true)).action, MachineAction::Nothing);
        assert_eq!(decide(&waiting(DomainState::Paused, false)).action, MachineAction::Nothing);
        assert_eq!(decide(&waiting(DomainState::Shutoff, false)).action, MachineAction::Start);
    }

    #[test]
    fn a_lost_domain_is_reported_with_what_to_do_and_deletion_still_cleans_up() {
        let lost = MachineSnapshot { provisioned: true, host: Host::Absent, ..ready_machine() };
        let p = decide(&lost);
        assert_eq!(p.action, MachineAction::Nothing);
        assert_eq!(p.requeue, Requeue::After(RECHECK_LOST));
        assert!(!p.provisioned, "a lost machine does not claim a (new) provisioning: {p:?}");
        let ready = p.conditions.iter().find(|c| c.type_ == READY).unwrap();
        for needle in
            ["ns-m-abc123", "qemu+tcp://kvm1/system", "not created again", "MachineHealthCheck", "delete the Machine"]
        {
            assert!(ready.message.contains(needle), "Ready message lacks {needle:?}: {}", ready.message);
        }
        assert_eq!(condition(&p, DOMAIN_PROVISIONING_READY), (Status::True, r::DOMAIN_PROVISIONED));

        // The same host without a provisioning behind it is a machine to create.
        assert_eq!(decide(&MachineSnapshot { provisioned: false, ..lost.clone() }).action, MachineAction::Create);
        // Deleting a lost machine removes what is left of it (disk, seed, reservation).
        assert_eq!(decide(&MachineSnapshot { deleting: true, ..lost }).action, MachineAction::Delete);
    }

    /// Whatever the host and the bootstrap data say, a provisioned machine is never created again.
    #[test]
    fn a_provisioned_machine_is_never_created() {
        let hosts = [
            Host::NotObserved,
            Host::Absent,
            Host::Present { state: DomainState::Shutoff, has_address: false },
            Host::Present { state: DomainState::Crashed, has_address: false },
            Host::Present { state: DomainState::Running, has_address: true },
            failed(true),
        ];
        let bootstraps =
            [Bootstrap::NotSet, Bootstrap::SecretMissing("b".into()), Bootstrap::Invalid("x".into()), Bootstrap::Ready];
        for host in &hosts {
            for bootstrap in &bootstraps {
                let s = MachineSnapshot {
                    provisioned: true,
                    host: host.clone(),
                    bootstrap: bootstrap.clone(),
                    ..ready_machine()
                };
                assert_ne!(decide(&s).action, MachineAction::Create, "{s:?}");
            }
        }
    }

    #[rstest]
    #[case(true, RETRY_AFTER_TRANSIENT_FAILURE)]
    #[case(false, RETRY_AFTER_PERMANENT_FAILURE)]
    fn failures_are_retried_without_a_tight_loop(#[case] transient: bool, #[case] after: Duration) {
        let p = decide(&MachineSnapshot { host: failed(transient), ..ready_machine() });
        assert_eq!(p.requeue, Requeue::After(after));
        assert_eq!(condition(&p, READY).0, Status::False);
    }
}
