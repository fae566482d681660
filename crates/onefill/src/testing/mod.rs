//! The protocol conformance suite, for anyone who implements [`Backend`]
//! (feature `test-support`).
//!
//! onefill's guarantees (one load per herd fleet-wide, fenced fills, bounded
//! waiters, stale-while-refresh, …) hold on a store only if its [`Backend`]
//! keeps the contract of the [`backend`](crate::backend) module. The
//! [`conformance`] scenarios check that contract end to end, through real
//! [`Cache`]s: they are the very scenarios onefill runs on its
//! [`MemoryBackend`] (in paused time) and on `RedisBackend`, standalone and
//! clustered (in real time). A backend for Valkey, KeyDB, DragonflyDB,
//! Memcached or a database runs them with one line:
//! [`conformance_suite!`](crate::conformance_suite) generates one `#[test]`
//! per scenario, so they run in parallel and fail one by one.
//!
//! # What a harness provides
//!
//! A [`Harness`] hands the scenarios backends on **one shared store**:
//!
//! - [`Harness::backend`] is called several times per scenario, once per
//!   simulated process (each of those gets its own [`Cache`]). Every handle
//!   must see the same values, leases and fill notifications, as separate
//!   processes sharing one server do; a new connection per call is the most
//!   faithful. The store may be shared with scenarios running at the same
//!   time: each scenario works in a namespace of its own ([`unique_ns`]).
//! - [`Harness::paused`] says whether tokio time is paused. A store whose
//!   TTLs follow tokio's clock (an in-process store, or a wrapper of
//!   [`MemoryBackend`]) should run paused, with
//!   `tokio::test(start_paused = true)`: every wait, lease expiry and poll is
//!   then virtual, the suite takes no wall time, and four scenarios also
//!   assert exact virtual durations (`dead_holder_is_taken_over`,
//!   `waiters_wake_on_fill_notification`, `deadline_outcomes`,
//!   `hung_loader_is_bounded`). A store with its own clock (a server's TTLs)
//!   must run in real time (`paused() == false`, and a multi-threaded
//!   runtime so the callers really race): the scenarios then assert counts
//!   and outcomes only, and take up to about ten seconds each, because their
//!   loaders, leases and TTLs really sleep.
//!
//! The harness constructor given to the macro is an `async` expression,
//! evaluated once per test inside the test's runtime (so it may start a
//! server, or connect to a shared one).
//!
//! # Failures
//!
//! Everything here is test code: a scenario (and a helper such as
//! [`herd`] or [`lease_held`]) **panics** on a failed assertion or an
//! unexpected error, with a message that says what was expected; it never
//! returns a `Result`.
//!
//! # Example: a third-party backend
//!
//! A `Backend` of your own (here a wrapper that delegates to
//! [`MemoryBackend`], in your crate's tests) and the whole suite on it:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use async_trait::async_trait;
//! use onefill::backend::{
//!     Acquired, Backend, BackendError, FillKeys, FillSubscription, LeaseToken, Stored,
//! };
//! use onefill::testing::Harness;
//! use onefill::MemoryBackend;
//!
//! /// The store under test.
//! #[derive(Debug, Clone, Default)]
//! struct MyStore(MemoryBackend);
//!
//! #[async_trait]
//! impl Backend for MyStore {
//!     async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
//!         self.0.get(keys).await
//!     }
//!     async fn acquire(
//!         &self,
//!         keys: &FillKeys,
//!         token: &LeaseToken,
//!         lease_ttl: Duration,
//!         refresh_window: Duration,
//!     ) -> Result<Acquired, BackendError> {
//!         self.0.acquire(keys, token, lease_ttl, refresh_window).await
//!     }
//!     async fn fill(
//!         &self,
//!         keys: &FillKeys,
//!         token: &LeaseToken,
//!         bytes: &[u8],
//!         ttl: Duration,
//!     ) -> Result<bool, BackendError> {
//!         self.0.fill(keys, token, bytes, ttl).await
//!     }
//!     async fn release(
//!         &self,
//!         keys: &FillKeys,
//!         token: &LeaseToken,
//!         entry: Option<(&[u8], Duration)>,
//!     ) -> Result<bool, BackendError> {
//!         self.0.release(keys, token, entry).await
//!     }
//!     async fn extend(
//!         &self,
//!         keys: &FillKeys,
//!         token: &LeaseToken,
//!         lease_ttl: Duration,
//!     ) -> Result<bool, BackendError> {
//!         self.0.extend(keys, token, lease_ttl).await
//!     }
//!     async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
//!         self.0.set(keys, bytes, ttl).await
//!     }
//!     async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
//!         self.0.invalidate(keys).await
//!     }
//!     async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
//!         self.0.subscribe(keys).await
//!     }
//! }
//!
//! /// One store; every `backend()` is a handle on it, as a new process
//! /// would open.
//! struct MyHarness(MyStore);
//!
//! #[async_trait]
//! impl Harness for MyHarness {
//!     async fn backend(&self) -> Arc<dyn Backend> {
//!         Arc::new(self.0.clone())
//!     }
//!     fn paused(&self) -> bool {
//!         true // MemoryBackend's TTLs follow tokio's clock
//!     }
//! }
//!
//! async fn my_store() -> MyHarness {
//!     MyHarness(MyStore::default())
//! }
//!
//! // In `tests/conformance.rs`: one #[test] per scenario. Needs tokio's
//! // `macros`, `rt` and `test-util` (for `start_paused`) features.
//! onefill::conformance_suite!(my_store(), tokio::test(start_paused = true));
//! # fn main() {}
//! ```
//!
//! With `onefill = { version = "…", features = ["test-support"] }` in the
//! `[dev-dependencies]`. A store in real time is instantiated with a
//! multi-threaded runtime instead:
//! `onefill::conformance_suite!(my_server(), tokio::test(flavor = "multi_thread", worker_threads = 2));`.
//! For a backend whose clones share one store, as here, [`CloneHarness`]
//! is that harness ready-made.
//!
//! The helpers below ([`Origin`], [`herd`], [`lease_held`], …) are the ones
//! the scenarios use, for writing scenarios of your own in the same terms;
//! each scenario is also a public function of [`conformance`], to call from
//! a test of your own.
//!
//! [`MemoryBackend`]: crate::MemoryBackend

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Barrier;
use tokio::time::Instant;

use crate::backend::{Acquired, Backend, FillKeys};
use crate::{Cache, CacheBuilder, CallOptions, Error, Fetched, LeaseToken};

pub mod conformance;
pub mod faulty;
pub mod processes;
mod under_test;

pub use faulty::{Fault, Faults, FaultyBackend, Op};
pub use processes::{ProcessBackend, Processes};
pub use under_test::{Blocking, CacheUnderTest, UnderTestWithOptions};

/// Gives the suite backends that share one store. See the
/// [module docs](self#what-a-harness-provides).
#[async_trait]
pub trait Harness: Send + Sync {
    /// A handle on the shared store, as a new process would open it.
    async fn backend(&self) -> Arc<dyn Backend>;
    /// Whether tokio time is paused (then virtual durations may be asserted).
    fn paused(&self) -> bool;
    /// Whether the scenarios call the cache through its
    /// [`BlockingCache`](crate::BlockingCache) (see [`Blocking`]).
    fn blocking(&self) -> bool {
        false
    }
}

/// A [`Harness`] for a backend whose clones share one store (as
/// [`MemoryBackend`](crate::MemoryBackend)'s do): every
/// [`backend`](Harness::backend) is a clone of `backend`. A store reached
/// over a network is better tested with a harness of its own that opens a
/// new connection per call. Example:
/// [`conformance_suite!`](crate::conformance_suite).
#[derive(Debug, Clone, Default)]
pub struct CloneHarness<B> {
    /// The backend, cloned for every simulated process.
    pub backend: B,
    /// What [`Harness::paused`] answers: whether the tests run in paused
    /// tokio time.
    pub paused: bool,
}

#[async_trait]
impl<B: Backend + Clone> Harness for CloneHarness<B> {
    async fn backend(&self) -> Arc<dyn Backend> {
        Arc::new(self.backend.clone())
    }
    fn paused(&self) -> bool {
        self.paused
    }
}

/// The error of the simulated origin: the loaders of [`failing_loader`] fail
/// with `OriginError("db down")`.
#[derive(Debug, thiserror::Error)]
#[error("origin failed: {0}")]
pub struct OriginError(pub String);

/// The future a test loader returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A simulated origin: counts loads, sleeps, returns `value-N`.
#[derive(Clone, Default)]
pub struct Origin {
    /// How many loads started, across every loader of this origin.
    pub loads: Arc<AtomicUsize>,
}

impl Origin {
    /// How many loads started so far.
    pub fn count(&self) -> usize {
        self.loads.load(Ordering::SeqCst)
    }

    /// A loader that counts the load, sleeps `took` (tokio time), then
    /// answers `"{key}-v{n}"`, where `n` is this load's number (from 1).
    pub fn loader(
        &self,
        took: Duration,
    ) -> impl FnOnce(String) -> BoxFuture<Result<String, OriginError>> + Send + 'static {
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
) -> impl FnOnce(String) -> BoxFuture<Result<String, OriginError>> + Send + 'static {
    let calls = calls.clone();
    move |_key: String| {
        Box::pin(async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(OriginError("db down".into()))
        })
    }
}

/// A cache on a new backend handle of `h`, in namespace `ns`, without TTL
/// jitter; otherwise the defaults. Called as the harness says
/// ([`Harness::blocking`]).
pub async fn cache(h: &dyn Harness, ns: &str) -> CacheUnderTest {
    cache_with(h, ns, |b| b).await
}

/// Like [`cache`], with the builder adjusted by `f` before it is built.
pub async fn cache_with(
    h: &dyn Harness,
    ns: &str,
    f: impl FnOnce(CacheBuilder<String, String>) -> CacheBuilder<String, String>,
) -> CacheUnderTest {
    let cache = f(Cache::builder()
        .namespace(ns)
        .shared_backend(h.backend().await)
        .jitter(0.0))
    .build()
    .expect("valid options");
    CacheUnderTest::new(cache, h.blocking())
}

/// A namespace no other test uses: `name` and a random suffix.
pub fn unique_ns(name: &str) -> String {
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

/// Runs `n` callers of [`Cache::fetch`] released together behind a barrier,
/// spread round-robin over `caches`, each with a loader of `origin` that
/// takes `took`; returns their answers in order.
pub async fn herd(
    caches: &[CacheUnderTest],
    n: usize,
    key: &str,
    origin: &Origin,
    took: Duration,
    options: CallOptions,
) -> Vec<Result<Fetched<String>, Error>> {
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
            cache.with_options(&options).fetch(&key, loader).await
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("caller task"));
    }
    out
}

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
