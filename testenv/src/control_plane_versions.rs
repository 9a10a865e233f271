//! The pinned versions of the local control plane and the directory it is cached in.
//!
//! This file is the single source of these facts for both sides: the `testenv` crate
//! (which runs the binaries) and `cargo xtask control-plane` (which builds them; it
//! includes this file with `#[path]`). It uses `std` only for that reason.

use std::path::PathBuf;

/// Release of `k8s.io/kubernetes` that `kube-apiserver` and `kubectl` are built from.
pub const KUBERNETES_VERSION: &str = "v1.36.3";
/// Version of the `k8s.io/*` staging modules (api, apimachinery, ...) that match
/// [`KUBERNETES_VERSION`]: kubernetes `v1.X.Y` publishes them as `v0.X.Y`.
pub const KUBERNETES_STAGING_VERSION: &str = "v0.36.3";
/// Release of `go.etcd.io/etcd/server/v3` that the `etcd` binary is built from.
pub const ETCD_VERSION: &str = "v3.6.16";
/// Release of `sigs.k8s.io/cluster-api` (and its `api` module) for the core manager and CRDs.
pub const CAPI_VERSION: &str = "v1.14.2";

/// Environment variable: a directory in envtest layout (`kube-apiserver`, `etcd`, `kubectl`).
pub const KUBEBUILDER_ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";
/// Environment variable overriding the cache directory of the built control plane.
pub const CONTROL_PLANE_DIR_ENV: &str = "CAPL_CONTROL_PLANE_DIR";

/// File names inside the control-plane directory.
pub const KUBE_APISERVER_BIN: &str = "kube-apiserver";
pub const ETCD_BIN: &str = "etcd";
pub const KUBECTL_BIN: &str = "kubectl";
pub const CAPI_MANAGER_BIN: &str = "capi-manager";
/// CAPI's kubeadm bootstrap provider manager (CABPK, `sigs.k8s.io/cluster-api/bootstrap/kubeadm`).
pub const CAPI_KUBEADM_BOOTSTRAP_MANAGER_BIN: &str = "capi-kubeadm-bootstrap-manager";
/// CAPI's kubeadm control plane provider manager (KCP, `sigs.k8s.io/cluster-api/controlplane/kubeadm`).
pub const CAPI_KUBEADM_CONTROL_PLANE_MANAGER_BIN: &str = "capi-kubeadm-control-plane-manager";
/// `clusterctl` (`sigs.k8s.io/cluster-api/cmd/clusterctl`).
pub const CLUSTERCTL_BIN: &str = "clusterctl";
/// Directory (inside the control-plane directory) holding CAPI's CRD YAML files.
pub const CAPI_CRDS_DIR: &str = "capi-crds";
/// Directory (inside the control-plane directory) holding the webhook manifests
/// (`config/webhook/manifests.yaml`) of CAPI core and the kubeadm providers, one file each.
pub const CAPI_WEBHOOKS_DIR: &str = "capi-webhooks";
/// The files of [`CAPI_WEBHOOKS_DIR`] and where each comes from in the CAPI module.
pub const CAPI_WEBHOOK_MANIFESTS: &[(&str, &str)] = &[
    ("core.yaml", "core/config/webhook/manifests.yaml"),
    ("kubeadm-bootstrap.yaml", "bootstrap/kubeadm/config/webhook/manifests.yaml"),
    ("kubeadm-control-plane.yaml", "controlplane/kubeadm/config/webhook/manifests.yaml"),
];

/// The name of the cache sub-directory: changes whenever one of the pinned versions changes,
/// so a version bump never reuses stale binaries.
pub fn version_key() -> String {
    format!("k8s-{KUBERNETES_VERSION}_etcd-{ETCD_VERSION}_capi-{CAPI_VERSION}")
}

/// The control-plane directory: `$CAPL_CONTROL_PLANE_DIR` when set, otherwise
/// `$XDG_CACHE_HOME/cluster-api-provider-libvirt/control-plane/<version-key>`
/// (`$XDG_CACHE_HOME` defaulting to `$HOME/.cache`).
pub fn control_plane_dir() -> Result<PathBuf, String> {
    if let Some(dir) = non_empty_env(CONTROL_PLANE_DIR_ENV) {
        return Ok(PathBuf::from(dir));
    }
    let cache = match non_empty_env("XDG_CACHE_HOME") {
        Some(cache) => PathBuf::from(cache),
        None => match non_empty_env("HOME") {
            Some(home) => PathBuf::from(home).join(".cache"),
            None => {
                return Err(format!(
                    "cannot place the control-plane cache: neither {CONTROL_PLANE_DIR_ENV}, \
                     XDG_CACHE_HOME nor HOME is set; set {CONTROL_PLANE_DIR_ENV} to a directory"
                ));
            }
        },
    };
    Ok(cache.join("cluster-api-provider-libvirt").join("control-plane").join(version_key()))
}

/// `$KUBEBUILDER_ASSETS` when it is set and holds both `kube-apiserver` and `etcd`.
pub fn usable_kubebuilder_assets() -> Option<PathBuf> {
    let dir = PathBuf::from(non_empty_env(KUBEBUILDER_ASSETS_ENV)?);
    (dir.join(KUBE_APISERVER_BIN).is_file() && dir.join(ETCD_BIN).is_file()).then_some(dir)
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}
