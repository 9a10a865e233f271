//! The progress of a longer command, one named step at a time.

use anyhow::Result;

/// Runs one named step of a longer command, printing its start, outcome and duration.
pub fn step<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    eprintln!("==> {name}");
    let started = std::time::Instant::now();
    let out = f();
    eprintln!(
        "==> {name}: {} in {:.1} s",
        if out.is_ok() { "done" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    out
}
