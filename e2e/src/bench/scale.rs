//! *scale*: `machines` LibvirtMachines with their Machines, bootstrap
//! Secrets and one Cluster, created at once through the local kube-apiserver
//! with CAPI core, against the manager's embedded simulated host
//! (`--hypervisor sim --sim-large-network`). Measures the time until all are
//! provisioned with an address, reconciles per second, API requests and
//! libvirt calls per machine, the manager's peak RSS and CPU time; then,
//! optionally, the [`steady`](super::steady) window; then deletes the
//! Cluster and measures the time until everything is gone and what the
//! simulated host still holds (leaks).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::json;

use super::metrics::diff;
use super::report::{fmt, percentile, print_table, ready_json, ready_rows, write_json};
use super::stack::{BenchStack, NAME_PREFIX, cpu_breakdown};
use super::workload::{Workload, create_workload, delete_cluster, duplicate_ips, provisioned_ip, wait_each};
use crate::harness::objects::Placement;

const CLUSTER: &str = "bench";

/// What `capl-e2e bench scale` and `bench steady` take.
#[derive(Debug, Clone)]
pub struct Args {
    pub machines: usize,
    /// Leave the machines alone this long before deleting them (the steady benchmark).
    pub steady: Option<Duration>,
    pub provider_binary: PathBuf,
    /// Where the JSON goes.
    pub out: PathBuf,
    /// Reconciles at once (`--concurrency` of the manager).
    pub concurrency: u16,
}

pub async fn run(args: &Args) -> Result<bool> {
    let provider_args = vec![
        "--hypervisor=sim".to_string(),
        "--sim-large-network".to_string(),
        format!("--concurrency={}", args.concurrency),
    ];
    let stack = BenchStack::start(&args.provider_binary, provider_args).await?;
    let result = measure(&stack, args).await;
    if result.is_err() {
        eprintln!("manager log: {}", stack.work_dir.join("provider.log").display());
    }
    result
}

/// Where the machines go: the embedded simulated host's network and pools.
pub fn placement() -> Placement {
    Placement {
        uri: "qemu:///system".into(),
        network: capl_host::sim_host::NETWORK.into(),
        base_pool: capl_host::sim_host::BASE_POOL.into(),
        domain_pool: capl_host::sim_host::DOMAIN_POOL.into(),
        image: capl_host::sim_host::BASE_IMAGE.into(),
        // In the /22 network, below its DHCP range.
        endpoint_host: "10.20.0.5".into(),
        credentials: None,
    }
}

async fn measure(stack: &BenchStack, args: &Args) -> Result<bool> {
    let client = stack.client();
    let n = args.machines;
    let ns = format!("{NAME_PREFIX}scale");
    stack.plane.env.create_namespace(&ns).await?;
    let placement = placement();

    let m0 = stack.metrics().await?;
    let api0 = stack.api_requests().await?;
    let p0 = stack.process()?;
    let cpu0 = stack.cpu_seconds()?;
    eprintln!("creating {n} machines (Secret, LibvirtMachine, Machine each) and one Cluster at once");
    let Workload { started, created_s, objects: own_creates } =
        create_workload(&client, &ns, CLUSTER, &placement, n).await?;
    eprintln!("created in {created_s:.1} s; waiting for every machine's address");
    let (ready, lists) =
        wait_each(&client, &ns, n, started, Duration::from_secs(1800), |lm| provisioned_ip(lm).is_some()).await?;
    let all_ready_s = percentile(&ready, 1.0);
    let m1 = stack.metrics().await?;
    let api1 = stack.api_requests().await?;
    let p1 = stack.process()?;
    let (cpu_text, cpu_used) = cpu_breakdown(&stack.cpu_seconds()?, &cpu0);

    // Every address once.
    let duplicate_ips = duplicate_ips(&client, &ns).await?;

    let reconciles = m1.reconciles() - m0.reconciles();
    let libvirt_calls = m1.libvirt_calls() - m0.libvirt_calls();
    let api = api1.since(&api0);
    // This benchmark's own requests: the creates, the watch (a list and a watch each time it starts) and the final list.
    let own_requests = (own_creates + 2 * lists + 1) as f64;
    let calls_by =
        diff(&m1.by_label("capl_libvirt_calls_total", "call"), &m0.by_label("capl_libvirt_calls_total", "call"));
    let steps = step_means(&m1);
    let mean_of = |name: &str, labels: &[(&str, &str)]| {
        let sum = m1.sum(&format!("{name}_sum"), labels) - m0.sum(&format!("{name}_sum"), labels);
        let count = m1.sum(&format!("{name}_count"), labels) - m0.sum(&format!("{name}_count"), labels);
        if count > 0.0 { sum / count } else { 0.0 }
    };
    let reconcile_mean = mean_of("capl_reconcile_duration_seconds", &[("controller", "libvirtmachine")]);
    let host_operations: BTreeMap<String, f64> = m1
        .by_label("capl_libvirt_operation_duration_seconds_count", "operation")
        .into_keys()
        .map(|op| {
            let mean = mean_of("capl_libvirt_operation_duration_seconds", &[("operation", op.as_str())]);
            (op, mean)
        })
        .collect();

    let steady = match args.steady {
        Some(window) => Some(super::steady::measure(stack, &ns, n, window).await?),
        None => None,
    };

    eprintln!("deleting the Cluster (CAPI deletes the Machines, the manager the domains)");
    let m2 = stack.metrics().await?;
    let deleting = Instant::now();
    delete_cluster(&client, &ns, CLUSTER).await?;
    let deleted_s = deleting.elapsed().as_secs_f64();
    let m3 = stack.metrics().await?;
    let p3 = stack.process()?;
    let leaks = stack.sim_inventory().await?;

    let cpu_provision = p1.cpu_seconds - p0.cpu_seconds;
    let mut rows = vec![
        ("machines".to_string(), n.to_string()),
        ("manager --concurrency".into(), args.concurrency.to_string()),
        ("objects created (s)".into(), fmt(created_s, 1)),
    ];
    rows.extend(ready_rows(&ready));
    rows.extend([
        ("reconciles (LibvirtMachine)".into(), fmt(reconciles, 0)),
        ("reconciles per machine".into(), fmt(reconciles / n as f64, 2)),
        ("reconciles per second".into(), fmt(reconciles / all_ready_s, 1)),
        ("reconcile duration, mean (ms)".into(), fmt(reconcile_mean * 1000.0, 1)),
        (
            "host operations, mean (ms)".into(),
            host_operations.iter().map(|(op, s)| format!("{op} {:.1}", s * 1000.0)).collect::<Vec<_>>().join(", "),
        ),
        ("libvirt calls per machine".into(), fmt(libvirt_calls / n as f64, 1)),
        ("API requests per machine (all clients)".into(), fmt(api.total() / n as f64, 1)),
        ("API requests per machine (without the benchmark's)".into(), fmt((api.total() - own_requests) / n as f64, 1)),
        ("API requests, largest (all clients)".into(), api.top(6)),
        ("manager CPU while provisioning (s)".into(), fmt(cpu_provision, 1)),
        ("CPU while provisioning, every process (s)".into(), cpu_text),
        ("manager peak RSS while provisioning (MiB)".into(), fmt(p1.peak_rss_mib, 1)),
        ("duplicate IPs".into(), duplicate_ips.to_string()),
        ("delete: all gone (s)".into(), fmt(deleted_s, 1)),
        ("delete: libvirt calls per machine".into(), fmt((m3.libvirt_calls() - m2.libvirt_calls()) / n as f64, 1)),
        ("leaks on the host after delete".into(), leaks.len().to_string()),
        ("manager CPU, whole run (s)".into(), fmt(p3.cpu_seconds, 1)),
        ("manager peak RSS, whole run (MiB)".into(), fmt(p3.peak_rss_mib, 1)),
        ("libvirt connections opened".into(), fmt(m3.connections_opened(), 0)),
    ]);
    for (step, mean) in &steps {
        rows.push((format!("create step {step}: mean (ms)"), fmt(mean * 1000.0, 3)));
    }
    let title = format!("scale: {n} machines on the simulated host");
    print_table(&title, &rows);
    let report = json!({
        "table": super::report::table_json(&title, &rows),
        "benchmark": "scale",
        "machines": n,
        "concurrency": args.concurrency,
        "created_s": created_s,
        "ready_s": ready_json(&ready),
        "reconciles": reconciles,
        "reconciles_per_s": reconciles / all_ready_s,
        "reconcile_mean_s": reconcile_mean,
        "host_operation_mean_s": host_operations,
        "libvirt_calls": libvirt_calls,
        "libvirt_calls_by_call": calls_by,
        "api_requests": api.to_json(),
        "api_requests_total": api.total(),
        "api_requests_benchmark_own": own_requests,
        "manager_cpu_s_provisioning": cpu_provision,
        "cpu_s_provisioning_by_process": cpu_used,
        "manager_peak_rss_mib_provisioning": p1.peak_rss_mib,
        "manager_rss_mib_after_provisioning": p1.rss_mib,
        "duplicate_ips": duplicate_ips,
        "delete_s": deleted_s,
        "delete_libvirt_calls": m3.libvirt_calls() - m2.libvirt_calls(),
        "leaks": leaks,
        "manager_cpu_s_total": p3.cpu_seconds,
        "manager_peak_rss_mib_total": p3.peak_rss_mib,
        "connections_opened": m3.connections_opened(),
        "create_step_mean_s": steps,
    });
    let path = write_json(&args.out, "scale", &report)?;
    println!("wrote {}", path.display());
    if let Some(steady) = steady {
        super::steady::report(&args.out, &steady)?;
    }
    if duplicate_ips > 0 || !leaks.is_empty() {
        bail!("{duplicate_ips} duplicate IPs, {} objects left on the host: {}", leaks.len(), leaks.join(", "));
    }
    Ok(true)
}

/// The mean duration of each create step from `capl_create_step_duration_seconds`.
pub fn step_means(m: &super::metrics::Metrics) -> BTreeMap<String, f64> {
    let sums = m.by_label("capl_create_step_duration_seconds_sum", "step");
    let counts = m.by_label("capl_create_step_duration_seconds_count", "step");
    sums.into_iter()
        .filter_map(|(step, sum)| Some((step.clone(), sum / *counts.get(&step).filter(|c| **c > 0.0)?)))
        .collect()
}
