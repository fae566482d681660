//! Counters for everything the cache decides, exported twice: as a
//! [`Stats`] snapshot on the cache, and through the `metrics` facade (the
//! names in [`crate::metrics`], labelled by namespace) for whatever
//! exporter the application installed. (Over 600 lines: each counter is a
//! `Stats` field with its rustdoc, an atomic, a metric handle and its
//! recording method, kept side by side so none is added without the
//! others.)
//!
//! Counting sits on the hit path, so nothing is looked up or allocated per
//! event: the `metrics` handles of a cache (one per series, each labelled
//! with its namespace) are registered once, when the cache is built, and
//! kept next to the snapshot's atomics. A handle is bound to the recorder
//! that was installed when it was registered: the `metrics` recorder
//! (exporter) must be installed *before* the cache is built; a cache built
//! earlier reports to the recorder of that moment (the no-op one if none
//! was) for the rest of its life. Every series exists, at 0, from the
//! moment the cache is built.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{BackendError, BackendErrorKind};

mod contention;
mod stripe;

use contention::Contention;
use stripe::{stripe, STRIPES};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident => $metric:literal $( { $lk:literal => $lv:literal } )? ),* $(,)?) => {
        /// A snapshot of a cache's counters since it was built.
        ///
        /// Counters only grow; subtract two snapshots to get a rate. Hits,
        /// misses, stale answers and negative hits count *flights* (backend
        /// conversations): callers that shared a flight are counted once in
        /// `coalesced` each, and share the flight's outcome. Answers from
        /// the L1 are not flights: a fresh one counts in `l1_hits`, a stale
        /// one (grace) in `stale_served`. The same counts go to the
        /// `metrics` facade under the names listed in [`crate::metrics`].
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
            fn add_to(&self, stats: &mut Stats) {
                $( stats.$name += self.$name.load(Relaxed); )*
            }
        }

        /// A cache's `metrics` handles, registered once (see the module docs).
        #[derive(Debug)]
        struct Handles {
            $( $name: metrics::Counter, )*
            load_duration: metrics::Histogram,
            lease_wait_duration: metrics::Histogram,
            lease_hold_duration: metrics::Histogram,
            flight_callers: metrics::Histogram,
            lease_waiters: metrics::Gauge,
            writes_pending: metrics::Gauge,
        }

        impl Handles {
            fn register(namespace: &str) -> Self {
                crate::metrics::describe();
                Handles {
                    $( $name: metrics::counter!(
                        $metric,
                        "namespace" => namespace.to_owned()
                        $( , $lk => $lv )?
                    ), )*
                    load_duration: metrics::histogram!(
                        "onefill_load_duration_seconds",
                        "namespace" => namespace.to_owned()
                    ),
                    lease_wait_duration: metrics::histogram!(
                        "onefill_lease_wait_duration_seconds",
                        "namespace" => namespace.to_owned()
                    ),
                    lease_hold_duration: metrics::histogram!(
                        "onefill_lease_hold_duration_seconds",
                        "namespace" => namespace.to_owned()
                    ),
                    flight_callers: metrics::histogram!(
                        "onefill_flight_callers",
                        "namespace" => namespace.to_owned()
                    ),
                    lease_waiters: metrics::gauge!(
                        "onefill_lease_waiters",
                        "namespace" => namespace.to_owned()
                    ),
                    writes_pending: metrics::gauge!(
                        "onefill_writes_pending",
                        "namespace" => namespace.to_owned()
                    ),
                }
            }
        }

        #[cfg(test)]
        impl Stats {
            /// Every counter with its `metrics` name and extra label.
            fn named(&self) -> Vec<(&'static str, Option<(&'static str, &'static str)>, u64)> {
                vec![ $( ($metric, None $( .or(Some(($lk, $lv))) )?, self.$name), )* ]
            }
        }
    };
}

counters! {
    /// Calls answered by a fresh value from the backend (flights).
    hits => "onefill_hits_total" { "layer" => "backend" },
    /// Calls answered by the in-process [`L1`](crate::L1) without a
    /// flight (not counted in `hits`).
    l1_hits => "onefill_hits_total" { "layer" => "l1" },
    /// L1 entries dropped because the backend reported a change of their key.
    l1_invalidations => "onefill_l1_invalidations_total",
    /// Times the L1 was emptied because the backend lost track of changes
    /// (its tracking connection was re-established).
    l1_resets => "onefill_l1_resets_total",
    /// Calls that found no usable value (cold, expired or unreadable). With
    /// a soft timeout, a stale read counts here only if it was not
    /// answered stale (a load answered it), else in `stale_served` only.
    misses => "onefill_misses_total",
    /// Calls answered by a stale value (grace window, fail-safe, or outage).
    stale_served => "onefill_stale_served_total",
    /// Loader runs that returned a value.
    loads_ok => "onefill_loads_total" { "outcome" => "ok" },
    /// Loader runs that failed: an error, a panic or the maximum load time.
    loads_error => "onefill_loads_total" { "outcome" => "error" },
    /// Loaded values their loader said must not be stored
    /// ([`Loaded::no_store`](crate::Loaded::no_store)): answered, never
    /// written. A batch's loader counts one per such value.
    loads_not_stored => "onefill_loads_not_stored_total",
    /// Loads run without a lease because the wait deadline passed or the
    /// backend failed (at most one per process per key at a time).
    degraded_loads => "onefill_degraded_loads_total",
    /// Loads started under a lease just won while this process was still
    /// running another load of the same key (one whose lease was lost, or
    /// a degraded one): two loads of one key at once.
    duplicate_loads => "onefill_duplicate_loads_total",
    /// Leases this process acquired.
    lease_acquired => "onefill_leases_acquired_total",
    /// Acquire attempts that found another holder's lease.
    lease_contended => "onefill_lease_contentions_total",
    /// Leases won by a waiter of this process from a holder that died or
    /// stalled: taken over once the holder was judged gone (see
    /// `holders_dead`, `holders_frozen`), or once its lease had run out (as
    /// the last re-check saw it) with no notification that it ended. A
    /// stalled holder's load then runs twice.
    lease_takeovers => "onefill_lease_takeovers_total",
    /// Holders a waiter of this process judged dead (their connections to
    /// the store closed) and took the lease over from, before it expired.
    holders_dead => "onefill_holders_gone_total" { "verdict" => "dead" },
    /// Holders a waiter of this process judged frozen (alive, but silent
    /// for about a second) and took the lease over from. A holder judged
    /// frozen wrongly loads once more than needed; its fill is fenced.
    holders_frozen => "onefill_holders_gone_total" { "verdict" => "frozen" },
    /// Leases lost before the fill or release (expired or invalidated
    /// mid-load): each is a possible duplicate load. Should stay near zero.
    lease_lost => "onefill_leases_lost_total",
    /// Fills refused because the lease no longer held this process's token
    /// (expired or invalidated mid-load): nothing was written.
    fills_fenced => "onefill_fills_fenced_total",
    /// Successful watchdog renewals.
    lease_extended => "onefill_lease_renewals_total" { "outcome" => "ok" },
    /// Watchdog renewals that failed or timed out (retried at the next
    /// period; a renewal that finds the lease gone counts in `lease_lost`).
    lease_renewal_failures => "onefill_lease_renewals_total" { "outcome" => "error" },
    /// Flights that waited for another process's load.
    waits => "onefill_waits_total",
    /// Waits that reached their deadline.
    wait_timeouts => "onefill_wait_timeouts_total",
    /// Re-checks made by waiters that no notification woke: at the holder's
    /// lease expiry, at the safety poll, or at a poll tick of a waiter
    /// without a (confirmed) subscription.
    wait_polls => "onefill_wait_rechecks_total" { "trigger" => "poll" },
    /// Re-checks made by waiters because a fill notification arrived.
    wait_notified => "onefill_wait_rechecks_total" { "trigger" => "notified" },
    /// Calls that joined a flight already under way in this process instead
    /// of talking to the backend themselves.
    coalesced => "onefill_coalesced_total",
    /// Stored values that could not be decoded (treated as misses).
    decode_errors => "onefill_decode_errors_total",
    /// Backend calls that failed or timed out.
    backend_errors => "onefill_backend_errors_total",
    /// Refreshes started before expiry (early refresh).
    early_refreshes => "onefill_refreshes_total" { "reason" => "early" },
    /// Background refreshes started while a stale value was served.
    background_refreshes => "onefill_refreshes_total" { "reason" => "stale" },
    /// Calls answered by a cached failure (negative caching).
    negative_hits => "onefill_negative_hits_total",
    /// Calls where the circuit breaker skipped the backend.
    circuit_rejected => "onefill_circuit_rejections_total",
    /// Times the circuit breaker opened.
    circuit_opened => "onefill_circuit_opens_total",
    /// Windows of 10 s in which at least half of this cache's flights (and
    /// at least 20) had to wait for another process's lease: the lock is
    /// doing the work a refresh strategy (grace, early refresh) should do.
    contention_warnings => "onefill_contention_warnings_total",
    /// Writes (`set`, `invalidate`) that failed for want of the backend
    /// (unreachable, circuit open, timed out, or their caller's future
    /// dropped mid-way) and were queued to be replayed as invalidations
    /// once it answers again (a write of a key already queued takes that
    /// one's place, and counts again).
    writes_queued => "onefill_writes_queued_total",
    /// Queued writes replayed: the backend ran them.
    writes_replayed => "onefill_writes_replayed_total",
    /// Queued writes dropped unreplayed because the queue was full
    /// (`replay_queue_capacity`): the oldest goes. Other processes may
    /// answer what such a write replaced until it expires.
    writes_dropped => "onefill_writes_dropped_total" { "reason" => "full" },
    /// Replays the backend refused (a command error, not an outage):
    /// dropped, not retried.
    writes_refused => "onefill_writes_dropped_total" { "reason" => "refused" },
    /// Writes of a value or a mark (fills, releases that leave an entry,
    /// `set`, `invalidate`, `expire`, marks, replays) that ran but that
    /// fewer replicas confirmed in time than the backend was asked to wait
    /// for (Redis:
    /// `onefill::redis::RedisOptions::durability`):
    /// a failover may lose them. Not counted in `backend_errors`.
    writes_unreplicated => "onefill_writes_unreplicated_total",
}

/// A flight counted in the `onefill_lease_waiters` gauge while alive.
#[derive(Debug)]
pub(crate) struct Waiting(metrics::Gauge);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// The snapshot's counters, one set per stripe of threads: two worker
/// threads counting every hit would otherwise take one cache line from each
/// other on every count (the L1 hit path counts too). A snapshot sums them.
#[derive(Debug)]
struct Striped {
    stripes: [Stripe; STRIPES],
}

/// One stripe, on cache lines of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(Counters);

impl Default for Striped {
    fn default() -> Self {
        Striped {
            stripes: std::array::from_fn(|_| Stripe::default()),
        }
    }
}

impl Striped {
    /// The calling thread's counters.
    fn here(&self) -> &Counters {
        &self.stripes[stripe()].0
    }

    fn snapshot(&self) -> Stats {
        let mut stats = Stats::default();
        for stripe in &self.stripes {
            stripe.0.add_to(&mut stats);
        }
        stats
    }
}

/// Shared handle that records into both the snapshot and `metrics`.
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    counters: Arc<Striped>,
    metrics: Arc<Handles>,
    namespace: Arc<str>,
    contention: Arc<Contention>,
    /// When the last line about unreplicated writes was logged.
    unreplicated: Arc<parking_lot::Mutex<UnreplicatedLog>>,
}

/// At most one line about unreplicated writes per this window.
const UNREPLICATED_LOG_EVERY: Duration = Duration::from_secs(10);

/// The log of unreplicated writes: when it last spoke, and how many since.
#[derive(Debug, Default)]
struct UnreplicatedLog {
    last: Option<tokio::time::Instant>,
    since: u64,
}

macro_rules! bump {
    ($self:ident, $field:ident) => {{
        $self.counters.here().$field.fetch_add(1, Relaxed);
        $self.metrics.$field.increment(1);
    }};
}

impl Recorder {
    /// Registers the cache's `metrics` handles with the recorder installed
    /// now (see the module docs).
    pub(crate) fn new(namespace: &str) -> Self {
        Recorder {
            counters: Arc::default(),
            metrics: Arc::new(Handles::register(namespace)),
            namespace: namespace.into(),
            contention: Arc::new(Contention::new()),
            unreplicated: Arc::default(),
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
        self.metrics.load_duration.record(took.as_secs_f64());
    }
    pub(crate) fn loads_not_stored(&self, values: u64) {
        if values > 0 {
            self.counters
                .here()
                .loads_not_stored
                .fetch_add(values, Relaxed);
            self.metrics.loads_not_stored.increment(values);
        }
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
    /// A watchdog renewal failed or timed out (the lease may still hold).
    pub(crate) fn lease_renewal_failed(&self, op: &'static str, error: &BackendError) {
        bump!(self, lease_renewal_failures);
        self.backend_error(op, error);
    }
    /// A waiter won the lease after its holder's had run out unannounced.
    pub(crate) fn lease_takeover(&self) {
        bump!(self, lease_takeovers)
    }
    /// A waiter judged its holder dead (the takeover that follows is
    /// counted by [`lease_takeover`](Self::lease_takeover) if it wins).
    pub(crate) fn holder_dead(&self) {
        bump!(self, holders_dead)
    }
    /// A waiter judged its holder frozen (as for a dead one).
    pub(crate) fn holder_frozen(&self) {
        bump!(self, holders_frozen)
    }
    /// A fill found the lease no longer ours: nothing was written.
    pub(crate) fn fill_fenced(&self) {
        bump!(self, fills_fenced)
    }
    /// A leased load started while another load of the key still ran here.
    pub(crate) fn duplicate_load(&self, key: &str) {
        bump!(self, duplicate_loads);
        tracing::warn!(
            key,
            "a load started while another load of the same key was still running in this process"
        );
    }
    /// A lease this process won ended (filled, released or dropped) after
    /// being held for `held`.
    pub(crate) fn lease_held(&self, held: Duration) {
        self.metrics.lease_hold_duration.record(held.as_secs_f64());
    }
    /// A flight answered `callers` callers (itself and those that joined).
    pub(crate) fn flight_callers(&self, callers: u64) {
        self.metrics.flight_callers.record(callers as f64);
    }
    /// One more flight waits for another process's lease, until the guard
    /// is dropped.
    pub(crate) fn waiting(&self) -> Waiting {
        self.metrics.lease_waiters.increment(1.0);
        Waiting(self.metrics.lease_waiters.clone())
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
        self.metrics
            .lease_wait_duration
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
        if error.kind() == BackendErrorKind::NotPermitted {
            tracing::error!(
                op,
                %error,
                "the backend's access control refused a call: grant the ACL user what the \
                 Redis guide lists"
            );
        } else {
            tracing::warn!(op, %error, "backend call failed");
        }
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
    /// A failed write was queued for replay.
    pub(crate) fn write_queued(&self) {
        bump!(self, writes_queued)
    }
    /// A queued write was replayed.
    pub(crate) fn write_replayed(&self) {
        bump!(self, writes_replayed)
    }
    /// A queued write was dropped, the queue being full (logged in
    /// summary by the queue).
    pub(crate) fn write_dropped(&self) {
        bump!(self, writes_dropped)
    }
    /// A replay was refused by the backend and dropped.
    pub(crate) fn write_refused(&self) {
        bump!(self, writes_refused)
    }
    /// A write ran but too few replicas confirmed it: counted, and logged
    /// at most once per [`UNREPLICATED_LOG_EVERY`] with the number since
    /// the last line (a replica down would make every write one).
    pub(crate) fn write_unreplicated(&self, op: &'static str, error: &BackendError) {
        bump!(self, writes_unreplicated);
        let mut log = self.unreplicated.lock();
        log.since += 1;
        let now = tokio::time::Instant::now();
        if log
            .last
            .is_some_and(|last| now < last + UNREPLICATED_LOG_EVERY)
        {
            return;
        }
        let writes = std::mem::take(&mut log.since);
        log.last = Some(now);
        drop(log);
        tracing::warn!(
            op,
            %error,
            writes,
            "writes not confirmed by enough replicas: a failover may lose them \
             (`writes` since the last such line; at most one per 10 s)"
        );
    }
    /// A cache's queue of writes to replay went from `before` to `after`
    /// (a gauge summed over the caches of a namespace, as the waiters').
    pub(crate) fn writes_pending(&self, before: usize, after: usize) {
        let delta = after as f64 - before as f64;
        if delta != 0.0 {
            self.metrics.writes_pending.increment(delta);
        }
    }
    pub(crate) fn circuit_opened(&self) {
        bump!(self, circuit_opened);
        tracing::warn!("circuit breaker opened: backend calls are skipped for a while");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use crate::backend::memory::MemoryBackend;
    use crate::cache::Cache;

    fn build(namespace: &str, backend: &MemoryBackend) -> Cache<String, String> {
        Cache::builder()
            .namespace(namespace)
            .backend(backend.clone())
            .build()
            .unwrap()
    }

    async fn load(value: &'static str, took: u64) -> Result<String, std::io::Error> {
        tokio::time::sleep(Duration::from_millis(took)).await;
        Ok(value.to_owned())
    }

    /// Every counter and both histograms reach the `metrics` recorder under
    /// their names, labelled with the namespace, and agree with `stats()`.
    /// The handles are registered while the cache is built (here with a
    /// thread-local recorder); everything is counted afterwards, outside
    /// that scope and partly on spawned tasks, and still reaches it.
    #[tokio::test(start_paused = true)]
    async fn metrics_are_emitted_under_their_names_and_namespace() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let backend = MemoryBackend::new();
        // Two processes of namespace "m" (one series each: they add up).
        let (a, b) = metrics::with_local_recorder(&recorder, || {
            (build("m", &backend), build("m", &backend))
        });
        // Built with no recorder installed: its handles are no-ops for good.
        let late = build("late", &backend);

        let k = "k".to_owned();
        let (x, y, z) = tokio::join!(
            a.get_or_load(&k, |_| load("v", 100)),
            a.get_or_load(&k, |_| load("v", 100)),
            a.get_or_load(&k, |_| load("v", 100)),
        );
        assert_eq!([x.unwrap(), y.unwrap(), z.unwrap()], ["v", "v", "v"]);
        assert_eq!(a.get_or_load(&k, |_| load("v2", 100)).await.unwrap(), "v");
        let failed = a
            .get_or_load(&"bad".to_owned(), |_| async {
                Err::<String, _>(std::io::Error::other("boom"))
            })
            .await;
        assert!(failed.is_err());
        let holder = tokio::spawn({
            let a = a.clone();
            async move { a.get_or_load(&"w".to_owned(), |_| load("w", 500)).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let waited = b
            .get_or_load(&"w".to_owned(), |_| load("not this", 1))
            .await;
        assert_eq!(waited.unwrap(), "w");
        assert_eq!(holder.await.unwrap().unwrap(), "w");
        late.get_or_load(&k, |_| load("v", 1)).await.unwrap();
        assert_eq!(late.stats().loads_ok, 1, "counted in its own stats");

        let (sa, sb) = (a.stats(), b.stats());
        // The snapshots themselves: the scenario above, counted once each.
        assert_eq!((sa.misses, sa.hits, sa.coalesced), (2 + 1, 1, 2));
        assert_eq!((sa.loads_ok, sa.loads_error, sa.lease_acquired), (2, 1, 3));
        assert_eq!((sb.misses, sb.waits), (1, 1), "{sb:?}");
        assert!(sb.lease_contended >= 1, "{sb:?}");
        assert_eq!(sb.wait_notified, 1, "woken by the fill: {sb:?}");
        assert_eq!((sb.loads_ok, sb.wait_timeouts), (0, 0));

        let mut counters = HashMap::new();
        let mut histograms = HashMap::new();
        let mut gauges = HashMap::new();
        for (key, unit, description, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let name = key.name().to_owned();
            let described = crate::metrics::ALL.iter().find(|m| m.name == name);
            let described = described.unwrap_or_else(|| panic!("{name} is in the table"));
            assert_eq!(unit, Some(described.unit), "{name}");
            assert!(description.is_some(), "{name} is described");
            let mut labels = key.labels().map(|l| (l.key(), l.value()));
            assert_eq!(labels.next(), Some(("namespace", "m")), "{name}");
            let extra = labels.next().map(|(k, v)| (k.to_owned(), v.to_owned()));
            assert_eq!(labels.next(), None, "{name}");
            let series = (name.clone(), extra);
            match value {
                DebugValue::Counter(n) => assert!(counters.insert(series, n).is_none()),
                DebugValue::Histogram(xs) => assert!(histograms.insert(name, xs).is_none()),
                DebugValue::Gauge(x) => assert!(gauges.insert(name, x).is_none()),
            }
        }
        let expected: Vec<_> = (sa.named().into_iter().zip(sb.named()))
            .map(|((name, label, x), (_, _, y))| {
                let label = label.map(|(k, v)| (k.to_owned(), v.to_owned()));
                ((name.to_owned(), label), x + y)
            })
            .collect();
        assert_eq!(
            counters.len(),
            expected.len(),
            "every counter is registered (at 0 if nothing happened): {counters:?}"
        );
        for (series, n) in expected {
            assert_eq!(counters.get(&series), Some(&n), "{series:?}");
        }
        let loads = &histograms["onefill_load_duration_seconds"];
        assert_eq!(loads.len() as u64, sa.loads_ok + sa.loads_error);
        assert!(loads.iter().any(|s| s.0 >= 0.5), "{loads:?}");
        let waits = &histograms["onefill_lease_wait_duration_seconds"];
        assert_eq!(waits.len() as u64, sb.waits);
        let held = &histograms["onefill_lease_hold_duration_seconds"];
        assert_eq!(held.len() as u64, sa.lease_acquired, "{held:?}");
        assert!(
            held.iter().any(|s| s.0 >= 0.5),
            "held for the 500 ms load: {held:?}"
        );
        // a: the flight of three callers, the hit, "bad", "w"; b: "w".
        let mut callers: Vec<f64> = histograms["onefill_flight_callers"]
            .iter()
            .map(|s| s.0)
            .collect();
        callers.sort_by(f64::total_cmp);
        assert_eq!(callers, [1.0, 1.0, 1.0, 1.0, 3.0]);
        assert_eq!(histograms.len(), 4);
        assert_eq!(gauges.len(), 2);
        assert_eq!(gauges["onefill_lease_waiters"].0, 0.0, "no wait left");
        assert_eq!(gauges["onefill_writes_pending"].0, 0.0, "no write failed");
    }
}
