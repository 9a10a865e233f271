//! Writes the generated manifests; `cargo xtask manifests` and
//! `cargo xtask release` run it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use capl::manifests::{self, DeploymentSettings};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Generate the provider's Kubernetes manifests")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write config/, metadata.yaml, the generated flavors and the book's API reference under the repository root.
    Write {
        #[arg(long, default_value = ".")]
        root: PathBuf,
    },
    /// Write the release artifacts into a directory.
    Release {
        /// Release version, e.g. v0.1.0.
        #[arg(long)]
        version: String,
        /// Manager image, e.g. registry.example/cluster-api-provider-libvirt:v0.1.0.
        #[arg(long)]
        image: String,
        /// Repository root (for templates/).
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Output directory.
        #[arg(long, default_value = "dist")]
        out: PathBuf,
        /// Install for one namespace: the manager watches only it and its
        /// rules are a Role there (not a ClusterRole).
        #[arg(long)]
        watch_namespace: Option<String>,
    },
    /// Write only install.yaml (CRDs, RBAC, policy, Deployment) for kubectl, with any image reference.
    InstallYaml {
        #[arg(long)]
        image: String,
        /// Output file.
        #[arg(long)]
        out: PathBuf,
        /// Install for one namespace: the manager watches only it and its
        /// rules are a Role there (not a ClusterRole).
        #[arg(long)]
        watch_namespace: Option<String>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Write { root } => write_config(&root),
        Command::Release { version, image, root, out, watch_namespace } => {
            release(&version, &image, &root, &out, watch_namespace.as_deref())
        }
        Command::InstallYaml { image, out, watch_namespace } => {
            let settings = scoped(DeploymentSettings { image, ..Default::default() }, watch_namespace.as_deref());
            write_file(&out, &manifests::render_yaml(&manifests::release_components(&settings)))
        }
    }
}

fn scoped(settings: DeploymentSettings, watch_namespace: Option<&str>) -> DeploymentSettings {
    match watch_namespace {
        Some(ns) => settings.for_one_namespace(ns),
        None => settings,
    }
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn write_config(root: &Path) -> Result<()> {
    for file in manifests::config_files() {
        write_file(&root.join(&file.path), &file.to_yaml())?;
        println!("wrote {}", file.path);
    }
    write_file(&root.join("metadata.yaml"), &manifests::render_yaml(&[manifests::clusterctl_metadata()]))?;
    println!("wrote metadata.yaml");
    let default_flavor = root.join(manifests::DEFAULT_FLAVOR);
    let default_flavor =
        std::fs::read_to_string(&default_flavor).with_context(|| format!("reading {}", default_flavor.display()))?;
    for (path, flavor) in manifests::generated_flavors(&default_flavor).map_err(anyhow::Error::msg)? {
        write_file(&root.join(path), &flavor)?;
        println!("wrote {path}");
    }
    write_file(&root.join(capl::api_reference::PATH), &capl::api_reference::markdown())?;
    println!("wrote {}", capl::api_reference::PATH);
    Ok(())
}

/// clusterctl's name for this provider: `<type>-<name>`, the directory a
/// local provider repository holds its versions in.
const PROVIDER_DIRECTORY: &str = "infrastructure-libvirt";

/// Writes `<out>/infrastructure-libvirt/<version>/`, the layout clusterctl
/// reads from a local repository (`url: file://<out>/infrastructure-libvirt/<version>/infrastructure-components.yaml`
/// in clusterctl.yaml's `providers:`).
fn release(version: &str, image: &str, root: &Path, out: &Path, watch_namespace: Option<&str>) -> Result<()> {
    let parsed = manifests::ReleaseVersion::parse(version).map_err(anyhow::Error::msg)?;
    manifests::check_release_image(image).map_err(anyhow::Error::msg)?;
    let metadata = manifests::release_metadata(&parsed).map_err(anyhow::Error::msg)?;
    let out = std::path::absolute(out).with_context(|| format!("resolving {}", out.display()))?;
    let dir = out.join(PROVIDER_DIRECTORY).join(version);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing the previous {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if let Some(ns) = watch_namespace {
        manifests::check_namespace_name(ns).map_err(anyhow::Error::msg)?;
    }
    let components = manifests::release_components(&scoped(DeploymentSettings::clusterctl(image), watch_namespace));
    write_file(&dir.join("infrastructure-components.yaml"), &manifests::render_yaml(&components))?;
    let install = manifests::release_components(&scoped(
        DeploymentSettings { image: image.into(), ..Default::default() },
        watch_namespace,
    ));
    write_file(&dir.join("install.yaml"), &manifests::render_yaml(&install))?;
    write_file(&dir.join("metadata.yaml"), &manifests::render_yaml(&[metadata]))?;
    let templates = root.join("templates");
    let mut copied = Vec::new();
    for entry in std::fs::read_dir(&templates).with_context(|| format!("reading {}", templates.display()))? {
        let path = entry?.path();
        let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if file_name.starts_with("cluster-template") || file_name.starts_with("clusterclass-") {
            std::fs::copy(&path, dir.join(&file_name)).with_context(|| format!("copying {}", path.display()))?;
            copied.push(file_name);
        }
    }
    copied.sort();
    println!("release {version} in {}:", dir.display());
    println!("  infrastructure-components.yaml ({} objects)", components.len());
    println!("  install.yaml");
    println!("  metadata.yaml");
    for name in copied {
        println!("  {name}");
    }
    println!("clusterctl.yaml entry:");
    println!("  providers:");
    println!("    - name: libvirt");
    println!("      type: InfrastructureProvider");
    println!("      url: file://{}/infrastructure-components.yaml", dir.display());
    Ok(())
}
