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
        /// Use a kind management cluster with CAPI installed by clusterctl
        /// (needs docker, kind, clusterctl, kubectl and internet).
        #[arg(long)]
        kind: bool,
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

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { only, kind } => run(&only, kind).await,
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
    let mut config = StackConfig::from_env(false)?;
    if kind {
        config.management = e2e::management::ManagementKind::Kind;
    }
    let outcomes = e2e::suite::run(&config, only).await?;
    println!("\n{}", e2e::suite::table(&outcomes));
    Ok(outcomes.iter().all(|o| o.passed))
}
