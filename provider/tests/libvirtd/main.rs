//! Tests that need the private test libvirtd (`cargo xtask host up`; the
//! contract, URI variable and network and pool names, is
//! `testenv::test_host`). Without it the tests on the real daemon fail naming
//! that command.
//!
//! - `conformance`: the `Hypervisor` trait on libvirt-sim, libvirt's
//!   `test:///default` driver and the real libvirtd, scenario by scenario;
//! - `host_scenarios`: the host operations (create, start, delete, faults,
//!   foreign objects) on libvirt-sim and the real libvirtd, as one table;
//! - `host_sim`: host tests only the simulator can do (call counts, faults);
//! - `libvirt_real`: `LibvirtHypervisor` details on the real daemon;
//! - `remote_credentials`: `qemu+tls://` to the daemon's TLS listener with
//!   client certificates of its test CA (and of another CA), and
//!   `qemu+libssh://`/`qemu+libssh2://` through a private sshd, with
//!   credentials in files as a credentials Secret gives them;
//! - `controllers_real`: the controllers end to end on the real daemon, with
//!   the local kube-apiserver (`cargo xtask control-plane build`) as well;
//! - `credentials_controllers`: LibvirtClusters over TLS and libssh with
//!   their credentials in Secrets (`credentialsRef`), refused credentials and
//!   a rotated Secret, with the local kube-apiserver too;
//! - `hung_host_manager`: the manager binary with a host that never answers
//!   next to the real daemon (this one also needs the local control plane);
//! - `daemon_faults`: libvirtd killed while machines are created and
//!   dnsmasq killed while guests wait for leases (local control plane and the
//!   guest image of `cargo xtask guest-image` as well);
//! - `two_managers`: two manager processes without leader election reserving
//!   addresses on one network at once (local control plane as well);
//! - `two_hosts`: two more private libvirtd started by the test (not the
//!   test host), guests of both on one Linux bridge with static addresses,
//!   reaching each other (the guest image as well).
//!
//! The tests on the real daemon share it and run side by side, except
//! `daemon_faults`, which kills it: it takes the daemon alone
//! ([`own_real_daemon`]) while the others hold a share ([`share_real_daemon`]).

/// The API-server side of the reconciler tests (objects, waits, the manager),
/// for `controllers_real` and `hung_host_manager`.
use capl_test_support::api_server as api_support;
mod conformance;
mod controllers_real;
mod credentials_controllers;
mod daemon_faults;
mod host_scenarios;
mod host_sim;
mod host_support;
mod hung_host_manager;
mod libvirt_real;
mod real_support;
mod remote_credentials;
mod two_hosts;
mod two_managers;

/// Who uses the private libvirtd in this test process: shared by the tests
/// that only use it, taken alone by the one that kills and restarts it.
static REAL_DAEMON: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A share of the private libvirtd, for a test that uses it (async tests).
pub async fn share_real_daemon() -> tokio::sync::RwLockReadGuard<'static, ()> {
    REAL_DAEMON.read().await
}

/// [`share_real_daemon`] for tests that are not async.
pub fn share_real_daemon_blocking() -> tokio::sync::RwLockReadGuard<'static, ()> {
    REAL_DAEMON.blocking_read()
}

/// The private libvirtd alone, for a test that kills it: waits until the
/// tests that share it are done, and holds off new ones.
pub async fn own_real_daemon() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    REAL_DAEMON.write().await
}

/// The message of a caught panic (scenarios run under `catch_unwind` so one
/// failure does not hide the others).
pub fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

/// Writes a test's summary to `<target>/tmp/reports/<name>.txt` (which
/// `cargo xtask test` prints after the run, since `cargo test` hides the
/// output of passing tests) and to stderr.
pub fn report(name: &str, text: &str) {
    eprint!("{text}");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reports");
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join(format!("{name}.txt")), text)) {
        eprintln!("cannot write the {name} report into {}: {e}", dir.display());
    }
}
