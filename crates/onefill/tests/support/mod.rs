//! What the memory-backend fault tests share (`mod support;`): a real
//! [`MemoryBackend`] behind switches ([`Switched`]), pods built on it,
//! loaders that count their loads, and the few set-ups and checks several
//! tests repeat. Each test file uses a part of it (hence `dead_code`).
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use onefill::backend::{Acquired, Backend, FillKeys, FillSubscription, Stored};
use onefill::testing::{BoxFuture, Origin, OriginError};
use onefill::{
    BackendError, BackendErrorKind, Cache, CacheBuilder, CallOptions, CircuitBreaker, Error,
    Fetched, LeaseToken, LeaseTtl, MemoryBackend, Outcome,
};
use tokio::task::JoinHandle;

/// Every call runs on the store.
pub const HEALTHY: u8 = 0;
/// Every call hangs (a SIGSTOPped Redis).
pub const HANG: u8 = 1;
/// Every call is refused (a dead Redis).
pub const REFUSE: u8 = 2;
/// Every call fails with a non-transient error (as OOM, NOAUTH, CROSSSLOT).
pub const COMMAND: u8 = 3;
/// `acquire` runs on the store, then its reply is lost (a timeout).
pub const LOSE_ACQUIRE_REPLY: u8 = 4;
/// The first two calls answer, every later one hangs.
pub const HANG_FROM_THIRD: u8 = 5;
/// `set` and `invalidate` run on the store, then their reply never comes
/// (a Redis that executed the command, then stalled or lost the reply).
pub const WRITE_THEN_HANG: u8 = 6;

/// The namespace of every pod.
pub const NS: &str = "faults";

/// What a call is, for the modes that treat some calls apart.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Acquire,
    Write,
    Other,
}

/// A real MemoryBackend behind switches: a mode, a latency (every call runs
/// on the store after [`delay`](Switched::delay)), and lost `fill` requests.
#[derive(Debug, Clone, Default)]
pub struct Switched {
    inner: MemoryBackend,
    mode: Arc<AtomicU8>,
    delay_ms: Arc<AtomicU64>,
    lose_fill: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Switched {
    /// Another process's view of the same store, with its own switches.
    pub fn peer(&self) -> Switched {
        Switched {
            inner: self.inner.clone(),
            ..Switched::default()
        }
    }
    /// Switches to `mode` (one of the constants above).
    pub fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
    /// Every call waits `ms` before it reaches the store (40 ms: a healthy
    /// server in another region).
    pub fn delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
    }
    /// While `lost`, `fill` requests are lost: nothing runs on the store and
    /// the call times out after 10 ms.
    pub fn lose_fill(&self, lost: bool) {
        self.lose_fill.store(lost, Ordering::SeqCst);
    }
    /// How many calls reached this view so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    /// The store itself, past every switch.
    pub fn store(&self) -> &MemoryBackend {
        &self.inner
    }
    /// Runs `call` on the store as the switches say.
    async fn pass<T>(
        &self,
        op: Op,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        match self.mode.load(Ordering::SeqCst) {
            HANG => std::future::pending().await,
            REFUSE => Err(BackendError::new(
                BackendErrorKind::Connection,
                "connection refused",
            )),
            COMMAND => Err(BackendError::new(BackendErrorKind::Command, "OOM")),
            LOSE_ACQUIRE_REPLY if op == Op::Acquire => {
                let _ = call.await;
                Err(BackendError::new(BackendErrorKind::Timeout, "reply lost"))
            }
            HANG_FROM_THIRD if n > 2 => std::future::pending().await,
            WRITE_THEN_HANG if op == Op::Write => {
                let _ = call.await;
                std::future::pending().await
            }
            _ => call.await,
        }
    }
}

#[async_trait]
impl Backend for Switched {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        self.pass(Op::Other, self.inner.get(keys)).await
    }
    async fn acquire(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        ttl: Duration,
        w: Duration,
    ) -> Result<Acquired, BackendError> {
        self.pass(Op::Acquire, self.inner.acquire(k, t, ttl, w))
            .await
    }
    async fn fill(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        b: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        if self.lose_fill.load(Ordering::SeqCst) {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            return Err(BackendError::new(BackendErrorKind::Timeout, "fill lost"));
        }
        self.pass(Op::Other, self.inner.fill(k, t, b, ttl)).await
    }
    async fn release(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        e: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        self.pass(Op::Other, self.inner.release(k, t, e)).await
    }
    async fn extend(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.pass(Op::Other, self.inner.extend(k, t, ttl)).await
    }
    async fn set(&self, k: &FillKeys, b: &[u8], ttl: Duration) -> Result<(), BackendError> {
        self.pass(Op::Write, self.inner.set(k, b, ttl)).await
    }
    async fn invalidate(&self, k: &FillKeys) -> Result<(), BackendError> {
        self.pass(Op::Write, self.inner.invalidate(k)).await
    }
    async fn subscribe(&self, k: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        self.pass(Op::Other, self.inner.subscribe(k)).await
    }
}

/// A pod on `backend`: 200 ms backend timeout, no jitter, no early refresh,
/// then whatever `f` sets.
pub fn pod(
    backend: &Switched,
    f: impl FnOnce(CacheBuilder<String, String>) -> CacheBuilder<String, String>,
) -> Cache<String, String> {
    f(Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .jitter(0.0)
        .early_refresh_beta(0.0)
        .backend_timeout(Duration::from_millis(200)))
    .build()
    .unwrap()
}

/// The key most tests use.
pub fn key() -> String {
    "k".to_string()
}

/// The store's keys of [`key`] in a [`pod`].
pub fn keys() -> FillKeys {
    FillKeys::new(NS, "k")
}

/// A loader that counts its load into `loads`, sleeps `took` (tokio time),
/// then answers `"{key}-v{n}"`, `n` being that count.
pub fn counting_loader(
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> impl FnOnce(String) -> BoxFuture<Result<String, OriginError>> + Send + 'static {
    Origin {
        loads: loads.clone(),
    }
    .loader(took)
}

/// A call with an instant loader counting into `loads`.
pub async fn fetch_now(
    c: &Cache<String, String>,
    key: &str,
    loads: &Arc<AtomicUsize>,
) -> Fetched<String> {
    fetch_loading(c, key, loads, Duration::ZERO).await
}

/// A call with a loader counting into `loads` that takes `took`.
pub async fn fetch_loading(
    c: &Cache<String, String>,
    key: &str,
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> Fetched<String> {
    let loader = counting_loader(loads, took);
    c.fetch(&key.to_owned(), &CallOptions::new(), loader)
        .await
        .unwrap()
}

/// A call on [`key`] in a task of its own, with a loader counting into
/// `loads` that takes `took`: a load under way while the test goes on.
pub fn spawn_fetch(
    c: &Cache<String, String>,
    options: CallOptions,
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> JoinHandle<Result<Fetched<String>, Error>> {
    let c = c.clone();
    let loader = counting_loader(loads, took);
    tokio::spawn(async move { c.fetch(&key(), &options, loader).await })
}

/// Two processes on one store, each with its own switches and its own
/// [`pod`] (adjusted by `f`).
pub fn two_pods(
    f: impl Fn(CacheBuilder<String, String>) -> CacheBuilder<String, String>,
) -> [(Switched, Cache<String, String>); 2] {
    let a = Switched::default();
    let b = a.peer();
    let (pod_a, pod_b) = (pod(&a, &f), pod(&b, &f));
    [(a, pod_a), (b, pod_b)]
}

/// A pod adjustment: leases of a fixed `ttl`.
pub fn fixed_lease(
    ttl: Duration,
) -> impl Fn(CacheBuilder<String, String>) -> CacheBuilder<String, String> + Copy {
    move |b| b.lease_ttl(LeaseTtl::Fixed(ttl))
}

/// A pod adjustment: a circuit breaker opening after `threshold`
/// consecutive failures, for `open_for`.
pub fn breaker(
    threshold: u32,
    open_for: Duration,
) -> impl Fn(CacheBuilder<String, String>) -> CacheBuilder<String, String> + Copy {
    move |b| b.circuit_breaker(CircuitBreaker::new(threshold, open_for))
}

/// Two processes on one store ([`two_pods`]), the first 10 ms into a load
/// of [`key`] that takes `took` (counted into `loads`); its call runs in a
/// task of its own.
pub async fn a_load_under_way(
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> (
    [(Switched, Cache<String, String>); 2],
    JoinHandle<Result<Fetched<String>, Error>>,
) {
    let pods = two_pods(|b| b);
    let call = spawn_fetch(&pods[0].1, CallOptions::new(), loads, took);
    tokio::time::sleep(Duration::from_millis(10)).await;
    (pods, call)
}

/// A holder next to the server loads [`key`] for 2 s; 10 ms later a waiter
/// `delay_ms` away from the server asks for it. Returns the waiter's
/// answer, the holder's, and how many loads ran.
pub async fn a_far_waiter_of_a_long_load(
    delay_ms: u64,
) -> (Fetched<String>, Fetched<String>, usize) {
    let loads = Arc::new(AtomicUsize::new(0));
    let ([_, (far, waiter)], slow) = a_load_under_way(&loads, Duration::from_secs(2)).await;
    far.delay(delay_ms);
    let waited = fetch_now(&waiter, "k", &loads).await;
    let held = slow.await.unwrap().unwrap();
    (waited, held, loads.load(Ordering::SeqCst))
}

/// Makes the backend refuse, then checks that the next call on [`key`]
/// loads afresh (`"k-v2"`, degraded): the outage fallback has nothing for
/// it.
pub async fn assert_the_fallback_forgot(
    backend: &Switched,
    c: &Cache<String, String>,
    loads: &Arc<AtomicUsize>,
    why: &str,
) {
    backend.set(REFUSE);
    let f = fetch_now(c, "k", loads).await;
    assert_eq!(
        (f.value.as_str(), f.outcome),
        ("k-v2", Outcome::Degraded),
        "{why}"
    );
}
