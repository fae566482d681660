//! What time it is on the server, within known bounds, so that a hit can
//! read a value's remaining TTL from the expiry its envelope records (the
//! server's clock, stamped by the writing script) without asking for `PTTL`
//! (decision 0011).
//!
//! A sample is a `TIME` answer and the local monotonic instants between
//! which the server produced it: at the local instant `now` the server's
//! clock is at most `time + (now − sent)` (plus a drift allowance), and at
//! least `time + (now − received)`. Only the upper bound is used to read a
//! TTL, so a figure is never fresher than the server's own `PTTL`; the
//! difference (the sample's round trip plus the drift allowance) is how
//! much less fresh it can look. Samples ride on a hit (a pipelined
//! `GET` + `PTTL` + `TIME`, one round trip, at most one in flight) once the
//! last one was sent a second ago; the tighter of the kept and the new is
//! kept.
//! No client wall clock is read anywhere.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// A sample older than this is renewed by the next hit.
const RESAMPLE_AFTER: Duration = Duration::from_secs(1);

/// How fast the server's clock may run against the local monotonic clock:
/// 500 ppm (1 in 2,000), the most NTP slews a clock by (crystals are
/// within ±100 ppm).
const DRIFT_DIVISOR: u64 = 2_000;

/// A sample whose uncertainty (round trip plus drift) exceeds this is not
/// used: hits send the pipelined `GET` + `PTTL` instead.
pub(super) const MAX_ERROR: Duration = Duration::from_millis(20);

/// One `TIME` answer and when it was asked and answered (local instants).
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// The server's clock, in unix microseconds.
    server_us: u64,
    sent: Instant,
    received: Instant,
}

impl Sample {
    /// How far apart the two bounds of the server's clock are at `now`.
    fn error(&self, now: Instant) -> Duration {
        let round_trip = micros(self.received.saturating_duration_since(self.sent));
        let elapsed = micros(now.saturating_duration_since(self.sent));
        Duration::from_micros(round_trip.saturating_add(drift_us(elapsed)))
    }

    /// The latest the server's clock can read at `now`, in unix
    /// microseconds.
    fn latest_us(&self, now: Instant) -> u64 {
        let elapsed = micros(now.saturating_duration_since(self.sent));
        self.server_us
            .saturating_add(elapsed)
            .saturating_add(drift_us(elapsed))
    }
}

/// Whole microseconds, in 64 bits (every hit computes these: no 128-bit
/// division).
fn micros(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()))
}

/// The drift allowance for `elapsed_us`, rounded up.
fn drift_us(elapsed_us: u64) -> u64 {
    elapsed_us / DRIFT_DIVISOR + 1
}

/// The server's clock as this process knows it (one per standalone
/// backend; a cluster's masters each have their own clock, and its hits
/// keep asking for `PTTL`).
#[derive(Debug, Default)]
pub(super) struct ServerClock {
    state: Mutex<State>,
    sampling: AtomicBool,
}

#[derive(Clone, Copy, Debug, Default)]
struct State {
    /// The tightest recent sample.
    kept: Option<Sample>,
    /// When the last answered sample was sent (kept or not).
    tried: Option<Instant>,
}

/// What a hit sends.
pub(super) enum Plan<'a> {
    /// `GET` alone: the envelope's expiry and this estimate tell the TTL.
    Get(Estimate),
    /// `GET` + `PTTL` + `TIME`: a new sample rides on this hit.
    Sample(Sampling<'a>),
    /// `GET` + `PTTL`: no usable sample (none yet, or too uncertain).
    GetPttl,
}

/// The kept sample, as of the hit that uses it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Estimate(Sample);

impl Estimate {
    /// The TTL left, at the local instant `now`, of a key that expires at
    /// `expires_at_ms` (unix ms of the server's clock): never more than
    /// the server would report. `None` if it may have expired.
    pub(super) fn remaining(&self, expires_at_ms: u64, now: Instant) -> Option<Duration> {
        let left_us = expires_at_ms
            .saturating_mul(1_000)
            .checked_sub(self.0.latest_us(now))?;
        (left_us > 0).then(|| Duration::from_micros(left_us))
    }
}

/// The right to take the next sample, given back when dropped (a hit whose
/// future is dropped mid-flight frees it too).
pub(super) struct Sampling<'a> {
    clock: &'a ServerClock,
    sent: Instant,
}

impl Sampling<'_> {
    /// The server answered `TIME` with `(seconds, microseconds)`; the
    /// pipeline that carried it was sent when this was made.
    pub(super) fn record(self, seconds: u64, micros: u64) {
        let received = Instant::now();
        let sample = Sample {
            server_us: seconds.saturating_mul(1_000_000).saturating_add(micros),
            sent: self.sent,
            received,
        };
        let mut state = self.clock.state.lock();
        state.tried = Some(self.sent);
        // Keep the tighter one (a reply delayed by a busy client widens
        // the bounds; an older sample widens by its drift allowance).
        let better = state
            .kept
            .is_none_or(|old| sample.error(received) <= old.error(received));
        if better {
            state.kept = Some(sample);
        }
    }
}

impl Sampling<'_> {
    /// The server refused the sample: try again a second later, not at
    /// every hit.
    pub(super) fn refused(self) {
        self.clock.state.lock().tried = Some(self.sent);
    }
}

impl Drop for Sampling<'_> {
    fn drop(&mut self) {
        self.clock.sampling.store(false, Ordering::Release);
    }
}

impl ServerClock {
    /// How the hit about to be sent should ask.
    pub(super) fn plan(&self, now: Instant) -> Plan<'_> {
        let State { kept, tried } = *self.state.lock();
        let due = tried.is_none_or(|t| now.saturating_duration_since(t) >= RESAMPLE_AFTER);
        if due
            && self
                .sampling
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return Plan::Sample(Sampling {
                clock: self,
                sent: Instant::now(),
            });
        }
        match kept {
            Some(sample) if sample.error(now) <= MAX_ERROR => Plan::Get(Estimate(sample)),
            _ => Plan::GetPttl,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_kind(plan: &Plan<'_>) -> &'static str {
        match plan {
            Plan::Get(_) => "get",
            Plan::Sample(_) => "sample",
            Plan::GetPttl => "pair",
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_hit_samples_and_the_others_ask_for_pttl_meanwhile() {
        let clock = ServerClock::default();
        let first = clock.plan(Instant::now());
        assert_eq!(plan_kind(&first), "sample");
        assert_eq!(plan_kind(&clock.plan(Instant::now())), "pair");
        // Dropped without an answer: the next hit samples.
        drop(first);
        let Plan::Sample(sampling) = clock.plan(Instant::now()) else {
            panic!("no sample after a dropped one");
        };
        tokio::time::advance(Duration::from_micros(100)).await;
        sampling.record(1_700_000_000, 250_000);
        let Plan::Get(estimate) = clock.plan(Instant::now()) else {
            panic!("a sample in hand, and no GET alone");
        };
        // The server read 1_700_000_000.250 s at most 100 µs ago: a key
        // expiring at .350 has at most 100 ms left, and at least 99.8 ms
        // (the round trip and a microsecond of drift allowance).
        let left = estimate
            .remaining(1_700_000_000_350, Instant::now())
            .unwrap();
        assert!(left <= Duration::from_millis(100), "{left:?}");
        assert!(left >= Duration::from_micros(99_800), "{left:?}");
        assert_eq!(estimate.remaining(1_700_000_000_250, Instant::now()), None);
        // A second later the sample is renewed by one hit.
        tokio::time::advance(RESAMPLE_AFTER).await;
        assert_eq!(plan_kind(&clock.plan(Instant::now())), "sample");
    }

    #[tokio::test(start_paused = true)]
    async fn the_figure_shrinks_with_the_drift_allowance_and_a_loose_sample_is_not_used() {
        let clock = ServerClock::default();
        let Plan::Sample(sampling) = clock.plan(Instant::now()) else {
            panic!("no sample");
        };
        sampling.record(1_000, 0);
        let Plan::Get(estimate) = clock.plan(Instant::now()) else {
            panic!("no GET alone");
        };
        let at = Instant::now() + Duration::from_millis(900);
        // 900 ms later, 500 ppm of it (450 µs) more may have passed there.
        let left = estimate.remaining(1_000_000 + 1_000, at).unwrap();
        assert!(left <= Duration::from_micros(100_000 - 450), "{left:?}");

        // A sample whose answer took longer than MAX_ERROR is not used.
        let clock = ServerClock::default();
        let Plan::Sample(sampling) = clock.plan(Instant::now()) else {
            panic!("no sample");
        };
        tokio::time::advance(MAX_ERROR + Duration::from_millis(1)).await;
        sampling.record(1_000, 0);
        assert_eq!(plan_kind(&clock.plan(Instant::now())), "pair");
    }
}
