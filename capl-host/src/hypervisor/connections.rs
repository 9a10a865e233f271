//! One cached libvirt connection per host URI, shared by every reconcile, and
//! a bounded time for everything done on a host.
//!
//! - [`Connections`] maps a URI to a host slot holding at most one open
//!   [`Hypervisor`]. The first call on a host opens it (through a
//!   [`Connector`]); later calls reuse it. A connection found dead (it reports
//!   `is_alive() == false`, or a call failed because the connection is gone:
//!   [`CallError::connection_lost`], or a call timed out on it) is dropped by
//!   [`HostHandle::call`] itself and the *next* call reconnects; callers never
//!   drop connections. A failed call is never retried here: the reconcile that
//!   saw the error requeues, and every host step is idempotent.
//! - Each host admits at most `max_calls_per_host` calls at a time (a tokio
//!   semaphore), so a burst of reconciles cannot pile requests onto one
//!   libvirtd (whose default `max_client_requests` is 5 per client).
//! - [`HostHandle::call`] runs the blocking trait call on tokio's blocking
//!   pool (`spawn_blocking`); nothing here blocks a runtime worker, and no
//!   lock is held while libvirt is called or a connection is opened.
//!
//! # A host that does not answer
//!
//! libvirt's calls, `virConnectOpen` included, have no timeout of their own: a
//! libvirtd that accepts the TCP connection and never answers blocks the
//! calling thread until the peer closes the connection. So the async side
//! bounds every wait and gives up on the thread:
//!
//! - **Connect**: at most one connect per host runs at a time, on the
//!   blocking pool and outside every lock. Callers that need the host's
//!   connection meanwhile wait for that connect, each until
//!   `connect_timeout` ([`DEFAULT_CONNECT_TIMEOUT`], 15 s) after it started;
//!   once a connect has run longer than that, callers fail at once. No second
//!   connect is started while one is stuck, so a hung host costs one blocked
//!   thread for connecting; when the stuck connect returns (the host closes
//!   the TCP connection, e.g. because libvirtd was restarted), its
//!   connection is used, or the next call connects again.
//! - **Call**: a call (one host operation, a handful of libvirt calls) that
//!   has not returned after `call_timeout` ([`DEFAULT_CALL_TIMEOUT`], 30 s)
//!   is abandoned and its connection dropped, so the next call reconnects.
//!   The abandoned thread keeps its call slot until libvirt returns (when the
//!   peer stops answering altogether, keepalive closes the connection within
//!   ~20 s; a libvirtd that answers keepalive but not the call keeps it until
//!   it is restarted), so stuck threads per host never exceed
//!   `max_calls_per_host`. A caller that waits
//!   `call_timeout` for a slot fails too, and says that every slot is taken;
//!   while every slot of a host is held by a call already given up on, its
//!   callers fail at once, saying so, instead of waiting for a slot (a
//!   reconcile worker is not held for a host that cannot answer).
//! - **A host that has just hung**: before any call is given up on, a caller
//!   that finds every slot taken waits only while the host answers. Each
//!   call's libvirt calls are watched (the connection handed to the closure
//!   is [`Observed`]); when every slot is held by a call waiting for a
//!   libvirt call past its patience ([`DEFAULT_SLOT_PATIENCE`] for a quick
//!   one, [`LENGTHY_CALL_PATIENCE`] for one that starts a guest or makes a
//!   volume, or four times the slowest of its kind the host answered), the
//!   caller fails at once, saying so. Progress is judged per libvirt call,
//!   not per call, because a call that creates a machine holds its slot for
//!   many libvirt calls and seconds in all on a host that answers each of
//!   them. A host that has answered nothing yet gets the whole call timeout.
//! - **A host that stopped answering**: once a call on a host has been given
//!   up on, the host counts as unanswered until a call on it returns. Meanwhile
//!   one call at a time goes to it (a probe); every other call fails at once
//!   with `no answer`, saying that one call at a time tries the host, and the
//!   callers already waiting for one of its call slots are woken to fail the
//!   same way. So a host whose calls hang holds at most one reconcile worker
//!   (its probe) after its first timeout, however many machines it has,
//!   instead of one per call slot and every caller queued behind them. The
//!   first call that returns, with a result or an error from the host, ends it.
//! - **Threads, over all hosts**: URIs are user input, so the number of hosts,
//!   and of threads they can hold, is not bounded by the per-host limits
//!   alone. Connects in flight are bounded over all hosts
//!   ([`DEFAULT_MAX_CONNECT_THREADS`]) and so are calls in flight, stuck ones
//!   included ([`DEFAULT_MAX_CALL_THREADS`]); both together stay well below
//!   tokio's blocking pool, so that hosts that do not answer can never take
//!   every thread and stall the manager's other work. A connect or call that
//!   finds its budget used up waits for a thread within its own timeout and
//!   then fails, saying that the manager is waiting on too many hosts; hosts
//!   with an open connection and a free slot are served as before.
//! - Each of these failures is [`CallError::no_answer`]: for the host layer a
//!   `HostError::NoAnswer`, "no answer from <uri> within <N> s", of kind
//!   `HostUnreachable`, which the controllers report as the condition reason
//!   `HostUnreachable` and retry. Other hosts have their own slots, connects
//!   and threads and are not held up. The manager sets both timeouts with
//!   `--libvirt-call-timeout` and `--libvirt-connect-timeout`.
//!
//! # Domain events
//!
//! With an event sink set ([`Connections::set_event_sink`]), every connection
//! the cache opens subscribes to domain lifecycle events
//! ([`Hypervisor::subscribe_domain_events`]) before any call uses it, inside
//! the connect (so within its timeout), and hands each event to the sink as
//! [`HostEvent::Domain`]. The subscription lives exactly as long as the cached
//! connection: dropping the connection (it died, a call timed out on it, its
//! host was forgotten) drops the subscription, on a thread of its own since
//! deregistering is a call to the host. A connection whose subscription
//! failed is used all the same and replaced by the next
//! [`Connections::check_connections`].
//!
//! Events sent while no connection was subscribed are lost, so a new
//! connection to a host that had one before (a reconnect) is announced as
//! [`HostEvent::Reconnected`] once its subscription is in place: the receiver
//! looks at everything on that host again. A first connection needs no such
//! look: whatever is observed through it is observed after its subscription.
//! Likewise the first call to return from a host that had stopped answering
//! is announced as [`HostEvent::Answered`]: what failed on that host meanwhile
//! can be tried again at once instead of at its next retry.
//!
//! Nothing reconnects a host on its own, and a host whose machines are all
//! healthy gets no calls for a long time, so [`Connections::check_connections`]
//! (the manager runs it every few seconds) finds cached connections that died
//! (`is_alive`, which makes no round trip: keepalive or the closed socket
//! decides it) or have no subscription, and reconnects them, and reconnects
//! hosts that lost their connection, backing off while they refuse.
//!

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};

use super::events::{EventFanOut, HostEvent, HostEventSink, Subscription};
use super::observed::{Observed, Rpc, RpcObserver};
use super::{Connector, ErrorKind, Hypervisor, HypervisorError, Result};

/// The longest wait between two reconnects of a host that refuses them in
/// [`Connections::check_connections`].
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// The first wait after a failed reconnect; it doubles with each failure.
const RECONNECT_BACKOFF_MIN: Duration = Duration::from_secs(5);

/// The error type of a closure run by [`HostHandle::call`]: a bare
/// [`HypervisorError`], or an error of the host layer that wraps one
/// (`crate::HostError`). The handle asks it whether the connection is gone,
/// and builds one when no call could be made at all.
pub trait CallError: Sized + Send + 'static {
    /// The call could not run on `uri`: no connection could be opened, or the
    /// call did not complete.
    fn unavailable(uri: &str, source: HypervisorError) -> Self;

    /// Nothing came back from `uri` within `timeout`: a connect, a wait for a
    /// call slot, or a call. `note` (empty, or starting with a space) says
    /// more. The message says "no answer from <uri> within <N> s".
    fn no_answer(uri: &str, timeout: Duration, note: &str) -> Self;

    /// Nothing was sent to `uri`: all `max` threads the cache may hold for
    /// `what` ("connects" or "calls") over all hosts are taken by hosts that
    /// do not answer.
    fn threads_used_up(uri: &str, what: &'static str, max: usize) -> Self;

    /// This failure means the connection is gone; the handle drops it.
    fn connection_lost(&self) -> bool;
}

impl CallError for HypervisorError {
    fn unavailable(_uri: &str, source: HypervisorError) -> Self {
        source
    }

    fn no_answer(uri: &str, timeout: Duration, note: &str) -> Self {
        HypervisorError::new(
            ErrorKind::ConnectionLost,
            0,
            format!("no answer from {uri} within {}{note}", seconds(timeout)),
        )
    }

    fn threads_used_up(uri: &str, what: &'static str, max: usize) -> Self {
        HypervisorError::new(ErrorKind::Other, 0, threads_used_up_message(uri, what, max))
    }

    fn connection_lost(&self) -> bool {
        self.kind == ErrorKind::ConnectionLost
    }
}

/// libvirtd's default `max_client_requests`: concurrent calls one client
/// connection may have in flight before the daemon queues them.
pub const DEFAULT_MAX_CALLS_PER_HOST: usize = 5;

/// How long one [`HostHandle::call`] may take before it is given up, by
/// default. A host operation is a handful of libvirt calls that take
/// milliseconds each, up to a few seconds for starting or destroying a domain.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long opening a connection may take before callers are told the host
/// does not answer, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Connects that may run at once over all hosts, by default: a connect to a
/// host that accepts and never answers holds its thread until the peer
/// closes the connection.
pub const DEFAULT_MAX_CONNECT_THREADS: usize = 32;

/// Calls that may run at once over all hosts, by default, counting calls
/// given up on that have not returned.
pub const DEFAULT_MAX_CALL_THREADS: usize = 192;

/// How long a quick libvirt call (a lookup, an XML read, a DHCP entry) may
/// go unanswered, at least, while every call slot of its host is taken,
/// before callers stop waiting for a slot: see [`HostHandle::call`]. Four
/// times the slowest quick call the host answered, when that is longer.
pub const DEFAULT_SLOT_PATIENCE: Duration = Duration::from_secs(1);

/// The same for a lengthy libvirt call (a guest started or stopped, a
/// volume made or copied, every domain listed), at least.
pub const LENGTHY_CALL_PATIENCE: Duration = Duration::from_secs(10);

/// The connection cache: one slot per host URI.
pub struct Connections {
    connector: Arc<dyn Connector>,
    max_calls_per_host: usize,
    call_timeout: Duration,
    connect_timeout: Duration,
    slot_patience: Duration,
    hosts: Mutex<HashMap<String, Arc<HostSlot>>>,
    /// The threads connects and calls may hold, over all hosts.
    connect_threads: Budget,
    call_threads: Budget,
    opened: AtomicU64,
    attempts: AtomicU64,
    /// Where domain events go.
    events: EventFanOut,
}

impl Connections {
    /// A cache with the default timeouts ([`DEFAULT_CALL_TIMEOUT`],
    /// [`DEFAULT_CONNECT_TIMEOUT`]); change them with [`Connections::with_timeouts`].
    pub fn new(connector: Arc<dyn Connector>, max_calls_per_host: usize) -> Self {
        assert!(max_calls_per_host > 0, "max_calls_per_host must be at least 1");
        Self {
            connector,
            max_calls_per_host,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            slot_patience: DEFAULT_SLOT_PATIENCE,
            hosts: Mutex::new(HashMap::new()),
            connect_threads: Budget::new("connects", DEFAULT_MAX_CONNECT_THREADS),
            call_threads: Budget::new("calls", DEFAULT_MAX_CALL_THREADS),
            opened: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            events: EventFanOut::default(),
        }
    }

    /// Sends the domain events of every connection opened from now on to
    /// `sink` (replacing an earlier sink, which gets nothing more). A
    /// connection opened before has no subscription and is replaced by the
    /// next [`Connections::check_connections`].
    pub fn set_event_sink(&self, sink: HostEventSink) {
        self.events.set_sink(sink);
    }

    fn has_sink(&self) -> bool {
        self.events.has_sink()
    }

    /// Event subscriptions made so far, over all hosts (for tests and metrics).
    pub fn subscriptions_made(&self) -> u64 {
        self.events.subscriptions_made()
    }

    /// One look at every host's connection, for the domain events: a cached
    /// connection that is no longer alive, or has no event subscription while
    /// a sink is set, is dropped and a new one opened (which subscribes and is
    /// announced as [`HostEvent::Reconnected`]); a host that had a connection
    /// and lost it is reconnected, at most every 5 s doubling up to
    /// [`RECONNECT_BACKOFF_MAX`] while connects fail. No call is made on the
    /// host but the connect: `is_alive` makes no round trip, and runs on the
    /// blocking pool within a call slot (a host whose slots are all taken is
    /// left to its calls) and the call timeout. Returns how many connects it
    /// started.
    pub async fn check_connections(self: &Arc<Self>) -> usize {
        if !self.has_sink() {
            return 0;
        }
        let slots: Vec<Arc<HostSlot>> =
            self.hosts.lock().expect("connection cache lock poisoned").values().cloned().collect();
        let mut started = 0;
        for slot in slots {
            let handle = HostHandle { cache: self.clone(), slot };
            if handle.check().await {
                started += 1;
            }
        }
        started
    }

    /// Sets how long one call and one connect may take (both must be above zero).
    pub fn with_timeouts(mut self, call: Duration, connect: Duration) -> Self {
        assert!(!call.is_zero() && !connect.is_zero(), "libvirt timeouts must be above zero");
        self.call_timeout = call;
        self.connect_timeout = connect;
        self
    }

    /// Sets the least time a quick libvirt call may go unanswered while every
    /// call slot of its host is taken before callers stop waiting for a slot
    /// ([`DEFAULT_SLOT_PATIENCE`]).
    pub fn with_slot_patience(mut self, patience: Duration) -> Self {
        self.slot_patience = patience;
        self
    }

    /// Sets how many connects and how many calls may hold a thread at once,
    /// over all hosts (both must be at least 1).
    pub fn with_thread_limits(mut self, connects: usize, calls: usize) -> Self {
        assert!(connects > 0 && calls > 0, "thread limits must be at least 1");
        self.connect_threads = Budget::new("connects", connects);
        self.call_threads = Budget::new("calls", calls);
        self
    }

    /// Threads held now by connects and by calls (stuck ones included), over all hosts.
    pub fn threads_in_use(&self) -> (usize, usize) {
        (self.connect_threads.in_use(), self.call_threads.in_use())
    }

    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The handle for one host. Cheap; opens nothing until the first call.
    pub fn host(self: &Arc<Self>, uri: &str) -> HostHandle {
        let slot = {
            let mut hosts = self.hosts.lock().expect("connection cache lock poisoned");
            hosts
                .entry(uri.to_string())
                .or_insert_with(|| {
                    Arc::new(HostSlot {
                        uri: uri.to_string(),
                        state: Mutex::new(SlotState::default()),
                        permits: Arc::new(Semaphore::new(self.max_calls_per_host)),
                        abandoned: AtomicUsize::new(0),
                        found_unanswered: Notify::new(),
                        next_call: AtomicU64::new(0),
                        moved: Notify::new(),
                    })
                })
                .clone()
        };
        HostHandle { cache: self.clone(), slot }
    }

    /// Forgets every host `keep` rejects that is idle (no call in flight, no
    /// connect running, no handle held elsewhere), closing its connection:
    /// the manager calls it with the URIs its objects still name, so a
    /// process that saw many hosts holds nothing for hosts it no longer
    /// uses. Returns how many hosts were forgotten.
    pub fn forget_hosts(&self, keep: impl Fn(&str) -> bool) -> usize {
        let mut hosts = self.hosts.lock().expect("connection cache lock poisoned");
        let before = hosts.len();
        hosts.retain(|uri, slot| {
            let idle = Arc::strong_count(slot) == 1
                && slot.permits.available_permits() == self.max_calls_per_host
                && slot.state().connecting.is_none();
            keep(uri) || !idle
        });
        before - hosts.len()
    }

    /// The URIs this cache holds a slot for.
    pub fn host_uris(&self) -> Vec<String> {
        self.hosts.lock().expect("connection cache lock poisoned").keys().cloned().collect()
    }

    /// Connections opened through this cache so far, over all hosts.
    pub fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::SeqCst)
    }

    /// Connects started through this cache so far (successful or not, returned or not).
    pub fn connect_attempts(&self) -> u64 {
        self.attempts.load(Ordering::SeqCst)
    }
}

/// One host's connection and the connect in flight, if any. Locked only for
/// a moment, never while libvirt is called.
#[derive(Default)]
struct SlotState {
    conn: Option<Arc<dyn Hypervisor>>,
    /// The domain-event subscription of `conn`, if it has one.
    subscription: Option<Subscription>,
    connecting: Option<Attempt>,
    /// Whether a connection was ever opened for this host.
    connected_before: bool,
    /// Connects that failed in a row, and when the last one ended.
    failed_connects: u32,
    last_failure: Option<Instant>,
    /// Set when a call was given up on, cleared when a call returns: while
    /// set, only the probe's call goes to the host.
    unanswered: bool,
    /// Whether the probe of an unanswered host is in flight.
    probing: bool,
    /// Set when a caller was turned away because the host stalled, cleared
    /// when a call returns.
    turned_away: bool,
    /// The calls holding a call slot, by id, each with the libvirt call it
    /// waits for, if any: when that was sent and whether it is lengthy.
    calls: HashMap<u64, Option<(Instant, bool)>>,
    /// The slowest quick and the slowest lengthy libvirt call the host
    /// answered; `None` until it answered one.
    slowest: Option<[Duration; 2]>,
}

impl SlotState {
    /// When the host counts as stalled unless a libvirt call returns first:
    /// every call slot (`max`) is held by a call waiting for a libvirt call
    /// that has had no answer for its patience (`least`, or
    /// [`LENGTHY_CALL_PATIENCE`] for a lengthy one, or four times the slowest
    /// of its kind the host answered, when that is longer). `None` while a
    /// call holding a slot is not waiting for libvirt, or the host has
    /// answered no libvirt call yet (its calls may take any time). A call is
    /// in `calls` only while it holds a slot, so a full `calls` means that
    /// no slot is free.
    fn stalls_at(&self, max: usize, least: Duration) -> Option<Instant> {
        let slowest = self.slowest?;
        if self.calls.len() < max {
            return None;
        }
        let mut at = None;
        for waiting in self.calls.values() {
            let (sent, lengthy) = (*waiting)?;
            let floor = if lengthy { LENGTHY_CALL_PATIENCE.max(least) } else { least };
            at = at.max(Some(sent + (slowest[usize::from(lengthy)] * 4).max(floor)));
        }
        at
    }
}

/// A connect running on the blocking pool; every caller that needs the
/// host's connection meanwhile waits for this one instead of starting another.
#[derive(Clone)]
struct Attempt {
    id: u64,
    started: Instant,
    done: watch::Receiver<Option<Result<Arc<dyn Hypervisor>>>>,
}

struct HostSlot {
    uri: String,
    state: Mutex<SlotState>,
    permits: Arc<Semaphore>,
    /// Calls given up on (past the call timeout) whose thread has not returned.
    abandoned: AtomicUsize,
    /// Wakes the callers waiting for a call slot when the host is found
    /// unanswered, so that they fail at once too.
    found_unanswered: Notify,
    /// The id of the next call to take a slot.
    next_call: AtomicU64,
    /// Wakes the callers waiting for a call slot whenever a libvirt call on
    /// the host is sent or returns, so that they look whether it stalled.
    moved: Notify,
}

/// The libvirt calls of one call holding a slot of `slot`: each is recorded
/// in the host's state as it is sent and when it returns.
struct SlotWatch {
    slot: Arc<HostSlot>,
    id: u64,
}

impl RpcObserver for SlotWatch {
    type Guard = RpcReturned;

    fn begin(&self, rpc: Rpc) -> RpcReturned {
        let sent = Instant::now();
        if let Some(waiting) = self.slot.state().calls.get_mut(&self.id) {
            *waiting = Some((sent, rpc.lengthy));
        }
        self.slot.moved.notify_waiters();
        RpcReturned { slot: self.slot.clone(), id: self.id, sent, lengthy: rpc.lengthy }
    }
}

/// Records, when dropped, that a libvirt call returned.
struct RpcReturned {
    slot: Arc<HostSlot>,
    id: u64,
    sent: Instant,
    lengthy: bool,
}

impl Drop for RpcReturned {
    fn drop(&mut self) {
        {
            let mut state = self.slot.state();
            let now = Instant::now();
            if let Some(waiting) = state.calls.get_mut(&self.id) {
                *waiting = None;
            }
            let slowest = state.slowest.get_or_insert_default();
            let kind = &mut slowest[usize::from(self.lengthy)];
            *kind = (*kind).max(now - self.sent);
        }
        self.slot.moved.notify_waiters();
    }
}

/// A call's hold on its slot, in the host's state: taken when the call gets
/// its slot, given back when its blocking thread ends.
struct CallHeld {
    slot: Arc<HostSlot>,
    id: u64,
}

impl CallHeld {
    fn new(slot: &Arc<HostSlot>) -> Self {
        let id = slot.next_call.fetch_add(1, Ordering::SeqCst);
        slot.state().calls.insert(id, None);
        Self { slot: slot.clone(), id }
    }

    fn watch(&self) -> SlotWatch {
        SlotWatch { slot: self.slot.clone(), id: self.id }
    }
}

impl Drop for CallHeld {
    fn drop(&mut self) {
        self.slot.state().calls.remove(&self.id);
        self.slot.moved.notify_waiters();
    }
}

/// A number of threads that may be held at once, as a semaphore whose
/// permits go with the blocking threads.
struct Budget {
    /// What the threads do, as the messages say it: "connects" or "calls".
    what: &'static str,
    max: usize,
    permits: Arc<Semaphore>,
}

impl Budget {
    fn new(what: &'static str, max: usize) -> Self {
        Self { what, max, permits: Arc::new(Semaphore::new(max)) }
    }

    fn in_use(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// A thread of this budget if one is free now.
    fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    /// The error for `uri` when every thread of this budget is taken.
    fn used_up<E: CallError>(&self, uri: &str) -> E {
        tracing::warn!(%uri, what = self.what, max = self.max, "every thread the manager may hold for these is taken");
        E::threads_used_up(uri, self.what, self.max)
    }

    /// A thread of this budget, waiting at most `within` for one to free up.
    async fn take(&self, within: Duration) -> Option<OwnedSemaphorePermit> {
        match tokio::time::timeout(within, self.permits.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Some(permit),
            _ => None,
        }
    }
}

/// Where a call's blocking thread is: still running within its time, given
/// up on by its caller, or returned.
const RUNNING: u8 = 0;
const RETURNED: u8 = 1;
const ABANDONED: u8 = 2;

impl HostSlot {
    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call on this host was given up on: from now on one call at a time
    /// goes to it until one returns.
    fn mark_unanswered(&self) {
        {
            let mut state = self.state();
            if !state.unanswered {
                tracing::warn!(uri = %self.uri, "libvirt host stopped answering; one call at a time tries it until it answers");
                state.unanswered = true;
            }
        }
        self.found_unanswered.notify_waiters();
    }

    /// A call on this host returned with the host's answer: calls go to it
    /// as usual again. When the host had been unanswered, or callers had
    /// been turned away as it stalled, until now, that is announced through
    /// `emit` as [`HostEvent::Answered`]: the reconciles that failed
    /// meanwhile wait for a retry, and need not.
    fn answered(&self, emit: impl FnOnce(HostEvent)) {
        {
            let mut state = self.state();
            if !(state.unanswered || state.turned_away) {
                return;
            }
            tracing::info!(uri = %self.uri, "libvirt host answers again");
            state.unanswered = false;
            state.turned_away = false;
        }
        emit(HostEvent::Answered { uri: self.uri.clone() });
    }

    /// Forgets `used` if it is still the cached connection.
    fn evict(&self, used: &Arc<dyn Hypervisor>, why: &str) {
        let mut state = self.state();
        if state.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, used)) {
            tracing::warn!(uri = %self.uri, "libvirt connection {why}; the next call reconnects");
            state.conn = None;
            state.subscription = None;
        }
    }
}

/// Ends a probe when dropped, however its call ended, so that the next call
/// becomes the probe.
struct ProbeDone(Arc<HostSlot>);

impl Drop for ProbeDone {
    fn drop(&mut self) {
        self.0.state().probing = false;
    }
}

/// One host of a [`Connections`] cache.
#[derive(Clone)]
pub struct HostHandle {
    cache: Arc<Connections>,
    slot: Arc<HostSlot>,
}

/// What the blocking side of a call gives back: the call's result, or the
/// closure unrun because the connection was found dead.
enum Ran<R, F> {
    Done(R),
    DeadConnection(F),
}

impl HostHandle {
    pub fn uri(&self) -> &str {
        &self.slot.uri
    }

    /// Runs `f` on the host's connection on tokio's blocking pool, within the
    /// host's call bound and the cache's timeouts:
    /// `host.call(move |h| h.domain_state(&name)).await`.
    ///
    /// `f` returns a [`HypervisorError`] or an error of the host layer (any
    /// [`CallError`]). A failure that means the connection is gone drops the
    /// connection, so that the next call reconnects; the error is returned as
    /// is. A connection that cannot be opened is returned as
    /// [`CallError::unavailable`]; a connect, a wait for a call slot or a call
    /// that takes longer than its timeout as [`CallError::no_answer`] (a
    /// timed-out call's connection is dropped too). This function never
    /// blocks a runtime worker. It returns within the connect timeout plus
    /// twice the call timeout (a slot, then the call), or twice that when the
    /// cached connection turned out dead and was replaced (once).
    pub async fn call<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&dyn Hypervisor) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: CallError,
    {
        let uri = self.slot.uri.as_str();
        let call_timeout = self.cache.call_timeout;
        // Held until the call ends: the one call that tries an unanswered host.
        let probe_done = self.admit()?;
        let probe = probe_done.is_some();
        let mut f = f;
        // A connection found dead is replaced once; a fresh one that is dead
        // at once is reported.
        for _ in 0..2 {
            let conn = self.connection::<E>().await?;
            let max = self.cache.max_calls_per_host;
            if self.slot.abandoned.load(Ordering::SeqCst) >= max {
                return Err(E::no_answer(uri, call_timeout, &all_slots_stuck(max)));
            }
            // Registered before the host's state is read, so that a host found
            // unanswered while this call waits for a slot wakes it.
            let found_unanswered = self.slot.found_unanswered.notified();
            tokio::pin!(found_unanswered);
            found_unanswered.as_mut().enable();
            if !probe && self.slot.state().unanswered {
                return Err(E::no_answer(uri, call_timeout, UNANSWERED));
            }
            let permit = self.take_slot::<E>(found_unanswered.as_mut(), probe).await?;
            let Some(thread) = self.cache.call_threads.take(call_timeout).await else {
                return Err(self.cache.call_threads.used_up(uri));
            };
            let used = conn.clone();
            let held = CallHeld::new(&self.slot);
            let state = Arc::new(AtomicU8::new(RUNNING));
            let (ended, slot, emit) = (state.clone(), self.slot.clone(), self.cache.events.emitter());
            // The permits go with the blocking thread: a call that never
            // returns keeps its slot and its thread of the budget, so stuck
            // threads per host stay bounded by the call bound and over all
            // hosts by the budget.
            let task = tokio::task::spawn_blocking(move || {
                let watch = held.watch();
                let _permits = (held, permit, thread);
                let ran = if used.is_alive() {
                    Ran::Done(f(&Observed::new(used.as_ref(), watch)))
                } else {
                    Ran::DeadConnection(f)
                };
                if ended.swap(RETURNED, Ordering::SeqCst) == ABANDONED {
                    slot.abandoned.fetch_sub(1, Ordering::SeqCst);
                    // A call given up on came back with the host's answer: its
                    // callers need not wait for another call to find out.
                    if matches!(&ran, Ran::Done(out) if !out.as_ref().is_err_and(CallError::connection_lost)) {
                        slot.answered(emit);
                    }
                }
                ran
            });
            let outcome = tokio::time::timeout(call_timeout, task).await;
            if outcome.is_err() {
                // Counted before it is marked, so the thread never subtracts first.
                self.slot.abandoned.fetch_add(1, Ordering::SeqCst);
                if state.compare_exchange(RUNNING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst).is_err() {
                    self.slot.abandoned.fetch_sub(1, Ordering::SeqCst);
                }
            }
            match outcome {
                Ok(Ok(Ran::Done(out))) => {
                    match &out {
                        Err(e) if e.connection_lost() => self.slot.evict(&conn, "lost"),
                        _ => self.slot.answered(|event| self.cache.events.emit(event)),
                    }
                    return out;
                }
                Ok(Ok(Ran::DeadConnection(unrun))) => {
                    self.slot.evict(&conn, "is dead");
                    f = unrun;
                }
                Ok(Err(e)) => {
                    return Err(E::unavailable(
                        uri,
                        HypervisorError::new(
                            ErrorKind::Other,
                            0,
                            format!("libvirt call on host {uri} did not complete: {e}"),
                        ),
                    ));
                }
                Err(_) => {
                    self.slot.evict(&conn, &format!("gave no answer within {}", seconds(call_timeout)));
                    self.slot.mark_unanswered();
                    return Err(E::no_answer(uri, call_timeout, ""));
                }
            }
        }
        Err(E::unavailable(
            uri,
            HypervisorError::new(
                ErrorKind::ConnectionLost,
                0,
                format!("the connection to {uri} closed right after it was opened"),
            ),
        ))
    }

    /// A call slot of the host. While every slot is taken the caller waits
    /// for one as long as the host moves, and at most the call timeout: when
    /// every slot is held by a call waiting for a libvirt call that has gone
    /// unanswered past its patience (see [`SlotState::stalls_at`]) and
    /// nothing returned meanwhile, the caller fails at once, saying so,
    /// instead of holding its reconcile worker until the call timeout. A busy
    /// host whose calls are each made of many libvirt calls keeps its callers
    /// waiting their turn, as each libvirt call that returns moves it.
    async fn take_slot<E: CallError>(
        &self,
        mut found_unanswered: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        probe: bool,
    ) -> Result<OwnedSemaphorePermit, E> {
        let uri = self.slot.uri.as_str();
        let (max, call_timeout, least) =
            (self.cache.max_calls_per_host, self.cache.call_timeout, self.cache.slot_patience);
        let deadline = Instant::now() + call_timeout;
        let acquire = self.slot.permits.clone().acquire_owned();
        tokio::pin!(acquire);
        loop {
            // Registered before the state is read, so that no move is missed.
            let moved = self.slot.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            let now = Instant::now();
            if now >= deadline {
                tracing::warn!(%uri, calls = max, "no call slot freed up: every call in flight is waiting for an answer");
                return Err(E::no_answer(uri, call_timeout, &all_slots_stuck(max)));
            }
            let stalls_at = {
                let mut state = self.slot.state();
                let stalls_at = state.stalls_at(max, least);
                if stalls_at.is_some_and(|at| at <= now) {
                    state.turned_away = true;
                    drop(state);
                    tracing::debug!(%uri, calls = max, "every call slot is held by a call without an answer; not waiting");
                    return Err(E::no_answer(uri, least, &all_slots_stalled(max)));
                }
                stalls_at
            };
            let wake_at = stalls_at.map_or(deadline, |at| at.min(deadline));
            tokio::select! {
                biased;
                acquired = &mut acquire => {
                    let Ok(permit) = acquired else {
                        return Err(E::unavailable(
                            uri,
                            HypervisorError::new(ErrorKind::Other, 0, format!("call bound of host {uri} was closed")),
                        ));
                    };
                    return Ok(permit);
                }
                () = &mut found_unanswered, if !probe => return Err(E::no_answer(uri, call_timeout, UNANSWERED)),
                () = &mut moved => {}
                () = tokio::time::sleep_until(wake_at.into()) => {}
            }
        }
    }

    /// Whether a call may go to the host now: always while it answers
    /// (`None`); while it does not, only as the one probe in flight (whose
    /// end the returned guard marks), and every other caller is told at once.
    fn admit<E: CallError>(&self) -> Result<Option<ProbeDone>, E> {
        let mut state = self.slot.state();
        if !state.unanswered {
            return Ok(None);
        }
        if state.probing {
            return Err(E::no_answer(&self.slot.uri, self.cache.call_timeout, UNANSWERED));
        }
        state.probing = true;
        Ok(Some(ProbeDone(self.slot.clone())))
    }

    /// The host's connection for a stream that lasts as long as its source
    /// does (a volume upload fed by a download): run it on a blocking thread
    /// of the caller's own, outside the host's call bound and call timeout,
    /// which are for calls that answer at once. The caller bounds it (e.g. by
    /// an idle timeout on what it sends). Opens the connection like
    /// [`HostHandle::call`] does, within the connect timeout.
    pub async fn stream_connection(&self) -> Result<Arc<dyn Hypervisor>, HypervisorError> {
        self.connection::<HypervisorError>().await
    }

    /// The host's cached connection, or the one being opened: at most one
    /// connect per host runs at a time, outside any lock, and every caller
    /// waits for it at most until the connect timeout since it started. A
    /// connect that has run longer than that makes callers fail at once.
    async fn connection<E: CallError>(&self) -> Result<Arc<dyn Hypervisor>, E> {
        let timeout = self.cache.connect_timeout;
        let mut thread = None;
        let attempt = loop {
            {
                let mut state = self.slot.state();
                if let Some(conn) = &state.conn {
                    // Whether it is still alive is asked on the blocking thread.
                    return Ok(conn.clone());
                }
                if let Some(attempt) = &state.connecting {
                    break attempt.clone();
                }
                let taken = thread.take().or_else(|| self.cache.connect_threads.try_take());
                if let Some(permit) = taken {
                    let attempt = self.start_connect(permit);
                    state.connecting = Some(attempt.clone());
                    break attempt;
                }
            }
            // Every connect thread is taken (hosts that do not answer hold
            // them): wait for one, within the connect timeout, then look again.
            match self.cache.connect_threads.take(timeout).await {
                Some(permit) => thread = Some(permit),
                None => {
                    return Err(self.cache.connect_threads.used_up(&self.slot.uri));
                }
            }
        };
        let left = (attempt.started + timeout).saturating_duration_since(Instant::now());
        let mut done = attempt.done;
        match tokio::time::timeout(left, done.wait_for(Option::is_some)).await {
            Ok(Ok(result)) => match result.as_ref().expect("waited for Some") {
                Ok(conn) => Ok(conn.clone()),
                Err(e) => Err(E::unavailable(&self.slot.uri, e.clone())),
            },
            Ok(Err(_)) => Err(E::unavailable(
                &self.slot.uri,
                HypervisorError::new(ErrorKind::Other, 0, format!("connecting to {} did not complete", self.slot.uri)),
            )),
            Err(_) => {
                let waiting = attempt.started.elapsed();
                tracing::warn!(uri = %self.slot.uri, waiting = ?waiting, "libvirt connect has not returned");
                Err(E::no_answer(&self.slot.uri, timeout, ""))
            }
        }
    }

    /// Starts a connect on the blocking pool. When it returns (however late)
    /// it stores its connection and ends the attempt, so the next caller
    /// uses the connection or starts a new connect.
    fn start_connect(&self, thread: OwnedSemaphorePermit) -> Attempt {
        let id = self.cache.attempts.fetch_add(1, Ordering::SeqCst);
        let (tx, done) = watch::channel(None);
        let (cache, slot) = (self.cache.clone(), self.slot.clone());
        // Detached: the task runs to its end whether or not anyone waits, and
        // holds its thread of the budget until then.
        drop(tokio::task::spawn_blocking(move || {
            let _thread = thread;
            // A connector that panics must still end the attempt, or the host
            // would wait for it for ever.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cache.connector.connect(&slot.uri)))
                .unwrap_or_else(|_| {
                    Err(HypervisorError::new(ErrorKind::Other, 0, format!("connecting to {} panicked", slot.uri)))
                });
            // Subscribed before anyone can use the connection, so that whatever
            // is observed through it is observed after its subscription.
            let subscription = result.as_ref().ok().and_then(|conn| cache.events.subscribe(&slot.uri, conn.as_ref()));
            let reconnected = {
                let mut state = slot.state();
                if state.connecting.as_ref().is_some_and(|a| a.id == id) {
                    state.connecting = None;
                }
                match &result {
                    Ok(conn) => {
                        cache.opened.fetch_add(1, Ordering::SeqCst);
                        let subscribed = subscription.is_some();
                        if cache.has_sink() && !subscribed {
                            // Counts as a failure for the backoff of the check that replaces it.
                            state.failed_connects = state.failed_connects.saturating_add(1);
                            state.last_failure = Some(Instant::now());
                        } else {
                            state.failed_connects = 0;
                            state.last_failure = None;
                        }
                        // A connection that is not cached (a late connect that lost
                        // the race with another) must not keep its subscription.
                        let stale = state.subscription.replace(Subscription(subscription));
                        let old = state.conn.replace(conn.clone());
                        let reconnected = std::mem::replace(&mut state.connected_before, true) && subscribed;
                        drop(state);
                        drop((stale, old));
                        reconnected
                    }
                    Err(e) => {
                        tracing::warn!(uri = %slot.uri, error = %e, "cannot connect to libvirt");
                        state.failed_connects = state.failed_connects.saturating_add(1);
                        state.last_failure = Some(Instant::now());
                        false
                    }
                }
            };
            if reconnected {
                tracing::info!(uri = %slot.uri, "reconnected to libvirt and subscribed to domain events again");
                cache.events.emit(HostEvent::Reconnected { uri: slot.uri.clone() });
            }
            tx.send_replace(Some(result));
        }));
        Attempt { id, started: Instant::now(), done }
    }

    /// [`Connections::check_connections`] for this host; true when it started a connect.
    async fn check(&self) -> bool {
        let (conn, subscribed, backoff, wants_connection) = {
            let state = self.slot.state();
            let backoff = state.last_failure.is_some_and(|at| {
                let wait = RECONNECT_BACKOFF_MIN
                    .saturating_mul(1 << state.failed_connects.saturating_sub(1).min(8))
                    .min(RECONNECT_BACKOFF_MAX);
                at.elapsed() < wait
            });
            (
                state.conn.clone(),
                state.subscription.as_ref().is_some_and(|s| s.0.is_some()),
                backoff,
                state.connected_before && state.connecting.is_none() && !backoff,
            )
        };
        match conn {
            Some(conn) => {
                // Within a call slot, so that stuck checks stay bounded like stuck calls.
                let Ok(permit) = self.slot.permits.clone().try_acquire_owned() else { return false };
                let probe = conn.clone();
                let alive = tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    probe.is_alive()
                });
                let why = match tokio::time::timeout(self.cache.call_timeout, alive).await {
                    // A host that refused the last subscription is asked again after the backoff.
                    Ok(Ok(true)) if subscribed || backoff => return false,
                    Ok(Ok(true)) => "has no domain event subscription",
                    Ok(_) => "is dead",
                    Err(_) => "gave no answer whether it is alive",
                };
                self.slot.evict(&conn, why);
                self.reconnect()
            }
            None if wants_connection => self.reconnect(),
            None => false,
        }
    }

    /// Starts a connect unless one runs; true when it started one.
    fn reconnect(&self) -> bool {
        let mut state = self.slot.state();
        if state.conn.is_some() || state.connecting.is_some() {
            return false;
        }
        // No thread free: the next check tries again.
        let Some(thread) = self.cache.connect_threads.try_take() else { return false };
        state.connecting = Some(self.start_connect(thread));
        true
    }

    /// Calls currently admitted on this host, including calls that timed out
    /// and have not returned yet (for tests and metrics).
    pub fn calls_in_flight(&self) -> usize {
        self.cache.max_calls_per_host - self.slot.permits.available_permits()
    }

    /// Whether a connect to this host is running (started and not returned).
    pub fn connecting(&self) -> bool {
        self.slot.state().connecting.is_some()
    }
}

/// The note of a "no answer" for a call not sent because the host stopped
/// answering (a call on it was given up on and none has returned since).
const UNANSWERED: &str =
    " (a call to this host went unanswered and none has returned since; one call at a time tries it until it answers)";

/// The note of a "no answer" when every call slot of a host is taken.
fn all_slots_stuck(max: usize) -> String {
    format!(" (all {max} calls the provider makes at once to this host are still waiting for an answer)")
}

/// The note of a "no answer" when every call slot of a host is held by a
/// call waiting for a libvirt call past its patience, and none returned since.
fn all_slots_stalled(max: usize) -> String {
    format!(
        " (all {max} calls the provider makes at once to this host are waiting for an answer and none has come \
         since; this one was not sent and is retried)"
    )
}

/// Why nothing was sent to `uri`: every thread of the budget for `what` is
/// held, by hosts that do not answer.
pub fn threads_used_up_message(uri: &str, what: &str, max: usize) -> String {
    format!(
        "nothing was sent to {uri}: all {max} {what} the manager runs at once over all hosts are waiting for \
         hosts that do not answer; it tries again when one of them returns or gives up (fix or remove the \
         LibvirtClusters whose hosts show \"no answer\")"
    )
}

/// `d` in whole seconds when it is whole, as the messages say it: "30 s", "0.5 s".
pub fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use libvirt_sim::{Error, ErrorCode, Host, Op};

    use super::*;
    use crate::hypervisor::sim::SimConnector;

    /// A call that fails because the connection is gone returns its error
    /// (it is not retried) and the next call reconnects; a connection that is
    /// no longer alive is replaced before the next call and then reused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_connection_is_replaced_on_the_next_call() {
        let uri = "sim:///capl-connections-lost";
        let host = Host::builder(uri).build().unwrap();
        let cache = Arc::new(Connections::new(Arc::new(SimConnector), 4));
        let handle = cache.host(uri);
        let opened = || host.counters().connections_opened();
        handle.call(|h| h.capabilities_xml()).await.unwrap();
        assert_eq!(opened(), 1);

        host.fail_nth(Op::GetCapabilities, 1, Error::new(ErrorCode::NoConnect, "client socket is closed"));
        let calls = host.counters().calls(Op::GetCapabilities);
        let e = handle.call(|h| h.capabilities_xml()).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::ConnectionLost, "{e}");
        assert_eq!(host.counters().calls(Op::GetCapabilities), calls + 1, "the error is returned, not retried");
        handle.call(|h| h.capabilities_xml()).await.unwrap();
        assert_eq!(opened(), 2, "reconnected after ConnectionLost");

        host.drop_connections();
        handle.call(|h| h.capabilities_xml()).await.unwrap();
        assert_eq!(opened(), 3, "a connection that is not alive is replaced");
        handle.call(|h| h.capabilities_xml()).await.unwrap();
        assert_eq!(opened(), 3);
        assert_eq!(cache.connections_opened(), 3);
        host.unregister();
    }

    const TIMEOUT: Duration = Duration::from_millis(400);
    /// Generous: the machine running the tests is shared and slow.
    const BOUND: Duration = Duration::from_secs(5);

    fn sim_cache(max_calls: usize) -> Arc<Connections> {
        Arc::new(Connections::new(Arc::new(SimConnector), max_calls).with_timeouts(TIMEOUT, TIMEOUT))
    }

    /// What a host operation returns when the host does not answer, as the
    /// controllers see it.
    async fn capabilities(handle: &HostHandle) -> Result<String, crate::HostError> {
        let uri = handle.uri().to_string();
        handle.call(move |h| h.capabilities_xml().map_err(|source| crate::HostError::Unreachable { uri, source })).await
    }

    /// A call the host never answers comes back, within the call timeout, as
    /// HostUnreachable "no answer from <uri> within N s"; its connection is
    /// dropped (the next call reconnects); another host, and other calls on
    /// a fresh connection, go on meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hung_call_is_no_answer_and_other_hosts_go_on() {
        let (hung_uri, ok_uri) = ("sim:///capl-hung-call", "sim:///capl-hung-call-other");
        let hung = Host::builder(hung_uri).build().unwrap();
        let ok = Host::builder(ok_uri).build().unwrap();
        let cache = sim_cache(4);
        let (hung_handle, ok_handle) = (cache.host(hung_uri), cache.host(ok_uri));
        capabilities(&hung_handle).await.unwrap();
        assert_eq!(hung.counters().connections_opened(), 1);

        hung.faults().hang(Op::GetCapabilities, None);
        let started = Instant::now();
        let e = capabilities(&hung_handle).await.unwrap_err();
        let took = started.elapsed();
        assert!(took >= TIMEOUT && took < BOUND, "the hung call returned after {took:?}");
        assert_eq!(e.kind(), crate::FailureKind::HostUnreachable, "{e}");
        assert!(e.to_string().starts_with("no answer from sim:///capl-hung-call within 0.4 s: "), "{e}");
        assert_eq!(hung_handle.calls_in_flight(), 1, "the stuck call keeps its slot");

        // The other host is untouched; the hung host answers other calls on a new connection.
        for _ in 0..3 {
            capabilities(&ok_handle).await.unwrap();
        }
        assert!(hung_handle.call(|h| h.pool_is_active("missing")).await.is_err_and(|e| e.is_not_found()));
        assert_eq!(hung.counters().connections_opened(), 2, "the timed-out call's connection was dropped");

        hung.faults().release(Op::GetCapabilities);
        capabilities(&hung_handle).await.unwrap();
        let deadline = Instant::now() + BOUND;
        while hung_handle.calls_in_flight() > 0 {
            assert!(Instant::now() < deadline, "the released call never gave its slot back");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        hung.unregister();
        ok.unregister();
    }

    /// A connect that never returns: the first caller and a second one get
    /// "no answer" within the connect timeout, later callers at once, and
    /// only one connect runs; other hosts are not held up. Once the host
    /// answers, the connect in flight is the one used.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hung_connect_holds_up_no_one_beyond_its_timeout() {
        let (hung_uri, ok_uri) = ("sim:///capl-hung-connect", "sim:///capl-hung-connect-other");
        let hung = Host::builder(hung_uri).build().unwrap();
        let ok = Host::builder(ok_uri).build().unwrap();
        let cache = sim_cache(4);
        let (hung_handle, ok_handle) = (cache.host(hung_uri), cache.host(ok_uri));

        hung.faults().hang(Op::Connect, None);
        let started = Instant::now();
        let second = {
            let handle = hung_handle.clone();
            tokio::spawn(async move { capabilities(&handle).await })
        };
        let first = capabilities(&hung_handle).await.unwrap_err();
        let second = second.await.unwrap().unwrap_err();
        let took = started.elapsed();
        assert!(took >= TIMEOUT && took < BOUND, "the callers waited {took:?}");
        for e in [&first, &second] {
            assert_eq!(e.kind(), crate::FailureKind::HostUnreachable, "{e}");
            assert!(e.to_string().starts_with("no answer from sim:///capl-hung-connect within 0.4 s: "), "{e}");
        }

        let started = Instant::now();
        let later = capabilities(&hung_handle).await.unwrap_err();
        assert!(started.elapsed() < TIMEOUT, "a caller after the timeout waited {:?}", started.elapsed());
        assert!(later.to_string().starts_with("no answer from sim:///capl-hung-connect within 0.4 s: "), "{later}");
        capabilities(&ok_handle).await.unwrap();
        assert!(hung_handle.connecting());
        assert_eq!(hung.counters().calls(Op::Connect), 1, "one connect runs, however many callers");

        hung.faults().release(Op::Connect);
        let deadline = Instant::now() + BOUND;
        while hung_handle.connecting() {
            assert!(Instant::now() < deadline, "the released connect never returned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        capabilities(&hung_handle).await.unwrap();
        assert_eq!(hung.counters().calls(Op::Connect), 1, "the late connection is used");
        hung.unregister();
        ok.unregister();
    }

    /// Calls that never return keep their slots (so stuck threads stay
    /// bounded); a caller that finds every slot taken by calls in flight is
    /// told so within the call timeout instead of waiting for ever, and once
    /// every slot is held by a call already given up on, callers are told at
    /// once (no reconcile waits for a host that cannot answer).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_whose_call_slots_are_all_stuck_says_so() {
        let uri = "sim:///capl-hung-slots";
        let host = Host::builder(uri).build().unwrap();
        let cache = sim_cache(2);
        let handle = cache.host(uri);
        host.faults().hang(Op::GetCapabilities, None);
        let stuck = spawn_calls(&handle, 2, |h| h.capabilities_xml());
        while handle.calls_in_flight() < 2 {
            tokio::task::yield_now().await;
        }
        let slots_full = " (all 2 calls the provider makes at once to this host are still waiting for an answer)";
        let started = Instant::now();
        let e = handle.call(|h| h.pool_is_active("missing")).await.unwrap_err();
        let took = started.elapsed();
        assert!(took < BOUND, "waited {took:?} for a slot");
        // Told when its own wait for a slot ends, or, when the stuck calls are
        // given up on first, at that moment that the host stopped answering.
        assert!(
            [slots_full, UNANSWERED]
                .map(|note| format!("no answer from sim:///capl-hung-slots within 0.4 s{note}"))
                .contains(&e.message),
            "{e}"
        );
        for call in stuck {
            call.await.unwrap().unwrap_err();
        }

        // Both calls are now given up on and still hold their slots: the next
        // caller is told at once.
        assert_eq!(handle.calls_in_flight(), 2);
        let started = Instant::now();
        let e = handle.call(|h| h.pool_is_active("missing")).await.unwrap_err();
        assert!(started.elapsed() < TIMEOUT, "waited {:?} although every slot is stuck", started.elapsed());
        assert_eq!(e.message, format!("no answer from sim:///capl-hung-slots within 0.4 s{slots_full}"));
        assert_eq!(host.counters().calls(Op::GetCapabilities), 2, "no third call was started");

        host.faults().release(Op::GetCapabilities);
        let deadline = Instant::now() + BOUND;
        while handle.calls_in_flight() > 0 {
            assert!(Instant::now() < deadline, "the released calls never returned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        capabilities(&handle).await.unwrap();
        host.unregister();
    }

    /// `n` callers of `call` at once on `handle`.
    fn spawn_calls<T: Send + 'static>(
        handle: &HostHandle,
        n: usize,
        call: impl Fn(&dyn Hypervisor) -> Result<T> + Clone + Send + 'static,
    ) -> Vec<tokio::task::JoinHandle<Result<T>>> {
        (0..n)
            .map(|_| {
                let (handle, call) = (handle.clone(), call.clone());
                tokio::spawn(async move { handle.call(move |h| call(h)).await })
            })
            .collect()
    }

    /// A caller that finds every slot of a host taken by calls waiting for a
    /// libvirt call without an answer waits only the patience, not the call
    /// timeout, and the next caller is told at once. A busy host is not
    /// taken for a stalled one: callers wait their turn behind calls made of
    /// many quick libvirt calls that together take longer than the patience,
    /// behind a lengthy libvirt call that does, and, on a host that has
    /// answered nothing yet, behind quick calls that each take longer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_waits_for_a_slot_only_while_the_host_answers() {
        const CALL: Duration = Duration::from_secs(10);
        const PATIENCE: Duration = Duration::from_millis(300);
        let uri = "sim:///capl-stalled";
        let cache = || {
            Arc::new(Connections::new(Arc::new(SimConnector), 2).with_timeouts(CALL, CALL).with_slot_patience(PATIENCE))
        };
        let stalled = format!("no answer from {uri} within 0.3 s{}", all_slots_stalled(2));
        let host = Host::builder(uri).build().unwrap();
        let (cache1, received) = (cache(), Received::default());
        cache1.set_event_sink(received.sink());
        let handle = cache1.host(uri);
        // A call answered before the hang does not make the host look slow.
        capabilities(&handle).await.unwrap();
        host.faults().hang(Op::GetCapabilities, None);
        let release = ReleaseOnDrop(&host, Op::GetCapabilities);
        let stuck = spawn_calls(&handle, 2, |h| h.capabilities_xml());
        while handle.calls_in_flight() < 2 {
            tokio::task::yield_now().await;
        }
        let started = Instant::now();
        let e = handle.call(|h| h.pool_is_active("missing")).await.unwrap_err();
        let waited = started.elapsed();
        assert!(waited < CALL / 4, "waited {waited:?} for a slot of a host that answers nothing");
        assert_eq!(e.message, stalled);
        let started = Instant::now();
        let e = handle.call(|h| h.pool_is_active("missing")).await.unwrap_err();
        assert!(started.elapsed() < PATIENCE, "waited {:?} although the host had stalled", started.elapsed());
        assert_eq!(e.message, stalled);
        assert_eq!(host.counters().calls(Op::PoolLookup), 0, "a call was sent past the stalled slots");
        // The callers turned away are told when the host answers, once.
        drop(release);
        for call in stuck {
            call.await.unwrap().unwrap();
        }
        let answered = || received.0.lock().unwrap().iter().filter(|e| matches!(e, HostEvent::Answered { .. })).count();
        assert_eq!(answered(), 1, "the host answering again after it stalled was not announced once");
        capabilities(&handle).await.unwrap();
        assert_eq!(answered(), 1, "announced again for a host that kept answering");
        host.unregister();

        // Each call is eight quick libvirt calls of half the patience: six
        // callers on two slots are all answered.
        let host = Host::builder(uri).build().unwrap();
        let handle = cache().host(uri);
        capabilities(&handle).await.unwrap();
        host.faults().set_latency(Op::PoolLookup, PATIENCE / 2);
        let busy = spawn_calls(&handle, 6, |h| {
            (0..8).try_for_each(|_| match h.pool_is_active("missing") {
                Err(e) if e.is_not_found() => Ok(()),
                other => other.map(drop),
            })
        });
        for caller in busy {
            caller.await.unwrap().expect("a caller of a busy host that answers gave up");
        }
        host.unregister();

        // A lengthy libvirt call (a guest started) of three times the
        // patience, on a host that answered quick calls before.
        let host = Host::builder(uri).build().unwrap();
        let handle = cache().host(uri);
        capabilities(&handle).await.unwrap();
        host.faults().set_latency(Op::DomainCreate, PATIENCE * 3);
        let starts = spawn_calls(&handle, 4, |h| match h.domain_start("missing") {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        });
        for caller in starts {
            caller.await.unwrap().expect("a caller behind a lengthy call gave up");
        }
        host.unregister();

        // Quick calls that each take longer than the patience on a host that
        // has answered nothing yet, one slot, six callers: each is answered.
        let host = Host::builder(uri).build().unwrap();
        let handle = Arc::new(
            Connections::new(Arc::new(SimConnector), 1).with_timeouts(CALL, CALL).with_slot_patience(PATIENCE),
        )
        .host(uri);
        host.faults().set_latency(Op::GetCapabilities, PATIENCE * 3 / 2);
        for caller in spawn_calls(&handle, 6, |h| h.capabilities_xml()) {
            caller.await.unwrap().expect("a caller of a slow host that answers gave up");
        }
        assert_eq!(host.counters().calls(Op::GetCapabilities), 6);
        host.unregister();
    }

    /// Once a call on a host is given up on, one call at a time goes to the
    /// host until one returns: callers waiting for a call slot are woken and
    /// told, of callers at once only one reaches the host and the others are
    /// told at once; the first call that returns opens the host to all again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_that_stopped_answering_is_tried_by_one_call_at_a_time() {
        /// Long enough that the callers started together are all admitted
        /// before the first of them can time out.
        const CALL: Duration = Duration::from_secs(2);
        let unanswered = format!("no answer from sim:///capl-unanswered within 2 s{UNANSWERED}");
        let no_answer = "no answer from sim:///capl-unanswered within 2 s".to_string();
        // What the caller was told, up to the fix the message goes on with.
        let spawn = |handle: &HostHandle| {
            let handle = handle.clone();
            tokio::spawn(async move {
                capabilities(&handle)
                    .await
                    .map_err(|e| e.to_string().split(": libvirtd there").next().unwrap().to_string())
            })
        };

        // One call slot: a caller waiting for it is woken when the call in it is given up on.
        let uri = "sim:///capl-unanswered";
        let host = Host::builder(uri).build().unwrap();
        let cache = Arc::new(Connections::new(Arc::new(SimConnector), 1).with_timeouts(CALL, CALL));
        let handle = cache.host(uri);
        host.faults().hang(Op::GetCapabilities, None);
        // A failed assertion must not leave threads hung, which the runtime waits for.
        let _release = ReleaseOnDrop(&host, Op::GetCapabilities);
        let first = spawn(&handle);
        while handle.calls_in_flight() < 1 {
            tokio::task::yield_now().await;
        }
        // Half a call timeout later, so that this caller's own wait for the
        // slot would end a second after the first call is given up on.
        tokio::time::sleep(CALL / 2).await;
        let waiting = spawn(&handle);
        assert_eq!(first.await.unwrap().unwrap_err(), no_answer);
        let e = waiting.await.unwrap().unwrap_err();
        assert_eq!(e, unanswered, "the waiting caller was not told when the host was found unanswered");
        drop(_release);
        host.unregister();

        // Four call slots: of three callers, one reaches the host.
        let host = Host::builder(uri).build().unwrap();
        let cache = Arc::new(Connections::new(Arc::new(SimConnector), 4).with_timeouts(CALL, CALL));
        let handle = cache.host(uri);
        host.faults().hang(Op::GetCapabilities, None);
        let _release = ReleaseOnDrop(&host, Op::GetCapabilities);
        assert_eq!(spawn(&handle).await.unwrap().unwrap_err(), no_answer);
        assert_eq!(host.counters().calls(Op::GetCapabilities), 1);
        let callers: Vec<_> = (0..3).map(|_| spawn(&handle)).collect();
        let mut told = Vec::new();
        for caller in callers {
            told.push(caller.await.unwrap().unwrap_err());
        }
        told.sort();
        assert_eq!(told, [no_answer.clone(), unanswered.clone(), unanswered.clone()]);
        assert_eq!(host.counters().calls(Op::GetCapabilities), 2, "only the probe reached the host");

        // The host answers: the next call returns and the host is open to all again.
        host.faults().release(Op::GetCapabilities);
        capabilities(&handle).await.unwrap();
        let callers: Vec<_> = (0..3).map(|_| spawn(&handle)).collect();
        for caller in callers {
            caller.await.unwrap().unwrap();
        }
        assert_eq!(host.counters().calls(Op::GetCapabilities), 6);
        host.unregister();
    }

    /// Releases a hung operation when dropped (also when a test panics).
    struct ReleaseOnDrop<'a>(&'a Host, Op);

    impl Drop for ReleaseOnDrop<'_> {
        fn drop(&mut self) {
            self.0.faults().release(self.1);
        }
    }

    /// Hosts that accept and never answer a connect hold at most the
    /// connect budget's threads, over all hosts; a further host is told that
    /// the manager waits on too many hosts, within the connect timeout; a
    /// host already connected keeps being served; once the hung connects
    /// return, their threads are free again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hung_connects_hold_no_more_threads_than_the_budget() {
        let healthy_uri = "sim:///capl-budget-healthy";
        let healthy = Host::builder(healthy_uri).build().unwrap();
        let hung: Vec<(String, Host)> = (0..3)
            .map(|i| {
                let uri = format!("sim:///capl-budget-hung-{i}");
                let host = Host::builder(&uri).build().unwrap();
                host.faults().hang(Op::Connect, None);
                (uri, host)
            })
            .collect();
        let cache = Arc::new(
            Connections::new(Arc::new(SimConnector), 4).with_timeouts(TIMEOUT, TIMEOUT).with_thread_limits(2, 8),
        );
        let healthy_handle = cache.host(healthy_uri);
        capabilities(&healthy_handle).await.unwrap();

        for (uri, _) in &hung[..2] {
            let e = capabilities(&cache.host(uri)).await.unwrap_err();
            assert!(e.to_string().starts_with(&format!("no answer from {uri} within 0.4 s")), "{e}");
        }
        assert_eq!(cache.threads_in_use().0, 2, "two connects hang");
        let third = &hung[2].0;
        let started = Instant::now();
        let e = capabilities(&cache.host(third)).await.unwrap_err();
        let took = started.elapsed();
        assert!(took >= TIMEOUT && took < BOUND, "waited {took:?} for a connect thread");
        assert_eq!(e.kind(), crate::FailureKind::HostUnreachable, "{e}");
        assert!(
            e.to_string().starts_with(&format!(
                "nothing was sent to {third}: all 2 connects the manager runs at once over all hosts are waiting"
            )),
            "{e}"
        );
        assert_eq!(hung[2].1.counters().calls(Op::Connect), 0, "no third connect was started");
        assert_eq!(cache.threads_in_use().0, 2);
        capabilities(&healthy_handle).await.expect("a connected host is served meanwhile");

        for (_, host) in &hung {
            host.faults().release(Op::Connect);
        }
        let deadline = Instant::now() + BOUND;
        while cache.threads_in_use().0 > 0 {
            assert!(Instant::now() < deadline, "the released connects never returned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        capabilities(&cache.host(third)).await.expect("connects again once threads are free");
        for (_, host) in hung {
            host.unregister();
        }
        healthy.unregister();
    }

    /// Calls stuck on a host count against the budget of call threads over
    /// all hosts: with the budget used up, another host's call is refused
    /// within the call timeout, saying why, and served again once they return.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stuck_calls_hold_no_more_threads_than_the_budget() {
        let (hung_uri, other_uri) = ("sim:///capl-call-budget-hung", "sim:///capl-call-budget-other");
        let hung = Host::builder(hung_uri).build().unwrap();
        let other = Host::builder(other_uri).build().unwrap();
        let cache = Arc::new(
            Connections::new(Arc::new(SimConnector), 4).with_timeouts(TIMEOUT, TIMEOUT).with_thread_limits(4, 2),
        );
        let (hung_handle, other_handle) = (cache.host(hung_uri), cache.host(other_uri));
        capabilities(&other_handle).await.unwrap();
        hung.faults().hang(Op::GetCapabilities, None);
        for _ in 0..2 {
            capabilities(&hung_handle).await.unwrap_err();
        }
        assert_eq!(cache.threads_in_use().1, 2);
        let e = capabilities(&other_handle).await.unwrap_err();
        assert_eq!(e.kind(), crate::FailureKind::HostUnreachable, "{e}");
        assert!(e.to_string().contains("all 2 calls the manager runs at once over all hosts are waiting"), "{e}");
        hung.faults().release(Op::GetCapabilities);
        let deadline = Instant::now() + BOUND;
        while cache.threads_in_use().1 > 0 {
            assert!(Instant::now() < deadline, "the released calls never returned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        capabilities(&other_handle).await.expect("served again");
        hung.unregister();
        other.unregister();
    }

    /// The events a cache's sink received, and a way to wait for them.
    #[derive(Clone, Default)]
    struct Received(Arc<Mutex<Vec<HostEvent>>>);

    impl Received {
        fn sink(&self) -> HostEventSink {
            let events = self.0.clone();
            Arc::new(move |e| events.lock().unwrap().push(e))
        }

        async fn wait_for(&self, what: &str, found: impl Fn(&[HostEvent]) -> bool) {
            let deadline = Instant::now() + BOUND;
            while !found(&self.0.lock().unwrap()) {
                assert!(Instant::now() < deadline, "no {what} among {:?}", self.0.lock().unwrap());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }

        fn reconnects(&self) -> usize {
            self.0.lock().unwrap().iter().filter(|e| matches!(e, HostEvent::Reconnected { .. })).count()
        }
    }

    /// A host that had stopped answering is announced to the sink once it
    /// answers: when the call given up on returns, before any other call;
    /// calls after it are not announced.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_that_answers_again_is_announced_once() {
        let uri = "sim:///capl-answers-again";
        let host = Host::builder(uri).build().unwrap();
        let cache = sim_cache(2);
        let received = Received::default();
        cache.set_event_sink(received.sink());
        let handle = cache.host(uri);
        capabilities(&handle).await.unwrap();
        let answered = || received.0.lock().unwrap().iter().filter(|e| matches!(e, HostEvent::Answered { .. })).count();
        host.faults().hang(Op::GetCapabilities, None);
        let release = ReleaseOnDrop(&host, Op::GetCapabilities);
        let e = capabilities(&handle).await.unwrap_err();
        assert!(matches!(&e, crate::HostError::NoAnswer { note, .. } if note.is_empty()), "{e}");
        assert_eq!(answered(), 0, "announced while the host does not answer");
        // The call given up on returns once the host answers: that is announced
        // without waiting for another call.
        drop(release);
        received
            .wait_for("the host answering again", |e| {
                e.iter().any(|e| matches!(e, HostEvent::Answered { uri: u } if u == uri))
            })
            .await;
        capabilities(&handle).await.expect("the host answers again");
        capabilities(&handle).await.unwrap();
        assert_eq!(answered(), 1, "announced again for a host that kept answering");
        host.unregister();
    }

    fn domain_event(events: &[HostEvent], domain: &str) -> bool {
        events.iter().any(|e| matches!(e, HostEvent::Domain { event, .. } if event.domain == domain))
    }

    const DOMAIN: &str = "<domain type='qemu'><name>ev</name><memory unit='MiB'>32</memory><devices/></domain>";

    /// A connection subscribes before its first call; a dead one is found by
    /// the check, replaced, subscribed again and announced as a reconnect,
    /// once; a live, subscribed one is left alone and costs the host nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_subscribe_and_a_reconnect_is_announced_once() {
        let uri = "sim:///capl-connections-events";
        let host = Host::builder(uri).build().unwrap();
        let cache = Arc::new(Connections::new(Arc::new(SimConnector), 4));
        let received = Received::default();
        cache.set_event_sink(received.sink());
        let handle = cache.host(uri);
        handle.call(|h| h.capabilities_xml()).await.unwrap();
        assert_eq!(host.counters().calls(Op::DomainEventRegister), 1);
        assert_eq!(cache.subscriptions_made(), 1);

        let other = crate::hypervisor::sim::SimHypervisor::connect(uri).unwrap();
        other.domain_define(DOMAIN).unwrap();
        received.wait_for("event of domain ev", |e| domain_event(e, "ev")).await;
        assert!(received.0.lock().unwrap().iter().all(|e| matches!(e, HostEvent::Domain { uri: u, .. } if u == uri)));
        assert_eq!(received.reconnects(), 0, "a first connection is no reconnect");

        let calls = host.counters().snapshot();
        assert_eq!(cache.check_connections().await, 0, "a live, subscribed connection is left alone");
        assert_eq!(host.counters().snapshot(), calls, "the check made a call on the host");

        host.drop_connections();
        assert_eq!(cache.check_connections().await, 1, "a dead connection is replaced");
        received.wait_for("a reconnect", |e| e.iter().any(|e| matches!(e, HostEvent::Reconnected { .. }))).await;
        assert_eq!(host.counters().connections_opened(), 3, "the test's, the first and the new");
        assert_eq!(host.counters().calls(Op::DomainEventRegister), 2);

        received.0.lock().unwrap().clear();
        let other = crate::hypervisor::sim::SimHypervisor::connect(uri).unwrap();
        other.domain_start("ev").unwrap();
        received.wait_for("an event on the new connection", |e| domain_event(e, "ev")).await;
        assert_eq!(cache.check_connections().await, 0);
        assert_eq!(received.reconnects(), 0);
        host.unregister();
    }

    /// A host that refuses the reconnect is tried again only after a backoff.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_reconnect_backs_off() {
        let uri = "sim:///capl-connections-events-refused";
        let host = Host::builder(uri).build().unwrap();
        let cache = Arc::new(Connections::new(Arc::new(SimConnector), 4));
        let received = Received::default();
        cache.set_event_sink(received.sink());
        let handle = cache.host(uri);
        handle.call(|h| h.capabilities_xml()).await.unwrap();

        host.unregister();
        assert_eq!(cache.check_connections().await, 1, "the dead connection is replaced");
        let deadline = Instant::now() + BOUND;
        while handle.connecting() {
            assert!(Instant::now() < deadline, "the connect never returned");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(cache.check_connections().await, 0, "retried before the backoff");
        assert_eq!(cache.connect_attempts(), 2);

        host.register();
        handle.call(|h| h.capabilities_xml()).await.unwrap();
        received.wait_for("a reconnect", |e| e.iter().any(|e| matches!(e, HostEvent::Reconnected { .. }))).await;
        assert_eq!(received.reconnects(), 1);
        host.unregister();
    }

    /// Connections opened before the sink was set have no subscription: the
    /// check replaces them, and the replacement is announced.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_opened_before_the_sink_is_replaced() {
        let uri = "sim:///capl-connections-events-late-sink";
        let host = Host::builder(uri).build().unwrap();
        let cache = Arc::new(Connections::new(Arc::new(SimConnector), 4));
        let handle = cache.host(uri);
        handle.call(|h| h.capabilities_xml()).await.unwrap();
        assert_eq!(cache.check_connections().await, 0, "without a sink nothing is checked");
        assert_eq!(host.counters().calls(Op::DomainEventRegister), 0);

        let received = Received::default();
        cache.set_event_sink(received.sink());
        assert_eq!(cache.check_connections().await, 1);
        received.wait_for("a reconnect", |e| e.iter().any(|e| matches!(e, HostEvent::Reconnected { .. }))).await;
        assert_eq!(host.counters().calls(Op::DomainEventRegister), 1);
        assert_eq!(host.counters().connections_opened(), 2);
        host.unregister();
    }

    /// A host that refuses the subscription: the connection is used all the
    /// same, and replaced (subscribing again) only after the backoff, not at
    /// every check.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_subscription_keeps_the_connection_and_is_retried_after_a_backoff() {
        let uri = "sim:///capl-connections-events-refused-subscription";
        let host = Host::builder(uri).build().unwrap();
        let cache = Arc::new(Connections::new(Arc::new(SimConnector), 4));
        let received = Received::default();
        cache.set_event_sink(received.sink());
        host.fail_nth(Op::DomainEventRegister, 1, Error::new(ErrorCode::NoSupport, "no events here"));
        let handle = cache.host(uri);
        handle.call(|h| h.capabilities_xml()).await.unwrap();
        assert_eq!(cache.subscriptions_made(), 0);
        assert_eq!(cache.check_connections().await, 0, "replaced before the backoff");
        handle.call(|h| h.capabilities_xml()).await.unwrap();
        assert_eq!(host.counters().connections_opened(), 1, "the unsubscribed connection is used");

        tokio::time::sleep(RECONNECT_BACKOFF_MIN).await;
        assert_eq!(cache.check_connections().await, 1);
        received.wait_for("a reconnect", |e| e.iter().any(|e| matches!(e, HostEvent::Reconnected { .. }))).await;
        assert_eq!(cache.subscriptions_made(), 1);
        assert_eq!(host.counters().connections_opened(), 2);
        host.unregister();
    }
}
