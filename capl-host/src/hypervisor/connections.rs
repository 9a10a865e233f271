//! One cached libvirt connection per host URI, shared by every reconcile.
//!
//! - [`Connections`] maps a URI to a host slot holding at most one open
//!   [`Hypervisor`]. The first call on a host opens it (through a
//!   [`Connector`]); later calls reuse it. A connection found dead (it reports
//!   `is_alive() == false`, or a call failed because the connection is gone:
//!   [`CallError::connection_lost`]) is dropped by [`HostHandle::call`] itself
//!   and the *next* call reconnects; callers never drop connections. A failed
//!   call is never retried here: the reconcile that saw the error requeues,
//!   and every host step is idempotent.
//! - Each host admits at most `max_calls_per_host` calls at a time (a tokio
//!   semaphore), so a burst of reconciles cannot pile requests onto one
//!   libvirtd (whose default `max_client_requests` is 5 per client).
//! - [`HostHandle::call`] runs the blocking trait call on tokio's blocking
//!   pool (`spawn_blocking`); nothing here blocks a runtime worker.
//! - [`LibvirtConnector`] registers libvirt's default event loop once, before
//!   its first connection, runs it on its own thread, and turns on keepalive
//!   (default: a probe every 5 s, the connection is closed after 3 missed
//!   probes), so a host that vanished is noticed within ~15-20 s even when no
//!   call is in flight.
//!
//! # Remote URIs
//!
//! Connections are opened non-interactively (`virConnectOpen`, no auth
//! callback), so every credential must be found without a prompt.
//!
//! - `qemu+tls://host/system` (port 16514): the client needs the CA
//!   certificate and a client certificate/key signed by that CA. As root they
//!   are read from `/etc/pki/CA/cacert.pem`, `/etc/pki/libvirt/clientcert.pem`
//!   and `/etc/pki/libvirt/private/clientkey.pem`; as another user from
//!   `$HOME/.pki/libvirt/{cacert,clientcert,clientkey}.pem`. The URI parameter
//!   `?pkipath=/dir` points at one directory holding all three files (the
//!   natural choice in a container: mount a Secret there). The server
//!   certificate must name `host` (CN or subjectAltName); `?no_verify=1`
//!   turns that check off (tests only).
//! - `qemu+tcp://host/system` (port 16509): plain TCP, no encryption. The
//!   daemon must listen on TCP (`listen_tcp = 1`, or `virtproxyd-tcp.socket`)
//!   with `auth_tcp = "none"`, since SASL would need an interactive callback.
//!   For isolated lab networks only.
//! - `qemu+libssh://user@host/system` (libvirt's built-in libssh transport)
//!   and `qemu+libssh2://user@host/system` (libssh2): the private key comes
//!   from `?keyfile=/path/to/id_ed25519` (or an ssh-agent through
//!   `SSH_AUTH_SOCK`; choose with `?sshauth=privkey` / `agent`); the key must
//!   not have a passphrase. The server's host key must already be in
//!   `?known_hosts=/path` (default `$HOME/.ssh/known_hosts`), because
//!   `known_hosts_verify=normal` (the default) refuses unknown hosts without a
//!   prompt; `known_hosts_verify=ignore` disables the check (tests only). The
//!   remote user needs access to the libvirt socket (root, or the `libvirt`
//!   group), and the remote host needs `virt-ssh-helper` (libvirt >= 9.5) or
//!   `nc`; pick with `?proxy=auto|native|netcat`. libssh2 only reads some key
//!   formats: if it rejects an OpenSSH-format key, convert it with
//!   `ssh-keygen -p -m PEM -f key`.
//!
//! Examples: `qemu+tls://kvm1.lab/system?pkipath=/etc/capl/pki/kvm1`,
//! `qemu+libssh://root@kvm1.lab/system?keyfile=/etc/capl/ssh/id_ed25519&known_hosts=/etc/capl/ssh/known_hosts`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::libvirt::{LibvirtHypervisor, from_virt};
use super::{ErrorKind, Hypervisor, HypervisorError, Result};

/// The error type of a closure run by [`HostHandle::call`]: a bare
/// [`HypervisorError`], or an error of the host layer that wraps one
/// (`crate::HostError`). The handle asks it whether the connection is gone,
/// and builds one when no call could be made at all.
pub trait CallError: Sized + Send + 'static {
    /// The call could not run on `uri`: no connection could be opened, or the
    /// call did not complete.
    fn unavailable(uri: &str, source: HypervisorError) -> Self;

    /// This failure means the connection is gone; the handle drops it.
    fn connection_lost(&self) -> bool;
}

impl CallError for HypervisorError {
    fn unavailable(_uri: &str, source: HypervisorError) -> Self {
        source
    }

    fn connection_lost(&self) -> bool {
        self.kind == ErrorKind::ConnectionLost
    }
}

/// Opens a new connection to a host. One implementation per backend (real
/// libvirt here; the simulator's lives with `sim`).
pub trait Connector: Send + Sync {
    fn connect(&self, uri: &str) -> Result<Arc<dyn Hypervisor>>;
}

/// Keepalive settings for [`LibvirtConnector`] (`virConnectSetKeepAlive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    /// Seconds between probes; 0 or less turns keepalive off.
    pub interval_secs: i32,
    /// Unanswered probes after which libvirt closes the connection.
    pub count: u32,
}

impl Default for KeepAlive {
    fn default() -> Self {
        Self { interval_secs: 5, count: 3 }
    }
}

/// [`Connector`] over the `virt` crate, counting the connections it opens.
#[derive(Debug, Default)]
pub struct LibvirtConnector {
    keepalive: KeepAlive,
    opened: AtomicU64,
}

impl LibvirtConnector {
    pub fn new(keepalive: KeepAlive) -> Self {
        Self { keepalive, opened: AtomicU64::new(0) }
    }

    /// How many connections this connector has opened successfully.
    pub fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::SeqCst)
    }
}

impl Connector for LibvirtConnector {
    fn connect(&self, uri: &str) -> Result<Arc<dyn Hypervisor>> {
        ensure_event_loop()?;
        let hv = LibvirtHypervisor::connect(uri)?;
        if self.keepalive.interval_secs > 0 {
            // Ok(false): a local driver (test:///) has no keepalive; fine.
            hv.set_keepalive(self.keepalive.interval_secs, self.keepalive.count).map_err(|mut e| {
                e.message = format!("cannot enable keepalive on {uri}: {}", e.message);
                e
            })?;
        }
        self.opened.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(hv))
    }
}

/// Registers libvirt's default event loop implementation (once per process)
/// and runs it on a dedicated thread, `libvirt-events`.
///
/// Keepalive and stream/close callbacks only fire while an event loop runs;
/// libvirt requires the registration before the connections that use it are
/// opened, so [`LibvirtConnector`] calls this before every connect.
pub fn ensure_event_loop() -> Result<()> {
    static EVENT_LOOP: OnceLock<Result<()>> = OnceLock::new();
    EVENT_LOOP
        .get_or_init(|| {
            virt::event::event_register_default_impl().map_err(|e| {
                let mut err = from_virt(e);
                err.message = format!("cannot register libvirt's default event loop: {}", err.message);
                err
            })?;
            std::thread::Builder::new()
                .name("libvirt-events".into())
                .spawn(|| {
                    loop {
                        if let Err(e) = virt::event::event_run_default_impl() {
                            tracing::error!(error = %e, "libvirt event loop iteration failed");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                })
                .map_err(|e| {
                    HypervisorError::new(
                        ErrorKind::Other,
                        0,
                        format!("cannot spawn the libvirt event loop thread: {e}"),
                    )
                })?;
            Ok(())
        })
        .clone()
}

/// libvirtd's default `max_client_requests`: concurrent calls one client
/// connection may have in flight before the daemon queues them.
pub const DEFAULT_MAX_CALLS_PER_HOST: usize = 5;

/// The connection cache: one slot per host URI.
pub struct Connections {
    connector: Arc<dyn Connector>,
    max_calls_per_host: usize,
    hosts: Mutex<HashMap<String, Arc<HostSlot>>>,
    opened: AtomicU64,
}

impl Connections {
    pub fn new(connector: Arc<dyn Connector>, max_calls_per_host: usize) -> Self {
        assert!(max_calls_per_host > 0, "max_calls_per_host must be at least 1");
        Self { connector, max_calls_per_host, hosts: Mutex::new(HashMap::new()), opened: AtomicU64::new(0) }
    }

    /// A cache over real libvirt with default keepalive and call bound.
    pub fn libvirt() -> Self {
        Self::new(Arc::new(LibvirtConnector::default()), DEFAULT_MAX_CALLS_PER_HOST)
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
                        conn: Mutex::new(None),
                        permits: Arc::new(Semaphore::new(self.max_calls_per_host)),
                    })
                })
                .clone()
        };
        HostHandle { cache: self.clone(), slot }
    }

    /// Connections opened through this cache so far, over all hosts.
    pub fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::SeqCst)
    }

    /// Drops the cached connection of `uri` (if any); the next call reconnects.
    /// Reconciles need not call this: [`HostHandle::call`] drops a lost
    /// connection itself.
    pub fn invalidate(&self, uri: &str) {
        let slot = self.hosts.lock().expect("connection cache lock poisoned").get(uri).cloned();
        if let Some(slot) = slot {
            *slot.conn.lock().expect("host slot lock poisoned") = None;
        }
    }

    /// The cached connection of `slot`, opened (again) when there is none or
    /// it is no longer alive. Blocks: call from a blocking context.
    fn checkout(&self, slot: &HostSlot) -> Result<Arc<dyn Hypervisor>> {
        // Held while connecting, so concurrent first calls open one connection.
        let mut conn = slot.conn.lock().expect("host slot lock poisoned");
        if let Some(c) = conn.as_ref() {
            if c.is_alive() {
                return Ok(c.clone());
            }
            tracing::warn!(uri = %slot.uri, "libvirt connection is dead; reconnecting");
            *conn = None;
        }
        let fresh = self.connector.connect(&slot.uri)?;
        self.opened.fetch_add(1, Ordering::SeqCst);
        *conn = Some(fresh.clone());
        Ok(fresh)
    }

    /// Forgets `used` if it is still the cached connection of `slot`.
    fn evict(&self, slot: &HostSlot, used: &Arc<dyn Hypervisor>) {
        let mut conn = slot.conn.lock().expect("host slot lock poisoned");
        if conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, used)) {
            tracing::warn!(uri = %slot.uri, "libvirt connection lost; the next call reconnects");
            *conn = None;
        }
    }
}

struct HostSlot {
    uri: String,
    conn: Mutex<Option<Arc<dyn Hypervisor>>>,
    permits: Arc<Semaphore>,
}

/// One host of a [`Connections`] cache.
#[derive(Clone)]
pub struct HostHandle {
    cache: Arc<Connections>,
    slot: Arc<HostSlot>,
}

impl HostHandle {
    pub fn uri(&self) -> &str {
        &self.slot.uri
    }

    /// Runs `f` on the host's connection on tokio's blocking pool, within the
    /// host's call bound: `host.call(move |h| h.domain_state(&name)).await`.
    ///
    /// `f` returns a [`HypervisorError`] or an error of the host layer (any
    /// [`CallError`]). A failure that means the connection is gone drops the
    /// connection, so that the next call reconnects; the error is returned as
    /// is. A connection that cannot be opened is returned as
    /// [`CallError::unavailable`].
    pub async fn call<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&dyn Hypervisor) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: CallError,
    {
        let uri = self.slot.uri.clone();
        let permit = self.slot.permits.clone().acquire_owned().await.map_err(|_| {
            E::unavailable(
                &uri,
                HypervisorError::new(ErrorKind::Other, 0, format!("call bound of host {uri} was closed")),
            )
        })?;
        let this = self.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            this.call_blocking(f)
        })
        .await;
        joined.unwrap_or_else(|e| {
            Err(E::unavailable(
                &uri,
                HypervisorError::new(ErrorKind::Other, 0, format!("libvirt call on host {uri} did not complete: {e}")),
            ))
        })
    }

    /// The same as [`HostHandle::call`] for code already on a blocking
    /// thread (xtask, tests, `spawn_blocking` bodies). Not bounded by the
    /// async call semaphore.
    pub fn call_blocking<T, E: CallError>(&self, f: impl FnOnce(&dyn Hypervisor) -> Result<T, E>) -> Result<T, E> {
        let conn = self.cache.checkout(&self.slot).map_err(|e| E::unavailable(&self.slot.uri, e))?;
        let out = f(conn.as_ref());
        if let Err(e) = &out
            && e.connection_lost()
        {
            self.cache.evict(&self.slot, &conn);
        }
        out
    }

    /// Calls currently admitted on this host (for tests and metrics).
    pub fn calls_in_flight(&self) -> usize {
        self.cache.max_calls_per_host - self.slot.permits.available_permits()
    }
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
}
