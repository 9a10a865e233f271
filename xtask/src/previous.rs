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
//! [`release`] adds what `clusterctl` installs it from: the release directory
//! its own `capl-manifests release` writes (with its own templates, taken
//! from the commit by `git archive`) for the manager image
//! [`PREVIOUS_IMAGE`], which [`release`] builds from the previous manager the
//! way `docker-build --offline` builds the current one.
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

/// The previous release's manager image.
pub const PREVIOUS_IMAGE: &str = "capl.local/cluster-api-provider-libvirt:v0.1.0";

/// The previous release's binaries.
pub struct Previous {
    /// The full commit they are built from.
    pub commit: String,
    pub manager: PathBuf,
    pub manifests: PathBuf,
}

/// The previous release as clusterctl installs it.
pub struct Release {
    /// Holds `infrastructure-libvirt/<PREVIOUS_VERSION>/` (components, metadata, templates).
    pub dir: PathBuf,
    /// The manager image the components name, in the docker engine.
    pub image: &'static str,
}

fn cache_dir(commit: &str) -> Result<PathBuf> {
    crate::paths::user_cache(&format!("previous/{commit}"), "previous release")
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
    let previous = Previous {
        manager: dir.join("cluster-api-provider-libvirt"),
        manifests: dir.join("capl-manifests"),
        commit: commit.clone(),
    };
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

/// The previous release's clusterctl repository directory and its manager
/// image, made from [`build`]'s binaries once per commit.
pub fn release() -> Result<Release> {
    let previous = build()?;
    let dir = cache_dir(&previous.commit)?.join("release");
    let components = dir.join("infrastructure-libvirt").join(PREVIOUS_VERSION).join("infrastructure-components.yaml");
    let sh = Shell::new()?;
    if !components.is_file() {
        // The templates of that commit: its release copies them.
        let root = cache_dir(&previous.commit)?.join("tree");
        if root.exists() {
            fs::remove_dir_all(&root)?;
        }
        fs::create_dir_all(&root)?;
        sh.change_dir(repo_root());
        let archive = root.join("templates.tar");
        let commit = &previous.commit;
        cmd!(sh, "git archive --output {archive} {commit} templates").quiet().run()?;
        cmd!(sh, "tar -C {root} -xf {archive}").quiet().run()?;
        let manifests = &previous.manifests;
        let staging = dir.with_extension("partial");
        if staging.exists() {
            fs::remove_dir_all(&staging)?;
        }
        cmd!(
            sh,
            "{manifests} release --version {PREVIOUS_VERSION} --image {PREVIOUS_IMAGE} --root {root} --out {staging}"
        )
        .quiet()
        .run()
        .context("writing the previous release with its own capl-manifests")?;
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::rename(&staging, &dir)?;
        fs::remove_dir_all(&root)?;
    }
    crate::images::previous_manager_image(&previous.manager, PREVIOUS_IMAGE, &previous.commit)?;
    Ok(Release { dir, image: PREVIOUS_IMAGE })
}
