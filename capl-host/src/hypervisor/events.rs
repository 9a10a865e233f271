//! The domain-event fan-out of a [`super::connections::Connections`] cache:
//! every connection the cache opens subscribes to its host's domain lifecycle
//! events, and the events of every host go to one sink as [`HostEvent`]s. A
//! connection's [`Subscription`] lives exactly as long as the cached
//! connection (see the `connections` module's "Domain events").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::{DomainEvent, EventSubscription, Hypervisor};

/// What a [`Connections`] cache tells its event sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEvent {
    /// A lifecycle event of a domain on the host opened with `uri`.
    Domain { uri: String, event: DomainEvent },
    /// The host opened with `uri` has a new, subscribed connection after it
    /// had another: events in between were lost.
    Reconnected { uri: String },
    /// A call to the host opened with `uri` returned after one had gone
    /// unanswered, or after callers were turned away because every call slot
    /// was stalled: the calls refused or given up on meanwhile can succeed now.
    Answered { uri: String },
}

/// Receives the cache's [`HostEvent`]s. It runs on the backend's event thread
/// (or a connect's blocking thread): it must be quick and must not block.
pub type HostEventSink = Arc<dyn Fn(HostEvent) + Send + Sync + 'static>;

/// The sink, shared with the subscriptions' callbacks (which must not hold
/// the cache itself), and how many subscriptions were made.
#[derive(Default)]
pub(super) struct EventFanOut {
    sink: Arc<RwLock<Option<HostEventSink>>>,
    subscriptions: AtomicU64,
}

impl EventFanOut {
    /// Sends the events of every subscription made from now on to `sink`
    /// (replacing an earlier sink, which gets nothing more).
    pub(super) fn set_sink(&self, sink: HostEventSink) {
        *self.sink.write().unwrap_or_else(|e| e.into_inner()) = Some(sink);
    }

    pub(super) fn has_sink(&self) -> bool {
        self.sink.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    pub(super) fn emit(&self, event: HostEvent) {
        emit_to(&self.sink, event);
    }

    /// [`EventFanOut::emit`] for a thread that does not hold the cache.
    pub(super) fn emitter(&self) -> impl Fn(HostEvent) + Send + 'static {
        let sink = self.sink.clone();
        move |event| emit_to(&sink, event)
    }

    /// Subscribes `conn` (just opened for `uri`) to domain events for the
    /// sink; `None` without a sink or when subscribing failed (logged).
    pub(super) fn subscribe(&self, uri: &str, conn: &dyn Hypervisor) -> Option<EventSubscription> {
        if !self.has_sink() {
            return None;
        }
        let sink = Arc::downgrade(&self.sink);
        let from = uri.to_string();
        let subscribed = conn.subscribe_domain_events(Box::new(move |event| {
            if let Some(sink) = sink.upgrade() {
                emit_to(&sink, HostEvent::Domain { uri: from.clone(), event });
            }
        }));
        match subscribed {
            Ok(subscription) => {
                self.subscriptions.fetch_add(1, Ordering::SeqCst);
                Some(subscription)
            }
            Err(e) => {
                tracing::warn!(%uri, error = %e, "cannot subscribe to domain lifecycle events; the connection is replaced at the next check");
                None
            }
        }
    }

    /// Event subscriptions made so far, over all hosts.
    pub(super) fn subscriptions_made(&self) -> u64 {
        self.subscriptions.load(Ordering::SeqCst)
    }
}

fn emit_to(sink: &RwLock<Option<HostEventSink>>, event: HostEvent) {
    let sink = sink.read().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(sink) = sink {
        sink(event);
    }
}

/// A connection's event subscription. Dropping it deregisters on a thread of
/// its own: deregistering is a call to the host, which may not answer, and
/// it is dropped where no call may block (under the slot's lock, on a
/// runtime worker).
pub(super) struct Subscription(pub(super) Option<EventSubscription>);

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(subscription) = self.0.take() {
            let spawned =
                std::thread::Builder::new().name("libvirt-event-deregister".into()).spawn(move || drop(subscription));
            if let Err(e) = spawned {
                // Never block here; the subscription's callback then lives on until the process ends.
                tracing::warn!(error = %e, "cannot spawn a thread to deregister domain events");
            }
        }
    }
}
