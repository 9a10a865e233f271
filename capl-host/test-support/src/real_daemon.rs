//! Who uses the private libvirtd in one test process, and the summaries the
//! suites write.
//!
//! The tests on the real daemon share it and run side by side, except one
//! that kills it: that one takes it alone ([`own_real_daemon`]) while the
//! others hold a share ([`share_real_daemon`]). Each test binary has its own
//! lock; `cargo test` runs the binaries one after the other.

use std::path::Path;

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

/// Writes a test's summary to `<target_tmpdir>/reports/<name>.txt` (which
/// `cargo xtask test` prints after the run, since `cargo test` hides the
/// output of passing tests) and to stderr. A test binary passes its
/// `CARGO_TARGET_TMPDIR`.
pub fn write_report(target_tmpdir: &Path, name: &str, text: &str) {
    eprint!("{text}");
    let dir = target_tmpdir.join("reports");
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join(format!("{name}.txt")), text)) {
        eprintln!("cannot write the {name} report into {}: {e}", dir.display());
    }
}
