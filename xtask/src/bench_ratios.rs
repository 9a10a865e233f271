//! The ratios the performance page leads with: the provider's scale run
//! against the floor (the same machines with no manager, the benchmark
//! writing only what the contract requires), both from one `cargo xtask
//! bench` invocation. Read from `target/bench/scale.json` and `floor.json`,
//! printed, and written to `target/bench/ratios.json` with its table (which
//! `bench_tables` puts first on the page).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

/// The ratio rows from the two reports.
pub fn rows(scale: &Value, floor: &Value) -> Result<Vec<(String, String)>> {
    let machines = |v: &Value| v["machines"].as_f64().filter(|n| *n > 0.0);
    let (n_scale, n_floor) = (
        machines(scale).context("scale.json has no machine count")?,
        machines(floor).context("floor.json has no machine count")?,
    );
    ensure!(n_scale == n_floor, "scale ran {n_scale} machines and floor {n_floor}: run both with the same --machines");
    let all =
        |v: &Value, name: &str| v["ready_s"]["all"].as_f64().with_context(|| format!("{name}.json has no ready_s.all"));
    let requests = |v: &Value, name: &str| -> Result<f64> {
        let total =
            v["api_requests_total"].as_f64().with_context(|| format!("{name}.json has no api_requests_total"))?;
        let own = v["api_requests_benchmark_own"].as_f64().unwrap_or(0.0);
        Ok((total - own) / n_scale)
    };
    let (t_scale, t_floor) = (all(scale, "scale")?, all(floor, "floor")?);
    let (r_scale, r_floor) = (requests(scale, "scale")?, requests(floor, "floor")?);
    let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}", a / b) } else { "-".into() };
    Ok(vec![
        ("machines".into(), format!("{n_scale:.0}")),
        ("all machines with their address: provider / floor (s)".into(), format!("{t_scale:.1} / {t_floor:.1}")),
        ("  provider against floor".into(), ratio(t_scale, t_floor)),
        (
            "API requests per machine, without the benchmark's: provider run / floor".into(),
            format!("{r_scale:.1} / {r_floor:.1}"),
        ),
        ("  provider run against floor".into(), ratio(r_scale, r_floor)),
    ])
}

/// Prints the ratios and writes `ratios.json` into `dir` when both reports are there.
pub fn write(dir: &Path) -> Result<Option<PathBuf>> {
    let read = |name: &str| -> Result<Option<Value>> {
        let path = dir.join(format!("{name}.json"));
        if !path.is_file() {
            return Ok(None);
        }
        Ok(Some(
            serde_json::from_str(&std::fs::read_to_string(&path)?)
                .with_context(|| format!("parsing {}", path.display()))?,
        ))
    };
    let (Some(scale), Some(floor)) = (read("scale")?, read("floor")?) else {
        return Ok(None);
    };
    let rows = rows(&scale, &floor)?;
    let title = "ratios: the provider against the floor, one run";
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    println!("\n{title}\n{}", "-".repeat(title.len()));
    for (k, v) in &rows {
        println!("{k:<width$}  {v}");
    }
    let table = json!({"title": title, "rows": rows.iter().map(|(k, v)| [k, v]).collect::<Vec<_>>()});
    let path = dir.join("ratios.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json!({"benchmark": "ratios", "table": table}))?)?;
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(all: f64, total: f64, own: f64) -> Value {
        json!({"machines": 1000, "ready_s": {"all": all}, "api_requests_total": total, "api_requests_benchmark_own": own})
    }

    #[test]
    fn the_ratios_compare_time_and_requests_without_the_benchmarks_own() {
        let rows = rows(&report(99.3, 21_400.0, 3_000.0), &report(66.6, 13_000.0, 5_000.0)).unwrap();
        let get = |k: &str| rows.iter().find(|(name, _)| name.starts_with(k)).map(|(_, v)| v.clone()).unwrap();
        assert_eq!(get("all machines"), "99.3 / 66.6");
        assert_eq!(get("  provider against floor"), "1.49");
        assert_eq!(get("API requests"), "18.4 / 8.0");
        assert_eq!(get("  provider run against floor"), "2.30");
    }

    #[test]
    fn different_machine_counts_are_refused() {
        let mut floor = report(66.6, 13_000.0, 5_000.0);
        floor["machines"] = json!(200);
        let err = rows(&report(99.3, 21_400.0, 3_000.0), &floor).unwrap_err();
        assert!(err.to_string().contains("same --machines"), "{err}");
    }
}
