//! The one deadline of the library: a backend future bounded by a duration
//! from when it began, failing as a [`BackendError`] of kind `Timeout` whose
//! text names what did not answer and how long it was given. Every bound on
//! a backend call (the cache's, the Redis backend's own response timeout,
//! the push connections') goes through here, so a timeout reads the same
//! wherever it fired. The cache's own calls are also given up early when
//! a failover replaces their server ([`checked`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep, Timeout};

use crate::error::{BackendError, BackendErrorKind};

/// How often a [`Checked`] call that has not answered yet asks whether its
/// server still serves keys: the longest a call stays on a server that
/// a failover replaced. A call answered sooner (every call of a healthy
/// server) is never asked.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(10);

pin_project_lite::pin_project! {
    /// A backend call bounded by a deadline, and given up early once its
    /// server no longer serves its keys (see [`checked`]).
    pub(crate) struct Checked<F, S> {
        #[pin]
        fut: F,
        #[pin]
        sleep: Sleep,
        deadline: Instant,
        serves: Option<S>,
    }
}

/// Why a [`Checked`] call ended without its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// Its deadline passed.
    Elapsed,
    /// Its server stopped serving keys while it ran.
    Moved,
}

/// `fut`, bounded by `limit` from `began`, and given up as soon as
/// `serves` says its server no longer serves keys (asked every
/// [`CHECK_EVERY`] while it runs). A primary that a failover replaced
/// (stopped, or paused by a manual failover) holds a call until its
/// timeout: the call is better sent again where the keys are now. One
/// timer, as [`timer`]'s: a call that answers within [`CHECK_EVERY`]
/// costs what it did. Without `serves` (a server that is never replaced
/// under a call), the deadline alone, as [`timer`].
pub(crate) fn checked<F: Future, S: FnMut() -> bool>(
    began: Instant,
    limit: Duration,
    serves: Option<S>,
    fut: F,
) -> Checked<F, S> {
    let far = began + Duration::from_secs(365 * 24 * 3600);
    let deadline = began.checked_add(limit).map_or(far, |d| d.min(far));
    let first = match serves {
        Some(_) => began
            .checked_add(CHECK_EVERY)
            .map_or(deadline, |c| c.min(deadline)),
        None => deadline,
    };
    Checked {
        fut,
        sleep: tokio::time::sleep_until(first),
        deadline,
        serves,
    }
}

impl<F: Future, S: FnMut() -> bool> Future for Checked<F, S> {
    type Output = Result<F::Output, Cut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(answer) = this.fut.poll(cx) {
            return Poll::Ready(Ok(answer));
        }
        loop {
            ready!(this.sleep.as_mut().poll(cx));
            if this.sleep.deadline() >= *this.deadline {
                return Poll::Ready(Err(Cut::Elapsed));
            }
            let Some(serves) = this.serves.as_mut() else {
                // Unreachable: without `serves` the first wake-up is the
                // deadline's.
                return Poll::Ready(Err(Cut::Elapsed));
            };
            if !serves() {
                return Poll::Ready(Err(Cut::Moved));
            }
            // From now, not from when the check was due: a task that
            // stalled asks once, not once per check it missed.
            let next = Instant::now()
                .checked_add(CHECK_EVERY)
                .unwrap_or(*this.deadline);
            this.sleep.as_mut().reset(next.min(*this.deadline));
        }
    }
}

/// The cause of a call given up because its server stopped serving keys
/// (see [`moved`]).
#[derive(Debug)]
struct Moved;

impl fmt::Display for Moved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the server was replaced")
    }
}

impl std::error::Error for Moved {}

/// The error of a call `op` given up after `ran` because its server
/// stopped serving keys (a failover replaced it): a connection error
/// (transient), told apart by [`is_moved`]. Like a timeout, it does not
/// say whether a write ran on the server it left.
pub(crate) fn moved(op: &'static str, ran: Duration) -> BackendError {
    BackendError::with_source(
        BackendErrorKind::Connection,
        format!("{op}: its server was replaced after {ran:?} (a failover)"),
        Moved,
    )
}

/// Whether `e` is a call given up by [`moved`]: sent again, it goes to the
/// server that serves the key now.
pub(crate) fn is_moved(e: &BackendError) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.is::<Moved>())
}

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
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_checked_call_is_given_up_soon_after_its_server_moves() {
        let began = Instant::now();
        let serves = AtomicBool::new(true);
        let mover = async {
            tokio::time::sleep(Duration::from_millis(33)).await;
            serves.store(false, Ordering::Relaxed);
            std::future::pending::<Result<(), Cut>>().await
        };
        let call = checked(
            began,
            Duration::from_millis(250),
            Some(|| serves.load(Ordering::Relaxed)),
            std::future::pending::<()>(),
        );
        let cut = tokio::select! {
            cut = call => cut,
            never = mover => never,
        };
        assert_eq!(cut, Err(Cut::Moved));
        assert_eq!(began.elapsed(), Duration::from_millis(40));
        let e = moved("get", began.elapsed());
        assert!(is_moved(&e) && e.is_transient());
        assert!(!is_moved(&timed_out("get", Duration::from_millis(250))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_checked_call_answers_or_times_out_as_a_timer_does() {
        let began = Instant::now();
        let slow = async {
            tokio::time::sleep(Duration::from_millis(25)).await;
            7
        };
        assert_eq!(
            checked(began, Duration::from_millis(250), Some(|| true), slow).await,
            Ok(7)
        );
        let began = Instant::now();
        let never = std::future::pending::<()>();
        let cut = checked(
            began,
            Duration::from_millis(95),
            None::<fn() -> bool>,
            never,
        )
        .await;
        assert_eq!(cut, Err(Cut::Elapsed));
        assert_eq!(began.elapsed(), Duration::from_millis(95));
        let far = checked(Instant::now(), Duration::MAX, Some(|| true), async { 8 }).await;
        assert_eq!(far, Ok(8));
    }

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
