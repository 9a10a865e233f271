//! Polling with a deadline: every wait of the harness goes through [`until`].

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// The result of one poll.
pub enum Check<T> {
    Done(T),
    /// Not yet; the text says what was seen (it ends up in the timeout error).
    Pending(String),
}

/// How often [`until`] polls.
const INTERVAL: Duration = Duration::from_millis(1000);

/// Polls `probe` every second until it is done, fails hard, or `timeout` passes.
/// A timeout error names `what`, the timeout and the last state seen.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Check<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe().await? {
            Check::Done(value) => return Ok(value),
            Check::Pending(state) => state,
        };
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(INTERVAL).await;
    }
}
