//! `cargo xtask test`: the README's test command and what CI runs.
//!
//! It sets up everything the tests need on a fresh Debian/Ubuntu machine and
//! then runs them; nothing is skipped. In order:
//! 1. host packages (libvirt, QEMU, dnsmasq, ISO tools) when missing;
//! 2. the local control plane (kube-apiserver, etcd, kubectl, CAPI core),
//!    built from Go modules into a cache outside the repository, or reused;
//! 3. a private libvirtd with its own network and pools;
//! 4. `cargo test` over the whole workspace, with that libvirtd's URI in
//!    `CAPL_TEST_LIBVIRT_URI`, and then the libvirt conformance suite on its
//!    own with its output shown (it prints how many scenarios ran on each
//!    backend: libvirt-sim, `test:///default` and the real libvirtd);
//! 5. the private libvirtd is stopped again (unless `--keep-host`).

use std::time::Instant;

use anyhow::Result;
use xshell::{Shell, cmd};

use crate::{control_plane, libvirt_host, repo_root};

#[derive(clap::Args)]
pub struct Args {
    /// Leave the private libvirtd running afterwards (faster re-runs).
    #[arg(long)]
    keep_host: bool,
    /// Extra arguments passed to `cargo test` after `--`, e.g. a test name filter.
    #[arg(last = true)]
    cargo_test_args: Vec<String>,
}

pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    step("host packages", libvirt_host::deps)?;
    step("control plane", || control_plane::run(control_plane::Command::Build))?;
    let uri = step("private libvirtd", libvirt_host::up)?;

    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    sh.set_var("CAPL_TEST_LIBVIRT_URI", &uri);
    let extra = &args.cargo_test_args;
    let workspace = step("cargo test", || {
        cmd!(sh, "cargo test --workspace --locked --no-fail-fast -- --skip conformance {extra...}")
            .run()
            .map_err(anyhow::Error::from)
    });
    let conformance = step("conformance suite", || {
        cmd!(sh, "cargo test --locked -p cluster-api-provider-libvirt --test conformance -- --nocapture")
            .run()
            .map_err(anyhow::Error::from)
    });
    let result = workspace.and(conformance);

    if !args.keep_host {
        step("stop private libvirtd", libvirt_host::down)?;
    }
    eprintln!("xtask test: finished in {:.0} s", started.elapsed().as_secs_f64());
    result
}

fn step<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    eprintln!("==> {name}");
    let started = Instant::now();
    let out = f();
    eprintln!("==> {name}: {} in {:.1} s", if out.is_ok() { "done" } else { "FAILED" }, started.elapsed().as_secs_f64());
    out
}
