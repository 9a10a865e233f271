//! `cargo xtask e2e`: real CAPI Machines become real VMs.
//!
//! Prepares everything the e2e suite needs, in order, reusing what exists:
//! 1. host packages (`host deps`);
//! 2. the local control plane (`control-plane build`);
//! 3. the guest image (`guest-image`) and, when a `workload` scenario runs,
//!    the Kubernetes node image (`node-image`);
//! 4. the private libvirtd with its network and pools (`host up`);
//! 5. the provider binary and the `capl-e2e` runner (`cargo build`);
//!
//! then runs `capl-e2e run`, which starts the control plane, CAPI core and
//! the provider, runs every scenario one after another, tears it all down
//! and prints the summary table (scenario, result, seconds). The exit code
//! is non-zero when any scenario failed. The private libvirtd is stopped
//! afterwards unless `--keep-host`.
//!
//! `--libvirt container`: the same suite with a containerized libvirtd
//! (testcontainers, reached over TLS with a credentials Secret) instead of the
//! private one; a docker engine is started when none answers.
//!
//! `--kind`: the management cluster is a kind cluster made offline, with
//! cert-manager (built from its Go module) and CAPI core, the kubeadm
//! providers and this provider (its image, built offline) installed by
//! `clusterctl init`; the provider runs as the Deployment's Pod
//! and drives a containerized libvirtd on the kind node's docker network.
//! The scenarios that need guests routable from this machine or a second
//! manager process (workload, multihost, move) are the private run's.

use capl_testbed::env;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use xshell::{Shell, cmd};

use crate::{control_plane, guest_image, libvirt_host, repo_root, step};

#[derive(clap::Args, Default)]
pub struct Args {
    /// Only these scenarios (ids: init, upgrade, deployed, single, md, pause, restart, stopped, delete, workload,
    /// multihost, move, pod-logs); repeatable. Without it, every scenario the
    /// stack can run (upgrade, deployed and pod-logs need --kind).
    #[arg(long)]
    only: Vec<String>,
    /// Leave the private libvirtd running afterwards (faster re-runs).
    #[arg(long)]
    keep_host: bool,
    /// The management cluster is a kind cluster, the provider its Pod, the host
    /// a containerized libvirtd; everything built offline (docker engine started
    /// when none runs).
    #[arg(long)]
    kind: bool,
    /// The libvirt host: the private libvirtd (`host up`) or a containerized one.
    #[arg(long, value_enum, default_value_t)]
    libvirt: Libvirt,
    #[command(subcommand)]
    pub upstream: Option<Upstream>,
}

/// Suites other than this repository's own scenarios.
#[derive(clap::Subcommand)]
pub enum Upstream {
    /// Cluster API's own e2e specs (sigs.k8s.io/cluster-api/test/e2e) on kind
    /// and a containerized libvirtd; prints spec, result, duration.
    Capi(CapiArgs),
}

/// The arguments of `cargo xtask e2e capi`.
#[derive(clap::Args, Default, Clone)]
pub struct CapiArgs {
    /// Only these specs (quick-start, quick-start-topology, md-remediation, md-scale); repeatable.
    #[arg(long)]
    pub focus: Vec<String>,
    /// Every spec of the suite, not only the default set CI runs.
    #[arg(long)]
    pub all: bool,
}

/// Which libvirt host the suite drives.
#[derive(clap::ValueEnum, Clone, Copy, Default, PartialEq, Eq)]
pub enum Libvirt {
    #[default]
    Private,
    Container,
}

impl Args {
    /// What `cargo xtask test` runs: every scenario, on the libvirtd it started.
    pub fn for_test_command() -> Self {
        Self { keep_host: true, ..Self::default() }
    }

    /// What `cargo xtask test` runs after that: the suite on kind.
    pub fn kind_for_test_command() -> Self {
        Self { kind: true, libvirt: Libvirt::Container, ..Self::default() }
    }
}

pub fn run(args: Args) -> Result<()> {
    if args.kind || args.libvirt == Libvirt::Container {
        return run_in_containers(&args);
    }
    let started = Instant::now();
    step("host packages", libvirt_host::deps)?;
    step("control plane", || control_plane::run(control_plane::Command::Build))?;
    let image = step("guest image", || guest_image::build(false))?;
    let uri = step("private libvirtd", libvirt_host::up)?;
    let bins = step("build provider and e2e runner", build_binaries)?;

    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    sh.set_var(libvirt_host::URI_ENV, &uri);
    sh.set_var(env::GUEST_IMAGE, &image);
    sh.set_var(env::PROVIDER_BIN, &bins.provider);
    sh.set_var(env::MANIFESTS_BIN, &bins.manifests);
    sh.set_var(SUMMARY_ENV, summary_path("private"));
    let runner = &bins.e2e;
    let runner_args: Vec<String> = args.only.iter().flat_map(|o| ["--only".to_string(), o.clone()]).collect();
    let result = step("e2e scenarios", || {
        cmd!(sh, "{runner} run {runner_args...}").run().context("some e2e scenarios failed (see the table above)")
    });
    if !args.keep_host {
        step("stop private libvirtd", libvirt_host::down)?;
    }
    eprintln!("xtask e2e: finished in {:.0} s", started.elapsed().as_secs_f64());
    result
}

/// `cargo xtask e2e --kind` and `--libvirt container`: the suite with a
/// containerized libvirtd, on kind or on the local control plane, with
/// everything built offline (kind, its node image, the manager image and
/// CAPI's for kind; the containerized libvirtd's image; the guest image; the
/// control plane cache for kubectl and CAPI's CRDs).
fn run_in_containers(args: &Args) -> Result<()> {
    let started = Instant::now();
    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    let mut mode = vec!["--libvirt".to_string(), "container".to_string()];
    let bins = if args.kind {
        let upgrade = args.only.is_empty() || args.only.iter().any(|o| o == "upgrade");
        mode.push("--kind".into());
        prepare_kind(&sh, upgrade)?
    } else {
        let bins = prepare_containers(&sh)?;
        sh.set_var(env::PROVIDER_BIN, &bins.provider);
        bins
    };
    sh.set_var(SUMMARY_ENV, summary_path(if args.kind { "kind" } else { "container" }));
    let runner = &bins.e2e;
    let only: Vec<String> = args.only.iter().flat_map(|o| ["--only".to_string(), o.clone()]).collect();
    let what = if args.kind { "e2e scenarios on kind" } else { "e2e scenarios on a containerized libvirtd" };
    let result = step(what, || {
        cmd!(sh, "{runner} run {mode...} {only...}").run().context("some e2e scenarios failed (see the table above)")
    });
    eprintln!("xtask e2e: finished in {:.0} s", started.elapsed().as_secs_f64());
    result
}

/// What every run on a containerized libvirtd needs: virsh, the control
/// plane cache (kubectl, CAPI's CRDs), a docker engine, the libvirtd image,
/// the guest image and the binaries (returned); their variables set in `sh`.
fn prepare_containers(sh: &Shell) -> Result<Binaries> {
    step("host packages", libvirt_host::deps)?;
    step("control plane", || control_plane::run(control_plane::Command::Build))?;
    step("docker engine", || crate::docker_engine::up().map(drop))?;
    let libvirtd_image = step("containerized libvirtd image", crate::images::libvirtd_image)?;
    let guest = step("guest image", || guest_image::build(false))?;
    let bins = step("build provider and e2e runner", build_binaries)?;
    sh.set_var(env::LIBVIRTD_IMAGE, &libvirtd_image);
    sh.set_var(env::GUEST_IMAGE, &guest);
    sh.set_var(env::MANIFESTS_BIN, &bins.manifests);
    Ok(bins)
}

/// [`prepare_containers`] plus what a kind management cluster needs, built
/// offline: kind and its node image, the manager image, CAPI's images,
/// cert-manager and (with `previous`) the previous release.
pub fn prepare_kind(sh: &Shell, previous: bool) -> Result<Binaries> {
    let bins = prepare_containers(sh)?;
    let kind = step("kind and its node image", crate::kind::prepare)?;
    let image = crate::images::TEST_MANAGER_IMAGE;
    step("manager image, built offline", || crate::images::build_provider_offline(image))?;
    let capi_images =
        step("CAPI images, built offline", || crate::images::capi_images(&control_plane::control_plane_dir()?))?;
    sh.set_var(env::KIND_BIN, &kind.binary);
    sh.set_var(env::KIND_NODE_IMAGE, &kind.node_image);
    sh.set_var(env::KIND_WRAPPER_DIR, &kind.wrapper_dir);
    sh.set_var(env::REAL_DOCKER, &kind.real_docker);
    sh.set_var(env::PROVIDER_IMAGE, image);
    sh.set_var(env::CAPI_IMAGES, capi_images.join(","));
    let cert_manager = step("cert-manager, built offline", crate::cert_manager::prepare)?;
    sh.set_var(env::CERT_MANAGER_MANIFEST, &cert_manager.manifest);
    sh.set_var(env::CERT_MANAGER_IMAGES, cert_manager.images.join(","));
    if previous {
        let previous = step("previous release, built from this repository's history", crate::previous::release)?;
        sh.set_var(env::PREVIOUS_PROVIDER_IMAGE, previous.image);
        sh.set_var(env::PREVIOUS_RELEASE_DIR, &previous.dir);
    }
    Ok(bins)
}

/// The variable that tells `capl-e2e run` where to write its summary table too.
const SUMMARY_ENV: &str = env::E2E_SUMMARY;

/// Where the summary table of the run on `stack` goes (`private`, `container`, `kind`).
pub fn summary_path(stack: &str) -> PathBuf {
    crate::target_dir().join(format!("tmp/e2e-summary-{stack}.txt"))
}

/// The binaries the e2e suite and the demo run.
pub struct Binaries {
    pub provider: PathBuf,
    /// Writes the release the `move` scenario gives clusterctl.
    pub manifests: PathBuf,
    pub e2e: PathBuf,
}

/// `cargo build` of the provider's manager and the `capl-e2e` runner.
pub fn build_binaries() -> Result<Binaries> {
    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    cmd!(
        sh,
        "cargo build -p cluster-api-provider-libvirt --features cluster-api-provider-libvirt/sim --bin cluster-api-provider-libvirt --bin capl-manifests -p e2e --bin capl-e2e"
    )
        .run()
        .context("building the provider and the e2e runner failed")?;
    let target = crate::target_dir().join("debug");
    Ok(Binaries {
        provider: target.join("cluster-api-provider-libvirt"),
        manifests: target.join("capl-manifests"),
        e2e: target.join("capl-e2e"),
    })
}
