//! Domain lifecycle events, as libvirt's `VIR_DOMAIN_EVENT_ID_LIFECYCLE` callbacks deliver
//! them: the simulator emits the event kinds and details the QEMU driver emits for the same
//! transitions (the conformance suite compares them with a real libvirtd).
//!
//! Like libvirt, delivery is asynchronous: a transition queues its events while the host is
//! locked (so they keep the order of the transitions), and one dispatcher thread per host
//! (started with the first subscription) calls the subscribers. A callback may therefore
//! call back into the simulator without deadlocking.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};

/// `virDomainEventType`, with libvirt's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DomainEventKind {
    Defined = 0,
    Undefined = 1,
    Started = 2,
    Suspended = 3,
    Resumed = 4,
    Stopped = 5,
    Shutdown = 6,
    PmSuspended = 7,
    Crashed = 8,
}

/// The detail codes the simulator emits (libvirt's `virDomainEvent*DetailType` values).
pub mod event_detail {
    /// `VIR_DOMAIN_EVENT_DEFINED_ADDED`: a new persistent config.
    pub const DEFINED_ADDED: i32 = 0;
    /// `VIR_DOMAIN_EVENT_DEFINED_UPDATED`: an existing config replaced.
    pub const DEFINED_UPDATED: i32 = 1;
    /// `VIR_DOMAIN_EVENT_UNDEFINED_REMOVED`.
    pub const UNDEFINED_REMOVED: i32 = 0;
    /// `VIR_DOMAIN_EVENT_STARTED_BOOTED`.
    pub const STARTED_BOOTED: i32 = 0;
    /// `VIR_DOMAIN_EVENT_SUSPENDED_PAUSED`.
    pub const SUSPENDED_PAUSED: i32 = 0;
    /// `VIR_DOMAIN_EVENT_RESUMED_UNPAUSED`.
    pub const RESUMED_UNPAUSED: i32 = 0;
    /// `VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN`: the guest powered off.
    pub const STOPPED_SHUTDOWN: i32 = 0;
    /// `VIR_DOMAIN_EVENT_STOPPED_DESTROYED`.
    pub const STOPPED_DESTROYED: i32 = 1;
    /// `VIR_DOMAIN_EVENT_SHUTDOWN_GUEST`: the guest finished shutting down on its
    /// own (QEMU reports the power-off as guest-initiated).
    pub const SHUTDOWN_GUEST: i32 = 1;
    /// `VIR_DOMAIN_EVENT_SHUTDOWN_HOST`: the host asked QEMU to quit (a destroy's SIGTERM).
    pub const SHUTDOWN_HOST: i32 = 2;
    /// `VIR_DOMAIN_EVENT_CRASHED_PANICKED`.
    pub const CRASHED_PANICKED: i32 = 0;
}

/// One lifecycle event: the domain's name, the kind and libvirt's detail code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainEvent {
    pub domain: String,
    pub kind: DomainEventKind,
    pub detail: i32,
}

type Callback = Arc<dyn Fn(&DomainEvent) + Send + Sync>;

/// The subscribers of one host and its dispatcher.
#[derive(Default)]
pub(crate) struct Events {
    subscribers: Arc<Mutex<BTreeMap<u64, Callback>>>,
    next_id: AtomicU64,
    /// The dispatcher's queue; `None` until the first subscription.
    queue: Mutex<Option<Sender<DomainEvent>>>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.subscribers.lock().map(|s| s.len()).unwrap_or(0);
        f.debug_struct("Events").field("subscribers", &n).finish()
    }
}

impl Events {
    /// Adds a subscriber; returns its id for [`unsubscribe`](Self::unsubscribe).
    pub fn subscribe(&self, callback: Callback) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst) + 1;
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).insert(id, callback);
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if queue.is_none() {
            let (tx, rx) = channel::<DomainEvent>();
            let subscribers = Arc::clone(&self.subscribers);
            // Ends when the host (and so the sender) is dropped.
            std::thread::Builder::new()
                .name("libvirt-sim-events".into())
                .spawn(move || {
                    for event in rx {
                        let callbacks: Vec<Callback> =
                            subscribers.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
                        for callback in callbacks {
                            callback(&event);
                        }
                    }
                })
                .expect("spawn the simulated host's event dispatcher");
            *queue = Some(tx);
        }
        id
    }

    /// Removes a subscriber; false when the id is unknown (already removed).
    pub fn unsubscribe(&self, id: u64) -> bool {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).remove(&id).is_some()
    }

    /// Queues an event for the subscribers (nothing to do without any).
    pub fn emit(&self, domain: &str, kind: DomainEventKind, detail: i32) {
        if let Some(tx) = self.queue.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = tx.send(DomainEvent { domain: domain.to_string(), kind, detail });
        }
    }
}
