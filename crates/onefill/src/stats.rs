//! Counters for everything the cache decides, exported twice: as a
//! [`Stats`] snapshot on the cache, and through the `metrics` facade
//! (`onefill_*` counters and histograms labelled by namespace) for whatever
//! exporter the application installed.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use crate::error::BackendError;

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// A snapshot of a cache's counters since it was built.
        ///
        /// Counters only grow; subtract two snapshots to get a rate. Hits,
        /// misses, stale answers and negative hits count *flights* (backend
        /// conversations): callers that shared a flight are counted once in
        /// `coalesced` each, and share the flight's outcome.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[serde(default)]
        #[non_exhaustive]
        pub struct Stats {
            $( $(#[$doc])* pub $name: u64, )*
        }

        #[derive(Debug, Default)]
        struct Counters {
            $( $name: AtomicU64, )*
        }

        impl Counters {
            fn snapshot(&self) -> Stats {
                Stats { $( $name: self.$name.load(Relaxed), )* }
            }
        }
    };
}

counters! {
    /// Calls answered by a fresh value from the backend (flights).
    hits,
    /// Calls answered by the in-process [`L1`](crate::L1) without a
    /// flight (not counted in `hits`).
    l1_hits,
    /// L1 entries dropped because the backend reported a change of their key.
    l1_invalidations,
    /// Times the L1 was emptied because the backend lost track of changes
    /// (its tracking connection was re-established).
    l1_resets,
    /// Calls that found no usable value (cold, expired or unreadable).
    misses,
    /// Calls answered by a stale value (grace window, fail-safe, or outage).
    stale_served,
    /// Loader runs that returned a value.
    loads_ok,
    /// Loader runs that failed: an error, a panic or the maximum load time.
    loads_error,
    /// Loads run without a lease because the wait deadline passed or the
    /// backend failed (at most one per process per key at a time).
    degraded_loads,
    /// Leases this process acquired.
    lease_acquired,
    /// Acquire attempts that found another holder's lease.
    lease_contended,
    /// Leases lost before the fill or release (expired or invalidated
    /// mid-load): each is a possible duplicate load. Should stay near zero.
    lease_lost,
    /// Successful watchdog renewals.
    lease_extended,
    /// Flights that waited for another process's load.
    waits,
    /// Waits that reached their deadline.
    wait_timeouts,
    /// Re-checks made by waiters on a poll tick (not woken by a notification).
    wait_polls,
    /// Re-checks made by waiters because a fill notification arrived.
    wait_notified,
    /// Calls that joined a flight already under way in this process instead
    /// of talking to the backend themselves.
    coalesced,
    /// Stored values that could not be decoded (treated as misses).
    decode_errors,
    /// Backend calls that failed or timed out.
    backend_errors,
    /// Refreshes started before expiry (early refresh).
    early_refreshes,
    /// Background refreshes started while a stale value was served.
    background_refreshes,
    /// Calls answered by a cached failure (negative caching).
    negative_hits,
    /// Calls where the circuit breaker skipped the backend.
    circuit_rejected,
    /// Times the circuit breaker opened.
    circuit_opened,
    /// Windows of 10 s in which at least half of this cache's flights (and
    /// at least 20) had to wait for another process's lease: the lock is
    /// doing the work a refresh strategy (grace, early refresh) should do.
    contention_warnings,
}

/// Shared handle that records into both the snapshot and `metrics`.
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    counters: Arc<Counters>,
    namespace: Arc<str>,
    contention: Arc<Contention>,
}

/// The "contention approaches the request rate" guard rail: flights and
/// waits in the current 10 s window, with lock-free counters (it sits on the
/// hit path).
#[derive(Debug)]
struct Contention {
    epoch: std::time::Instant,
    window: AtomicU64,
    flights: AtomicU64,
    waits: AtomicU64,
    warned_window: AtomicU64,
}

const CONTENTION_WINDOW: Duration = Duration::from_secs(10);
const CONTENTION_MIN_FLIGHTS: u64 = 20;

impl Contention {
    fn new() -> Self {
        Contention {
            epoch: std::time::Instant::now(),
            window: AtomicU64::new(0),
            flights: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            warned_window: AtomicU64::new(u64::MAX),
        }
    }

    /// Moves to the current window, resetting the counts when it changed.
    fn roll(&self) -> u64 {
        let now = (self.epoch.elapsed().as_millis() / CONTENTION_WINDOW.as_millis()) as u64;
        let seen = self.window.load(Relaxed);
        if now != seen
            && self
                .window
                .compare_exchange(seen, now, Relaxed, Relaxed)
                .is_ok()
        {
            self.flights.store(0, Relaxed);
            self.waits.store(0, Relaxed);
        }
        now
    }

    fn flight(&self) {
        self.roll();
        self.flights.fetch_add(1, Relaxed);
    }

    /// Records a wait; true the first time in a window that waits reach
    /// half of the flights.
    fn wait(&self) -> bool {
        let window = self.roll();
        let waits = self.waits.fetch_add(1, Relaxed) + 1;
        let flights = self.flights.load(Relaxed);
        flights >= CONTENTION_MIN_FLIGHTS
            && waits * 2 >= flights
            && self.warned_window.swap(window, Relaxed) != window
    }
}

macro_rules! bump {
    ($self:ident, $field:ident) => {{
        $self.counters.$field.fetch_add(1, Relaxed);
        metrics::counter!(concat!("onefill_", stringify!($field)), "namespace" => $self.namespace.to_string())
            .increment(1);
    }};
}

impl Recorder {
    pub(crate) fn new(namespace: &str) -> Self {
        Recorder {
            counters: Arc::default(),
            namespace: namespace.into(),
            contention: Arc::new(Contention::new()),
        }
    }
    pub(crate) fn snapshot(&self) -> Stats {
        self.counters.snapshot()
    }
    pub(crate) fn hit(&self) {
        bump!(self, hits)
    }
    pub(crate) fn l1_hit(&self) {
        bump!(self, l1_hits)
    }
    pub(crate) fn l1_invalidation(&self) {
        bump!(self, l1_invalidations)
    }
    pub(crate) fn l1_reset(&self) {
        bump!(self, l1_resets)
    }
    pub(crate) fn miss(&self) {
        bump!(self, misses)
    }
    pub(crate) fn stale_served(&self) {
        bump!(self, stale_served)
    }
    pub(crate) fn load_finished(&self, ok: bool, took: Duration) {
        if ok {
            bump!(self, loads_ok)
        } else {
            bump!(self, loads_error)
        }
        metrics::histogram!("onefill_load_seconds", "namespace" => self.namespace.to_string())
            .record(took.as_secs_f64());
    }
    pub(crate) fn degraded_load(&self) {
        bump!(self, degraded_loads)
    }
    pub(crate) fn lease_acquired(&self) {
        bump!(self, lease_acquired)
    }
    pub(crate) fn lease_contended(&self) {
        bump!(self, lease_contended)
    }
    pub(crate) fn lease_lost(&self, key: &str) {
        bump!(self, lease_lost);
        tracing::warn!(
            key,
            "lease lost before the fill: a duplicate load may have happened"
        );
    }
    pub(crate) fn lease_extended(&self) {
        bump!(self, lease_extended)
    }
    /// A flight starts (one backend conversation).
    pub(crate) fn flight(&self) {
        self.contention.flight();
    }
    pub(crate) fn wait_started(&self) {
        bump!(self, waits);
        if self.contention.wait() {
            bump!(self, contention_warnings);
            tracing::warn!(
                namespace = &*self.namespace,
                "at least half of this cache's flights wait for another process's lease: \
                 hot keys are expiring under load; consider a grace window (serve stale \
                 while refreshing) or early refresh"
            );
        }
    }
    pub(crate) fn wait_finished(&self, waited: Duration, timed_out: bool) {
        if timed_out {
            bump!(self, wait_timeouts)
        }
        metrics::histogram!("onefill_wait_seconds", "namespace" => self.namespace.to_string())
            .record(waited.as_secs_f64());
    }
    pub(crate) fn wait_poll(&self, notified: bool) {
        if notified {
            bump!(self, wait_notified)
        } else {
            bump!(self, wait_polls)
        }
    }
    pub(crate) fn coalesced(&self) {
        bump!(self, coalesced)
    }
    pub(crate) fn decode_error(&self, key: &str, why: &str) {
        bump!(self, decode_errors);
        tracing::warn!(
            key,
            why,
            "stored value could not be decoded; treated as a miss"
        );
    }
    pub(crate) fn backend_error(&self, op: &'static str, error: &BackendError) {
        bump!(self, backend_errors);
        tracing::warn!(op, %error, "backend call failed");
    }
    pub(crate) fn early_refresh(&self) {
        bump!(self, early_refreshes)
    }
    pub(crate) fn background_refresh(&self) {
        bump!(self, background_refreshes)
    }
    pub(crate) fn negative_hit(&self) {
        bump!(self, negative_hits)
    }
    pub(crate) fn circuit_rejected(&self) {
        bump!(self, circuit_rejected)
    }
    pub(crate) fn circuit_opened(&self) {
        bump!(self, circuit_opened);
        tracing::warn!("circuit breaker opened: backend calls are skipped for a while");
    }
}
