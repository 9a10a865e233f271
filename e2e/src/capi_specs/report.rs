//! The table of a run from Ginkgo's JSON report: spec, result, duration.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

/// One spec's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub spec: String,
    /// Ginkgo's state: passed, failed, skipped, pending, panicked, timedout,
    /// interrupted, aborted; `not run` when the report lacks it.
    pub state: String,
    pub duration: Duration,
    /// The failure's message and where it happened.
    pub failure: Option<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.state == "passed"
    }
}

/// Reads the report at `path`: one outcome per spec asked for (by its
/// label), in order;
/// a spec the report lacks is `not run` (a failed BeforeSuite, for one, with
/// its failure).
pub fn read(path: &Path, specs: &[&str]) -> Result<Vec<Outcome>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading Ginkgo's report {}", path.display()))?;
    let reports: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(outcomes(&reports, specs))
}

fn outcomes(reports: &Value, specs: &[&str]) -> Vec<Outcome> {
    let entries: Vec<&Value> = reports
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["SpecReports"].as_array().into_iter().flatten())
        .collect();
    let suite_failure = entries
        .iter()
        .find(|e| e["LeafNodeType"] == "BeforeSuite" && e["State"] != "passed")
        .map(|e| format!("BeforeSuite {}: {}", e["State"].as_str().unwrap_or("?"), failure(e).unwrap_or_default()));
    specs
        .iter()
        .map(|spec| {
            let entry = entries.iter().find(|e| {
                e["LeafNodeType"] == "It"
                    && e["ContainerHierarchyLabels"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .flat_map(|labels| labels.as_array().into_iter().flatten())
                        .any(|l| l == *spec)
            });
            match entry {
                Some(e) => Outcome {
                    spec: spec.to_string(),
                    state: e["State"].as_str().unwrap_or("unknown").to_string(),
                    duration: Duration::from_nanos(e["RunTime"].as_u64().unwrap_or(0)),
                    failure: failure(e),
                },
                None => Outcome {
                    spec: spec.to_string(),
                    state: "not run".into(),
                    duration: Duration::ZERO,
                    failure: suite_failure.clone(),
                },
            }
        })
        .collect()
}

fn failure(entry: &Value) -> Option<String> {
    let f = &entry["Failure"];
    let message = f["Message"].as_str().filter(|m| !m.is_empty())?;
    let location = &f["Location"];
    Some(format!(
        "{} ({}:{})",
        message.trim(),
        location["FileName"].as_str().unwrap_or("?"),
        location["LineNumber"].as_u64().unwrap_or(0)
    ))
}

/// The table: spec, result, duration; failures below it.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::from("| Spec | Result | Duration |\n|---|---|---|\n");
    for o in outcomes {
        out.push_str(&format!("| {} | {} | {:.0} s |\n", o.spec, o.state, o.duration.as_secs_f64()));
    }
    for o in outcomes.iter().filter(|o| o.failure.is_some()) {
        out.push_str(&format!("\n{}: {}\n", o.spec, o.failure.as_deref().unwrap_or_default()));
    }
    out
}

/// The table with the date of the run, and no failure messages (they are in the run's log).
pub fn dated_table(outcomes: &[Outcome], date: &str) -> String {
    let mut out = String::from("| Spec | Result | Duration | Date |\n|---|---|---|---|\n");
    for o in outcomes {
        out.push_str(&format!("| {} | {} | {:.0} s | {date} |\n", o.spec, o.state, o.duration.as_secs_f64()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SPECS: &[&str] = &["a", "b", "c"];

    fn it(label: &str, state: &str, seconds: u64) -> Value {
        json!({
            "LeafNodeType": "It", "State": state, "RunTime": seconds * 1_000_000_000u64,
            "ContainerHierarchyLabels": [[label]],
            "Failure": if state == "passed" { json!({}) } else {
                json!({"Message": "Timed out", "Location": {"FileName": "quick_start.go", "LineNumber": 7}})
            },
        })
    }

    #[test]
    fn each_spec_gets_its_state_and_duration_and_a_missing_one_is_not_run() {
        let reports = json!([{"SpecReports": [
            {"LeafNodeType": "BeforeSuite", "State": "passed"},
            it("a", "passed", 300),
            it("b", "failed", 1800),
        ]}]);
        let got = outcomes(&reports, SPECS);
        assert_eq!(got[0].state, "passed");
        assert_eq!(got[0].duration, Duration::from_secs(300));
        assert!(got[0].passed());
        assert_eq!(got[1].state, "failed");
        assert_eq!(got[1].failure.as_deref(), Some("Timed out (quick_start.go:7)"));
        assert_eq!(got[2].state, "not run");
        assert!(!got[2].passed());
        let table = table(&got);
        assert!(table.contains("| b | failed | 1800 s |"), "{table}");
    }

    #[test]
    fn a_failed_before_suite_is_the_reason_of_every_spec() {
        let reports = json!([{"SpecReports": [{
            "LeafNodeType": "BeforeSuite", "State": "failed",
            "Failure": {"Message": "no kubeconfig", "Location": {"FileName": "suite_test.go", "LineNumber": 3}},
        }]}]);
        let got = outcomes(&reports, SPECS);
        assert!(got.iter().all(|o| o.state == "not run"));
        assert_eq!(got[0].failure.as_deref(), Some("BeforeSuite failed: no kubeconfig (suite_test.go:3)"));
    }
}
