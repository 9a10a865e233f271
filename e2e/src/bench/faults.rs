//! *faults*: what faults cost, on the manager's embedded simulated hosts
//! through the local kube-apiserver with CAPI core.
//!
//! 1. **Faults at scale.** `machines` machines created at once, first with no
//!    fault, then again with 5 % of libvirt calls failing as if the
//!    connection dropped, every connection dropped each `drop_every`, and
//!    libvirtd restarted once half of them are provisioned; each run is then
//!    deleted (the second with the failing calls again). Printed: the time
//!    until all are provisioned with an address in both runs and their
//!    ratio, failed reconciles (retries) per machine, duplicate addresses,
//!    and what the host still holds after the delete (leaks: domains, volumes,
//!    DHCP entries).
//! 2. **A hung host beside a healthy one.** `healthy` machines on the healthy
//!    host alone; then the same number again, created together with `hung`
//!    machines on a second simulated host whose every call but a connect
//!    hangs from that moment; then again, created once the hung host's
//!    machines report that it does not answer. Printed: the healthy machines'
//!    time in each run and the ratios to alone. After each run the hung host
//!    answers again, its machines converge, and everything is deleted and
//!    checked for leaks.
//!
//! A run fails on a leak or a duplicate address, never on a time.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use kube::Client;
use serde_json::json;

use super::report::{fmt, percentile, print_table, write_json};
use super::stack::{BenchStack, NAME_PREFIX};
use super::workload::{
    Workload, create_all, create_workload, delete_cluster, machine_objects, provisioned_ip, wait_each,
};
use crate::harness::objects::{self, Kind, Placement};

/// The second simulated host, whose calls hang in part 2.
const HUNG_URI: &str = "qemu+tcp://hung.sim/system";
/// Share of calls that fail in part 1, and the seed of their sequence.
const FAIL_RATE: f64 = 0.05;
const FAIL_SEED: u64 = 42;
/// How long a run may take before the benchmark gives up.
const RUN_LIMIT: Duration = Duration::from_secs(1800);

/// What `capl-e2e bench faults` takes.
#[derive(Debug, Clone)]
pub struct Args {
    pub machines: usize,
    pub hung: usize,
    pub healthy: usize,
    pub drop_every: Duration,
    pub provider_binary: PathBuf,
    pub out: PathBuf,
}

pub async fn run(args: &Args) -> Result<bool> {
    let provider_args = vec![
        "--hypervisor=sim".to_string(),
        "--sim-large-network".to_string(),
        format!("--sim-extra-host={HUNG_URI}"),
        // A hung host's calls are given up on after this; 30 s is the default.
        "--libvirt-call-timeout=30s".to_string(),
    ];
    let stack = BenchStack::start(&args.provider_binary, provider_args).await?;
    let result = measure(&stack, args).await;
    if result.is_err() {
        eprintln!("manager log: {}", stack.work_dir.join("provider.log").display());
    }
    result
}

/// The main simulated host (the /22 network).
fn healthy_placement() -> Placement {
    super::scale::placement()
}

/// The second simulated host (the /24 network of `sim_host::register`).
fn hung_placement() -> Placement {
    Placement { uri: HUNG_URI.into(), endpoint_host: "192.168.122.5".into(), ..super::scale::placement() }
}

/// `POST /sim/fault` "<uri> <fault>" to the manager.
async fn fault(stack: &BenchStack, uri: &str, what: &str) -> Result<()> {
    super::stack::http_post(stack.metrics_port, "/sim/fault", &format!("{uri} {what}")).await?;
    Ok(())
}

/// What one run of part 1 measured.
struct Run {
    all_ready_s: f64,
    failed_reconciles: f64,
    duplicate_ips: usize,
    leaks: Vec<String>,
    restarted_at_s: Option<f64>,
    drops: usize,
}

async fn measure(stack: &BenchStack, args: &Args) -> Result<bool> {
    let client = stack.client();
    let n = args.machines;
    let healthy_uri = healthy_placement().uri;

    eprintln!("part 1: {n} machines without faults");
    let calm = scale_run(stack, &client, "calm", n, None).await?;
    eprintln!(
        "part 1: {n} machines with {}% of calls failing, connections dropped every {} s and a daemon restart",
        FAIL_RATE * 100.0,
        args.drop_every.as_secs()
    );
    let stormy = scale_run(stack, &client, "faults", n, Some((&healthy_uri, args.drop_every))).await?;

    eprintln!("part 2: {} machines on the healthy host alone", args.healthy);
    let alone = hung_run(stack, &client, "alone", args.healthy, 0, false).await?;
    eprintln!("part 2: {} machines created as {} on another host hang", args.healthy, args.hung);
    let beside = hung_run(stack, &client, "beside", args.healthy, args.hung, false).await?;
    eprintln!("part 2: {} machines created once {} on another host report it hung", args.healthy, args.hung);
    let known = hung_run(stack, &client, "known", args.healthy, args.hung, true).await?;

    let per_machine = |r: &Run| r.failed_reconciles / n as f64;
    let leaks: Vec<String> = [&calm.leaks, &stormy.leaks, &alone.leaks, &beside.leaks, &known.leaks]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    let duplicates = calm.duplicate_ips + stormy.duplicate_ips + beside.duplicate_ips + known.duplicate_ips;
    let rows: Vec<(String, String)> = vec![
        ("machines".into(), n.to_string()),
        ("without faults: all with address (s)".into(), fmt(calm.all_ready_s, 1)),
        (
            format!(
                "with faults ({}% of calls, drops every {} s, a restart): all with address (s)",
                FAIL_RATE * 100.0,
                args.drop_every.as_secs()
            ),
            fmt(stormy.all_ready_s, 1),
        ),
        ("with faults / without".into(), fmt(stormy.all_ready_s / calm.all_ready_s, 2)),
        (
            "connection drops, daemon restart at (s)".into(),
            format!("{}, {}", stormy.drops, stormy.restarted_at_s.map_or("-".into(), |s| fmt(s, 1))),
        ),
        ("failed reconciles per machine, without faults".into(), fmt(per_machine(&calm), 2)),
        ("failed reconciles per machine, with faults".into(), fmt(per_machine(&stormy), 2)),
        ("duplicate addresses".into(), duplicates.to_string()),
        ("leaks after delete (domains, volumes, DHCP entries)".into(), leaks.len().to_string()),
        (format!("{} healthy machines alone: all with address (s)", args.healthy), fmt(alone.healthy_s, 1)),
        (format!("the same, created as {} on another host hang (s)", args.hung), fmt(beside.healthy_s, 1)),
        ("  against alone".into(), fmt(beside.healthy_s / alone.healthy_s, 2)),
        (format!("the same, created once {} on another host report it hung (s)", args.hung), fmt(known.healthy_s, 1)),
        ("  against alone ".into(), fmt(known.healthy_s / alone.healthy_s, 2)),
        (
            "hung host's machines once it answers: all with address (s)".into(),
            format!("{} / {}", fmt(beside.hung_after_s, 1), fmt(known.hung_after_s, 1)),
        ),
    ];
    let title = format!("faults: {n} machines through faults; {} beside a hung host", args.healthy);
    print_table(&title, &rows);
    let report = json!({
        "table": super::report::table_json(&title, &rows),
        "benchmark": "faults",
        "machines": n,
        "calm_all_ready_s": calm.all_ready_s,
        "faults_all_ready_s": stormy.all_ready_s,
        "failed_reconciles_calm": calm.failed_reconciles,
        "failed_reconciles_faults": stormy.failed_reconciles,
        "healthy_alone_s": alone.healthy_s,
        "healthy_beside_hung_s": beside.healthy_s,
        "healthy_beside_known_hung_s": known.healthy_s,
        "duplicate_ips": duplicates,
        "leaks": leaks,
    });
    let path = write_json(&args.out, "faults", &report)?;
    println!("wrote {}", path.display());
    if duplicates > 0 || !leaks.is_empty() {
        bail!("{duplicates} duplicate addresses, {} objects left on the hosts: {}", leaks.len(), leaks.join(", "));
    }
    Ok(true)
}

fn failed_reconciles(m: &super::metrics::Metrics) -> f64 {
    m.sum("capl_reconcile_errors_total", &[("controller", "libvirtmachine")])
}

/// One run of part 1 in a namespace of its own: `n` machines created,
/// provisioned (with `storm`: failing calls, connection drops every given
/// interval on that host, a restart at half), then deleted.
async fn scale_run(
    stack: &BenchStack,
    client: &Client,
    name: &str,
    n: usize,
    storm: Option<(&str, Duration)>,
) -> Result<Run> {
    let ns = format!("{NAME_PREFIX}faults-{name}");
    stack.plane.env.create_namespace(&ns).await?;
    let m0 = stack.metrics().await?;
    if let Some((uri, _)) = storm {
        fault(stack, uri, &format!("fail-randomly {FAIL_RATE} {FAIL_SEED}")).await?;
    }
    let Workload { started, .. } = create_workload(client, &ns, "bench", &healthy_placement(), n).await?;

    // Drops and the restart run beside the wait, until every machine has its address.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let storm_task = storm.map(|(uri, every)| {
        let uri = uri.to_string();
        let port = stack.metrics_port;
        let (client, ns) = (client.clone(), ns.clone());
        tokio::spawn(async move {
            let (mut drops, mut restarted_at) = (0usize, None);
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            let mut look = tokio::time::interval(Duration::from_secs(2));
            loop {
                tokio::select! {
                    _ = stop_rx.changed() => break,
                    _ = tick.tick() => {
                        super::stack::http_post(port, "/sim/fault", &format!("{uri} drop-connections")).await?;
                        drops += 1;
                    }
                    _ = look.tick(), if restarted_at.is_none() => {
                        let items = objects::list(&client, &ns, Kind::LibvirtMachine).await?;
                        if items.iter().filter(|lm| provisioned_ip(lm).is_some()).count() >= n / 2 {
                            super::stack::http_post(port, "/sim/fault", &format!("{uri} restart-daemon")).await?;
                            restarted_at = Some(started.elapsed().as_secs_f64());
                        }
                    }
                }
            }
            anyhow::Ok((drops, restarted_at))
        })
    });
    let waited = wait_each(client, &ns, n, started, RUN_LIMIT, |lm| provisioned_ip(lm).is_some()).await;
    let _ = stop_tx.send(true);
    let (drops, restarted_at_s) = match storm_task {
        Some(task) => task.await??,
        None => (0, None),
    };
    let (ready, _) = waited?;
    let all_ready_s = percentile(&ready, 1.0);
    let duplicate_ips = super::workload::duplicate_ips(client, &ns).await?;
    let m1 = stack.metrics().await?;
    eprintln!("  all {n} with address after {all_ready_s:.1} s; deleting");
    delete_cluster(client, &ns, "bench").await?;
    if let Some((uri, _)) = storm {
        fault(stack, uri, "clear").await?;
    }
    Ok(Run {
        all_ready_s,
        failed_reconciles: failed_reconciles(&m1) - failed_reconciles(&m0),
        duplicate_ips,
        leaks: stack.sim_inventory().await?,
        restarted_at_s,
        drops,
    })
}

/// What one run of part 2 measured.
struct HungRun {
    healthy_s: f64,
    hung_after_s: f64,
    duplicate_ips: usize,
    leaks: Vec<String>,
}

/// One run of part 2: `healthy` machines on the healthy host, created
/// together with `hung` machines on the hung host (none: the healthy ones
/// alone), or with `known` once one of those reports that the host does not
/// answer; the healthy ones' time until all have an address. Then the hung
/// host answers, its machines converge, and everything is deleted.
async fn hung_run(
    stack: &BenchStack,
    client: &Client,
    name: &str,
    healthy: usize,
    hung: usize,
    known: bool,
) -> Result<HungRun> {
    let ns = format!("{NAME_PREFIX}faults-{name}");
    let hung_ns = format!("{NAME_PREFIX}faults-{name}-hung");
    stack.plane.env.create_namespace(&ns).await?;
    if hung > 0 {
        // The hung host's LibvirtCluster is checked while the host answers;
        // then it hangs, and its machines are created first, so that their
        // reconciles are queued before the healthy ones'.
        stack.plane.env.create_namespace(&hung_ns).await?;
        create_all(client, &hung_ns, super::workload::cluster_objects(&hung_ns, "hung", &hung_placement())?).await?;
        crate::harness::wait::until("the hung host's LibvirtCluster to be provisioned", RUN_LIMIT, || async {
            let lc = objects::get(client, &hung_ns, Kind::LibvirtCluster, "hung").await?;
            Ok(if lc.is_some_and(|lc| lc.data["status"]["initialization"]["provisioned"] == true) {
                crate::harness::wait::Check::Done(())
            } else {
                crate::harness::wait::Check::Pending("not provisioned yet".to_string())
            })
        })
        .await?;
        fault(stack, HUNG_URI, "hang").await?;
        create_all(client, &hung_ns, machine_objects(&hung_ns, "hung", &hung_placement().image, hung)?).await?;
        if known {
            crate::harness::wait::until("a machine of the hung host to report HostUnreachable", RUN_LIMIT, || async {
                let items = objects::list(client, &hung_ns, Kind::LibvirtMachine).await?;
                let unreachable = items.iter().any(|lm| {
                    lm.data["status"]["conditions"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["reason"] == "HostUnreachable"))
                });
                Ok(if unreachable {
                    crate::harness::wait::Check::Done(())
                } else {
                    crate::harness::wait::Check::Pending("none yet".to_string())
                })
            })
            .await?;
        }
    }
    let Workload { started, .. } = create_workload(client, &ns, "bench", &healthy_placement(), healthy).await?;
    let (ready, _) = wait_each(client, &ns, healthy, started, RUN_LIMIT, |lm| provisioned_ip(lm).is_some()).await?;
    let healthy_s = percentile(&ready, 1.0);
    eprintln!("  the {healthy} healthy machines with address after {healthy_s:.1} s");
    let mut duplicate_ips = super::workload::duplicate_ips(client, &ns).await?;
    let mut hung_after_s = 0.0;
    if hung > 0 {
        fault(stack, HUNG_URI, "clear").await?;
        let answering = Instant::now();
        let (ready, _) =
            wait_each(client, &hung_ns, hung, answering, RUN_LIMIT, |lm| provisioned_ip(lm).is_some()).await?;
        hung_after_s = percentile(&ready, 1.0);
        eprintln!("  the {hung} machines of the hung host with address {hung_after_s:.1} s after it answered");
        duplicate_ips += super::workload::duplicate_ips(client, &hung_ns).await?;
        delete_cluster(client, &hung_ns, "hung").await?;
    }
    delete_cluster(client, &ns, "bench").await?;
    Ok(HungRun { healthy_s, hung_after_s, duplicate_ips, leaks: stack.sim_inventory().await? })
}
