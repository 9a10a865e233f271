//! The crates others take (those whose manifest allows publishing, today
//! `libvirt-sim` and `capl-api`): `cargo xtask test` packages them the way
//! `cargo publish` would, building each from its packaged sources alone, so a
//! release cannot find a crate that does not package.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use xshell::{Shell, cmd};

use crate::repo_root;

/// The workspace's publishable packages: `publish` not set to false.
pub fn published() -> Result<Vec<String>> {
    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    let metadata = cmd!(sh, "cargo metadata --no-deps --format-version 1 --locked").quiet().read()?;
    let metadata: Value = serde_json::from_str(&metadata).context("reading cargo metadata")?;
    let mut names: Vec<String> = metadata["packages"]
        .as_array()
        .context("cargo metadata lists no packages")?
        .iter()
        // `publish` is null when any registry may take the package, [] when none.
        .filter(|p| p["publish"].is_null())
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

/// `cargo package` of every published crate, verified (built from the package).
pub fn package() -> Result<()> {
    let crates = published()?;
    if crates.is_empty() {
        bail!("no workspace package may be published: libvirt-sim and capl-api should be");
    }
    let sh = Shell::new()?;
    sh.change_dir(repo_root());
    let args: Vec<String> = crates.iter().flat_map(|c| ["-p".to_string(), c.clone()]).collect();
    // --allow-dirty: this checks that the crates package, not the checkout's state.
    cmd!(sh, "cargo package --locked --allow-dirty {args...}").run()?;
    eprintln!("crates: {} package", crates.join(", "));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_published_crates_are_the_simulator_and_the_api() {
        assert_eq!(super::published().unwrap(), ["capl-api", "libvirt-sim"]);
    }

    /// The release workflow publishes exactly the crates this module packages.
    #[test]
    fn the_release_workflow_publishes_the_published_crates() {
        let workflow = std::fs::read_to_string(crate::repo_root().join(".github/workflows/release.yml")).unwrap();
        let line = workflow
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("run: cargo publish"))
            .expect("release.yml runs cargo publish");
        let words: Vec<&str> = line.split_whitespace().collect();
        let mut named: Vec<String> = words.windows(2).filter(|w| w[0] == "-p").map(|w| w[1].to_string()).collect();
        named.sort();
        assert_eq!(named, super::published().unwrap(), "{line}");
    }
}
