//! The protocol conformance suite: every scenario is an async function
//! generic over a [`Harness`], so the very same assertions run on the
//! memory backend (under paused tokio time) and on real Redis, standalone
//! and clustered (in real time).
//!
//! Include with `mod conformance;` and instantiate with
//! [`conformance_suite!`].

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use onefill::backend::{Acquired, Backend, FillKeys};
use onefill::{
    Cache, CallOptions, Error, LeaseToken, LeaseTtl, OnWaitTimeout, Outcome, WaitPolicy,
};
use tokio::sync::Barrier;
use tokio::time::Instant;

/// Gives the suite backends that share one store.
#[async_trait]
pub trait Harness: Send + Sync {
    /// A handle on the shared store, as a new process would open it.
    async fn backend(&self) -> Arc<dyn Backend>;
    /// Whether tokio time is paused (then virtual durations may be asserted).
    fn paused(&self) -> bool;
}

#[derive(Debug, thiserror::Error)]
#[error("origin failed: {0}")]
pub struct OriginError(pub String);

/// A simulated origin: counts loads, sleeps, returns `value-N`.
#[derive(Clone, Default)]
pub struct Origin {
    pub loads: Arc<AtomicUsize>,
}

impl Origin {
    pub fn count(&self) -> usize {
        self.loads.load(Ordering::SeqCst)
    }
    pub fn loader(
        &self,
        took: Duration,
    ) -> impl FnOnce(String) -> futures_lite::BoxedFuture<Result<String, OriginError>> + Send + 'static
    {
        let loads = self.loads.clone();
        move |key: String| {
            Box::pin(async move {
                let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(took).await;
                Ok(format!("{key}-v{n}"))
            })
        }
    }
}

/// A loader that counts its calls and always fails with "db down".
pub fn failing_loader(
    calls: &Arc<AtomicUsize>,
) -> impl FnOnce(String) -> futures_lite::BoxedFuture<Result<String, OriginError>> + Send + 'static
{
    let calls = calls.clone();
    move |_key: String| {
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(OriginError("db down".into()))
        })
    }
}

/// Minimal boxed future alias (no extra crate needed).
pub mod futures_lite {
    pub type BoxedFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
}

pub async fn cache(h: &dyn Harness, ns: &str) -> Cache<String, String> {
    Cache::builder()
        .namespace(ns)
        .shared_backend(h.backend().await)
        .jitter(0.0)
        .build()
        .expect("valid options")
}

async fn cache_with(
    h: &dyn Harness,
    ns: &str,
    f: impl FnOnce(onefill::CacheBuilder<String, String>) -> onefill::CacheBuilder<String, String>,
) -> Cache<String, String> {
    f(Cache::builder()
        .namespace(ns)
        .shared_backend(h.backend().await)
        .jitter(0.0))
    .build()
    .expect("valid options")
}

fn unique_ns(name: &str) -> String {
    format!(
        "{name}-{}",
        LeaseToken::random().as_str().get(..8).unwrap_or("x")
    )
}

/// Whether someone holds the key's lease right now (probe by acquiring with
/// a throwaway token, releasing it again if we got it).
pub async fn lease_held(backend: &dyn Backend, keys: &FillKeys) -> bool {
    let probe = LeaseToken::random();
    match backend
        .acquire(keys, &probe, Duration::from_secs(5), Duration::MAX)
        .await
        .expect("acquire")
    {
        Acquired::Held { .. } => true,
        Acquired::Won { .. } => {
            backend.release(keys, &probe, None).await.expect("release");
            false
        }
        Acquired::Fresh(_) => unreachable!("window MAX is never fresh"),
    }
}

/// Runs `n` callers of `get_or_load` released together behind a barrier,
/// spread round-robin over `caches`.
async fn herd(
    caches: &[Cache<String, String>],
    n: usize,
    key: &str,
    origin: &Origin,
    took: Duration,
    options: CallOptions,
) -> Vec<Result<onefill::Fetched<String>, Error>> {
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let cache = caches[i % caches.len()].clone();
        let barrier = barrier.clone();
        let loader = origin.loader(took);
        let key = key.to_owned();
        let options = options.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            cache.fetch(&key, &options, loader).await
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("caller task"));
    }
    out
}

fn all_ok_with(results: &[Result<onefill::Fetched<String>, Error>], value: &str) {
    for r in results {
        match r {
            Ok(f) => assert_eq!(f.value, value),
            Err(e) => panic!("caller failed: {e}"),
        }
    }
}

/// Starts a call for key `k` in the background and returns once its loader
/// runs (so the lease is taken).
async fn start_slow_load(
    c: &Cache<String, String>,
    origin: &Origin,
    took: Duration,
) -> tokio::task::JoinHandle<Result<onefill::Fetched<String>, Error>> {
    let before = origin.count();
    let task = {
        let c = c.clone();
        let loader = origin.loader(took);
        tokio::spawn(async move { c.fetch(&"k".to_string(), &CallOptions::new(), loader).await })
    };
    eventually(Duration::from_secs(5), || origin.count() > before).await;
    task
}

// ---------------------------------------------------------------- scenarios

/// 1,000 tasks on one cold key in one process: exactly one loader call.
pub async fn herd_in_process(h: &dyn Harness) {
    let c = cache(h, &unique_ns("herd")).await;
    let origin = Origin::default();
    let results = herd(
        std::slice::from_ref(&c),
        1000,
        "hot",
        &origin,
        Duration::from_millis(200),
        CallOptions::new(),
    )
    .await;
    assert_eq!(origin.count(), 1, "one load for 1000 callers");
    all_ok_with(&results, "hot-v1");
    let stats = c.stats();
    assert_eq!(stats.loads_ok, 1);
    assert_eq!(stats.lease_acquired, 1);
    let led = results
        .iter()
        .filter(|r| !r.as_ref().unwrap().coalesced)
        .count();
    assert!(led >= 1);
    assert_eq!(stats.coalesced as usize, 1000 - led, "all others coalesced");
}

/// 8 independent caches (pods) × 100 callers sharing one store: one load.
pub async fn herd_across_pods(h: &dyn Harness) {
    let ns = unique_ns("pods");
    let mut caches = Vec::new();
    for _ in 0..8 {
        caches.push(cache(h, &ns).await);
    }
    let origin = Origin::default();
    let results = herd(
        &caches,
        800,
        "hot",
        &origin,
        Duration::from_millis(200),
        CallOptions::new(),
    )
    .await;
    assert_eq!(origin.count(), 1, "one load for 8 pods × 100 callers");
    all_ok_with(&results, "hot-v1");
    let loaded = results
        .iter()
        .filter(|r| r.as_ref().unwrap().outcome == Outcome::Loaded)
        .count();
    let waited = results
        .iter()
        .filter(|r| r.as_ref().unwrap().outcome == Outcome::Waited)
        .count();
    assert_eq!(loaded, 100, "the winning pod's 100 callers got Loaded");
    assert_eq!(
        loaded
            + waited
            + results
                .iter()
                .filter(|r| r.as_ref().unwrap().outcome == Outcome::Hit)
                .count(),
        800
    );
    let acquired: u64 = caches.iter().map(|c| c.stats().lease_acquired).sum();
    assert_eq!(acquired, 1);
}

/// A loader three times slower than the lease TTL still gives exactly one
/// load: the watchdog keeps the lease alive.
pub async fn watchdog_holds_a_slow_load(h: &dyn Harness) {
    let ns = unique_ns("watchdog");
    let lease = Duration::from_millis(300);
    let mut caches = Vec::new();
    for _ in 0..3 {
        caches.push(
            cache_with(h, &ns, |b| {
                b.lease_ttl(LeaseTtl::Fixed(lease))
                    .wait(WaitPolicy::default().deadline(Duration::from_secs(30)))
            })
            .await,
        );
    }
    let origin = Origin::default();
    let results = herd(&caches, 30, "slow", &origin, lease * 4, CallOptions::new()).await;
    assert_eq!(origin.count(), 1, "the watchdog kept the lease");
    all_ok_with(&results, "slow-v1");
    let extended: u64 = caches.iter().map(|c| c.stats().lease_extended).sum();
    assert!(
        extended >= 3,
        "renewed every third of the TTL, got {extended}"
    );
    let lost: u64 = caches.iter().map(|c| c.stats().lease_lost).sum();
    assert_eq!(lost, 0);
    // The watchdog stopped with the load: the lease is gone, not extended forever.
    let keys = FillKeys::new(&ns, "slow");
    assert!(!lease_held(&*h.backend().await, &keys).await);
}

/// A holder that died mid-load (its lease planted, never extended nor
/// released) is taken over by a waiter within the lease TTL plus one poll.
pub async fn dead_holder_is_taken_over(h: &dyn Harness) {
    let ns = unique_ns("dead");
    let backend = h.backend().await;
    let keys = FillKeys::new(&ns, "k");
    let lease = Duration::from_millis(800);
    let dead = LeaseToken::random();
    assert!(matches!(
        backend
            .acquire(&keys, &dead, lease, Duration::ZERO)
            .await
            .unwrap(),
        Acquired::Won { .. }
    ));
    let start = Instant::now();
    let c = cache(h, &ns).await;
    let origin = Origin::default();
    let results = herd(
        std::slice::from_ref(&c),
        20,
        "k",
        &origin,
        Duration::from_millis(50),
        CallOptions::new(),
    )
    .await;
    assert_eq!(origin.count(), 1);
    all_ok_with(&results, "k-v1");
    assert!(results
        .iter()
        .all(|r| r.as_ref().unwrap().outcome == Outcome::Loaded));
    assert_eq!(c.stats().waits, 1, "one flight waited, then took over");
    if h.paused() {
        let poll_max = WaitPolicy::default().poll_max;
        let took = start.elapsed();
        assert!(
            took <= lease + poll_max + Duration::from_millis(50) + Duration::from_millis(10),
            "took over after {took:?}"
        );
        assert!(took >= lease, "not before the dead lease expired: {took:?}");
    }
}

/// Release and extend are compare-and-X: a wrong token changes nothing.
pub async fn wrong_token_cannot_release_or_extend(h: &dyn Harness) {
    let backend = h.backend().await;
    let keys = FillKeys::new(&unique_ns("token"), "k");
    let mine = LeaseToken::random();
    let theirs = LeaseToken::random();
    let ttl = Duration::from_secs(10);
    assert!(matches!(
        backend
            .acquire(&keys, &mine, ttl, Duration::ZERO)
            .await
            .unwrap(),
        Acquired::Won { stale: None }
    ));
    assert!(!backend.release(&keys, &theirs, None).await.unwrap());
    assert!(!backend.extend(&keys, &theirs, ttl).await.unwrap());
    assert!(!backend.fill(&keys, &theirs, b"x", ttl).await.unwrap());
    assert!(
        backend.get(&keys).await.unwrap().is_none(),
        "a foreign fill wrote nothing"
    );
    match backend
        .acquire(&keys, &theirs, ttl, Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Held { lease_ttl, .. } => {
            assert!(lease_ttl <= ttl && lease_ttl > Duration::from_secs(5))
        }
        other => panic!("lease should still be held: {other:?}"),
    }
    assert!(backend.release(&keys, &mine, None).await.unwrap());
    assert!(!lease_held(&*backend, &keys).await);
}

/// Waiters in another pod return as soon as the fill lands (woken by the
/// notification), not at their next poll tick: with polls set 20 s apart,
/// a waiter that returns at all within the test was notified.
pub async fn waiters_wake_on_fill_notification(h: &dyn Harness) {
    let ns = unique_ns("notify");
    let slow_polls = WaitPolicy::default()
        .polling(Duration::from_secs(20), Duration::from_secs(20))
        .deadline(Duration::from_secs(60));
    let holder = cache(h, &ns).await;
    let waiter = cache_with(h, &ns, |b| b.wait(slow_polls)).await;
    let origin = Origin::default();
    let load = Duration::from_millis(500);
    // Let the holder take the lease first.
    let h1 = start_slow_load(&holder, &origin, load).await;
    let started = Instant::now();
    let waited = waiter
        .fetch(&"k".to_string(), &CallOptions::new(), origin.loader(load))
        .await
        .expect("waiter answered");
    let elapsed = started.elapsed();
    let held = h1.await.unwrap().unwrap();
    assert_eq!(held.outcome, Outcome::Loaded);
    assert_eq!(waited.outcome, Outcome::Waited);
    assert_eq!(waited.value, "k-v1");
    assert_eq!(origin.count(), 1);
    let s = waiter.stats();
    assert_eq!(s.wait_polls, 0, "no poll tick was needed");
    assert!(s.wait_notified >= 1);
    assert!(
        elapsed < Duration::from_secs(20),
        "well before the first poll: {elapsed:?}"
    );
    if h.paused() {
        assert!(elapsed <= load, "returned at the fill: {elapsed:?}");
    }
}

/// The configured outcome at the wait deadline, for each policy, when the
/// holder never fills.
pub async fn deadline_outcomes(h: &dyn Harness) {
    let cases = [
        (OnWaitTimeout::Error, None),
        (OnWaitTimeout::StaleOrError, None),
        (OnWaitTimeout::Load, Some(Outcome::Degraded)),
        (OnWaitTimeout::StaleOrLoad, Some(Outcome::Degraded)),
    ];
    for (policy, expected) in cases {
        let ns = unique_ns("deadline");
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        // A live holder that never fills (a long lease).
        backend
            .acquire(
                &keys,
                &LeaseToken::random(),
                Duration::from_secs(60),
                Duration::ZERO,
            )
            .await
            .unwrap();
        let deadline = Duration::from_millis(700);
        let mut pods = Vec::new();
        for _ in 0..3 {
            pods.push(
                cache_with(h, &ns, |b| {
                    b.wait(WaitPolicy::default().deadline(deadline).on_timeout(policy))
                })
                .await,
            );
        }
        let origin = Origin::default();
        let start = Instant::now();
        let results = herd(
            &pods,
            30,
            "k",
            &origin,
            Duration::from_millis(10),
            CallOptions::new(),
        )
        .await;
        match expected {
            None => {
                assert_eq!(origin.count(), 0, "{policy:?}: no load");
                for r in &results {
                    assert!(
                        matches!(r, Err(Error::WaitTimedOut(d)) if *d == deadline),
                        "{policy:?}: {r:?}"
                    );
                }
            }
            Some(outcome) => {
                assert_eq!(origin.count(), 3, "{policy:?}: one degraded load per pod");
                for r in &results {
                    assert_eq!(r.as_ref().unwrap().outcome, outcome, "{policy:?}");
                }
                let degraded: u64 = pods.iter().map(|p| p.stats().degraded_loads).sum();
                assert_eq!(degraded, 3);
            }
        }
        let timeouts: u64 = pods.iter().map(|p| p.stats().wait_timeouts).sum();
        assert_eq!(timeouts, 3, "{policy:?}: one timed-out wait per pod");
        if h.paused() {
            let took = start.elapsed();
            assert!(
                took >= deadline && took <= deadline + Duration::from_millis(100),
                "{took:?}"
            );
        }
        // The degraded loads did not write: the live holder's fill wins later.
        assert!(backend.get(&keys).await.unwrap().is_none());
    }
}

/// Defaults: a 6 s loader (longer than the default lease floor, shorter than
/// the wait deadline) across 4 pods × 50 callers is one load.
pub async fn six_second_loader_with_defaults(h: &dyn Harness) {
    let ns = unique_ns("six");
    let mut pods = Vec::new();
    for _ in 0..4 {
        pods.push(
            Cache::<String, String>::builder()
                .namespace(&ns)
                .shared_backend(h.backend().await)
                .build()
                .unwrap(),
        );
    }
    let origin = Origin::default();
    let results = herd(
        &pods,
        200,
        "k",
        &origin,
        Duration::from_secs(6),
        CallOptions::new(),
    )
    .await;
    assert_eq!(origin.count(), 1);
    all_ok_with(&results, "k-v1");
    let timeouts: u64 = pods.iter().map(|p| p.stats().wait_timeouts).sum();
    assert_eq!(timeouts, 0);
}

/// A failing loader: every coalesced caller gets the loader's own error
/// (downcastable), one call, and the lease is released.
pub async fn loader_error_reaches_every_caller(h: &dyn Harness) {
    let ns = unique_ns("err");
    let c = cache(h, &ns).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(50));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (c, calls, barrier) = (c.clone(), calls.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            c.get_or_load(&"k".to_string(), move |_| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err::<String, _>(OriginError("db down".into()))
            })
            .await
        }));
    }
    for t in tasks {
        let err = t.await.unwrap().unwrap_err();
        assert!(err.is_loader());
        let original = err.loader_error::<OriginError>().expect("typed error");
        assert_eq!(original.0, "db down");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(c.stats().loads_error, 1);
    let backend = h.backend().await;
    let keys = FillKeys::new(&ns, "k");
    assert!(!lease_held(&*backend, &keys).await, "released on error");
    assert!(
        backend.get(&keys).await.unwrap().is_none(),
        "nothing cached without negative_ttl"
    );
}

/// A panicking loader: every waiter gets an error, none hangs, the lease is
/// released.
pub async fn loader_panic_releases_everyone(h: &dyn Harness) {
    let ns = unique_ns("panic");
    let c = cache(h, &ns).await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.get_or_load(&"k".to_string(), |_| async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if true {
                    panic!("loader bug");
                }
                Ok::<String, OriginError>(String::new())
            })
            .await
        }));
    }
    for t in tasks {
        match t.await.unwrap() {
            Err(Error::LoaderPanicked(msg)) => assert!(msg.contains("loader bug")),
            other => panic!("expected LoaderPanicked, got {other:?}"),
        }
    }
    let keys = FillKeys::new(&ns, "k");
    assert!(!lease_held(&*h.backend().await, &keys).await);
}

/// Cancelling the caller whose loader runs cancels neither the load nor the
/// lease: the other callers get the value, and it is stored.
pub async fn cancelling_the_leader_strands_nobody(h: &dyn Harness) {
    let ns = unique_ns("cancel");
    let c = cache(h, &ns).await;
    let origin = Origin::default();
    let leader = start_slow_load(&c, &origin, Duration::from_millis(300)).await;
    let follower = {
        let c = c.clone();
        let loader = origin.loader(Duration::from_millis(300));
        tokio::spawn(async move { c.fetch(&"k".to_string(), &CallOptions::new(), loader).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    leader.abort();
    let got = follower.await.unwrap().unwrap();
    assert_eq!(got.value, "k-v1");
    assert!(got.coalesced);
    assert_eq!(origin.count(), 1);
    let again = c
        .fetch(
            &"k".to_string(),
            &CallOptions::new(),
            origin.loader(Duration::ZERO),
        )
        .await
        .unwrap();
    assert_eq!(
        again.outcome,
        Outcome::Hit,
        "the cancelled leader's load was stored"
    );
}

/// A loader that hangs is aborted at the maximum load time, its lease
/// released, its callers answered.
pub async fn hung_loader_is_bounded(h: &dyn Harness) {
    let ns = unique_ns("hung");
    let max = Duration::from_millis(600);
    let c = cache_with(h, &ns, |b| b.max_load_time(max)).await;
    let start = Instant::now();
    let err = c
        .get_or_load(&"k".to_string(), |_| async {
            std::future::pending::<()>().await;
            Ok::<String, OriginError>(String::new())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LoadTimedOut(d) if d == max), "{err:?}");
    assert!(err.is_timeout());
    if h.paused() {
        assert_eq!(start.elapsed(), max);
    }
    assert!(!lease_held(&*h.backend().await, &FillKeys::new(&ns, "k")).await);
}

/// The adaptive lease TTL follows measured load times.
pub async fn adaptive_lease_ttl_follows_load_times(h: &dyn Harness) {
    let ns = unique_ns("adaptive");
    let policy = LeaseTtl::Adaptive {
        factor: 3.0,
        floor: Duration::from_millis(100),
        ceiling: Duration::from_secs(30),
    };
    let c = cache_with(h, &ns, |b| b.lease_ttl(policy)).await;
    let origin = Origin::default();
    for i in 0..3 {
        c.get_or_load(
            &format!("warm{i}"),
            origin.loader(Duration::from_millis(400)),
        )
        .await
        .unwrap();
    }
    // Now p99 ≈ 400 ms: the next lease should be ≈ 1.2 s. Observe it from
    // outside while the next load runs.
    let backend = h.backend().await;
    let c2 = c.clone();
    let loader = origin.loader(Duration::from_millis(400));
    let task = tokio::spawn(async move { c2.get_or_load(&"probe".to_string(), loader).await });
    while origin.count() < 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let keys = FillKeys::new(&ns, "probe");
    match backend
        .acquire(
            &keys,
            &LeaseToken::random(),
            Duration::from_secs(1),
            Duration::MAX,
        )
        .await
        .unwrap()
    {
        Acquired::Held { lease_ttl, .. } => {
            assert!(
                lease_ttl > Duration::from_millis(900) && lease_ttl <= Duration::from_millis(1300),
                "lease ttl {lease_ttl:?} should be ≈ 3 × 400 ms"
            );
        }
        other => panic!("expected the probe to find the lease: {other:?}"),
    }
    task.await.unwrap().unwrap();
}

/// Counters tell the story of a herd and a hit.
pub async fn stats_count_what_happened(h: &dyn Harness) {
    let c = cache(h, &unique_ns("stats")).await;
    let origin = Origin::default();
    herd(
        std::slice::from_ref(&c),
        10,
        "k",
        &origin,
        Duration::from_millis(50),
        CallOptions::new(),
    )
    .await;
    c.get_or_load(&"k".to_string(), origin.loader(Duration::ZERO))
        .await
        .unwrap();
    let s = c.stats();
    assert_eq!(s.loads_ok, 1);
    assert_eq!(s.loads_error, 0);
    assert_eq!(s.misses, 1);
    assert_eq!(s.hits, 1);
    assert_eq!(s.lease_acquired, 1);
    assert_eq!(s.lease_contended, 0);
    assert_eq!(s.coalesced, 9);
    assert_eq!(s.waits, 0);
}

/// Bytes that are not our envelope (or not our type) are a counted miss and
/// are overwritten by the next fill; never an error.
pub async fn undecodable_value_is_a_miss(h: &dyn Harness) {
    let ns = unique_ns("corrupt");
    let backend = h.backend().await;
    let keys = FillKeys::new(&ns, "k");
    let c = cache(h, &ns).await;
    let origin = Origin::default();
    for garbage in [&b"\xff\x00garbage"[..], &b""[..]] {
        backend
            .set(&keys, garbage, Duration::from_secs(60))
            .await
            .unwrap();
        let got = c
            .fetch(
                &"k".to_string(),
                &CallOptions::new(),
                origin.loader(Duration::ZERO),
            )
            .await
            .unwrap();
        assert_eq!(got.outcome, Outcome::Loaded);
    }
    // A valid envelope whose payload is another type (a deploy changed V):
    // fresh on the server, unreadable here; it must not block the lease.
    let other: Cache<String, Vec<u64>> = Cache::builder()
        .namespace(&ns)
        .shared_backend(h.backend().await)
        .build()
        .unwrap();
    other.set(&"k".to_string(), vec![1, 2, 3]).await.unwrap();
    let got = c
        .fetch(
            &"k".to_string(),
            &CallOptions::new(),
            origin.loader(Duration::ZERO),
        )
        .await
        .unwrap();
    assert_eq!(got.outcome, Outcome::Loaded);
    assert_eq!(origin.count(), 3);
    assert_eq!(c.stats().decode_errors, 3);
    // ...and the fill replaced it.
    let hit = c
        .fetch(
            &"k".to_string(),
            &CallOptions::new(),
            origin.loader(Duration::ZERO),
        )
        .await
        .unwrap();
    assert_eq!(hit.outcome, Outcome::Hit);
    assert_eq!(hit.value, "k-v3");
}

/// `invalidate` during a slow load: its callers get the value, but it is
/// not stored (the fill is fenced out) and the lease loss is counted.
pub async fn invalidate_fences_a_fill_in_flight(h: &dyn Harness) {
    let ns = unique_ns("fence");
    let c = cache(h, &ns).await;
    let origin = Origin::default();
    let task = start_slow_load(&c, &origin, Duration::from_millis(500)).await;
    c.invalidate(&"k".to_string()).await.unwrap();
    assert_eq!(task.await.unwrap().unwrap().value, "k-v1");
    let keys = FillKeys::new(&ns, "k");
    assert!(
        h.backend().await.get(&keys).await.unwrap().is_none(),
        "fenced out"
    );
    assert_eq!(c.stats().lease_lost, 1);
}

// ------------------------------------------------- freshness and failure

/// Polls (virtual or real time) until `cond` holds, up to `limit`.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "condition not reached within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn pods_with(
    h: &dyn Harness,
    ns: &str,
    n: usize,
    f: impl Fn(onefill::CacheBuilder<String, String>) -> onefill::CacheBuilder<String, String>,
) -> Vec<Cache<String, String>> {
    let mut pods = Vec::new();
    for _ in 0..n {
        pods.push(cache_with(h, ns, &f).await);
    }
    pods
}

/// In the grace window every caller gets the stale value at once, and one
/// background refresh runs fleet-wide.
pub async fn stale_while_refresh_runs_once(h: &dyn Harness) {
    let ns = unique_ns("swr");
    let pods = pods_with(h, &ns, 3, |b| {
        b.ttl(Duration::from_secs(1))
            .grace(Duration::from_secs(10))
            .early_refresh_beta(0.0)
    })
    .await;
    let origin = Origin::default();
    let key = "k".to_string();
    let first = pods[0]
        .fetch(
            &key,
            &CallOptions::new(),
            origin.loader(Duration::from_millis(100)),
        )
        .await
        .unwrap();
    assert_eq!(first.outcome, Outcome::Loaded);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let results = herd(
        &pods,
        60,
        "k",
        &origin,
        Duration::from_millis(300),
        CallOptions::new(),
    )
    .await;
    for r in &results {
        let f = r.as_ref().unwrap();
        assert_eq!(
            (f.outcome, f.value.as_str()),
            (Outcome::Stale, "k-v1"),
            "no caller waits for the refresh"
        );
    }
    eventually(Duration::from_secs(5), || origin.count() == 2).await;
    let backend = h.backend().await;
    let keys = FillKeys::new(&ns, "k");
    // Wait for the refresh's fill to land, then everyone hits the new value.
    let start = Instant::now();
    loop {
        let f = pods[1]
            .fetch(&key, &CallOptions::new(), origin.loader(Duration::ZERO))
            .await
            .unwrap();
        if f.outcome == Outcome::Hit {
            assert_eq!(f.value, "k-v2");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(origin.count(), 2, "exactly one refresh across 3 pods");
    assert!(!lease_held(&*backend, &keys).await);
    let refreshes: u64 = pods.iter().map(|p| p.stats().background_refreshes).sum();
    assert!(refreshes >= 1);
}

/// XFetch refreshes a hot key before it expires, once fleet-wide, and no
/// caller ever sees a miss. With `beta = 0` it never does.
pub async fn early_refresh_before_expiry(h: &dyn Harness) {
    for beta in [100.0, 0.0] {
        let ns = unique_ns("xfetch");
        let pods = pods_with(h, &ns, 3, |b| {
            b.ttl(Duration::from_secs(2)).early_refresh_beta(beta)
        })
        .await;
        let origin = Origin::default();
        let key = "k".to_string();
        pods[0]
            .get_or_load(&key, origin.loader(Duration::from_millis(100)))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let results = herd(
            &pods,
            30,
            "k",
            &origin,
            Duration::from_millis(100),
            CallOptions::new(),
        )
        .await;
        assert!(
            results
                .iter()
                .all(|r| r.as_ref().unwrap().outcome == Outcome::Hit),
            "beta {beta}"
        );
        if beta > 0.0 {
            // delta 100 ms × beta 100: the draw covers the remaining second
            // with probability ≈ 0.9 per call; 30 calls make it certain.
            eventually(Duration::from_secs(3), || origin.count() == 2).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(origin.count(), 2, "one early refresh fleet-wide");
            let early: u64 = pods.iter().map(|p| p.stats().early_refreshes).sum();
            assert!(early >= 1);
            // The refreshed value is fresh again past the old expiry.
            tokio::time::sleep(Duration::from_millis(1200)).await;
            let f = pods[2]
                .fetch(
                    &key,
                    &CallOptions::new().early_refresh_beta(0.0),
                    origin.loader(Duration::ZERO),
                )
                .await
                .unwrap();
            assert_eq!((f.outcome, f.value.as_str()), (Outcome::Hit, "k-v2"));
        } else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert_eq!(origin.count(), 1, "beta 0: no early refresh");
        }
        let misses: u64 = pods.iter().map(|p| p.stats().misses).sum();
        assert_eq!(misses, 1, "only the cold miss");
    }
}

/// A failing origin is remembered for `negative_ttl`: later callers, in any
/// pod, get the cached failure without calling it; after the TTL it is
/// called again.
pub async fn negative_caching_spares_a_failing_origin(h: &dyn Harness) {
    let ns = unique_ns("negative");
    let pods = pods_with(h, &ns, 2, |b| b.negative_ttl(Duration::from_secs(1))).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let key = "k".to_string();
    let err = pods[0]
        .get_or_load(&key, failing_loader(&calls))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Loader(_)));
    for pod in &pods {
        let err = pod
            .get_or_load(&key, failing_loader(&calls))
            .await
            .unwrap_err();
        match err {
            Error::CachedFailure(msg) => assert!(msg.contains("db down"), "{msg}"),
            other => panic!("expected a cached failure, got {other:?}"),
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let negative: u64 = pods.iter().map(|p| p.stats().negative_hits).sum();
    assert_eq!(negative, 2);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let err = pods[1]
        .get_or_load(&key, failing_loader(&calls))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Loader(_)));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "called again after negative_ttl"
    );
}

/// The optional variant caches a key's absence.
pub async fn absence_is_cached(h: &dyn Harness) {
    let ns = unique_ns("absent");
    let c = cache(h, &ns).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let key = "missing".to_string();
    for _ in 0..3 {
        let calls = calls.clone();
        let found = c
            .get_or_load_optional(&key, move |_| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<Option<String>, OriginError>(None)
            })
            .await
            .unwrap();
        assert_eq!(found, None);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let err = c
        .get_or_load(&key, Origin::default().loader(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound));
}

/// Fail-safe: the loader fails while a stale value exists: callers get the
/// stale value, and the origin is not retried until the throttle passes.
pub async fn fail_safe_serves_stale_and_throttles(h: &dyn Harness) {
    let ns = unique_ns("failsafe");
    let c = cache_with(h, &ns, |b| {
        b.ttl(Duration::from_secs(1))
            .grace(Duration::from_secs(30))
            .early_refresh_beta(0.0)
            .fail_safe_throttle(Duration::from_secs(2))
    })
    .await;
    let key = "k".to_string();
    let good = Origin::default();
    c.get_or_load(&key, good.loader(Duration::ZERO))
        .await
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let f = c
        .fetch(&key, &CallOptions::new(), failing_loader(&calls))
        .await
        .unwrap();
    assert_eq!((f.outcome, f.value.as_str()), (Outcome::Stale, "k-v1"));
    eventually(Duration::from_secs(3), || calls.load(Ordering::SeqCst) == 1).await;
    // The failed refresh re-stored the stale value for the throttle period:
    // callers hit it and the origin is left alone.
    let start = Instant::now();
    loop {
        let f = c
            .fetch(&key, &CallOptions::new(), failing_loader(&calls))
            .await
            .unwrap();
        assert_eq!(f.value, "k-v1");
        if f.outcome == Outcome::Hit {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "throttle entry not written"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..5 {
        let f = c
            .fetch(&key, &CallOptions::new(), failing_loader(&calls))
            .await
            .unwrap();
        assert_eq!(f.value, "k-v1");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "throttled");
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let f = c
        .fetch(&key, &CallOptions::new(), failing_loader(&calls))
        .await
        .unwrap();
    assert_eq!((f.outcome, f.value.as_str()), (Outcome::Stale, "k-v1"));
    eventually(Duration::from_secs(3), || calls.load(Ordering::SeqCst) == 2).await;
    assert!(c.stats().stale_served >= 2);
}

/// Jitter spreads the TTLs written for keys filled together.
pub async fn jitter_spreads_expiry(h: &dyn Harness) {
    let ns = unique_ns("jitter");
    let c = cache_with(h, &ns, |b| b.ttl(Duration::from_secs(100)).jitter(0.2)).await;
    let origin = Origin::default();
    let backend = h.backend().await;
    let mut ttls = Vec::new();
    for i in 0..30 {
        let key = format!("k{i}");
        c.get_or_load(&key, origin.loader(Duration::ZERO))
            .await
            .unwrap();
        let stored = backend
            .get(&FillKeys::new(&ns, &key))
            .await
            .unwrap()
            .unwrap();
        ttls.push(stored.ttl);
    }
    let min = *ttls.iter().min().unwrap();
    let max = *ttls.iter().max().unwrap();
    assert!(
        min >= Duration::from_secs(79) && max <= Duration::from_secs(120),
        "{min:?}..{max:?}"
    );
    assert!(
        max - min >= Duration::from_secs(10),
        "spread {min:?}..{max:?}"
    );
}

/// `set` during a slow load: the load's callers get its value, the stored
/// value is the one that was set.
pub async fn set_fences_a_fill_in_flight(h: &dyn Harness) {
    let ns = unique_ns("setfence");
    let c = cache(h, &ns).await;
    let origin = Origin::default();
    let key = "k".to_string();
    let task = start_slow_load(&c, &origin, Duration::from_millis(400)).await;
    c.set(&key, "manual".to_string()).await.unwrap();
    assert_eq!(task.await.unwrap().unwrap().value, "k-v1");
    assert_eq!(c.get(&key).await.unwrap().as_deref(), Some("manual"));
    assert_eq!(c.stats().lease_lost, 1);
}

/// A value over the size limit is a clear error; nothing is written and the
/// lease is released.
pub async fn oversize_value_writes_nothing(h: &dyn Harness) {
    let ns = unique_ns("oversize");
    let c = cache_with(h, &ns, |b| b.max_value_bytes(64)).await;
    let err = c
        .get_or_load(&"k".to_string(), |_| async {
            Ok::<_, OriginError>("x".repeat(100))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(onefill::InputError::ValueTooLarge { max: 64, .. })
        ),
        "{err}"
    );
    let backend = h.backend().await;
    let keys = FillKeys::new(&ns, "k");
    assert!(backend.get(&keys).await.unwrap().is_none());
    assert!(!lease_held(&*backend, &keys).await);
    assert!(c
        .set(&"k".to_string(), "y".repeat(100))
        .await
        .unwrap_err()
        .is_invalid_input());
    assert!(backend.get(&keys).await.unwrap().is_none());
}

/// Instantiates every scenario as a `#[tokio::test]` with the given harness
/// constructor and runtime flavour.
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr, $attr:meta) => {
        $crate::conformance_suite!(@each $make, $attr,
            herd_in_process, herd_across_pods, watchdog_holds_a_slow_load,
            dead_holder_is_taken_over, wrong_token_cannot_release_or_extend,
            waiters_wake_on_fill_notification, deadline_outcomes,
            six_second_loader_with_defaults, loader_error_reaches_every_caller,
            loader_panic_releases_everyone, cancelling_the_leader_strands_nobody,
            hung_loader_is_bounded, adaptive_lease_ttl_follows_load_times,
            stats_count_what_happened, undecodable_value_is_a_miss,
            invalidate_fences_a_fill_in_flight, stale_while_refresh_runs_once,
            early_refresh_before_expiry, negative_caching_spares_a_failing_origin,
            absence_is_cached, fail_safe_serves_stale_and_throttles,
            jitter_spreads_expiry, set_fences_a_fill_in_flight, oversize_value_writes_nothing
        );
    };
    (@each $make:expr, $attr:meta, $($name:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $name() {
                let harness = $make.await;
                $crate::conformance::$name(&harness).await;
            }
        )*
    };
}
