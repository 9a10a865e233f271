//! `cargo xtask bench [scale|steady|floor|overhead|contention|faults]`: what the
//! provider costs at scale. Each benchmark prints a table and writes
//! `target/bench/<name>.json`, whose table then replaces that benchmark's in
//! the book (`docs/src/performance.md`, see `bench_tables`); without a subcommand steady, floor,
//! overhead, contention and faults run, the scale figures coming from the
//! steady run (which creates the same 1,000 machines first). `scale` alone is
//! followed by `floor` with as many machines; when both ran, the ratios of
//! the two come last (`bench_ratios`) and first on the page.
//!
//! Prepares what the benchmark needs, reusing what exists: the local control
//! plane (`control-plane build`), a release build of the manager and of the
//! `capl-e2e` runner, and for `overhead` and `contention` the host packages,
//! the guest image and the private libvirtd (`host up`, stopped again
//! afterwards when this command started it). Then runs `capl-e2e bench
//! <name>`, passing on the arguments after the name (see `capl-e2e bench
//! <name> --help`: `--machines`, `--minutes`, `--concurrency`).

use capl_testbed::env;
use std::path::PathBuf;

use anyhow::{Context, Result};
use xshell::{Shell, cmd};

use crate::{bench_tables, control_plane, guest_image, libvirt_host, repo_root, step};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    which: Option<Which>,
}

#[derive(clap::Subcommand, Clone)]
enum Which {
    /// 1,000 machines on the simulated host through the API server with CAPI core: created at once, then deleted;
    /// then the floor with as many machines, and their ratios.
    Scale(Rest),
    /// The same 1,000 machines left alone (5 minutes by default): calls, requests and reconciles per minute.
    Steady(Rest),
    /// The scale workload with no manager, the benchmark answering in its place: what CAPI core and the API server cost.
    Floor(Rest),
    /// 20 machines on the private libvirtd: each create step beside the same step done with virsh.
    Overhead(Rest),
    /// 100 machines at once on one real network: distinct addresses, reservations per second.
    Contention(Rest),
    /// 200 machines through failing calls, dropped connections and a daemon restart, against none; then 5 beside a hung host, against alone.
    Faults(Rest),
}

#[derive(clap::Args, Clone)]
struct Rest {
    /// Passed to `capl-e2e bench <name>`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

impl Which {
    fn name(&self) -> &'static str {
        match self {
            Which::Scale(_) => "scale",
            Which::Steady(_) => "steady",
            Which::Floor(_) => "floor",
            Which::Overhead(_) => "overhead",
            Which::Contention(_) => "contention",
            Which::Faults(_) => "faults",
        }
    }

    fn needs_libvirtd(&self) -> bool {
        matches!(self, Which::Overhead(_) | Which::Contention(_))
    }

    fn args(&self) -> &[String] {
        match self {
            Which::Scale(r)
            | Which::Steady(r)
            | Which::Floor(r)
            | Which::Overhead(r)
            | Which::Contention(r)
            | Which::Faults(r) => &r.args,
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    let runs = match args.which {
        // The floor right after, on the same machine: the ratio compares one run with one run.
        Some(Which::Scale(rest)) => {
            let machines = machines_args(&rest.args);
            vec![Which::Scale(rest), Which::Floor(Rest { args: machines })]
        }
        Some(which) => vec![which],
        None => vec![
            Which::Steady(Rest { args: Vec::new() }),
            Which::Floor(Rest { args: Vec::new() }),
            Which::Overhead(Rest { args: Vec::new() }),
            Which::Contention(Rest { args: Vec::new() }),
            Which::Faults(Rest { args: Vec::new() }),
        ],
    };
    step("control plane", || control_plane::run(control_plane::Command::Build))?;
    let mut env: Vec<(&str, String)> = Vec::new();
    let mut started_libvirtd = false;
    if runs.iter().any(Which::needs_libvirtd) {
        step("host packages", libvirt_host::deps)?;
        let image = step("guest image", || guest_image::build(false))?;
        started_libvirtd = !libvirt_host::is_up();
        let uri = step("private libvirtd", libvirt_host::up)?;
        env.push((libvirt_host::URI_ENV, uri));
        env.push((env::GUEST_IMAGE, image.display().to_string()));
    }
    let (provider, runner) = step("release build of the manager and the benchmark runner", build)?;
    let out = crate::target_dir().join("bench");
    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    sh.set_var(env::PROVIDER_BIN, &provider);
    for (key, value) in &env {
        sh.set_var(key, value);
    }
    let mut result = Ok(());
    for which in &runs {
        let name = which.name();
        let rest = which.args();
        let ran = step(&format!("bench {name}"), || {
            cmd!(sh, "{runner} bench --out {out} {name} {rest...}")
                .run()
                .with_context(|| format!("bench {name} failed"))
        });
        if result.is_ok() {
            result = ran;
        }
    }
    if started_libvirtd {
        step("stop private libvirtd", libvirt_host::down)?;
    }
    result?;
    if let Some(path) = crate::bench_ratios::write(&out)? {
        println!("wrote {}", path.display());
    }
    step("the book's performance tables", bench_tables::write)
}

/// `--machines N` (or `--machines=N`) out of a benchmark's arguments.
fn machines_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--machines" {
            out.push(arg.clone());
            out.extend(iter.next().cloned());
        } else if arg.starts_with("--machines=") {
            out.push(arg.clone());
        }
    }
    out
}

/// Release builds: the figures are the manager's as it would run.
fn build() -> Result<(PathBuf, PathBuf)> {
    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    cmd!(
        sh,
        "cargo build --release -p cluster-api-provider-libvirt --features cluster-api-provider-libvirt/sim --bin cluster-api-provider-libvirt -p e2e --bin capl-e2e"
    )
    .run()
    .context("building the manager and the benchmark runner failed")?;
    let target = crate::target_dir().join("release");
    Ok((target.join("cluster-api-provider-libvirt"), target.join("capl-e2e")))
}
