//! Runs the scenarios on one stack, one after another, and reports.

use std::time::Instant;

use anyhow::Result;

use crate::harness::kind_cluster::InstalledRelease;
use crate::harness::stack::{Stack, StackConfig, delete_all_clusters};
use crate::scenarios::catalog::{self, Needs, Scenario};

/// The outcome of one scenario.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: String,
    pub passed: bool,
    pub seconds: f64,
    /// What was observed (pass) or the error (failure).
    pub detail: String,
}

/// Starts the stack, runs the scenarios whose id is in `only` (all when
/// empty), tears the stack down, and returns one outcome per scenario plus
/// the stack itself ("setup" / "teardown") when those fail.
pub async fn run(config: &StackConfig, only: &[String]) -> Result<Vec<Outcome>> {
    let ids: Vec<&str> = catalog::all().iter().map(|s| s.id).collect();
    if let Some(unknown) = only.iter().find(|o| !ids.contains(&o.as_str())) {
        anyhow::bail!("no scenario has the id {unknown:?}; the scenario ids are {}", ids.join(", "));
    }
    let mut outcomes = Vec::new();
    let mut selected: Vec<Scenario> = Vec::new();
    let mut left_out = Vec::new();
    for scenario in catalog::all() {
        let asked = only.iter().any(|o| o == scenario.id);
        if !only.is_empty() && !asked {
            continue;
        }
        match scenario.unmet(config) {
            None => selected.push(scenario),
            // Asked for by name: a failure, not a silent omission.
            Some(why) if asked => outcomes.push(Outcome {
                name: scenario.name.into(),
                passed: false,
                seconds: 0.0,
                detail: format!("cannot run on this stack: {why}"),
            }),
            Some(why) => left_out.push(format!("{} ({why})", scenario.id)),
        }
    }
    if !left_out.is_empty() {
        eprintln!("e2e: not on this stack: {}", left_out.join("; "));
    }
    if selected.is_empty() {
        return Ok(outcomes);
    }
    // A kind cluster starts from the previous release when a scenario upgrades it.
    let mut config = config.clone();
    if selected.iter().any(|s| s.needs == Needs::KindFromPreviousRelease) {
        config.release = InstalledRelease::Previous;
    }
    let config = &config;
    let started = Instant::now();
    eprintln!(
        "e2e: starting the stack ({} management cluster, {} libvirtd, provider)",
        config.management.name(),
        config.backend.name()
    );
    let mut stack = match Stack::start(config).await {
        Ok(stack) => stack,
        Err(err) => {
            outcomes.push(Outcome {
                name: "setup".into(),
                passed: false,
                seconds: started.elapsed().as_secs_f64(),
                detail: format!("{err:#}"),
            });
            return Ok(outcomes);
        }
    };
    eprintln!(
        "e2e: stack up in {:.0} s (work dir {}, provider log: {})",
        started.elapsed().as_secs_f64(),
        stack.work_dir.display(),
        stack.provider.log_hint()
    );
    for scenario in selected {
        eprintln!("e2e: == {}", scenario.name);
        let started = Instant::now();
        let result = (scenario.run)(&mut stack).await;
        let seconds = started.elapsed().as_secs_f64();
        let outcome = match result {
            Ok(detail) => Outcome { name: scenario.name.into(), passed: true, seconds, detail },
            Err(err) => {
                eprintln!(
                    "e2e: {} FAILED: {err:#}\n--- provider log (end) ---\n{}\n--- CAPI core log (end) ---\n{}",
                    scenario.name,
                    stack.provider.log_tail(25),
                    stack.management.capi_log_tail(15)
                );
                // The provider may have been killed by the scenario.
                if stack.provider.ensure_running().is_err() {
                    let _ = stack.provider.restart().await;
                }
                // Free the host for the next scenario (best effort; the
                // teardown tries again and reports what is left).
                if let Some(ns) = stack.last_namespace().map(str::to_string)
                    && let Err(err) = delete_all_clusters(&stack.client(), &ns).await
                {
                    eprintln!("e2e: cleaning up {ns} after the failure: {err:#}");
                }
                Outcome { name: scenario.name.into(), passed: false, seconds, detail: format!("{err:#}") }
            }
        };
        eprintln!(
            "e2e: {} {} in {:.0} s: {}",
            if outcome.passed { "PASS" } else { "FAIL" },
            outcome.name,
            seconds,
            outcome.detail
        );
        outcomes.push(outcome);
    }
    let started = Instant::now();
    let teardown = stack.shutdown().await;
    match teardown {
        Ok(leftovers) if leftovers.is_empty() => {}
        Ok(leftovers) => outcomes.push(Outcome {
            name: "teardown".into(),
            passed: false,
            seconds: started.elapsed().as_secs_f64(),
            detail: format!("the provider left these behind (removed now): {}", leftovers.join(", ")),
        }),
        Err(err) => outcomes.push(Outcome {
            name: "teardown".into(),
            passed: false,
            seconds: started.elapsed().as_secs_f64(),
            detail: format!("{err:#}"),
        }),
    }
    Ok(outcomes)
}

/// The summary table: scenario, result, seconds.
pub fn table(outcomes: &[Outcome]) -> String {
    let width = outcomes.iter().map(|o| o.name.len()).max().unwrap_or(8).max(8);
    let mut out = format!("{:<width$}  {:<6}  {:>7}\n", "scenario", "result", "seconds");
    out.push_str(&format!("{}  {}  {}\n", "-".repeat(width), "-".repeat(6), "-".repeat(7)));
    for o in outcomes {
        out.push_str(&format!(
            "{:<width$}  {:<6}  {:>7.1}\n",
            o.name,
            if o.passed { "pass" } else { "FAIL" },
            o.seconds
        ));
    }
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.passed).collect();
    for o in &failed {
        out.push_str(&format!("\n{}: {}\n", o.name, o.detail));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::harness::management::ManagementKind;
    use crate::harness::stack::Backend;

    fn config(backend: Backend, management: ManagementKind) -> StackConfig {
        StackConfig {
            backend,
            provider_binary: PathBuf::new(),
            guest_image: None,
            management,
            release: Default::default(),
        }
    }

    fn runs(config: &StackConfig) -> Vec<&'static str> {
        catalog::all().into_iter().filter(|s| s.unmet(config).is_none()).map(|s| s.id).collect()
    }

    #[test]
    fn each_stack_runs_every_scenario_it_can() {
        let private = config(Backend::Libvirt { uri: "qemu:///system".into() }, ManagementKind::Local);
        assert_eq!(
            runs(&private),
            ["init", "single", "md", "pause", "restart", "stopped", "delete", "multihost", "move"]
        );
        let kind = config(Backend::Container, ManagementKind::Kind);
        assert_eq!(runs(&kind), ["upgrade", "deployed", "single", "restart", "pod-logs"]);
        let container = config(Backend::Container, ManagementKind::Local);
        assert_eq!(runs(&container), ["init", "single", "md", "pause", "restart", "stopped", "delete"]);
    }

    #[tokio::test]
    async fn a_scenario_asked_for_that_the_stack_cannot_run_fails_without_starting_it() {
        let kind = config(Backend::Container, ManagementKind::Kind);
        let outcomes = run(&kind, &["multihost".to_string()]).await.unwrap();
        assert_eq!(outcomes.len(), 1);
        assert!(!outcomes[0].passed);
        assert!(outcomes[0].detail.contains("needs the private libvirtd"), "{}", outcomes[0].detail);
        let err = run(&kind, &["nonsense".to_string()]).await.unwrap_err();
        assert!(format!("{err}").contains("the scenario ids are"), "{err}");
    }
}
