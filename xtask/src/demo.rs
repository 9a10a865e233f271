//! `cargo xtask demo`: the README's main command.
//!
//! Prepares the host like `cargo xtask e2e` (packages, control plane, node
//! image, private libvirtd, binaries), then hands the terminal to
//! `capl-e2e demo`: it starts a local control plane, CAPI core, the kubeadm
//! bootstrap and control plane providers and this provider, and forms a real
//! Kubernetes cluster by the steps the e2e `workload` scenario uses
//! (`e2e/src/workload/formation.rs`): `clusterctl generate cluster` from the
//! default template with one control-plane machine and no worker, `kubectl
//! apply`, the control plane Available, then the MachineDeployment scaled to
//! one worker booting the node image of `cargo xtask node-image`. Each step has
//! a bound; a step that passes it fails the demo naming the step, the
//! machines' phases, the KubeadmControlPlane's conditions and the guests'
//! kubeadm lines. It narrates machine phases, kubeadm progress and node
//! readiness, says how to reach the workload cluster, and on Ctrl-C (or when
//! it failed, or with `--exit-after-ready` once both Nodes are Ready) deletes
//! the cluster and stops everything. The private libvirtd is stopped too when
//! this demo started it (a daemon that was already running, e.g. for tests, is
//! left running).
//!
//! `--quick` makes one Cluster with two plain Machines booting the tiny guest
//! image instead, and prints the machine phases, domain states, IPs and the
//! guests' console lines (about a minute; it gives up after 10).
//!
//! `--hypervisor sim` runs the quick demo on the provider's embedded simulated
//! libvirt host: no libvirtd, no guest image, no root needed at run time.

use capl_testbed::env;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::{control_plane, e2e, guest_image, libvirt_host, node_image, repo_root};

#[derive(clap::Args)]
pub struct Args {
    /// libvirt: the private libvirtd and real QEMU guests; sim: the provider's embedded simulator.
    #[arg(long, value_parser = ["libvirt", "sim"], default_value = "libvirt")]
    hypervisor: String,
    /// Clean up and exit as soon as the cluster is ready (for scripts and CI).
    #[arg(long)]
    exit_after_ready: bool,
    /// Two plain machines on the tiny guest image (about a minute) instead of the
    /// Kubernetes cluster; implied by `--hypervisor sim`.
    #[arg(long)]
    quick: bool,
    /// Multiplies the bound of each step of the Kubernetes cluster: e.g. 2 on a
    /// machine slower than 2 cores under software emulation.
    #[arg(long, default_value_t = 1.0)]
    timeout_factor: f64,
}

pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let sim = args.hypervisor == "sim";
    if sim && !args.quick {
        eprintln!("demo: --hypervisor sim runs the quick demo (two plain machines): kubeadm needs real guests");
    }
    let workload = !sim && !args.quick;
    eprintln!("demo: preparing (the first run installs packages and builds the control plane; later runs reuse them)");
    libvirt_host::deps()?;
    control_plane::run(control_plane::Command::Build)?;
    let mut runner_env = Vec::new();
    let mut started_libvirtd = false;
    if !sim {
        let image = guest_image::build(false)?;
        started_libvirtd = !libvirt_host::is_up();
        let uri = libvirt_host::up()?;
        runner_env.push((libvirt_host::URI_ENV, uri));
        runner_env.push((env::GUEST_IMAGE, image.display().to_string()));
        if workload {
            let node_image = node_image::build(false)?;
            runner_env.push((env::NODE_IMAGE, node_image.display().to_string()));
        }
    }
    let bins = e2e::build_binaries()?;
    eprintln!("demo: prepared in {:.0} s; starting the demo", started.elapsed().as_secs_f64());
    let mut command = Command::new(&bins.e2e);
    command
        .current_dir(repo_root())
        .args(["demo", "--hypervisor", &args.hypervisor])
        .env(env::PROVIDER_BIN, &bins.provider)
        .envs(runner_env);
    if args.exit_after_ready {
        command.arg("--exit-after-ready");
    }
    if workload {
        command.arg("--workload").arg("--timeout-factor").arg(args.timeout_factor.to_string());
    }
    let mut child = command.spawn().with_context(|| format!("starting {}", bins.e2e.display()))?;
    // Ctrl-C reaches the whole foreground process group: the demo cleans up on
    // it, and this process waits for that instead of dying first.
    // SAFETY: sets the disposition of SIGINT for this process; no handler runs.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let status = child.wait().context("waiting for the demo")?;
    if started_libvirtd {
        eprintln!("demo: stopping the private libvirtd this demo started");
        libvirt_host::down()?;
    }
    if !status.success() {
        bail!("the demo failed ({status})");
    }
    Ok(())
}
