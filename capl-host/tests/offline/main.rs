//! Tests of capl-host that need nothing running: no libvirtd. They use the
//! libvirt client library (libvirt's in-process `test:///default` driver),
//! the simulator, and the ISO readers `cargo xtask test` installs (xorriso,
//! blkid).
//!
//! capl-host's integration tests are two binaries, by what they need:
//! - `offline` (this one): nothing;
//! - `libvirtd`: the private test libvirtd (`cargo xtask host up`).
//!
//! Each test that misses what it needs fails with a message naming the command
//! that provides it. `cargo xtask test` provides everything.

mod host_cloud_init_iso;
mod host_naming;
mod host_xml_snapshots;
mod libvirt_test_driver;
