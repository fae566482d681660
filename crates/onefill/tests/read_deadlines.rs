//! A value's deadlines in this process (its L1 entry, the outage
//! fallback's copy) count from when the read began, not from its reply:
//! the TTL is read after the request reached the server, so a deadline
//! counted from the reply outlives the server's copy by the reply's
//! latency (review of issue 9's second pass; the hit, a restarted flight
//! and a batch each did). And a half-open probe frees its slot however
//! its read ends (the backend's future is made after the breaker admits
//! the call).
//!
//! Paused time and a `MemoryBackend` whose replies can be held back.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use onefill::backend::{Acquired, Backend, ChangeListener, FillKeys, FillSubscription, Stored};
use onefill::testing::{BoxFuture, OriginError};
use onefill::{
    BackendError, BackendErrorKind, Cache, CacheBuilder, CallOptions, CircuitBreaker, Error,
    Fetched, LeaseToken, MemoryBackend, Outcome, L1,
};
use tokio::sync::Semaphore;

const OPEN: u8 = 0;
/// The read is made, then its reply waits at the gate (response latency).
const GATED: u8 = 1;
const REFUSE: u8 = 2;
const PANIC: u8 = 4;

#[derive(Debug, Clone)]
struct Wire {
    inner: MemoryBackend,
    mode: Arc<AtomicU8>,
    gate: Arc<Semaphore>,
    gets: Arc<AtomicUsize>,
    /// Request latency: the read is made this long after `get` is called.
    request_delay_ms: Arc<AtomicU64>,
}

impl Default for Wire {
    fn default() -> Self {
        Wire {
            inner: MemoryBackend::new(),
            mode: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
            gets: Arc::default(),
            request_delay_ms: Arc::default(),
        }
    }
}

impl Wire {
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
    fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Backend for Wire {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        match self.mode.load(Ordering::SeqCst) {
            REFUSE => {
                return Err(BackendError::new(
                    BackendErrorKind::Connection,
                    "connection refused",
                ))
            }
            PANIC => panic!("backend get panicked"),
            _ => {}
        }
        let delay = self.request_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let read = self.inner.get(keys).await;
        if self.mode.load(Ordering::SeqCst) == GATED {
            self.gate.acquire().await.unwrap().forget();
        }
        read
    }
    async fn acquire(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        ttl: Duration,
        w: Duration,
    ) -> Result<Acquired, BackendError> {
        self.inner.acquire(k, t, ttl, w).await
    }
    async fn fill(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        b: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.inner.fill(k, t, b, ttl).await
    }
    async fn release(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        e: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        self.inner.release(k, t, e).await
    }
    async fn extend(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.inner.extend(k, t, ttl).await
    }
    async fn set(&self, k: &FillKeys, b: &[u8], ttl: Duration) -> Result<(), BackendError> {
        self.inner.set(k, b, ttl).await
    }
    async fn invalidate(&self, k: &FillKeys) -> Result<(), BackendError> {
        self.inner.invalidate(k).await
    }
    async fn subscribe(&self, k: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        self.inner.subscribe(k).await
    }
    fn track_changes(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: Weak<dyn ChangeListener>,
    ) -> Result<(), BackendError> {
        self.inner.track_changes(prefix, confirm_every, listener)
    }
    fn in_process(&self) -> bool {
        false
    }
}

fn base(wire: &Wire) -> CacheBuilder<String, String> {
    Cache::builder()
        .namespace("began")
        .backend(wire.clone())
        .jitter(0.0)
        .early_refresh_beta(0.0)
        .ttl(Duration::from_secs(1))
        .backend_timeout(Duration::from_secs(1))
}

fn counting(
    loads: &Arc<AtomicUsize>,
) -> impl FnOnce(String) -> BoxFuture<Result<String, OriginError>> + Send + 'static {
    let loads = loads.clone();
    move |key| {
        Box::pin(async move {
            let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(format!("{key}-v{n}"))
        })
    }
}

fn spawn_fetch(
    c: &Cache<String, String>,
    loads: &Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Result<Fetched<String>, Error>> {
    let c = c.clone();
    let loader = counting(loads);
    tokio::spawn(async move { c.fetch(&"k".to_owned(), &CallOptions::new(), loader).await })
}

async fn fetch(
    c: &Cache<String, String>,
    loads: &Arc<AtomicUsize>,
) -> Result<Fetched<String>, Error> {
    c.fetch(&"k".to_owned(), &CallOptions::new(), counting(loads))
        .await
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// A hit whose reply is slow (300 ms of response latency): the outage
/// fallback must not serve the value past the server's expiry. Before the
/// change the expiry counted from after the reply (server + 300 ms).
#[tokio::test(start_paused = true)]
async fn a_slow_hit_reply_never_stretches_the_fallback_past_the_server_expiry() {
    let wire = Wire::default();
    let c = base(&wire).no_l1().build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "v".into()).await.unwrap(); // expires at t0 + 1 s
    tokio::time::sleep(Duration::from_millis(500)).await;
    wire.set(GATED);
    let hit = spawn_fetch(&c, &loads);
    settle().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    wire.gate.add_permits(1);
    let hit = hit.await.unwrap().unwrap();
    assert_eq!((hit.value.as_str(), hit.outcome), ("v", Outcome::Hit));
    // t0 + ~1.1 s: gone on the server for ~100 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;
    wire.set(REFUSE);
    let outage = fetch(&c, &loads).await.unwrap();
    assert_eq!(
        (outage.value.as_str(), outage.outcome),
        ("k-v1", Outcome::Degraded),
        "the fallback served a value the server no longer keeps"
    );
}

/// The same with an L1: its entry must not outlive the server's copy.
#[tokio::test(start_paused = true)]
async fn a_slow_hit_reply_never_stretches_the_l1_past_the_server_expiry() {
    let wire = Wire::default();
    let c = base(&wire).l1(L1::new(100)).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "v".into()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    wire.set(GATED);
    let hit = spawn_fetch(&c, &loads);
    settle().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    wire.gate.add_permits(1);
    let hit = hit.await.unwrap().unwrap();
    assert_eq!((hit.value.as_str(), hit.outcome), ("v", Outcome::Hit));
    wire.set(OPEN);
    let l1_before = c.stats().l1_hits;
    tokio::time::sleep(Duration::from_millis(250)).await; // t0 + ~1.05 s
    let after = fetch(&c, &loads).await.unwrap();
    assert_eq!(
        c.stats().l1_hits,
        l1_before,
        "an L1 hit on an expired value: {after:?}"
    );
    assert_eq!(
        (after.value.as_str(), after.outcome),
        ("k-v1", Outcome::Loaded)
    );
}

/// A half-open probe whose read panics frees the probe slot (the permit is
/// dropped while unwinding): the next call probes and closes the breaker.
#[tokio::test(start_paused = true)]
async fn a_probe_that_panics_frees_the_probe_slot() {
    let wire = Wire::default();
    let c = base(&wire)
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(1)))
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "v".into()).await.unwrap();
    wire.set(REFUSE);
    let _ = fetch(&c, &loads).await; // opens the breaker
    tokio::time::sleep(Duration::from_millis(1_100)).await; // half-open
    c.set(&"k".to_owned(), "v2".into()).await.ok();
    wire.set(PANIC);
    let err = fetch(&c, &loads).await.unwrap_err();
    assert!(matches!(err, Error::FlightAbandoned), "{err}");
    wire.set(OPEN);
    let before = wire.gets();
    let _ = fetch(&c, &loads).await;
    assert_eq!(
        wire.gets(),
        before + 1,
        "the next call was not admitted as a probe"
    );
    // Closed again: a plain hit.
    let f = fetch(&c, &loads).await.unwrap();
    assert_eq!(f.outcome, Outcome::Hit);
}

/// A half-open probe whose caller is dropped mid-read frees its slot: the
/// flight restarted in a task probes again (and closes the breaker).
#[tokio::test(start_paused = true)]
async fn a_probe_dropped_mid_read_frees_the_probe_slot() {
    let wire = Wire::default();
    let c = base(&wire)
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(1)))
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    wire.set(REFUSE);
    let _ = fetch(&c, &loads).await; // opens the breaker
    wire.set(OPEN);
    tokio::time::sleep(Duration::from_millis(1_100)).await; // half-open
    c.set(&"k".to_owned(), "v".into()).await.unwrap();
    wire.set(GATED);
    let before = wire.gets();
    let leader = spawn_fetch(&c, &loads);
    settle().await;
    assert_eq!(wire.gets(), before + 1);
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    settle().await;
    assert_eq!(
        wire.gets(),
        before + 2,
        "the restarted flight was not admitted"
    );
    wire.set(OPEN);
    wire.gate.add_permits(1);
    settle().await;
    let f = fetch(&c, &loads).await.unwrap();
    assert_eq!((f.value.as_str(), f.outcome), ("v", Outcome::Hit));
    assert_eq!(
        loads.load(Ordering::SeqCst),
        1,
        "only the degraded load that opened it"
    );
}

/// The flight's own reads (here: a leader dropped mid-read, its flight
/// restarted in a task that reads again) count from before the read too.
/// Regression: the flight counted from after the reply, and the fallback
/// served the value ~100 ms after the server dropped it.
#[tokio::test(start_paused = true)]
async fn a_restarted_flight_with_a_slow_reply_never_stretches_the_fallback() {
    let wire = Wire::default();
    let c = base(&wire).no_l1().build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "v".into()).await.unwrap(); // expires at t0 + 1 s
    tokio::time::sleep(Duration::from_millis(500)).await;
    wire.set(GATED);
    let leader = spawn_fetch(&c, &loads);
    settle().await;
    let follower = spawn_fetch(&c, &loads);
    settle().await;
    leader.abort();
    let _ = leader.await;
    settle().await; // the restarted flight reads (ttl ~500 ms), its reply held
    tokio::time::sleep(Duration::from_millis(300)).await;
    wire.gate.add_permits(1);
    let f = follower.await.unwrap().unwrap();
    assert_eq!((f.value.as_str(), f.outcome), ("v", Outcome::Hit));
    tokio::time::sleep(Duration::from_millis(300)).await; // t0 + ~1.1 s
    wire.set(REFUSE);
    let outage = fetch(&c, &loads).await.unwrap();
    assert_eq!(
        (outage.value.as_str(), outage.outcome),
        ("k-v1", Outcome::Degraded),
        "the fallback served a value the server no longer keeps"
    );
}

/// The same through `get_or_load_many` (a batch reads for many flights and
/// hands each its answer). Regression: the L1 answered a hit ~50 ms after
/// the server dropped the value.
#[tokio::test(start_paused = true)]
async fn a_slow_batch_reply_never_stretches_the_l1_past_the_server_expiry() {
    let wire = Wire::default();
    let c = base(&wire).l1(L1::new(100)).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "v".into()).await.unwrap(); // expires at t0 + 1 s
    tokio::time::sleep(Duration::from_millis(500)).await;
    wire.set(GATED);
    let many = {
        let c = c.clone();
        tokio::spawn(async move {
            c.get_or_load_many(&["k".to_owned()], |ids: Vec<String>| async move {
                Ok::<_, OriginError>(
                    ids.into_iter()
                        .map(|k| (k, "loaded".to_owned()))
                        .collect::<Vec<_>>(),
                )
            })
            .await
        })
    };
    settle().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    wire.gate.add_permits(1);
    let got = many.await.unwrap().unwrap();
    assert_eq!(got["k"], "v");
    wire.set(OPEN);
    tokio::time::sleep(Duration::from_millis(250)).await; // t0 + ~1.05 s
    let l1_before = c.stats().l1_hits;
    let after = fetch(&c, &loads).await.unwrap();
    assert_eq!(
        c.stats().l1_hits,
        l1_before,
        "an L1 hit on a value the server expired: {after:?}"
    );
}
