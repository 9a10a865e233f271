//! Tests of the provider that need nothing running: no libvirtd, no API
//! server. (The tests of the host layer alone, its XML, names, seed ISO and
//! libvirt's `test:///default` driver, are capl-host's `offline` binary.)
//!
//! The provider's integration tests are three binaries, by what they need:
//! - `offline` (this one): nothing;
//! - `api_server`: the local control plane (`cargo xtask control-plane build`);
//! - `libvirtd`: the private test libvirtd (`cargo xtask host up`).
//!
//! Each test that misses what it needs fails with a message naming the command
//! that provides it. `cargo xtask test` provides everything.

use capl_test_support::clusterctl_template;

mod book;
mod dockerfile;
mod host_errors;
mod image_download;
mod manifests;
mod stock_image;
mod templates;
mod workflows;
