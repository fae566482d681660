//! A flight's backend budget: how much backend time it may lose to
//! failures before its callers must be answered.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::error::{BackendError, BackendErrorKind};

/// The backend time a flight may lose to failures before its callers are
/// answered: one backend timeout in all. Every call on the callers' path
/// (get, acquire, subscribe, re-checks, fill) is bounded by what is left,
/// and a call that fails is charged what it took, so a hung backend costs a
/// caller one timeout plus its load, never a chain of timeouts (each step
/// given a full timeout of its own would make a caller wait for all of
/// them in turn). Calls that answer are not charged: a healthy backend that is
/// far away (tens of ms a call) is waited on as long as the protocol needs.
pub(crate) struct Budget {
    pub(crate) total: Duration,
    left_micros: AtomicU64,
    /// When the last backend call made under this budget began.
    last_began: Mutex<Option<Instant>>,
}

impl Budget {
    pub(crate) fn new(total: Duration) -> Self {
        let budget = Budget {
            total,
            left_micros: AtomicU64::new(0),
            last_began: Mutex::new(None),
        };
        budget.refill();
        budget
    }
    pub(crate) fn left(&self) -> Duration {
        Duration::from_micros(self.left_micros.load(Ordering::Relaxed))
    }
    pub(crate) fn charge(&self, spent: Duration) {
        let spent = u64::try_from(spent.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .left_micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                Some(left.saturating_sub(spent))
            });
    }
    /// When the last backend call under this budget began, or the read
    /// handed to it by [`began`](Budget::began): what a value read then
    /// lives from (its TTL is read after).
    pub(crate) fn last_began(&self) -> Option<Instant> {
        *self.last_began.lock()
    }

    /// A read made outside [`run`](Budget::run) (a hit's, a batch's)
    /// began at `at`.
    pub(crate) fn began(&self, at: Instant) {
        *self.last_began.lock() = Some(at);
    }

    /// A full budget again (for work after the callers were answered).
    pub(crate) fn refill(&self) {
        let total = u64::try_from(self.total.as_micros()).unwrap_or(u64::MAX);
        self.left_micros.store(total, Ordering::Relaxed);
    }

    /// Runs a backend step bounded by what is left (never more than one
    /// backend timeout), and charges the time it took if it failed. With
    /// the budget spent, the step is not attempted: it fails at once as a
    /// timeout, and the flight degrades.
    pub(crate) async fn run<T, F>(
        &self,
        op: &'static str,
        step: impl FnOnce(Duration) -> F,
    ) -> Result<T, BackendError>
    where
        F: Future<Output = Result<T, BackendError>>,
    {
        let left = self.left();
        if left.is_zero() {
            return Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!(
                    "{op}: not attempted, this flight already lost its backend time ({:?}) to failures",
                    self.total
                ),
            ));
        }
        let started = Instant::now();
        self.began(started);
        let result = step(left).await;
        if result.is_err() {
            self.charge(started.elapsed());
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout() -> Result<(), BackendError> {
        Err(BackendError::new(BackendErrorKind::Timeout, "t"))
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_charged_answers_are_not() {
        let budget = Budget::new(Duration::from_millis(200));
        let slow_answer = |_| async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok::<_, BackendError>(())
        };
        budget.run("get", slow_answer).await.unwrap();
        assert_eq!(budget.left(), Duration::from_millis(200));
        let hang = |limit| async move {
            tokio::time::sleep(limit).await;
            timeout()
        };
        assert!(budget.run("acquire", hang).await.is_err());
        assert_eq!(budget.left(), Duration::ZERO);
        let err = budget
            .run("fill", |_| async { Ok::<_, BackendError>(()) })
            .await;
        assert!(err.unwrap_err().message().contains("not attempted"));
        budget.refill();
        assert_eq!(budget.left(), Duration::from_millis(200));
    }
}
