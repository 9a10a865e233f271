//! Changes the LibvirtMachine reconciler makes itself, kept from coming back
//! to it as reconciles.
//!
//! A reconcile that adds the finalizer and writes `spec.providerID`, and that
//! defines and starts the domain, knows what it did: the watch events of its
//! own writes and the domain's lifecycle events of its own actions carry
//! nothing new for it. Without this, each of them queued one more reconcile
//! of the same machine, which read the host again and (its view of the object
//! lagging behind the status it had just written) wrote the same status again.
//!
//! Only what is exactly the reconciler's own change is left out: an object
//! whose watched metadata is what the reconciler's write made of the object
//! it held (anything else changed in between, and the event passes), and a
//! lifecycle event of a kind the action produces on that domain, within a
//! short time after it. A domain that stops, crashes or is undefined, and a
//! change by anyone else, still reconcile at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use capl_host::hypervisor::DomainEventKind;
use kube::Resource;

/// How long an expected lifecycle event stays expected: libvirt delivers the
/// events of an action within milliseconds; one not seen by then is not
/// coming (a libvirt that does not send it), and it must not hide a later
/// event of the same kind.
pub const EXPECT_EVENTS_FOR: Duration = Duration::from_secs(30);

/// The lifecycle events defining and starting a domain produces: QEMU starts
/// with its CPUs paused and libvirt reports them resumed, then started (see the
/// conformance suite).
pub const CREATE_EVENTS: &[DomainEventKind] =
    &[DomainEventKind::Defined, DomainEventKind::Resumed, DomainEventKind::Started];
/// The lifecycle events starting a defined domain produces.
pub const START_EVENTS: &[DomainEventKind] = &[DomainEventKind::Resumed, DomainEventKind::Started];

/// What the object watch last passed on per object (by UID): the hash of what
/// a reconcile depends on ([`not_status`]), or the hash of the object
/// a reconcile's own write made.
#[derive(Default)]
pub struct SeenObjects {
    seen: Mutex<HashMap<String, u64>>,
}

impl SeenObjects {
    /// Whether the watch passes `object` on: what a reconcile depends on
    /// changed since the last object passed or written.
    pub fn pass<K: Resource>(&self, object: &K) -> bool {
        let Some(hash) = not_status(object) else { return true };
        let key = object.meta().uid.clone().unwrap_or_default();
        self.seen.lock().expect("seen objects lock").insert(key, hash) != Some(hash)
    }

    /// Notes, before the reconciler writes, the object its write will make:
    /// `expected` is the object it holds with its change made (and the
    /// generation a spec change gives). When the write's watch event carries
    /// exactly that, it is not passed on; when someone else's change is in it
    /// too (or came in between), it is. Noted before the write, because the
    /// watch event can arrive before the write's response. Returns what was
    /// noted before, for [`Self::write_failed`].
    pub fn will_write<K: Resource>(&self, expected: &K) -> Option<u64> {
        let hash = not_status(expected)?;
        let key = expected.meta().uid.clone().unwrap_or_default();
        self.seen.lock().expect("seen objects lock").insert(key, hash)
    }

    /// The write [`Self::will_write`] announced failed: what was noted
    /// before it holds again.
    pub fn write_failed<K: Resource>(&self, expected: &K, before: Option<u64>) {
        let key = expected.meta().uid.clone().unwrap_or_default();
        let mut seen = self.seen.lock().expect("seen objects lock");
        match before {
            Some(hash) => seen.insert(key, hash),
            None => seen.remove(&key),
        };
    }

    /// Forgets the objects whose UID `keep` rejects.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.seen.lock().expect("seen objects lock").retain(|uid, _| keep(uid));
    }
}

/// Lifecycle events the reconciler's own host actions will bring, per domain name.
#[derive(Default)]
pub struct ExpectedEvents {
    expected: Mutex<HashMap<String, Vec<(DomainEventKind, Instant)>>>,
}

impl ExpectedEvents {
    /// Notes that an action on `domain` is about to produce `kinds`.
    pub fn expect(&self, domain: &str, kinds: &[DomainEventKind]) {
        let now = Instant::now();
        let mut expected = self.expected.lock().expect("expected events lock");
        let list = expected.entry(domain.to_string()).or_default();
        list.retain(|(_, at)| now.duration_since(*at) < EXPECT_EVENTS_FOR);
        list.extend(kinds.iter().map(|kind| (*kind, now)));
    }

    /// Whether an event of `kind` on `domain` was expected (it is then no
    /// longer expected): the reconciler caused it and need not look again.
    pub fn take(&self, domain: &str, kind: DomainEventKind) -> bool {
        let now = Instant::now();
        let mut expected = self.expected.lock().expect("expected events lock");
        let Some(list) = expected.get_mut(domain) else { return false };
        list.retain(|(_, at)| now.duration_since(*at) < EXPECT_EVENTS_FOR);
        let found = list.iter().position(|(k, _)| *k == kind).map(|i| list.remove(i)).is_some();
        if list.is_empty() {
            expected.remove(domain);
        }
        found
    }

    /// Expects nothing more of `domain` (its action failed).
    pub fn forget(&self, domain: &str) {
        self.expected.lock().expect("expected events lock").remove(domain);
    }

    /// Forgets what is no longer expected (the sweep calls it).
    pub fn forget_old(&self) {
        let now = Instant::now();
        let mut expected = self.expected.lock().expect("expected events lock");
        expected.retain(|_, list| {
            list.retain(|(_, at)| now.duration_since(*at) < EXPECT_EVENTS_FOR);
            !list.is_empty()
        });
    }
}

/// What a reconcile of one of our objects depends on, hashed: everything but
/// its status (and resourceVersion and managedFields, which every write
/// changes). The controllers' own status writes therefore do not bring the
/// object back for another reconcile (and another look at the host);
/// changes to the spec (generation), labels, annotations (paused, skip host
/// cleanup), finalizers, owners and deletion do.
pub(crate) fn not_status<K: kube::Resource>(object: &K) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let meta = object.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.uid.hash(&mut hasher);
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp.as_ref().map(|t| t.0.to_string()).hash(&mut hasher);
    for owner in meta.owner_references.iter().flatten() {
        (&owner.api_version, &owner.kind, &owner.name, &owner.uid, owner.controller).hash(&mut hasher);
    }
    Some(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::LibvirtMachine;
    use serde_json::json;

    fn machine(finalizers: &[&str], labels: serde_json::Value, generation: i64) -> LibvirtMachine {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "LibvirtMachine",
            "metadata": { "name": "m", "namespace": "ns", "uid": "u1", "generation": generation,
                          "finalizers": finalizers, "labels": labels },
            "spec": { "vcpu": 1, "memoryMiB": 512, "diskGiB": 10, "image": "base.qcow2" },
        }))
        .unwrap()
    }

    #[test]
    fn an_own_write_is_not_passed_on_but_a_change_by_someone_else_is() {
        let seen = SeenObjects::default();
        let held = machine(&[], json!({}), 1);
        assert!(seen.pass(&held));
        assert!(!seen.pass(&held), "the same object again");

        // The reconciler adds its finalizer: its watch event carries nothing new.
        let with_finalizer = machine(&["f"], json!({}), 1);
        seen.will_write(&with_finalizer);
        assert!(!seen.pass(&with_finalizer));

        // A write whose result holds someone else's label too is passed on.
        seen.will_write(&machine(&["f"], json!({}), 2));
        assert!(seen.pass(&machine(&["f"], json!({ "theirs": "1" }), 2)));

        // A write that failed: the object as seen before it is not passed on again.
        let before = seen.will_write(&machine(&["f", "g"], json!({ "theirs": "1" }), 2));
        seen.write_failed(&machine(&["f", "g"], json!({ "theirs": "1" }), 2), before);
        assert!(!seen.pass(&machine(&["f"], json!({ "theirs": "1" }), 2)));

        // And a later change by someone else is passed on as always.
        assert!(seen.pass(&machine(&["f"], json!({ "theirs": "2" }), 2)));
        seen.retain(|_| false);
        assert!(seen.pass(&machine(&["f"], json!({ "theirs": "2" }), 2)), "forgotten: passed again");
    }

    #[test]
    fn expected_events_are_taken_once_and_others_pass() {
        let expected = ExpectedEvents::default();
        expected.expect("d", CREATE_EVENTS);
        assert!(expected.take("d", DomainEventKind::Defined));
        assert!(expected.take("d", DomainEventKind::Started));
        assert!(!expected.take("d", DomainEventKind::Started), "a second start was not expected");
        assert!(!expected.take("d", DomainEventKind::Stopped), "a stop is never expected");
        assert!(!expected.take("other", DomainEventKind::Defined));
        assert!(expected.take("d", DomainEventKind::Resumed));
        assert!(expected.expected.lock().unwrap().is_empty());
        // A failed start expects nothing more: a start by someone else reconciles.
        expected.expect("d", START_EVENTS);
        expected.forget("d");
        assert!(!expected.take("d", DomainEventKind::Started));
    }
}
