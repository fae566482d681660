//! Backend outages on the memory backend, in paused time: the backend is
//! wrapped so a test can make it hang (like a SIGSTOPped Redis) or refuse
//! (like a dead one). The same behaviour is proven on real Redis by
//! `redis_backend.rs` (a killed, restarted and paused server) and by the
//! CLI's fleet tests (`crates/onefill-cli/tests/fleet.rs`: SIGSTOP and
//! restart of Redis under load, with real processes).

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use onefill::backend::{Acquired, Backend, FillKeys, FillSubscription, Stored};
use onefill::{
    BackendError, BackendErrorKind, Cache, CallOptions, CircuitBreaker, CircuitState, Error,
    LeaseToken, MemoryBackend, Outcome,
};
use tokio::time::Instant;

const HEALTHY: u8 = 0;
const HANG: u8 = 1;
const REFUSE: u8 = 2;

/// A real MemoryBackend behind a switch.
#[derive(Debug, Clone, Default)]
struct Switched {
    inner: MemoryBackend,
    mode: Arc<AtomicU8>,
    calls: Arc<AtomicUsize>,
}

impl Switched {
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
    async fn gate(&self) -> Result<(), BackendError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.mode.load(Ordering::SeqCst) {
            HANG => std::future::pending().await,
            REFUSE => Err(BackendError::new(
                BackendErrorKind::Connection,
                "connection refused",
            )),
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl Backend for Switched {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        self.gate().await?;
        self.inner.get(keys).await
    }
    async fn acquire(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        ttl: Duration,
        w: Duration,
    ) -> Result<Acquired, BackendError> {
        self.gate().await?;
        self.inner.acquire(k, t, ttl, w).await
    }
    async fn fill(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        b: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.gate().await?;
        self.inner.fill(k, t, b, ttl).await
    }
    async fn release(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        e: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        self.gate().await?;
        self.inner.release(k, t, e).await
    }
    async fn extend(
        &self,
        k: &FillKeys,
        t: &LeaseToken,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.gate().await?;
        self.inner.extend(k, t, ttl).await
    }
    async fn set(&self, k: &FillKeys, b: &[u8], ttl: Duration) -> Result<(), BackendError> {
        self.gate().await?;
        self.inner.set(k, b, ttl).await
    }
    async fn invalidate(&self, k: &FillKeys) -> Result<(), BackendError> {
        self.gate().await?;
        self.inner.invalidate(k).await
    }
    async fn subscribe(&self, k: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        self.gate().await?;
        self.inner.subscribe(k).await
    }
}

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

fn counting_loader(
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> impl FnOnce(
    String,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, Never>> + Send>>
       + Send
       + 'static {
    let loads = loads.clone();
    move |key| {
        Box::pin(async move {
            let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(took).await;
            Ok(format!("{key}-v{n}"))
        })
    }
}

fn pod(
    backend: &Switched,
    f: impl FnOnce(onefill::CacheBuilder<String, String>) -> onefill::CacheBuilder<String, String>,
) -> Cache<String, String> {
    f(Cache::builder()
        .namespace("outage")
        .backend(backend.clone())
        .jitter(0.0)
        .early_refresh_beta(0.0)
        .backend_timeout(Duration::from_millis(200)))
    .build()
    .unwrap()
}

/// A hung backend on a cold key: every caller is answered within the
/// backend timeout plus one load, with one load per pod, not per caller.
#[tokio::test(start_paused = true)]
async fn hung_backend_bounds_every_caller_and_coalesces_per_pod() {
    let backend = Switched::default();
    backend.set(HANG);
    let pods = [pod(&backend, |b| b), pod(&backend, |b| b)];
    let loads = Arc::new(AtomicUsize::new(0));
    let load = Duration::from_millis(100);
    let mut tasks = Vec::new();
    for i in 0..60 {
        let c = pods[i % 2].clone();
        let loader = counting_loader(&loads, load);
        tasks.push(tokio::spawn(async move {
            let start = Instant::now();
            let r = c.fetch(&"k".to_string(), &CallOptions::new(), loader).await;
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
    let backend = Switched::default();
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
    backend.set(HANG);
    let outage_start = Instant::now();
    let mut answered = 0;
    while outage_start.elapsed() < Duration::from_secs(3) {
        for p in &pods {
            let start = Instant::now();
            let f = p
                .fetch(
                    &key,
                    &CallOptions::new(),
                    counting_loader(&loads, Duration::from_millis(100)),
                )
                .await
                .expect("no caller error");
            assert!(start.elapsed() <= Duration::from_millis(300));
            assert_eq!(f.value, "hot-v1");
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answered > 20);
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
    backend.set(HEALTHY);
    let before: u64 = pods.iter().map(|p| p.stats().lease_acquired).sum();
    // Past ttl + grace the value is gone; the next miss takes the lease again.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let f = pods[0]
        .fetch(
            &key,
            &CallOptions::new(),
            counting_loader(&loads, Duration::from_millis(100)),
        )
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
    let backend = Switched::default();
    let c = pod(&backend, |b| {
        b.circuit_breaker(CircuitBreaker::new(5, Duration::from_secs(2)))
    });
    backend.set(REFUSE);
    let loads = Arc::new(AtomicUsize::new(0));
    for i in 0..50 {
        let f = c
            .fetch(
                &format!("k{i}"),
                &CallOptions::new(),
                counting_loader(&loads, Duration::ZERO),
            )
            .await
            .unwrap();
        assert_eq!(f.outcome, Outcome::Degraded);
    }
    assert_eq!(
        backend.calls.load(Ordering::SeqCst),
        5,
        "only the failures that opened it"
    );
    assert_eq!(c.circuit_state(), CircuitState::Open);
    let s = c.stats();
    assert_eq!(s.circuit_opened, 1);
    assert_eq!(s.circuit_rejected, 45);
    backend.set(HEALTHY);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let f = c
        .fetch(
            &"after".to_string(),
            &CallOptions::new(),
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
    let backend = Switched::default();
    backend.set(REFUSE);
    let c = pod(&backend, |b| b.strict(true));
    let loads = Arc::new(AtomicUsize::new(0));
    let err = c
        .get_or_load(&"k".to_string(), counting_loader(&loads, Duration::ZERO))
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(matches!(err, Error::Backend(ref b) if b.kind() == BackendErrorKind::Connection));
    assert_eq!(loads.load(Ordering::SeqCst), 0);
    backend.set(HANG);
    let err = c
        .get_or_load(&"k".to_string(), counting_loader(&loads, Duration::ZERO))
        .await
        .unwrap_err();
    assert!(err.is_timeout() && err.is_backend(), "{err}");
}
