//! [`Hypervisor`] over the `virt` crate: real libvirt hosts and libvirt's
//! in-process `test:///default` driver.
//!
//! One [`LibvirtHypervisor`] wraps one `virConnectPtr`. libvirt connections
//! are thread-safe, so one value is shared by every caller (`connections`
//! caches one per URI; [`LibvirtConnector`] opens it with keepalive on).
//! Every method blocks; async callers go through `connections::HostHandle::call`.
//!
//! Errors keep libvirt's `virErrorNumber` and message; the
//! [`ErrorKind`] is derived from the number (and, for transport failures,
//! from the error domain) by the shared table, [`kind_of`].
//!
//! # Keepalive and the event loop
//!
//! [`LibvirtConnector`] registers libvirt's default event loop once, before
//! its first connection, runs it on its own thread, and turns on keepalive
//! (default: a probe every 5 s, the connection is closed after 3 missed
//! probes), so a host that vanished is noticed within ~15-20 s even when no
//! call is in flight. Keepalive starts only once a connection is open; the
//! connect timeout covers the time before.
//!
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

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::Duration;

use virt::connect::Connect;
use virt::domain::Domain;
use virt::network::Network;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;
use virt::sys;

use super::connections::{Connections, DEFAULT_MAX_CALLS_PER_HOST};
use super::{
    Connector, DhcpLease, DomainEvent, DomainEventCallback, DomainEventKind, DomainState, ErrorKind, EventSubscription,
    HostAdmin, Hypervisor, HypervisorError, NetworkUpdateCommand, NodeMemory, Result, UndefineFlags, kind_of,
};

// Chunk size for stream transfers (libvirt's own stream packets carry at most 256 KiB).
use super::STREAM_CHUNK;

/// A connection to one libvirt host through the `virt` crate.
///
/// Dropping it closes the connection on a thread of its own:
/// `virConnectClose` on a remote connection asks the daemon and waits for its
/// answer, which a host that stopped answering never sends, and the last
/// reference may be dropped anywhere (a runtime worker, under a lock).
pub struct LibvirtHypervisor {
    uri: String,
    conn: std::mem::ManuallyDrop<Connect>,
    events: Arc<EventHub>,
}

impl Drop for LibvirtHypervisor {
    fn drop(&mut self) {
        // SAFETY: `conn` is taken once, here, and not used after.
        let conn = unsafe { std::mem::ManuallyDrop::take(&mut self.conn) };
        let uri = self.uri.clone();
        let closing = std::thread::Builder::new().name("virConnectClose".into()).spawn(move || {
            // virt's Connect closes on drop and panics when the close fails.
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(conn))).is_err() {
                tracing::warn!(%uri, "closing the libvirt connection failed");
            }
        });
        if let Err(e) = closing {
            tracing::warn!(uri = %self.uri, error = %e, "no thread to close the libvirt connection on; closed here");
        }
    }
}

impl LibvirtHypervisor {
    /// `virConnectOpen(uri)`: opens a read-write connection.
    ///
    /// Remote URIs authenticate non-interactively (TLS certificates, SSH
    /// keys); see "Remote URIs" in this module's docs for what each transport needs.
    pub fn connect(uri: &str) -> Result<Self> {
        silence_default_error_printer();
        let conn = Connect::open(Some(uri)).map_err(|e| {
            let mut err = from_virt(e);
            err.message = format!("cannot open libvirt connection to {uri}: {}", err.message);
            err
        })?;
        Ok(Self { uri: uri.to_string(), conn: std::mem::ManuallyDrop::new(conn), events: Arc::default() })
    }

    /// `virConnectSetKeepAlive`: probe the peer every `interval_secs` and
    /// close the connection after `count` unanswered probes. Needs a
    /// registered event loop (see [`ensure_event_loop`]).
    ///
    /// Returns `Ok(false)` when the driver has no keepalive (local drivers
    /// such as `test:///` or a peer that does not support it).
    pub fn set_keepalive(&self, interval_secs: i32, count: u32) -> Result<bool> {
        match self.conn.set_keep_alive(interval_secs, count) {
            Ok(()) => Ok(true),
            Err(e) if code_of(&e) == sys::VIR_ERR_NO_SUPPORT as i32 => Ok(false),
            Err(e) => Err(from_virt(e)),
        }
    }

    /// The underlying `virt` connection, for calls the trait does not cover.
    pub fn connection(&self) -> &Connect {
        &self.conn
    }

    fn network(&self, name: &str) -> Result<Network> {
        self.conn.lookup_network_by_name(name).map_err(from_virt)
    }

    /// `virNetworkUpdate` of `section`: live when the network runs, config when it is persistent.
    fn network_update(&self, network: &str, command: NetworkUpdateCommand, section: u32, xml: &str) -> Result<()> {
        let net = self.network(network)?;
        let flags = network_update_flags(net.is_active().map_err(from_virt)?, net.is_persistent().map_err(from_virt)?);
        let cmd = match command {
            NetworkUpdateCommand::Modify => sys::VIR_NETWORK_UPDATE_COMMAND_MODIFY,
            NetworkUpdateCommand::Delete => sys::VIR_NETWORK_UPDATE_COMMAND_DELETE,
            NetworkUpdateCommand::AddLast => sys::VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
            NetworkUpdateCommand::AddFirst => sys::VIR_NETWORK_UPDATE_COMMAND_ADD_FIRST,
        };
        net.update(cmd, section, -1, xml, flags).map_err(from_virt)
    }

    fn pool(&self, name: &str) -> Result<StoragePool> {
        self.conn.lookup_storage_pool_by_name(name).map_err(from_virt)
    }

    fn volume(&self, pool: &str, name: &str) -> Result<StorageVol> {
        let pool = self.pool(pool)?;
        pool.lookup_storage_vol_by_name(name).map_err(from_virt)
    }

    fn domain(&self, name: &str) -> Result<Domain> {
        self.conn.lookup_domain_by_name(name).map_err(from_virt)
    }
}

impl Hypervisor for LibvirtHypervisor {
    fn domain_list(&self) -> Result<Vec<String>> {
        let doms = self.conn.list_all_domains(0).map_err(from_virt)?;
        doms.iter().map(|d| d.name().map_err(from_virt)).collect()
    }

    fn uri(&self) -> &str {
        &self.uri
    }

    fn capabilities_xml(&self) -> Result<String> {
        self.conn.capabilities().map_err(from_virt)
    }

    fn domain_capabilities_xml(&self, arch: &str, machine: Option<&str>, virttype: &str) -> Result<String> {
        self.conn.domain_capabilities(None, Some(arch), machine, Some(virttype), 0).map_err(from_virt)
    }

    fn node_memory(&self) -> Result<NodeMemory> {
        let total = self.conn.node_info().map_err(from_virt)?.memory * 1024;
        let free = self.conn.free_memory().map_err(from_virt)?;
        let mut committed = 0;
        for domain in self.conn.list_all_domains(0).map_err(from_virt)? {
            match domain.info().map_err(from_virt) {
                Ok(info) => committed += info.max_mem * 1024,
                // Undefined since the list was made: it takes nothing.
                Err(e) if e.kind == ErrorKind::NoDomain => {}
                Err(e) => return Err(e),
            }
        }
        Ok(NodeMemory { total, free, committed })
    }

    fn is_alive(&self) -> bool {
        // virConnectIsAlive makes no round trip: it reports whether the
        // client still holds an open transport. With keepalive on (see
        // `connections`), libvirt closes the transport of a peer that stopped
        // answering, so this turns false within interval * count seconds.
        matches!(self.conn.is_alive(), Ok(true))
    }

    fn network_xml(&self, name: &str) -> Result<String> {
        self.network(name)?.xml_desc(0).map_err(from_virt)
    }

    fn network_is_active(&self, name: &str) -> Result<bool> {
        self.network(name)?.is_active().map_err(from_virt)
    }

    fn network_update_dhcp_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()> {
        self.network_update(network, command, sys::VIR_NETWORK_SECTION_IP_DHCP_HOST, host_xml)
    }

    fn network_update_dns_host(&self, network: &str, command: NetworkUpdateCommand, host_xml: &str) -> Result<()> {
        self.network_update(network, command, sys::VIR_NETWORK_SECTION_DNS_HOST, host_xml)
    }

    fn network_dhcp_leases(&self, network: &str) -> Result<Vec<DhcpLease>> {
        let net = self.network(network)?;
        dhcp_leases(&net)
    }

    fn interface_xml(&self, name: &str) -> Result<String> {
        self.conn.lookup_interface_by_name(name).and_then(|i| i.xml_desc(0)).map_err(from_virt)
    }

    fn pool_is_active(&self, name: &str) -> Result<bool> {
        self.pool(name)?.is_active().map_err(from_virt)
    }

    fn pool_xml(&self, name: &str) -> Result<String> {
        self.pool(name)?.xml_desc(0).map_err(from_virt)
    }

    fn volume_xml(&self, pool: &str, name: &str) -> Result<String> {
        self.volume(pool, name)?.xml_desc(0).map_err(from_virt)
    }

    fn volume_create(&self, pool: &str, xml: &str) -> Result<String> {
        let pool = self.pool(pool)?;
        StorageVol::create_xml(&pool, xml, 0).and_then(|v| v.name()).map_err(from_virt)
    }

    fn volume_upload(&self, pool: &str, name: &str, bytes: &[u8]) -> Result<()> {
        let vol = self.volume(pool, name)?;
        let stream = Stream::new(&self.conn, 0).map_err(from_virt)?;
        if let Err(e) = vol.upload(&stream, 0, bytes.len() as u64, 0) {
            let _ = stream.abort();
            return Err(from_virt(e));
        }
        let mut sent = 0;
        while sent < bytes.len() {
            let end = (sent + STREAM_CHUNK).min(bytes.len());
            match stream.send(&bytes[sent..end]) {
                Ok(n) if n > 0 => sent += n as usize,
                Ok(_) => {
                    let _ = stream.abort();
                    return Err(HypervisorError::new(
                        ErrorKind::Other,
                        0,
                        format!("upload to volume {name} in pool {pool}: stream accepted no bytes at offset {sent}"),
                    ));
                }
                Err(e) => {
                    let _ = stream.abort();
                    return Err(from_virt(e));
                }
            }
        }
        stream.finish().map_err(from_virt)
    }

    fn volume_upload_from(&self, pool: &str, name: &str, length: u64, source: &mut dyn std::io::Read) -> Result<()> {
        let vol = self.volume(pool, name)?;
        let stream = Stream::new(&self.conn, 0).map_err(from_virt)?;
        if let Err(e) = vol.upload(&stream, 0, length, 0) {
            let _ = stream.abort();
            return Err(from_virt(e));
        }
        let mut send = |chunk: &[u8], offset: u64| -> Result<()> {
            let mut sent = 0;
            while sent < chunk.len() {
                match stream.send(&chunk[sent..]) {
                    Ok(m) if m > 0 => sent += m as usize,
                    Ok(_) => {
                        return Err(HypervisorError::new(
                            ErrorKind::Other,
                            0,
                            format!(
                                "upload to volume {name} in pool {pool}: stream accepted no bytes at offset {}",
                                offset + sent as u64
                            ),
                        ));
                    }
                    Err(e) => return Err(from_virt(e)),
                }
            }
            Ok(())
        };
        match super::stream_source(pool, name, length, source, &mut send) {
            Ok(()) => stream.finish().map_err(from_virt),
            Err(e) => {
                let _ = stream.abort();
                Err(e)
            }
        }
    }

    fn volume_download(&self, pool: &str, name: &str) -> Result<Vec<u8>> {
        let vol = self.volume(pool, name)?;
        let stream = Stream::new(&self.conn, 0).map_err(from_virt)?;
        // length 0: up to the end of the volume.
        if let Err(e) = vol.download(&stream, 0, 0, 0) {
            let _ = stream.abort();
            return Err(from_virt(e));
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; STREAM_CHUNK];
        loop {
            match stream.recv(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n as usize]),
                Err(e) => {
                    let _ = stream.abort();
                    return Err(from_virt(e));
                }
            }
        }
        stream.finish().map_err(from_virt)?;
        Ok(out)
    }

    fn volumes_backed_by(&self, path: &str) -> Result<Vec<String>> {
        super::volumes_backed_by(self, path)
    }

    fn volume_delete(&self, pool: &str, name: &str) -> Result<()> {
        self.volume(pool, name)?.delete(0).map_err(from_virt)
    }

    fn domain_define(&self, xml: &str) -> Result<String> {
        self.conn.define_domain_xml(xml).and_then(|d| d.name()).map_err(from_virt)
    }

    fn domain_xml(&self, name: &str) -> Result<String> {
        self.domain(name)?.xml_desc(0).map_err(from_virt)
    }

    fn domain_state(&self, name: &str) -> Result<DomainState> {
        use virt::domain::DomainState as V;
        let (state, _reason) = self.domain(name)?.state().map_err(from_virt)?;
        Ok(match state.unwrap_or(V::NoState) {
            V::NoState => DomainState::NoState,
            V::Running => DomainState::Running,
            V::Blocked => DomainState::Blocked,
            V::Paused => DomainState::Paused,
            V::Shutdown => DomainState::Shutdown,
            V::Shutoff => DomainState::Shutoff,
            V::Crashed => DomainState::Crashed,
            V::PMSuspended => DomainState::PmSuspended,
        })
    }

    fn domain_start(&self, name: &str) -> Result<()> {
        self.domain(name)?.create().map_err(from_virt)
    }

    fn domain_destroy(&self, name: &str) -> Result<()> {
        self.domain(name)?.destroy().map_err(from_virt)
    }

    fn domain_reset(&self, name: &str) -> Result<()> {
        self.domain(name)?.reset().map_err(from_virt)
    }

    fn domain_undefine(&self, name: &str, flags: UndefineFlags) -> Result<()> {
        let mut raw = 0;
        if flags.managed_save {
            raw |= sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE;
        }
        if flags.snapshots_metadata {
            raw |= sys::VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA;
        }
        if flags.nvram {
            raw |= sys::VIR_DOMAIN_UNDEFINE_NVRAM;
        }
        self.domain(name)?.undefine_flags(raw).map_err(from_virt)
    }

    fn domain_autostart(&self, name: &str) -> Result<bool> {
        self.domain(name)?.autostart().map_err(from_virt)
    }

    fn domain_set_autostart(&self, name: &str, autostart: bool) -> Result<()> {
        self.domain(name)?.set_autostart(autostart).map_err(from_virt)
    }

    fn subscribe_domain_events(&self, callback: DomainEventCallback) -> Result<EventSubscription> {
        subscribe_lifecycle(&self.conn, &self.events, callback)
    }
}

impl HostAdmin for LibvirtHypervisor {
    fn network_list(&self) -> Result<Vec<String>> {
        let nets = self.conn.list_all_networks(0).map_err(from_virt)?;
        nets.iter().map(|n| n.name().map_err(from_virt)).collect()
    }

    fn network_define(&self, xml: &str) -> Result<String> {
        self.conn.define_network_xml(xml).and_then(|n| n.name()).map_err(from_virt)
    }

    fn network_start(&self, name: &str) -> Result<()> {
        self.network(name)?.create().map_err(from_virt)
    }

    fn network_stop(&self, name: &str) -> Result<()> {
        self.network(name)?.destroy().map_err(from_virt)
    }

    fn network_undefine(&self, name: &str) -> Result<()> {
        self.network(name)?.undefine().map_err(from_virt)
    }

    fn pool_list(&self) -> Result<Vec<String>> {
        let pools = self.conn.list_all_storage_pools(0).map_err(from_virt)?;
        pools.iter().map(|p| p.name().map_err(from_virt)).collect()
    }

    fn pool_define(&self, xml: &str) -> Result<String> {
        self.conn.define_storage_pool_xml(xml, 0).and_then(|p| p.name()).map_err(from_virt)
    }

    fn pool_build(&self, name: &str) -> Result<()> {
        self.pool(name)?.build(0).map_err(from_virt)
    }

    fn pool_start(&self, name: &str) -> Result<()> {
        self.pool(name)?.create(0).map_err(from_virt)
    }

    fn pool_stop(&self, name: &str) -> Result<()> {
        self.pool(name)?.destroy().map_err(from_virt)
    }

    fn pool_undefine(&self, name: &str) -> Result<()> {
        self.pool(name)?.undefine().map_err(from_virt)
    }

    fn pool_refresh(&self, name: &str) -> Result<()> {
        self.pool(name)?.refresh(0).map_err(from_virt)
    }

    fn volume_list(&self, pool: &str) -> Result<Vec<String>> {
        self.pool(pool)?.list_volumes().map_err(from_virt)
    }

    fn domain_shutdown(&self, name: &str) -> Result<()> {
        self.domain(name)?.shutdown().map_err(from_virt)
    }

    fn domain_suspend(&self, name: &str) -> Result<()> {
        self.domain(name)?.suspend().map_err(from_virt)
    }
}

/// The `virNetworkUpdate` flags for a network in this state.
///
/// libvirt rejects `AFFECT_LIVE` on an inactive network ("network is not
/// running") and `AFFECT_CONFIG` on a transient one, so the flags follow the
/// network: live when it runs, config when it is persistent. (An inactive,
/// persistent network gets `CONFIG` only, which is what `AFFECT_CURRENT`
/// would pick too, but explicitly.)
pub fn network_update_flags(active: bool, persistent: bool) -> sys::virNetworkUpdateFlags {
    let mut flags = sys::VIR_NETWORK_UPDATE_AFFECT_CURRENT;
    if active {
        flags |= sys::VIR_NETWORK_UPDATE_AFFECT_LIVE;
    }
    if persistent {
        flags |= sys::VIR_NETWORK_UPDATE_AFFECT_CONFIG;
    }
    flags
}

unsafe extern "C" {
    /// libvirt allocates the lease array with malloc and documents that the
    /// caller frees the array itself with free(3).
    fn free(ptr: *mut c_void);
}

/// `virNetworkGetDHCPLeases` (not wrapped by `virt` 0.5).
fn dhcp_leases(net: &Network) -> Result<Vec<DhcpLease>> {
    let mut leases: *mut sys::virNetworkDHCPLeasePtr = std::ptr::null_mut();
    // SAFETY: `net` holds a valid network reference for the whole call; a
    // null MAC asks for all leases; libvirt fills `leases` with `n` pointers.
    let n = unsafe { sys::virNetworkGetDHCPLeases(net.as_ptr(), std::ptr::null(), &mut leases, 0) };
    if n < 0 {
        return Err(from_virt(virt::error::Error::last_error()));
    }
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        // SAFETY: i < n, each element is a valid lease until freed below.
        unsafe {
            let lease = *leases.add(i);
            out.push(DhcpLease {
                mac: c_string(((*lease).mac) as *const c_char).unwrap_or_default(),
                ip: c_string((*lease).ipaddr as *const c_char).unwrap_or_default(),
                prefix: (*lease).prefix,
                hostname: c_string((*lease).hostname as *const c_char).filter(|h| !h.is_empty()),
                expiry_time: (*lease).expirytime,
            });
            sys::virNetworkDHCPLeaseFree(lease);
        }
    }
    if !leases.is_null() {
        // SAFETY: the array itself was malloc'ed by libvirt; its elements are freed above.
        unsafe { free(leases as *mut c_void) };
    }
    Ok(out)
}

/// The lifecycle-event subscribers of one connection.
///
/// libvirt refuses a second registration of the same C callback for the same event
/// and domain on one connection ("event callback already tracked"), so a connection
/// has at most one registration, made for its first subscriber and removed with its
/// last; [`lifecycle_trampoline`] hands every event to all subscribers.
#[derive(Default)]
struct EventHub {
    subscribers: Mutex<BTreeMap<u64, Arc<DomainEventCallback>>>,
    next_id: AtomicU64,
    /// libvirt's callback id while registered.
    registration: Mutex<Option<i32>>,
}

impl EventHub {
    fn dispatch(&self, event: DomainEvent) {
        let callbacks: Vec<Arc<DomainEventCallback>> =
            self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        for callback in callbacks {
            // A panic must not unwind into libvirt's C frames, nor keep the event from
            // the other subscribers.
            let delivered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(event.clone())));
            if delivered.is_err() {
                tracing::error!(
                    domain = %event.domain,
                    kind = event.kind.as_str(),
                    detail = event.detail,
                    "a lifecycle event callback panicked"
                );
            }
        }
    }
}

/// Adds `callback` to the connection's hub, registering with libvirt
/// (`virConnectDomainEventRegisterAny(conn, NULL, VIR_DOMAIN_EVENT_ID_LIFECYCLE, ...)`)
/// for the first subscriber. Dropping the subscription removes the callback and, with
/// the last one, deregisters (`virConnectDomainEventDeregisterAny`).
///
/// libvirt owns a boxed `Arc<EventHub>` from registration on: it passes it back as
/// the opaque pointer to [`lifecycle_trampoline`] on its event loop thread, and hands
/// it to [`free_hub`] (which drops it) once the registration is gone, whether
/// deregistered or freed with the connection. Events are dispatched only while an
/// event loop runs ([`ensure_event_loop`], which must run before a remote
/// connection is opened for its socket to be watched).
fn subscribe_lifecycle(
    conn: &Connect,
    hub: &Arc<EventHub>,
    callback: DomainEventCallback,
) -> Result<EventSubscription> {
    // Local drivers (test:///) add their dispatch timer to the loop on the first
    // registration; remote connections need it since they were opened.
    ensure_event_loop()?;
    let mut registration = hub.registration.lock().unwrap_or_else(|e| e.into_inner());
    if registration.is_none() {
        *registration = Some(register_hub(conn, hub)?);
    }
    let id = hub.next_id.fetch_add(1, Ordering::SeqCst);
    hub.subscribers.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Arc::new(callback));
    drop(registration);
    // The subscription holds its own reference on the connection, so deregistering
    // never touches a closed one.
    let conn = conn.clone();
    let hub = Arc::clone(hub);
    Ok(EventSubscription::new(move || {
        let mut registration = hub.registration.lock().unwrap_or_else(|e| e.into_inner());
        let mut subscribers = hub.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subscribers.remove(&id);
        if subscribers.is_empty()
            && let Some(callback_id) = registration.take()
            // A closed connection frees its registrations itself; asking it would
            // only wait for an error.
            && matches!(conn.is_alive(), Ok(true))
        {
            // SAFETY: `conn` is valid; `callback_id` came from `register_hub` on this
            // connection. A failure (a broken connection) leaves the boxed hub to be
            // freed with the connection.
            unsafe { sys::virConnectDomainEventDeregisterAny(conn.as_ptr(), callback_id) };
        }
    }))
}

/// Registers the hub's trampoline with libvirt; returns libvirt's callback id.
fn register_hub(conn: &Connect, hub: &Arc<EventHub>) -> Result<i32> {
    let opaque = Box::into_raw(Box::new(Arc::clone(hub))) as *mut c_void;
    // The prototype takes the generic callback type; libvirt calls a
    // VIR_DOMAIN_EVENT_ID_LIFECYCLE callback with the lifecycle signature (the C
    // headers' VIR_DOMAIN_EVENT_CALLBACK cast).
    // SAFETY: both are `extern "C"` function pointers of the same size; only the
    // signature libvirt uses for this event id is ever called.
    let generic: sys::virConnectDomainEventGenericCallback = Some(unsafe {
        std::mem::transmute::<
            unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, i32, i32, *mut c_void) -> i32,
            unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *mut c_void),
        >(lifecycle_trampoline)
    });
    // SAFETY: `conn` is a valid connection for the call; a null domain means all
    // domains; libvirt keeps `opaque` and frees it exactly once through `free_hub`.
    let id = unsafe {
        sys::virConnectDomainEventRegisterAny(
            conn.as_ptr(),
            std::ptr::null_mut(),
            sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE as i32,
            generic,
            opaque,
            Some(free_hub),
        )
    };
    if id < 0 {
        let err = from_virt(virt::error::Error::last_error());
        // A failed registration does not call the free callback: the box is still ours.
        // SAFETY: `opaque` came from Box::into_raw above and libvirt did not keep it.
        drop(unsafe { Box::from_raw(opaque as *mut Arc<EventHub>) });
        return Err(err);
    }
    Ok(id)
}

/// The lifecycle callback libvirt calls on its event loop thread.
unsafe extern "C" fn lifecycle_trampoline(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    event: i32,
    detail: i32,
    opaque: *mut c_void,
) -> i32 {
    // SAFETY: libvirt passes a valid domain for the duration of the call; its name
    // is owned by the domain object and copied here.
    let domain = unsafe { c_string(sys::virDomainGetName(dom)) }.unwrap_or_default();
    let Some(kind) = DomainEventKind::from_raw(event) else {
        tracing::debug!(%domain, event, detail, "ignoring a lifecycle event of an unknown kind");
        return 0;
    };
    // SAFETY: `opaque` is the boxed hub registered in `register_hub`; libvirt frees
    // it (through `free_hub`) only after its last dispatch.
    let hub = unsafe { &*(opaque as *const Arc<EventHub>) };
    hub.dispatch(DomainEvent { domain, kind, detail });
    0
}

/// libvirt's free callback for the registration's opaque pointer.
unsafe extern "C" fn free_hub(opaque: *mut c_void) {
    if !opaque.is_null() {
        // SAFETY: `opaque` is the box leaked in `register_hub`; libvirt calls this
        // exactly once, after the last dispatch.
        drop(unsafe { Box::from_raw(opaque as *mut Arc<EventHub>) });
    }
}

/// # Safety
/// `ptr` is null or a valid NUL-terminated string.
unsafe fn c_string(ptr: *const c_char) -> Option<String> {
    if ptr.is_null() { None } else { Some(unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()) }
}

/// libvirt prints every error to stderr unless an error function is set;
/// errors are returned to callers here, so printing them too is noise.
fn silence_default_error_printer() {
    static ONCE: Once = Once::new();
    ONCE.call_once(virt::error::clear_error_callback);
}

fn code_of(err: &virt::error::Error) -> i32 {
    err.code().to_raw() as i32
}

/// Converts a `virt` error, keeping libvirt's code and message.
pub fn from_virt(err: virt::error::Error) -> HypervisorError {
    let code = code_of(&err);
    let domain = err.domain().to_raw() as i32;
    let transport = domain == sys::VIR_FROM_RPC as i32 || domain == sys::VIR_FROM_REMOTE as i32;
    HypervisorError::new(kind_of(code, transport), code, err.message().to_string())
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

impl Connections {
    /// A cache over real libvirt with default keepalive, call bound and timeouts.
    pub fn libvirt() -> Self {
        Self::new(Arc::new(LibvirtConnector::default()), DEFAULT_MAX_CALLS_PER_HOST)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn the_test_driver_delivers_lifecycle_events_and_a_panicking_callback_harms_no_other() {
        super::ensure_event_loop().unwrap();
        let hv = LibvirtHypervisor::connect("test:///default").unwrap();
        let name = format!("capl-events-unit-{}", std::process::id());
        let _panics = hv.subscribe_domain_events(Box::new(|_| panic!("a callback that panics"))).unwrap();
        let (tx, rx) = channel();
        let own = name.clone();
        let sub = hv
            .subscribe_domain_events(Box::new(move |e| {
                if e.domain == own {
                    let _ = tx.send((e.kind, e.detail));
                }
            }))
            .unwrap();
        let xml =
            format!("<domain type='test'><name>{name}</name><memory>1024</memory><os><type>hvm</type></os></domain>");
        hv.domain_define(&xml).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok((DomainEventKind::Defined, 0)));
        hv.domain_start(&name).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok((DomainEventKind::Started, 0)));
        drop(sub);
        hv.domain_destroy(&name).unwrap();
        hv.domain_undefine(&name, UndefineFlags::default()).unwrap();
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err(), "an event after the subscription was dropped");
    }

    #[test]
    fn update_flags_follow_network_state() {
        let live = sys::VIR_NETWORK_UPDATE_AFFECT_LIVE;
        let config = sys::VIR_NETWORK_UPDATE_AFFECT_CONFIG;
        assert_eq!(network_update_flags(true, true), live | config);
        assert_eq!(network_update_flags(false, true), config);
        assert_eq!(network_update_flags(true, false), live);
        assert_eq!(network_update_flags(false, false), sys::VIR_NETWORK_UPDATE_AFFECT_CURRENT);
    }

    /// Listeners on 127.0.0.1 that accept TCP connections and never answer,
    /// as a hostile LibvirtCluster's URIs could name: libvirt's client blocks
    /// in each connect until the peer closes. They hold at most the connect
    /// budget's threads however many there are, further ones are refused with
    /// the reason, and a host already connected (the in-process test driver)
    /// keeps being served. Closing the listeners ends the connects and frees
    /// their threads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn listeners_that_never_answer_hold_no_more_than_the_connect_budget() {
        use crate::hypervisor::connections::Connections;
        let accepted = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut listeners = Vec::new();
        for _ in 0..4 {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let uri = format!("qemu+tcp://127.0.0.1:{}/system", listener.local_addr().unwrap().port());
            let held = accepted.clone();
            let accept = listener.try_clone().unwrap();
            std::thread::spawn(move || {
                for stream in accept.incoming().flatten() {
                    held.lock().unwrap().push(stream);
                }
            });
            listeners.push((uri, listener));
        }
        let timeout = Duration::from_millis(500);
        let cache = Arc::new(
            Connections::new(Arc::new(LibvirtConnector::default()), 5)
                .with_timeouts(timeout, timeout)
                .with_thread_limits(2, 16),
        );
        let healthy = cache.host("test:///default");
        let version = |h: &crate::hypervisor::connections::HostHandle| {
            let h = h.clone();
            async move { h.call(|hv| hv.capabilities_xml()).await }
        };
        version(&healthy).await.expect("the test driver answers");

        let mut refused = 0;
        for (uri, _) in &listeners {
            let e = version(&cache.host(uri)).await.unwrap_err();
            if e.message.starts_with(&format!("nothing was sent to {uri}: all 2 connects")) {
                refused += 1;
            } else {
                assert!(e.message.starts_with(&format!("no answer from {uri} within 0.5 s")), "{e}");
            }
            version(&healthy).await.expect("the connected host is served meanwhile");
        }
        assert_eq!(refused, 2, "two connects hang, the other two are refused");
        assert_eq!(cache.threads_in_use().0, 2);
        assert_eq!(accepted.lock().unwrap().len(), 2, "only two connections reached the listeners");

        // The peers close: libvirt's connects return and free their threads.
        accepted.lock().unwrap().clear();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cache.threads_in_use().0 > 0 {
            assert!(std::time::Instant::now() < deadline, "the connects did not return after the peers closed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(listeners);
    }
}
