//! Tests of capl-host that need the private test libvirtd (`cargo xtask host
//! up`; the contract, URI variable and network and pool names, is
//! `capl_testbed::test_host`). Without it the tests on the real daemon fail
//! naming that command. (The provider's tests on that daemon, the controllers
//! and the manager, are the provider's `libvirtd` binary.)
//!
//! - `conformance`: the `Hypervisor` trait on libvirt-sim, libvirt's
//!   `test:///default` driver and the real libvirtd, scenario by scenario;
//! - `host_scenarios`: the host operations (create, start, delete, faults,
//!   foreign objects) on libvirt-sim and the real libvirtd, as one table;
//! - `guest_hardware`: CPU and firmware settings: what libvirt keeps of them
//!   and what the host's domain capabilities refuse;
//! - `host_sim`: host tests only the simulator can do (call counts, faults);
//! - `libvirt_real`: `LibvirtHypervisor` details on the real daemon;
//! - `remote_credentials`: `qemu+tls://` to the daemon's TLS listener with
//!   client certificates of its test CA (and of another CA), and
//!   `qemu+libssh://`/`qemu+libssh2://` through a private sshd, with
//!   credentials in files as a credentials Secret gives them;
//! - `two_hosts`: two more private libvirtd started by the test (not the
//!   test host), guests of both on one Linux bridge with static addresses,
//!   reaching each other (the guest image as well).
//!
//! The tests on the real daemon share it and run side by side
//! ([`share_real_daemon`]); none of them kills it.

mod conformance;
mod guest_hardware;
mod host_scenarios;
mod host_sim;
mod libvirt_real;
mod remote_credentials;
mod two_hosts;

pub use capl_host_test_support::real_daemon::{panic_message, share_real_daemon, share_real_daemon_blocking};

/// Writes a test's summary where `cargo xtask test` prints it from (see
/// [`capl_host_test_support::real_daemon::write_report`]).
pub fn report(name: &str, text: &str) {
    capl_host_test_support::real_daemon::write_report(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), name, text);
}
