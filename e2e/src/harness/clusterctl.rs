//! clusterctl against the local management clusters: the provider's release
//! as a local clusterctl repository, and the labels and provider names of
//! clusterctl's inventory ([`crate::harness::inventory`] writes it).
//!
//! [`LocalRepository::with_capi_release`] adds what the real `clusterctl
//! init` needs offline (CAPI's local repositories and cert-manager as
//! externally provisioned; see [`crate::scenarios::init`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::Value;
use testenv::control_plane_versions::{CAPI_RELEASE_PROVIDERS, CAPI_VERSION, CapiReleaseProvider};

use crate::repo_root;

/// clusterctl's labels (cmd/clusterctl/api/v1alpha3/labels.go and CAPI's provider label).
pub const CLUSTERCTL_LABEL: &str = "clusterctl.cluster.x-k8s.io";
pub const CLUSTERCTL_CORE_LABEL: &str = "clusterctl.cluster.x-k8s.io/core";
pub const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";
/// CAPI core's provider name and namespace in a clusterctl installation.
pub const CORE_PROVIDER: &str = "cluster-api";
pub const CORE_NAMESPACE: &str = "capi-system";
/// This provider's name in clusterctl (`<type>-<name>`).
pub const INFRA_PROVIDER: &str = "infrastructure-libvirt";
/// How long clusterctl waits for the cert-manager API (its `cert-manager: timeout:`).
pub const CERT_MANAGER_API_BOUND: &str = "30s";

/// The environment variable that names the `capl-manifests` binary.
pub const MANIFESTS_BIN_ENV: &str = capl_testbed::env::MANIFESTS_BIN;

/// A provider release written by `capl-manifests release` (the layout of
/// `cargo xtask release`) and a clusterctl.yaml whose `providers:` entry
/// points at it, in a directory of its own (also clusterctl's
/// `XDG_CONFIG_HOME`: no user configuration, no shared cache).
pub struct LocalRepository {
    pub root: PathBuf,
    pub version: String,
    pub config: PathBuf,
    clusterctl: PathBuf,
    /// Where clusterctl.yaml says this provider's components are: the
    /// release's file, or a URL that serves the release
    /// ([`LocalRepository::served_at`]).
    components_url: String,
    /// Set for every clusterctl command.
    env: Vec<(String, String)>,
}

/// How long one clusterctl command may run (init, move and generate take seconds here).
pub const CLUSTERCTL_BOUND: Duration = Duration::from_secs(300);

/// What a clusterctl command printed.
pub struct ClusterctlOutput {
    pub stdout: String,
    /// clusterctl's log (what a user sees on the terminal besides the command's output).
    pub stderr: String,
}

impl LocalRepository {
    /// Writes release `version` under `root` with the `capl-manifests` next
    /// to this binary (or `$CAPL_MANIFESTS_BIN`).
    pub fn release(root: &Path, version: &str) -> Result<Self> {
        Self::release_with_image(root, version, &format!("registry.example/cluster-api-provider-libvirt:{version}"))
    }

    /// [`LocalRepository::release`] with the manager image `image`.
    pub fn release_with_image(root: &Path, version: &str, image: &str) -> Result<Self> {
        let manifests = match std::env::var_os(MANIFESTS_BIN_ENV) {
            Some(path) => PathBuf::from(path),
            None => crate::built_binary("capl-manifests").with_context(|| {
                format!(
                    "capl-manifests is not built: run `cargo build -p cluster-api-provider-libvirt --bin \
                     capl-manifests` or set {MANIFESTS_BIN_ENV}"
                )
            })?,
        };
        let clusterctl = testenv::Assets::locate()?.clusterctl()?;
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        let output = Command::new(&manifests)
            .args(["release", "--version", version, "--image", image])
            .arg("--root")
            .arg(repo_root())
            .arg("--out")
            .arg(root)
            .output()
            .with_context(|| format!("running {}", manifests.display()))?;
        if !output.status.success() {
            bail!("capl-manifests release {version} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
        let components = root.join(INFRA_PROVIDER).join(version).join("infrastructure-components.yaml");
        let repository = Self {
            root: root.to_path_buf(),
            version: version.to_string(),
            config: root.join("clusterctl.yaml"),
            clusterctl,
            components_url: format!("file://{}", components.display()),
            env: Vec::new(),
        };
        repository.write_config(
            &[repository.provider_entry("libvirt", "InfrastructureProvider", &repository.components_url)],
            "",
        )?;
        Ok(repository)
    }

    /// The release directory of this provider: one directory per version.
    pub fn releases(&self) -> PathBuf {
        self.root.join(INFRA_PROVIDER)
    }

    /// From now on clusterctl.yaml names `url` for this provider, and every
    /// clusterctl command gets `env` (the release served as on GitHub:
    /// [`crate::harness::github_release`]). Call before [`LocalRepository::with_capi_release`].
    pub fn served_at(mut self, url: String, env: Vec<(String, String)>) -> Result<Self> {
        self.components_url = url;
        self.env = env;
        self.write_config(&[self.provider_entry("libvirt", "InfrastructureProvider", &self.components_url)], "")?;
        Ok(self)
    }

    /// The release's `infrastructure-components.yaml`.
    pub fn components(&self) -> PathBuf {
        self.root.join(INFRA_PROVIDER).join(&self.version).join("infrastructure-components.yaml")
    }

    /// Adds to clusterctl.yaml what `clusterctl init` needs besides this
    /// release, all from this machine: CAPI core and the kubeadm providers
    /// from the local repositories `cargo xtask control-plane build` makes of
    /// the pinned module (entries of the same name and type replace
    /// clusterctl's built-in GitHub ones), and cert-manager as externally
    /// provisioned (clusterctl then only checks that the cert-manager API
    /// serves an Issuer and a Certificate, for at most `timeout`, instead of
    /// downloading its release from GitHub).
    pub fn with_capi_release(self, assets: &testenv::Assets) -> Result<Self> {
        self.with_capi_release_args(assets, &[])
    }

    /// [`LocalRepository::with_capi_release`] with `kcp_args` added to the
    /// arguments of KubeadmControlPlane's manager, in a copy of its release
    /// under this repository (what an operator who wants a flag on a
    /// provider from the start does).
    pub fn with_capi_release_args(self, assets: &testenv::Assets, kcp_args: &[&str]) -> Result<Self> {
        let mut entries = vec![self.provider_entry("libvirt", "InfrastructureProvider", &self.components_url)];
        for provider in CAPI_RELEASE_PROVIDERS {
            let mut components = assets.capi_release_components(provider)?;
            if provider.type_ == "ControlPlaneProvider" && !kcp_args.is_empty() {
                components = self.copy_with_args(&components, provider, kcp_args)?;
            }
            entries.push(self.provider_entry(
                provider.name,
                provider.type_,
                &format!("file://{}", components.display()),
            ));
        }
        let cert_manager =
            format!("cert-manager:\n  externallyProvisioned: \"true\"\n  timeout: {CERT_MANAGER_API_BOUND}\n");
        self.write_config(&entries, &cert_manager)?;
        Ok(self)
    }

    /// A copy of CAPI's release of `provider` (components and metadata, the
    /// layout clusterctl reads) under this repository, with `args` after the
    /// manager's `--leader-elect`; returns the copy's components file.
    fn copy_with_args(&self, components: &Path, provider: &CapiReleaseProvider, args: &[&str]) -> Result<PathBuf> {
        let release = components.parent().context("a components file has a directory")?;
        let to = self.root.join("capi-release").join(provider.label).join(CAPI_VERSION);
        std::fs::create_dir_all(&to).with_context(|| format!("creating {}", to.display()))?;
        std::fs::copy(release.join("metadata.yaml"), to.join("metadata.yaml"))
            .with_context(|| format!("copying {}/metadata.yaml", release.display()))?;
        let text = std::fs::read_to_string(components).with_context(|| format!("reading {}", components.display()))?;
        let target = to.join(provider.components);
        std::fs::write(&target, args_after_leader_elect(&text, args)?)
            .with_context(|| format!("writing {}", target.display()))?;
        Ok(target)
    }

    fn provider_entry(&self, name: &str, type_: &str, url: &str) -> String {
        format!("  - name: {name}\n    type: {type_}\n    url: {url}\n")
    }

    /// Writes clusterctl.yaml: `providers:` with the provider entries, then `sections`.
    fn write_config(&self, providers: &[String], sections: &str) -> Result<()> {
        let text = format!("providers:\n{}{sections}", providers.concat());
        std::fs::write(&self.config, text).with_context(|| format!("writing {}", self.config.display()))
    }

    /// Runs `clusterctl <args> --config <this repository's clusterctl.yaml>`;
    /// returns stdout, or an error with stderr.
    pub fn clusterctl(&self, args: &[&str]) -> Result<String> {
        Ok(self.clusterctl_output(args)?.stdout)
    }

    /// Runs `clusterctl <args> --config <clusterctl.yaml>` for at most
    /// [`CLUSTERCTL_BOUND`] (then kills it); returns what it printed, or an
    /// error with its log.
    pub fn clusterctl_output(&self, args: &[&str]) -> Result<ClusterctlOutput> {
        self.clusterctl_output_env(args, &[])
    }

    /// [`LocalRepository::clusterctl`] with these environment variables set (the
    /// variables `clusterctl generate cluster` substitutes); returns stdout.
    pub fn clusterctl_env(&self, args: &[&str], env: &[(&str, &str)]) -> Result<String> {
        Ok(self.clusterctl_output_env(args, env)?.stdout)
    }

    fn clusterctl_output_env(&self, args: &[&str], env: &[(&str, &str)]) -> Result<ClusterctlOutput> {
        let mut child = Command::new(&self.clusterctl)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(env.iter().copied())
            .arg("--config")
            .arg(&self.config)
            .env("XDG_CONFIG_HOME", &self.root)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", self.clusterctl.display()))?;
        let read = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut text = String::new();
                if let Some(mut pipe) = pipe {
                    let _ = pipe.read_to_string(&mut text);
                }
                text
            })
        };
        let stdout = read(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
        let stderr = read(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
        let deadline = Instant::now() + CLUSTERCTL_BOUND;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let output =
            ClusterctlOutput { stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() };
        match status {
            None => bail!(
                "clusterctl {} did not finish within {CLUSTERCTL_BOUND:?} (killed): {}",
                args.join(" "),
                output.stderr.trim()
            ),
            Some(status) if !status.success() => {
                bail!("clusterctl {} failed ({status}): {}", args.join(" "), output.stderr.trim())
            }
            Some(_) => Ok(output),
        }
    }

    /// The components of this release as clusterctl installs them:
    /// `clusterctl generate provider --infrastructure libvirt:<version>`.
    pub fn generated_components(&self) -> Result<Vec<Value>> {
        self.generated_provider("--infrastructure", &format!("libvirt:{}", self.version))
    }

    /// `clusterctl generate provider <flag> <name:version>` (`--core cluster-api:v1.14.2`, ...):
    /// the components as `clusterctl init` applies them.
    pub fn generated_provider(&self, flag: &str, provider: &str) -> Result<Vec<Value>> {
        let text = self.clusterctl(&["generate", "provider", flag, provider])?;
        let mut documents = Vec::new();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = Value::deserialize(document).context("clusterctl generate provider wrote invalid YAML")?;
            if !value.is_null() {
                documents.push(value);
            }
        }
        Ok(documents)
    }
}

/// `text` (a provider's components) with `args` added after each
/// `- --leader-elect` argument, at its indentation: the one manager of a
/// CAPI provider's components.
fn args_after_leader_elect(text: &str, args: &[&str]) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut found = 0;
    for line in text.split_inclusive('\n') {
        out.push_str(line);
        let (indent, rest) = line.split_at(line.len() - line.trim_start().len());
        if rest.trim_end() == "- --leader-elect" {
            found += 1;
            for arg in args {
                out.push_str(&format!("{indent}- {arg}\n"));
            }
        }
    }
    if found != 1 {
        bail!(
            "the components have {found} `- --leader-elect` arguments, not one: the arguments {args:?} have no place"
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::args_after_leader_elect;

    #[test]
    fn args_go_after_leader_elect_at_its_indentation_and_nothing_else_changes() {
        let components = "spec:\n      containers:\n      - args:\n        - --leader-elect\n        - --diagnostics-address=:8443\n        command:\n";
        let edited = args_after_leader_elect(components, &["--a=1", "--b=2"]).unwrap();
        assert_eq!(
            edited,
            "spec:\n      containers:\n      - args:\n        - --leader-elect\n        - --a=1\n        - --b=2\n        - --diagnostics-address=:8443\n        command:\n"
        );
    }

    #[test]
    fn components_without_one_leader_elect_are_refused() {
        let err = args_after_leader_elect("args:\n- --other\n", &["--a=1"]).unwrap_err();
        assert!(err.to_string().contains("0 `- --leader-elect`"), "{err}");
        let twice = "- --leader-elect\n- --leader-elect\n";
        assert!(args_after_leader_elect(twice, &["--a=1"]).is_err());
    }
}
