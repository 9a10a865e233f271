//! What the benchmarks measure: the manager's `/metrics`, kube-apiserver's
//! request counters, a process's memory and CPU, and the growth of counters
//! between two readings.

use std::collections::BTreeMap;

use anyhow::Result;
use serde_json::Value;

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

/// `after - before`, per key: the counters that grew, by how much.
pub fn diff(after: &BTreeMap<String, f64>, before: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

impl ApiRequests {
    pub fn parse(text: &str) -> Self {
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
        let by_verb = diff(&self.by_verb, &before.by_verb);
        let by_resource = diff(&self.by_resource, &before.by_resource);
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

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
    fn this_process_has_memory_and_cpu() {
        let stats = ProcessStats::of(std::process::id()).expect("/proc");
        assert!(stats.peak_rss_mib > 0.0 && stats.peak_rss_mib >= stats.rss_mib * 0.99);
    }
}
