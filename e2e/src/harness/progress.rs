//! Progress lines on stderr, while a scenario, the stack or the benchmarks
//! run: `  [<who>] <message>`.

/// Prints `message` as a progress line of `who` (a scenario's id, or a part of the stack).
pub fn say(who: &str, message: impl AsRef<str>) {
    eprintln!("  [{who}] {}", message.as_ref());
}
