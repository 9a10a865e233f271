//! What the benchmarks print and write: tables, percentiles of ready times,
//! and `<out>/<name>.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

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
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn percentiles_of_ready_times() {
        let times: BTreeMap<String, f64> = (1..=10).map(|i| (format!("m{i}"), i as f64)).collect();
        assert_eq!(percentile(&times, 0.5), 5.0);
        assert_eq!(percentile(&times, 1.0), 10.0);
        assert_eq!(percentile(&times, 0.9), 9.0);
    }
}
