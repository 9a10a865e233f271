//! What the provider's integration test binaries share, imported as a crate:
//! - [`api_server`]: the API-server side of the reconciler tests (objects,
//!   waits, the manager on the simulator or a real host), used by the
//!   `api_server` binary and by the `libvirtd` binary's controller tests;
//! - [`clusterctl_template`]: renders the shipped templates as `clusterctl
//!   generate cluster` does, for the `offline` and `api_server` binaries;
//! - [`image_server`]: a local HTTP server of base images (and of the ways
//!   a server can fail), for the tests of spec.imageURL.

pub mod api_server;
pub mod clusterctl_template;
pub mod image_server;
