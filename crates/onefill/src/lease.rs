//! The distributed lease: its whole lifecycle, from the acquisition with a
//! fresh token through the watchdog to the fenced fill or the release, and
//! the policy that sizes its TTL.
//!
//! A lease is `SET lock token NX PX ttl` with a fresh random 128-bit token
//! per acquisition; it is released by compare-and-delete and extended by
//! compare-and-`PEXPIRE`, so a process can only ever touch its own lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Acquired, Backend, Stored};
use crate::calls::Calls;
use crate::error::{BackendError, BackendErrorKind, InvalidOption};
use crate::key::FillKeys;
use crate::loader::LoadTimes;
use crate::stats::Recorder;
use crate::token::LeaseToken;

/// How long a lease lives before it must be extended.
///
/// Where the backend cannot tell whether a holder is alive, short enough
/// that a dead holder's lease is gone soon; where it can (a standalone
/// Redis), an adaptive lease is at least 10 s, since the waiters' watch
/// tells them of a dead holder. The watchdog extends it every third of its
/// TTL while the loader really runs.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum LeaseTtl {
    /// Always this TTL.
    Fixed(Duration),
    /// `clamp(factor × p99 of recent load times, floor, ceiling)`; before any
    /// load was measured, `ceiling.min(floor × factor)`.
    Adaptive {
        /// Multiplier on the recent p99 load time.
        factor: f64,
        /// Smallest TTL handed out.
        floor: Duration,
        /// Largest TTL handed out.
        ceiling: Duration,
    },
}

impl Default for LeaseTtl {
    /// Adaptive: 3 × p99, at least 1 s (10 s for a holder its waiters
    /// watch), at most 30 s.
    fn default() -> Self {
        LeaseTtl::Adaptive {
            factor: 3.0,
            floor: Duration::from_secs(1),
            ceiling: Duration::from_secs(30),
        }
    }
}

/// The shortest adaptive lease whose holder the backend watches. Its
/// waiters learn of the holder's death or freeze from the watch, within a
/// second, so its TTL only bounds what the watch cannot see (a waiter
/// whose own watch lost its signal, a lease its live holder failed to
/// release); a longer lease needs fewer renewals
/// (one every few seconds instead of one a second).
pub(crate) const WATCHED_LEASE: Duration = Duration::from_secs(10);

/// The smallest lease TTL accepted: the watchdog extends every third of it.
pub(crate) const MIN_LEASE_TTL: Duration = Duration::from_millis(30);
/// The largest lease TTL accepted.
pub(crate) const MAX_LEASE_TTL: Duration = Duration::from_secs(3600);

impl LeaseTtl {
    pub(crate) fn validate(&self) -> Result<(), InvalidOption> {
        let in_range = |d: &Duration| (MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(d);
        match self {
            LeaseTtl::Fixed(d) if !in_range(d) => Err(InvalidOption::new(
                "lease_ttl",
                format!("must be between {MIN_LEASE_TTL:?} and {MAX_LEASE_TTL:?}, got {d:?}"),
            )),
            LeaseTtl::Adaptive {
                factor,
                floor,
                ceiling,
            } => {
                if !(factor.is_finite() && *factor >= 1.0 && *factor <= 100.0) {
                    return Err(InvalidOption::new(
                        "lease_ttl",
                        format!("adaptive factor must be within 1..=100, got {factor}"),
                    ));
                }
                if !in_range(floor) || !in_range(ceiling) || floor > ceiling {
                    return Err(InvalidOption::new(
                        "lease_ttl",
                        format!(
                            "adaptive floor {floor:?} and ceiling {ceiling:?} must satisfy \
                             {MIN_LEASE_TTL:?} <= floor <= ceiling <= {MAX_LEASE_TTL:?}"
                        ),
                    ));
                }
                Ok(())
            }
            LeaseTtl::Fixed(_) => Ok(()),
        }
    }

    /// The TTL for the next acquisition, given recent load times and
    /// whether the backend watches the lease's holder (its token names
    /// it): an adaptive lease is then at least [`WATCHED_LEASE`] (within
    /// its ceiling).
    pub(crate) fn ttl(&self, load_times: &LoadTimes, watched: bool) -> Duration {
        match *self {
            LeaseTtl::Fixed(d) => d,
            LeaseTtl::Adaptive {
                factor,
                floor,
                ceiling,
            } => {
                let base = load_times.p99().unwrap_or(floor);
                let ttl = base.mul_f64(factor).clamp(floor, ceiling);
                if watched {
                    ttl.max(WATCHED_LEASE.min(ceiling))
                } else {
                    ttl
                }
            }
        }
    }
}

/// One request for a lease (see [`Lease::acquire`]).
pub(crate) struct Ask<'a> {
    /// Fresh for this request.
    pub(crate) token: LeaseToken,
    pub(crate) lease_ttl: Duration,
    pub(crate) refresh_window: Duration,
    /// The token of a holder judged gone, whose lease counts as free.
    pub(crate) gone: Option<&'a LeaseToken>,
}

/// What an acquisition found.
pub(crate) enum Acquisition {
    /// The value is fresh beyond the refresh window: no lease was taken.
    Fresh(Stored),
    /// This process holds the lease now.
    Won {
        lease: Lease,
        /// A stale (or unreadable) value present at the time, if any.
        stale: Option<Stored>,
    },
    /// Another process holds the lease.
    Held {
        /// A stale (or unreadable) value present at the time, if any.
        stale: Option<Stored>,
        /// The holder's lease's remaining TTL.
        lease_ttl: Duration,
        /// The holder's token, if the backend read it back.
        holder: Option<LeaseToken>,
    },
}

impl Acquisition {
    /// What the backend's answer to a lease request made with `token`
    /// means: the one place an answer becomes an acquisition, for a single
    /// flight's request and a batch's alike. A lease won is counted and its
    /// watchdog started. An error may hide a lease taken with the reply
    /// lost (a timeout, a dropped connection): nobody would ever release
    /// it, so the fleet would wait out its whole TTL; the token is released
    /// in the background (compare-and-delete: harmless if it was not taken).
    pub(crate) fn of_answer(
        calls: &Calls,
        keys: &FillKeys,
        token: LeaseToken,
        lease_ttl: Duration,
        answer: Result<Acquired, BackendError>,
    ) -> Result<Acquisition, BackendError> {
        match answer {
            Ok(Acquired::Fresh(stored)) => Ok(Acquisition::Fresh(stored)),
            Ok(Acquired::Held {
                stale,
                lease_ttl,
                holder,
            }) => Ok(Acquisition::Held {
                stale,
                lease_ttl,
                holder,
            }),
            Ok(Acquired::Won { stale }) => Ok(Acquisition::Won {
                lease: Lease::won(calls, keys, token, lease_ttl),
                stale,
            }),
            Err(error) => {
                Lease::release_unanswered(calls, keys, token, &error);
                Err(error)
            }
        }
    }
}

/// A lease this process holds: its token, the watchdog that extends it
/// while the loader runs, and the duty to end it.
///
/// Ended by [`fill`](Lease::fill) or [`release`](Lease::release), which
/// consume it. Dropped without either (its flight's task was dropped
/// between acquire and fill), it releases the lease by compare-and-delete,
/// best effort, in a task of its own: the model is moka's `WaiterGuard`,
/// armed by an `Option` that the success path takes. Without a running
/// runtime (it is shutting down) nothing can be sent: the lease then
/// expires by itself within its TTL.
pub(crate) struct Lease {
    /// `Some` until the lease was filled or released.
    held: Option<Held>,
    /// Stops (by being dropped) when the loader is done.
    watchdog: Option<Watchdog>,
    /// Set by whoever first learns the lease was lost (the watchdog or the
    /// fill), so a lost lease is counted once.
    lost: Arc<AtomicBool>,
    /// Records how long the lease was held when the lease is dropped (after
    /// its fill or release, or when its drop guard releases it).
    _held_for: HoldTimer,
}

/// Records the time from the acquire to its drop in the lease hold
/// histogram.
struct HoldTimer {
    won: tokio::time::Instant,
    recorder: Recorder,
}

impl Drop for HoldTimer {
    fn drop(&mut self) {
        self.recorder.lease_held(self.won.elapsed());
    }
}

struct Held {
    backend: Arc<dyn Backend>,
    keys: FillKeys,
    token: LeaseToken,
    /// Bounds a release in the background (the backend timeout), so a hung
    /// backend does not pile up release tasks.
    timeout: Duration,
}

impl Lease {
    /// Asks for the lease of `keys` as `ask` says: with its token, fresh
    /// for this request (`SET lock token NX PX lease_ttl` unless the value
    /// is fresh beyond the refresh window), a lease still held by its
    /// `gone` token (a holder judged dead or frozen) counting as free. If
    /// won, the watchdog starts extending it at once.
    pub(crate) async fn acquire(
        calls: &Calls,
        keys: &FillKeys,
        ask: Ask<'_>,
        timeout: Duration,
    ) -> Result<Acquisition, BackendError> {
        let Ask {
            token,
            lease_ttl,
            refresh_window,
            gone,
        } = ask;
        let backend = &calls.backend;
        let (op, answer) = match gone {
            None => (
                "acquire",
                backend.acquire(keys, &token, lease_ttl, refresh_window),
            ),
            Some(gone) => (
                "take over",
                backend.take_over(keys, gone, &token, lease_ttl, refresh_window),
            ),
        };
        let acquired = calls.call(keys, timeout, op, answer).await;
        Acquisition::of_answer(calls, keys, token, lease_ttl, acquired)
    }

    /// The lease just won with `token`: counted, and its watchdog started.
    fn won(calls: &Calls, keys: &FillKeys, token: LeaseToken, lease_ttl: Duration) -> Lease {
        calls.recorder.lease_acquired();
        let lost = Arc::new(AtomicBool::new(false));
        // Renewals get the full backend timeout each, whatever the
        // caller's flight had left for this acquire.
        let watchdog = Watchdog::start(
            calls.backend.clone(),
            keys.clone(),
            token.clone(),
            lease_ttl,
            calls.timeout,
            calls.recorder.clone(),
            lost.clone(),
        );
        Lease {
            held: Some(Held {
                backend: calls.backend.clone(),
                keys: keys.clone(),
                token,
                timeout: calls.timeout,
            }),
            watchdog: Some(watchdog),
            lost,
            _held_for: HoldTimer {
                won: tokio::time::Instant::now(),
                recorder: calls.recorder.clone(),
            },
        }
    }

    /// After an acquire whose answer was lost (a timeout, a dropped
    /// connection): it may have taken the lease with `token`, so the token
    /// is released in the background (compare-and-delete: harmless if not).
    fn release_unanswered(calls: &Calls, keys: &FillKeys, token: LeaseToken, error: &BackendError) {
        if matches!(
            error.kind(),
            BackendErrorKind::Timeout | BackendErrorKind::Connection
        ) {
            release_in_background(Held {
                backend: calls.backend.clone(),
                keys: keys.clone(),
                token,
                timeout: calls.timeout,
            });
        }
    }

    /// The loader is done: stop extending the lease.
    pub(crate) fn loader_done(&mut self) {
        self.watchdog = None;
    }

    /// Stores `bytes` if the lease still holds our token (the fenced fill)
    /// and ends the lease. `Ok(false)`: the lease was lost (expired or
    /// invalidated) and nothing was written; counted as a lost lease.
    pub(crate) async fn fill(
        self,
        calls: &Calls,
        timeout: Duration,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.end(calls, timeout, Ending::Fill { bytes, ttl }).await
    }

    /// Releases the lease by compare-and-delete, optionally leaving a short
    /// entry behind (a cached failure, or a fail-safe value). `Ok(false)`:
    /// the lease was lost; counted as a lost lease, as by the fill.
    pub(crate) async fn release(
        self,
        calls: &Calls,
        timeout: Duration,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        self.end(calls, timeout, Ending::Release { entry }).await
    }

    /// Runs the token-checked step that ends the lease, then disarms the
    /// drop guard: done, or unknown whether it landed (an unended lease
    /// expires by itself). Dropped before the step answers, the guard still
    /// releases.
    async fn end(
        mut self,
        calls: &Calls,
        timeout: Duration,
        ending: Ending<'_>,
    ) -> Result<bool, BackendError> {
        self.loader_done();
        let Some(held) = self.held.as_ref() else {
            return Ok(false);
        };
        let filling = matches!(ending, Ending::Fill { .. });
        let (op, step) = match ending {
            Ending::Fill { bytes, ttl } => (
                "fill",
                held.backend.fill(&held.keys, &held.token, bytes, ttl),
            ),
            Ending::Release { entry } => (
                "release",
                held.backend.release(&held.keys, &held.token, entry),
            ),
        };
        let ended = match calls.call(&held.keys, timeout, op, step).await {
            // It wrote (counted by the call): its value is answered and its
            // lease is over; only its replication is in doubt.
            Err(e) if e.is_not_replicated() => Ok(true),
            ended => ended,
        };
        if filling && matches!(ended, Ok(false)) {
            calls.recorder.fill_fenced();
        }
        // Not ours any more, whether we fill or release (the load failed):
        // expired or revoked under the load, so another process may have
        // loaded too. Counted once per lease, with the watchdog.
        if matches!(ended, Ok(false)) && !self.lost.swap(true, Ordering::SeqCst) {
            calls.recorder.lease_lost(held.keys.value());
        }
        // Ended: disarm the guard. On an error the result is unknown: the
        // step may not have run (a timeout before it reached the server, an
        // open circuit) and the lease would be held its whole TTL, so the
        // guard stays armed and dropping `self` releases it in the
        // background; the compare-and-delete is harmless if the step landed.
        if ended.is_ok() {
            self.held = None;
        }
        ended
    }
}

/// How a lease ends.
enum Ending<'a> {
    /// Write the loaded value (fenced on the token).
    Fill { bytes: &'a [u8], ttl: Duration },
    /// Delete the lease, optionally leaving a short entry.
    Release { entry: Option<(&'a [u8], Duration)> },
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            release_in_background(held);
        }
    }
}

/// Releases a lease by compare-and-delete in a task of its own, best
/// effort (nothing to do without a runtime: the lease expires by itself).
fn release_in_background(held: Held) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            let release = held.backend.release(&held.keys, &held.token, None);
            let _ = tokio::time::timeout(held.timeout, release).await;
        });
    }
}

/// Extends a held lease every third of its TTL until dropped.
///
/// Dropping the watchdog stops it: it lives exactly as long as the load it
/// guards (completion, error, panic, cancellation or the maximum load time).
struct Watchdog {
    task: tokio::task::JoinHandle<()>,
}

impl Watchdog {
    fn start(
        backend: Arc<dyn Backend>,
        keys: FillKeys,
        token: LeaseToken,
        ttl: Duration,
        timeout: Duration,
        recorder: Recorder,
        lost: Arc<AtomicBool>,
    ) -> Self {
        let task = tokio::spawn(async move {
            let period = ttl / 3;
            let mut next = tokio::time::Instant::now() + period;
            loop {
                tokio::time::sleep_until(next).await;
                next += period;
                let extended =
                    tokio::time::timeout(timeout, backend.extend(&keys, &token, ttl)).await;
                match extended {
                    Ok(Ok(true)) => recorder.lease_extended(),
                    Ok(Ok(false)) => {
                        // Expired or invalidated: another process may be
                        // loading now. The fill will be fenced out.
                        if !lost.swap(true, Ordering::SeqCst) {
                            recorder.lease_lost(keys.value());
                        }
                        return;
                    }
                    // A failed renewal is retried at the next period; the
                    // lease is still valid for two more periods.
                    Ok(Err(e)) => recorder.lease_renewal_failed("extend", &e),
                    Err(_) => recorder.lease_renewal_failed(
                        "extend",
                        &BackendError::new(BackendErrorKind::Timeout, "extend timed out"),
                    ),
                }
            }
        });
        Watchdog { task }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_ttl_follows_p99_within_bounds() {
        let policy = LeaseTtl::Adaptive {
            factor: 3.0,
            floor: Duration::from_secs(1),
            ceiling: Duration::from_secs(30),
        };
        let times = LoadTimes::default();
        assert_eq!(policy.ttl(&times, false), Duration::from_secs(3));
        // A watched holder's lease is at least 10 s.
        assert_eq!(policy.ttl(&times, true), WATCHED_LEASE);
        for _ in 0..99 {
            times.record(Duration::from_millis(100));
        }
        times.record(Duration::from_secs(2));
        // p99 of 100 samples is the 99th smallest: 100 ms -> 300 ms -> floor.
        assert_eq!(policy.ttl(&times, false), Duration::from_secs(1));
        for _ in 0..10 {
            times.record(Duration::from_secs(4));
        }
        assert_eq!(policy.ttl(&times, false), Duration::from_secs(12));
        assert_eq!(policy.ttl(&times, true), Duration::from_secs(12));
        for _ in 0..50 {
            times.record(Duration::from_secs(60));
        }
        assert_eq!(policy.ttl(&times, false), Duration::from_secs(30));
    }

    #[test]
    fn a_watched_lease_stays_within_the_ceiling_and_a_fixed_one_is_kept() {
        let low_ceiling = LeaseTtl::Adaptive {
            factor: 3.0,
            floor: Duration::from_secs(1),
            ceiling: Duration::from_secs(4),
        };
        let times = LoadTimes::default();
        assert_eq!(low_ceiling.ttl(&times, true), Duration::from_secs(4));
        let fixed = LeaseTtl::Fixed(Duration::from_secs(2));
        assert_eq!(fixed.ttl(&times, true), Duration::from_secs(2));
    }

    #[test]
    fn absurd_lease_ttls_are_rejected() {
        assert!(LeaseTtl::Fixed(Duration::ZERO).validate().is_err());
        assert!(LeaseTtl::Fixed(Duration::from_secs(86_400))
            .validate()
            .is_err());
        assert!(LeaseTtl::Adaptive {
            factor: f64::NAN,
            floor: Duration::from_secs(1),
            ceiling: Duration::from_secs(2)
        }
        .validate()
        .is_err());
        assert!(LeaseTtl::Adaptive {
            factor: 2.0,
            floor: Duration::from_secs(3),
            ceiling: Duration::from_secs(2)
        }
        .validate()
        .is_err());
        assert!(LeaseTtl::default().validate().is_ok());
    }
}
