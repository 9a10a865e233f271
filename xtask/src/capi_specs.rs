//! `cargo xtask e2e capi`: Cluster API's own e2e specs against this provider.
//!
//! Builds the Ginkgo suite of `e2e/capi/` (a Go test binary linking
//! `sigs.k8s.io/cluster-api/test` at the CAPI version the control plane pins),
//! cached per content of its module under
//! `~/.cache/cluster-api-provider-libvirt/capi-specs/`, prepares what the kind
//! suite prepares plus the Kubernetes node image, and runs `capl-e2e capi`,
//! which makes the management cluster and the host and prints the table.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use capl_testbed::env;
use xshell::{Shell, cmd};

use crate::e2e::CapiArgs;
use crate::{node_image, repo_root, step};

/// Where `capl-e2e capi` writes the table of the run.
pub fn summary_path() -> PathBuf {
    crate::target_dir().join("tmp/capi-specs-summary.md")
}

/// The page with the table of the last run of every spec.
const PAGE: &str = "docs/src/developing.md";

/// The Go module of the suite.
fn module_dir() -> PathBuf {
    repo_root().join("e2e/capi")
}

/// Builds the suite's test binary (or reuses the one built from the same
/// module content) and returns its path.
pub fn build() -> Result<PathBuf> {
    let sh = Shell::new()?;
    let dir = module_dir();
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "go" || e == "mod" || e == "sum"))
        .collect();
    names.sort();
    let mut parts = Vec::new();
    for path in &names {
        parts.push(path.file_name().unwrap_or_default().to_string_lossy().into_owned());
        parts.push(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?);
    }
    let go_version = cmd!(sh, "go version").quiet().read().context("the suite needs Go: `go version` failed")?;
    parts.push(go_version);
    let key = crate::cache_key::short_hash(&parts.iter().map(String::as_str).collect::<Vec<_>>());
    let cache = crate::paths::user_cache(&format!("capi-specs/{key}"), "upstream e2e suite")?;
    let binary = cache.join("capi-specs.test");
    if binary.is_file() {
        return Ok(binary);
    }
    std::fs::create_dir_all(&cache)?;
    let partial = cache.join("capi-specs.test.partial");
    let _d = sh.push_dir(&dir);
    let _flags = sh.push_env("GOFLAGS", "-mod=readonly -buildvcs=false");
    let _toolchain = sh.push_env("GOTOOLCHAIN", "local");
    cmd!(sh, "nice -n 10 go test -c -o {partial} .")
        .run()
        .context("building the Ginkgo suite of e2e/capi (go test -c)")?;
    std::fs::rename(&partial, &binary)?;
    Ok(binary)
}

/// Prepares everything and runs `capl-e2e capi`.
pub fn run(args: &CapiArgs) -> Result<()> {
    let started = Instant::now();
    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    let runner = crate::e2e::prepare_kind(&sh, false)?.e2e;
    let node_image = step("Kubernetes node image", || node_image::build(false))?;
    sh.set_var(env::NODE_IMAGE, &node_image);
    let suite = step("Cluster API's e2e suite (go test -c)", build)?;
    sh.set_var(env::CAPI_SPECS_BIN, &suite);
    let mut selection: Vec<String> = args.focus.iter().flat_map(|f| ["--focus".to_string(), f.clone()]).collect();
    if args.all {
        selection.push("--all".into());
    }
    let summary = summary_path();
    let _ = std::fs::remove_file(&summary);
    sh.set_var(env::E2E_SUMMARY, &summary);
    let result = step("Cluster API's e2e specs", || {
        cmd!(sh, "{runner} capi {selection...}").run().context("some upstream specs failed (see the table above)")
    });
    if args.all {
        // A run of every spec is the developer page's table, passed or not.
        if let Ok(table) = std::fs::read_to_string(&summary) {
            let page = repo_root().join(PAGE);
            let text = std::fs::read_to_string(&page).with_context(|| format!("reading {PAGE}"))?;
            std::fs::write(&page, crate::bench_tables::replace_marked(&text, PAGE, "capi-specs", "last-run", &table)?)?;
            eprintln!("xtask e2e capi: the table of {PAGE} is this run's");
        }
    }
    eprintln!("xtask e2e capi: finished in {:.0} s", started.elapsed().as_secs_f64());
    result
}
