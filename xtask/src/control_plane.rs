//! `cargo xtask control-plane ...`: see issue 6.
use anyhow::Result;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Build (or reuse) the control-plane binaries and print their directory.
    Build,
}

pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Build => anyhow::bail!("control-plane build is not implemented yet"),
    }
}
