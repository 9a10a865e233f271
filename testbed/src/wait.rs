//! The one bounded wait of the tests, the e2e suite and the benchmarks: poll
//! a probe every `interval` until it is done, fails, or `timeout` has passed
//! since the wait began. [`blocking`] sleeps the thread between polls;
//! [`until`] (feature `tokio`) sleeps the task.
//!
//! A wait ends with [`Stop::TimedOut`] when a poll is still pending and more
//! than `timeout` has passed since the wait began, so the probe always runs
//! at least once. Each caller words its own failure (a panic in a test, an
//! error in e2e) from the [`Stop`].

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// How long a wait may take, and how often it looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub timeout: Duration,
    pub interval: Duration,
}

impl Bound {
    pub const fn new(timeout: Duration, interval: Duration) -> Self {
        Self { timeout, interval }
    }
}

/// The result of one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check<T> {
    Done(T),
    /// Not yet; the text says what was seen (it ends up in [`Stop::TimedOut`]).
    Pending(String),
}

impl From<bool> for Check<()> {
    /// `true` is done; `false` is pending with nothing to tell.
    fn from(done: bool) -> Self {
        if done { Check::Done(()) } else { Check::Pending(String::new()) }
    }
}

impl<T> From<Option<T>> for Check<T> {
    /// `Some` is done; `None` is pending with nothing to tell.
    fn from(value: Option<T>) -> Self {
        value.map_or_else(|| Check::Pending(String::new()), Check::Done)
    }
}

/// Why a wait ended without a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop<E> {
    /// The probe failed; the wait stopped at once.
    Failed(E),
    /// The timeout passed; the text of the last pending poll.
    TimedOut(String),
}

impl<E> Stop<E> {
    /// The probe's error, or for a timeout the error `timed_out` makes of
    /// the last state seen.
    pub fn into_error(self, timed_out: impl FnOnce(String) -> E) -> E {
        match self {
            Stop::Failed(err) => err,
            Stop::TimedOut(last) => timed_out(last),
        }
    }
}

/// Polls `probe` on this thread until it is done ([`Check::Done`]), fails
/// (an `Err`), or `bound.timeout` passes.
pub fn blocking<T, E>(bound: Bound, mut probe: impl FnMut() -> Result<Check<T>, E>) -> Result<T, Stop<E>> {
    let started = Instant::now();
    loop {
        match judge(probe(), bound, started)? {
            ControlFlow::Break(value) => return Ok(value),
            ControlFlow::Continue(()) => std::thread::sleep(bound.interval),
        }
    }
}

/// [`blocking`] for an async probe: the same polls and bound, the task
/// asleep between polls.
#[cfg(feature = "tokio")]
pub async fn until<T, E, F, Fut>(bound: Bound, mut probe: F) -> Result<T, Stop<E>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Check<T>, E>>,
{
    let started = Instant::now();
    loop {
        match judge(probe().await, bound, started)? {
            ControlFlow::Break(value) => return Ok(value),
            ControlFlow::Continue(()) => tokio::time::sleep(bound.interval).await,
        }
    }
}

/// One poll's outcome: done, poll again, or stop (failed, or still pending
/// with the timeout gone).
fn judge<T, E>(outcome: Result<Check<T>, E>, bound: Bound, started: Instant) -> Result<ControlFlow<T>, Stop<E>> {
    match outcome {
        Ok(Check::Done(value)) => Ok(ControlFlow::Break(value)),
        Ok(Check::Pending(last)) if started.elapsed() > bound.timeout => Err(Stop::TimedOut(last)),
        Ok(Check::Pending(_)) => Ok(ControlFlow::Continue(())),
        Err(err) => Err(Stop::Failed(err)),
    }
}
