//! `#[onefill::cached]` at run time: the default backend of the functions
//! that name no cache of their own ([`DefaultBackend`], declared once per
//! crate with [`default_backend!`](crate::default_backend), or set at start
//! with [`set_default_backend`]), here; the hidden items the expansion
//! calls (each function's cache slot, its key, its answer), in
//! `expansion.rs`; where a function is, and so its namespace, in `site.rs`.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::runtime::Handle;

use crate::backend::Backend;
use crate::blocking::{BlockingCache, Driver};
use crate::builder::CacheBuilder;
use crate::cache::Cache;
use crate::error::{ConfigError, Error};

/// The environment variable [`DefaultBackend::redis_from_env`] reads.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub const REDIS_URL_VAR: &str = "ONEFILL_REDIS_URL";

/// Where the caches of `#[onefill::cached]` functions without `cache = …`
/// keep their values: what a crate declares with
/// [`default_backend!`](crate::default_backend). Each such function gets a
/// cache of its own on it (its own namespace and freshness), built at its
/// first call.
///
/// - any [`Backend`] converts into one: `onefill::MemoryBackend::new()`,
///   say;
/// - `DefaultBackend::redis_from_env` (feature `redis`): the Redis server
///   named by `ONEFILL_REDIS_URL`, connected at the first call;
/// - [`DefaultBackend::set_at_start`]: whatever the program sets with
///   [`set_default_backend`] at start (for a library, whose application
///   chooses).
///
/// A backend set with [`set_default_backend`] is used instead of any
/// declared one, in every crate of the program.
pub struct DefaultBackend(Source);

enum Source {
    Ready(Store),
    #[cfg(feature = "redis")]
    Redis(Result<String, ConfigError>),
    SetAtStart,
}

impl<B: Backend> From<B> for DefaultBackend {
    fn from(backend: B) -> Self {
        DefaultBackend(Source::Ready(Store::of(backend)))
    }
}

impl DefaultBackend {
    /// The backend set at start with [`set_default_backend`]; a call before
    /// it fails with [`Error::Config`].
    pub fn set_at_start() -> Self {
        DefaultBackend(Source::SetAtStart)
    }

    /// The Redis server at `url`, connected at the first call (in a
    /// runtime of the default's own, so it outlives the runtime of
    /// whichever caller came first).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn redis(url: impl Into<String>) -> Self {
        DefaultBackend(Source::Redis(Ok(url.into())))
    }

    /// The Redis server whose URL is in the environment variable
    /// `ONEFILL_REDIS_URL` ([`REDIS_URL_VAR`]), read and connected at the
    /// first call. Unset, every call fails with [`Error::Config`] naming it.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn redis_from_env() -> Self {
        DefaultBackend(Source::Redis(std::env::var(REDIS_URL_VAR).map_err(|e| {
            misconfigured(format!(
                "the default backend is the Redis server named by {REDIS_URL_VAR}, which is \
                 not usable: {e}"
            ))
        })))
    }
}

impl fmt::Debug for DefaultBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.0 {
            Source::Ready(_) => "Ready",
            #[cfg(feature = "redis")]
            Source::Redis(_) => "Redis",
            Source::SetAtStart => "SetAtStart",
        };
        f.debug_tuple("DefaultBackend").field(&kind).finish()
    }
}

/// Sets the default backend of every `#[onefill::cached]` function without
/// `cache = …`, in every crate of the program, instead of what each
/// declared. Call it once, at the start of `main`.
///
/// Called within a multi-thread runtime, that runtime drives the backend
/// for synchronous functions; otherwise they use a runtime of the
/// default's own (two threads, started at their first call).
///
/// ```
/// onefill::default_backend!(onefill::DefaultBackend::set_at_start());
///
/// #[onefill::cached(ttl = "1m")]
/// fn square(n: u64) -> Result<u64, onefill::BoxError> {
///     Ok(n * n)
/// }
///
/// fn main() -> Result<(), onefill::BoxError> {
///     onefill::set_default_backend(onefill::MemoryBackend::new())?;
///     assert_eq!(square(12)?, 144);
///     Ok(())
/// }
/// ```
///
/// # Errors
///
/// [`ConfigError`] if a default was set already, or is in use already (a
/// function made its cache at its first call).
pub fn set_default_backend(backend: impl Backend) -> Result<(), ConfigError> {
    let home = Handle::try_current()
        .ok()
        .and_then(|handle| Driver::on(handle).ok());
    let mut defaults = DEFAULTS.lock().unwrap_or_else(PoisonError::into_inner);
    if defaults.declared_in_use {
        return Err(misconfigured(
            "the default backend is in use already: set it before the first call of a \
             `#[onefill::cached]` function"
                .to_owned(),
        ));
    }
    if defaults.at_start.is_some() {
        return Err(misconfigured(
            "the default backend was set already".to_owned(),
        ));
    }
    defaults.at_start = Some(Resolved {
        store: Store::of(backend),
        home,
    });
    Ok(())
}

/// Declares, at the crate root, the default backend of the crate's
/// `#[onefill::cached]` functions that name no cache (`cache = …`); the
/// argument is anything that converts into a [`DefaultBackend`], evaluated
/// once, at the first call that needs it.
///
/// ```
/// onefill::default_backend!(onefill::MemoryBackend::new());
/// # fn main() {}
/// ```
///
/// Without one, such a function does not compile, and the error says so.
/// It must be at the crate root (the expansion looks for it there); a
/// crate has at most one.
#[macro_export]
macro_rules! default_backend {
    ($source:expr $(,)?) => {
        #[doc(hidden)]
        #[allow(dead_code)]
        pub(crate) enum __OnefillDefault {}

        impl $crate::__private::DeclaredDefault for __OnefillDefault {
            fn slot() -> &'static $crate::__private::DeclaredSlot {
                static SLOT: $crate::__private::DeclaredSlot =
                    $crate::__private::DeclaredSlot::new();
                &SLOT
            }
            fn source() -> $crate::DefaultBackend {
                ::core::convert::Into::into($source)
            }
        }
    };
}

fn misconfigured(reason: String) -> ConfigError {
    ConfigError::Option {
        option: "default_backend",
        reason,
    }
}

/// A backend, kept as a `RedisBackend` when it is one (a cache built on
/// that type takes its faster hit path).
#[derive(Clone)]
enum Store {
    Shared(Arc<dyn Backend>),
    #[cfg(feature = "redis")]
    Redis(crate::backend::redis::RedisBackend),
}

impl Store {
    fn of<B: Backend>(backend: B) -> Store {
        #[cfg(feature = "redis")]
        {
            let any: &dyn std::any::Any = &backend;
            if let Some(redis) = any.downcast_ref::<crate::backend::redis::RedisBackend>() {
                return Store::Redis(redis.clone());
            }
        }
        Store::Shared(Arc::new(backend))
    }

    fn install<V>(&self, builder: CacheBuilder<String, V>) -> CacheBuilder<String, V> {
        match self {
            Store::Shared(backend) => builder.shared_backend(backend.clone()),
            #[cfg(feature = "redis")]
            Store::Redis(redis) => builder.backend(redis.clone()),
        }
    }
}

/// A default backend ready for caches: the store, and the runtime it lives
/// in when it lives in one (a connected Redis, a handle captured at start).
#[derive(Clone)]
struct Resolved {
    store: Store,
    home: Option<Driver>,
}

/// The backend set at start, and whether a crate's declared one is in use
/// (caches were made on it): decided together, under one lock, so a set
/// that returns `Ok` is the default of every cache made afterwards, and a
/// first call that made nothing (it failed) does not keep it from being set.
struct Defaults {
    at_start: Option<Resolved>,
    declared_in_use: bool,
}

static DEFAULTS: Mutex<Defaults> = Mutex::new(Defaults {
    at_start: None,
    declared_in_use: false,
});
static OWN_RUNTIME: OnceLock<Driver> = OnceLock::new();

/// The default's own runtime: it connects Redis (so the connection
/// outlives any caller's runtime) and drives synchronous functions when
/// no multi-thread runtime was captured at start. Never shut down.
fn own_runtime() -> Result<&'static Driver, ConfigError> {
    if let Some(driver) = OWN_RUNTIME.get() {
        return Ok(driver);
    }
    let driver = Driver::owned()?;
    // Two first callers may each start one: the loser's shuts down.
    Ok(OWN_RUNTIME.get_or_init(|| driver))
}

/// The backend set at start if there is one, else the crate's declared
/// one, then marked in use (unless the former was set meanwhile: then it).
async fn resolve(source: DefaultBackend) -> Result<Resolved, Error> {
    if let Some(set) = set_at_start() {
        return Ok(set);
    }
    let declared = declared_backend(source).await?;
    let mut defaults = DEFAULTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(set) = &defaults.at_start {
        return Ok(set.clone());
    }
    defaults.declared_in_use = true;
    Ok(declared)
}

fn set_at_start() -> Option<Resolved> {
    let defaults = DEFAULTS.lock().unwrap_or_else(PoisonError::into_inner);
    defaults.at_start.clone()
}

async fn declared_backend(source: DefaultBackend) -> Result<Resolved, Error> {
    match source.0 {
        Source::Ready(store) => Ok(Resolved { store, home: None }),
        Source::SetAtStart => Err(Error::Config(misconfigured(
            "no default backend was set: call `onefill::set_default_backend` at the start of \
             `main`, before the first call of a `#[onefill::cached]` function"
                .to_owned(),
        ))),
        #[cfg(feature = "redis")]
        Source::Redis(url) => {
            let url = url.map_err(Error::Config)?;
            let home = own_runtime().map_err(Error::Config)?.clone();
            let connected = home
                .handle()
                .spawn(async move { crate::backend::redis::RedisBackend::connect(&url).await })
                .await
                .map_err(|e| {
                    Error::Config(misconfigured(format!("connecting to Redis failed: {e}")))
                })??;
            Ok(Resolved {
                store: Store::Redis(connected),
                home: Some(home),
            })
        }
    }
}

/// One function's cache, built on the default backend for its call site.
fn build<V>(
    resolved: &Resolved,
    site: &expansion::Site,
    setup: impl FnOnce(CacheBuilder<String, V>) -> CacheBuilder<String, V>,
) -> Result<Cache<String, V>, Error>
where
    V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let builder = resolved
        .store
        .install(Cache::builder().namespace(site.namespace()));
    // Built inside the runtime the backend lives in: it may start tasks
    // there as the cache is installed (Redis change tracking for an L1).
    let _entered = resolved.home.as_ref().map(|home| home.handle().enter());
    setup(builder).build().map_err(Error::Config)
}

/// What the expansion of `#[onefill::cached]` calls (as
/// `onefill::__private`); not an API.
#[doc(hidden)]
pub mod expansion;
mod site;
