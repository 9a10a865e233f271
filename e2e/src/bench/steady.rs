//! *steady*: the machines of [`scale`](super::scale), all running with their
//! addresses, left alone for a window (5 minutes by default): libvirt calls,
//! API requests and reconciles per minute, and the manager's memory over the
//! window. Healthy machines should cost nothing between resyncs
//! (`--resync-interval`, 10 minutes), so every figure but memory should be
//! near zero.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};

use super::report::{fmt, print_table, write_json};
use super::stack::BenchStack;

/// How often memory is sampled during the window.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// What the window measured.
#[derive(Debug, Clone)]
pub struct Steady {
    pub machines: usize,
    pub window_s: f64,
    pub reconciles: f64,
    pub libvirt_calls: f64,
    pub libvirt_calls_by_call: std::collections::BTreeMap<String, f64>,
    pub api: super::metrics::ApiRequests,
    pub cpu_s: f64,
    pub rss_mib_start: f64,
    pub rss_mib_end: f64,
    pub rss_mib_max: f64,
    pub peak_rss_mib: f64,
}

/// Waits `window` with the `machines` of namespace `_ns` running, sampling memory.
pub async fn measure(stack: &BenchStack, _ns: &str, machines: usize, window: Duration) -> Result<Steady> {
    eprintln!("leaving the {machines} machines alone for {} s", window.as_secs());
    let m0 = stack.metrics().await?;
    let api0 = stack.api_requests().await?;
    let p0 = stack.process()?;
    let started = Instant::now();
    let mut rss_max = p0.rss_mib;
    while started.elapsed() < window {
        tokio::time::sleep(SAMPLE_EVERY.min(window.saturating_sub(started.elapsed()))).await;
        rss_max = rss_max.max(stack.process()?.rss_mib);
    }
    let window_s = started.elapsed().as_secs_f64();
    let m1 = stack.metrics().await?;
    let api1 = stack.api_requests().await?;
    let p1 = stack.process()?;
    Ok(Steady {
        machines,
        window_s,
        reconciles: m1.reconciles() - m0.reconciles(),
        libvirt_calls: m1.libvirt_calls() - m0.libvirt_calls(),
        libvirt_calls_by_call: super::metrics::diff(
            &m1.by_label("capl_libvirt_calls_total", "call"),
            &m0.by_label("capl_libvirt_calls_total", "call"),
        ),
        // The two reads of kube-apiserver's /metrics are this benchmark's own.
        api: api1.since(&api0),
        cpu_s: p1.cpu_seconds - p0.cpu_seconds,
        rss_mib_start: p0.rss_mib,
        rss_mib_end: p1.rss_mib,
        rss_mib_max: rss_max,
        peak_rss_mib: p1.peak_rss_mib,
    })
}

/// Prints the table and writes `steady.json`.
pub fn report(out: &Path, s: &Steady) -> Result<()> {
    let minutes = s.window_s / 60.0;
    let per_min = |v: f64| fmt(v / minutes, 1);
    let rows = vec![
        ("machines".to_string(), s.machines.to_string()),
        ("window (s)".into(), fmt(s.window_s, 0)),
        ("libvirt calls per minute".into(), per_min(s.libvirt_calls)),
        ("reconciles per minute".into(), per_min(s.reconciles)),
        ("API requests per minute (all clients)".into(), per_min(s.api.total())),
        ("API requests in the window, largest".into(), s.api.top(6)),
        ("manager CPU per minute (s)".into(), fmt(s.cpu_s / minutes, 2)),
        (
            "manager RSS at start / max / end (MiB)".into(),
            format!("{:.1} / {:.1} / {:.1}", s.rss_mib_start, s.rss_mib_max, s.rss_mib_end),
        ),
        ("manager peak RSS since start (MiB)".into(), fmt(s.peak_rss_mib, 1)),
    ];
    let title = format!("steady: {} running machines left alone", s.machines);
    print_table(&title, &rows);
    let value: Value = json!({
        "table": super::report::table_json(&title, &rows),
        "benchmark": "steady",
        "machines": s.machines,
        "window_s": s.window_s,
        "libvirt_calls": s.libvirt_calls,
        "libvirt_calls_by_call": s.libvirt_calls_by_call,
        "libvirt_calls_per_min": s.libvirt_calls / minutes,
        "reconciles": s.reconciles,
        "reconciles_per_min": s.reconciles / minutes,
        "api_requests": s.api.to_json(),
        "api_requests_per_min": s.api.total() / minutes,
        "manager_cpu_s": s.cpu_s,
        "manager_rss_mib": {"start": s.rss_mib_start, "max": s.rss_mib_max, "end": s.rss_mib_end},
        "manager_peak_rss_mib": s.peak_rss_mib,
    });
    let path = write_json(out, "steady", &value)?;
    println!("wrote {}", path.display());
    Ok(())
}
