//! The few writes the reconcilers make to their own objects: finalizers,
//! `spec.providerID`, and the status subresource.

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::context::CONTROLLER_NAME;
use super::error::Error;

/// Every write names the manager, so `managedFields` says who set the
/// finalizer and `spec.providerID` (instead of "unknown").
fn params() -> PatchParams {
    PatchParams { field_manager: Some(CONTROLLER_NAME.into()), ..PatchParams::default() }
}

/// Adds `finalizer`; the resourceVersion makes a concurrent change fail
/// (and the reconcile retry) instead of dropping someone's finalizer.
/// Returns the object as written, `None` when the finalizer was there.
pub async fn add_finalizer<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<Option<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut finalizers = object.finalizers().to_vec();
    if finalizers.iter().any(|f| f == finalizer) {
        return Ok(None);
    }
    finalizers.push(finalizer.to_string());
    let patch = json!({ "metadata": { "finalizers": finalizers, "resourceVersion": object.resource_version() } });
    Ok(Some(api.patch(&object.name_any(), &params(), &Patch::Merge(&patch)).await?))
}

pub async fn remove_finalizer<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let finalizers: Vec<&String> = object.finalizers().iter().filter(|f| *f != finalizer).collect();
    if finalizers.len() == object.finalizers().len() {
        return Ok(());
    }
    let patch = json!({ "metadata": { "finalizers": finalizers, "resourceVersion": object.resource_version() } });
    match api.patch(&object.name_any(), &params(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        // Gone already: that is what removing the last finalizer leads to.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// Merge-patches `spec` fields of the object (used for `spec.providerID`);
/// returns the object as written (with its new generation).
pub async fn patch_spec<K>(api: &Api<K>, name: &str, spec: serde_json::Value) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    Ok(api.patch(name, &params(), &Patch::Merge(&json!({ "spec": spec }))).await?)
}

/// Replaces the fields present in `status` through the status subresource.
pub async fn patch_status<K, S>(api: &Api<K>, name: &str, status: &S) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize,
{
    let patch = json!({ "status": status });
    api.patch_status(name, &params(), &Patch::Merge(&patch)).await?;
    Ok(())
}
