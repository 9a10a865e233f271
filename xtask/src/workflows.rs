//! `cargo xtask workflows`: the GitHub Actions workflows under
//! `.github/workflows/` checked with actionlint, which `cargo xtask test`
//! runs too. The workflows cannot run here; actionlint checks what can be
//! checked without running them: the syntax, expressions and their types,
//! the inputs of well-known actions, job dependencies, and runner labels.
//!
//! actionlint is built from its Go module, at [`ACTIONLINT_VERSION`], into the
//! cache beside the node image's Go builds and reused from there.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use crate::go_modules::{go_build, prepare_module};
use crate::repo_root;

/// The actionlint release built and run.
pub const ACTIONLINT_VERSION: &str = "v1.7.12";

/// Builds (or finds) actionlint and runs it on every workflow of the repository;
/// fails on any finding.
pub fn lint() -> Result<()> {
    let actionlint = build_actionlint()?;
    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    let workflows = repo_root().join(".github/workflows");
    let count = fs::read_dir(&workflows)
        .with_context(|| format!("reading {}", workflows.display()))?
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "yml" || x == "yaml")))
        .count();
    if count == 0 {
        bail!("no workflow in {}: nothing for actionlint to check", workflows.display());
    }
    if cmd!(sh, "{actionlint} -no-color").run().is_err() {
        bail!("actionlint found problems in .github/workflows (listed above): fix the workflows");
    }
    eprintln!("workflows: actionlint {ACTIONLINT_VERSION} found nothing in {count} workflows");
    Ok(())
}

fn build_actionlint() -> Result<PathBuf> {
    let dir = crate::node_image::go_cache_root()?.join(format!("actionlint-{ACTIONLINT_VERSION}"));
    let bin = dir.join("bin");
    fs::create_dir_all(&bin)?;
    let sh = Shell::new()?;
    sh.set_var("GOTOOLCHAIN", "local");
    sh.set_var("GOWORK", "off");
    sh.set_var("GO111MODULE", "on");
    cmd!(sh, "go version")
        .quiet()
        .ignore_stdout()
        .run()
        .context("actionlint is built with Go: `go` must be on PATH")?;
    let module = prepare_module(
        &sh,
        &dir,
        "actionlint",
        &format!(
            "module capl.local/tools/actionlint\n\ngo 1.26.0\n\nrequire github.com/rhysd/actionlint {ACTIONLINT_VERSION}\n"
        ),
        &["github.com/rhysd/actionlint/cmd/actionlint"],
        &[],
    )?;
    let ldflags = format!("-s -w -X github.com/rhysd/actionlint.version={ACTIONLINT_VERSION}");
    go_build(&sh, &module, &bin, "actionlint", "github.com/rhysd/actionlint/cmd/actionlint", &ldflags, true)?;
    Ok(bin.join("actionlint"))
}
