//! How a process that lost the lease race waits: bounded, woken by the fill
//! notification, with jittered exponential backoff polling as the fallback.
//!
//! The policy ([`WaitPolicy`], [`OnWaitTimeout`]) and the state machine of
//! one wait ([`Wait`]): subscribe to the key's fill channel first, then
//! re-check (the flight's `acquire`) at every notification, poll tick, or
//! the moment the holder's lease would expire, until the deadline; then the
//! configured outcome ([`WaitPolicy::at_deadline`]).

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::FillSubscription;
use crate::backoff::Backoff;
use crate::error::{Error, InvalidOption};
use crate::shared::Shared;

/// What a waiter does when its deadline passes without a fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnWaitTimeout {
    /// Serve a stale value if one exists, else run one degraded load (without
    /// the lease; at most one per process per key, through the flight).
    #[default]
    StaleOrLoad,
    /// Serve a stale value if one exists, else fail with
    /// [`Error::WaitTimedOut`](crate::Error::WaitTimedOut).
    StaleOrError,
    /// Run one degraded load (at most one per process per key).
    Load,
    /// Fail with [`Error::WaitTimedOut`](crate::Error::WaitTimedOut).
    Error,
}

/// Bounds and pacing for waiting on another process's load.
///
/// The defaults (deadline 10 s, polls from 20 ms doubling to 500 ms with
/// ±25 % jitter, [`OnWaitTimeout::StaleOrLoad`]) wait out a live 6 s load
/// (one load fleet-wide) yet bound every wait. A waiter also re-checks at
/// the moment the holder's lease would expire, so a dead holder is taken
/// over within its lease TTL, not a poll interval later.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct WaitPolicy {
    /// The longest a flight waits for another process's fill.
    pub deadline: Duration,
    /// The first poll interval.
    pub poll_initial: Duration,
    /// The largest poll interval.
    pub poll_max: Duration,
    /// What happens at the deadline.
    pub on_timeout: OnWaitTimeout,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy {
            deadline: Duration::from_secs(10),
            poll_initial: Duration::from_millis(20),
            poll_max: Duration::from_millis(500),
            on_timeout: OnWaitTimeout::default(),
        }
    }
}

impl WaitPolicy {
    /// Sets the deadline.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
    /// Sets the first and the largest poll interval.
    pub fn polling(mut self, initial: Duration, max: Duration) -> Self {
        self.poll_initial = initial;
        self.poll_max = max;
        self
    }
    /// Sets the outcome at the deadline.
    pub fn on_timeout(mut self, outcome: OnWaitTimeout) -> Self {
        self.on_timeout = outcome;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), InvalidOption> {
        let hour = Duration::from_secs(3600);
        if self.deadline.is_zero() || self.deadline > hour {
            return Err(InvalidOption::new(
                "wait.deadline",
                format!("must be within (0, 1h], got {:?}", self.deadline),
            ));
        }
        if self.poll_initial < Duration::from_millis(1) || self.poll_initial > self.poll_max {
            return Err(InvalidOption::new(
                "wait.poll_initial",
                format!(
                    "must be at least 1ms and at most poll_max ({:?}), got {:?}",
                    self.poll_max, self.poll_initial
                ),
            ));
        }
        if self.poll_max > Duration::from_secs(60) {
            return Err(InvalidOption::new(
                "wait.poll_max",
                format!("must be at most 60s, got {:?}", self.poll_max),
            ));
        }
        Ok(())
    }
}

/// What a waiter does at its deadline.
pub(crate) enum AtDeadline<T> {
    /// Serve this stale value.
    Serve(T),
    /// Run one degraded load (without the lease).
    Load,
    /// Fail with this error.
    Fail(Error),
}

impl WaitPolicy {
    /// The configured outcome when the deadline passes, given the stale
    /// value seen while waiting (if any).
    pub(crate) fn at_deadline<T>(&self, stale: Option<T>) -> AtDeadline<T> {
        match (self.on_timeout, stale) {
            (OnWaitTimeout::StaleOrLoad | OnWaitTimeout::StaleOrError, Some(value)) => {
                AtDeadline::Serve(value)
            }
            (OnWaitTimeout::StaleOrLoad | OnWaitTimeout::Load, _) => AtDeadline::Load,
            (OnWaitTimeout::StaleOrError | OnWaitTimeout::Error, _) => {
                AtDeadline::Fail(Error::WaitTimedOut(self.deadline))
            }
        }
    }
}

/// One flight's wait for another process's fill.
pub(crate) struct Wait {
    /// `None` if subscribing failed: polling alone then.
    subscription: Option<Box<dyn FillSubscription>>,
    started: Instant,
    deadline: Instant,
    backoff: Backoff,
}

/// What to do after [`Wait::until_recheck`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Re-check the key (acquire again).
    Recheck,
    /// The deadline passed.
    Deadline,
}

impl Wait {
    /// Starts waiting, with the key's fill subscription if one could be
    /// made (made *before* the caller re-checks, so a fill landing in
    /// between is not missed); without one, the wait polls alone.
    pub(crate) fn start<V>(
        shared: &Shared<V>,
        policy: &WaitPolicy,
        subscription: Option<Box<dyn FillSubscription>>,
    ) -> Wait {
        shared.recorder.wait_started();
        let started = Instant::now();
        Wait {
            subscription,
            started,
            deadline: started + policy.deadline,
            backoff: Backoff::new(policy.poll_initial, policy.poll_max),
        }
    }

    /// Waits until the next re-check is due: the fill is announced, the
    /// next poll tick comes, or the holder's lease (`holder_ttl` left)
    /// would expire, so a dead holder is taken over without delay. Returns
    /// [`Next::Deadline`] once the deadline has passed.
    pub(crate) async fn until_recheck<V>(
        &mut self,
        shared: &Shared<V>,
        holder_ttl: Duration,
    ) -> Next {
        let now = Instant::now();
        if now >= self.deadline {
            return Next::Deadline;
        }
        let nap = self
            .backoff
            .next_interval()
            .min(holder_ttl + Duration::from_millis(1))
            .min(self.deadline - now);
        let notified = match self.subscription.as_mut() {
            Some(sub) => tokio::select! {
                _ = sub.notified() => true,
                _ = tokio::time::sleep(nap) => false,
            },
            None => {
                tokio::time::sleep(nap).await;
                false
            }
        };
        shared.recorder.wait_poll(notified);
        Next::Recheck
    }

    /// Ends the wait (counted, with its duration).
    pub(crate) fn finish<V>(self, shared: &Shared<V>, timed_out: bool) {
        shared
            .recorder
            .wait_finished(self.started.elapsed(), timed_out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_wait_policies_are_rejected() {
        assert!(WaitPolicy::default().validate().is_ok());
        assert!(WaitPolicy::default()
            .deadline(Duration::ZERO)
            .validate()
            .is_err());
        assert!(WaitPolicy::default()
            .polling(Duration::from_secs(2), Duration::from_secs(1))
            .validate()
            .is_err());
    }
}
