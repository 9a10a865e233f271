//! `capl-e2e`: the e2e suite (`run`) and the demo (`demo`). Started by
//! `cargo xtask e2e` and `cargo xtask demo`, which prepare the host first.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use e2e::stack::StackConfig;

#[derive(Parser)]
#[command(name = "capl-e2e", about = "End-to-end tests and demo of cluster-api-provider-libvirt")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the scenarios against the private libvirtd and print a summary table.
    Run {
        /// Run only these scenario ids (init, single, md, pause, restart, stopped, delete, move).
        #[arg(long)]
        only: Vec<String>,
        /// The kind scenarios instead: the provider's image as a Pod of a kind
        /// cluster (`deployed`), with what `cargo xtask e2e --kind` builds offline.
        #[arg(long)]
        kind: bool,
    },
    /// A benchmark of issue 15 (started by `cargo xtask bench`): prints a table, writes JSON.
    Bench {
        #[command(subcommand)]
        which: Bench,
        /// Where the JSON goes.
        #[arg(long, default_value = "target/bench")]
        out: std::path::PathBuf,
    },
    /// One cluster, two machines, narrated; Ctrl-C cleans up.
    Demo {
        /// Use the provider's embedded simulated libvirt host.
        #[arg(long, value_parser = ["libvirt", "sim"], default_value = "libvirt")]
        hypervisor: String,
        /// Clean up and exit once both machines run (for non-interactive checks).
        #[arg(long)]
        exit_after_ready: bool,
        /// A real Kubernetes cluster (kubeadm control plane and a worker) instead of two plain machines.
        #[arg(long)]
        workload: bool,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// 1,000 machines on the simulated host through the API server: created at once, then deleted.
    Scale {
        #[arg(long, default_value_t = 1000)]
        machines: usize,
        /// The manager's --concurrency.
        #[arg(long, default_value_t = 10)]
        concurrency: u16,
    },
    /// The scale benchmark's machines left alone for a while: what they cost per minute.
    Steady {
        #[arg(long, default_value_t = 1000)]
        machines: usize,
        /// How long to leave them alone, in minutes.
        #[arg(long, default_value_t = 5.0)]
        minutes: f64,
        #[arg(long, default_value_t = 10)]
        concurrency: u16,
    },
    /// 20 machines on the private libvirtd, one after another: each create step beside virsh doing it.
    Overhead {
        #[arg(long, default_value_t = 20)]
        machines: usize,
    },
    /// 100 DHCP reservations at once on one real network of the private libvirtd.
    Contention {
        #[arg(long, default_value_t = 100)]
        machines: usize,
    },
}

async fn bench(which: Bench, out: std::path::PathBuf) -> anyhow::Result<bool> {
    let provider_binary = StackConfig::from_env(true)?.provider_binary;
    match which {
        Bench::Scale { machines, concurrency } => {
            let args = e2e::bench::scale::Args { machines, steady: None, provider_binary, out, concurrency };
            e2e::bench::scale::run(&args).await
        }
        Bench::Steady { machines, minutes, concurrency } => {
            let steady = Some(std::time::Duration::from_secs_f64(minutes * 60.0));
            let args = e2e::bench::scale::Args { machines, steady, provider_binary, out, concurrency };
            e2e::bench::scale::run(&args).await
        }
        Bench::Overhead { machines } => {
            let config = StackConfig::from_env(false)?;
            let e2e::stack::Backend::Libvirt { uri } = config.backend else { unreachable!("from_env(false)") };
            let guest_image = config.guest_image.ok_or_else(|| anyhow::anyhow!("no guest image"))?;
            let args = e2e::bench::overhead::Args { uri, guest_image, provider_binary, machines, out };
            e2e::bench::overhead::run(&args).await
        }
        Bench::Contention { machines } => {
            let uri = testenv::test_host::uri().map_err(anyhow::Error::msg)?;
            tokio::task::spawn_blocking(move || e2e::bench::contention::run(&uri, machines, &out)).await?
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { only, kind } => run(&only, kind).await,
        Command::Bench { which, out } => bench(which, out).await,
        Command::Demo { hypervisor, exit_after_ready, workload } => match StackConfig::from_env(hypervisor == "sim") {
            Ok(config) if workload => e2e::demo::run_workload(&config, exit_after_ready).await.map(|()| true),
            Ok(config) => e2e::demo::run(&config, exit_after_ready).await.map(|()| true),
            Err(err) => Err(err),
        },
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(only: &[String], kind: bool) -> anyhow::Result<bool> {
    if kind {
        let only = only.to_vec();
        // Blocking: kind, kubectl and testcontainers' own runtime.
        return Ok(tokio::task::spawn_blocking(move || run_kind(&only)).await?);
    }
    let config = StackConfig::from_env(false)?;
    let outcomes = e2e::suite::run(&config, only).await?;
    println!("\n{}", e2e::suite::table(&outcomes));
    Ok(outcomes.iter().all(|o| o.passed))
}

/// The kind scenarios (today `deployed`), with the same summary table.
fn run_kind(only: &[String]) -> bool {
    use e2e::scenario_deployed::{SCENARIO, run_scenario};
    let mut outcomes = Vec::new();
    for wanted in only.iter().filter(|o| o.as_str() != SCENARIO) {
        outcomes.push(e2e::suite::Outcome {
            name: wanted.clone(),
            passed: false,
            seconds: 0.0,
            detail: format!("not a kind scenario (with --kind: {SCENARIO})"),
        });
    }
    let started = std::time::Instant::now();
    let work = e2e::repo_root().join("target/tmp/e2e-kind");
    let result = run_scenario(&work);
    outcomes.push(e2e::suite::Outcome {
        name: SCENARIO.into(),
        passed: result.is_ok(),
        seconds: started.elapsed().as_secs_f64(),
        detail: match result {
            Ok(()) => "clusterctl init; Pod Ready and leading, nonroot, read-only, JSON log; rollout restart moved \
                       the Lease; a Machine, a MachineDeployment 2 -> 1 and Cluster deletion over qemu+tls"
                .into(),
            Err(e) => format!("{e:#}"),
        },
    });
    println!("\n{}", e2e::suite::table(&outcomes));
    outcomes.iter().all(|o| o.passed)
}
