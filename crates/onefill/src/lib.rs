//! # onefill
//!
//! Cache fills that are single-flight across a whole fleet. When a popular
//! key expires and N callers in P processes miss it together, the loader
//! runs **once**; everybody else gets that result, and nobody waits without
//! a bound.
//!
//! - **in-process single-flight**: one backend conversation per key per
//!   process ([`Cache`]);
//! - **a distributed lease** (`SET lock token NX PX ttl`, fenced fill,
//!   compare-and-delete release, a watchdog, an adaptive TTL: [`LeaseTtl`]);
//! - **bounded losers**: stale at once, or a wait woken by the fill
//!   notification with jittered polling as the fallback, up to a deadline,
//!   then a configured outcome ([`WaitPolicy`], [`OnWaitTimeout`]);
//! - **freshness**: TTL, grace (serve stale while one refresh runs), jitter,
//!   early refresh (a load time before expiry), negative caching, fail-safe;
//! - **an L1** ([`L1`]): decoded values in process, dropped everywhere when
//!   the key changes in the backend, whoever changed it (Redis
//!   `CLIENT TRACKING`); on by default on the embedded backend;
//! - **resilience**: backend timeouts, a circuit breaker, degradation to
//!   in-process coalescing;
//! - **observability**: [`Stats`], the `metrics` facade (every name in
//!   [`metrics`], lock-level ones included) and a `tracing`
//!   span per call, ready for OpenTelemetry (`examples/otel.rs`).
//!
//! The embedded [`MemoryBackend`] is the default; the `redis` feature (on
//! by default) adds `redis::RedisBackend` for a fleet. Synchronous code
//! calls the same cache through a [`BlockingCache`], with the same
//! guarantees.
//!
//! The [guide](crate::_guide) explains each part at length (loaders,
//! freshness, waiting, the L1, Redis, batches, resilience, observability),
//! with examples that run as tests.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! let cache: onefill::Cache<String, String> = onefill::Cache::builder()
//!     .namespace("users")
//!     .backend(onefill::MemoryBackend::new())
//!     .ttl(Duration::from_secs(60))
//!     .build()?;
//! let key = "42".to_string();
//! let user = cache
//!     .get_or_load(&key, |key| async move { Ok::<_, std::io::Error>(format!("user {key}")) })
//!     .await?;
//! assert_eq!(user, "user 42");
//! cache.invalidate(&key).await?;
//! let stats: onefill::Stats = cache.stats();
//! assert_eq!(stats.loads_ok, 1);
//! # Ok(()) }
//! ```
//!
//! ## A connection pool (or any shared state) in the loader
//!
//! The loader is `'static` and `Send`: it runs detached, in a task of its
//! own, so it may outlive the call that started it (see
//! [`Cache::get_or_load`]'s *Cancellation*). It cannot borrow the caller's
//! pool; it **owns a clone of the pool's handle**. Pools are built for
//! this: `sqlx::PgPool`, `deadpool`'s `Pool`, `bb8::Pool` and
//! `redis::aio::ConnectionManager` are all cheap `Clone` handles around an
//! `Arc`; wrap anything else (a client, a config) in an [`Arc`](std::sync::Arc).
//! Clone the handle *into the closure*, then take a connection *inside* the
//! loader, so one is held only while a load runs, never by waiting callers.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tokio::sync::Semaphore;
//!
//! /// Stands for `sqlx::PgPool`, a `deadpool` pool…: a cheap `Clone`
//! /// handle, here a semaphore of 4 connections behind an `Arc`.
//! #[derive(Clone)]
//! struct Pool {
//!     connections: Arc<Semaphore>,
//! }
//!
//! impl Pool {
//!     async fn user_name(&self, id: u64) -> Result<String, std::io::Error> {
//!         let _connection = self.connections.acquire().await.map_err(std::io::Error::other)?;
//!         Ok(format!("user {id}"))
//!     }
//! }
//!
//! /// The service's state: the cache and the pool side by side.
//! #[derive(Clone)]
//! struct Users {
//!     cache: onefill::Cache<u64, String>,
//!     pool: Pool,
//! }
//!
//! impl Users {
//!     async fn name(&self, id: u64) -> Result<String, onefill::Error> {
//!         // A clone of the handle moves into the `'static` loader.
//!         let pool = self.pool.clone();
//!         self.cache
//!             .get_or_load(&id, move |id| async move { pool.user_name(id).await })
//!             .await
//!     }
//! }
//!
//! let users = Users {
//!     cache: onefill::Cache::builder().namespace("users").build()?,
//!     pool: Pool { connections: Arc::new(Semaphore::new(4)) },
//! };
//! assert_eq!(users.name(42).await?, "user 42");
//! # Ok(()) }
//! ```
//!
//! ## Cargo features
//!
//! | feature | default | what it adds |
//! | --- | --- | --- |
//! | `redis` | on | `redis::RedisBackend`: standalone Redis and Redis Cluster (7.0+) |
//! | `tls` | off | `rediss://` URLs for the Redis backend (rustls with the ring provider) and `RedisOptions::tls_root_cert` / `tls_client_cert` |
//! | `postcard` | off | `PostcardCodec`, a compact binary codec |
//! | `encryption` | off | `Encrypted<C>`: any codec's bytes encrypted (XChaCha20-Poly1305, bound to their key), keys by id in a `KeyRing` |
//! | `compression` | off | `Compressed<C>`: any codec's bytes compressed with lz4 above a size threshold |
//! | `macros` | off | `#[onefill::cached]`: a function whose body is its cache's loader, keyed by its arguments; `default_backend!` and `DefaultBackend` (the guide's `cached` page) |
//! | `test-support` | off | `onefill::testing`: the conformance suite every [`Backend`] must pass, for implementers of other backends; `MemoryBackend::put_raw` / `get_raw` |
//!
//! With `--no-default-features` the crate is the embedded [`MemoryBackend`]
//! alone, with every policy.
//!
//! ## Observability
//!
//! Metrics go through the `metrics` facade: install an exporter (e.g.
//! `metrics-exporter-prometheus`) before building caches; every name,
//! label and unit is in [`metrics`], and the same counts
//! are in [`Cache::stats`]. Spans go through `tracing` (and on to
//! OpenTelemetry with `tracing-opentelemetry`, see `examples/otel.rs`):
//!
//! | span | level | fields | what |
//! | --- | --- | --- | --- |
//! | `onefill.get_or_load` | info | `namespace`, `outcome`, `coalesced`, `error`, `otel.status_code` | one call of `get_or_load`, `fetch` and their variants, unless the L1 answered it (an L1 hit makes no span); a coalesced call's span *follows from* its flight leader's |
//! | `onefill.get_or_load_many` | info | `namespace`, `keys`, `outcome`, `error`, `otel.status_code` | one batch call (`get_or_load_many`, `fetch_many`); its task and its keys' flights are its children |
//! | `onefill.get`, `onefill.set`, `onefill.invalidate`, `onefill.expire` | info | `namespace`, `outcome`, `error`, `otel.status_code` | one call of those |
//! | `onefill.backend` | debug | `op` | one backend call, a child of the call's span |
//! | `onefill.load` | info | `key`, `outcome`, `not_stored` | the loader's run, a child of the call's span (though it runs in a task of its own); `not_stored`: how many of its values must not be stored |
//! | `onefill.wait` | info | `notified`, `polls`, `timed_out` | a wait for another process's load, a child of the call's span |
//! | `onefill.refresh` | info | `namespace`, `reason` | a background refresh: a root span that *follows from* the call that started it |
//! | `onefill.deferred_fill` | info | `namespace` | a fill put off until after the answer: a root span that follows from its call |
//! | `onefill.deferred_load` | info | `namespace` | the rest of a load the soft timeout answered stale (its fill or release): a root span that follows from its call |
//! | `onefill.replay` | debug | `op` | the replay of a write that failed for want of the backend (decision 0017), in the cache's replay task: a root span over its `onefill.backend` call |
//!
//! `outcome` is `hit`, `stale`, `loaded`, `waited`, `degraded` or `error`
//! (and `miss` for `get`); `coalesced` says the call shared a flight
//! another caller of this process had started.
//!
//! ## What the lease is not
//!
//! The lease is a best-effort mutex that turns N loads into one; it is not a
//! correctness lock. The worst case of two holders (a lease expired under a
//! stalled process) is one duplicate load, and the fenced fill keeps the
//! late one from overwriting newer data. A loader with side effects that
//! must happen exactly once (a payment, an email) needs a real lock with
//! fencing tokens or a consensus store, not this.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod answer;
pub mod backend;
mod backoff;
mod batch;
mod blocking;
mod budget;
mod builder;
mod cache;
#[cfg(feature = "macros")]
mod cached;
mod calls;
mod circuit;
mod coalesce;
mod codec;
mod coherence;
mod deadline;
mod envelope;
mod error;
mod fallback;
mod flight;
mod freshness;
mod group;
mod hit;
mod key;
mod l1;
mod lease;
mod loader;
mod marks;
pub mod metrics;
mod options;
mod refreshing;
mod replay;
mod shared;
mod stats;
#[cfg(feature = "test-support")]
pub mod testing;
mod token;
mod wait;

/// The guide: markdown pages under `docs/guide/`, rendered by rustdoc
/// (their examples run as doctests). Doc-only: nothing to import.
#[doc = include_str!("../docs/guide/README.md")]
pub mod _guide {
    #[doc = include_str!("../docs/guide/getting_started.md")]
    pub mod getting_started {}
    #[doc = include_str!("../docs/guide/loaders.md")]
    pub mod loaders {}
    #[cfg(feature = "macros")]
    #[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
    #[doc = include_str!("../docs/guide/cached.md")]
    pub mod cached {}
    #[doc = include_str!("../docs/guide/freshness.md")]
    pub mod freshness {}
    #[doc = include_str!("../docs/guide/tags.md")]
    pub mod tags {}
    #[doc = include_str!("../docs/guide/waiting.md")]
    pub mod waiting {}
    #[doc = include_str!("../docs/guide/l1.md")]
    pub mod l1 {}
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[doc = include_str!("../docs/guide/redis.md")]
    pub mod redis {}
    #[doc = include_str!("../docs/guide/batches.md")]
    pub mod batches {}
    #[doc = include_str!("../docs/guide/blocking.md")]
    pub mod blocking {}
    #[doc = include_str!("../docs/guide/resilience.md")]
    pub mod resilience {}
    #[doc = include_str!("../docs/guide/observability.md")]
    pub mod observability {}
    #[cfg(all(feature = "compression", feature = "encryption"))]
    #[cfg_attr(docsrs, doc(cfg(all(feature = "compression", feature = "encryption"))))]
    #[doc = include_str!("../docs/guide/codecs.md")]
    pub mod codecs {}
    #[doc = include_str!("../docs/guide/backends.md")]
    pub mod backends {}
    #[doc = include_str!("../docs/guide/operating.md")]
    pub mod operating {}
}

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use backend::redis;

pub use answer::{Fetched, Outcome};
pub use backend::memory::MemoryBackend;
pub use backend::Backend;
pub use blocking::{BlockingCache, BlockingWithOptions};
pub use builder::CacheBuilder;
pub use cache::{Cache, WithOptions};
#[cfg(feature = "macros")]
#[doc(hidden)]
pub use cached::expansion as __private;
#[cfg(all(feature = "macros", feature = "redis"))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "macros", feature = "redis"))))]
pub use cached::REDIS_URL_VAR;
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use cached::{set_default_backend, DefaultBackend};
pub use circuit::{CircuitBreaker, CircuitState};
#[cfg(feature = "compression")]
#[cfg_attr(docsrs, doc(cfg(feature = "compression")))]
pub use codec::Compressed;
#[cfg(feature = "postcard")]
#[cfg_attr(docsrs, doc(cfg(feature = "postcard")))]
pub use codec::PostcardCodec;
pub use codec::{Codec, JsonCodec, Marker};
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub use codec::{Encrypted, KeyRing, KeyRingError, KEY_LEN};
pub use envelope::{MAX_TAGS, MAX_TAG_BYTES};
pub use error::{
    BackendError, BackendErrorKind, BoxError, CodecError, ConfigError, Error, InputError,
    IntoLoaderError, LoaderError,
};
pub use l1::{Untracked, DEFAULT_UNTRACKED_MAX_AGE, L1};
pub use lease::LeaseTtl;
pub use loader::{BatchLoader, Loaded, Loader};
pub use marks::TAG_RETENTION;
pub use options::{CallOptions, MAX_TTL};
pub use stats::Stats;
pub use token::LeaseToken;
pub use wait::{OnWaitTimeout, WaitPolicy};

/// The cache of a function, in one attribute: its body becomes the loader
/// of a [`Cache`] call (an `async fn`) or a [`BlockingCache`] call (a plain
/// `fn`), keyed by its arguments. The default backend of the functions
/// that name no cache is declared once per crate with [`default_backend!`];
/// see also [`DefaultBackend`], [`set_default_backend`] and the
/// [guide](crate::_guide::cached).
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use onefill_macros::cached;
