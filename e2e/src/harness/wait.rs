//! Polling with a deadline: every wait of the harness goes through [`until`]
//! (or [`until_blocking`], its twin for blocking probes), the testbed's one
//! bounded wait with the harness's interval, its treatment of API calls that
//! got no answer, and its timeout error.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use anyhow::{Result, anyhow};
use capl_testbed::wait::{self, Bound, Stop};

pub use capl_testbed::wait::Check;

/// How often [`until`] polls.
const INTERVAL: Duration = Duration::from_millis(1000);

/// Polls `probe` every second until it is done, fails hard, or `timeout` passes.
/// A probe error that is a [`NoAnswer`] (see [`Answered`]) counts as "not yet";
/// any other error fails at once. A timeout error names `what`, the timeout and
/// the last state seen.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Check<T>>>,
{
    let outcome = wait::until(Bound::new(timeout, INTERVAL), || {
        let poll = probe();
        async move { not_yet_without_answer(poll.await) }
    })
    .await;
    conclude(outcome, what, timeout)
}

/// [`until`] for a probe that blocks (kubectl): the same polls, deadline and
/// errors, the thread asleep between polls.
pub fn until_blocking<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Result<Check<T>>) -> Result<T> {
    let outcome = wait::blocking(Bound::new(timeout, INTERVAL), || not_yet_without_answer(probe()));
    conclude(outcome, what, timeout)
}

/// A probe error that is a [`NoAnswer`] as "not yet", with its text as the
/// state seen.
fn not_yet_without_answer<T>(outcome: Result<Check<T>>) -> Result<Check<T>> {
    match outcome {
        Err(err) if err.is::<NoAnswer>() => Ok(Check::Pending(format!("{err:#}"))),
        other => other,
    }
}

/// The wait's value, the probe's hard error, or the timeout error.
fn conclude<T>(outcome: Result<T, Stop<anyhow::Error>>, what: &str, timeout: Duration) -> Result<T> {
    outcome.map_err(|stop| {
        stop.into_error(|last| anyhow!("timed out after {timeout:?} waiting for {what}; last seen: {last}"))
    })
}

/// Whether a Kubernetes API call failed in a way that passes by itself: no answer
/// at all (connect or read timeout, connection refused or reset) or an answer
/// asking to come back later (429, 500, 502, 503, 504). The API server of a
/// workload cluster whose guest CPUs QEMU emulates gives both, for minutes at a
/// time, while its guest is saturated (kubeadm restarting static Pods, a worker
/// joining).
pub fn passes(err: &kube::Error) -> bool {
    match err {
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        kube::Error::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
        _ => false,
    }
}

/// An API call that got no usable answer but may get one later ([`passes`]);
/// [`until`] counts it as "not yet".
#[derive(Debug)]
pub struct NoAnswer {
    what: String,
    source: kube::Error,
}

impl fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: no answer yet ({})", self.what, self.source)
    }
}

impl std::error::Error for NoAnswer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Names what an API call was for and sorts its failure: one that [`passes`]
/// becomes a [`NoAnswer`] (retried by [`until`]), any other fails the wait.
pub trait Answered<T> {
    fn answered(self, what: &str) -> Result<T>;
}

impl<T> Answered<T> for std::result::Result<T, kube::Error> {
    fn answered(self, what: &str) -> Result<T> {
        self.map_err(|source| {
            if passes(&source) {
                anyhow::Error::new(NoAnswer { what: what.to_owned(), source })
            } else {
                anyhow::Error::new(source).context(what.to_owned())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use kube::core::Status;

    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure("refused", "Test").with_code(code)))
    }

    fn no_connection() -> kube::Error {
        kube::Error::Service("client error (SendRequest): connection error: timed out".into())
    }

    #[test]
    fn no_answer_and_try_later_pass_but_a_refusal_does_not() {
        assert!(passes(&no_connection()));
        for code in [429, 500, 502, 503, 504] {
            assert!(passes(&api_error(code)), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 422] {
            assert!(!passes(&api_error(code)), "{code}");
        }
    }

    #[tokio::test]
    async fn until_retries_a_call_without_answer_and_fails_on_a_refusal() {
        let calls = AtomicUsize::new(0);
        let value = until("a pod", Duration::from_secs(60), || async {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let result = if n < 2 { Err(no_connection()) } else { Ok(n) };
            Ok(Check::Done(result.answered("reading Pod p")?))
        })
        .await
        .expect("two timeouts then an answer");
        assert_eq!(value, 2);

        let err = until("a pod", Duration::from_secs(60), || async {
            let result: std::result::Result<(), _> = Err(api_error(403));
            Ok(Check::Done(result.answered("reading Pod p")?))
        })
        .await
        .expect_err("403 fails at once");
        assert!(format!("{err:#}").starts_with("reading Pod p: ApiError"), "{err:#}");

        let err = until("a pod", Duration::ZERO, || async {
            let result: std::result::Result<(), _> = Err(no_connection());
            Ok(Check::Done(result.answered("reading Pod p")?))
        })
        .await
        .expect_err("never answered");
        let text = format!("{err:#}");
        assert!(
            text.starts_with("timed out after 0ns waiting for a pod; last seen: reading Pod p: no answer yet"),
            "{text}"
        );
    }
}
