//! `cargo xtask previous`: the previous release of the provider, built from
//! this repository's own history for the `clusterctl upgrade` test.
//!
//! The previous release is a pinned commit ([`PREVIOUS_COMMIT`]) of this
//! repository, released as [`PREVIOUS_VERSION`]. Its manager and its
//! `capl-manifests` are built in a temporary `git worktree` with a target
//! directory of their own, and the two binaries are kept under
//! `~/.cache/cluster-api-provider-libvirt/previous/<commit>/`: a later run
//! reuses them, so only a cold machine pays the build (about three minutes
//! on two cores with the crates already downloaded). The worktree and its
//! target directory are removed once the binaries are copied.
//!
//! The clone must hold the commit: a shallow clone (GitHub's checkout action
//! by default) does not, and the command says so.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use crate::repo_root;

/// The commit the previous release is built from.
pub const PREVIOUS_COMMIT: &str = "6a2bf8e";
/// The version the previous release is given in the local clusterctl repository.
pub const PREVIOUS_VERSION: &str = "v0.1.0";

/// The previous release's binaries.
pub struct Previous {
    pub manager: PathBuf,
    pub manifests: PathBuf,
}

fn cache_dir(commit: &str) -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/cluster-api-provider-libvirt/previous").join(commit))
}

/// The previous release's binaries, built once per commit.
pub fn build() -> Result<Previous> {
    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    let wanted = format!("{PREVIOUS_COMMIT}^{{commit}}");
    let commit = cmd!(sh, "git rev-parse --verify --quiet {wanted}")
        .quiet()
        .read()
        .ok()
        .filter(|c| !c.is_empty())
        .with_context(|| {
            format!(
                "this clone does not hold commit {PREVIOUS_COMMIT}, the previous release: clone with its history \
                 (`git fetch --unshallow`, or `fetch-depth: 0` in the checkout action)"
            )
        })?;
    let dir = cache_dir(&commit)?;
    let previous =
        Previous { manager: dir.join("cluster-api-provider-libvirt"), manifests: dir.join("capl-manifests") };
    if previous.manager.is_file() && previous.manifests.is_file() {
        return Ok(previous);
    }
    fs::create_dir_all(&dir)?;
    let work = dir.join("worktree");
    let target = dir.join("target");
    // A leftover of an interrupted build goes first.
    let _ = cmd!(sh, "git worktree remove --force {work}").quiet().ignore_stderr().run();
    cmd!(sh, "git worktree add --detach {work} {commit}").quiet().run().context("checking out the previous release")?;
    let built = build_in(&work, &target);
    cmd!(sh, "git worktree remove --force {work}").quiet().run().context("removing the previous release's worktree")?;
    built?;
    for (name, to) in [("cluster-api-provider-libvirt", &previous.manager), ("capl-manifests", &previous.manifests)] {
        fs::copy(target.join("release").join(name), to).with_context(|| format!("keeping the previous {name}"))?;
    }
    fs::remove_dir_all(&target).context("removing the previous release's target directory")?;
    Ok(previous)
}

fn build_in(work: &Path, target: &Path) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(work);
    let _target = sh.push_env("CARGO_TARGET_DIR", target);
    let built = cmd!(
        sh,
        "cargo build --release --locked -p cluster-api-provider-libvirt --bin cluster-api-provider-libvirt --bin capl-manifests"
    )
    .run();
    if built.is_err() {
        bail!("building the previous release ({PREVIOUS_COMMIT}) failed (output above)");
    }
    Ok(())
}
