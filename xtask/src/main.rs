//! `cargo xtask <command>`: every chore of the project.
//!
//! Each command lives in the module named after it; `main` only parses the
//! command line and dispatches. xtask does not depend on the provider crate,
//! so it builds before libvirt's development headers are installed.

mod background;
mod bench;
mod bench_ratios;
mod bench_sim;
mod bench_tables;
mod cache_key;
mod capi_specs;
mod cert_manager;
mod control_plane;
mod crates;
mod demo;
mod demo_check;
mod deploy;
mod docker;
mod docker_engine;
mod docs;
mod e2e;
mod go_modules;
mod guest_image;
mod images;
mod kind;
mod libvirt_host;
mod manifests;
mod node_addons;
mod node_image;
mod paths;
mod previous;
mod progress;
mod test;
mod workflows;

use std::path::PathBuf;

use anyhow::Result;
pub use cache_key::short_hash;
use clap::{Parser, Subcommand};
pub use paths::{repo_root, target_dir};
pub use progress::step;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Chores for cluster-api-provider-libvirt")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every test, installing and starting what they need (the README's test command).
    Test(test::Args),
    /// Regenerate CRDs, RBAC, the manager manifests, metadata.yaml, the generated flavor and the API reference.
    Manifests,
    /// Check the book's internal links and build it with mdBook into target/book.
    Docs,
    /// Write a release as a clusterctl provider repository: <out>/infrastructure-libvirt/<version>/
    /// (components, metadata, templates, install.yaml).
    Release {
        /// Release version, e.g. v0.1.0.
        #[arg(long)]
        version: String,
        /// Manager image, e.g. registry.example/cluster-api-provider-libvirt:v0.1.0.
        #[arg(long)]
        image: String,
        /// Output directory.
        #[arg(long, default_value = "dist")]
        out: PathBuf,
        /// Install for one namespace: the manager watches only it, and its
        /// rules are a Role there instead of a ClusterRole.
        #[arg(long)]
        watch_namespace: Option<String>,
    },
    /// Apply the CRDs to the cluster of the current kubeconfig.
    Install,
    /// Delete the CRDs from the cluster of the current kubeconfig.
    Uninstall,
    /// Deploy the controller (CRDs, RBAC, policy, Deployment) with the given image.
    Deploy {
        #[arg(long)]
        image: String,
    },
    /// Remove what `deploy` applied.
    Undeploy,
    /// Build the manager image with docker, and check it (nonroot, starts, loads libvirt).
    DockerBuild {
        #[arg(long)]
        image: String,
        /// No registry: build on this machine and assemble the image from its
        /// files instead of the Dockerfile's base images.
        #[arg(long)]
        offline: bool,
    },
    /// Push the manager image with docker.
    DockerPush {
        #[arg(long)]
        image: String,
    },
    /// Build or locate kube-apiserver, etcd, kubectl and CAPI core (envtest layout).
    #[command(subcommand)]
    ControlPlane(control_plane::Command),
    /// Install, start and stop the private libvirtd used by tests and the demo.
    #[command(subcommand)]
    Host(libvirt_host::Command),
    /// Use the running docker engine, or install and start dockerd (and stop it again).
    #[command(subcommand)]
    DockerEngine(docker_engine::Command),
    /// Build (or reuse) the containerized libvirtd's image; print its name.
    LibvirtdImage,
    /// Build (or reuse) the kind node image (offline, cgroup v1 ready); print its name.
    KindNodeImage,
    /// The provider at scale: scale, steady, floor, overhead, contention (all but scale without a name); tables and target/bench/*.json.
    Bench(bench::Args),
    /// Write the book's performance tables from target/bench/*.json (`bench` does it after each run).
    BenchTables,
    /// Define and start 10,000 domains on one simulated host; print time and peak memory.
    BenchSim(bench_sim::Args),
    /// Build (or reuse) the tiny test guest image the e2e tests and the demo boot; print its path.
    GuestImage(guest_image::Args),
    /// Build (or reuse) the Kubernetes node image (Debian, kubeadm, containerd, images); print its path.
    NodeImage(node_image::Args),
    /// Run the end-to-end scenarios on real VMs and print a summary table.
    E2e(e2e::Args),
    /// One cluster with two machines, narrated; Ctrl-C cleans up.
    Demo(demo::Args),
    /// Check .github/workflows with actionlint (built from its Go module; `test` runs it too).
    Workflows,
    /// Build (or reuse) the previous release from this repository's history: its manager, capl-manifests,
    /// clusterctl repository directory and manager image; print their paths and the image.
    Previous,
    /// Build (or reuse) cert-manager for the kind management cluster from its Go module: its images and
    /// its static manifest; print the manifest's path and the images.
    CertManager,
    /// Build (or reuse), one after another, what the suites on kind need beyond the workspace: cert-manager,
    /// the previous release, Cluster API's e2e suite, kind and its node image (`test` runs it in the
    /// background).
    KindPrerequisites,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Test(args) => test::run(args),
        Command::CertManager => {
            let built = cert_manager::prepare()?;
            println!("{} {}", built.manifest.display(), built.images.join(" "));
            Ok(())
        }
        Command::Previous => {
            let previous = previous::build()?;
            let release = previous::release()?;
            println!(
                "{} {} {} {} {}",
                previous::PREVIOUS_VERSION,
                previous.manager.display(),
                previous.manifests.display(),
                release.dir.display(),
                release.image
            );
            Ok(())
        }
        // kind's node image last: it is made of the node image's binaries,
        // which `cargo xtask test` builds in another job started before this one.
        Command::KindPrerequisites => {
            cert_manager::prepare()?;
            previous::release()?;
            capi_specs::build()?;
            kind::prepare()?;
            Ok(())
        }
        Command::Manifests => manifests::write(),
        Command::Docs => docs::build(),
        Command::Release { version, image, out, watch_namespace } => {
            let out = if out.is_absolute() { out } else { repo_root().join(out) };
            manifests::release(&version, &image, &out, watch_namespace.as_deref())
        }
        Command::Install => deploy::install(),
        Command::Uninstall => deploy::uninstall(),
        Command::Deploy { image } => deploy::deploy(&image),
        Command::Undeploy => deploy::undeploy(),
        Command::DockerBuild { image, offline } => docker::build(&image, offline),
        Command::DockerPush { image } => docker::push(&image),
        Command::ControlPlane(cmd) => control_plane::run(cmd),
        Command::Host(cmd) => libvirt_host::run(cmd),
        Command::DockerEngine(cmd) => docker_engine::run(cmd),
        Command::LibvirtdImage => images::libvirtd_image_command(),
        Command::KindNodeImage => kind::node_image_command(),
        Command::Bench(args) => bench::run(args),
        Command::BenchTables => bench_tables::write(),
        Command::BenchSim(args) => bench_sim::run(args),
        Command::GuestImage(args) => guest_image::run(args),
        Command::NodeImage(args) => node_image::run(args),
        Command::E2e(e2e::Args { upstream: Some(e2e::Upstream::Capi(capi)), .. }) => capi_specs::run(&capi),
        Command::E2e(args) => e2e::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Workflows => workflows::lint(),
    }
}
