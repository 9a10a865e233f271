//! What the scale benchmarks run on: the local control plane with CAPI core
//! ([`ControlPlane`]), the manager beside it ([`BenchStack`]), and the CPU
//! each of their processes used.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kube::Client;
use testenv::{CapiManager, CapiOptions, TestEnv};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::metrics::{ApiRequests, Metrics, ProcessStats};
use crate::harness::provider_process::ProviderProcess;
use crate::repo_root;

/// Namespaces the benchmarks create start with this (and so do their
/// domains, volumes and DHCP hosts on a real host).
pub const NAME_PREFIX: &str = "capl-bench-";

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

    /// What the manager's simulated hosts hold (`/sim/inventory`: domains,
    /// volumes of the domain pool and DHCP entries, one a line): after a
    /// benchmark's delete, its leaks.
    pub async fn sim_inventory(&self) -> Result<Vec<String>> {
        let inventory = http_get(self.metrics_port, "/sim/inventory").await?;
        Ok(inventory.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect())
    }
}

fn free_port() -> Result<u16> {
    let [port] = testenv::free_loopback_ports()?;
    Ok(port)
}

pub async fn http_get(port: u16, path: &str) -> Result<String> {
    request(port, &format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"), path).await
}

/// `POST path` with `body` (text) to 127.0.0.1:`port`; the answer's body.
pub async fn http_post(port: u16, path: &str, body: &str) -> Result<String> {
    let head = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    request(port, &(head + body), path).await
}

async fn request(port: u16, request: &str, path: &str) -> Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").context("not an HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("{path}: {} {body}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

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
