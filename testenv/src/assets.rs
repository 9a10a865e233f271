//! Where the control-plane binaries and CAPI's (and the IPAM provider's) CRDs are found.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::control_plane_versions::{
    CAPI_CRDS_DIR, CAPI_KUBEADM_BOOTSTRAP_MANAGER_BIN, CAPI_KUBEADM_CONTROL_PLANE_MANAGER_BIN, CAPI_MANAGER_BIN,
    CAPI_REPOSITORY_DIR, CAPI_VERSION, CAPI_WEBHOOKS_DIR, CERT_MANAGER_CRDS_DIR, CLUSTERCTL_BIN, CONTROL_PLANE_DIR_ENV,
    CapiReleaseProvider, ETCD_BIN, IPAM_CRDS_DIR, IPAM_IN_CLUSTER_MANAGER_BIN, KUBE_APISERVER_BIN,
    KUBEBUILDER_ASSETS_ENV, KUBECTL_BIN, control_plane_dir, usable_kubebuilder_assets,
};

/// The command that builds every asset.
pub const BUILD_COMMAND: &str = "cargo xtask control-plane build";

/// The located assets.
///
/// `kube-apiserver` and `etcd` come from `$KUBEBUILDER_ASSETS` when it holds both, otherwise
/// from the control-plane directory (`$CAPL_CONTROL_PLANE_DIR`, else the default cache
/// directory). CAPI's managers, clusterctl, CRDs and webhook manifests, and the in-cluster
/// IPAM provider's manager and CRDs, always come from the control-plane directory.
#[derive(Clone, Debug)]
pub struct Assets {
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
    /// The directory that holds `kube-apiserver` and `etcd` (and usually `kubectl`).
    pub binaries_dir: PathBuf,
    /// The control-plane directory built by `cargo xtask control-plane build`.
    pub control_plane_dir: PathBuf,
}

impl Assets {
    pub fn locate() -> Result<Self> {
        let control_plane_dir = control_plane_dir().map_err(anyhow::Error::msg)?;
        let binaries_dir = match usable_kubebuilder_assets() {
            Some(dir) => dir,
            None => {
                for binary in [KUBE_APISERVER_BIN, ETCD_BIN] {
                    if !control_plane_dir.join(binary).is_file() {
                        bail!(
                            "the local control plane is missing: no {binary} in {} (nor a usable \
                             ${KUBEBUILDER_ASSETS_ENV} holding kube-apiserver and etcd); run `{BUILD_COMMAND}` \
                             (or set ${CONTROL_PLANE_DIR_ENV} to the directory it printed)",
                            control_plane_dir.display()
                        );
                    }
                }
                control_plane_dir.clone()
            }
        };
        Ok(Self {
            kube_apiserver: binaries_dir.join(KUBE_APISERVER_BIN),
            etcd: binaries_dir.join(ETCD_BIN),
            binaries_dir,
            control_plane_dir,
        })
    }

    /// `kubectl`, when present next to kube-apiserver or in the control-plane directory.
    pub fn kubectl(&self) -> Option<PathBuf> {
        [&self.binaries_dir, &self.control_plane_dir].into_iter().map(|dir| dir.join(KUBECTL_BIN)).find(|p| p.is_file())
    }

    pub fn capi_manager(&self) -> Result<PathBuf> {
        self.required_in_control_plane_dir(CAPI_MANAGER_BIN, Path::is_file)
    }

    /// CAPI's kubeadm bootstrap provider manager (CABPK).
    pub fn capi_kubeadm_bootstrap_manager(&self) -> Result<PathBuf> {
        self.required_in_control_plane_dir(CAPI_KUBEADM_BOOTSTRAP_MANAGER_BIN, Path::is_file)
    }

    /// CAPI's kubeadm control plane provider manager (KCP).
    pub fn capi_kubeadm_control_plane_manager(&self) -> Result<PathBuf> {
        self.required_in_control_plane_dir(CAPI_KUBEADM_CONTROL_PLANE_MANAGER_BIN, Path::is_file)
    }

    /// `clusterctl`, built from the same CAPI module as the managers.
    pub fn clusterctl(&self) -> Result<PathBuf> {
        self.required_in_control_plane_dir(CLUSTERCTL_BIN, Path::is_file)
    }

    pub fn capi_crds_dir(&self) -> Result<PathBuf> {
        self.required_in_control_plane_dir(CAPI_CRDS_DIR, Path::is_dir)
    }

    /// A webhook manifest of [`CAPI_WEBHOOKS_DIR`] (`core.yaml`, `kubeadm-bootstrap.yaml`,
    /// `kubeadm-control-plane.yaml`).
    pub fn capi_webhook_manifest(&self, file: &str) -> Result<PathBuf> {
        self.required_in_control_plane_dir(&format!("{CAPI_WEBHOOKS_DIR}/{file}"), Path::is_file)
    }

    /// The components file of a CAPI provider's release in the clusterctl local repository
    /// built from the pinned module (`capi-repository/<label>/<version>/<components file>`).
    pub fn capi_release_components(&self, provider: &CapiReleaseProvider) -> Result<PathBuf> {
        let path = format!("{CAPI_REPOSITORY_DIR}/{}/{CAPI_VERSION}/{}", provider.label, provider.components);
        self.required_in_control_plane_dir(&path, Path::is_file)
    }

    /// cert-manager's CRDs at the version clusterctl installs by default.
    pub fn cert_manager_crds_dir(&self) -> Result<PathBuf> {
        self.required_in_control_plane_dir(CERT_MANAGER_CRDS_DIR, Path::is_dir)
    }

    /// CAPI's in-cluster IPAM provider manager (`sigs.k8s.io/cluster-api-ipam-provider-in-cluster`).
    pub fn ipam_in_cluster_manager(&self) -> Result<PathBuf> {
        self.required_in_control_plane_dir(IPAM_IN_CLUSTER_MANAGER_BIN, Path::is_file)
    }

    /// The in-cluster IPAM provider's CRDs (InClusterIPPool, GlobalInClusterIPPool and the
    /// prefix pools; IPAddressClaim and IPAddress are CAPI core's, in [`Assets::capi_crds_dir`]).
    pub fn ipam_crds_dir(&self) -> Result<PathBuf> {
        self.required_in_control_plane_dir(IPAM_CRDS_DIR, Path::is_dir)
    }

    fn required_in_control_plane_dir(&self, name: &str, exists: fn(&Path) -> bool) -> Result<PathBuf> {
        let path = self.control_plane_dir.join(name);
        if !exists(&path) {
            bail!("the CAPI part of the local control plane is missing: no {} ; run `{BUILD_COMMAND}`", path.display());
        }
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_control_plane_names_the_build_command() {
        let empty = std::env::temp_dir().join(format!("capl-testenv-no-assets-{}", std::process::id()));
        // SAFETY: the only test of this binary that touches the environment.
        unsafe {
            std::env::remove_var(KUBEBUILDER_ASSETS_ENV);
            std::env::set_var(CONTROL_PLANE_DIR_ENV, &empty);
        }
        let error = Assets::locate().unwrap_err().to_string();
        assert!(error.contains(BUILD_COMMAND), "{error}");
        assert!(error.contains(&empty.display().to_string()), "{error}");
    }
}
