//! `cargo xtask bench-sim`: define and start 10,000 domains on one simulated host
//! (libvirt-sim), from one caller and from concurrent callers; print time and peak memory.
//!
//! Each run is its own process (`libvirt-sim/examples/bench_10k.rs`, release build) so
//! that its VmHWM is its own.

use anyhow::{Context, Result};
use xshell::{Shell, cmd};

#[derive(clap::Args)]
pub struct Args {
    /// Domains to define and start.
    #[arg(long, default_value_t = 10_000)]
    domains: usize,
    /// Concurrent callers for the second run.
    #[arg(long, default_value_t = 8)]
    threads: usize,
}

pub fn run(args: Args) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(crate::repo_root());
    let domains = args.domains.to_string();
    for threads in [1, args.threads] {
        let threads = threads.to_string();
        cmd!(
            sh,
            "cargo run --quiet --release -p libvirt-sim --example bench_10k -- --domains {domains} --threads {threads}"
        )
        .run()
        .with_context(|| format!("benchmark with {threads} caller(s) failed"))?;
    }
    Ok(())
}
