//! Regression tests from an adversarial review of issues 7 and 8 (the
//! review's hostile tests, one per attack): here those on `set` and
//! `invalidate`, the outage fallback, `no_lease`, the circuit breaker, keys
//! and options, and a stress test on real threads; those on a flight's
//! budget, lease and load are in `adversarial_flights.rs`. A test whose
//! attack once broke the library says what used to happen; the attacks
//! that held stay as guards. Memory backend behind switches
//! (`support::Switched`), in paused time but for the stress test.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::{Acquired, Backend, FillKeys};
use onefill::testing::{failing_loader, OriginError};
use onefill::{
    BackendErrorKind, Cache, CallOptions, CircuitBreaker, CircuitState, Error, LeaseToken,
    LeaseTtl, MemoryBackend, Outcome, WaitPolicy,
};
use support::{
    a_load_under_way, assert_the_fallback_forgot, breaker, counting_loader, fetch_now, key, keys,
    pod, spawn_fetch, two_pods, Switched, HANG, HEALTHY, NS, REFUSE, WRITE_THEN_HANG,
};
use tokio::time::Instant;

/// A pod with "k" loaded ("k-v1"; its loads count into the third item),
/// whose backend then runs `set` and `invalidate` without answering.
async fn loaded_then_writes_hang() -> (Switched, Cache<String, String>, Arc<AtomicUsize>) {
    let wire = Switched::default();
    let c = pod(&wire, |b| b);
    let loads = Arc::new(AtomicUsize::new(0));
    fetch_now(&c, "k", &loads).await;
    wire.set(WRITE_THEN_HANG);
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
    let wire = Switched::default();
    let c = pod(&wire, |b| b);
    let loads = Arc::new(AtomicUsize::new(0));
    let older = spawn_fetch(&c, CallOptions::new(), &loads, Duration::from_millis(500));
    tokio::time::sleep(Duration::from_millis(50)).await;
    wire.set(WRITE_THEN_HANG);
    let gave_up =
        tokio::time::timeout(Duration::from_millis(50), c.set(&key(), "manual".into())).await;
    assert!(gave_up.is_err(), "the caller gave up");
    wire.set(HEALTHY);
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
    wire.set(HEALTHY);
    assert_eq!(
        c.get(&key()).await.unwrap().as_deref(),
        Some("manual"),
        "it landed"
    );
    wire.set(REFUSE);
    let f = fetch_now(&c, "k", &loads).await;
    assert_ne!(
        f.value, "k-v1",
        "the value the set replaced is not served ({:?})",
        f.outcome
    );
}

/// Held in the review: a plain failed invalidate (a timeout, not a
/// cancellation) forgets the fallback.
#[tokio::test(start_paused = true)]
async fn a_timed_out_invalidate_forgets_the_fallback() {
    let (wire, c, loads) = loaded_then_writes_hang().await;
    assert!(c.invalidate(&key()).await.is_err());
    assert_the_fallback_forgot(&wire, &c, &loads, "the invalidated value is not served").await;
}

// ---------------------------------------------------------------------------
// Outage fallback (fallback.rs)
// ---------------------------------------------------------------------------

/// A tombstone left by `invalidate` used to be an ordinary entry for the
/// fallback's capacity eviction (and usually the one closest to its end):
/// two other keys evicted it, and the flight from before the invalidate
/// then recorded the invalidated value, which the next outage served. An
/// evicted tombstone now raises a floor epoch below which nothing is
/// recorded.
#[tokio::test(start_paused = true)]
async fn fallback_a_tombstone_survives_capacity_eviction() {
    let wire = Switched::default();
    let c = pod(&wire, |b| b.outage_fallback_capacity(2));
    let loads = Arc::new(AtomicUsize::new(0));
    let older = spawn_fetch(&c, CallOptions::new(), &loads, Duration::from_millis(500));
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.invalidate(&key()).await.unwrap();
    for other in ["a", "b"] {
        fetch_now(&c, other, &loads).await;
    }
    assert_eq!(older.await.unwrap().unwrap().value, "k-v1");
    wire.set(REFUSE);
    let f = fetch_now(&c, "k", &loads).await;
    assert_ne!(f.value, "k-v1", "the invalidated value is not served");
}

/// Fault 7 again, through a healthy read: a Hit used to be recorded for a
/// full `ttl + grace` from the read, although the server said the value
/// had 100 ms left. With ttl 1 s, a value loaded 1.5 s earlier (expired on
/// the server 0.5 s ago) was served in the next outage. The fallback now
/// serves a value no longer than the server said it lives.
#[tokio::test(start_paused = true)]
async fn fallback_never_serves_a_value_past_its_server_expiry() {
    let wire = Switched::default();
    let c = pod(&wire, |b| b.ttl(Duration::from_secs(1)));
    let loads = Arc::new(AtomicUsize::new(0));
    let first = fetch_now(&c, "k", &loads).await;
    assert_eq!(first.outcome, Outcome::Loaded);
    tokio::time::sleep(Duration::from_millis(900)).await;
    let hit = fetch_now(&c, "k", &loads).await;
    assert_eq!(hit.outcome, Outcome::Hit);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let why = "k-v1 was loaded 1.5 s ago with ttl 1 s, grace 0";
    assert_the_fallback_forgot(&wire, &c, &loads, why).await;
}

// ---------------------------------------------------------------------------
// no_lease (flight.rs load_without_waiting)
// ---------------------------------------------------------------------------

/// Held in the review: no_lease with a remote holder answers Degraded and
/// stores nothing; the holder's fill is what lands.
#[tokio::test(start_paused = true)]
async fn no_lease_never_overwrites_the_holders_fill() {
    let loads = Arc::new(AtomicUsize::new(0));
    let ([_, (_, b)], holder) = a_load_under_way(&loads, Duration::from_millis(500)).await;
    let cheap = b
        .fetch(
            &key(),
            &CallOptions::new().no_lease(),
            counting_loader(&loads, Duration::from_millis(700)),
        )
        .await
        .unwrap();
    assert_eq!(cheap.outcome, Outcome::Degraded);
    assert_eq!(holder.await.unwrap().unwrap().value, "k-v1");
    assert_eq!(b.get(&key()).await.unwrap().as_deref(), Some("k-v1"));
}

/// Held in the review: no_lease racing an invalidate from another process
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
// Circuit breaker permit (circuit.rs)
// ---------------------------------------------------------------------------

/// Held in the review: set/invalidate/get probes dropped by the caller's
/// timeout never leave the breaker half-open; a healthy backend is used
/// again.
#[tokio::test(start_paused = true)]
async fn dropped_write_probes_do_not_wedge_the_breaker() {
    let wire = Switched::default();
    let c = pod(&wire, breaker(1, Duration::from_millis(100)));
    wire.set(REFUSE);
    let _ = c.get(&key()).await;
    assert_eq!(c.circuit_state(), CircuitState::Open);
    wire.set(HANG);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let _ = tokio::time::timeout(Duration::from_millis(5), c.set(&key(), "x".into())).await;
        let _ = tokio::time::timeout(Duration::from_millis(5), c.invalidate(&key())).await;
    }
    wire.set(HEALTHY);
    tokio::time::sleep(Duration::from_millis(150)).await;
    c.set(&key(), "y".into()).await.unwrap();
    assert_eq!(c.circuit_state(), CircuitState::Closed);
}

/// One probe at a time: a call admitted while the circuit was closed that
/// failed late (its timeout) used to clear `probing` although the probe in
/// flight was someone else's, so a second probe was admitted beside it.
/// Only the probe now ends the half-open state: the second call is
/// rejected.
#[tokio::test(start_paused = true)]
async fn circuit_one_probe_at_a_time_even_when_an_older_call_fails_late() {
    let wire = Switched::default();
    let c = pod(&wire, breaker(1, Duration::from_millis(50)));
    let t0 = Instant::now();
    wire.set(HANG);
    let old = {
        let c = c.clone();
        tokio::spawn(async move { c.get(&"old".to_string()).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    wire.set(REFUSE);
    let _ = c.get(&"opens".to_string()).await;
    assert_eq!(c.circuit_state(), CircuitState::Open);
    tokio::time::sleep_until(t0 + Duration::from_millis(100)).await;
    wire.set(HANG);
    let probe = {
        let c = c.clone();
        tokio::spawn(async move { c.get(&"probe".to_string()).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(c.circuit_state(), CircuitState::HalfOpen);
    // The old call times out at 200 ms; the probe is still in flight.
    tokio::time::sleep_until(t0 + Duration::from_millis(260)).await;
    assert!(!probe.is_finished(), "the probe is still in flight");
    let second = tokio::time::timeout(Duration::from_millis(1), c.get(&"q".to_string())).await;
    assert!(
        matches!(&second, Ok(Err(Error::Backend(e))) if e.kind() == BackendErrorKind::CircuitOpen),
        "a second call while the probe is in flight is rejected, got {second:?}"
    );
    let _ = old.await;
}

// ---------------------------------------------------------------------------
// Keys (key.rs) and options (options.rs)
// ---------------------------------------------------------------------------

/// Held in the review: hostile keys round-trip and never collide with
/// their escapes.
#[tokio::test(start_paused = true)]
async fn hostile_keys_round_trip_without_collisions() {
    let wire = Switched::default();
    let c = pod(&wire, |b| b.max_key_bytes(64 * 1024));
    let long = "}{%".repeat(20_000);
    let keys = [
        "a{b",
        "a%7Bb",
        "a%257Bb",
        "}",
        "%7D",
        "{",
        "%",
        "%25",
        "\0",
        "\0}",
        "k\u{0}{x}",
        &long,
    ];
    for (i, k) in keys.iter().enumerate() {
        c.set(&k.to_string(), format!("v{i}")).await.unwrap();
    }
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(
            c.get(&k.to_string()).await.unwrap(),
            Some(format!("v{i}")),
            "{k:?}"
        );
    }
    c.invalidate(&"a{b".to_string()).await.unwrap();
    assert_eq!(
        c.get(&"a%7Bb".to_string()).await.unwrap().as_deref(),
        Some("v1")
    );
    let too_long = "x".repeat(64 * 1024 + 1);
    assert!(c.get(&too_long).await.unwrap_err().is_invalid_input());
}

/// Held in the review: options at their limits build and answer; just
/// past them they are refused with the setter's name.
#[tokio::test(start_paused = true)]
async fn options_at_their_limits() {
    let wire = Switched::default();
    let c = pod(&wire, |b| {
        b.ttl(onefill::MAX_TTL)
            .grace(onefill::MAX_TTL)
            .jitter(0.5)
            .early_refresh_beta(100.0)
            .max_load_time(Duration::from_secs(24 * 3600))
            .lease_ttl(LeaseTtl::Fixed(Duration::from_millis(30)))
            .wait(WaitPolicy::default().deadline(Duration::from_secs(3600)))
            .negative_ttl(onefill::MAX_TTL)
            .fail_safe_throttle(onefill::MAX_TTL)
            .backend_timeout(Duration::from_millis(1))
            .circuit_breaker(CircuitBreaker::new(u32::MAX, Duration::from_secs(3600)))
    });
    let loads = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        c.get_or_load(&key(), counting_loader(&loads, Duration::from_millis(100)))
            .await
            .unwrap();
    }
    c.invalidate(&key()).await.unwrap();
    wire.set(REFUSE);
    c.get_or_load(&key(), counting_loader(&loads, Duration::ZERO))
        .await
        .unwrap();
    let err = Cache::<String, String>::builder()
        .jitter(0.500001)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("jitter"), "{err}");
    let err = c
        .get_or_load_with(
            &key(),
            &CallOptions::new().ttl(onefill::MAX_TTL + Duration::from_millis(1)),
            counting_loader(&loads, Duration::ZERO),
        )
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
}

/// Per-call options, the later setter winning: `no_lease` after
/// `lease_ttl` does not wait for a lease another process holds (it loads
/// at once), and `no_negative_caching` overrides the cache-wide negative
/// TTL (a failed load is not remembered: the next call loads again). The
/// same calls without those options wait for the holder, and remember the
/// failure, so each half can fail.
#[tokio::test(start_paused = true)]
async fn call_options_the_later_setter_wins() {
    let wire = Switched::default();
    let deadline = Duration::from_millis(500);
    let c = pod(&wire, |b| {
        b.negative_ttl(Duration::from_secs(60))
            .wait(WaitPolicy::default().deadline(deadline))
    });
    let opts = CallOptions::new()
        .lease_ttl(LeaseTtl::default())
        .no_lease()
        .no_negative_caching();
    let held = |name: &str| {
        let store = wire.store().clone();
        let keys = FillKeys::new(NS, name);
        async move {
            let taken = store
                .acquire(
                    &keys,
                    &LeaseToken::random(),
                    Duration::from_secs(60),
                    Duration::ZERO,
                )
                .await
                .unwrap();
            assert!(matches!(taken, Acquired::Won { .. }), "{taken:?}");
        }
    };
    // How long a failing call takes on a key whose lease another process
    // holds, and how many loads two failing calls on a free key run.
    let run = |name: &'static str, options: CallOptions| {
        let c = c.clone();
        let held = held(name);
        async move {
            held.await;
            let calls = Arc::new(AtomicUsize::new(0));
            let started = Instant::now();
            let key = name.to_string();
            let _ = c
                .get_or_load_with(&key, &options, failing_loader(&calls))
                .await;
            let waited = started.elapsed();
            let free = format!("{name}-free");
            let calls = Arc::new(AtomicUsize::new(0));
            for _ in 0..2 {
                let err = c
                    .get_or_load_with(&free, &options, failing_loader(&calls))
                    .await
                    .unwrap_err();
                assert!(err.is_loader(), "{err:?}");
            }
            (waited, calls.load(Ordering::SeqCst))
        }
    };
    let (waited, loads) = run("with", opts).await;
    assert!(
        waited < deadline,
        "no_lease waited for the lease: {waited:?}"
    );
    assert_eq!(
        loads, 2,
        "no_negative_caching: the failure is not remembered"
    );
    let (waited, loads) = run("without", CallOptions::new()).await;
    assert!(
        waited >= deadline,
        "a leased call waits for the holder: {waited:?}"
    );
    assert_eq!(
        loads, 1,
        "the cache-wide negative TTL remembers the failure"
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

/// Held in the review (stress): with other tasks hammering the key (loads,
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

/// Review of issue 9, item 4: an early refresh whose load failed replaced
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
        let f = cache
            .fetch(&key, &CallOptions::new(), failing)
            .await
            .unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Hit, "v1"));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(cache.stats().early_refreshes, 1, "fail_safe {fail_safe}");
        // Still the fresh value, until its own expiry, and not after it.
        let f = cache
            .fetch(&key, &CallOptions::new(), failing)
            .await
            .unwrap();
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
