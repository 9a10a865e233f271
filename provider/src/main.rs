//! The manager: runs the LibvirtCluster and LibvirtMachine controllers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use capl::controller::{self, Context, Settings, metrics::Metrics};
use capl_host::domain_xml::DomainTypePreference;
use capl_host::hypervisor::connections::{
    Connections, DEFAULT_MAX_CALL_THREADS, DEFAULT_MAX_CALLS_PER_HOST, DEFAULT_MAX_CONNECT_THREADS,
};
use capl_host::uri_policy::UriPolicy;
use clap::{Parser, ValueEnum};
use tokio::sync::watch;

#[derive(Parser, Debug)]
#[command(name = "cluster-api-provider-libvirt", version, about = "Cluster API infrastructure provider for libvirt")]
struct Flags {
    /// Watch only this namespace; "*" or empty watches all namespaces.
    #[arg(long, default_value = "*")]
    namespace: String,
    /// Address of the Prometheus metrics endpoint (/metrics); "0" turns it off.
    #[arg(long, default_value = ":8080")]
    metrics_bind_address: String,
    /// Address of /healthz and /readyz.
    #[arg(long, default_value = ":8081")]
    health_probe_bind_address: String,
    /// Run the controllers only while holding a coordination.k8s.io Lease.
    #[arg(long)]
    leader_elect: bool,
    /// Namespace of the leader election Lease (default: $POD_NAMESPACE, else the kubeconfig's).
    #[arg(long)]
    leader_election_namespace: Option<String>,
    /// Reconciles running at once, per controller.
    #[arg(long, default_value_t = 10)]
    concurrency: u16,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// With --hypervisor sim: a /22 network (10.20.0.0/22, 1,009 DHCP addresses) instead of
    /// the /24 with 100, for runs with hundreds of machines (the benchmarks).
    #[arg(long)]
    sim_large_network: bool,
    /// Which hypervisor backend to talk to: real libvirt, or an embedded simulated host (demos, tests).
    #[arg(long, value_enum, default_value_t = Backend::Libvirt)]
    hypervisor: Backend,
    /// With --hypervisor sim: the URI the simulated host answers on.
    #[arg(long, default_value = "qemu:///system")]
    sim_uri: String,
    /// With --hypervisor sim: one more simulated host, at this URI, prepared
    /// like the first (the /24 network); repeat for more. With a metrics
    /// address, `POST /sim/fault` takes "<uri> <fault>" for any of them (the
    /// benchmarks' faults: see `capl_host::sim_host::inject_fault`).
    #[arg(long)]
    sim_extra_host: Vec<String>,
    /// Domain type: kvm, qemu, or auto (kvm when the host offers it).
    #[arg(long, default_value = "auto")]
    domain_type: String,
    /// Also log each domain's serial console to <dir>/<domain>-console.log on the libvirt host.
    #[arg(long)]
    console_log_dir: Option<String>,
    /// Accept every libvirt URI: the ext transport, command=, socket=, name=, no_verify=1,
    /// known_hosts_verify=ignore and files outside the credentials directories. Only when
    /// everyone who may create a LibvirtCluster is trusted with the manager's user.
    #[arg(long)]
    allow_unsafe_uris: bool,
    /// A directory the URIs' pkipath=, keyfile= and known_hosts= may point into, with the
    /// namespaces whose LibvirtClusters may use it: DIR=team-a,team-b, DIR=* for every
    /// namespace, DIR alone for none (repeatable).
    #[arg(
        long = "credentials-dir",
        default_value = capl_host::uri_policy::DEFAULT_CREDENTIALS_DIR,
        value_parser = capl_host::uri_policy::CredentialsDir::parse
    )]
    credentials_dirs: Vec<capl_host::uri_policy::CredentialsDir>,
    /// Where the manager writes the credentials of LibvirtClusters' credentialsRef Secrets
    /// (mode 0700/0600): a private, memory-backed directory (an emptyDir with medium Memory).
    /// URIs may not point into it.
    #[arg(long, default_value = capl_host::credentials::DEFAULT_SCRATCH_DIR)]
    credentials_scratch_dir: std::path::PathBuf,
    /// Concurrent libvirt calls per host.
    #[arg(long, default_value_t = DEFAULT_MAX_CALLS_PER_HOST)]
    max_calls_per_host: usize,
    /// How long one host operation (a few libvirt calls) may take before the
    /// machine reports HostUnreachable "no answer from <uri> within N s":
    /// e.g. 30s, 500ms, 2m.
    #[arg(long, value_parser = parse_timeout, default_value = "30s")]
    libvirt_call_timeout: Duration,
    /// How long opening a libvirt connection may take before callers are told the host does not answer.
    #[arg(long, value_parser = parse_timeout, default_value = "15s")]
    libvirt_connect_timeout: Duration,
    /// libvirt connects that may run at once over all hosts (a host that
    /// accepts and never answers holds one until it closes the connection).
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECT_THREADS)]
    max_connect_threads: usize,
    /// libvirt calls that may run at once over all hosts, counting calls given
    /// up on that have not returned.
    #[arg(long, default_value_t = DEFAULT_MAX_CALL_THREADS)]
    max_call_threads: usize,
    /// Threads that run reconciles and serve the probes (tokio's workers). Set
    /// explicitly: tokio would otherwise start as many as the CPU limit
    /// allows, one under the shipped 500m limit.
    #[arg(long, default_value_t = 4)]
    runtime_workers: usize,
    /// How often a running, healthy machine is looked at on its host without a
    /// reason: its domain's lifecycle events bring it back at once; this only
    /// covers events that were lost. E.g. 10m, 1h.
    #[arg(long, value_parser = parse_timeout, default_value = "10m")]
    resync_interval: Duration,
    /// Base images named by URL (spec.imageURL): how long opening the TCP
    /// connection to the image's server may take.
    #[arg(long, value_parser = parse_timeout, default_value = "30s")]
    image_connect_timeout: Duration,
    /// Base images named by URL: a download that receives no byte for this
    /// long (its response's head included) fails and is tried again.
    #[arg(long, value_parser = parse_timeout, default_value = "60s")]
    image_idle_timeout: Duration,
    /// Base images named by URL: the largest image downloaded, e.g. 64Gi,
    /// 500Mi or a number of bytes.
    #[arg(long, value_parser = parse_size, default_value = "64Gi")]
    image_max_size: u64,
    /// Base images named by URL: delete a downloaded image when the last
    /// machine on it is deleted and no volume of the host is an overlay on
    /// it. Off: downloaded images stay until removed by hand.
    #[arg(long)]
    image_remove_unused: bool,
}

/// A size flag: bytes, or a number with Ki, Mi, Gi or Ti; above zero.
fn parse_size(value: &str) -> Result<u64, String> {
    let value = value.trim();
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: u64 = number.parse().map_err(|_| format!("{value:?} is not a size such as 64Gi, 500Mi or 1048576"))?;
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(format!("{value:?}: the unit must be Ki, Mi, Gi or Ti (or none, for bytes)")),
    };
    match number.checked_mul(factor) {
        Some(0) => Err("a size must be above zero".into()),
        Some(size) => Ok(size),
        None => Err(format!("{value:?} is too large")),
    }
}

/// A duration flag: a number with the unit ms, s, m or h ("30s", "500ms", "2m", "1h"); above zero.
fn parse_timeout(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let split = value.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("{value:?} is not a duration such as 30s, 500ms or 2m"))?;
    let secs = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("{value:?} has no unit: write e.g. 30s, 500ms or 2m")),
    };
    let timeout = Duration::try_from_secs_f64(secs).map_err(|e| format!("{value:?}: {e}"))?;
    if timeout.is_zero() {
        return Err("a timeout must be above zero".into());
    }
    Ok(timeout)
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Backend {
    Libvirt,
    Sim,
}

fn parse_addr(value: &str) -> Result<Option<SocketAddr>> {
    if value == "0" || value.is_empty() {
        return Ok(None);
    }
    let full = if value.starts_with(':') { format!("0.0.0.0{value}") } else { value.to_string() };
    Ok(Some(full.parse().with_context(|| format!("bind address {value:?} is not host:port or :port"))?))
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

#[derive(Clone)]
struct Probe {
    metrics: Metrics,
    ready: watch::Receiver<bool>,
}

async fn serve(addr: SocketAddr, router: Router) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    tracing::info!(%addr, "serving");
    axum::serve(listener, router).await?;
    Ok(())
}

/// Whether the manager can still make progress: host calls, credential
/// writes and the event loop's work all run on tokio's blocking pool, so a
/// pool whose every thread is stuck stops them all. `Err` says so when no
/// thread picked up a no-op within `within`.
async fn blocking_pool_answers(within: Duration) -> Result<(), String> {
    match tokio::time::timeout(within, tokio::task::spawn_blocking(|| ())).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("the blocking pool failed a no-op: {e}")),
        Err(_) => Err(format!(
            "no thread of the blocking pool ran a no-op within {} s: every thread is stuck, and host calls cannot run",
            within.as_secs_f64()
        )),
    }
}

/// How long the process waits, after the controllers stopped, for work still
/// on the blocking pool (libvirt calls) before it exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(8);

/// tokio's blocking pool: libvirt calls and connects (bounded well below it
/// by --max-connect-threads and --max-call-threads), file writes of
/// credentials, and the liveness probe's own check.
const BLOCKING_THREADS: usize = 512;

/// How long /healthz waits for a thread of the blocking pool.
const HEALTH_PROBE_WAIT: Duration = Duration::from_secs(5);

fn main() -> Result<()> {
    let flags = Flags::parse();
    anyhow::ensure!(flags.runtime_workers > 0, "--runtime-workers must be at least 1");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(flags.runtime_workers)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()?;
    let result = runtime.block_on(run(flags));
    // Dropping the runtime would wait for every blocking task without bound;
    // a libvirt call stuck on a dead host must not keep the Pod terminating.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    result
}

async fn run(flags: Flags) -> Result<()> {
    init_logging(flags.log_format);
    let domain_type = DomainTypePreference::parse(&flags.domain_type).map_err(anyhow::Error::msg)?;

    #[cfg(feature = "sim")]
    let mut sim_hosts = std::collections::BTreeMap::new();
    #[cfg(not(feature = "sim"))]
    anyhow::ensure!(
        flags.sim_extra_host.is_empty(),
        "--sim-extra-host: this build has no simulated host (build it with the `sim` feature)"
    );
    let connector: Arc<dyn capl_host::hypervisor::Connector> = match flags.hypervisor {
        Backend::Libvirt => Arc::new(capl_host::hypervisor::libvirt::LibvirtConnector::default()),
        #[cfg(not(feature = "sim"))]
        Backend::Sim => anyhow::bail!(
            "--hypervisor sim: this build has no simulated host (it is built with the `sim` feature, e.g. \
             `cargo build -p cluster-api-provider-libvirt --features sim`); use --hypervisor libvirt"
        ),
        #[cfg(feature = "sim")]
        Backend::Sim => {
            let host = if flags.sim_large_network {
                capl_host::sim_host::register_large(&flags.sim_uri)
            } else {
                capl_host::sim_host::register(&flags.sim_uri)
            }
            .context("building the simulated host")?;
            tracing::info!(uri = %flags.sim_uri, network = capl_host::sim_host::NETWORK, "simulated libvirt host ready");
            // They live as long as the process.
            sim_hosts.insert(flags.sim_uri.clone(), host);
            for uri in &flags.sim_extra_host {
                let host = capl_host::sim_host::register(uri)
                    .with_context(|| format!("building the simulated host {uri} (--sim-extra-host)"))?;
                tracing::info!(%uri, "simulated libvirt host ready");
                sim_hosts.insert(uri.clone(), host);
            }
            Arc::new(capl_host::hypervisor::sim::SimConnector)
        }
    };
    let metrics = Metrics::default();
    let connector = Arc::new(capl::counted_host::CountingConnector::new(connector, metrics.clone()));
    anyhow::ensure!(flags.max_calls_per_host > 0, "--max-calls-per-host must be at least 1");
    anyhow::ensure!(
        flags.max_connect_threads > 0 && flags.max_call_threads > 0,
        "--max-connect-threads and --max-call-threads must be at least 1"
    );
    anyhow::ensure!(
        flags.max_connect_threads + flags.max_call_threads <= BLOCKING_THREADS / 2,
        "--max-connect-threads {} and --max-call-threads {} add up to more than {}, half of the blocking pool: \
         hosts that do not answer could then starve the manager's other work; lower them",
        flags.max_connect_threads,
        flags.max_call_threads,
        BLOCKING_THREADS / 2
    );
    let connections = Arc::new(
        Connections::new(connector, flags.max_calls_per_host)
            .with_timeouts(flags.libvirt_call_timeout, flags.libvirt_connect_timeout)
            .with_thread_limits(flags.max_connect_threads, flags.max_call_threads),
    );

    let client =
        kube::Client::try_default().await.context("connecting to Kubernetes (KUBECONFIG or in-cluster config)")?;
    for dir in flags.credentials_dirs.iter().map(|d| &d.path) {
        anyhow::ensure!(
            !flags.credentials_scratch_dir.starts_with(dir) && !dir.starts_with(&flags.credentials_scratch_dir),
            "--credentials-scratch-dir {} and --credentials-dir {} overlap: a URI could then name the files of \
             another cluster's Secret; use separate directories",
            flags.credentials_scratch_dir.display(),
            dir.display()
        );
    }
    match capl_host::credentials::CredentialStore::remove_previous(&flags.credentials_scratch_dir) {
        Ok(0) => {}
        Ok(removed) => {
            tracing::info!(removed, dir = %flags.credentials_scratch_dir.display(), "removed credentials an earlier process wrote")
        }
        Err(e) => {
            tracing::warn!(error = %e, dir = %flags.credentials_scratch_dir.display(), "cannot remove credentials an earlier process wrote")
        }
    }
    let settings = Settings {
        namespace: watched_namespace(&flags.namespace),
        domain_type,
        console_log_dir: flags.console_log_dir.clone(),
        concurrency: flags.concurrency,
        uri_policy: UriPolicy {
            allow_unsafe: flags.allow_unsafe_uris,
            credentials_dirs: flags.credentials_dirs.clone(),
        },
        credentials_scratch_dir: flags.credentials_scratch_dir.clone(),
        resync_interval: flags.resync_interval,
        image_downloads: capl::image::DownloadSettings {
            connect_timeout: flags.image_connect_timeout,
            idle_timeout: flags.image_idle_timeout,
            max_bytes: flags.image_max_size,
            remove_unused: flags.image_remove_unused,
            ..Default::default()
        },
        ..Settings::default()
    };
    let ctx = Arc::new(Context::new(client.clone(), connections, settings, metrics.clone()));

    // Ready means "able to serve": the API server answers. Leadership is the
    // Lease's business, so a standby replica is Ready too and a rolling update
    // (new Pod Ready first, then the old one stopped and its Lease handed over)
    // completes.
    let (ready_tx, ready_rx) = watch::channel(false);
    tokio::spawn(mark_ready_when_api_answers(client.clone(), ready_tx));
    let probe = Probe { metrics: metrics.clone(), ready: ready_rx };
    if let Some(addr) = parse_addr(&flags.metrics_bind_address)? {
        let router = Router::new()
            .route("/metrics", get(|State(p): State<Probe>| async move { p.metrics.encode() }))
            .with_state(probe.clone());
        // What the simulated host holds, for leak checks: it lives in this process only.
        #[cfg(feature = "sim")]
        let router = if matches!(flags.hypervisor, Backend::Sim) {
            let (uri, extra) = (flags.sim_uri.clone(), flags.sim_extra_host.clone());
            let hosts = Arc::new(sim_hosts);
            router
                .route(
                    "/sim/inventory",
                    get(move || {
                        let (uri, extra) = (uri.clone(), extra.clone());
                        async move {
                            let list = move || {
                                let mut out = sim_inventory(&uri);
                                for uri in &extra {
                                    out.extend(sim_inventory(uri).lines().map(|l| format!("{uri} {l}\n")));
                                }
                                out
                            };
                            tokio::task::spawn_blocking(list).await.unwrap_or_default()
                        }
                    }),
                )
                .route("/sim/fault", axum::routing::post(move |body: String| async move { sim_fault(&hosts, &body) }))
        } else {
            router
        };
        tokio::spawn(async move { serve(addr, router).await.map_err(|e| tracing::error!(%e, "metrics server")) });
    }
    if let Some(addr) = parse_addr(&flags.health_probe_bind_address)? {
        let router = Router::new()
            .route(
                "/healthz",
                get(|| async {
                    match blocking_pool_answers(HEALTH_PROBE_WAIT).await {
                        Ok(()) => (StatusCode::OK, "ok".to_string()),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }),
            )
            .route(
                "/readyz",
                get(|State(p): State<Probe>| async move {
                    if *p.ready.borrow() {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "the Kubernetes API server has not answered yet")
                    }
                }),
            )
            .with_state(probe);
        tokio::spawn(async move { serve(addr, router).await.map_err(|e| tracing::error!(%e, "health server")) });
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    let shutdown = {
        let rx = stop_rx.clone();
        async move {
            let mut rx = rx;
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));

    if flags.leader_elect {
        let namespace = flags
            .leader_election_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| client.default_namespace().to_string());
        let manager =
            kube_lease_manager::LeaseManagerBuilder::new(client.clone(), "cluster-api-provider-libvirt-leader")
                .with_namespace(&namespace)
                .with_identity(leader_identity())
                .build()
                .await
                .context("setting up leader election")?;
        let (mut leading, task) = manager.watch().await;
        tracing::info!(%namespace, "waiting for leadership (ready as a standby)");
        let mut stop = stop_rx.clone();
        loop {
            if *leading.borrow_and_update() {
                break;
            }
            tokio::select! {
                changed = leading.changed() => changed.context("leader election stopped")?,
                _ = stop.wait_for(|s| *s) => return Ok(()),
            }
        }
        tracing::info!("leading");
        let lost = tokio::select! {
            () = within_grace(controller::run(ctx, shutdown), stop_rx.clone()) => false,
            _ = leading.wait_for(|l| !*l) => true,
        };
        if lost {
            tracing::error!("lost leadership; exiting so that another replica takes over");
            std::process::exit(1);
        }
        // Hand the Lease over at once rather than letting it expire.
        drop(leading);
        match tokio::time::timeout(SHUTDOWN_GRACE, task).await {
            Ok(Ok(Ok(manager))) => {
                if let Err(err) = manager.release().await {
                    tracing::warn!(%err, "could not release the leader Lease; it expires on its own");
                }
            }
            _ => tracing::warn!("leader election did not stop in time; the Lease expires on its own"),
        }
    } else {
        within_grace(controller::run(ctx, shutdown), stop_rx.clone()).await;
    }
    Ok(())
}

/// Runs the controllers; once shutdown was asked for, waits at most
/// [`SHUTDOWN_GRACE`] for them to finish the reconciles in flight. (The
/// controllers' own graceful shutdown can wait much longer, e.g. on watches
/// that are backing off.)
async fn within_grace(controllers: impl std::future::Future<Output = ()>, mut stop: watch::Receiver<bool>) {
    tokio::pin!(controllers);
    tokio::select! {
        () = &mut controllers => return,
        _ = stop.wait_for(|s| *s) => {}
    }
    if tokio::time::timeout(SHUTDOWN_GRACE, controllers).await.is_err() {
        tracing::warn!(grace = ?SHUTDOWN_GRACE, "controllers did not stop within the grace period; exiting anyway");
    }
}

/// This replica's name in the Lease: `<hostname>_<pid>_<start time>` (the
/// hostname is the Pod name in a cluster), so an operator reading the Lease's
/// `holderIdentity` sees which Pod leads.
fn leader_identity() -> String {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{hostname}_{}_{:x}", std::process::id(), started.as_nanos())
}

/// The namespace to watch: `None` (every namespace) for "*" or "".
fn watched_namespace(flag: &str) -> Option<String> {
    match flag.trim() {
        "" | "*" => None,
        namespace => Some(namespace.to_string()),
    }
}

/// Sets `ready` once the API server answers a request (each try bounded).
async fn mark_ready_when_api_answers(client: kube::Client, ready: watch::Sender<bool>) {
    const TRY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
    loop {
        match tokio::time::timeout(TRY_TIMEOUT, client.apiserver_version()).await {
            Ok(Ok(_)) => {
                let _ = ready.send(true);
                return;
            }
            Ok(Err(err)) => tracing::warn!(%err, "the Kubernetes API server did not answer; not ready yet"),
            Err(_) => tracing::warn!(timeout = ?TRY_TIMEOUT, "no answer from the Kubernetes API server; not ready yet"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

/// `POST /sim/fault` "<uri> <fault>": applies the fault to that simulated host.
#[cfg(feature = "sim")]
fn sim_fault(
    hosts: &std::collections::BTreeMap<String, capl_host::sim_host::SimHost>,
    body: &str,
) -> (StatusCode, String) {
    let Some((uri, fault)) = body.trim().split_once(' ') else {
        return (StatusCode::BAD_REQUEST, format!("expected \"<uri> <fault>\", got {body:?}"));
    };
    let Some(host) = hosts.get(uri) else {
        let known: Vec<&String> = hosts.keys().collect();
        return (StatusCode::NOT_FOUND, format!("no simulated host {uri:?}; there are {known:?}"));
    };
    match capl_host::sim_host::inject_fault(host, fault) {
        Ok(done) => {
            tracing::warn!(%uri, %fault, "simulated fault: {done}");
            (StatusCode::OK, done)
        }
        Err(why) => (StatusCode::BAD_REQUEST, why),
    }
}

/// The simulated host's domains, volumes of the domain pool and DHCP hosts
/// of the network, one `<kind> <name>` a line (the `/sim/inventory` route,
/// which lists the extra hosts' after it, each line led by the host's URI).
#[cfg(feature = "sim")]
fn sim_inventory(uri: &str) -> String {
    use capl_host::hypervisor::{HostAdmin, Hypervisor};
    let Ok(host) = capl_host::hypervisor::sim::SimHypervisor::connect(uri) else {
        return "error cannot connect to the simulated host\n".into();
    };
    let mut out = String::new();
    for domain in host.domain_list().unwrap_or_default() {
        out.push_str(&format!("domain {domain}\n"));
    }
    for volume in host.volume_list(capl_host::sim_host::DOMAIN_POOL).unwrap_or_default() {
        out.push_str(&format!("volume {volume}\n"));
    }
    let xml = host.network_xml(capl_host::sim_host::NETWORK).unwrap_or_default();
    let hosts = capl_host::network_xml::parse_network(&xml).ok().and_then(|n| n.ipv4).map(|ip| ip.hosts);
    for entry in hosts.unwrap_or_default() {
        let ip = entry.ip.map(|ip| ip.to_string()).unwrap_or_default();
        out.push_str(&format!("dhcp_host {} {ip}\n", entry.name.unwrap_or_default()));
    }
    out
}

#[cfg(test)]
mod tests {
    use capl_host::hypervisor::connections::{DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT};

    use super::*;

    #[test]
    fn sizes_take_a_binary_unit_or_bytes() {
        assert_eq!(parse_size("64Gi"), Ok(64 << 30));
        assert_eq!(parse_size("500Mi"), Ok(500 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("0").unwrap_err().contains("above zero"));
        assert!(parse_size("10GB").unwrap_err().contains("Ki, Mi, Gi or Ti"));
    }

    /// `--credentials-dir` as an operator writes it: the default directory is
    /// granted to no namespace, `DIR=NAMESPACES` grants it, and a value that is
    /// not a directory and namespaces stops the manager with the fix.
    #[test]
    fn credentials_directories_name_the_namespaces_that_may_use_them() {
        use capl_host::uri_policy::{CredentialsDir, Namespaces};
        let flags = Flags::try_parse_from(["manager"]).unwrap();
        assert_eq!(flags.credentials_dirs, [CredentialsDir::new("/etc/capl", Namespaces::None)]);
        let flags = Flags::try_parse_from([
            "manager",
            "--credentials-dir=/etc/capl/kvm1=team-a,team-b",
            "--credentials-dir",
            "/etc/capl/shared=*",
        ])
        .unwrap();
        assert_eq!(
            flags.credentials_dirs,
            [
                CredentialsDir::new("/etc/capl/kvm1", Namespaces::Only(vec!["team-a".into(), "team-b".into()])),
                CredentialsDir::new("/etc/capl/shared", Namespaces::All),
            ]
        );
        let err = Flags::try_parse_from(["manager", "--credentials-dir=/etc/capl=Team A"]).unwrap_err().to_string();
        assert!(err.contains("\"Team A\" is not a namespace name"), "{err}");
    }

    #[test]
    fn timeouts_take_a_unit_and_must_be_above_zero() {
        assert_eq!(parse_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_timeout("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_timeout("6h"), Ok(Duration::from_secs(6 * 3600)));
        assert!(parse_timeout("30").unwrap_err().contains("no unit"));
        assert!(parse_timeout("0s").unwrap_err().contains("above zero"));
        assert!(parse_timeout("soon").is_err());
    }

    /// /healthz fails once every blocking thread is stuck (as libvirt calls
    /// on hosts that never answer would leave them), and passes again when
    /// one returns.
    #[test]
    fn the_liveness_check_fails_while_every_blocking_thread_is_stuck() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let within = Duration::from_millis(300);
            assert_eq!(blocking_pool_answers(within).await, Ok(()));
            let (release, held) = std::sync::mpsc::channel::<()>();
            let held = Arc::new(std::sync::Mutex::new(held));
            let stuck: Vec<_> = (0..2)
                .map(|_| {
                    let held = held.clone();
                    tokio::task::spawn_blocking(move || {
                        let _ = held.lock().unwrap().recv();
                    })
                })
                .collect();
            let why = blocking_pool_answers(within).await.unwrap_err();
            assert!(why.contains("every thread is stuck"), "{why}");
            release.send(()).unwrap();
            release.send(()).unwrap();
            for task in stuck {
                task.await.unwrap();
            }
            assert_eq!(blocking_pool_answers(within).await, Ok(()));
        });
    }

    #[test]
    fn the_default_thread_limits_are_the_connection_layer_defaults() {
        let flags = Flags::parse_from(["cluster-api-provider-libvirt"]);
        assert_eq!(flags.max_connect_threads, DEFAULT_MAX_CONNECT_THREADS);
        assert_eq!(flags.max_call_threads, DEFAULT_MAX_CALL_THREADS);
        assert!(flags.max_connect_threads + flags.max_call_threads <= BLOCKING_THREADS / 2);
    }

    #[test]
    fn the_default_timeouts_are_the_connection_layer_defaults() {
        let flags = Flags::parse_from(["cluster-api-provider-libvirt"]);
        assert_eq!(flags.libvirt_call_timeout, DEFAULT_CALL_TIMEOUT);
        assert_eq!(flags.libvirt_connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(flags.resync_interval, capl::controller::DEFAULT_RESYNC_INTERVAL);
        let images = capl::image::DownloadSettings::default();
        assert_eq!(flags.image_connect_timeout, images.connect_timeout);
        assert_eq!(flags.image_idle_timeout, images.idle_timeout);
        assert_eq!(flags.image_max_size, images.max_bytes);
        assert_eq!(flags.image_remove_unused, images.remove_unused);
    }
}
