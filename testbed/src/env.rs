//! The environment variables of the tasks and the tests: those through which
//! the tasks (`cargo xtask test`, `e2e`, `demo`, `bench`) hand what they built
//! or started to the tests and the e2e runner, and those a developer sets to
//! steer them. Each is named here once.

/// The tiny test guest image (`cargo xtask guest-image` prints its path).
pub const GUEST_IMAGE: &str = "CAPL_GUEST_IMAGE";
/// The Kubernetes node image (`cargo xtask node-image` prints its path).
pub const NODE_IMAGE: &str = "CAPL_NODE_IMAGE";
/// The containerized libvirtd's image (`cargo xtask libvirtd-image` prints its name).
pub const LIBVIRTD_IMAGE: &str = "CAPL_LIBVIRTD_IMAGE";
/// The kind node image (`cargo xtask kind-node-image` prints its name).
pub const KIND_NODE_IMAGE: &str = "CAPL_KIND_NODE_IMAGE";
/// The provider binary the e2e runner starts.
pub const PROVIDER_BIN: &str = "CAPL_PROVIDER_BIN";
/// The private libvirtd's URI (`cargo xtask host up` writes it to a file too).
pub const TEST_LIBVIRT_URI: &str = "CAPL_TEST_LIBVIRT_URI";
/// The `capl-manifests` binary the e2e runner renders the release with.
pub const MANIFESTS_BIN: &str = "CAPL_MANIFESTS_BIN";
/// The kind binary (`cargo xtask e2e --kind` builds it).
pub const KIND_BIN: &str = "CAPL_KIND_BIN";
/// The directory whose `docker` is the wrapper kind runs.
pub const KIND_WRAPPER_DIR: &str = "CAPL_KIND_WRAPPER_DIR";
/// The real docker binary behind that wrapper.
pub const REAL_DOCKER: &str = "CAPL_REAL_DOCKER";
/// The manager image loaded into kind.
pub const PROVIDER_IMAGE: &str = "CAPL_PROVIDER_IMAGE";
/// CAPI's images loaded into kind, comma-separated.
pub const CAPI_IMAGES: &str = "CAPL_CAPI_IMAGES";
/// The Ginkgo suite of Cluster API's own e2e specs (`e2e/capi/`), built by `cargo xtask e2e capi`.
pub const CAPI_SPECS_BIN: &str = "CAPL_CAPI_SPECS_BIN";
/// cert-manager's static manifest for kind (`cargo xtask cert-manager`).
pub const CERT_MANAGER_MANIFEST: &str = "CAPL_CERT_MANAGER_MANIFEST";
/// cert-manager's images loaded into kind, comma-separated.
pub const CERT_MANAGER_IMAGES: &str = "CAPL_CERT_MANAGER_IMAGES";
/// The previous release's manager image (`cargo xtask previous`).
pub const PREVIOUS_PROVIDER_IMAGE: &str = "CAPL_PREVIOUS_PROVIDER_IMAGE";
/// The previous release's clusterctl repository directory (`cargo xtask previous`).
pub const PREVIOUS_RELEASE_DIR: &str = "CAPL_PREVIOUS_RELEASE_DIR";
/// Where the e2e runner writes its summary table.
pub const E2E_SUMMARY: &str = "CAPL_E2E_SUMMARY";
/// `RUST_LOG` of the provider process the e2e runner starts (default `info,kube=warn`).
pub const E2E_PROVIDER_LOG: &str = "CAPL_E2E_PROVIDER_LOG";

/// A directory in envtest layout (`kube-apiserver`, `etcd`, `kubectl`) to use
/// instead of the built control plane.
pub const KUBEBUILDER_ASSETS: &str = "KUBEBUILDER_ASSETS";
/// Overrides the cache directory of the built control plane.
pub const CONTROL_PLANE_DIR: &str = "CAPL_CONTROL_PLANE_DIR";
/// Overrides the cache directory of the test guest image.
pub const GUEST_CACHE_DIR: &str = "CAPL_GUEST_CACHE_DIR";
/// Overrides the cache directory of the Kubernetes node image.
pub const NODE_IMAGE_CACHE_DIR: &str = "CAPL_NODE_IMAGE_CACHE_DIR";
/// The storage driver of the dockerd `cargo xtask docker-engine up` starts (default `vfs`).
pub const DOCKERD_STORAGE_DRIVER: &str = "CAPL_DOCKERD_STORAGE_DRIVER";
/// Inside the containerized libvirtd: the directory with its TLS CA,
/// certificate and key; when set, its start script listens for TLS.
pub const LIBVIRTD_TLS_DIR: &str = "CAPL_LIBVIRTD_TLS_DIR";
/// Runs only the conformance scenarios whose names contain it.
pub const CONFORMANCE_ONLY: &str = "CAPL_CONFORMANCE_ONLY";
/// Runs only the host scenarios whose names contain it.
pub const HOST_SCENARIO_ONLY: &str = "CAPL_HOST_SCENARIO_ONLY";
