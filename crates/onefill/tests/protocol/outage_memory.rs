//! Backend outages on the memory backend, in paused time: the backend is
//! wrapped (`crate::support::Switched`) so a test can make it hang (like a
//! SIGSTOPped Redis), refuse (like a dead one), answer slowly, reject
//! commands, or lose a reply: the breaker, lost replies, the outage
//! fallback, and a flight's backend budget. The regressions that need no
//! such switch are in the conformance suite's `regressions` theme, so every
//! backend runs them. The same behaviour is proven on real Redis by
//! `redis_backend.rs` (a killed, restarted and paused server) and by the
//! CLI's fleet tests (`crates/onefill-cli/tests/fleet.rs`: SIGSTOP and
//! restart of Redis under load, with real processes).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{
    a_far_waiter_of_a_long_load, a_load_under_way, assert_the_fallback_forgot, breaker,
    counting_loader, fetch_now, fixed_lease, pod, spawn_fetch, switched, two_pods, Switched,
    Switches, COMMAND, HANG, HANG_FROM_THIRD, HEALTHY, LOSE_ACQUIRE_REPLY, REFUSE,
};
use onefill::testing::{Fault, Op};
use onefill::{BackendErrorKind, Cache, CallOptions, CircuitState, Error, Outcome};
use tokio::time::Instant;

/// A hung backend on a cold key: every caller is answered within the
/// backend timeout plus one load, with one load per pod, not per caller.
#[tokio::test(start_paused = true)]
async fn hung_backend_bounds_every_caller_and_coalesces_per_pod() {
    let backend = switched();
    backend.set_mode(HANG);
    let pods = [pod(&backend, |b| b), pod(&backend, |b| b)];
    let loads = Arc::new(AtomicUsize::new(0));
    let load = Duration::from_millis(100);
    let mut tasks = Vec::new();
    for i in 0..60 {
        let c = pods[i % 2].clone();
        let loader = counting_loader(&loads, load);
        tasks.push(tokio::spawn(async move {
            let start = Instant::now();
            let r = c.fetch(&"k".to_string(), loader).await;
            (r, start.elapsed())
        }));
    }
    for t in tasks {
        let (r, took) = t.await.unwrap();
        let f = r.expect("no caller error during the outage");
        assert_eq!(f.outcome, Outcome::Degraded);
        assert!(
            took <= Duration::from_millis(300),
            "{took:?} > timeout + load"
        );
    }
    assert_eq!(loads.load(Ordering::SeqCst), 2, "one load per pod");
}

/// A hot key while the backend hangs for 3 s: callers keep being answered
/// from the last value, without errors and without loads; after recovery
/// the lease is used again.
#[tokio::test(start_paused = true)]
async fn hot_key_survives_an_outage_then_leases_resume() {
    let backend = switched();
    let pods = [
        pod(&backend, |b| {
            b.ttl(Duration::from_secs(1)).grace(Duration::from_secs(5))
        }),
        pod(&backend, |b| {
            b.ttl(Duration::from_secs(1)).grace(Duration::from_secs(5))
        }),
    ];
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "hot".to_string();
    for p in &pods {
        p.get_or_load(&key, counting_loader(&loads, Duration::from_millis(100)))
            .await
            .unwrap();
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    backend.set_mode(HANG);
    let outage_start = Instant::now();
    let mut answered = 0;
    while outage_start.elapsed() < Duration::from_secs(3) {
        for p in &pods {
            let start = Instant::now();
            let f = p
                .fetch(&key, counting_loader(&loads, Duration::from_millis(100)))
                .await
                .expect("no caller error");
            assert!(start.elapsed() <= Duration::from_millis(300));
            assert_eq!(f.value, "hot-v1");
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each pod's breaker lets a probe through about every 100 ms while
    // it is open, and against a hung backend each probe holds its caller
    // for the backend timeout (250 ms): an iteration (two calls and the
    // pause) takes at most 550 ms, so 3 s give at least 5 of them.
    assert!(answered >= 10, "only {answered} answers in 3 s");
    assert_eq!(
        loads.load(Ordering::SeqCst),
        1,
        "served from the last value, no load"
    );
    assert!(
        pods.iter()
            .any(|p| p.circuit_state() != CircuitState::Closed),
        "the breaker opened"
    );
    backend.set_mode(HEALTHY);
    let before: u64 = pods.iter().map(|p| p.stats().lease_acquired).sum();
    // Past ttl + grace the value is gone; the next miss takes the lease again.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let f = pods[0]
        .fetch(&key, counting_loader(&loads, Duration::from_millis(100)))
        .await
        .unwrap();
    assert_eq!(f.outcome, Outcome::Loaded);
    let after: u64 = pods.iter().map(|p| p.stats().lease_acquired).sum();
    assert_eq!(after, before + 1, "leasing resumed by itself");
    assert_eq!(pods[0].circuit_state(), CircuitState::Closed);
}

/// A refusing backend opens the breaker after 5 consecutive failures; calls
/// then skip it until a probe succeeds.
#[tokio::test(start_paused = true)]
async fn circuit_breaker_stops_hammering_a_dead_backend() {
    let backend = switched();
    let c = pod(&backend, breaker(5, Duration::from_secs(2)));
    backend.set_mode(REFUSE);
    let loads = Arc::new(AtomicUsize::new(0));
    for i in 0..50 {
        let f = c
            .fetch(&format!("k{i}"), counting_loader(&loads, Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(f.outcome, Outcome::Degraded);
    }
    // Five reads, each with a read of the namespace's marks beside it (the
    // process never got to read them).
    assert_eq!(backend.calls(), 10, "only the failures that opened it");
    assert_eq!(c.circuit_state(), CircuitState::Open);
    let s = c.stats();
    assert_eq!(s.circuit_opened, 1);
    assert_eq!(s.circuit_rejected, 45);
    backend.set_mode(HEALTHY);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let f = c
        .fetch(
            &"after".to_string(),
            counting_loader(&loads, Duration::ZERO),
        )
        .await
        .unwrap();
    assert_eq!(
        f.outcome,
        Outcome::Loaded,
        "the probe went through and closed the circuit"
    );
    assert_eq!(c.circuit_state(), CircuitState::Closed);
}

/// Strict mode surfaces backend errors instead of degrading.
#[tokio::test(start_paused = true)]
async fn strict_mode_surfaces_backend_errors() {
    let backend = switched();
    backend.set_mode(REFUSE);
    let c = pod(&backend, |b| b.strict(true));
    let loads = Arc::new(AtomicUsize::new(0));
    let err = c
        .get_or_load(&"k".to_string(), counting_loader(&loads, Duration::ZERO))
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(matches!(err, Error::Backend(ref b) if b.kind() == BackendErrorKind::Connection));
    assert_eq!(loads.load(Ordering::SeqCst), 0);
    backend.set_mode(HANG);
    let err = c
        .get_or_load(&"k".to_string(), counting_loader(&loads, Duration::ZERO))
        .await
        .unwrap_err();
    assert!(err.is_timeout() && err.is_backend(), "{err}");
}

/// Opens the breaker of `c` (threshold 1) and lets `open_for` pass, so the
/// next call is the half-open probe.
async fn open_then_wait_for_the_probe(backend: &Switched, c: &Cache<String, String>) {
    backend.set_mode(REFUSE);
    let _ = c.get(&"any".to_string()).await;
    assert_eq!(c.circuit_state(), CircuitState::Open);
    tokio::time::sleep(Duration::from_millis(1001)).await;
}

/// Heals the backend; the next call must reach it and close the circuit.
async fn assert_used_again(backend: &Switched, c: &Cache<String, String>) {
    backend.set_mode(HEALTHY);
    let loads = Arc::new(AtomicUsize::new(0));
    let loader = counting_loader(&loads, Duration::ZERO);
    let f = c.fetch(&"k".to_string(), loader).await;
    assert_eq!(
        f.unwrap().outcome,
        Outcome::Loaded,
        "the backend is used again"
    );
    assert_eq!(c.circuit_state(), CircuitState::Closed);
}

fn breaker_pod(backend: &Switched) -> Cache<String, String> {
    pod(backend, breaker(1, Duration::from_secs(1)))
}

/// Regression: the half-open probe's caller dropped its future (its own
/// timeout around `get`): the breaker stayed half-open and rejected every
/// call for good. Now the next call probes, and a healthy backend is used.
#[tokio::test(start_paused = true)]
async fn a_dropped_probe_does_not_leave_the_breaker_half_open() {
    let backend = switched();
    let c = breaker_pod(&backend);
    open_then_wait_for_the_probe(&backend, &c).await;
    backend.set_mode(HANG);
    let dropped = tokio::time::timeout(Duration::from_millis(10), c.get(&"k".to_string())).await;
    assert!(dropped.is_err(), "the probe's caller gave up");
    assert_used_again(&backend, &c).await;
}

/// Regression: the probe met a non-transient error (OOM, NOAUTH, CROSSSLOT):
/// neither a success nor a failure, so the breaker stayed half-open. An
/// error the server answered proves it up: the probe ends, the circuit
/// closes.
#[tokio::test(start_paused = true)]
async fn a_probe_meeting_a_command_error_ends_the_half_open_state() {
    let backend = switched();
    let c = breaker_pod(&backend);
    open_then_wait_for_the_probe(&backend, &c).await;
    backend.set_mode(COMMAND);
    let _ = c.get(&"k".to_string()).await;
    assert_used_again(&backend, &c).await;
}

/// Regression: `acquire` ran on the server and its reply was lost; the flight
/// degraded without releasing the token it sent, so another process waited
/// the lease's whole TTL and a second load ran after it. Now the token is
/// released in the background: the other process wins at once, no wait.
#[tokio::test(start_paused = true)]
async fn an_acquire_whose_reply_is_lost_releases_its_lease() {
    let [(backend, a), (_, b)] = two_pods(fixed_lease(Duration::from_secs(10)));
    backend.set_mode(LOSE_ACQUIRE_REPLY);
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k".to_string();
    let first = fetch_now(&a, &key, &loads).await;
    assert_eq!(first.outcome, Outcome::Degraded);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let start = Instant::now();
    let second = fetch_now(&b, &key, &loads).await;
    assert_eq!(second.outcome, Outcome::Loaded);
    assert_eq!(b.stats().waits, 0, "the orphaned lease was released");
    assert!(start.elapsed() < Duration::from_secs(1));
}

/// Regression: a value served from the outage fallback was recorded again,
/// renewing its `ttl + grace`; with ttl 1 s a value seen 29.5 s earlier was
/// still served. Now the bound counts from when it was loaded or read.
#[tokio::test(start_paused = true)]
async fn the_fallback_never_serves_a_value_older_than_ttl_plus_grace() {
    let backend = switched();
    let c = pod(&backend, |b| b.ttl(Duration::from_secs(1)));
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k".to_string();
    let load = || counting_loader(&loads, Duration::ZERO);
    assert_eq!(
        c.fetch(&key, load()).await.unwrap().outcome,
        Outcome::Loaded
    );
    backend.set_mode(REFUSE);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let served = c.fetch(&key, load()).await.unwrap();
    assert_eq!(
        (served.value.as_str(), served.outcome),
        ("k-v1", Outcome::Stale)
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = c.fetch(&key, load()).await.unwrap();
    assert_eq!(
        later.outcome,
        Outcome::Degraded,
        "k-v1 is 1.1 s old: past ttl + grace"
    );
}

/// Regression: a flight that started before `invalidate` recorded its value
/// in the outage fallback after it; a later outage served the invalidated
/// value.
#[tokio::test(start_paused = true)]
async fn invalidate_keeps_its_value_out_of_the_fallback() {
    let backend = switched();
    let c = pod(&backend, |b| b);
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k".to_string();
    let slow = spawn_fetch(&c, CallOptions::new(), &loads, Duration::from_millis(500));
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.invalidate(&key).await.unwrap();
    assert_eq!(slow.await.unwrap().unwrap().value, "k-v1");
    assert_the_fallback_forgot(&backend, &c, &loads, "the invalidated value is not served").await;
}

/// Regression: with an L1, a `set` whose reply came late recorded its own
/// value in the outage fallback after another process's write, which had
/// landed in between, was reported; a later outage answered the value that
/// write had replaced. With an L1 a `set` now leaves the key to the next
/// read.
#[tokio::test(start_paused = true)]
async fn a_late_set_reply_keeps_nothing_another_write_replaced_meanwhile() {
    let [(a, pod_a), (_, pod_b)] = two_pods(|b| b.l1(onefill::L1::new(100)));
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k".to_string();
    a.faults().set([Op::Set], Fault::Gated);
    let writing = tokio::spawn({
        let (pod_a, key) = (pod_a.clone(), key.clone());
        async move { pod_a.set(&key, "from-a".to_owned()).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    pod_b.set(&key, "from-b".to_owned()).await.unwrap();
    a.faults().open_gate(1);
    writing.await.unwrap().unwrap();
    a.set_mode(REFUSE);
    let f = fetch_now(&pod_a, &key, &loads).await;
    assert_eq!(
        f.outcome,
        Outcome::Degraded,
        "{:?}: the value B's write replaced",
        f.value
    );
}

/// Regression: a backend that hangs in the middle of a flight used to cost a
/// caller one timeout per step: here the subscription of a waiter (200 ms),
/// then its re-check (200 ms more). A flight now loses at most one backend
/// timeout to failures before answering: the re-check is not attempted,
/// and the waiter degrades at once.
#[tokio::test(start_paused = true)]
async fn a_backend_hanging_mid_flight_costs_a_caller_one_timeout() {
    let loads = Arc::new(AtomicUsize::new(0));
    let ([_, (hanging, waiter)], _held) = a_load_under_way(&loads, Duration::from_secs(5)).await;
    hanging.set_mode(HANG_FROM_THIRD);
    let start = Instant::now();
    let f = fetch_now(&waiter, "k", &loads).await;
    let took = start.elapsed();
    assert_eq!(f.outcome, Outcome::Degraded);
    assert!(took <= Duration::from_millis(201), "{took:?} > one timeout");
}

/// The other side of the flight's budget (one backend timeout at most): a healthy but distant backend
/// (40 ms a call, 200 ms budget) must not run a long wait out of budget.
/// Calls that answer are not charged, so the waiter waits out another
/// process's 2 s load: one load, not a degraded second one.
#[tokio::test(start_paused = true)]
async fn a_far_backend_still_waits_out_a_long_load() {
    let (waited, held, loads) = a_far_waiter_of_a_long_load(40).await;
    assert_eq!(
        (waited.value.as_str(), waited.outcome),
        ("k-v1", Outcome::Waited)
    );
    assert_eq!(held.outcome, Outcome::Loaded);
    assert_eq!(loads, 1);
}

/// The outage fallback forgets what a write replaced, and never outlives
/// the server's copy; the breaker's probe survives dropped and late calls.
mod fallback_and_breaker {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::support::{
        assert_the_fallback_forgot, breaker, fetch_now, key, pod, spawn_fetch, switched, Switches,
        HANG, HEALTHY, REFUSE,
    };

    use onefill::{BackendErrorKind, CallOptions, CircuitState, Error, Outcome};
    use tokio::time::Instant;

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
        let wire = switched();
        let c = pod(&wire, |b| b.outage_fallback_capacity(2));
        let loads = Arc::new(AtomicUsize::new(0));
        let older = spawn_fetch(&c, CallOptions::new(), &loads, Duration::from_millis(500));
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.invalidate(&key()).await.unwrap();
        for other in ["a", "b"] {
            fetch_now(&c, other, &loads).await;
        }
        assert_eq!(older.await.unwrap().unwrap().value, "k-v1");
        wire.set_mode(REFUSE);
        let f = fetch_now(&c, "k", &loads).await;
        assert_ne!(f.value, "k-v1", "the invalidated value is not served");
    }

    /// Regression again, through a healthy read: a Hit used to be recorded for a
    /// full `ttl + grace` from the read, although the server said the value
    /// had 100 ms left. With ttl 1 s, a value loaded 1.5 s earlier (expired on
    /// the server 0.5 s ago) was served in the next outage. The fallback now
    /// serves a value no longer than the server said it lives.
    #[tokio::test(start_paused = true)]
    async fn fallback_never_serves_a_value_past_its_server_expiry() {
        let wire = switched();
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
    // Circuit breaker permit (circuit.rs)
    // ---------------------------------------------------------------------------

    /// A guard: set/invalidate/get probes dropped by the caller's
    /// timeout never leave the breaker half-open; a healthy backend is used
    /// again.
    #[tokio::test(start_paused = true)]
    async fn dropped_write_probes_do_not_wedge_the_breaker() {
        let wire = switched();
        let c = pod(&wire, breaker(1, Duration::from_millis(100)));
        wire.set_mode(REFUSE);
        let _ = c.get(&key()).await;
        assert_eq!(c.circuit_state(), CircuitState::Open);
        wire.set_mode(HANG);
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let _ = tokio::time::timeout(Duration::from_millis(5), c.set(&key(), "x".into())).await;
            let _ = tokio::time::timeout(Duration::from_millis(5), c.invalidate(&key())).await;
        }
        wire.set_mode(HEALTHY);
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
        let wire = switched();
        let c = pod(&wire, breaker(1, Duration::from_millis(50)));
        let t0 = Instant::now();
        wire.set_mode(HANG);
        let old = {
            let c = c.clone();
            tokio::spawn(async move { c.get(&"old".to_string()).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        wire.set_mode(REFUSE);
        let _ = c.get(&"opens".to_string()).await;
        assert_eq!(c.circuit_state(), CircuitState::Open);
        tokio::time::sleep_until(t0 + Duration::from_millis(100)).await;
        wire.set_mode(HANG);
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
}

/// A flight's backend budget on a slow backend: what it loads is stored, a
/// waiter waits, and cut timeouts do not open the breaker.
mod backend_budget {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use crate::support::{
        a_far_waiter_of_a_long_load, counting_loader, fetch_loading, keys, pod, switched, two_pods,
        Switches,
    };

    use onefill::{CircuitState, Outcome};

    use tokio::time::Instant;

    // ---------------------------------------------------------------------------
    // Budget (flight.rs)
    // ---------------------------------------------------------------------------

    /// A healthy backend 90 ms away (under half the 200 ms timeout, every call
    /// answered well within it). The first call loads under the lease. Its
    /// fill used to run with the 20 ms left of the flight's budget (less than
    /// even the one-way trip) instead of being deferred, and time out: the
    /// lease stayed behind, nothing was stored, and another process (right
    /// next to the server) waited out the orphaned lease. (This process hid
    /// it: its next flight degraded on the spent budget and served the outage
    /// fallback on a healthy backend.) The budget now charges failed calls
    /// only: the value is stored, and the other process hits it.
    #[tokio::test(start_paused = true)]
    async fn budget_a_backend_under_half_the_timeout_still_stores_what_it_loads() {
        let [(wire, c), (_, other)] = two_pods(|b| b);
        wire.delay(90);
        let loads = Arc::new(AtomicUsize::new(0));
        let first = fetch_loading(&c, "k", &loads, Duration::from_millis(100)).await;
        assert_eq!(first.outcome, Outcome::Loaded);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let start = Instant::now();
        let second = fetch_loading(&other, "k", &loads, Duration::from_millis(100)).await;
        assert_eq!(
            (
                second.outcome,
                loads.load(Ordering::SeqCst),
                wire.store().get_raw(keys().value()).is_some()
            ),
            (Outcome::Hit, 1, true),
            "the loaded value was stored; the other process waited {:?} (stats of the loader's \
         process: {:?})",
            start.elapsed(),
            c.stats()
        );
    }

    /// The other side of the same budget: a waiter 70 ms away. get (70) and
    /// acquire (70) used to leave 60 ms, the subscribe was cut at 60 ms, the
    /// budget was spent and the first re-check "not attempted": the waiter
    /// degraded at once and loaded a second time, although the holder filled
    /// within 2 s. Calls that answer are no longer charged: the waiter waits,
    /// and there is one load fleet-wide.
    #[tokio::test(start_paused = true)]
    async fn budget_a_waiter_at_a_third_of_the_timeout_waits_instead_of_loading() {
        let (waited, held, loads) = a_far_waiter_of_a_long_load(70).await;
        assert_eq!(held.outcome, Outcome::Loaded);
        assert_eq!(
            (waited.outcome, loads),
            (Outcome::Waited, 1),
            "one load fleet-wide"
        );
    }

    /// Timeouts the budget imposed (a step cut short because an earlier step
    /// used part of the budget) used to be fed to the circuit breaker as
    /// failures: a backend answering every call in 120 ms (timeout 200 ms) was
    /// declared dead after five misses, and every caller then loaded without
    /// the lease. Answered calls are no longer charged, and a call the budget
    /// cut short that times out is no evidence against the backend: the
    /// breaker stays closed.
    #[tokio::test(start_paused = true)]
    async fn budget_cut_timeouts_do_not_open_the_breaker_on_a_healthy_backend() {
        let wire = switched();
        wire.delay(120);
        let c = pod(&wire, |b| b);
        let loads = Arc::new(AtomicUsize::new(0));
        // Ten keys at once (a page of a feed): ten gets succeed, then ten
        // acquires used to be cut at 80 ms: ten consecutive "failures".
        let mut tasks = Vec::new();
        for i in 0..10 {
            let c = c.clone();
            let loader = counting_loader(&loads, Duration::ZERO);
            tasks.push(tokio::spawn(async move {
                c.fetch(&format!("k{i}"), loader).await
            }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(
            c.circuit_state(),
            CircuitState::Closed,
            "every call was answered in 120 ms < 200 ms (stats: {:?})",
            c.stats()
        );
    }
}
