//! The manager binary against a host that accepts TCP connections and never
//! answers: a tokio listener on 127.0.0.1 used as
//! `qemu+tcp://127.0.0.1:<port>/system`, next to the private libvirtd as a
//! healthy host, with the real kube-apiserver of `testenv` (this test needs
//! `cargo xtask control-plane build` as well as `cargo xtask host up`).
//!
//! While the listener hangs, /healthz answers, a machine on the healthy host
//! is created and runs, and the hung host's machine reports HostUnreachable
//! "no answer from <uri> within 3 s". Then the listener is replaced by a
//! forwarder to the private libvirtd's socket (as when a hung libvirtd is
//! restarted: the connections it held are closed) and that machine converges.
//!
//! A second test freezes a forwarder to the private libvirtd while the
//! manager, with one runtime worker and leader election, holds a connection
//! through it: dropping that connection (its close and its domain event
//! deregistration wait on the host) must stall neither /healthz nor the
//! Lease's renewal.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capl::api::capi::Cluster;
use capl::api::{LibvirtCluster, LibvirtMachine};
use capl_host::hypervisor::libvirt::LibvirtHypervisor;
use kube::ResourceExt;
use serde_json::{Value, json};
use testenv::test_host;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};

use crate::api_support::*;
use capl_host_test_support::host::{Fixture, IMAGE_BYTES, ensure_base_image};

const IMAGE: &str = "capl-host-tests-base.qcow2";

/// A TCP listener that first accepts and never answers, and after
/// [`Listener::forward`] forwards every connection to a unix socket.
struct Listener {
    port: u16,
    forwarding: Arc<Mutex<bool>>,
    /// The connections accepted while hanging, held open and never read.
    held: Arc<Mutex<Vec<TcpStream>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Listener {
    async fn start(upstream: std::path::PathBuf) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let forwarding = Arc::new(Mutex::new(false));
        let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (fwd, kept) = (forwarding.clone(), held.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { return };
                if !*fwd.lock().unwrap() {
                    kept.lock().unwrap().push(client);
                    continue;
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let mut server = UnixStream::connect(&upstream)
                        .await
                        .unwrap_or_else(|e| panic!("connecting to {}: {e}", upstream.display()));
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        Self { port, forwarding, held, task }
    }

    fn uri(&self) -> String {
        format!("qemu+tcp://127.0.0.1:{}/system", self.port)
    }

    /// From now on forward; the connections held so far are closed.
    fn forward(&self) {
        *self.forwarding.lock().unwrap() = true;
        self.held.lock().unwrap().clear();
    }

    fn held(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `GET /healthz` on 127.0.0.1:`port`, bounded: the status code, or why there is none.
async fn healthz(port: u16) -> Result<u16, String> {
    let get = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
        stream.write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n").await.map_err(|e| e.to_string())?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.map_err(|e| e.to_string())?;
        response.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or(response)
    };
    tokio::time::timeout(Duration::from_secs(2), get).await.unwrap_or_else(|_| Err("no answer within 2 s".into()))
}

fn libvirt_cluster(name: &str, uri: &str, cluster: &str, uid: &str) -> Value {
    let mut lc = libvirt_cluster_json(name, uri, Some((cluster, uid)));
    lc["spec"]["network"] = json!(test_host::NETWORK);
    lc["spec"]["basePool"] = json!(test_host::BASE_POOL);
    lc["spec"]["domainPool"] = json!(test_host::DISK_POOL);
    lc
}

async fn cluster_on(w: &World, name: &str, uri: &str) {
    let c: Cluster = w.apply(cluster_json(name, &format!("{name}-lc"), true)).await;
    let _: LibvirtCluster = w.apply(libvirt_cluster(&format!("{name}-lc"), uri, name, &c.uid().unwrap())).await;
    let _: Cluster = w.patch_status(name, json!({ "initialization": { "infrastructureProvisioned": true } })).await;
}

async fn machine_on(w: &World, cluster: &str, name: &str) {
    let secret = format!("{name}-bootstrap");
    create_bootstrap_secret(w, &secret, cloud_config(name)).await;
    let m: capl::api::capi::Machine = w.apply(machine_json(name, cluster, name, Some(&secret))).await;
    let mut lm = libvirt_machine_json(name, cluster, Some((name, &m.uid().unwrap())));
    lm["spec"]["image"] = json!(IMAGE);
    let _: LibvirtMachine = w.apply(lm).await;
}

/// Created and running on the host (the test image does not boot, so no address comes).
fn running(lm: &LibvirtMachine) -> bool {
    let c = machine_conditions(lm);
    lm.spec.provider_id.is_some()
        && has(c, "DomainProvisioningReady", "True", None)
        && has(c, "MachineCreated", "True", None)
        && has(c, "DomainRunning", "True", None)
}

/// DomainProvisioningReady False with reason HostUnreachable, and Ready
/// False, both saying the host does not answer.
fn reports_no_answer(lm: &LibvirtMachine, uri: &str) -> bool {
    let no_answer = format!("no answer from {uri} within 3 s");
    let conditions = machine_conditions(lm);
    condition(conditions, "DomainProvisioningReady")
        .is_some_and(|c| c.status == "False" && c.reason == "HostUnreachable" && c.message.contains(&no_answer))
        && condition(conditions, "Ready").is_some_and(|c| c.status == "False" && c.message.contains(&no_answer))
}

/// Polls `name` until `ready`; fails with the object and the manager's log.
async fn wait_machine(
    w: &World,
    manager: &mut ManagerProcess,
    name: &str,
    what: &str,
    ready: impl Fn(&LibvirtMachine) -> bool,
) -> LibvirtMachine {
    let started = Instant::now();
    loop {
        let lm = w.api::<LibvirtMachine>().get_opt(name).await.unwrap();
        if let Some(lm) = &lm
            && ready(lm)
        {
            return lm.clone();
        }
        if let Ok(Some(status)) = manager.child.try_wait() {
            panic!("the manager exited with {status}:\n{}", manager.log_tail());
        }
        assert!(
            started.elapsed() < WAIT,
            "LibvirtMachine {name}: timed out waiting for {what}; last seen:\n{}\nmanager log:\n{}",
            serde_json::to_string_pretty(&lm).unwrap(),
            manager.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The manager binary for `w`'s namespace with 3 s libvirt timeouts and
/// `extra` flags; returns it and its health port.
fn start_manager(w: &World, extra: &[&str]) -> (ManagerProcess, u16) {
    let [health] = testenv::free_loopback_ports().unwrap();
    let log = w.env.scratch_dir().join(format!("manager-{}.log", w.ns));
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cluster-api-provider-libvirt"))
        .args(["--namespace", &w.ns, "--metrics-bind-address", "0", "--domain-type", "qemu"])
        .args(["--health-probe-bind-address", &format!("127.0.0.1:{health}")])
        .args(["--libvirt-call-timeout", "3s", "--libvirt-connect-timeout", "3s"])
        // The healthy host is the private libvirtd, reached through socket=.
        .arg("--allow-unsafe-uris")
        .args(extra)
        .env("KUBECONFIG", w.env.kubeconfig_path())
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("start the manager binary");
    (ManagerProcess { child, log }, health)
}

/// The private libvirtd's unix socket, from the `socket=` of its URI.
fn daemon_socket(uri: &str) -> std::path::PathBuf {
    uri.split("socket=")
        .nth(1)
        .and_then(|s| s.split('&').next())
        .unwrap_or_else(|| panic!("{uri} has no socket= parameter (the URI of `cargo xtask host up` has)"))
        .into()
}

fn fixture() -> Fixture {
    Fixture {
        network: test_host::NETWORK.into(),
        base_pool: test_host::BASE_POOL.into(),
        domain_pool: test_host::DISK_POOL.into(),
        image: IMAGE.into(),
        image_bytes: IMAGE_BYTES,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_host_stalls_only_its_own_machines_until_it_answers() {
    let _daemon = crate::share_real_daemon().await;
    let healthy_uri = test_host::uri_or_panic();
    let socket = daemon_socket(&healthy_uri);
    let hv = LibvirtHypervisor::connect(&healthy_uri).unwrap_or_else(|e| panic!("{e}"));
    ensure_base_image(&hv, &fixture());

    let w = World::new("hung-manager").await;
    let listener = Listener::start(socket).await;
    let hung_uri = listener.uri();
    let (mut manager, health) = start_manager(&w, &[]);

    cluster_on(&w, "hung", &hung_uri).await;
    cluster_on(&w, "good", &healthy_uri).await;
    machine_on(&w, "hung", "h0").await;
    machine_on(&w, "good", "g0").await;

    wait_machine(&w, &mut manager, "h0", "HostUnreachable with the no-answer message", |lm| {
        reports_no_answer(lm, &hung_uri)
    })
    .await;
    assert_eq!(healthz(health).await, Ok(200), "{}", manager.log_tail());
    wait_machine(&w, &mut manager, "g0", "the machine on the healthy host running", running).await;
    assert_eq!(healthz(health).await, Ok(200), "{}", manager.log_tail());
    // One connect at a time to the hung host, however many reconciles asked.
    assert_eq!(listener.held(), 1, "connections the hung host accepted; manager log:\n{}", manager.log_tail());
    let lm: LibvirtMachine = w.api().get("h0").await.unwrap();
    assert!(reports_no_answer(&lm, &hung_uri), "{lm:#?}");

    // A working libvirtd behind the same address: the machine converges (the
    // retry after a transient failure is 20 s).
    listener.forward();
    let lm = wait_machine(&w, &mut manager, "h0", "the hung host's machine running once it answers", running).await;
    assert!(has(machine_conditions(&lm), "InfrastructureReady", "True", None), "{lm:#?}");
    w.wait_for::<LibvirtCluster>("hung-lc", "the hung host's infrastructure checked", |lc| {
        has(cluster_conditions(lc), "InfrastructureReady", "True", None)
    })
    .await;

    // Both machines are removed from the host again.
    for name in ["h0", "g0"] {
        w.delete::<LibvirtMachine>(name).await;
    }
    for name in ["h0", "g0"] {
        w.wait_gone::<LibvirtMachine>(name).await;
    }
    assert_eq!(healthz(health).await, Ok(200), "{}", manager.log_tail());
}

/// A TCP forwarder to a unix socket that can be frozen: while frozen it
/// keeps every connection open and passes nothing either way, as a libvirtd
/// that stopped answering in the middle of a session (calls, keepalive and
/// `virConnectClose` alike wait for replies that never come).
struct Relay {
    port: u16,
    frozen: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(upstream: std::path::PathBuf) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let (frozen, watch) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                let server = UnixStream::connect(&upstream)
                    .await
                    .unwrap_or_else(|e| panic!("connecting to {}: {e}", upstream.display()));
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                connections.spawn(Self::pass(client_read, server_write, watch.clone()));
                connections.spawn(Self::pass(server_read, client_write, watch.clone()));
            }
        });
        Self { port, frozen, task }
    }

    /// Copies `from` to `to` while not frozen; while frozen it holds both
    /// ends and copies nothing (what it read is passed on after a thaw).
    async fn pass(
        mut from: impl tokio::io::AsyncRead + Unpin,
        mut to: impl tokio::io::AsyncWrite + Unpin,
        mut frozen: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if frozen.wait_for(|f| !*f).await.is_err() {
                return;
            }
            let n = tokio::select! {
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                _ = frozen.wait_for(|f| *f) => continue,
            };
            if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    fn uri(&self) -> String {
        format!("qemu+tcp://127.0.0.1:{}/system", self.port)
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `spec.renewTime` of the manager's leader Lease in `w`'s namespace.
async fn lease_renewed(w: &World) -> Option<k8s_openapi::jiff::Timestamp> {
    let lease = w
        .api::<k8s_openapi::api::coordination::v1::Lease>()
        .get_opt("cluster-api-provider-libvirt-leader")
        .await
        .unwrap();
    lease.and_then(|l| l.spec).and_then(|s| s.renew_time).map(|t| t.0)
}

/// The manager's runtime has one worker thread (`--runtime-workers 1`, as in
/// the shipped Deployment), and a host stops answering while the manager
/// holds a connection to it: the calls on it time out, keepalive finds it
/// dead and the connection is dropped, whose close (and domain event
/// deregistration) waits on the host. None of that may run on the runtime
/// thread: /healthz answers within 2 s throughout, and the leader Lease is
/// renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_on_a_hung_host_stalls_neither_healthz_nor_the_lease() {
    const WATCH: Duration = Duration::from_secs(45);
    let _daemon = crate::share_real_daemon().await;
    let uri = test_host::uri_or_panic();
    let hv = LibvirtHypervisor::connect(&uri).unwrap_or_else(|e| panic!("{e}"));
    ensure_base_image(&hv, &fixture());

    let w = World::new("hung-close").await;
    let relay = Relay::start(daemon_socket(&uri)).await;
    let relay_uri = relay.uri();
    let (mut manager, health) =
        start_manager(&w, &["--runtime-workers", "1", "--leader-elect", "--leader-election-namespace", &w.ns]);
    cluster_on(&w, "frozen", &relay_uri).await;
    machine_on(&w, "frozen", "f0").await;
    wait_machine(&w, &mut manager, "f0", "the machine running through the relay", running).await;
    let before = lease_renewed(&w).await.expect("the manager leads, so its Lease has a renewTime");

    relay.freeze(true);
    // A call on the frozen connection: deleting the machine.
    w.delete::<LibvirtMachine>("f0").await;
    let started = Instant::now();
    while started.elapsed() < WATCH {
        let asked = Instant::now();
        let answer = healthz(health).await;
        assert_eq!(
            answer,
            Ok(200),
            "/healthz {:.1} s after the host stopped answering; manager log:\n{}",
            started.elapsed().as_secs_f64(),
            manager.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500).saturating_sub(asked.elapsed())).await;
    }
    let log = std::fs::read_to_string(&manager.log).unwrap();
    assert!(
        log.lines().any(|l| l.contains(&relay_uri) && l.contains("the next call reconnects")),
        "the connection to the frozen host was never dropped, so nothing was tested; manager log:\n{}",
        manager.log_tail()
    );
    let after = lease_renewed(&w).await.expect("the Lease is still there");
    assert!(after > before, "the Lease was not renewed while the host hung ({before} then {after})");
    if let Ok(Some(status)) = manager.child.try_wait() {
        panic!("the manager exited with {status}:\n{}", manager.log_tail());
    }

    // The host answers again: the machine's deletion completes.
    relay.freeze(false);
    w.wait_gone::<LibvirtMachine>("f0").await;
    assert_eq!(healthz(health).await, Ok(200), "{}", manager.log_tail());
}
