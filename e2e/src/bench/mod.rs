//! `capl-e2e bench <name>`, started by `cargo xtask bench`: what the provider
//! costs at scale, measured through the real parts.
//!
//! - [`scale`]: 1,000 machines on the embedded simulated host, through the
//!   local kube-apiserver with CAPI core: created at once, then deleted.
//! - [`steady`]: the same 1,000 left alone: what they cost per minute.
//! - [`overhead`]: 20 machines on the private libvirtd, each create step
//!   beside the same step done with virsh.
//! - [`contention`]: 100 machines at once on one real network.
//! - [`floor`]: the scale workload with no manager, the benchmark answering
//!   each LibvirtMachine with the least a provider must write: what CAPI
//!   core and the API server alone cost, the floor under `scale`.
//!
//! Each prints a table and writes `<out>/<name>.json`. Nothing here asserts a
//! time: the figures are printed; only correctness (leaks, duplicate
//! addresses) makes a run fail.

pub mod contention;
pub mod floor;
pub mod overhead;
pub mod scale;
pub mod steady;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::Client;
use serde_json::Value;
use testenv::{CapiManager, CapiOptions, TestEnv};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::objects::{self, Kind, Placement};
use crate::harness::provider_process::ProviderProcess;
use crate::repo_root;

/// Namespaces the benchmarks create start with this (and so do their
/// domains, volumes and DHCP hosts on a real host).
pub const NAME_PREFIX: &str = "capl-bench-";

/// Creates in flight at once while a benchmark makes its objects.
const CREATE_CONCURRENCY: usize = 64;

/// The local control plane the scale benchmarks run against: kube-apiserver,
/// etcd and CAPI core with its webhooks, and this cluster's CRDs.
pub struct ControlPlane {
    // Fields drop in order: CAPI, then the API server.
    pub capi: CapiManager,
    pub env: TestEnv,
}

impl ControlPlane {
    pub async fn start() -> Result<Self> {
        let env = TestEnv::start().await.context("starting the local control plane")?;
        let capi = env.start_capi(CapiOptions::new()).await.context("starting CAPI core")?;
        env.install_crds_from_dir(&repo_root().join("config/crd/bases")).await?;
        Ok(Self { capi, env })
    }

    pub fn client(&self) -> Client {
        self.env.client()
    }

    /// kube-apiserver's request counters now (every client: this benchmark, CAPI core, the manager).
    pub async fn api_requests(&self) -> Result<ApiRequests> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        let text = self.client().request_text(request).await.context("reading kube-apiserver's /metrics")?;
        Ok(ApiRequests::parse(&text))
    }

    /// CPU seconds so far of each process of the control plane, of this
    /// benchmark runner, and of `others` (name, pid).
    pub fn cpu_seconds(&self, others: &[(&'static str, u32)]) -> BTreeMap<String, f64> {
        let mut processes: Vec<(&str, u32)> = self.env.pids().to_vec();
        processes.extend(self.capi.pids());
        processes.extend(others.iter().copied());
        processes.push(("benchmark runner", std::process::id()));
        processes
            .into_iter()
            .filter_map(|(name, pid)| Some((name.to_string(), ProcessStats::of(pid).ok()?.cpu_seconds)))
            .collect()
    }
}

/// "name seconds" of `after - before`, largest first, with the sum.
pub fn cpu_breakdown(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> (String, BTreeMap<String, f64>) {
    let used: BTreeMap<String, f64> =
        after.iter().map(|(name, s)| (name.clone(), s - before.get(name).copied().unwrap_or(0.0))).collect();
    let mut sorted: Vec<(&String, &f64)> = used.iter().collect();
    sorted.sort_by(|a, b| b.1.total_cmp(a.1));
    let total: f64 = used.values().sum();
    let parts = sorted.iter().map(|(name, s)| format!("{name} {s:.1}")).collect::<Vec<_>>().join(", ");
    (format!("{total:.1} in all: {parts}"), used)
}

/// The control plane and the manager, started with `provider_args` plus a metrics endpoint.
pub struct BenchStack {
    // Fields drop in order: the provider, then the control plane.
    pub provider: ProviderProcess,
    pub plane: ControlPlane,
    pub metrics_port: u16,
    pub work_dir: PathBuf,
}

impl BenchStack {
    pub async fn start(provider_binary: &Path, mut provider_args: Vec<String>) -> Result<Self> {
        let work_dir = std::env::temp_dir().join(format!("capl-bench-{}", std::process::id()));
        std::fs::create_dir_all(&work_dir)?;
        let plane = ControlPlane::start().await?;
        let metrics_port = free_port()?;
        provider_args.push(format!("--metrics-bind-address=127.0.0.1:{metrics_port}"));
        let provider = ProviderProcess::start(
            provider_binary,
            provider_args,
            plane.env.kubeconfig_path(),
            &work_dir.join("provider.log"),
        )
        .await?;
        Ok(Self { provider, plane, metrics_port, work_dir })
    }

    pub fn client(&self) -> Client {
        self.plane.client()
    }

    /// The manager's metrics now.
    pub async fn metrics(&self) -> Result<Metrics> {
        Ok(Metrics(http_get(self.metrics_port, "/metrics").await?))
    }

    fn manager_pid(&self) -> Result<u32> {
        self.provider.pid().context("the manager is not running")
    }

    /// The manager's peak and current memory and its CPU time so far.
    pub fn process(&self) -> Result<ProcessStats> {
        ProcessStats::of(self.manager_pid()?)
    }

    /// CPU seconds so far of every process of the benchmark, the manager's included.
    pub fn cpu_seconds(&self) -> Result<BTreeMap<String, f64>> {
        Ok(self.plane.cpu_seconds(&[("manager", self.manager_pid()?)]))
    }

    /// kube-apiserver's request counters now (every client: this benchmark, CAPI core, the manager).
    pub async fn api_requests(&self) -> Result<ApiRequests> {
        self.plane.api_requests().await
    }
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

pub async fn http_get(port: u16, path: &str) -> Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").context("not an HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

/// The text exposition of the manager's `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Metrics(pub String);

impl Metrics {
    /// The sum of the samples of `name` whose labels include all of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        samples(&self.0, name)
            .filter(|(l, _)| labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map(|(_, v)| v)
            .sum()
    }

    /// The samples of `name` summed by the value of `label`.
    pub fn by_label(&self, name: &str, label: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (labels, value) in samples(&self.0, name) {
            *out.entry(labels.get(label).cloned().unwrap_or_default()).or_insert(0.0) += value;
        }
        out
    }

    pub fn reconciles(&self) -> f64 {
        self.sum("capl_reconciles_total", &[("controller", "libvirtmachine")])
    }

    pub fn libvirt_calls(&self) -> f64 {
        self.sum("capl_libvirt_calls_total", &[])
    }

    pub fn connections_opened(&self) -> f64 {
        self.sum("capl_libvirt_connections_opened_total", &[])
    }
}

/// `name{labels} value` lines of a Prometheus text exposition.
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (BTreeMap<String, String>, f64)> + 'a {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(move |line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, labels) = match series.split_once('{') {
            Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            return None;
        }
        let labels = labels
            .split("\",")
            .filter_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                Some((k.trim_matches(',').to_string(), v.trim_matches('"').to_string()))
            })
            .collect();
        Some((labels, value.parse().ok()?))
    })
}

/// `apiserver_request_total`, summed by verb, and by verb and resource.
#[derive(Debug, Clone, Default)]
pub struct ApiRequests {
    pub by_verb: BTreeMap<String, f64>,
    /// `"<VERB> <resource>[/<subresource>]"`.
    pub by_resource: BTreeMap<String, f64>,
}

/// The counters of `now` that grew since `before`, by how much.
fn increase(now: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    now.iter()
        .map(|(key, n)| (key.clone(), n - before.get(key).copied().unwrap_or(0.0)))
        .filter(|(_, n)| *n > 0.0)
        .collect()
}

impl ApiRequests {
    fn parse(text: &str) -> Self {
        let mut by_resource = BTreeMap::new();
        for (labels, value) in samples(text, "apiserver_request_total") {
            let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
            let mut key = format!("{} {}", get("verb"), get("resource"));
            if !get("subresource").is_empty() {
                key = format!("{key}/{}", get("subresource"));
            }
            *by_resource.entry(key).or_insert(0.0) += value;
        }
        Self { by_verb: Metrics(text.to_string()).by_label("apiserver_request_total", "verb"), by_resource }
    }

    pub fn total(&self) -> f64 {
        self.by_verb.values().sum()
    }

    /// Requests since `before`, by verb.
    pub fn since(&self, before: &ApiRequests) -> ApiRequests {
        let by_verb = increase(&self.by_verb, &before.by_verb);
        let by_resource = increase(&self.by_resource, &before.by_resource);
        ApiRequests { by_verb, by_resource }
    }

    pub fn to_json(&self) -> Value {
        serde_json::json!({"by_verb": self.by_verb, "by_verb_and_resource": self.by_resource})
    }

    /// The `n` largest verb-and-resource counts, "VERB resource n" joined by commas.
    pub fn top(&self, n: usize) -> String {
        let mut all: Vec<(&String, &f64)> = self.by_resource.iter().collect();
        all.sort_by(|a, b| b.1.total_cmp(a.1));
        all.iter().take(n).map(|(k, v)| format!("{k} {v:.0}")).collect::<Vec<_>>().join(", ")
    }
}

/// A process's memory and CPU from /proc.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessStats {
    /// VmHWM: the peak resident set, MiB.
    pub peak_rss_mib: f64,
    /// VmRSS now, MiB.
    pub rss_mib: f64,
    /// utime + stime, seconds.
    pub cpu_seconds: f64,
}

impl ProcessStats {
    pub fn of(pid: u32) -> Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kib = |key: &str| -> f64 {
            status
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command (which may hold spaces) start at field 3, state.
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
        // utime and stime are fields 14 and 15; `fields[0]` is field 3.
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Ok(Self {
            peak_rss_mib: kib("VmHWM:") / 1024.0,
            rss_mib: kib("VmRSS:") / 1024.0,
            cpu_seconds: (ticks(11) + ticks(12)) / hz,
        })
    }
}

/// Creates, at most [`CREATE_CONCURRENCY`] at a time, every object of
/// `objects` ((kind, document) in the namespace).
pub async fn create_all(client: &Client, ns: &str, objects: Vec<(Kind, Value)>) -> Result<()> {
    let results: Vec<Result<()>> = futures::stream::iter(objects)
        .map(|(kind, object)| {
            let client = client.clone();
            async move { objects::create(&client, ns, kind, object).await.map(|_| ()) }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Deletes the Cluster `cluster` (CAPI deletes its Machines, their
/// infrastructure goes with them) and waits until no Cluster, Machine or
/// infrastructure object is left in `ns`.
pub async fn delete_cluster(client: &Client, ns: &str, cluster: &str) -> Result<()> {
    objects::delete(client, ns, Kind::Cluster, cluster).await?;
    crate::harness::wait::until("every object of the benchmark to be deleted", Duration::from_secs(1800), || async {
        let mut left = 0;
        for kind in [Kind::Cluster, Kind::LibvirtCluster, Kind::Machine, Kind::LibvirtMachine] {
            left += objects::list(client, ns, kind).await?.len();
        }
        Ok(if left == 0 {
            crate::harness::wait::Check::Done(())
        } else {
            crate::harness::wait::Check::Pending(format!("{left} left"))
        })
    })
    .await
}

/// The objects of `count` machines `m-0000`.. of `cluster`: for each a
/// bootstrap Secret, a LibvirtMachine and a Machine (CAPI sets the owner reference).
pub fn machine_objects(ns: &str, cluster: &str, image: &str, count: usize) -> Result<Vec<(Kind, Value)>> {
    let mut out = Vec::with_capacity(count * 3);
    for i in 0..count {
        let name = format!("m-{i:04}");
        let secret = format!("{name}-bootstrap");
        out.push((Kind::Secret, objects::bootstrap_secret(ns, &secret, cluster, &objects::user_data(cluster))));
        out.push((
            Kind::LibvirtMachine,
            objects::document(&objects::libvirt_machine(ns, &name, cluster, image, None))?,
        ));
        out.push((Kind::Machine, objects::machine(ns, &name, cluster, &secret)));
    }
    Ok(out)
}

/// The objects of [`create_workload`], just created.
pub struct Workload {
    /// When the first create went out.
    pub started: Instant,
    /// How long creating all of them took, seconds.
    pub created_s: f64,
    /// How many objects were created (the benchmark's own POSTs).
    pub objects: usize,
}

/// Creates, at once, the Cluster `cluster` on `placement` and `count`
/// machines of it (the workload of `scale` and `floor`).
pub async fn create_workload(
    client: &Client,
    ns: &str,
    cluster: &str,
    placement: &Placement,
    count: usize,
) -> Result<Workload> {
    let started = Instant::now();
    let mut all = cluster_objects(ns, cluster, placement)?;
    all.extend(machine_objects(ns, cluster, &placement.image, count)?);
    let objects = all.len();
    create_all(client, ns, all).await?;
    Ok(Workload { started, created_s: started.elapsed().as_secs_f64(), objects })
}

/// The times by which the first, half, 90 % and all of the machines in
/// `ready` had their address, as table rows.
pub fn ready_rows(ready: &BTreeMap<String, f64>) -> Vec<(String, String)> {
    vec![
        ("first machine with address (s)".into(), fmt(percentile(ready, 0.0), 1)),
        ("50% with address (s)".into(), fmt(percentile(ready, 0.5), 1)),
        ("90% with address (s)".into(), fmt(percentile(ready, 0.9), 1)),
        ("all with address (s)".into(), fmt(percentile(ready, 1.0), 1)),
    ]
}

/// [`ready_rows`] as JSON.
pub fn ready_json(ready: &BTreeMap<String, f64>) -> Value {
    serde_json::json!({
        "first": percentile(ready, 0.0), "p50": percentile(ready, 0.5),
        "p90": percentile(ready, 0.9), "all": percentile(ready, 1.0),
    })
}

/// The Cluster and LibvirtCluster `cluster` on `placement`.
pub fn cluster_objects(ns: &str, cluster: &str, placement: &Placement) -> Result<Vec<(Kind, Value)>> {
    Ok(vec![
        (Kind::LibvirtCluster, objects::document(&objects::libvirt_cluster(ns, cluster, placement))?),
        (Kind::Cluster, objects::cluster(ns, cluster, false)),
    ])
}

/// A LibvirtMachine that is provisioned and has its InternalIP.
pub fn provisioned_ip(lm: &kube::api::DynamicObject) -> Option<String> {
    let provisioned = lm.data["status"]["initialization"]["provisioned"] == true;
    if provisioned { objects::internal_ip(lm) } else { None }
}

/// Watches the namespace's LibvirtMachines until `count` of them satisfied
/// `ready` (or `timeout` since `since` passes); returns the time each first
/// did (seconds since `since`) and the lists the watch made (a watch, not
/// repeated lists, so that looking costs the API server little).
pub async fn wait_each(
    client: &Client,
    ns: &str,
    count: usize,
    since: Instant,
    timeout: Duration,
    ready: impl Fn(&kube::api::DynamicObject) -> bool,
) -> Result<(BTreeMap<String, f64>, usize)> {
    use kube::runtime::{WatchStreamExt, watcher};
    let api = Kind::LibvirtMachine.api(client, ns);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let deadline = tokio::time::Instant::from_std(since + timeout);
    let mut first_seen = BTreeMap::new();
    let mut lists = 0;
    while first_seen.len() < count {
        let event = match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(event)) => event,
            Ok(None) => bail!("the watch of LibvirtMachines in {ns} ended"),
            Err(_) => bail!("after {timeout:?} only {} of {count} machines were ready", first_seen.len()),
        };
        match event {
            Ok(watcher::Event::Init) => lists += 1,
            Ok(watcher::Event::Apply(lm) | watcher::Event::InitApply(lm)) if ready(&lm) => {
                first_seen.entry(objects::name(&lm)).or_insert_with(|| since.elapsed().as_secs_f64());
            }
            Ok(_) => {}
            // The backoff retries; a watch that keeps failing ends at the deadline.
            Err(err) => eprintln!("watching LibvirtMachines: {err}"),
        }
    }
    Ok((first_seen, lists))
}

/// The time by which `fraction` of the machines were ready.
pub fn percentile(times: &BTreeMap<String, f64>, fraction: f64) -> f64 {
    let mut sorted: Vec<f64> = times.values().copied().collect();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 * fraction).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

/// Prints `rows` (name, value) as a two-column table under `title`.
pub fn print_table(title: &str, rows: &[(String, String)]) {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    println!("\n{title}");
    println!("{}", "-".repeat(title.len()));
    for (k, v) in rows {
        println!("{k:<width$}  {v}");
    }
}

/// The printed table as JSON, `{"title": ..., "rows": [[name, value], ...]}`:
/// what `cargo xtask bench-tables` renders into the book.
pub fn table_json(title: &str, rows: &[(String, String)]) -> Value {
    serde_json::json!({"title": title, "rows": rows.iter().map(|(k, v)| [k, v]).collect::<Vec<_>>()})
}

/// Writes `value` as `<out>/<name>.json`; returns the path.
pub fn write_json(out: &Path, name: &str, value: &Value) -> Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let path = out.join(format!("{name}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(value)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// A figure with `digits` decimals.
pub fn fmt(value: f64, digits: usize) -> String {
    format!("{value:.digits$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP capl_reconciles Reconciles\n\
        capl_reconciles_total{controller=\"libvirtmachine\"} 12\n\
        capl_reconciles_total{controller=\"libvirtcluster\"} 3\n\
        capl_libvirt_calls_total{call=\"domain_xml\"} 5\n\
        capl_libvirt_calls_total{call=\"domain_state\"} 2\n\
        capl_libvirt_connections_opened_total 1\n\
        apiserver_request_total{code=\"201\",group=\"\",resource=\"secrets\",verb=\"POST\"} 7\n\
        apiserver_request_total{code=\"200\",group=\"\",resource=\"secrets\",verb=\"GET\"} 4\n\
        apiserver_request_total{code=\"404\",group=\"\",resource=\"secrets\",verb=\"GET\"} 1\n";

    #[test]
    fn prometheus_samples_are_summed_by_name_and_label() {
        let m = Metrics(TEXT.into());
        assert_eq!(m.reconciles(), 12.0);
        assert_eq!(m.libvirt_calls(), 7.0);
        assert_eq!(m.connections_opened(), 1.0);
        assert_eq!(m.by_label("capl_libvirt_calls_total", "call").get("domain_state"), Some(&2.0));
        let api = ApiRequests::parse(TEXT);
        assert_eq!(api.by_verb.get("GET"), Some(&5.0));
        assert_eq!(api.total(), 12.0);
        assert_eq!(api.by_resource.get("GET secrets"), Some(&5.0));
        let before = ApiRequests { by_verb: [("GET".to_string(), 5.0)].into(), by_resource: BTreeMap::new() };
        assert_eq!(api.since(&before).total(), 7.0);
    }

    #[test]
    fn percentiles_of_ready_times() {
        let times: BTreeMap<String, f64> = (1..=10).map(|i| (format!("m{i}"), i as f64)).collect();
        assert_eq!(percentile(&times, 0.5), 5.0);
        assert_eq!(percentile(&times, 1.0), 10.0);
        assert_eq!(percentile(&times, 0.9), 9.0);
    }

    #[test]
    fn this_process_has_memory_and_cpu() {
        let stats = ProcessStats::of(std::process::id()).expect("/proc");
        assert!(stats.peak_rss_mib > 0.0 && stats.peak_rss_mib >= stats.rss_mib * 0.99);
    }

    #[test]
    fn cpu_breakdown_subtracts_and_puts_the_largest_first() {
        let before = BTreeMap::from([("etcd".to_string(), 1.0), ("kube-apiserver".to_string(), 10.0)]);
        let after = BTreeMap::from([
            ("etcd".to_string(), 3.5),
            ("kube-apiserver".to_string(), 30.0),
            ("manager".to_string(), 4.0),
        ]);
        let (text, used) = cpu_breakdown(&after, &before);
        assert_eq!(text, "26.5 in all: kube-apiserver 20.0, manager 4.0, etcd 2.5");
        assert_eq!(used["manager"], 4.0, "a process not sampled before counts from zero");
    }
}
