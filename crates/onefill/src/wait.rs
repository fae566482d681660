//! How a process that lost the lease race waits: bounded, woken by the fill
//! notification or by its watch of the holder, with polling only as a
//! safety net.
//!
//! The policy ([`WaitPolicy`], [`OnWaitTimeout`]) and the state machine of
//! one wait ([`Wait`]): subscribe to the key's fill channel first, then
//! re-check (the flight's `acquire`) at every notification; while the
//! backend watches the holder, take its lease over when the watch says it
//! is gone; at the moment the holder's lease would expire; and, unless
//! the holder is watched, at a poll tick; until the deadline,
//! then the configured outcome ([`WaitPolicy::at_deadline`]). A subscribed
//! waiter's poll tick is the slow safety net ([`WaitPolicy::safety_poll`]);
//! only a waiter without a subscription polls at the fast backoff.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{FillSubscription, Gone, HolderWatch};
use crate::backoff::{jittered, Backoff};
use crate::error::{Error, InvalidOption};
use crate::stats::{Recorder, Waiting};
use crate::token::LeaseToken;
use tracing::Instrument;

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
/// A waiter subscribes to the key's fill notifications, then re-checks the
/// key (one `acquire`, which also takes the lease if it is free):
///
/// - when notified of the fill (or of a release, an invalidation, or the
///   holder's word that it lost its lease): the normal wake-up, about a
///   round trip after the fill;
/// - where the backend watches the holder (a standalone Redis), when the
///   watch says it is gone: it takes the lease over at once;
/// - at the moment the holder's lease would expire, as the last re-check
///   saw it: a live holder's watchdog has extended it by then (the re-check
///   learns the new expiry and the next one waits for it), a dead holder's
///   lease is gone, so the waiter takes over within the lease TTL. A
///   watched holder's lease is long (at least 10 s), so this costs little,
///   and it is still needed: a live process can leave a lease behind (its
///   release failed), and it lets go of it only when a waiter's question
///   about that lease reaches it (on Redis), which a waiter whose watch
///   lost its signal no longer sends;
/// - and, while subscribed and not watching the holder, every
///   [`safety_poll`] (default 3 s ±25 %)
///   after its last re-check: a safety net for a notification lost on the
///   way, not the way a waiter learns of a fill;
/// - without a subscription (subscribing failed), it polls instead from
///   [`poll_initial`] doubling to [`poll_max`] (20 ms → 500 ms by default,
///   ±25 %).
///
/// With the Redis backend a subscription the server has not confirmed yet
/// (a slow or reconnecting subscriber connection) also wakes its waiter at
/// that default polling pace until it is confirmed, and once more then.
///
/// The defaults (deadline 10 s, [`OnWaitTimeout::StaleOrLoad`]) wait out a
/// live 6 s load (one load fleet-wide) yet bound every wait.
///
/// [`safety_poll`]: WaitPolicy::safety_poll
/// [`poll_initial`]: WaitPolicy::poll_initial
/// [`poll_max`]: WaitPolicy::poll_max
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct WaitPolicy {
    /// The longest a flight waits for another process's fill.
    pub deadline: Duration,
    /// The first poll interval of a waiter without a subscription.
    pub poll_initial: Duration,
    /// The largest poll interval of a waiter without a subscription.
    pub poll_max: Duration,
    /// The longest a subscribed waiter goes without re-checking (±25 %),
    /// in case a notification was lost. It also re-checks at every
    /// notification and when the holder's lease would expire. Not used
    /// while the backend watches the holder alive: its beats come over the
    /// connection its notifications would.
    pub safety_poll: Duration,
    /// What happens at the deadline.
    pub on_timeout: OnWaitTimeout,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy {
            deadline: Duration::from_secs(10),
            poll_initial: Duration::from_millis(20),
            poll_max: Duration::from_millis(500),
            safety_poll: Duration::from_secs(3),
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
    /// Sets the first and the largest poll interval of a waiter without a
    /// subscription.
    pub fn polling(mut self, initial: Duration, max: Duration) -> Self {
        self.poll_initial = initial;
        self.poll_max = max;
        self
    }
    /// Sets the safety-net poll of a subscribed waiter: the longest it goes
    /// without re-checking (±25 %).
    pub fn safety_poll(mut self, interval: Duration) -> Self {
        self.safety_poll = interval;
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
        if self.safety_poll < Duration::from_millis(1) || self.safety_poll > hour {
            return Err(InvalidOption::new(
                "wait.safety_poll",
                format!("must be within [1ms, 1h], got {:?}", self.safety_poll),
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
    /// The fast polling of a waiter without a subscription.
    backoff: Backoff,
    /// The safety-net interval of a subscribed waiter.
    safety_poll: Duration,
    /// The holder being watched (the token found in its lease) and its
    /// watch, while the backend can tell whether it is alive: no safety
    /// poll then.
    watch: Option<(LeaseToken, Box<dyn HolderWatch>)>,
    /// Counts this wait in the `onefill_lease_waiters` gauge while it lives.
    _waiting: Waiting,
    /// `onefill.wait`, a child of the flight's call span: open from the
    /// start of the wait to its end; its naps run in it.
    span: tracing::Span,
    /// Re-checks so far, by trigger (the span's fields).
    notified: u64,
    polls: u64,
}

/// What to do after [`Wait::until_recheck`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// The key's fill channel fired: re-check (the fill has most likely
    /// landed).
    Notified,
    /// A poll tick or the holder's lease expiry: re-check (acquire again).
    Recheck,
    /// The watched holder is gone: take its lease over (the token is the
    /// one found in it).
    Gone(Gone, LeaseToken),
    /// The deadline passed.
    Deadline,
}

impl Wait {
    /// Starts waiting, with the key's fill subscription if one could be
    /// made (made *before* the caller re-checks, so a fill landing in
    /// between is not missed); without one, the wait polls alone.
    pub(crate) fn start(
        recorder: &Recorder,
        policy: &WaitPolicy,
        subscription: Option<Box<dyn FillSubscription>>,
    ) -> Wait {
        recorder.wait_started();
        let waiting = recorder.waiting();
        let started = Instant::now();
        Wait {
            subscription,
            started,
            deadline: started + policy.deadline,
            backoff: Backoff::new(policy.poll_initial, policy.poll_max),
            safety_poll: policy.safety_poll,
            watch: None,
            _waiting: waiting,
            notified: 0,
            polls: 0,
            span: tracing::info_span!(
                "onefill.wait",
                notified = tracing::field::Empty,
                polls = tracing::field::Empty,
                timed_out = tracing::field::Empty,
            ),
        }
    }

    /// Watches `holder` (the token found in the lease) with `watch` from
    /// now on, in place of any holder watched before.
    pub(crate) fn watch(&mut self, holder: LeaseToken, watch: Box<dyn HolderWatch>) {
        self.watch = Some((holder, watch));
    }

    /// The holder being watched, if any.
    pub(crate) fn watched(&self) -> Option<&LeaseToken> {
        self.watch.as_ref().map(|(holder, _)| holder)
    }

    /// Stops watching the holder (its lease moved on).
    pub(crate) fn unwatch(&mut self) {
        self.watch = None;
    }

    /// Waits until the next re-check is due, counting from the last one:
    /// the fill is announced; the watched holder is gone; the holder's
    /// lease (`holder_ttl` left at the last re-check) would expire, so a
    /// dead holder, or a lease a live holder left behind, is taken over
    /// without delay; or the next poll tick comes, which for a subscribed
    /// waiter is only the safety net ([`WaitPolicy::safety_poll`], not
    /// while the holder is watched) and for one without a subscription the
    /// fast backoff. Returns
    /// [`Next::Deadline`] once the deadline has passed.
    pub(crate) async fn until_recheck(
        &mut self,
        recorder: &Recorder,
        holder_ttl: Duration,
    ) -> Next {
        let checked = Instant::now();
        let lease_ends = holder_ttl.saturating_add(Duration::from_millis(1));
        loop {
            let now = Instant::now();
            if now >= self.deadline {
                return Next::Deadline;
            }
            let left = self.deadline - now;
            let tick = match (&self.subscription, &self.watch) {
                // A holder watched alive announces its fill, or the loss of
                // its lease, over the connection its beats come through:
                // nothing is left for a safety poll to find.
                (Some(_), Some(_)) => left,
                (Some(_), None) => jittered(self.safety_poll),
                (None, _) => self.backoff.next_interval(),
            };
            // Watched or not: a lease left behind by a live holder is let
            // go only when a question about it reaches the holder, so the
            // lease's expiry stays a bound.
            let nap = tick.min(left).min(lease_ends.saturating_sub(now - checked));
            let (subscription, watch) = (&mut self.subscription, &mut self.watch);
            let woken = async {
                let notified = async {
                    match subscription.as_mut() {
                        Some(sub) => sub.notified().await,
                        None => std::future::pending().await,
                    }
                };
                let gone = async {
                    match watch.as_mut() {
                        Some((_, watch)) => watch.gone().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = notified => Woken::Notified,
                    gone = gone => Woken::Watch(gone),
                    () = tokio::time::sleep(nap) => Woken::Tick,
                }
            };
            let notified = match woken.instrument(self.span.clone()).await {
                Woken::Notified => true,
                Woken::Tick => false,
                Woken::Watch(Some(gone)) => match self.watch.take() {
                    Some((holder, _)) => return Next::Gone(gone, holder),
                    None => continue,
                },
                Woken::Watch(None) => {
                    // The watch lost its signal: the safety poll is a
                    // bound again, from the next nap on.
                    self.watch = None;
                    continue;
                }
            };
            return self.woken(recorder, notified);
        }
    }

    /// A nap ended by a notification or a tick: counted, and a re-check.
    fn woken(&mut self, recorder: &Recorder, notified: bool) -> Next {
        recorder.wait_poll(notified);
        // Recorded in the span once, at the end (an OpenTelemetry span
        // keeps every value recorded, not the last).
        if notified {
            self.notified += 1;
        } else {
            self.polls += 1;
        }
        if notified {
            Next::Notified
        } else {
            Next::Recheck
        }
    }

    /// Ends the wait (counted, with its duration).
    pub(crate) fn finish(self, recorder: &Recorder, timed_out: bool) {
        self.span
            .record("notified", self.notified)
            .record("polls", self.polls)
            .record("timed_out", timed_out);
        recorder.wait_finished(self.started.elapsed(), timed_out);
    }
}

/// What ended one nap of a wait.
enum Woken {
    Notified,
    Watch(Option<Gone>),
    Tick,
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
        assert!(WaitPolicy::default()
            .safety_poll(Duration::ZERO)
            .validate()
            .is_err());
        assert!(WaitPolicy::default()
            .safety_poll(Duration::from_secs(7200))
            .validate()
            .is_err());
    }
}
