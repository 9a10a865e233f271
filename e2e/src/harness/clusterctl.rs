//! clusterctl against the local management clusters: the provider's release
//! as a local clusterctl repository, and the clusterctl inventory `clusterctl
//! move` reads.
//!
//! [`LocalRepository::with_capi_release`] adds what the real `clusterctl
//! init` needs offline (CAPI's local repositories and cert-manager as
//! externally provisioned; see [`crate::scenarios::init`]).
//!
//! `clusterctl move` finds the kinds to move through the clusterctl
//! inventory: it lists only CRDs labelled `clusterctl.cluster.x-k8s.io`, and
//! it refuses a target that lacks a provider the source has (Provider objects
//! of `clusterctl.cluster.x-k8s.io/v1alpha3`). `clusterctl init` writes both
//! when it installs a provider. The `move` scenario's management clusters do
//! not come from `clusterctl init`: their CAPI core runs as a local process
//! whose webhooks `testenv` serves, while `clusterctl init` would apply CAPI's
//! webhook configurations for in-cluster Services (no Pod runs here: no
//! kubelet) that fail closed. So [`install_inventory`] writes what `clusterctl
//! init` would have written for the two providers whose controllers do run
//! there:
//! - CAPI core (`cluster-api`): its CRDs, already installed from the pinned
//!   module, get the two labels clusterctl adds to every component, and a
//!   Provider object for the pinned version;
//! - this provider (`infrastructure-libvirt`): its CRDs are applied from
//!   `clusterctl generate provider --infrastructure libvirt:<version>` run on
//!   the release layout (`capl-manifests release`), so the labels are the ones
//!   clusterctl itself puts on the release's components, and a Provider object
//!   for that version in the components' namespace.
//!
//! The inventory CRD itself (`providers.clusterctl.cluster.x-k8s.io`) is the
//! one of the pinned CAPI module, as clusterctl installs it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde::Deserialize;
use serde_json::{Value, json};
use testenv::control_plane_versions::{CAPI_RELEASE_PROVIDERS, CAPI_VERSION};

use crate::harness::management::Management;
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
/// The API groups of CAPI core's CRDs (`core-components.yaml`).
const CORE_GROUPS: &[&str] =
    &["cluster.x-k8s.io", "addons.cluster.x-k8s.io", "ipam.cluster.x-k8s.io", "runtime.cluster.x-k8s.io"];
/// How long clusterctl waits for the cert-manager API (its `cert-manager: timeout:`).
pub const CERT_MANAGER_API_BOUND: &str = "30s";
/// Field manager of what the harness applies for clusterctl.
const FIELD_MANAGER: &str = "capl-e2e-clusterctl";

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
            None => crate::harness::stack::built_binary("capl-manifests").with_context(|| {
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
        let repository = Self {
            root: root.to_path_buf(),
            version: version.to_string(),
            config: root.join("clusterctl.yaml"),
            clusterctl,
        };
        repository.write_config(
            &[repository.provider_entry("libvirt", "InfrastructureProvider", &repository.components())],
            "",
        )?;
        Ok(repository)
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
        let mut entries = vec![self.provider_entry("libvirt", "InfrastructureProvider", &self.components())];
        for provider in CAPI_RELEASE_PROVIDERS {
            entries.push(self.provider_entry(
                provider.name,
                provider.type_,
                &assets.capi_release_components(provider)?,
            ));
        }
        let cert_manager =
            format!("cert-manager:\n  externallyProvisioned: \"true\"\n  timeout: {CERT_MANAGER_API_BOUND}\n");
        self.write_config(&entries, &cert_manager)?;
        Ok(self)
    }

    fn provider_entry(&self, name: &str, type_: &str, components: &Path) -> String {
        format!("  - name: {name}\n    type: {type_}\n    url: file://{}\n", components.display())
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

/// The inventory CRD of the pinned CAPI module (what clusterctl embeds and installs).
fn inventory_crd_yaml() -> Result<String> {
    let modcache = Command::new("go")
        .args(["env", "GOMODCACHE"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| !p.as_os_str().is_empty())
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join("go/pkg/mod")))
        .context("neither `go env GOMODCACHE` nor $HOME names the Go module cache")?;
    let path = modcache
        .join(format!("sigs.k8s.io/cluster-api@{CAPI_VERSION}"))
        .join("cmd/clusterctl/config/manifest/clusterctl-api.yaml");
    std::fs::read_to_string(&path).with_context(|| {
        format!("reading clusterctl's inventory CRD {} (run `cargo xtask control-plane build`)", path.display())
    })
}

fn provider_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider"),
        "providers",
    )
}

/// A Provider object as clusterctl's `components.InventoryObject()` writes it.
pub fn provider_object(namespace: &str, name: &str, provider_name: &str, type_: &str, version: &str) -> Value {
    json!({
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Provider",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {CLUSTERCTL_LABEL: "", PROVIDER_LABEL: name, CLUSTERCTL_CORE_LABEL: "inventory"},
        },
        "providerName": provider_name,
        "type": type_,
        "version": version,
    })
}

/// The Provider objects of a management cluster, as `name version`.
pub async fn providers(management: &Management) -> Result<Vec<String>> {
    let api: Api<DynamicObject> = Api::all_with(management.client(), &provider_resource());
    Ok(api
        .list(&ListParams::default())
        .await
        .context("listing clusterctl Provider objects")?
        .items
        .iter()
        .map(|p| {
            format!("{} {}", p.metadata.name.clone().unwrap_or_default(), p.data["version"].as_str().unwrap_or(""))
        })
        .collect())
}

/// Writes the clusterctl inventory of CAPI core and of `repository`'s
/// release into `management` (see the module documentation).
pub async fn install_inventory(management: &Management, repository: &LocalRepository) -> Result<()> {
    install_core_inventory(management).await?;
    install_provider_inventory(management, repository).await
}

/// The clusterctl inventory of CAPI core alone: the inventory CRD, the labels
/// clusterctl adds to core-components.yaml's CRDs, and the Provider object.
pub async fn install_core_inventory(management: &Management) -> Result<()> {
    let Management::Local { env, .. } = management else {
        bail!("the clusterctl inventory is written only into the local control plane (kind runs `clusterctl init`)");
    };
    env.install_crd_yaml(&inventory_crd_yaml()?).await.context("installing clusterctl's inventory CRD")?;
    let crds: Api<CustomResourceDefinition> = Api::all(management.client());
    let labels = json!({"metadata": {"labels": {CLUSTERCTL_LABEL: "", PROVIDER_LABEL: CORE_PROVIDER}}});
    let mut labelled = 0;
    for crd in crds.list(&ListParams::default()).await.context("listing CRDs")?.items {
        if CORE_GROUPS.contains(&crd.spec.group.as_str()) {
            let name = crd.metadata.name.clone().unwrap_or_default();
            crds.patch(&name, &PatchParams::default(), &Patch::Merge(&labels))
                .await
                .with_context(|| format!("labelling CRD {name}"))?;
            labelled += 1;
        }
    }
    if labelled == 0 {
        bail!("no CAPI core CRD found to label: was CAPI installed?");
    }
    create_provider(management, CORE_NAMESPACE, CORE_PROVIDER, CORE_PROVIDER, "CoreProvider", CAPI_VERSION).await
}

/// This provider's clusterctl inventory, from the release layout: the CRDs of
/// `clusterctl generate provider` (labelled by clusterctl) and the Provider
/// object in the components' namespace.
pub async fn install_provider_inventory(management: &Management, repository: &LocalRepository) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(management.client());
    // This provider: its CRDs as clusterctl renders the release's components.
    let components = repository.generated_components()?;
    let namespace = components
        .iter()
        .find(|d| d["kind"] == "Namespace")
        .and_then(|d| d["metadata"]["name"].as_str())
        .context("the release's components hold no Namespace")?
        .to_string();
    let mut ours = Vec::new();
    for crd in components.iter().filter(|d| d["kind"] == "CustomResourceDefinition") {
        if crd["metadata"]["labels"][CLUSTERCTL_LABEL] != ""
            || crd["metadata"]["labels"][PROVIDER_LABEL] != INFRA_PROVIDER
        {
            bail!("clusterctl generate provider did not label CRD {} as clusterctl does", crd["metadata"]["name"]);
        }
        let crd: CustomResourceDefinition =
            serde_json::from_value(crd.clone()).context("a CRD of the release's components")?;
        let name = crd.metadata.name.clone().context("a CRD without a name")?;
        crds.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&crd))
            .await
            .with_context(|| format!("applying CRD {name} from the release"))?;
        ours.push(name);
    }
    if ours.is_empty() {
        bail!("the release's components hold no CRD");
    }

    create_provider(management, &namespace, INFRA_PROVIDER, "libvirt", "InfrastructureProvider", &repository.version)
        .await
}

async fn create_provider(
    management: &Management,
    ns: &str,
    name: &str,
    provider_name: &str,
    type_: &str,
    version: &str,
) -> Result<()> {
    ensure_namespace(management, ns).await?;
    let object: DynamicObject = serde_json::from_value(provider_object(ns, name, provider_name, type_, version))?;
    Api::<DynamicObject>::namespaced_with(management.client(), ns, &provider_resource())
        .patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object))
        .await
        .with_context(|| format!("creating the inventory entry {ns}/{name}"))?;
    Ok(())
}

async fn ensure_namespace(management: &Management, name: &str) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(management.client());
    if api.get_opt(name).await?.is_none() {
        management.create_namespace(name).await?;
    }
    Ok(())
}
