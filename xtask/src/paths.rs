//! Where the repository and Cargo's build output are.

use std::path::PathBuf;

/// The repository root (the parent of xtask's manifest directory).
pub fn repo_root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the repo").to_path_buf()
}

/// `~/.cache/cluster-api-provider-libvirt/<sub>`: what the tasks build once
/// per version and keep across clones; `what` names it in the error.
pub fn user_cache(sub: &str, what: &str) -> anyhow::Result<PathBuf> {
    let home =
        std::env::var_os("HOME").ok_or_else(|| anyhow::anyhow!("HOME is not set: cannot place the {what} cache"))?;
    Ok(PathBuf::from(home).join(".cache/cluster-api-provider-libvirt").join(sub))
}

/// Cargo's target directory: `CARGO_TARGET_DIR`, else `<repo>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo_root().join("target"), PathBuf::from)
}
