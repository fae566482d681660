//! [`CacheBuilder`]: the cache's parts (namespace, backend, codec) and its
//! policy. The policy setters are generated from the option table in
//! `options.rs`, where each option is declared once.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::backend::memory::MemoryBackend;
use crate::backend::{Backend, ChangeListener};
use crate::cache::Cache;
use crate::circuit::CircuitBreaker;
use crate::codec::{Codec, JsonCodec};
use crate::error::ConfigError;
use crate::key;
use crate::l1::L1;
use crate::lease::LeaseTtl;
use crate::options::{with_options, Policy};
use crate::shared::Shared;
use crate::wait::WaitPolicy;

/// Builds a [`Cache`]. Every option has a default; [`build`](CacheBuilder::build)
/// validates them all.
///
/// | option | default |
/// | --- | --- |
/// | namespace | `onefill` |
/// | backend | a new [`MemoryBackend`] |
/// | codec | [`JsonCodec`] |
/// | L1 | 10,000 entries on the embedded and the Redis backend, off on other backends unless they ask for one ([`Backend::default_l1`]); [`CacheBuilder::l1`], [`CacheBuilder::no_l1`] |
/// | ttl | 60 s |
/// | grace (stale-while-refresh window) | 0 (off) |
/// | jitter | up to 10 % shorter |
/// | early refresh `beta` (a load time before expiry) | 1.0 |
/// | lease TTL | adaptive: 3 × p99 load time within [1 s, 30 s] |
/// | max load time | 30 s |
/// | wait | deadline 10 s; woken by the fill notification, re-checking at the holder's lease expiry and every 3 s (safety poll; polls 20 ms → 500 ms without a subscription); then stale or one degraded load |
/// | backend timeout (for all the calls of one flight) | 250 ms |
/// | negative TTL | none |
/// | fail-safe | on, throttle 5 s |
/// | strict | off |
/// | max value / key size | 8 MiB / 1 KiB |
/// | circuit breaker | open after 5 consecutive failures, for 2 s |
/// | outage fallback | last values of 10,000 keys, each at most until it would have expired on the server |
///
/// The policy setters (all but `namespace`, `backend`, `shared_backend` and
/// `codec`) also exist on [`CallOptions`](crate::CallOptions) where they make
/// sense for one call.
pub struct CacheBuilder<K, V> {
    namespace: String,
    backend: Option<Arc<dyn Backend>>,
    /// The backend, when it is a `RedisBackend` (see `Shared::get`).
    #[cfg(feature = "redis")]
    redis: Option<crate::backend::redis::RedisBackend>,
    codec: Option<Arc<dyn Codec<V>>>,
    /// `None`: the default (an L1 where the backend asks for one, see
    /// `Backend::default_l1`); `Some(None)`: none.
    l1: Option<Option<L1>>,
    /// Set by the generated setters in `options.rs`.
    pub(crate) policy: Policy,
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
            #[cfg(feature = "redis")]
            redis: None,
            codec: None,
            l1: None,
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
        #[cfg(feature = "redis")]
        {
            let any: &dyn std::any::Any = &backend;
            self.redis = any
                .downcast_ref::<crate::backend::redis::RedisBackend>()
                .cloned();
        }
        self.backend = Some(Arc::new(backend));
        self
    }
    /// A backend already shared behind an `Arc`.
    pub fn shared_backend(mut self, backend: Arc<dyn Backend>) -> Self {
        #[cfg(feature = "redis")]
        {
            self.redis = None;
        }
        self.backend = Some(backend);
        self
    }
    /// An in-process L1 in front of the backend, kept coherent by it (see
    /// [`L1`]), instead of the default one (10,000 entries on the embedded
    /// and the Redis backend). A backend that cannot keep it coherent makes
    /// [`build`](CacheBuilder::build) fail.
    ///
    /// ```
    /// let cache = onefill::Cache::<u64, String>::builder()
    ///     .l1(onefill::L1::new(10_000))
    ///     .build()
    ///     .unwrap();
    /// # drop(cache);
    /// ```
    pub fn l1(mut self, l1: L1) -> Self {
        self.l1 = Some(Some(l1));
        self
    }
    /// No L1, not even the default one (10,000 entries on the embedded and
    /// the Redis backend): every call reads the backend.
    pub fn no_l1(mut self) -> Self {
        self.l1 = Some(None);
        self
    }
    /// The value codec.
    pub fn codec(mut self, codec: impl Codec<V>) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }
}

/// The size of the L1 a cache has unless told otherwise, on a backend
/// that asks for one (`Backend::default_l1`): the embedded and the Redis
/// backend. Why 10,000 entries: the L1 guide's "The default L1".
pub(crate) const DEFAULT_L1_ENTRIES: usize = 10_000;

/// The builder's setter of every option of the table in `options.rs`, per
/// call and cache-wide alike (the table's defaults and checks are the
/// policy's business).
macro_rules! builder_setters {
    (
        per_call { $( $pf:ident : $pty:ty = $pdefault:expr, check($pcheck:expr) {
            $( $(#[$pdoc:meta])* fn $psetter:ident ( $( $parg:ident : $parg_ty:ty ),* ) = $pvalue:expr ; )+
        } )* }
        cache_wide { $( $cf:ident : $cty:ty = $cdefault:expr, check($ccheck:expr) {
            $( $(#[$cdoc:meta])* fn $csetter:ident ( $( $carg:ident : $carg_ty:ty ),* ) = $cvalue:expr ; )+
        } )* }
    ) => {
        impl<K, V> CacheBuilder<K, V> {
            $( $(
                $(#[$pdoc])*
                pub fn $psetter(mut self, $( $parg: $parg_ty ),* ) -> Self {
                    self.policy.$pf = $pvalue;
                    self
                }
            )+ )*
            $( $(
                $(#[$cdoc])*
                pub fn $csetter(mut self, $( $carg: $carg_ty ),* ) -> Self {
                    self.policy.$cf = $cvalue;
                    self
                }
            )+ )*
        }
    };
}

with_options!(builder_setters);

impl<K, V> Cache<K, V> {
    /// A builder with the defaults (namespace `onefill`, the embedded
    /// [`MemoryBackend`](crate::MemoryBackend), JSON, TTL 60 s, see [`CacheBuilder`]).
    pub fn builder() -> CacheBuilder<K, V> {
        CacheBuilder::new()
    }
}

impl<K, V> CacheBuilder<K, V>
where
    V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
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
        // The L1 asked for, or the default one if the backend asks for it.
        // Only the one asked for may fail the build: the default gives way
        // to no L1 where the backend cannot keep it coherent.
        let explicit = self.l1.is_some();
        let l1 = match self.l1 {
            Some(choice) => choice,
            None if backend.default_l1() => Some(L1::new(DEFAULT_L1_ENTRIES)),
            None => None,
        };
        if let Some(l1) = &l1 {
            l1.validate()?;
        }
        #[cfg(feature = "redis")]
        if let Some(redis) = &self.redis {
            redis.check_durability_against(self.policy.backend_timeout);
            redis.check_namespace_in_background(&self.namespace);
        }
        #[cfg(feature = "redis")]
        let redis = self.redis;
        let parts = Parts {
            namespace: self.namespace,
            backend,
            codec,
            policy: self.policy,
            #[cfg(feature = "redis")]
            redis,
        };
        let shared = match parts.clone().shared(l1.as_ref()) {
            Ok(shared) => shared,
            Err(refusal) if !explicit => {
                // Not asked for: the cache goes on as it did before the
                // default L1 (which a backend that asks for it should not
                // refuse; a wrapper may), and says so quietly.
                tracing::info!(
                    namespace = parts.namespace,
                    error = %refusal,
                    "the backend cannot keep the default L1 coherent: the cache has no L1"
                );
                parts.shared(None).map_err(|e| ConfigError::Option {
                    option: "l1",
                    reason: format!("cannot be kept coherent: {e}"),
                })?
            }
            Err(refusal) => {
                return Err(ConfigError::Option {
                    option: "l1",
                    reason: format!("cannot be kept coherent: {refusal}"),
                })
            }
        };
        Ok(Cache::from_shared(shared))
    }
}

/// What a cache is made of besides its L1, kept whole until the backend
/// has accepted to keep the L1 coherent (a default L1 it refuses gives way
/// to none: `CacheBuilder::build`).
#[derive(Clone)]
struct Parts<V> {
    namespace: String,
    backend: Arc<dyn Backend>,
    codec: Arc<dyn Codec<V>>,
    policy: Policy,
    #[cfg(feature = "redis")]
    redis: Option<crate::backend::redis::RedisBackend>,
}

impl<V> Parts<V>
where
    V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    /// The cache's shared state with `l1`, its change reports asked of the
    /// backend. Err: the backend's refusal to report changes.
    fn shared(self, l1: Option<&L1>) -> Result<Arc<Shared<V>>, crate::error::BackendError> {
        #[allow(unused_mut)]
        let mut shared = Shared::new(self.namespace, self.backend, self.codec, self.policy, l1);
        #[cfg(feature = "redis")]
        {
            shared.calls.redis = self.redis;
        }
        let shared = Arc::new(shared);
        {
            // What no report told: without an L1, another process's marks;
            // with one, those made while the backend could not vouch for
            // its reports. The cache hears of them when it reads the marks
            // again (see `Marks::on_moved`).
            let weak = Arc::downgrade(&shared);
            shared.marks.on_moved(Box::new(move || {
                if let Some(shared) = weak.upgrade() {
                    shared.marked_elsewhere();
                }
            }));
        }
        if let (Some(local), Some(l1)) = (&shared.l1, l1) {
            // The cache listens, not its L1: a report reaches the outage
            // fallback and the namespace's marks too (see `coherence.rs`;
            // the L1's prefix covers the marks' keys). Held weakly by the
            // backend, for as long as the cache's handles live. (Without
            // an L1, the marks are read again after a while instead.)
            let listener: Arc<dyn ChangeListener> = shared.clone();
            shared.calls.backend.track_changes(
                local.prefix(),
                l1.confirm_every(),
                Arc::downgrade(&listener),
            )?;
        }
        Ok(shared)
    }
}
