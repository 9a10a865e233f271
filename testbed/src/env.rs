//! The environment variables through which the tasks (`cargo xtask test`,
//! `e2e`, `demo`, `bench`) hand what they built or started to the tests and the
//! e2e runner. Each is named here once.

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
pub const TEST_LIBVIRT_URI: &str = crate::test_host::URI_ENV;
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
/// Where the e2e runner writes its summary table.
pub const E2E_SUMMARY: &str = "CAPL_E2E_SUMMARY";
