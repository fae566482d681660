//! A circuit breaker in front of the backend: after consecutive failures it
//! opens and calls skip the backend (callers are served from the flight and
//! stale values). While it is open, one call at a time is let through as a
//! probe, on a short interval that grows while the probes fail; any call
//! that gets an answer closes it.
//!
//! Why probe so often: the moment the backend answers again, every process
//! whose circuit is still open goes on loading on its own, and a fleet is
//! back to one load per key only once the last of them has probed. A
//! probe while the backend is down is one call at a time per shard: one
//! that fails at once (a refused connection), about ten a second; or one
//! held to the cache's backend timeout (a server that hangs), which holds
//! its flight's callers too, so the next probe then waits at least three
//! times as long (see `ProbePace::after_probe`).
//!
//! Longer than most files here for its tests, about half of it: the
//! breaker's states and its probe pace are checked here, with time paused,
//! where each rule is one short test.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::error::InvalidOption;

/// When the circuit breaker opens and how often it probes while open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CircuitBreaker {
    /// Consecutive transient failures that open the circuit (0 disables it).
    pub failure_threshold: u32,
    /// The longest the circuit stays open before a probe: the wait before
    /// the first probe is [`first_probe_after`](Self::first_probe_after),
    /// and it doubles after each failed probe up to this.
    pub open_for: Duration,
    /// The wait before the first probe once the circuit opens (at most
    /// [`open_for`](Self::open_for)). Each wait is this doubled once per
    /// failed probe, ±25 % at random so that the processes of a fleet do
    /// not probe in step.
    pub first_probe_after: Duration,
}

/// The default wait before the first probe.
const FIRST_PROBE_AFTER: Duration = Duration::from_millis(25);
/// The default longest wait between two probes.
const OPEN_FOR: Duration = Duration::from_millis(100);

impl Default for CircuitBreaker {
    /// Opens after 5 consecutive failures; probes after 25 ms, then every
    /// 50 ms, then every 100 ms while the probes fail (each ±25 %): a
    /// process is back in step within about 100 ms of the backend's
    /// return, at the cost of about ten probes a second while it is down.
    fn default() -> Self {
        CircuitBreaker {
            failure_threshold: 5,
            open_for: OPEN_FOR,
            first_probe_after: FIRST_PROBE_AFTER,
        }
    }
}

impl CircuitBreaker {
    /// A breaker that opens after `failure_threshold` consecutive failures
    /// and probes every `open_for` while open (no growth: the first probe
    /// waits `open_for` too; see
    /// [`first_probe_after`](Self::first_probe_after)).
    pub fn new(failure_threshold: u32, open_for: Duration) -> Self {
        CircuitBreaker {
            failure_threshold,
            open_for,
            first_probe_after: open_for,
        }
    }
    /// The first probe after `first` rather than `open_for`; the waits
    /// then double up to `open_for` while the probes fail.
    pub fn first_probe_after(mut self, first: Duration) -> Self {
        self.first_probe_after = first;
        self
    }
    /// Never opens.
    pub fn disabled() -> Self {
        CircuitBreaker::new(0, Duration::from_secs(1))
    }
    pub(crate) fn validate(&self) -> Result<(), InvalidOption> {
        if self.failure_threshold == 0 {
            return Ok(());
        }
        if self.open_for.is_zero() || self.open_for > Duration::from_secs(3600) {
            return Err(InvalidOption::new(
                "circuit_breaker.open_for",
                format!("must be within (0, 1h], got {:?}", self.open_for),
            ));
        }
        if self.first_probe_after.is_zero() || self.first_probe_after > self.open_for {
            return Err(InvalidOption::new(
                "circuit_breaker.first_probe_after",
                format!(
                    "must be within (0, open_for = {:?}], got {:?}",
                    self.open_for, self.first_probe_after
                ),
            ));
        }
        Ok(())
    }

    /// The waits between probes (jittered only when they grow: a fixed
    /// `open_for` asked for with [`new`](Self::new) is kept exactly).
    fn probe_pace(&self) -> ProbePace {
        if self.first_probe_after < self.open_for {
            ProbePace::Growing(Backoff::new(self.first_probe_after, self.open_for))
        } else {
            ProbePace::Fixed(self.open_for)
        }
    }
}

/// A failed probe's wait is at least this many times as long as the probe
/// held its call: probes then hold a key's callers a quarter of the time at
/// most, against a server that hangs.
const HELD_FACTOR: u32 = 3;

/// The waits of an open circuit before each probe.
#[derive(Debug)]
enum ProbePace {
    Fixed(Duration),
    Growing(Backoff),
}

impl ProbePace {
    fn next(&mut self) -> Duration {
        match self {
            ProbePace::Fixed(wait) => *wait,
            ProbePace::Growing(backoff) => backoff.next_interval(),
        }
    }

    /// The wait after a probe that failed having held its call `held`:
    /// the next wait, and at least [`HELD_FACTOR`] times that. A probe
    /// refused at once costs nothing, but one against a server that hangs
    /// holds its caller (and every caller of its flight) for the backend
    /// timeout: probed every 100 ms, a hot key would wait on probes most of
    /// the time. A fixed wait asked for is kept as it is.
    fn after_probe(&mut self, held: Duration) -> Duration {
        match self {
            ProbePace::Fixed(wait) => *wait,
            ProbePace::Growing(backoff) => backoff
                .next_interval()
                .max(held.saturating_mul(HELD_FACTOR)),
        }
    }

    /// Starts over from the first wait (the circuit closed).
    fn reset(&mut self) {
        if let ProbePace::Growing(backoff) = self {
            backoff.reset();
        }
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
    /// The wait before the next probe while open.
    pace: ProbePace,
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
    /// `Some` for the half-open probe until its outcome is reported: when
    /// it was let through.
    probe: Option<Instant>,
}

impl Breaker {
    pub(crate) fn new(config: CircuitBreaker) -> Self {
        Breaker {
            config,
            state: Mutex::new(BreakerState {
                consecutive_failures: 0,
                open_until: None,
                probing: false,
                pace: config.probe_pace(),
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
                Some(Instant::now())
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
        s.pace.reset();
        self.healthy.store(true, Ordering::Release);
    }

    /// Records a transient failure of the probe (`probe`) or of any other
    /// call; returns true when this one opened the circuit. Only the probe
    /// ends the half-open state: a call admitted before the circuit opened
    /// that fails late must not free the probe slot while the probe runs.
    fn failure(&self, probe: Option<Instant>) -> bool {
        if self.config.failure_threshold == 0 {
            return false;
        }
        let mut s = self.lock();
        self.healthy.store(false, Ordering::Release);
        s.consecutive_failures = s.consecutive_failures.saturating_add(1);
        if let Some(sent) = probe {
            s.probing = false;
            let now = Instant::now();
            let wait = s.pace.after_probe(now.saturating_duration_since(sent));
            s.open_until = Some(now + wait);
            return false;
        }
        if s.open_until.is_none() && s.consecutive_failures >= self.config.failure_threshold {
            let wait = s.pace.next();
            s.open_until = Some(Instant::now() + wait);
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
        let probe = self.probe.take();
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

    /// Whether a call is admitted `after` from now (time is paused), the
    /// permit dropped unused if so (a dropped probe frees its slot).
    async fn admitted_after(b: &Breaker, after: Duration) -> bool {
        tokio::time::advance(after).await;
        b.admit().is_some()
    }

    /// The default breaker probes soon after it opens, then on a growing
    /// interval up to `open_for` (±25 %) while the probes fail, and starts
    /// over from the first wait once a call succeeded: a process is back
    /// in step within about `open_for` of the backend's return.
    #[tokio::test(start_paused = true)]
    async fn probes_on_a_growing_interval_while_open() {
        let config = CircuitBreaker::default();
        assert_eq!(config.first_probe_after, Duration::from_millis(25));
        assert_eq!(config.open_for, Duration::from_millis(100));
        let b = Breaker::new(config);
        let open = |b: &Breaker| {
            for _ in 0..config.failure_threshold {
                let _ = fail(b);
            }
            assert_eq!(b.state(), CircuitState::Open);
        };
        open(&b);
        // The first wait is 25 ms ±25 %.
        assert!(!admitted_after(&b, Duration::from_millis(18)).await);
        tokio::time::advance(Duration::from_millis(14)).await;
        let probe = b.admit().expect("the first probe by 32 ms");
        assert!(b.admit().is_none(), "one probe in flight at a time");
        assert!(!probe.failed());
        // Then 50 ms ±25 %: not before 37 ms.
        assert!(!admitted_after(&b, Duration::from_millis(37)).await);
        tokio::time::advance(Duration::from_millis(26)).await;
        assert!(!b.admit().expect("the second probe by 63 ms").failed());
        // Then 100 ms ±25 %, and never longer however many probes fail.
        for n in 0..20 {
            assert!(
                !admitted_after(&b, Duration::from_millis(74)).await,
                "probe {n} came too soon"
            );
            tokio::time::advance(Duration::from_millis(52)).await;
            assert!(
                !b.admit().expect("a probe within 126 ms").failed(),
                "a failed probe does not count as a new opening"
            );
        }
        tokio::time::advance(Duration::from_millis(126)).await;
        b.admit().expect("probe").succeeded();
        assert_eq!(b.state(), CircuitState::Closed);
        // Open again: the waits start over from the first.
        open(&b);
        assert!(admitted_after(&b, Duration::from_millis(32)).await);
    }

    /// A probe that held its call (a server that hangs: the probe fails at
    /// the backend timeout) waits at least three times as long before the
    /// next, so probes do not hold a hot key's callers most of the time;
    /// one refused at once goes back to the short waits.
    #[tokio::test(start_paused = true)]
    async fn a_probe_that_hung_waits_three_times_as_long() {
        let b = Breaker::new(CircuitBreaker::default());
        for _ in 0..5 {
            let _ = fail(&b);
        }
        tokio::time::advance(Duration::from_millis(32)).await;
        let probe = b.admit().expect("the first probe");
        tokio::time::advance(Duration::from_millis(250)).await;
        assert!(!probe.failed());
        assert!(
            !admitted_after(&b, Duration::from_millis(749)).await,
            "no probe within 3 x 250 ms"
        );
        tokio::time::advance(Duration::from_millis(2)).await;
        let quick = b.admit().expect("a probe after 750 ms");
        assert!(!quick.failed(), "refused at once");
        assert!(
            admitted_after(&b, Duration::from_millis(126)).await,
            "back to the short waits"
        );
    }

    /// `new` keeps one fixed wait, exactly, as it always did: a caller
    /// that asked for `open_for` gets no probe before it.
    #[tokio::test(start_paused = true)]
    async fn a_fixed_open_for_does_not_grow_or_shrink() {
        let b = Breaker::new(CircuitBreaker::new(1, Duration::from_secs(1)));
        assert!(fail(&b));
        for _ in 0..5 {
            assert!(!admitted_after(&b, Duration::from_millis(999)).await);
            tokio::time::advance(Duration::from_millis(1)).await;
            assert!(!b.admit().expect("the probe at 1 s").failed());
        }
    }

    #[test]
    fn probe_waits_are_checked() {
        let ok = CircuitBreaker::default();
        assert!(ok.validate().is_ok());
        let too_late = ok.first_probe_after(Duration::from_millis(101));
        let err = format!("{:?}", too_late.validate().unwrap_err());
        assert!(err.contains("first_probe_after"), "{err}");
        assert!(ok.first_probe_after(Duration::ZERO).validate().is_err());
        assert!(
            CircuitBreaker::disabled()
                .first_probe_after(Duration::ZERO)
                .validate()
                .is_ok(),
            "a disabled breaker has no waits to check"
        );
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
