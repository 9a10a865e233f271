//! The clusterctl inventory of the local management clusters, written as
//! `clusterctl init` would have written it.
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

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::control_plane_versions::CAPI_VERSION;

use crate::harness::clusterctl::{
    CLUSTERCTL_CORE_LABEL, CLUSTERCTL_LABEL, CORE_NAMESPACE, CORE_PROVIDER, INFRA_PROVIDER, LocalRepository,
    PROVIDER_LABEL,
};
use crate::harness::management::Management;

/// The API groups of CAPI core's CRDs (`core-components.yaml`).
const CORE_GROUPS: &[&str] =
    &["cluster.x-k8s.io", "addons.cluster.x-k8s.io", "ipam.cluster.x-k8s.io", "runtime.cluster.x-k8s.io"];
/// Field manager of what the harness applies for clusterctl.
const FIELD_MANAGER: &str = "capl-e2e-clusterctl";

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
