//! `cargo xtask host ...`: the private libvirtd for tests and the demo.
use anyhow::Result;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Install libvirt, QEMU and dnsmasq from Debian's packages.
    Deps,
}

pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Deps => anyhow::bail!("host deps is not implemented yet"),
    }
}
