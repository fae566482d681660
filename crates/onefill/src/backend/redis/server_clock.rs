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
//! much less fresh it can look. The lower bound tells a value that is
//! stale whatever the server's clock reads within them. The first sample is taken when the
//! backend connects; later ones ride on a hit (a pipelined `GET` + `TIME`,
//! one round trip, at most one in flight) once the last one was sent ten
//! seconds ago, when the drift allowance has grown to 5 ms: a figure a few
//! milliseconds less fresh than `PTTL` costs nothing, a `TIME` a second per
//! process is a command the fleet pays for; the tighter of the kept and
//! the new is kept.
//! No client wall clock is read anywhere.
//!
//! A backend under Sentinel talks to another server after a failover,
//! whose clock is another machine's: [`ServerClock::start_over`] makes the
//! samples of the old primary count for nothing (hits send `GET` + `PTTL`
//! until the new primary's first sample, taken by the next hit).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// A sample older than this is renewed by the next hit.
const RESAMPLE_AFTER: Duration = Duration::from_secs(10);

/// How fast the server's clock may run against the local monotonic clock:
/// 500 ppm (1 in 2,000), the most NTP slews a clock by (crystals are
/// within ±100 ppm).
const DRIFT_DIVISOR: u64 = 2_000;

/// A sample whose uncertainty (round trip plus drift) exceeds this is not
/// used: hits send the pipelined `GET` + `PTTL` instead.
pub(super) const MAX_ERROR: Duration = Duration::from_millis(20);

/// One `TIME` answer and when it was asked and answered (microseconds of
/// the local monotonic clock since the [`ServerClock`]'s anchor).
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// The server's clock, in unix microseconds.
    server_us: u64,
    sent_us: u64,
    received_us: u64,
}

impl Sample {
    /// How far apart the two bounds of the server's clock are at `now_us`.
    fn error_us(&self, now_us: u64) -> u64 {
        let round_trip = self.received_us.saturating_sub(self.sent_us);
        round_trip.saturating_add(drift_us(now_us.saturating_sub(self.sent_us)))
    }

    /// The earliest the server's clock can read at `now_us`, in unix
    /// microseconds.
    fn earliest_us(&self, now_us: u64) -> u64 {
        let elapsed = now_us.saturating_sub(self.received_us);
        self.server_us
            .saturating_add(elapsed)
            .saturating_sub(drift_us(elapsed))
    }

    /// The latest the server's clock can read at `now_us`, in unix
    /// microseconds.
    fn latest_us(&self, now_us: u64) -> u64 {
        let elapsed = now_us.saturating_sub(self.sent_us);
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
///
/// Every hit reads it, from every worker thread: a sequence lock on
/// atomics, not a mutex (a preempted holder would stall the hits of the
/// other threads on a busy machine). It has one writer at a time: the
/// holder of the `sampling` flag.
#[derive(Debug)]
pub(super) struct ServerClock {
    anchor: Instant,
    /// Odd while the writer is storing.
    seq: AtomicU64,
    /// The kept sample; `server_us` 0: none yet.
    server_us: AtomicU64,
    sent_us: AtomicU64,
    received_us: AtomicU64,
    /// When the last answered sample was sent, plus one (0: never).
    tried_us: AtomicU64,
    /// The era the stored sample and attempt belong to.
    stored_era: AtomicU64,
    /// The current era: bumped by [`start_over`](ServerClock::start_over).
    era: AtomicU64,
    sampling: AtomicBool,
}

impl Default for ServerClock {
    fn default() -> Self {
        ServerClock {
            anchor: Instant::now(),
            seq: AtomicU64::new(0),
            server_us: AtomicU64::new(0),
            sent_us: AtomicU64::new(0),
            received_us: AtomicU64::new(0),
            tried_us: AtomicU64::new(0),
            stored_era: AtomicU64::new(0),
            era: AtomicU64::new(0),
            sampling: AtomicBool::new(false),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct State {
    /// The tightest recent sample.
    kept: Option<Sample>,
    /// When the last answered sample was sent (kept or not).
    tried_us: Option<u64>,
    /// The era of both.
    era: u64,
}

/// What a hit sends.
pub(super) enum Plan<'a> {
    /// `GET` alone: the envelope's expiry and this estimate tell the TTL.
    Get(Estimate),
    /// `GET` + `TIME`: a new sample rides on this hit.
    Sample(Sampling<'a>),
    /// `GET` + `PTTL`: no usable sample (none yet, or too uncertain).
    GetPttl,
}

/// The kept sample, as of the hit that uses it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Estimate {
    sample: Sample,
    anchor: Instant,
}

impl Estimate {
    /// The TTL left, at the local instant `now`, of a key that expires at
    /// `expires_at_ms` (unix ms of the server's clock): never more than
    /// the server would report. `None` if it may have expired.
    pub(super) fn remaining(&self, expires_at_ms: u64, now: Instant) -> Option<Duration> {
        let now_us = micros(now.saturating_duration_since(self.anchor));
        let left_us = expires_at_ms
            .saturating_mul(1_000)
            .checked_sub(self.sample.latest_us(now_us))?;
        (left_us > 0).then(|| Duration::from_micros(left_us))
    }

    /// The TTL a read at `now` reports for a value that expires at
    /// `expires_at_ms` with `grace` of it stale: the lower bound, when both
    /// bounds tell the same (fresh by the lower one, or stale by the upper
    /// one too); `None` when the server's own `PTTL` must decide (the
    /// bounds straddle the end of its freshness, or it may have expired).
    pub(super) fn judged_ttl(
        &self,
        expires_at_ms: u64,
        grace: Duration,
        now: Instant,
    ) -> Option<Duration> {
        let ttl = self.remaining(expires_at_ms, now)?;
        (ttl > grace || self.remaining_at_most(expires_at_ms, now) <= grace).then_some(ttl)
    }

    /// The most TTL the server can have left, at `now`, for a key that
    /// expires at `expires_at_ms`: never less than it would report.
    fn remaining_at_most(&self, expires_at_ms: u64, now: Instant) -> Duration {
        let now_us = micros(now.saturating_duration_since(self.anchor));
        let left_us = expires_at_ms
            .saturating_mul(1_000)
            .saturating_sub(self.sample.earliest_us(now_us));
        Duration::from_micros(left_us)
    }
}

/// The right to take the next sample, given back when dropped (a hit whose
/// future is dropped mid-flight frees it too).
pub(super) struct Sampling<'a> {
    clock: &'a ServerClock,
    sent_us: u64,
    /// The era it was sent in: its answer may be the old server's.
    era: u64,
}

impl Sampling<'_> {
    /// The server answered `TIME` with `(seconds, microseconds)`; the
    /// pipeline that carried it was sent when this was made. Returns the
    /// answer in unix microseconds.
    pub(super) fn record(self, seconds: u64, micros: u64) -> u64 {
        let received_us = self.clock.now_us(Instant::now());
        let sample = Sample {
            server_us: seconds
                .saturating_mul(1_000_000)
                .saturating_add(micros)
                .max(1),
            sent_us: self.sent_us,
            received_us,
        };
        let Some(old) = self.clock.load_current(self.era) else {
            return sample.server_us;
        };
        // Keep the tighter one (a reply delayed by a busy client widens
        // the bounds; an older sample widens by its drift allowance).
        let better = old
            .kept
            .is_none_or(|old| sample.error_us(received_us) <= old.error_us(received_us));
        self.clock.store(State {
            kept: if better { Some(sample) } else { old.kept },
            tried_us: Some(self.sent_us),
            era: self.era,
        });
        sample.server_us
    }

    /// The server refused the sample: try again ten seconds later, not at
    /// every hit.
    pub(super) fn refused(self) {
        let Some(old) = self.clock.load_current(self.era) else {
            return;
        };
        self.clock.store(State {
            kept: old.kept,
            tried_us: Some(self.sent_us),
            era: self.era,
        });
    }
}

impl Drop for Sampling<'_> {
    fn drop(&mut self) {
        self.clock.sampling.store(false, Ordering::Release);
    }
}

impl ServerClock {
    fn now_us(&self, now: Instant) -> u64 {
        micros(now.saturating_duration_since(self.anchor))
    }

    /// A consistent copy of the state (retried while the writer stores).
    fn load(&self) -> State {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let server_us = self.server_us.load(Ordering::Relaxed);
                let sent_us = self.sent_us.load(Ordering::Relaxed);
                let received_us = self.received_us.load(Ordering::Relaxed);
                let tried_us = self.tried_us.load(Ordering::Relaxed);
                let era = self.stored_era.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return State {
                        kept: (server_us != 0).then_some(Sample {
                            server_us,
                            sent_us,
                            received_us,
                        }),
                        tried_us: tried_us.checked_sub(1),
                        era,
                    };
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Stores `state`; only the holder of the `sampling` flag calls this.
    fn store(&self, state: State) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        if let Some(sample) = state.kept {
            self.server_us.store(sample.server_us, Ordering::Relaxed);
            self.sent_us.store(sample.sent_us, Ordering::Relaxed);
            self.received_us
                .store(sample.received_us, Ordering::Relaxed);
        }
        self.tried_us.store(
            state.tried_us.map_or(0, |t| t.saturating_add(1)),
            Ordering::Relaxed,
        );
        self.stored_era.store(state.era, Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The state, if it is of `era` and `era` is the current one; for a
    /// state of an earlier era, an empty one.
    fn load_current(&self, era: u64) -> Option<State> {
        if self.era.load(Ordering::Acquire) != era {
            return None;
        }
        let state = self.load();
        Some(if state.era == era {
            state
        } else {
            State {
                kept: None,
                tried_us: None,
                era,
            }
        })
    }

    /// The samples taken so far are another server's (a Sentinel
    /// failover): none of them counts any more, and the next hit samples.
    pub(super) fn start_over(&self) {
        self.era.fetch_add(1, Ordering::AcqRel);
    }

    /// How the hit about to be sent should ask.
    pub(super) fn plan(&self, now: Instant) -> Plan<'_> {
        let now_us = self.now_us(now);
        let era = self.era.load(Ordering::Acquire);
        let State { kept, tried_us, .. } = self.load_current(era).unwrap_or(State {
            kept: None,
            tried_us: None,
            era,
        });
        let due = tried_us.is_none_or(|t| now_us.saturating_sub(t) >= micros(RESAMPLE_AFTER));
        if due
            && self
                .sampling
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return Plan::Sample(Sampling {
                clock: self,
                sent_us: self.now_us(Instant::now()),
                era,
            });
        }
        match kept {
            Some(sample) if sample.error_us(now_us) <= micros(MAX_ERROR) => Plan::Get(Estimate {
                sample,
                anchor: self.anchor,
            }),
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
        // And at most 100 ms plus the drift allowance: the server read
        // .250 s no earlier than the answer came, which was now.
        let most = estimate.remaining_at_most(1_700_000_000_350, Instant::now());
        assert!(most >= Duration::from_millis(100), "{most:?}");
        assert!(most <= Duration::from_micros(100_001), "{most:?}");
        assert!(most >= left);
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

        // A read's verdict, from a sample whose answer took 10 ms (the
        // server read 1.000 s between 0 and 10 ms ago): a value expiring
        // at 1.500 s with 300 ms of grace has 490–500 ms left, fresh; at
        // 1.305 s, 295–305 ms: the bounds straddle its grace, so `PTTL`
        // decides; at 1.250 s, 240–250 ms, stale by both.
        let clock = ServerClock::default();
        let Plan::Sample(sampling) = clock.plan(Instant::now()) else {
            panic!("no sample");
        };
        tokio::time::advance(Duration::from_millis(10)).await;
        sampling.record(1, 0);
        let Plan::Get(estimate) = clock.plan(Instant::now()) else {
            panic!("no GET alone");
        };
        let grace = Duration::from_millis(300);
        let now = Instant::now();
        let fresh = estimate.judged_ttl(1_500, grace, now).expect("fresh");
        assert!(fresh >= Duration::from_millis(489) && fresh <= Duration::from_millis(490));
        assert_eq!(estimate.judged_ttl(1_305, grace, now), None);
        let stale = estimate.judged_ttl(1_250, grace, now).expect("stale");
        assert!(stale >= Duration::from_millis(239) && stale <= Duration::from_millis(240));
        assert_eq!(estimate.judged_ttl(1_005, grace, now), None, "may be gone");

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
