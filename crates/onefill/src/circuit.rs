//! A circuit breaker in front of the backend: after consecutive failures it
//! opens and calls skip the backend (callers are served from the flight and
//! stale values), then one probe is let through; a success closes it.

use std::time::Duration;

use parking_lot::Mutex;
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

#[derive(Debug)]
pub(crate) struct Breaker {
    config: CircuitBreaker,
    state: Mutex<BreakerState>,
}

#[derive(Debug)]
struct BreakerState {
    consecutive_failures: u32,
    open_until: Option<Instant>,
    probing: bool,
}

/// The breaker's verdict on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    Yes,
    Reject,
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
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, BreakerState> {
        self.state.lock()
    }

    pub(crate) fn admit(&self) -> Admit {
        let mut s = self.lock();
        match s.open_until {
            None => Admit::Yes,
            Some(until) if Instant::now() < until => Admit::Reject,
            Some(_) if s.probing => Admit::Reject,
            Some(_) => {
                s.probing = true;
                Admit::Yes
            }
        }
    }

    pub(crate) fn success(&self) {
        let mut s = self.lock();
        s.consecutive_failures = 0;
        s.open_until = None;
        s.probing = false;
    }

    /// Records a transient failure; returns true when this one opened the circuit.
    pub(crate) fn failure(&self) -> bool {
        if self.config.failure_threshold == 0 {
            return false;
        }
        let mut s = self.lock();
        s.consecutive_failures = s.consecutive_failures.saturating_add(1);
        let reopen = s.probing;
        s.probing = false;
        if reopen || s.consecutive_failures >= self.config.failure_threshold {
            let was_closed = s.open_until.is_none();
            s.open_until = Some(Instant::now() + self.config.open_for);
            return was_closed;
        }
        false
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn opens_probes_and_closes() {
        let b = Breaker::new(CircuitBreaker::new(3, Duration::from_secs(1)));
        assert_eq!(b.admit(), Admit::Yes);
        assert!(!b.failure());
        assert!(!b.failure());
        assert!(b.failure(), "third consecutive failure opens");
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.admit(), Admit::Reject);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(b.admit(), Admit::Yes, "one probe after open_for");
        assert_eq!(b.admit(), Admit::Reject, "only one probe at a time");
        assert!(
            !b.failure(),
            "a failed probe re-opens without counting as a new opening"
        );
        assert_eq!(b.admit(), Admit::Reject);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(b.admit(), Admit::Yes);
        b.success();
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(b.admit(), Admit::Yes);
    }

    #[test]
    fn disabled_never_opens() {
        let b = Breaker::new(CircuitBreaker::disabled());
        for _ in 0..100 {
            b.failure();
        }
        assert_eq!(b.admit(), Admit::Yes);
    }
}
