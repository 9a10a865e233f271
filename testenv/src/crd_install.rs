//! Installing CustomResourceDefinitions from YAML and waiting until they are served.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition,
};
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};
use serde::Deserialize;

/// The field manager of every object this crate applies.
pub const FIELD_MANAGER: &str = "capl-testenv";

/// How long a CRD may take to become Established.
const ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);

/// What to do with `spec.conversion` of the CRDs being installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    /// Keep the CRD as written.
    AsWritten,
    /// Replace any conversion webhook with `strategy: None` (no webhook server runs here, and
    /// only one version of the objects is used).
    StripWebhook,
}

/// Parses every CRD of a (multi-document) YAML text. `origin` names the text in errors.
pub fn parse_crds(yaml: &str, origin: &str) -> Result<Vec<CustomResourceDefinition>> {
    let mut crds = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let value = serde_yaml::Value::deserialize(document)
            .with_context(|| format!("document {index} of {origin} is not valid YAML"))?;
        if value.is_null() {
            continue;
        }
        let kind = value.get("kind").and_then(serde_yaml::Value::as_str).unwrap_or("<none>");
        if kind != "CustomResourceDefinition" {
            bail!("document {index} of {origin} has kind {kind:?}, expected CustomResourceDefinition");
        }
        let crd: CustomResourceDefinition = serde_yaml::from_value(value)
            .with_context(|| format!("document {index} of {origin} is not a valid apiextensions.k8s.io/v1 CRD"))?;
        crds.push(crd);
    }
    if crds.is_empty() {
        bail!("{origin} holds no CustomResourceDefinition");
    }
    Ok(crds)
}

/// Reads every `*.yaml`/`*.yml` file of `dir` (sorted by name) as CRDs.
pub fn read_crd_dir(dir: &Path) -> Result<Vec<CustomResourceDefinition>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("listing CRD files in {}", dir.display()))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|path| path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml"));
    files.sort();
    if files.is_empty() {
        bail!("no *.yaml file in {}: expected CRD manifests there", dir.display());
    }
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        crds.extend(parse_crds(&text, &file.display().to_string())?);
    }
    Ok(crds)
}

/// Server-side applies `crds` and waits until each one is Established.
pub async fn install(
    client: &Client,
    crds: Vec<CustomResourceDefinition>,
    conversion: Conversion,
) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for mut crd in crds {
        let name = crd.metadata.name.clone().context("a CRD without metadata.name cannot be installed")?;
        crd.status = None;
        crd.metadata.creation_timestamp = None;
        if conversion == Conversion::StripWebhook {
            crd.spec.conversion = Some(CustomResourceConversion { strategy: "None".to_owned(), webhook: None });
        }
        api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&crd))
            .await
            .with_context(|| format!("the API server rejected CRD {name}"))?;
        names.push(name);
    }
    for name in &names {
        let established = await_condition(api.clone(), name, conditions::is_crd_established());
        tokio::time::timeout(ESTABLISHED_TIMEOUT, established)
            .await
            .with_context(|| format!("CRD {name} was not Established within {ESTABLISHED_TIMEOUT:?}"))?
            .with_context(|| format!("watching CRD {name} for the Established condition"))?;
    }
    Ok(names)
}
