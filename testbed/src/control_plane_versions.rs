//! The pinned versions of the local control plane and the directory it is cached in.
//!
//! This file is the single source of these facts for both sides: the `testenv` crate
//! (which runs the binaries) and `cargo xtask control-plane` (which builds them).

use std::path::PathBuf;

/// Release of `k8s.io/kubernetes` that `kube-apiserver` and `kubectl` are built from.
pub const KUBERNETES_VERSION: &str = "v1.36.3";
/// Version of the `k8s.io/*` staging modules (api, apimachinery, ...) that match
/// [`KUBERNETES_VERSION`]: kubernetes `v1.X.Y` publishes them as `v0.X.Y`.
pub const KUBERNETES_STAGING_VERSION: &str = "v0.36.3";
/// The latest patch of the previous Kubernetes minor the Go module proxy serves: the
/// release an upgrade test starts from (`cargo xtask node-image --kubernetes-version`).
pub const PREVIOUS_KUBERNETES_VERSION: &str = "v1.35.8";
/// Release of `go.etcd.io/etcd/server/v3` that the `etcd` binary is built from.
pub const ETCD_VERSION: &str = "v3.6.16";
/// Release of `sigs.k8s.io/cluster-api` (and its `api` module) for the core manager and CRDs.
pub const CAPI_VERSION: &str = "v1.14.2";

/// Release of `sigs.k8s.io/cluster-api-ipam-provider-in-cluster`, CAPI's in-cluster IPAM
/// provider: its manager and its pool CRDs (InClusterIPPool, GlobalInClusterIPPool and the
/// prefix pools). The IPAddressClaim and IPAddress CRDs it serves are CAPI core's.
/// Not part of [`version_key`] (it came later): after a bump, remove
/// [`IPAM_IN_CLUSTER_MANAGER_BIN`] and [`IPAM_CRDS_DIR`] from the cache to rebuild them.
pub const IPAM_IN_CLUSTER_VERSION: &str = "v1.1.0";

/// Release of `sigs.k8s.io/kustomize/kustomize/v5` that `kustomize` is built from: the
/// version CAPI's Makefile builds its release manifests with (`KUSTOMIZE_VER`).
pub const KUSTOMIZE_VERSION: &str = "v5.7.0";
/// Release of `github.com/cert-manager/cert-manager` whose CRDs are copied: the version
/// clusterctl [`CAPI_VERSION`] installs by default (`CertManagerDefaultVersion`; the build
/// checks that the two agree).
pub const CERT_MANAGER_VERSION: &str = "v1.21.1";

/// A test image preloaded in the Kubernetes node image (`cargo xtask node-image`): one layer
/// with Debian's static busybox (`/bin/busybox`, `/bin/sh`), for pods that need a shell,
/// `wget` or `httpd` (the workload e2e's pod-to-pod check). Never pulled.
pub const NODE_TEST_IMAGE: &str = "capl.local/busybox:1.35";

/// Environment variable: a directory in envtest layout (`kube-apiserver`, `etcd`, `kubectl`).
pub const KUBEBUILDER_ASSETS_ENV: &str = crate::env::KUBEBUILDER_ASSETS;
/// Environment variable overriding the cache directory of the built control plane.
pub const CONTROL_PLANE_DIR_ENV: &str = crate::env::CONTROL_PLANE_DIR;

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
/// CAPI's in-cluster IPAM provider manager (`sigs.k8s.io/cluster-api-ipam-provider-in-cluster`,
/// its root package, at [`IPAM_IN_CLUSTER_VERSION`]).
pub const IPAM_IN_CLUSTER_MANAGER_BIN: &str = "capi-ipam-in-cluster-manager";
/// `kustomize`, to build CAPI's release components as its Makefile does.
pub const KUSTOMIZE_BIN: &str = "kustomize";
/// Directory (inside the control-plane directory): CAPI core and the kubeadm providers as
/// clusterctl local repositories, `<label>/<version>/{<components file>,metadata.yaml}`.
pub const CAPI_REPOSITORY_DIR: &str = "capi-repository";
/// Directory (inside the control-plane directory) holding cert-manager's CRDs
/// (`deploy/crds` of the cert-manager module at [`CERT_MANAGER_VERSION`]).
pub const CERT_MANAGER_CRDS_DIR: &str = "cert-manager-crds";

/// Directory (inside the control-plane directory) holding the in-cluster IPAM provider's CRDs
/// (`config/crd/bases` of its module at [`IPAM_IN_CLUSTER_VERSION`]).
pub const IPAM_CRDS_DIR: &str = "ipam-crds";

/// A provider of the CAPI release: what `make release-manifests` builds and how clusterctl names it.
pub struct CapiReleaseProvider {
    /// clusterctl's provider name (`--core cluster-api`, `--bootstrap kubeadm`, ...).
    pub name: &'static str,
    /// clusterctl's provider type, as in clusterctl.yaml's `providers:`.
    pub type_: &'static str,
    /// clusterctl's label: the Provider object's name and the repository directory.
    pub label: &'static str,
    /// The components file of the release.
    pub components: &'static str,
    /// The directory of the CAPI module whose `config/default` is built.
    pub module_dir: &'static str,
    /// The image name under `registry.k8s.io/cluster-api`.
    pub image: &'static str,
    /// The namespace of the components.
    pub namespace: &'static str,
}

/// Where CAPI's release images live (`PROD_REGISTRY` in its Makefile).
pub const CAPI_RELEASE_REGISTRY: &str = "registry.k8s.io/cluster-api";

/// CAPI core and the kubeadm bootstrap and control plane providers, in clusterctl's install order.
pub const CAPI_RELEASE_PROVIDERS: &[CapiReleaseProvider] = &[
    CapiReleaseProvider {
        name: "cluster-api",
        type_: "CoreProvider",
        label: "cluster-api",
        components: "core-components.yaml",
        module_dir: "core",
        image: "cluster-api-controller",
        namespace: "capi-system",
    },
    CapiReleaseProvider {
        name: "kubeadm",
        type_: "BootstrapProvider",
        label: "bootstrap-kubeadm",
        components: "bootstrap-components.yaml",
        module_dir: "bootstrap/kubeadm",
        image: "kubeadm-bootstrap-controller",
        namespace: "capi-kubeadm-bootstrap-system",
    },
    CapiReleaseProvider {
        name: "kubeadm",
        type_: "ControlPlaneProvider",
        label: "control-plane-kubeadm",
        components: "control-plane-components.yaml",
        module_dir: "controlplane/kubeadm",
        image: "kubeadm-control-plane-controller",
        namespace: "capi-kubeadm-control-plane-system",
    },
];
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
