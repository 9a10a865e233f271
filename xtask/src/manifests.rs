//! `cargo xtask manifests` and `cargo xtask release`: both run the provider's
//! `capl-manifests` binary, which renders everything from the Rust types.

use std::path::Path;

use anyhow::Result;
use xshell::{Shell, cmd};

use crate::repo_root;

/// Regenerate config/ and metadata.yaml.
pub fn write() -> Result<()> {
    let sh = Shell::new()?;
    let root = repo_root();
    sh.change_dir(&root);
    cmd!(sh, "cargo run --quiet --locked -p cluster-api-provider-libvirt --bin capl-manifests -- write --root {root}")
        .run()?;
    Ok(())
}

/// Write the release artifacts to `out`.
pub fn release(version: &str, image: &str, out: &Path, watch_namespace: Option<&str>) -> Result<()> {
    let sh = Shell::new()?;
    let root = repo_root();
    sh.change_dir(&root);
    let scope: Vec<String> = watch_namespace.map(|ns| vec!["--watch-namespace".into(), ns.into()]).unwrap_or_default();
    cmd!(
        sh,
        "cargo run --quiet --locked -p cluster-api-provider-libvirt --bin capl-manifests -- release --version {version} --image {image} --root {root} --out {out} {scope...}"
    )
    .run()?;
    Ok(())
}
