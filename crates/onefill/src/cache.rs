//! The public face: [`Cache`] and its [`CacheBuilder`].

use std::fmt::{self, Display};
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::backend::memory::MemoryBackend;
use crate::backend::Backend;
use crate::circuit::{Breaker, CircuitBreaker, CircuitState};
use crate::codec::{Codec, JsonCodec};
use crate::conversation::{self, Flight, Inner, Load, Outcome};
use crate::error::{ConfigError, Error, LoaderError};
use crate::fallback::Fallback;
use crate::flight::Joined;
use crate::freshness;
use crate::key::{self, FillKeys};
use crate::lease::LeaseTtl;
use crate::options::{CallOptions, Policy};
use crate::stats::{Recorder, Stats};
use crate::wait::WaitPolicy;

/// A value and how the call got it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fetched<V> {
    /// The value.
    pub value: V,
    /// How the flight answered.
    pub outcome: Outcome,
    /// Whether this call shared a flight another local call had started
    /// (no backend conversation of its own).
    pub coalesced: bool,
}

/// A cache-aside cache whose fills are single-flight across the fleet.
///
/// Cheap to clone (an `Arc`), `Send + Sync`. Many caches, each with its own
/// namespace, may share one backend. Keys are any `Display` type: the
/// string form is the key.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// let cache: onefill::Cache<String, String> = onefill::Cache::builder()
///     .namespace("users")
///     .backend(onefill::MemoryBackend::new())
///     .ttl(Duration::from_secs(60))
///     .build()?;
///
/// let name = cache
///     .get_or_load(&"42".to_string(), |id| async move {
///         Ok::<_, std::io::Error>(format!("user {id}"))
///     })
///     .await?;
/// assert_eq!(name, "user 42");
/// assert_eq!(cache.stats().loads_ok, 1);
/// # Ok(()) }
/// ```
pub struct Cache<K, V> {
    inner: Arc<Inner<V>>,
    _key: PhantomData<fn(K)>,
}

impl<K, V> Clone for Cache<K, V> {
    fn clone(&self) -> Self {
        Cache {
            inner: self.inner.clone(),
            _key: PhantomData,
        }
    }
}

impl<K, V> fmt::Debug for Cache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("namespace", &self.inner.namespace)
            .field("backend", &self.inner.backend)
            .field("policy", &self.inner.policy)
            .finish()
    }
}

impl<K, V> Cache<K, V>
where
    K: Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// A builder with the defaults (namespace `onefill`, the embedded
    /// [`MemoryBackend`], JSON, TTL 60 s, see [`CacheBuilder`]).
    pub fn builder() -> CacheBuilder<K, V> {
        CacheBuilder::new()
    }

    /// Returns the cached value, or runs `loader` to produce and store it,
    /// once across every process sharing the backend.
    ///
    /// # Concurrent calls on the same key
    ///
    /// Calls in this process share one flight: one backend conversation and
    /// at most one loader run; the others get a clone of its result. Across
    /// processes the lease elects one loader; the others wait for its fill
    /// (woken by a notification, polling as the fallback) up to the wait
    /// deadline, then get the configured [`OnWaitTimeout`](crate::OnWaitTimeout)
    /// outcome. Only the first caller's `loader` runs; the others are dropped.
    ///
    /// # Cancellation
    ///
    /// The flight and the loader run detached (spawned). Dropping the future
    /// of any caller, the one whose loader runs included, cancels neither the
    /// load nor the lease: the other callers still get the result and the
    /// lease is released or filled as usual.
    ///
    /// # Errors
    ///
    /// - [`Error::Loader`] with the loader's own error (as
    ///   [`LoaderError`]), shared by every coalesced caller;
    ///   [`Error::LoaderPanicked`], [`Error::LoadTimedOut`];
    /// - [`Error::WaitTimedOut`] if the wait policy says so;
    /// - [`Error::CachedFailure`] if negative caching remembered a failure;
    /// - [`Error::InvalidInput`] for an empty or too-long key, a value over
    ///   the size limit or out-of-range call options;
    /// - [`Error::Backend`] only in strict mode (otherwise a failing backend
    ///   degrades to in-process coalescing and stale values);
    /// - [`Error::NotFound`] if a caller of
    ///   [`get_or_load_optional`](Cache::get_or_load_optional) cached the
    ///   key's absence.
    ///
    /// # Panics
    ///
    /// Never because of the loader (a panicking loader becomes
    /// [`Error::LoaderPanicked`]). Must be called within a tokio runtime.
    pub async fn get_or_load<F, Fut, E>(&self, key: &K, loader: F) -> Result<V, Error>
    where
        F: FnOnce(K) -> Fut + Send + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        self.fetch(key, &CallOptions::default(), loader)
            .await
            .map(|f| f.value)
    }

    /// [`get_or_load`](Cache::get_or_load) with per-call overrides of the
    /// cache's policy.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use std::time::Duration;
    /// let cache = onefill::Cache::<u32, u32>::builder().build().unwrap();
    /// let options = onefill::CallOptions::new().ttl(Duration::from_secs(5)).no_lease();
    /// let v = cache
    ///     .get_or_load_with(&7, &options, |k| async move { Ok::<_, std::io::Error>(k * 2) })
    ///     .await?;
    /// assert_eq!(v, 14);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Cache::get_or_load).
    pub async fn get_or_load_with<F, Fut, E>(
        &self,
        key: &K,
        options: &CallOptions,
        loader: F,
    ) -> Result<V, Error>
    where
        F: FnOnce(K) -> Fut + Send + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        self.fetch(key, options, loader).await.map(|f| f.value)
    }

    /// Like [`get_or_load_with`](Cache::get_or_load_with), and also says how
    /// the call was answered ([`Outcome`]) and whether it was coalesced.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use onefill::{CallOptions, Outcome};
    /// let cache = onefill::Cache::<u32, u32>::builder().build().unwrap();
    /// let load = |k: u32| async move { Ok::<_, std::io::Error>(k + 1) };
    /// let first = cache.fetch(&1, &CallOptions::new(), load).await?;
    /// assert_eq!((first.value, first.outcome), (2, Outcome::Loaded));
    /// let second = cache.fetch(&1, &CallOptions::new(), load).await?;
    /// assert_eq!(second.outcome, Outcome::Hit);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Cache::get_or_load).
    pub async fn fetch<F, Fut, E>(
        &self,
        key: &K,
        options: &CallOptions,
        loader: F,
    ) -> Result<Fetched<V>, Error>
    where
        F: FnOnce(K) -> Fut + Send + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        let owned = key.clone();
        let load: Load<V> = Box::new(move || {
            Box::pin(async move { loader(owned).await.map(Some).map_err(LoaderError::new) })
        });
        let fetched = self.fetch_erased(key, options, load).await?;
        match fetched.value {
            Some(value) => Ok(Fetched {
                value,
                outcome: fetched.outcome,
                coalesced: fetched.coalesced,
            }),
            None => Err(Error::NotFound),
        }
    }

    /// For loaders that may find nothing: `Ok(None)` from the loader is
    /// cached as the key's absence (for `negative_ttl` if set, else `ttl`),
    /// so a missing row is not looked up again by every caller.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// let cache = onefill::Cache::<u32, String>::builder().build().unwrap();
    /// let found = cache
    ///     .get_or_load_optional(&404, |_| async { Ok::<_, std::io::Error>(None) })
    ///     .await?;
    /// assert_eq!(found, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Cache::get_or_load), except that a cached absence
    /// is `Ok(None)`.
    pub async fn get_or_load_optional<F, Fut, E>(
        &self,
        key: &K,
        loader: F,
    ) -> Result<Option<V>, Error>
    where
        F: FnOnce(K) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        self.fetch_optional(key, &CallOptions::default(), loader)
            .await
            .map(|f| f.value)
    }

    /// [`get_or_load_optional`](Cache::get_or_load_optional) with per-call
    /// options, reporting the [`Outcome`].
    ///
    /// # Errors
    ///
    /// As [`get_or_load_optional`](Cache::get_or_load_optional).
    pub async fn fetch_optional<F, Fut, E>(
        &self,
        key: &K,
        options: &CallOptions,
        loader: F,
    ) -> Result<Fetched<Option<V>>, Error>
    where
        F: FnOnce(K) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        let owned = key.clone();
        let load: Load<V> = Box::new(move || {
            Box::pin(async move { loader(owned).await.map_err(LoaderError::new) })
        });
        self.fetch_erased(key, options, load).await
    }

    async fn fetch_erased(
        &self,
        key: &K,
        options: &CallOptions,
        load: Load<V>,
    ) -> Result<Fetched<Option<V>>, Error> {
        let (key, policy) = self.prepare(key, options)?;
        let (waiter, coalesced) = match self.inner.flights.join(&key) {
            Joined::Follower(waiter) => {
                self.inner.recorder.coalesced();
                (waiter, true)
            }
            Joined::Leader(completion, waiter) => {
                let keys = FillKeys::new(&self.inner.namespace, &key);
                let mut flight = Flight::new(self.inner.clone(), keys, policy, load);
                tokio::spawn(async move {
                    let (answer, refresh) = flight.run().await;
                    flight.remember(&answer);
                    completion.complete(answer);
                    if let Some(why) = refresh {
                        flight.refresh(why).await;
                    }
                });
                (waiter, false)
            }
        };
        let (value, outcome) = waiter.outcome().await?;
        Ok(Fetched {
            value,
            outcome,
            coalesced,
        })
    }

    fn prepare(&self, key: &K, options: &CallOptions) -> Result<(String, Policy), Error> {
        let key = self.validated(key)?;
        let policy = self.inner.policy.with(options)?;
        Ok((key, policy))
    }

    fn validated(&self, key: &K) -> Result<String, Error> {
        let key = key.to_string();
        key::validate_key(&key, self.inner.policy.max_key_bytes)?;
        Ok(key)
    }

    fn keys(&self, key: &K) -> Result<FillKeys, Error> {
        Ok(FillKeys::new(&self.inner.namespace, &self.validated(key)?))
    }

    async fn call<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, crate::BackendError>>,
    ) -> Result<T, Error> {
        conversation::call_backend(&self.inner, self.inner.policy.backend_timeout, op, fut)
            .await
            .map_err(Error::Backend)
    }

    /// Reads the stored value (fresh, or stale within the grace window)
    /// without loading. `Ok(None)` for a miss, a cached absence or failure,
    /// and an unreadable value.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key; [`Error::Backend`] if the
    /// backend fails.
    pub async fn get(&self, key: &K) -> Result<Option<V>, Error> {
        let keys = self.keys(key)?;
        let stored = self.call("get", self.inner.backend.get(&keys)).await?;
        Ok(stored
            .and_then(|s| conversation::stored_value(&self.inner, &s, keys.value()))
            .flatten())
    }

    /// Writes a value (with this cache's TTL, jitter and grace) and removes
    /// any lease, so a load in flight from before this write is fenced out
    /// and cannot overwrite it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key or a value over the size limit
    /// (nothing is written); [`Error::Encode`]; [`Error::Backend`].
    pub async fn set(&self, key: &K, value: V) -> Result<(), Error> {
        let keys = self.keys(key)?;
        let policy = &self.inner.policy;
        let value = Some(value);
        let bytes = conversation::encode_value(&self.inner, policy, &value, Duration::ZERO)?;
        let ttl = freshness::written_ttl(policy.ttl, policy.jitter, policy.grace);
        self.call("set", self.inner.backend.set(&keys, &bytes, ttl))
            .await?;
        // The outage fallback must not answer with what this write replaced.
        self.inner
            .fallback
            .record(keys.value(), &value, policy.ttl + policy.grace);
        Ok(())
    }

    /// Removes the value and any lease. A load already in flight (here or in
    /// another process) still answers its own callers but does not store its
    /// result: it could predate the invalidation.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key; [`Error::Backend`].
    pub async fn invalidate(&self, key: &K) -> Result<(), Error> {
        let keys = self.keys(key)?;
        self.inner.fallback.forget(keys.value());
        self.call("invalidate", self.inner.backend.invalidate(&keys))
            .await
    }

    /// A snapshot of this cache's counters.
    pub fn stats(&self) -> Stats {
        self.inner.recorder.snapshot()
    }

    /// The circuit breaker's current state.
    pub fn circuit_state(&self) -> CircuitState {
        self.inner.breaker.state()
    }

    /// This cache's namespace.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }
}

/// Builds a [`Cache`]. Every option has a default; [`build`](CacheBuilder::build)
/// validates them all.
///
/// | option | default |
/// | --- | --- |
/// | namespace | `onefill` |
/// | backend | a new [`MemoryBackend`] |
/// | codec | [`JsonCodec`] |
/// | ttl | 60 s |
/// | grace (stale-while-refresh window) | 0 (off) |
/// | jitter | ±10 % |
/// | early refresh `beta` (XFetch) | 1.0 |
/// | lease TTL | adaptive: 3 × p99 load time within [1 s, 30 s] |
/// | max load time | 30 s |
/// | wait | deadline 10 s, polls 20 ms → 500 ms, then stale or one degraded load |
/// | backend timeout | 1 s |
/// | negative TTL | none |
/// | fail-safe | on, throttle 5 s |
/// | strict | off |
/// | max value / key size | 8 MiB / 1 KiB |
/// | circuit breaker | open after 5 consecutive failures, for 2 s |
/// | outage fallback | last values of 10,000 keys, each for `ttl + grace` |
pub struct CacheBuilder<K, V> {
    namespace: String,
    backend: Option<Arc<dyn Backend>>,
    codec: Option<Arc<dyn Codec<V>>>,
    policy: Policy,
    _key: PhantomData<fn(K)>,
}

impl<K, V> fmt::Debug for CacheBuilder<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("namespace", &self.namespace)
            .field("policy", &self.policy)
            .finish()
    }
}

impl<K, V> Default for CacheBuilder<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V> CacheBuilder<K, V> {
    /// The defaults; see the table above.
    pub fn new() -> Self {
        CacheBuilder {
            namespace: "onefill".to_owned(),
            backend: None,
            codec: None,
            policy: Policy::default(),
            _key: PhantomData,
        }
    }
    /// The key prefix; must not be empty nor contain `{` or `}`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }
    /// Where values and leases live.
    pub fn backend(mut self, backend: impl Backend) -> Self {
        self.backend = Some(Arc::new(backend));
        self
    }
    /// A backend already shared behind an `Arc`.
    pub fn shared_backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = Some(backend);
        self
    }
    /// The value codec.
    pub fn codec(mut self, codec: impl Codec<V>) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }
    /// How long a value stays fresh (1 ms to 1 year).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.policy.ttl = ttl;
        self
    }
    /// How long after `ttl` a value is still served (stale) while one
    /// background refresh runs fleet-wide; also the window in which fail-safe
    /// can serve it when the loader fails.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.policy.grace = grace;
        self
    }
    /// The ± fraction applied to every TTL written (0 to 0.5).
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.policy.jitter = fraction;
        self
    }
    /// XFetch's `beta`: 1.0 is the paper's optimum, larger refreshes earlier,
    /// 0 turns early refresh off. Early refresh applies to caches without a
    /// grace window: with one, the first stale read already refreshes in the
    /// background without making anyone wait, and early refreshes would only
    /// add loads.
    pub fn early_refresh_beta(mut self, beta: f64) -> Self {
        self.policy.beta = beta;
        self
    }
    /// The lease TTL policy.
    pub fn lease_ttl(mut self, lease: LeaseTtl) -> Self {
        self.policy.lease = Some(lease);
        self
    }
    /// No distributed lease (in-process coalescing only).
    pub fn no_lease(mut self) -> Self {
        self.policy.lease = None;
        self
    }
    /// The longest a loader may run; then it is aborted and its lease released.
    pub fn max_load_time(mut self, max: Duration) -> Self {
        self.policy.max_load_time = max;
        self
    }
    /// How losers of the lease race wait.
    pub fn wait(mut self, wait: WaitPolicy) -> Self {
        self.policy.wait = wait;
        self
    }
    /// The bound on every backend call.
    pub fn backend_timeout(mut self, timeout: Duration) -> Self {
        self.policy.backend_timeout = timeout;
        self
    }
    /// Remember loader failures for this long, so a failing origin is not
    /// called by every successive winner.
    pub fn negative_ttl(mut self, ttl: Duration) -> Self {
        self.policy.negative_ttl = Some(ttl);
        self
    }
    /// Serve the stale value when the loader fails (default on).
    pub fn fail_safe(mut self, on: bool) -> Self {
        self.policy.fail_safe = on;
        self
    }
    /// After a fail-safe answer, the stale value is stored as fresh for this
    /// long, so the failing origin is not retried at once.
    pub fn fail_safe_throttle(mut self, throttle: Duration) -> Self {
        self.policy.fail_safe_throttle = throttle;
        self
    }
    /// Surface backend errors to callers instead of degrading.
    pub fn strict(mut self, on: bool) -> Self {
        self.policy.strict = on;
        self
    }
    /// The largest encoded value accepted (bytes).
    pub fn max_value_bytes(mut self, max: usize) -> Self {
        self.policy.max_value_bytes = max;
        self
    }
    /// The longest key accepted (bytes of its string form).
    pub fn max_key_bytes(mut self, max: usize) -> Self {
        self.policy.max_key_bytes = max;
        self
    }
    /// How many keys' last values this process keeps to answer during a
    /// backend outage (each for `ttl + grace` after it was seen); 0 turns it
    /// off. Healthy reads never use it.
    pub fn outage_fallback_capacity(mut self, keys: usize) -> Self {
        self.policy.fallback_capacity = keys;
        self
    }
    /// The circuit breaker in front of the backend.
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.policy.circuit = breaker;
        self
    }
}

impl<K, V> CacheBuilder<K, V>
where
    V: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Validates the options and builds the cache.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the first invalid option: an empty namespace or
    /// one with `{`/`}`, a zero or absurd TTL, a jitter outside [0, 0.5], …
    pub fn build(self) -> Result<Cache<K, V>, ConfigError> {
        key::validate_namespace(&self.namespace)?;
        self.policy.validate()?;
        let backend = self
            .backend
            .unwrap_or_else(|| Arc::new(MemoryBackend::new()));
        let codec = self.codec.unwrap_or_else(|| Arc::new(JsonCodec));
        let inner = Inner {
            recorder: Recorder::new(&self.namespace),
            breaker: Breaker::new(self.policy.circuit),
            fallback: Fallback::new(self.policy.fallback_capacity),
            namespace: self.namespace,
            backend,
            codec,
            policy: self.policy,
            load_times: Default::default(),
            flights: Default::default(),
            refreshing: Default::default(),
        };
        Ok(Cache {
            inner: Arc::new(inner),
            _key: PhantomData,
        })
    }
}
