//! `cargo xtask <command>`: every chore of the project.
//!
//! Each command lives in the module named after it; `main` only parses the
//! command line and dispatches.

mod control_plane;
mod libvirt_host;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Chores for cluster-api-provider-libvirt")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build or locate kube-apiserver, etcd, kubectl and CAPI core (envtest layout).
    #[command(subcommand)]
    ControlPlane(control_plane::Command),
    /// Install, start and stop the private libvirtd used by tests and the demo.
    #[command(subcommand)]
    Host(libvirt_host::Command),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::ControlPlane(cmd) => control_plane::run(cmd),
        Command::Host(cmd) => libvirt_host::run(cmd),
    }
}

/// The repository root (the parent of xtask's manifest directory).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the repo").to_path_buf()
}
