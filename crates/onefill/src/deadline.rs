//! The one deadline of the library: a backend future bounded by a duration
//! from when it began, failing as a [`BackendError`] of kind `Timeout` whose
//! text names what did not answer and how long it was given. Every bound on
//! a backend call (the cache's, the Redis backend's own response timeout,
//! the push connections') goes through here, so a timeout reads the same
//! wherever it fired.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, Timeout};

use crate::error::{BackendError, BackendErrorKind};

/// `fut`, bounded by `limit` from `began`: its answer, or a timeout of `op`.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) async fn within<T>(
    op: &'static str,
    began: Instant,
    limit: Duration,
    fut: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    timer(began, limit, fut)
        .await
        .unwrap_or_else(|_| Err(timed_out(op, limit)))
}

/// The timer of [`within`] alone, for a caller that holds the future in
/// its own state and turns the elapsed case into [`timed_out`] itself (the
/// hit path: one layer less in its future). `began` is read once by the
/// caller (no second read of the clock); a deadline past what an `Instant`
/// holds is no deadline, as with `tokio::time::timeout`.
pub(crate) fn timer<F: Future>(began: Instant, limit: Duration, fut: F) -> Timeout<F> {
    match began.checked_add(limit) {
        Some(deadline) => tokio::time::timeout_at(deadline, fut),
        None => tokio::time::timeout(limit, fut),
    }
}

/// The error of a call `op` that did not answer within `limit`.
pub(crate) fn timed_out(op: &'static str, limit: Duration) -> BackendError {
    BackendError::new(
        BackendErrorKind::Timeout,
        format!("{op} did not answer within {limit:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_future_that_does_not_answer_is_a_timeout_that_says_so() {
        let began = Instant::now();
        let err = within(
            "acquire",
            began,
            Duration::from_millis(10),
            std::future::pending::<Result<(), BackendError>>(),
        )
        .await
        .unwrap_err();
        assert!(err.is_timeout());
        assert_eq!(
            err.to_string(),
            "timed out: acquire did not answer within 10ms"
        );
        assert_eq!(began.elapsed(), Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn the_bound_counts_from_when_the_call_began() {
        let began = Instant::now();
        tokio::time::sleep(Duration::from_millis(8)).await;
        let slow = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(())
        };
        let err = within("get", began, Duration::from_millis(10), slow)
            .await
            .unwrap_err();
        assert!(err.is_timeout());
        assert_eq!(began.elapsed(), Duration::from_millis(10));
        let answer = within("get", Instant::now(), Duration::MAX, async { Ok(7) }).await;
        assert_eq!(answer.unwrap(), 7);
    }
}
