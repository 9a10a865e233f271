//! Tests of the provider that need the private test libvirtd (`cargo xtask
//! host up`; the contract, URI variable and network and pool names, is
//! `testenv::test_host`). Without it the tests on the real daemon fail naming
//! that command. (The tests of the host layer alone on that daemon, the
//! conformance suite and the host scenarios among them, are capl-host's
//! `libvirtd` binary.)
//!
//! - `controllers_real`: the controllers end to end on the real daemon, with
//!   the local kube-apiserver (`cargo xtask control-plane build`) as well;
//! - `credentials_controllers`: LibvirtClusters over TLS and libssh with
//!   their credentials in Secrets (`credentialsRef`), refused credentials and
//!   a rotated Secret, with the local kube-apiserver too;
//! - `hung_host_manager`: the manager binary with a host that never answers
//!   next to the real daemon, and with one runtime worker and a host that
//!   stops answering while connected (these also need the local control
//!   plane);
//! - `daemon_faults`: libvirtd killed while machines are created and
//!   dnsmasq killed while guests wait for leases (local control plane and the
//!   guest image of `cargo xtask guest-image` as well);
//! - `two_managers`: two manager processes without leader election reserving
//!   addresses on one network at once (local control plane as well).
//!
//! The tests on the real daemon share it and run side by side, except
//! `daemon_faults`, which kills it: it takes the daemon alone
//! ([`own_real_daemon`]) while the others hold a share ([`share_real_daemon`]).

/// The API-server side of the reconciler tests (objects, waits, the manager),
/// for `controllers_real` and `hung_host_manager`.
use capl_test_support::api_server as api_support;
mod controllers_real;
mod credentials_controllers;
mod daemon_faults;
mod hung_host_manager;
mod image_download_real;
mod real_support;
mod two_managers;

pub use capl_host_test_support::real_daemon::{own_real_daemon, share_real_daemon};

/// Writes a test's summary where `cargo xtask test` prints it from (see
/// [`capl_host_test_support::real_daemon::write_report`]).
pub fn report(name: &str, text: &str) {
    capl_host_test_support::real_daemon::write_report(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), name, text);
}
