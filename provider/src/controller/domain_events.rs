//! Domain lifecycle events from the libvirt hosts -> reconciles of the
//! LibvirtMachines whose domains they concern.
//!
//! The connection cache subscribes every host connection to libvirt's
//! lifecycle events and hands them to the sink made here (see
//! `capl_host::hypervisor::connections`). An event on a domain that is a
//! LibvirtMachine's (its name is the one `capl_host::naming` derives from the
//! machine's namespace, name and identity) reconciles that machine; events
//! on other domains are ignored. A reconnect, after which events may have
//! been lost, reconciles every LibvirtMachine on that host once.
//!
//! A connection that breaks again and again (a flaky network) must not have
//! every machine of its host reconciled again and again: a host is re-listed
//! at once after a reconnect, and at most once per [`RELIST_MIN_GAP`]
//! after that; a reconnect within the gap re-lists at its end (never later),
//! so no reconnect goes without a look.
//!
//! The sink runs on libvirt's event thread and must not block, so it only
//! puts the event into a bounded queue. When the queue is full the event is
//! dropped and every LibvirtMachine is reconciled once the queue drains (as
//! after a reconnect), so an event is never lost without a look.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;

use super::machine::machine_identity;
use super::metrics::Metrics;
use super::own_changes::ExpectedEvents;
use crate::api::LibvirtMachine;
use capl_host::hypervisor::events::{HostEvent, HostEventSink};

/// Events queued between libvirt's event thread and the controller.
const QUEUE: usize = 4096;

/// The least time between two re-lists of one host (the first re-list after
/// a reconnect is at once): a flaky connection costs its host at most what
/// looking at every machine once a minute costs.
pub const RELIST_MIN_GAP: Duration = Duration::from_secs(60);

/// The receiving side of [`sink`].
pub struct Receiver {
    queue: mpsc::Receiver<HostEvent>,
    /// Set when an event was dropped because the queue was full.
    overflowed: Arc<AtomicBool>,
    /// For a re-list put off to the end of its gap; weak, so that the stream
    /// ends once the sink is gone.
    again: mpsc::WeakSender<HostEvent>,
}

/// A sink for the connection cache, and the receiver for [`reconciles`].
pub fn sink() -> (HostEventSink, Receiver) {
    let (tx, queue) = mpsc::channel(QUEUE);
    let again = tx.downgrade();
    let overflowed = Arc::new(AtomicBool::new(false));
    let flag = overflowed.clone();
    let sink: HostEventSink = Arc::new(move |event| {
        if tx.try_send(event).is_err() {
            flag.store(true, Ordering::SeqCst);
        }
    });
    (sink, Receiver { queue, overflowed, again })
}

/// What one host event asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wanted {
    Nothing,
    One(ObjectRef<LibvirtMachine>),
    /// Every LibvirtMachine recorded on the host with this (user's) URI.
    Host(String),
    /// Every LibvirtMachine (events were dropped).
    All,
}

/// The reconciles the host events ask for, for `Controller::reconcile_on`.
/// `user_uri` maps a URI the manager opened to the one the objects name;
/// `relist_gap` is [`RELIST_MIN_GAP`] but in tests.
pub fn reconciles(
    receiver: Receiver,
    machines: Store<LibvirtMachine>,
    user_uri: impl Fn(&str) -> String + Send + 'static,
    metrics: Metrics,
    relist_gap: Duration,
    expected: Arc<ExpectedEvents>,
) -> impl Stream<Item = ObjectRef<LibvirtMachine>> + Send + 'static {
    let Receiver { queue, overflowed, again } = receiver;
    let mut names = DomainNames::default();
    let mut relists = Relists::default();
    futures::stream::unfold(queue, |mut queue| async move { queue.recv().await.map(|event| (event, queue)) })
        .flat_map(move |event| {
            let wanted = match event {
                HostEvent::Domain { event, .. } => {
                    let found = names.machine_of(&machines, &event.domain);
                    match found {
                        Some(machine) if expected.take(&event.domain, event.kind) => {
                            metrics.domain_event("own");
                            tracing::debug!(domain = %event.domain, kind = event.kind.as_str(), machine = %machine, "domain event of the reconciler's own action: nothing new");
                            Wanted::Nothing
                        }
                        Some(machine) => {
                            metrics.domain_event("reconcile");
                            tracing::debug!(domain = %event.domain, kind = event.kind.as_str(), detail = event.detail, machine = %machine, "domain event: reconciling its LibvirtMachine");
                            Wanted::One(machine)
                        }
                        None => {
                            metrics.domain_event("ignored");
                            Wanted::Nothing
                        }
                    }
                }
                // What happened on the host while no connection was
                // subscribed is looked at again, at most once per gap.
                HostEvent::Reconnected { uri } => {
                    if relists.due(&uri, relist_gap, &again) {
                        Wanted::Host(user_uri(&uri))
                    } else {
                        Wanted::Nothing
                    }
                }
                // What failed on the host while it did not answer is tried
                // again now. Not held to the reconnect gap: the host was found
                // unanswered first, which takes a call timeout, and a reconnect
                // during the hang must not put this off.
                HostEvent::Answered { uri } => Wanted::Host(user_uri(&uri)),
            };
            let wanted = if overflowed.swap(false, Ordering::SeqCst) { Wanted::All } else { wanted };
            let refs = match wanted {
                Wanted::Nothing => Vec::new(),
                Wanted::One(machine) => vec![machine],
                Wanted::Host(uri) => {
                    metrics.host_relisted();
                    let on_host = machines_on_host(&machines, &uri);
                    tracing::info!(%uri, machines = on_host.len(), "reconnected to the host, or it answers again: reconciling its machines");
                    on_host
                }
                Wanted::All => {
                    metrics.host_relisted();
                    tracing::warn!("domain events were dropped (the queue was full): reconciling every machine");
                    machines.state().iter().map(|m| ObjectRef::from_obj(m.as_ref())).collect()
                }
            };
            futures::stream::iter(refs)
        })
}

/// When each host was last re-listed, and whether a re-list waits for the
/// end of its gap.
#[derive(Default)]
struct Relists {
    hosts: HashMap<String, (Instant, bool)>,
}

impl Relists {
    /// Whether host `uri` (opened URI) is to be re-listed now. If it was
    /// re-listed less than `gap` ago, the re-list is put off to the end of the
    /// gap (a `Reconnected` sent again through `again`), once.
    fn due(&mut self, uri: &str, gap: Duration, again: &mpsc::WeakSender<HostEvent>) -> bool {
        let now = Instant::now();
        match self.hosts.get_mut(uri) {
            Some((last, deferred)) if now.duration_since(*last) < gap => {
                if !*deferred && let Some(tx) = again.upgrade() {
                    *deferred = true;
                    let (at, uri) = (*last + gap, uri.to_string());
                    tracing::info!(%uri, "reconnected again: the host's machines are looked at once the re-list gap ends");
                    tokio::spawn(async move {
                        tokio::time::sleep_until(at.into()).await;
                        let _ = tx.send(HostEvent::Reconnected { uri }).await;
                    });
                }
                false
            }
            _ => {
                self.hosts.insert(uri.to_string(), (now, false));
                true
            }
        }
    }
}

/// The LibvirtMachines that recorded `uri` as their host.
pub fn machines_on_host(machines: &Store<LibvirtMachine>, uri: &str) -> Vec<ObjectRef<LibvirtMachine>> {
    machines
        .state()
        .iter()
        .filter(|m| m.status.as_ref().and_then(|s| s.host_uri.as_deref()) == Some(uri))
        .map(|m| ObjectRef::from_obj(m.as_ref()))
        .collect()
}

/// What a machine's domain name follows besides its namespace and name:
/// the provider ID (the identity) and the recorded domain name (the scheme).
type NameInputs = (Option<String>, Option<String>);

/// The domain name of each LibvirtMachine, remembered per UID, identity and
/// recorded domain name (computing it hashes).
#[derive(Default)]
struct DomainNames {
    /// Per LibvirtMachine UID: what its domain name follows, and the name.
    by_uid: HashMap<String, (NameInputs, String)>,
}

impl DomainNames {
    /// The LibvirtMachine whose domain is `domain`, if any.
    fn machine_of(&mut self, machines: &Store<LibvirtMachine>, domain: &str) -> Option<ObjectRef<LibvirtMachine>> {
        let all = machines.state();
        if self.by_uid.len() > 2 * all.len() + 64 {
            // Forget machines that are gone.
            self.by_uid.clear();
        }
        all.iter()
            .find(|m| self.domain_of(m).is_some_and(|name| name == domain))
            .map(|m| ObjectRef::from_obj(m.as_ref()))
    }

    fn domain_of(&mut self, machine: &LibvirtMachine) -> Option<&str> {
        let uid = machine.uid()?;
        // The name follows the provider ID and the recorded domain name (its scheme).
        let key = (machine.spec.provider_id.clone(), machine.status.as_ref().and_then(|s| s.domain_name.clone()));
        let fresh = self.by_uid.get(&uid).is_some_and(|(k, _)| *k == key);
        if !fresh {
            // A provider ID this provider did not set: nothing of ours exists under it.
            let identity = machine_identity(machine).ok()?;
            let name = super::machine::machine_domain_name(machine, &identity);
            self.by_uid.insert(uid.clone(), (key, name));
        }
        self.by_uid.get(&uid).map(|(_, name)| name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capl_host::hypervisor::{DomainEvent, DomainEventKind};
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;
    use serde_json::json;

    fn machine(name: &str, uid: &str, provider_id: Option<&str>, host: &str) -> LibvirtMachine {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "LibvirtMachine",
            "metadata": { "name": name, "namespace": "ns", "uid": uid },
            "spec": { "vcpu": 1, "memoryMiB": 512, "diskGiB": 10, "image": "base.qcow2", "providerID": provider_id },
            "status": { "hostURI": host },
        }))
        .unwrap()
    }

    fn event(uri: &str, domain: &str) -> HostEvent {
        HostEvent::Domain {
            uri: uri.into(),
            event: DomainEvent { domain: domain.into(), kind: DomainEventKind::Stopped, detail: 1 },
        }
    }

    fn store(machines: &[LibvirtMachine]) -> Store<LibvirtMachine> {
        let mut writer = Writer::<LibvirtMachine>::default();
        for m in machines {
            writer.apply_watcher_event(&watcher::Event::Apply(m.clone()));
        }
        writer.as_reader()
    }

    async fn reconciles_for(events: Vec<HostEvent>, machines: &[LibvirtMachine], overflow: bool) -> Vec<String> {
        let (sink, receiver) = sink();
        let store = store(machines);
        if overflow {
            receiver.overflowed.store(true, Ordering::SeqCst);
        }
        for e in events {
            sink(e);
        }
        // The stream ends once the queue is drained and the sink is gone.
        drop(sink);
        let user_uri = |opened: &str| opened.split('?').next().unwrap_or_default().to_string();
        reconciles(receiver, store, user_uri, Metrics::default(), RELIST_MIN_GAP, Arc::default())
            .map(|r| r.name)
            .collect()
            .await
    }

    #[tokio::test]
    async fn an_event_reconciles_the_machine_of_its_domain_only() {
        let a = machine("a", "uid-a", None, "qemu:///h1");
        let b = machine("b", "uid-b", Some("libvirt://5d0f6c2e-8a47-4c1b-9a53-0c2d7e4b8f10"), "qemu:///h1");
        let domain_a = capl_host::naming::domain_name("ns", "a", "uid-a");
        // With a provider ID, the identity is its UUID, not the UID.
        let domain_b = capl_host::naming::domain_name("ns", "b", "5d0f6c2e-8a47-4c1b-9a53-0c2d7e4b8f10");
        let stale_b = capl_host::naming::domain_name("ns", "b", "uid-b");
        let events = vec![
            event("qemu:///h1", &domain_a),
            event("qemu:///h1", "someone-elses-vm"),
            event("qemu:///h1", &domain_b),
            event("qemu:///h1", &stale_b),
        ];
        assert_eq!(reconciles_for(events, &[a, b], false).await, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_machine_named_with_six_digits_gets_the_events_of_its_recorded_domain() {
        use capl_host::naming::{NameScheme, domain_name_in};
        let uuid = "5d0f6c2e-8a47-4c1b-9a53-0c2d7e4b8f10";
        let legacy = domain_name_in(NameScheme::Legacy, "ns", "old", uuid);
        let mut old = machine("old", "uid-old", Some(&format!("libvirt://{uuid}")), "qemu:///h1");
        old.status.as_mut().unwrap().domain_name = Some(legacy.clone());
        let current = domain_name_in(NameScheme::Current, "ns", "old", uuid);
        let events = vec![event("qemu:///h1", &current), event("qemu:///h1", &legacy)];
        assert_eq!(reconciles_for(events, &[old], false).await, ["old"]);
    }

    #[tokio::test]
    async fn a_reconnect_or_an_answer_reconciles_the_machines_of_that_host_and_an_overflow_all() {
        let machines = [
            machine("a", "uid-a", None, "qemu+tls://h1/system"),
            machine("b", "uid-b", None, "qemu+tls://h2/system"),
            machine("c", "uid-c", None, "qemu+tls://h1/system"),
        ];
        let reconnect = HostEvent::Reconnected { uri: "qemu+tls://h1/system?pkipath=/run/x".into() };
        let mut on_h1 = reconciles_for(vec![reconnect.clone()], &machines, false).await;
        on_h1.sort();
        assert_eq!(on_h1, ["a", "c"]);
        // A host that answers again after a call went unanswered: the same,
        // even right after a reconnect re-listed it.
        let answered = HostEvent::Answered { uri: "qemu+tls://h1/system?pkipath=/run/x".into() };
        let mut again = reconciles_for(vec![reconnect.clone(), answered], &machines, false).await;
        again.sort();
        assert_eq!(again, ["a", "a", "c", "c"]);
        let mut all = reconciles_for(vec![event("qemu+tls://h1/system", "not-ours")], &machines, true).await;
        all.sort();
        assert_eq!(all, ["a", "b", "c"], "an overflow looks at every machine");
    }

    /// Reconnects in a row re-list the host at once, then once more at the
    /// end of the gap however many came within it; never more, never none.
    #[tokio::test]
    async fn reconnects_within_the_gap_re_list_once_at_its_end() {
        let machines = [machine("a", "uid-a", None, "qemu:///h1"), machine("b", "uid-b", None, "qemu:///h2")];
        let (sink, receiver) = sink();
        let metrics = Metrics::default();
        let gap = Duration::from_millis(300);
        let started = Instant::now();
        for _ in 0..3 {
            sink(HostEvent::Reconnected { uri: "qemu:///h1".into() });
        }
        // The sink stays, as in the manager: the stream is watched for three gaps.
        let seen: Vec<(String, Duration)> =
            reconciles(receiver, store(&machines), |u| u.to_string(), metrics.clone(), gap, Arc::default())
                .map(|r| (r.name, started.elapsed()))
                .take_until(tokio::time::sleep(gap * 3))
                .collect()
                .await;
        drop(sink);
        let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "a"], "{seen:?}");
        assert!(seen[1].1 >= gap, "the second re-list came {:?} after the first reconnect", seen[1].1);
        assert!(metrics.encode().contains("capl_host_relists_total 2"), "{}", metrics.encode());
    }
}
