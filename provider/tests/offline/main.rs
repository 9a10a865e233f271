//! Tests that need nothing running: no libvirtd, no API server. They use the
//! libvirt client library (libvirt's in-process `test:///default` driver),
//! the simulator, and the ISO readers `cargo xtask test` installs (xorriso,
//! blkid).
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
mod host_cloud_init_iso;
mod host_errors;
mod host_naming;
mod host_xml_snapshots;
mod libvirt_test_driver;
mod manifests;
mod stock_image;
mod templates;
