//! `capl-e2e`: the e2e suite (`run`) and the demo (`demo`). Started by
//! `cargo xtask e2e` and `cargo xtask demo`, which prepare the host first.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use e2e::harness::stack::StackConfig;

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
        /// Run only these scenario ids (init, deployed, single, md, pause, restart, stopped, delete,
        /// workload, multihost, move, pod-logs).
        #[arg(long)]
        only: Vec<String>,
        /// The management cluster is a kind cluster with everything installed by
        /// clusterctl init, the provider as its Pod (what `cargo xtask e2e --kind`
        /// builds offline); implies `--libvirt container`.
        #[arg(long)]
        kind: bool,
        /// The libvirt host: the private libvirtd of `cargo xtask host up`, or a
        /// containerized libvirtd reached over TLS (testcontainers; needs a docker
        /// engine and the image of `cargo xtask libvirtd-image`).
        #[arg(long, value_parser = ["private", "container"], default_value = "private")]
        libvirt: String,
    },
    /// Cluster API's own e2e specs (`e2e/capi/`) on kind and a containerized
    /// libvirtd (started by `cargo xtask e2e capi`): prints spec, result, duration.
    Capi {
        /// Only these specs (quick-start, quick-start-topology, md-remediation, md-scale); repeatable.
        #[arg(long)]
        focus: Vec<String>,
        /// Every spec of the suite, not only the default set.
        #[arg(long)]
        all: bool,
    },
    /// A benchmark of the provider at scale (started by `cargo xtask bench`): prints a table, writes JSON.
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
        /// Multiplies the bound of each step of the Kubernetes cluster (for slower or faster machines).
        #[arg(long, default_value_t = 1.0)]
        timeout_factor: f64,
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
    /// The scale workload with no manager: the benchmark writes the least a provider must, so that
    /// what remains is CAPI core's and the API server's cost (the floor under `scale`).
    Floor {
        #[arg(long, default_value_t = 1000)]
        machines: usize,
        /// Answers in flight at once (as the manager's --concurrency).
        #[arg(long, default_value_t = 10)]
        concurrency: usize,
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
    /// Machines on the simulated host through failing calls, dropped connections and a daemon
    /// restart, against the same without faults; then machines beside a hung host, against alone.
    Faults {
        #[arg(long, default_value_t = 200)]
        machines: usize,
        /// Machines on the hung host.
        #[arg(long, default_value_t = 30)]
        hung: usize,
        /// Machines on the healthy host beside it.
        #[arg(long, default_value_t = 5)]
        healthy: usize,
        /// Seconds between dropping every connection.
        #[arg(long, default_value_t = 60)]
        drop_every: u64,
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
        Bench::Floor { machines, concurrency } => {
            e2e::bench::floor::run(&e2e::bench::floor::Args { machines, concurrency, out }).await
        }
        Bench::Overhead { machines } => {
            let config = StackConfig::from_env(false)?;
            let e2e::harness::stack::Backend::Libvirt { uri } = config.backend else { unreachable!("from_env(false)") };
            let guest_image = config.guest_image.ok_or_else(|| anyhow::anyhow!("no guest image"))?;
            let args = e2e::bench::overhead::Args { uri, guest_image, provider_binary, machines, out };
            e2e::bench::overhead::run(&args).await
        }
        Bench::Faults { machines, hung, healthy, drop_every } => {
            let drop_every = std::time::Duration::from_secs(drop_every);
            let args = e2e::bench::faults::Args { machines, hung, healthy, drop_every, provider_binary, out };
            e2e::bench::faults::run(&args).await
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
        Command::Run { only, kind, libvirt } => run(&only, kind, &libvirt).await,
        Command::Bench { which, out } => bench(which, out).await,
        Command::Capi { focus, all } => match e2e::capi_specs::select(&focus, all) {
            Ok(specs) => tokio::task::spawn_blocking(move || e2e::capi_specs::run(&specs))
                .await
                .unwrap_or_else(|e| Err(anyhow::anyhow!("the upstream specs' runner panicked: {e}"))),
            Err(err) => Err(err),
        },
        Command::Demo { hypervisor, exit_after_ready, workload, timeout_factor } => {
            match StackConfig::from_env(hypervisor == "sim") {
                Ok(config) if workload => {
                    e2e::demo::run_workload(&config, exit_after_ready, timeout_factor).await.map(|()| true)
                }
                Ok(config) => e2e::demo::run(&config, exit_after_ready).await.map(|()| true),
                Err(err) => Err(err),
            }
        }
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

/// Where `run` also writes its summary table, if set.
const SUMMARY_ENV: &str = capl_testbed::env::E2E_SUMMARY;

async fn run(only: &[String], kind: bool, libvirt: &str) -> anyhow::Result<bool> {
    use e2e::harness::management::ManagementKind;
    use e2e::harness::stack::Backend;
    let config = match (kind, libvirt) {
        (false, "private") => StackConfig::private_libvirtd()?,
        (false, _) => StackConfig::with(Backend::Container, ManagementKind::Local)?,
        (true, _) => StackConfig::with(Backend::Container, ManagementKind::Kind)?,
    };
    let outcomes = e2e::scenarios::suite::run(&config, only).await?;
    let table = e2e::scenarios::suite::table(&outcomes);
    println!("\n{table}");
    // For whoever started us to repeat at the end of a long log (`cargo xtask test`).
    if let Some(path) = std::env::var_os(SUMMARY_ENV) {
        let stack = format!("{} management cluster, {} libvirtd", config.management.name(), config.backend.name());
        if let Err(err) = std::fs::write(&path, format!("e2e on the {stack}:\n{table}")) {
            eprintln!("error: writing the summary to {}: {err}", std::path::Path::new(&path).display());
        }
    }
    Ok(outcomes.iter().all(|o| o.passed))
}
