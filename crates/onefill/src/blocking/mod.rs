//! [`BlockingCache`]: the cache for synchronous code (`std::thread`
//! workers, CLI tools, batch jobs, sync web frameworks, FFI), with every
//! guarantee of the async [`Cache`] it wraps. Each call is the async call,
//! driven to completion by `driver.rs`; each loader is a plain closure run
//! on the runtime's blocking pool by `load.rs`.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt::{self, Display};
use std::hash::Hash;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::runtime::{Handle, Runtime};

use crate::answer::Fetched;
use crate::builder::CacheBuilder;
use crate::cache::Cache;
use crate::circuit::CircuitState;
use crate::error::{ConfigError, Error, IntoLoaderError};
use crate::loader::Loaded;
use crate::options::CallOptions;
use crate::stats::Stats;

mod driver;
mod load;
mod with_options;

pub(crate) use driver::Driver;

/// The options of a call that sets none.
static NO_OPTIONS: CallOptions = CallOptions::NONE;
pub use with_options::BlockingWithOptions;

/// A [`Cache`] for synchronous callers: the same calls, blocking until
/// answered, with loaders that are plain closures `FnOnce(K) -> Result<T,
/// E>`.
///
/// Every guarantee of the async cache holds, because each call *is* the
/// async call: one load per key across the fleet (blocking and async
/// callers of a key share it), bounded waits, stale answers, fail-safe, the
/// L1. A loader runs on the runtime's blocking pool, never on an async
/// worker, so a slow query cannot starve the runtime that drives the
/// backend for every other caller.
///
/// Get one from [`CacheBuilder::build_blocking`] (with a runtime of its
/// own: for programs without one) or [`Cache::blocking`] (on the
/// application's multi-thread runtime). Cheap to clone, `Send + Sync`:
/// share it between threads.
///
/// ```
/// use std::time::Duration;
///
/// let users = onefill::Cache::<u64, String>::builder()
///     .namespace("users")
///     .ttl(Duration::from_secs(60))
///     .build_blocking()?;
/// let workers: Vec<_> = (0..8)
///     .map(|_| {
///         let users = users.clone();
///         std::thread::spawn(move || {
///             // A plain closure: a synchronous query, say.
///             users.get_or_load(&42, |id| Ok::<_, std::io::Error>(format!("user {id}")))
///         })
///     })
///     .collect();
/// for worker in workers {
///     assert_eq!(worker.join().unwrap()?, "user 42");
/// }
/// assert_eq!(users.stats().loads_ok, 1, "eight threads, one load");
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
///
/// # From async code
///
/// From `spawn_blocking` (on any runtime) the calls wait on that thread.
/// From an async task (or a runtime's main future), on either runtime
/// flavour, they return [`Error::BlockingInAsync`] at once, never a hang:
/// waiting there would stall the worker's other tasks, and on a
/// current-thread runtime every task. In async code, call the async
/// [`Cache`] ([`BlockingCache::as_async`]): it is the same cache.
///
/// ```
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cache = onefill::Cache::<u64, String>::builder().build()?;
/// let blocking = cache.blocking()?;
/// let name = tokio::task::spawn_blocking(move || {
///     blocking.get_or_load(&7, |id| Ok::<_, std::io::Error>(format!("user {id}")))
/// })
/// .await??;
/// assert_eq!(name, "user 7");
/// // Async callers of the same cache share its flights, L1 and stats.
/// assert_eq!(cache.get(&7).await?, Some("user 7".to_owned()));
/// # Ok(()) }
/// ```
///
/// # Cancellation and timeouts
///
/// A blocking call cannot be dropped half-way, but its loader may outlive
/// it: the maximum load time answers the callers with
/// [`Error::LoadTimedOut`] and releases the lease, while the closure,
/// which nothing can interrupt, finishes on its blocking thread and its
/// result is dropped.
pub struct BlockingCache<K, V> {
    cache: Cache<K, V>,
    driver: Driver,
}

impl<K, V> Clone for BlockingCache<K, V> {
    fn clone(&self) -> Self {
        BlockingCache {
            cache: self.cache.clone(),
            driver: self.driver.clone(),
        }
    }
}

impl<K, V> fmt::Debug for BlockingCache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingCache")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl<K, V> CacheBuilder<K, V>
where
    K: Display + Clone + Send + Sync + 'static,
    V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    /// Builds the cache for synchronous callers, with a runtime of its own
    /// (two worker threads, named `onefill-blocking`, shut down when the
    /// last clone of the handle is dropped). For code with a runtime of
    /// its own, [`Cache::blocking`] shares it instead.
    ///
    /// A backend that must be connected in a runtime (Redis) is connected
    /// in the one that will drive it: see [`Cache::into_blocking`].
    ///
    /// # Errors
    ///
    /// As [`build`](CacheBuilder::build), and [`ConfigError`] if the
    /// runtime cannot start (no threads left).
    pub fn build_blocking(self) -> Result<BlockingCache<K, V>, ConfigError> {
        let driver = Driver::owned()?;
        // Built inside the runtime that will drive it: a backend may start
        // tasks of its own as it is installed.
        let cache = {
            let _entered = driver.handle().enter();
            self.build()?
        };
        Ok(BlockingCache { cache, driver })
    }
}

impl<K, V> Cache<K, V> {
    /// This cache for synchronous callers, on the multi-thread runtime this
    /// is called in. It shares everything with this cache: flights, L1,
    /// stats.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] outside a runtime, or in a current-thread one (its
    /// I/O stops while its thread waits, so blocked callers could wait for
    /// ever): use [`CacheBuilder::build_blocking`] there.
    pub fn blocking(&self) -> Result<BlockingCache<K, V>, ConfigError> {
        let handle = Handle::try_current().map_err(|_| ConfigError::Option {
            option: "blocking",
            reason: "`Cache::blocking` must be called within a tokio runtime: use \
                     `Cache::blocking_on` with a handle, or `CacheBuilder::build_blocking`"
                .to_owned(),
        })?;
        self.blocking_on(handle)
    }

    /// This cache for synchronous callers, on the runtime `handle` belongs
    /// to (the one the backend was connected in), which must outlive the
    /// calls, as with any tokio `Handle`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if it is a current-thread runtime (see
    /// [`blocking`](Cache::blocking)).
    pub fn blocking_on(&self, handle: Handle) -> Result<BlockingCache<K, V>, ConfigError> {
        Ok(BlockingCache {
            cache: self.clone(),
            driver: Driver::on(handle)?,
        })
    }

    /// This cache for synchronous callers, on `runtime`, the one its
    /// backend was connected in, which the blocking handle keeps (and shuts
    /// down when its last clone goes): how a program without async code of
    /// its own uses Redis.
    ///
    /// ```no_run
    /// # #[cfg(feature = "redis")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let cache = runtime.block_on(async {
    ///     let backend = onefill::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    ///     let cache = onefill::Cache::<u64, String>::builder()
    ///         .namespace("users")
    ///         .backend(backend)
    ///         .build()?;
    ///     Ok::<_, Box<dyn std::error::Error>>(cache)
    /// })?;
    /// let users = cache.into_blocking(runtime)?;
    /// let name = users.get_or_load(&42, |id| Ok::<_, std::io::Error>(format!("user {id}")))?;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "redis"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if it is a current-thread runtime (see
    /// [`blocking`](Cache::blocking)); the runtime is then shut down.
    pub fn into_blocking(self, runtime: Runtime) -> Result<BlockingCache<K, V>, ConfigError> {
        Ok(BlockingCache {
            cache: self,
            driver: Driver::owning(runtime)?,
        })
    }
}

impl<K, V> BlockingCache<K, V>
where
    K: Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Returns the cached value, or runs `loader` on a blocking thread to
    /// produce and store it, once across every process sharing the backend.
    /// As [`Cache::get_or_load`], for a plain closure.
    ///
    /// # Errors
    ///
    /// As [`Cache::get_or_load`], and [`Error::BlockingInAsync`] from an
    /// async task (see [From async code](BlockingCache#from-async-code)).
    pub fn get_or_load<Q, F, T, E>(&self, key: &Q, loader: F) -> Result<V, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(K) -> Result<T, E> + Send + 'static,
        T: Into<Loaded<V>> + Send + 'static,
        E: IntoLoaderError,
    {
        self.fetch(key, loader).map(|fetched| fetched.value)
    }

    /// [`get_or_load`](BlockingCache::get_or_load), also saying how the
    /// call was answered. As [`Cache::fetch`].
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](BlockingCache::get_or_load).
    pub fn fetch<Q, F, T, E>(&self, key: &Q, loader: F) -> Result<Fetched<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(K) -> Result<T, E> + Send + 'static,
        T: Into<Loaded<V>> + Send + 'static,
        E: IntoLoaderError,
    {
        self.plain().fetch(key, loader)
    }

    /// For loaders that may find nothing: `Ok(None)` is cached as the
    /// key's absence. As [`Cache::get_or_load_optional`].
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](BlockingCache::get_or_load), except that a cached
    /// absence is `Ok(None)`.
    pub fn get_or_load_optional<Q, F, T, E>(&self, key: &Q, loader: F) -> Result<Option<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(K) -> Result<T, E> + Send + 'static,
        T: Into<Loaded<Option<V>>> + Send + 'static,
        E: IntoLoaderError,
    {
        self.fetch_optional(key, loader)
            .map(|fetched| fetched.value)
    }

    /// [`get_or_load_optional`](BlockingCache::get_or_load_optional),
    /// reporting how the call was answered. As [`Cache::fetch_optional`].
    ///
    /// # Errors
    ///
    /// As [`get_or_load_optional`](BlockingCache::get_or_load_optional).
    pub fn fetch_optional<Q, F, T, E>(
        &self,
        key: &Q,
        loader: F,
    ) -> Result<Fetched<Option<V>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(K) -> Result<T, E> + Send + 'static,
        T: Into<Loaded<Option<V>>> + Send + 'static,
        E: IntoLoaderError,
    {
        self.plain().fetch_optional(key, loader)
    }

    /// The values of many keys, the missing ones loaded by one call of
    /// `loader` on a blocking thread. As [`Cache::get_or_load_many`].
    ///
    /// # Errors
    ///
    /// As [`Cache::get_or_load_many`], and [`Error::BlockingInAsync`].
    pub fn get_or_load_many<F, I, T, E>(
        &self,
        keys: &[K],
        loader: F,
    ) -> Result<HashMap<K, V>, Error>
    where
        K: Hash + Eq,
        F: Fn(Vec<K>) -> Result<I, E> + Send + Sync + 'static,
        I: IntoIterator<Item = (K, T)> + Send + 'static,
        T: Into<Loaded<V>>,
        E: IntoLoaderError,
    {
        self.plain().get_or_load_many(keys, loader)
    }

    /// Each key's answer on its own. As [`Cache::fetch_many`].
    ///
    /// # Errors
    ///
    /// As [`Cache::fetch_many`], and [`Error::BlockingInAsync`].
    #[allow(clippy::type_complexity)]
    pub fn fetch_many<F, I, T, E>(
        &self,
        keys: &[K],
        loader: F,
    ) -> Result<HashMap<K, Result<Fetched<Option<V>>, Error>>, Error>
    where
        K: Hash + Eq,
        F: Fn(Vec<K>) -> Result<I, E> + Send + Sync + 'static,
        I: IntoIterator<Item = (K, T)> + Send + 'static,
        T: Into<Loaded<V>>,
        E: IntoLoaderError,
    {
        self.plain().fetch_many(keys, loader)
    }

    /// The calls without options of their own: the cache treats calls
    /// with no option set as plain ones (the L1 included).
    fn plain(&self) -> BlockingWithOptions<'_, K, V> {
        BlockingWithOptions::new(self, &NO_OPTIONS)
    }

    /// These calls with per-call options. As [`Cache::with_options`].
    pub fn with_options<'a>(&'a self, options: &'a CallOptions) -> BlockingWithOptions<'a, K, V> {
        BlockingWithOptions::new(self, options)
    }

    /// The cached value, if there is a fresh one. As [`Cache::get`].
    ///
    /// # Errors
    ///
    /// As [`Cache::get`], and [`Error::BlockingInAsync`].
    pub fn get<Q>(&self, key: &Q) -> Result<Option<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        self.driver.run(self.cache.get(key))?
    }

    /// Stores a value. As [`Cache::set`].
    ///
    /// # Errors
    ///
    /// As [`Cache::set`], and [`Error::BlockingInAsync`].
    pub fn set<Q>(&self, key: &Q, value: V) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        self.plain().set(key, value)
    }

    /// Removes a key, in every process. As [`Cache::invalidate`].
    ///
    /// # Errors
    ///
    /// As [`Cache::invalidate`], and [`Error::BlockingInAsync`].
    pub fn invalidate<Q>(&self, key: &Q) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        self.driver.run(self.cache.invalidate(key))?
    }

    /// Marks a key's value stale, in every process, without removing it.
    /// As [`Cache::expire`].
    ///
    /// # Errors
    ///
    /// As [`Cache::expire`], and [`Error::BlockingInAsync`].
    pub fn expire<Q>(&self, key: &Q) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        self.driver.run(self.cache.expire(key))?
    }

    /// Stores a value carrying `tags`. As [`Cache::set_tagged`].
    ///
    /// # Errors
    ///
    /// As [`Cache::set_tagged`], and [`Error::BlockingInAsync`].
    pub fn set_tagged<Q, I, T>(&self, key: &Q, value: V, tags: I) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.plain().set_tagged(key, value, tags)
    }

    /// Makes every value tagged `tag` a miss, in every process. As
    /// [`Cache::invalidate_tag`].
    ///
    /// # Errors
    ///
    /// As [`Cache::invalidate_tag`], and [`Error::BlockingInAsync`].
    pub fn invalidate_tag(&self, tag: &str) -> Result<(), Error> {
        self.driver.run(self.cache.invalidate_tag(tag))?
    }

    /// Makes every value tagged `tag` stale, in every process. As
    /// [`Cache::expire_tag`].
    ///
    /// # Errors
    ///
    /// As [`Cache::expire_tag`], and [`Error::BlockingInAsync`].
    pub fn expire_tag(&self, tag: &str) -> Result<(), Error> {
        self.driver.run(self.cache.expire_tag(tag))?
    }

    /// Makes every value of the namespace a miss, in every process. As
    /// [`Cache::clear`].
    ///
    /// # Errors
    ///
    /// As [`Cache::clear`], and [`Error::BlockingInAsync`].
    pub fn clear(&self) -> Result<(), Error> {
        self.driver.run(self.cache.clear())?
    }

    /// Counts since the cache was built. As [`Cache::stats`].
    pub fn stats(&self) -> Stats {
        self.cache.stats()
    }

    /// How many failed writes wait to be replayed. As
    /// [`Cache::pending_writes`].
    pub fn pending_writes(&self) -> usize {
        self.cache.pending_writes()
    }

    /// The circuit breaker's state. As [`Cache::circuit_state`].
    pub fn circuit_state(&self) -> CircuitState {
        self.cache.circuit_state()
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        self.cache.namespace()
    }

    /// The async cache this handle drives: the same flights, L1 and stats.
    pub fn as_async(&self) -> &Cache<K, V> {
        &self.cache
    }

    /// The runtime its calls run on.
    pub fn runtime(&self) -> &Handle {
        self.driver.handle()
    }
}
