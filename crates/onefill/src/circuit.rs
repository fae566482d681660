//! A circuit breaker in front of the backend: after consecutive failures it
//! opens and calls skip the backend (callers are served from the flight and
//! stale values), then one probe is let through; a success closes it.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::time::Instant;

use crate::error::InvalidOption;

/// When the circuit breaker opens and how long it stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CircuitBreaker {
    /// Consecutive transient failures that open the circuit (0 disables it).
    pub failure_threshold: u32,
    /// How long the circuit stays open before one probe is let through.
    pub open_for: Duration,
}

impl Default for CircuitBreaker {
    /// Opens after 5 consecutive failures, for 2 s.
    fn default() -> Self {
        CircuitBreaker {
            failure_threshold: 5,
            open_for: Duration::from_secs(2),
        }
    }
}

impl CircuitBreaker {
    /// A breaker that opens after `failure_threshold` consecutive failures
    /// for `open_for`.
    pub fn new(failure_threshold: u32, open_for: Duration) -> Self {
        CircuitBreaker {
            failure_threshold,
            open_for,
        }
    }
    /// Never opens.
    pub fn disabled() -> Self {
        CircuitBreaker::new(0, Duration::from_secs(1))
    }
    pub(crate) fn validate(&self) -> Result<(), InvalidOption> {
        if self.failure_threshold > 0
            && (self.open_for.is_zero() || self.open_for > Duration::from_secs(3600))
        {
            return Err(InvalidOption::new(
                "circuit_breaker.open_for",
                format!("must be within (0, 1h], got {:?}", self.open_for),
            ));
        }
        Ok(())
    }
}

/// The state of a cache's breaker, as reported in [`Stats`](crate::Stats)-like
/// diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CircuitState {
    /// Calls go to the backend.
    Closed,
    /// Calls skip the backend until the probe time.
    Open,
    /// One probe call is under way.
    HalfOpen,
}

/// One [`Breaker`] per shard of the backend
/// ([`Backend::shard`](crate::backend::Backend::shard)): a Redis Cluster
/// master that fails opens its own circuit, and the keys of the healthy
/// masters keep their normal service.
#[derive(Debug)]
pub(crate) struct Breakers {
    config: CircuitBreaker,
    /// Shard 0: every key of a backend that fails as a whole, without a
    /// lookup.
    first: Breaker,
    others: RwLock<HashMap<u64, Arc<Breaker>>>,
}

/// How long after its last call a shard's breaker still counts in
/// [`Breakers::state`].
const IN_USE_FOR: Duration = Duration::from_secs(10);

/// Shards remembered before the closed breakers of the others are pruned
/// (a shard's number changes when a failover moves its slots).
const MAX_REMEMBERED_SHARDS: usize = 1024;

/// A borrowed or shared [`Breaker`].
pub(crate) enum BreakerRef<'a> {
    First(&'a Breaker),
    Other(Arc<Breaker>),
}

impl Deref for BreakerRef<'_> {
    type Target = Breaker;
    fn deref(&self) -> &Breaker {
        match self {
            BreakerRef::First(b) => b,
            BreakerRef::Other(b) => b,
        }
    }
}

impl Breakers {
    pub(crate) fn new(config: CircuitBreaker) -> Self {
        Breakers {
            config,
            first: Breaker::new(config),
            others: RwLock::new(HashMap::new()),
        }
    }

    /// The breaker of `shard`, created closed on first use.
    pub(crate) fn of(&self, shard: u64) -> BreakerRef<'_> {
        if shard == 0 {
            return BreakerRef::First(&self.first);
        }
        if let Some(b) = self.others.read().get(&shard) {
            return BreakerRef::Other(b.clone());
        }
        let mut others = self.others.write();
        if others.len() >= MAX_REMEMBERED_SHARDS {
            others.retain(|_, b| b.state() != CircuitState::Closed);
        }
        BreakerRef::Other(
            others
                .entry(shard)
                .or_insert_with(|| Arc::new(Breaker::new(self.config)))
                .clone(),
        )
    }

    /// The worst state over the shards in use: open if any is. Left out: a
    /// shard that no longer serves keys (`serves_keys` says no: a failover
    /// or a reshard moved all its slots, so no call will probe its breaker
    /// again), and a shard no call asked about for [`IN_USE_FOR`]. Either
    /// would make the cache look unhealthy after the outage is over.
    pub(crate) fn state(&self, serves_keys: impl Fn(u64) -> bool) -> CircuitState {
        let others = self.others.read();
        std::iter::once(&self.first)
            .chain(
                others
                    .iter()
                    .filter(|(shard, _)| serves_keys(**shard))
                    .map(|(_, b)| &**b),
            )
            .filter(|b| b.in_use())
            .map(|b| b.state())
            .max_by_key(|state| match state {
                CircuitState::Closed => 0,
                CircuitState::HalfOpen => 1,
                CircuitState::Open => 2,
            })
            .unwrap_or(CircuitState::Closed)
    }
}

#[derive(Debug)]
pub(crate) struct Breaker {
    config: CircuitBreaker,
    state: Mutex<BreakerState>,
    /// Closed with no failure since the last success: a call goes through
    /// and a success has nothing to reset, without the lock (every backend
    /// call of every flight passes here). Written under the lock only.
    healthy: AtomicBool,
    /// When a call last asked to go through: milliseconds after `epoch`,
    /// plus one (0: never).
    last_call: AtomicU64,
    epoch: Instant,
}

#[derive(Debug)]
struct BreakerState {
    consecutive_failures: u32,
    open_until: Option<Instant>,
    probing: bool,
}

/// Leave to make one backend call, from [`Breaker::admit`].
///
/// The call's outcome must be reported with [`succeeded`](Permit::succeeded)
/// or [`failed`](Permit::failed). A permit dropped without either (the
/// caller's future was dropped mid-call) reports nothing; if it was the
/// half-open probe, the probe slot is freed, so the next call probes: a
/// probe ends one way or the other whatever happens to it, and the breaker
/// can never stay half-open.
#[must_use]
pub(crate) struct Permit<'a> {
    breaker: &'a Breaker,
    /// `Some` for the half-open probe until its outcome is reported.
    probe: Option<()>,
}

impl Breaker {
    pub(crate) fn new(config: CircuitBreaker) -> Self {
        Breaker {
            config,
            state: Mutex::new(BreakerState {
                consecutive_failures: 0,
                open_until: None,
                probing: false,
            }),
            healthy: AtomicBool::new(true),
            last_call: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    fn note_call(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        // Written only when it changed: the line stays shared between cores.
        if self.last_call.load(Ordering::Relaxed) != now {
            self.last_call.store(now, Ordering::Relaxed);
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, BreakerState> {
        self.state.lock()
    }

    /// A permit for one call, or `None` while the circuit is open (or its
    /// one probe is under way).
    pub(crate) fn admit(&self) -> Option<Permit<'_>> {
        self.note_call();
        if self.healthy.load(Ordering::Acquire) {
            return Some(Permit {
                breaker: self,
                probe: None,
            });
        }
        let mut s = self.lock();
        let probe = match s.open_until {
            None => None,
            Some(until) if Instant::now() < until => return None,
            Some(_) if s.probing => return None,
            Some(_) => {
                s.probing = true;
                Some(())
            }
        };
        Some(Permit {
            breaker: self,
            probe,
        })
    }

    fn success(&self) {
        if self.healthy.load(Ordering::Acquire) {
            return;
        }
        let mut s = self.lock();
        s.consecutive_failures = 0;
        s.open_until = None;
        s.probing = false;
        self.healthy.store(true, Ordering::Release);
    }

    /// Records a transient failure of the probe (`probe`) or of any other
    /// call; returns true when this one opened the circuit. Only the probe
    /// ends the half-open state: a call admitted before the circuit opened
    /// that fails late must not free the probe slot while the probe runs.
    fn failure(&self, probe: bool) -> bool {
        if self.config.failure_threshold == 0 {
            return false;
        }
        let mut s = self.lock();
        self.healthy.store(false, Ordering::Release);
        s.consecutive_failures = s.consecutive_failures.saturating_add(1);
        if probe {
            s.probing = false;
            s.open_until = Some(Instant::now() + self.config.open_for);
            return false;
        }
        if s.open_until.is_none() && s.consecutive_failures >= self.config.failure_threshold {
            s.open_until = Some(Instant::now() + self.config.open_for);
            return true;
        }
        false
    }

    /// Whether a call asked to go through in the last [`IN_USE_FOR`].
    fn in_use(&self) -> bool {
        match self.last_call.load(Ordering::Relaxed) {
            0 => false,
            at => {
                self.epoch
                    .elapsed()
                    .saturating_sub(Duration::from_millis(at - 1))
                    < IN_USE_FOR
            }
        }
    }

    pub(crate) fn state(&self) -> CircuitState {
        let s = self.lock();
        match s.open_until {
            None => CircuitState::Closed,
            Some(_) if s.probing => CircuitState::HalfOpen,
            Some(until) if Instant::now() < until => CircuitState::Open,
            Some(_) => CircuitState::HalfOpen,
        }
    }
}

impl Permit<'_> {
    /// The backend answered (an answer that is an error, such as a script
    /// error or `NOAUTH`, still proves it alive): closes the circuit.
    pub(crate) fn succeeded(mut self) {
        self.probe = None;
        self.breaker.success();
    }

    /// The call failed transiently (timeout, connection, busy); returns true
    /// when this failure opened the circuit.
    pub(crate) fn failed(mut self) -> bool {
        let probe = self.probe.take().is_some();
        self.breaker.failure(probe)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.probe.take().is_some() {
            // The probe was abandoned: free the slot so the next call probes.
            self.breaker.lock().probing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail(b: &Breaker) -> bool {
        b.admit().expect("admitted").failed()
    }

    #[tokio::test(start_paused = true)]
    async fn opens_probes_and_closes() {
        let b = Breaker::new(CircuitBreaker::new(3, Duration::from_secs(1)));
        assert!(!fail(&b));
        assert!(!fail(&b));
        assert!(fail(&b), "third consecutive failure opens");
        assert_eq!(b.state(), CircuitState::Open);
        assert!(b.admit().is_none());
        tokio::time::advance(Duration::from_millis(1001)).await;
        let probe = b.admit().expect("one probe after open_for");
        assert!(b.admit().is_none(), "only one probe at a time");
        assert!(
            !probe.failed(),
            "a failed probe re-opens without counting as a new opening"
        );
        assert!(b.admit().is_none());
        tokio::time::advance(Duration::from_millis(1001)).await;
        b.admit().expect("probe").succeeded();
        assert_eq!(b.state(), CircuitState::Closed);
        assert!(b.admit().is_some());
    }

    /// Regression: a probe whose caller dropped its
    /// future left the breaker half-open for good.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_probe_frees_the_probe_slot() {
        let b = Breaker::new(CircuitBreaker::new(1, Duration::from_secs(1)));
        assert!(fail(&b));
        tokio::time::advance(Duration::from_millis(1001)).await;
        drop(b.admit().expect("probe"));
        assert_eq!(b.state(), CircuitState::HalfOpen);
        let probe = b.admit().expect("the next call probes again");
        probe.succeeded();
        assert_eq!(b.state(), CircuitState::Closed);
    }

    /// Regression: a call admitted while the circuit was
    /// closed that failed late, during the probe, freed the probe slot and
    /// let a second probe in.
    #[tokio::test(start_paused = true)]
    async fn a_late_failure_does_not_admit_a_second_probe() {
        let b = Breaker::new(CircuitBreaker::new(2, Duration::from_secs(1)));
        let late = b.admit().expect("closed");
        assert!(!fail(&b));
        assert!(fail(&b), "opens");
        tokio::time::advance(Duration::from_millis(1001)).await;
        let probe = b.admit().expect("the probe");
        assert!(!late.failed(), "already open");
        assert!(b.admit().is_none(), "still one probe at a time");
        probe.succeeded();
        assert_eq!(b.state(), CircuitState::Closed);
    }

    /// A failing shard (a cluster master) opens its own circuit only, so
    /// one master's outage does not degrade the keys of the healthy ones.
    #[tokio::test(start_paused = true)]
    async fn shards_fail_apart() {
        let breakers = Breakers::new(CircuitBreaker::new(2, Duration::from_secs(1)));
        assert!(!fail(&breakers.of(7)));
        assert!(fail(&breakers.of(7)), "shard 7 opens");
        assert!(breakers.of(7).admit().is_none());
        assert!(breakers.of(8).admit().is_some(), "shard 8 is not affected");
        assert!(breakers.of(0).admit().is_some(), "nor shard 0");
        assert_eq!(
            breakers.state(|_| true),
            CircuitState::Open,
            "the worst state"
        );
        tokio::time::advance(Duration::from_millis(1001)).await;
        breakers.of(7).admit().expect("probe").succeeded();
        assert_eq!(breakers.state(|_| true), CircuitState::Closed);
    }

    /// After a failover, the dead master's breaker is
    /// never called again; it must not keep the cache's state open.
    #[tokio::test(start_paused = true)]
    async fn a_shard_nobody_calls_any_more_does_not_count() {
        let breakers = Breakers::new(CircuitBreaker::new(1, Duration::from_secs(1)));
        assert!(fail(&breakers.of(7)));
        assert_eq!(breakers.state(|_| true), CircuitState::Open);
        breakers.of(8).admit().expect("closed").succeeded();
        tokio::time::advance(IN_USE_FOR).await;
        breakers.of(8).admit().expect("closed").succeeded();
        assert_eq!(
            breakers.state(|_| true),
            CircuitState::Closed,
            "7 is out of use"
        );
    }

    /// A shard that no longer serves keys (its slots all moved) leaves the
    /// state at once, although it was called a moment ago: no call will
    /// probe its breaker again.
    #[tokio::test(start_paused = true)]
    async fn a_shard_that_serves_no_keys_does_not_count() {
        let breakers = Breakers::new(CircuitBreaker::new(1, Duration::from_secs(1)));
        assert!(fail(&breakers.of(7)));
        breakers.of(8).admit().expect("closed").succeeded();
        assert_eq!(breakers.state(|shard| shard != 9), CircuitState::Open);
        assert_eq!(breakers.state(|shard| shard != 7), CircuitState::Closed);
    }

    #[test]
    fn disabled_never_opens() {
        let b = Breaker::new(CircuitBreaker::disabled());
        for _ in 0..100 {
            fail(&b);
        }
        assert!(b.admit().is_some());
    }
}
