//! Writes (`set`, `invalidate`) against loads, replies lost or late, and
//! other processes: a write whose caller gave up still detaches older
//! flights and forgets the outage fallback, `no_lease` loads are fenced by
//! writes, a remote invalidate is not undone by an older shared load, and a
//! stress test on real threads. Memory backend behind switches
//! (`crate::support::Switched`), in paused time but for the stress test. A test
//! whose case once broke the library says what used to happen; the others
//! guard what held.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{
    a_load_under_way, assert_the_fallback_forgot, counting_loader, fetch_now, key, keys, pod,
    spawn_fetch, switched, two_pods, Switched, Switches, HEALTHY, NS, REFUSE, WRITE_THEN_HANG,
};
use onefill::testing::OriginError;
use onefill::{Cache, CallOptions, MemoryBackend, Outcome};

/// A pod with "k" loaded ("k-v1"; its loads count into the third item),
/// whose backend then runs `set` and `invalidate` without answering.
async fn loaded_then_writes_hang() -> (Switched, Cache<String, String>, Arc<AtomicUsize>) {
    let wire = switched();
    let c = pod(&wire, |b| b);
    let loads = Arc::new(AtomicUsize::new(0));
    fetch_now(&c, "k", &loads).await;
    wire.set_mode(WRITE_THEN_HANG);
    (wire, c, loads)
}

// ---------------------------------------------------------------------------
// set / invalidate: written(), epochs, tombstones (cache.rs, fallback.rs)
// ---------------------------------------------------------------------------

/// `invalidate` wrapped in the caller's own timeout: the DEL ran on the
/// server, the reply was late, the caller gave up. `written()` and the
/// tombstone used to come after the await, so they never happened: the
/// fallback still held the invalidated value and the next outage served
/// it. A guard armed before the command now detaches the key and
/// tombstones the fallback however the call ends.
#[tokio::test(start_paused = true)]
async fn writes_an_invalidate_whose_caller_gave_up_still_forgets_the_fallback() {
    let (wire, c, loads) = loaded_then_writes_hang().await;
    let gave_up = tokio::time::timeout(Duration::from_millis(50), c.invalidate(&key())).await;
    assert!(gave_up.is_err(), "the caller gave up");
    assert!(
        wire.store().get_raw(keys().value()).is_none(),
        "the invalidate ran on the server"
    );
    assert_the_fallback_forgot(&wire, &c, &loads, "the invalidated value is not served").await;
}

/// `set` wrapped in the caller's own timeout, after the write landed: the
/// key's older flight used not to be detached, so a call made after the
/// caller gave up (the new value already in the store) joined it and got
/// the value from before the set. The set's guard now detaches older
/// flights however the call ends: that call reads the new value.
#[tokio::test(start_paused = true)]
async fn writes_a_set_whose_caller_gave_up_still_detaches_older_flights() {
    let wire = switched();
    let c = pod(&wire, |b| b);
    let loads = Arc::new(AtomicUsize::new(0));
    let older = spawn_fetch(&c, CallOptions::new(), &loads, Duration::from_millis(500));
    tokio::time::sleep(Duration::from_millis(50)).await;
    wire.set_mode(WRITE_THEN_HANG);
    let gave_up =
        tokio::time::timeout(Duration::from_millis(50), c.set(&key(), "manual".into())).await;
    assert!(gave_up.is_err(), "the caller gave up");
    wire.set_mode(HEALTHY);
    assert!(
        wire.store().get_raw(keys().value()).is_some(),
        "the set landed"
    );
    let after = fetch_now(&c, "k", &loads).await;
    assert_eq!(older.await.unwrap().unwrap().value, "k-v1");
    assert_eq!(after.value, "manual", "coalesced: {}", after.coalesced);
}

/// A `set` that timed out (result unknown: here it landed) used to return
/// before touching the fallback, which kept the value the set replaced:
/// the next outage served it although the store held the newer one
/// (`invalidate` forgot "even if the backend failed"; `set` did not). The
/// set's guard now tombstones the fallback however the call ends.
#[tokio::test(start_paused = true)]
async fn writes_a_set_with_an_unknown_result_does_not_leave_the_replaced_value_in_the_fallback() {
    let (wire, c, loads) = loaded_then_writes_hang().await;
    let err = c.set(&key(), "manual".into()).await.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    wire.set_mode(HEALTHY);
    assert_eq!(
        c.get(&key()).await.unwrap().as_deref(),
        Some("manual"),
        "it landed"
    );
    wire.set_mode(REFUSE);
    let f = fetch_now(&c, "k", &loads).await;
    assert_ne!(
        f.value, "k-v1",
        "the value the set replaced is not served ({:?})",
        f.outcome
    );
}

/// A guard: a plain failed invalidate (a timeout, not a
/// cancellation) forgets the fallback.
#[tokio::test(start_paused = true)]
async fn a_timed_out_invalidate_forgets_the_fallback() {
    let (wire, c, loads) = loaded_then_writes_hang().await;
    assert!(c.invalidate(&key()).await.is_err());
    assert_the_fallback_forgot(&wire, &c, &loads, "the invalidated value is not served").await;
}

// ---------------------------------------------------------------------------
// no_lease (flight.rs load_without_waiting)
// ---------------------------------------------------------------------------

/// A guard: no_lease with a remote holder answers Degraded and
/// stores nothing; the holder's fill is what lands.
#[tokio::test(start_paused = true)]
async fn no_lease_never_overwrites_the_holders_fill() {
    let loads = Arc::new(AtomicUsize::new(0));
    let ([_, (_, b)], holder) = a_load_under_way(&loads, Duration::from_millis(500)).await;
    let cheap = b
        .with_options(&CallOptions::new().no_lease())
        .fetch(&key(), counting_loader(&loads, Duration::from_millis(700)))
        .await
        .unwrap();
    assert_eq!(cheap.outcome, Outcome::Degraded);
    assert_eq!(holder.await.unwrap().unwrap().value, "k-v1");
    assert_eq!(b.get(&key()).await.unwrap().as_deref(), Some("k-v1"));
}

/// A guard: no_lease racing an invalidate from another process
/// does not store its older result.
#[tokio::test(start_paused = true)]
async fn no_lease_is_fenced_by_an_invalidate() {
    let [(_, a), (_, b)] = two_pods(|b| b);
    let loads = Arc::new(AtomicUsize::new(0));
    let cheap = spawn_fetch(
        &a,
        CallOptions::new().no_lease(),
        &loads,
        Duration::from_millis(500),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.invalidate(&key()).await.unwrap();
    cheap.await.unwrap().unwrap();
    assert_eq!(b.get(&key()).await.unwrap(), None);
    assert_eq!(
        a.stats().lease_lost,
        1,
        "counted once (watchdog and fill share the flag)"
    );
}

// ---------------------------------------------------------------------------
// Races on real threads
// ---------------------------------------------------------------------------

/// Sets its flag when dropped (also while unwinding from a panic).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A guard (stress): with other tasks hammering the key (loads,
/// early refreshes, invalidates), a `set` of version N is never followed,
/// in this process, by an answer older than N.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_no_answer_older_than_a_returned_set() {
    let store = MemoryBackend::new();
    let c: Cache<String, u64> = Cache::builder()
        .namespace(NS)
        .backend(store)
        .ttl(Duration::from_millis(20))
        .early_refresh_beta(5.0)
        .build()
        .unwrap();
    let db = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Stops the hammers however the test ends: a failed assertion used to
    // leave them running, and a hammer answered from the L1 never yields,
    // so the runtime's shutdown hung (CI waited until its limit).
    let _stop_on_exit = StopOnDrop(stop.clone());
    let mut hammers = Vec::new();
    for h in 0..3 {
        let (c, db, stop) = (c.clone(), db.clone(), stop.clone());
        hammers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                if h == 2 && i.is_multiple_of(7) {
                    let _ = c.invalidate(&key()).await;
                    continue;
                }
                let db = db.clone();
                let _ = c
                    .get_or_load(&key(), move |_k| async move {
                        let v = db.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        Ok::<_, OriginError>(v)
                    })
                    .await;
                // An L1 hit never yields: let the runtime stop the task.
                tokio::task::yield_now().await;
            }
        }));
    }
    for n in 1..=2000u64 {
        db.store(n, Ordering::SeqCst);
        c.set(&key(), n).await.unwrap();
        let db2 = db.clone();
        let seen = c
            .get_or_load(&key(), move |_k| async move {
                Ok::<_, OriginError>(db2.load(Ordering::SeqCst))
            })
            .await
            .unwrap();
        assert!(seen >= n, "after set({n}) returned, got {seen}");
    }
    stop.store(true, Ordering::SeqCst);
    for h in hammers {
        h.await.unwrap();
    }
}

/// Regression: an early refresh whose load failed replaced
/// the value it refreshed, which was still fresh: with negative caching, by
/// a cached failure (callers got `CachedFailure` for a value fresh for
/// seconds more); with fail-safe, by a re-store for the throttle period,
/// which shortened or stretched its life. Now nothing is written: the value
/// keeps its remaining TTL.
#[tokio::test(start_paused = true)]
async fn a_failed_early_refresh_leaves_the_fresh_value_alone() {
    for fail_safe in [false, true] {
        let cache = Cache::<String, String>::builder()
            .namespace("early-fail")
            .backend(onefill::MemoryBackend::new())
            .ttl(Duration::from_secs(10))
            .jitter(0.0)
            .fail_safe(fail_safe)
            .fail_safe_throttle(Duration::from_secs(30))
            .negative_ttl(Duration::from_secs(30))
            .build()
            .unwrap();
        let key = "k".to_owned();
        cache
            .get_or_load(&key, |_| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                Ok::<_, std::io::Error>("v1".to_owned())
            })
            .await
            .unwrap();
        // 1.5 s of freshness left: inside the window (1.2 × 2 s + 5 ms).
        tokio::time::advance(Duration::from_millis(8_500)).await;
        let failing = |_| async { Err::<String, _>(std::io::Error::other("origin down")) };
        let f = cache.fetch(&key, failing).await.unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Hit, "v1"));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(cache.stats().early_refreshes, 1, "fail_safe {fail_safe}");
        // Still the fresh value, until its own expiry, and not after it.
        let f = cache.fetch(&key, failing).await.unwrap();
        assert_eq!(
            (f.outcome, f.value.as_str()),
            (Outcome::Hit, "v1"),
            "fail_safe {fail_safe}"
        );
        tokio::time::advance(Duration::from_millis(1_600)).await;
        assert_eq!(
            cache.get(&key).await.unwrap(),
            None,
            "expired at its own TTL"
        );
    }
}

/// A flight waits on another process's lease and, re-checking, reads a
/// stale value (another client wrote it, past its TTL, in grace); then an
/// `invalidate` deletes the value and the lease. The flight wins the lease
/// over nothing and its load fails. It used to fall back on the stale value
/// read before the invalidate and re-store it as the fail-safe entry, so a
/// `get` after the invalidate had returned found the deleted value again
/// (the simulation's foreign writer found it). The stale value to fall back
/// on is the one the winning `acquire` read, if any.
#[tokio::test(start_paused = true)]
async fn a_failed_load_does_not_restore_a_value_deleted_while_it_waited() {
    let ns = "restore";
    let build = |backend: &MemoryBackend| {
        Cache::<String, String>::builder()
            .namespace(ns)
            .backend(backend.clone())
            .ttl(Duration::from_secs(1))
            .grace(Duration::from_secs(60))
            .jitter(0.0)
            .fail_safe(true)
            .wait(
                onefill::WaitPolicy::default()
                    .deadline(Duration::from_secs(10))
                    .polling(Duration::from_millis(10), Duration::from_millis(10)),
            )
            .no_l1()
            .build()
            .unwrap()
    };
    let backend = MemoryBackend::new();
    let cache = build(&backend);
    let keys = onefill::backend::FillKeys::new(ns, "k");
    // Another process's lease: the waiter re-checks when it runs out (at
    // 20 ms), by when its holder has extended it.
    backend.put_raw(keys.lock(), b"another process", Duration::from_millis(20));
    let waiter = {
        let cache = cache.clone();
        tokio::spawn(async move {
            let failing = |_| async { Err::<String, _>(std::io::Error::other("origin down")) };
            cache.fetch("k", failing).await
        })
    };
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Another client writes "old" for less than its grace: stale at once.
    let scratch = MemoryBackend::new();
    build(&scratch).set("k", "old".to_owned()).await.unwrap();
    let (bytes, _) = scratch.get_raw(keys.value()).unwrap();
    backend.put_raw(keys.value(), &bytes, Duration::from_secs(30));
    backend.put_raw(keys.lock(), b"another process", Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(50)).await;
    cache.invalidate("k").await.unwrap();
    let _ = waiter.await.unwrap();
    assert_eq!(
        cache.get("k").await.unwrap(),
        None,
        "the invalidated value came back"
    );
}

/// A remote invalidate is not undone by a load from before it shared in
/// this process.
mod shared_loads {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use crate::support::{key, two_pods};
    use onefill::testing::{BoxFuture, OriginError};
    use onefill::Outcome;
    use parking_lot::Mutex;

    /// A loader reading a mutable origin at the start of the load, answering
    /// what it read after `took`.
    fn reading(
        origin: &Arc<Mutex<String>>,
        loads: &Arc<AtomicUsize>,
        took: Duration,
    ) -> impl FnOnce(String) -> BoxFuture<Result<String, OriginError>> + Send + 'static {
        let origin = origin.clone();
        let loads = loads.clone();
        move |_key| {
            Box::pin(async move {
                loads.fetch_add(1, Ordering::SeqCst);
                let read = origin.lock().clone();
                tokio::time::sleep(took).await;
                Ok(read)
            })
        }
    }

    // ---------------------------------------------------------------------------
    // Shared loads (loader.rs): one load per key per process
    // ---------------------------------------------------------------------------

    /// A background refresh R (lease L1) starts loading and reads the origin.
    /// Another process changes the origin and invalidates the key (deleting
    /// L1, so R's fill is fenced out). A later call here misses and wins a
    /// *new* lease L2; its load used to join R's in-process load from before
    /// the invalidate, so the pre-invalidation value was filled under L2,
    /// fenced on a token it legitimately held: the fencing that stops "a slow,
    /// late loader from writing data older than an invalidation" was bypassed.
    /// A flight holding a lease it just won now runs its own load (only
    /// unstored loads share one): the call answers the new value, and it is
    /// the one stored.
    #[tokio::test(start_paused = true)]
    async fn loads_a_remote_invalidate_is_not_undone_by_a_shared_older_load() {
        let [(_, a), (_, b)] =
            two_pods(|b| b.ttl(Duration::from_secs(1)).grace(Duration::from_secs(10)));
        let origin = Arc::new(Mutex::new("old".to_string()));
        let loads = Arc::new(AtomicUsize::new(0));
        let v = a
            .get_or_load(&key(), reading(&origin, &loads, Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(v, "old");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        // Stale: served at once, refresh R starts loading (2 s) and reads "old".
        let stale = a
            .fetch(&key(), reading(&origin, &loads, Duration::from_secs(2)))
            .await
            .unwrap();
        assert_eq!(stale.outcome, Outcome::Stale);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(loads.load(Ordering::SeqCst), 2, "the refresh is loading");
        // Another process writes the origin, then invalidates.
        *origin.lock() = "new".to_string();
        b.invalidate(&key()).await.unwrap();
        let after = a
            .fetch(&key(), reading(&origin, &loads, Duration::ZERO))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let stored = b.get(&key()).await.unwrap();
        assert_eq!(
            (after.value.as_str(), stored.as_deref()),
            ("new", Some("new")),
            "a load started before the invalidate neither answers after it nor is stored"
        );
    }
}

/// A call after an invalidate never shares, nor fills from, a load from
/// before it.
mod invalidation_and_loads {
    use std::time::Duration;

    use onefill::Outcome;

    use crate::support::loaders::after;
    use crate::support::{pod, spawn_get_or_load, switched, two_pods};

    /// `invalidate` (and `set`) detach the key's in-process load, so a call
    /// that starts after them runs a load of its own. The detach used the user
    /// key while loads are coalesced under the backend key, so it did nothing:
    /// the new flight won the lease (the invalidation had revoked the old one),
    /// joined the load from before the invalidation, and answered, and stored,
    /// its value (simulation seed 161).
    #[tokio::test(start_paused = true)]
    async fn a_call_after_invalidate_never_shares_a_load_from_before_it() {
        let c = pod(&switched(), |b| b);
        let key = "k".to_string();
        let before = spawn_get_or_load(&c, &key, after(500, Ok("old")));
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.invalidate(&key).await.unwrap();
        let later = c.fetch(&key, after(0, Ok("new"))).await.unwrap();
        assert_eq!(
            (later.value.as_str(), later.outcome),
            ("new", Outcome::Loaded),
            "the call after the invalidation ran its own load"
        );
        assert_eq!(before.await.unwrap().unwrap(), "old");
        assert_eq!(
            c.get(&key).await.unwrap().as_deref(),
            Some("new"),
            "the load from before the invalidation did not overwrite the new value"
        );
    }

    /// A flight that wins the lease while a load of the key is already under
    /// way in its process (a background refresh's) used to share that load, so
    /// the process loaded the key once; but that load started before the lease
    /// was won, and its value may predate a `set` or `invalidate` made since in
    /// another process (which revoked the refresh's lease). It was filled under
    /// the new lease all the same: an invalidated value landed after the
    /// invalidation (simulation seed 16). Now a flight holding a lease it just
    /// won runs a load of its own (`Sharing::Own` in `loader.rs`): the two
    /// loads overlap in the process, explained by the revoked lease, and only
    /// the new one's value is stored.
    #[tokio::test(start_paused = true)]
    async fn a_new_lease_is_filled_by_its_own_load_not_one_from_before_an_invalidation() {
        let [(_, a), (_, b)] =
            two_pods(|b| b.ttl(Duration::from_secs(1)).grace(Duration::from_secs(10)));
        let key = "k".to_string();
        a.get_or_load(&key, after(0, Ok("v1"))).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        // Stale: answered at once; the background refresh loads "before" for 1 s.
        let stale = a.fetch(&key, after(1000, Ok("before"))).await.unwrap();
        assert_eq!(stale.outcome, Outcome::Stale);
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Another process invalidates: the value and the refresh's lease go.
        b.invalidate(&key).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A miss in the first process wins a new lease and runs its own load,
        // though the refresh's (from before the invalidation) is under way.
        let fresh = a.fetch(&key, after(0, Ok("after"))).await.unwrap();
        assert_eq!(
            (fresh.value.as_str(), fresh.outcome, fresh.coalesced),
            ("after", Outcome::Loaded, false),
            "the flight under the new lease ran its own load"
        );
        assert_eq!(b.get(&key).await.unwrap().as_deref(), Some("after"));
        // The refresh ends: its fill is fenced out (its lease was revoked).
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            b.get(&key).await.unwrap().as_deref(),
            Some("after"),
            "a value loaded before the invalidation was stored after it"
        );
        let stats = a.stats();
        assert_eq!(
            (stats.loads_ok, stats.lease_lost),
            (3, 1),
            "v1, before and after loaded; the refresh's fill found its lease lost"
        );
    }
}
