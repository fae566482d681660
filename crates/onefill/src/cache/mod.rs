//! The public face: [`Cache`], and [`WithOptions`] for calls with their
//! own options. One verb per choice: `get_or_load` answers the value,
//! `fetch` the value and how it was answered; `_optional` takes a loader
//! that may find nothing, `_many` many keys at once; a loader returns `V`
//! or a [`Loaded<V>`](crate::Loaded) that chooses its freshness; options
//! come through [`Cache::with_options`]. Every verb is a few lines over
//! one of three private primitives: `load_one` (`one.rs`), `load_many`
//! (`many.rs`) and `write`. (A little over 600 lines, most of them the
//! verbs' rustdoc and examples: the face users read is one page.)

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt::{self, Display};
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;

use tokio::time::Instant;
use tracing::Instrument;

use crate::answer::Fetched;
use crate::circuit::CircuitState;
use crate::error::Error;
use crate::key::{FillKeys, KeyBuf};
use crate::l1::Lookup;
use crate::loader::{BatchLoader, Loaded, Loader};
use crate::options::CallOptions;
use crate::shared::{Shared, Writing};
use crate::stats::Stats;

/// The options of a call that sets none: a `&CallOptions::default()`
/// temporary would be held through the call (~230 bytes of its future).
static NO_OPTIONS: CallOptions = CallOptions::NONE;

/// The span of a call other than a load (`get`, `set`, `invalidate`,
/// `expire`):
/// `tracing` wants a literal name per call site.
macro_rules! call_span {
    ($name:literal, $cache:expr) => {
        tracing::info_span!(
            $name,
            namespace = $cache.shared.namespace.as_str(),
            outcome = tracing::field::Empty,
            error = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
        )
    };
}

mod many;
mod marks;
mod one;
mod primitives;
mod with_options;

use primitives::ended;
pub use with_options::WithOptions;

/// A cache-aside cache whose fills are single-flight across the fleet.
///
/// Cheap to clone (an `Arc`), `Send + Sync`. Many caches, each with its own
/// namespace, may share one backend. Keys are any `Display` type: the
/// string form is the key.
///
/// Every keyed call takes the key borrowed as `HashMap::get` does
/// (`K: Borrow<Q>`): a `Cache<String, _>` takes `"42"` as well as
/// `&"42".to_string()`. `Q`'s string form must be `K`'s (as for `str` and
/// `String`): a `Q` that displays otherwise names another key, and nothing
/// can check it (as `HashMap` cannot check that `Hash` agrees). A loader
/// still receives the owned `K` (`Q::to_owned`, made only when the loader
/// may run: an L1 hit allocates no key), so the loading calls also need
/// `Q: ToOwned<Owned = K>` (a `Cache<Arc<str>, _>` takes `&Arc<str>`
/// there, not `&str`).
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
/// // A `&str` for a `String` key; the loader gets the owned `String`.
/// let name = cache
///     .get_or_load("42", |id: String| async move {
///         Ok::<_, std::io::Error>(format!("user {id}"))
///     })
///     .await?;
/// assert_eq!(name, "user 42");
/// assert_eq!(cache.get(&"42".to_string()).await?.as_deref(), Some("user 42"));
/// assert_eq!(cache.stats().loads_ok, 1);
/// # Ok(()) }
/// ```
pub struct Cache<K, V> {
    shared: Arc<Shared<V>>,
    _key: PhantomData<fn(K)>,
}

impl<K, V> Clone for Cache<K, V> {
    fn clone(&self) -> Self {
        Cache::from_shared(self.shared.clone())
    }
}

impl<K, V> Cache<K, V> {
    pub(crate) fn from_shared(shared: Arc<Shared<V>>) -> Self {
        Cache {
            shared,
            _key: PhantomData,
        }
    }
}

impl<K, V> fmt::Debug for Cache<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("namespace", &self.shared.namespace)
            .field("backend", &self.shared.calls.backend)
            .field("policy", &self.shared.policy)
            .finish()
    }
}

impl<K, V> Cache<K, V>
where
    K: Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Returns the cached value, or runs `loader` to produce and store it,
    /// once across every process sharing the backend.
    ///
    /// The loader returns the value, or a [`Loaded`] that also chooses the
    /// value's TTL and grace (a short TTL for a draft, a long one for a
    /// published page; what it leaves unset is the call's policy). A chosen
    /// TTL or grace out of range is clamped (see [`Loaded::ttl`]), never an
    /// error.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use std::time::Duration;
    /// use onefill::Loaded;
    ///
    /// struct Page { body: String, published: bool }
    /// async fn load_page(id: String) -> std::io::Result<Page> {
    ///     Ok(Page { body: format!("page {id}"), published: id != "draft" })
    /// }
    ///
    /// let cache = onefill::Cache::<String, String>::builder().build().unwrap();
    /// // A plain value, with the cache's freshness…
    /// let user = cache
    ///     .get_or_load("user:1", |id| async move { Ok::<_, std::io::Error>(format!("{id}!")) })
    ///     .await?;
    /// // …or a value that chooses its own.
    /// let page = cache
    ///     .get_or_load("home", |id| async move {
    ///         let page = load_page(id).await?;
    ///         let ttl = if page.published { 3600 } else { 5 };
    ///         Ok::<_, std::io::Error>(Loaded::new(page.body).ttl(Duration::from_secs(ttl)))
    ///     })
    ///     .await?;
    /// assert_eq!((user.as_str(), page.as_str()), ("user:1!", "page home"));
    /// # Ok(()) }
    /// ```
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
    /// The loader and everything after a miss run detached (spawned).
    /// Dropping the future of any caller, the one whose loader runs
    /// included, cancels neither the load nor the lease: the other callers
    /// still get the result and the lease is released or filled as usual.
    /// (A flight's first read runs in its first caller's task, so a hit
    /// costs no task; if that caller is dropped during the read, the flight
    /// starts over in a task of its own for the others.)
    ///
    /// # With an L1
    ///
    /// With [`CacheBuilder::l1`](crate::CacheBuilder::l1), a fresh value this process read before is
    /// answered from memory (no backend call, no flight) while the backend
    /// vouches for it; see [`L1`](crate::L1). Calls with options of their
    /// own ([`with_options`](Cache::with_options)) always go through the
    /// flight.
    ///
    /// # Errors
    ///
    /// - [`Error::Loader`] with the loader's own error (as
    ///   [`LoaderError`](crate::LoaderError)), shared by every coalesced caller;
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
    pub async fn get_or_load<Q, F, T>(&self, key: &Q, loader: F) -> Result<V, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<V>>,
    {
        self.load_value(key, &NO_OPTIONS, loader)
            .await
            .map(|f| f.value)
    }

    /// Like [`get_or_load`](Cache::get_or_load), and also says how the call
    /// was answered ([`Outcome`](crate::Outcome)) and whether it shared
    /// another call's flight.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use onefill::Outcome;
    /// let cache = onefill::Cache::<u32, u32>::builder().build().unwrap();
    /// let load = |k: u32| async move { Ok::<_, std::io::Error>(k + 1) };
    /// let first = cache.fetch(&1, load).await?;
    /// assert_eq!((first.value, first.outcome), (2, Outcome::Loaded));
    /// let second = cache.fetch(&1, load).await?;
    /// assert_eq!(second.outcome, Outcome::Hit);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](Cache::get_or_load).
    pub async fn fetch<Q, F, T>(&self, key: &Q, loader: F) -> Result<Fetched<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<V>>,
    {
        self.load_value(key, &NO_OPTIONS, loader).await
    }

    /// For loaders that may find nothing: `Ok(None)` from the loader is
    /// cached as the key's absence (for `negative_ttl` if set, else `ttl`;
    /// a [`Loaded`] of `None` may choose how long), so a missing row is not
    /// looked up again by every caller.
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
    pub async fn get_or_load_optional<Q, F, T>(
        &self,
        key: &Q,
        loader: F,
    ) -> Result<Option<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<Option<V>>>,
    {
        self.load_one(key, &NO_OPTIONS, loader)
            .await
            .map(|f| f.value)
    }

    /// [`get_or_load_optional`](Cache::get_or_load_optional), reporting how
    /// the call was answered, as [`fetch`](Cache::fetch).
    ///
    /// # Errors
    ///
    /// As [`get_or_load_optional`](Cache::get_or_load_optional).
    pub async fn fetch_optional<Q, F, T>(
        &self,
        key: &Q,
        loader: F,
    ) -> Result<Fetched<Option<V>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<Option<V>>>,
    {
        self.load_one(key, &NO_OPTIONS, loader).await
    }

    /// Returns the values of many keys at once, loading the missing ones
    /// with **one** call of `loader` (per process), once across every
    /// process sharing the backend.
    ///
    /// `loader` gets the keys this process holds the lease of (each key
    /// once, in the order given) and returns what it found as `(key, value)`
    /// pairs: a `HashMap<K, V>`, a `Vec<(K, V)>`, any `IntoIterator`, each
    /// value plain or a [`Loaded`] one (its own freshness, or not stored). A key
    /// it does not return **is absent**: cached as such (for
    /// `negative_ttl` if set, else `ttl`, as
    /// [`get_or_load_optional`](Cache::get_or_load_optional)'s `Ok(None)`)
    /// and missing from the answer, so a `SELECT … WHERE id = ANY($1)` that
    /// finds no row for a key is not asked again by every caller. Pairs for
    /// keys it was not asked for are ignored (not stored: nobody leased them);
    /// a key returned twice keeps its first pair.
    ///
    /// The answer maps each key found to its value; duplicate keys (by
    /// their string form) are answered once; no keys, no work (the loader
    /// is not called).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use std::collections::HashMap;
    ///
    /// let cache = onefill::Cache::<u64, String>::builder().build().unwrap();
    /// let users = cache
    ///     .get_or_load_many(&[1, 2, 3], |ids: Vec<u64>| async move {
    ///         // One query for every id missing from the cache, e.g.
    ///         // `SELECT id, name FROM users WHERE id = ANY($1)`.
    ///         let rows: HashMap<u64, String> = ids
    ///             .into_iter()
    ///             .filter(|id| *id != 3) // no user 3
    ///             .map(|id| (id, format!("user {id}")))
    ///             .collect();
    ///         Ok::<_, std::io::Error>(rows)
    ///     })
    ///     .await?;
    /// assert_eq!(users[&1], "user 1");
    /// assert!(!users.contains_key(&3)); // absent, and cached as such
    /// # Ok(()) }
    /// ```
    ///
    /// # How it runs
    ///
    /// Keys fresh in the [`L1`](crate::L1) are answered from it. Every
    /// other key runs the protocol of [`get_or_load`](Cache::get_or_load),
    /// step for step, with the steps its keys take at the same moment made
    /// together: their reads in one round trip (a pipeline; on a Redis
    /// Cluster one per master, in parallel), the misses' lease requests in
    /// one more, and `loader` once for the keys won (each filled fenced on
    /// its own lease token, exactly as a single fill) with any keys to load
    /// without the lease (the backend failed them, or `no_lease` found them
    /// held). The keys other processes are loading are waited for as a
    /// single call waits (each subscribed to its fill notification, each
    /// within the wait policy's deadline, with its outcome); keys woken
    /// together are re-read, re-asked for and taken over together. Stale
    /// values are served and refreshed together in the background. So
    /// `loader` may run more than once in a call: once for the keys won at
    /// first, and once more for each group taken over or loaded at the
    /// wait deadline together, or refreshed in the background. Batches of
    /// more than [`MAX_PIPELINE`](crate::backend::MAX_PIPELINE) keys are
    /// sent in chunks of that size (concurrently); `loader` still gets all
    /// the keys won in one call.
    ///
    /// # Concurrent calls on the same key
    ///
    /// Each key joins the in-process flight of that key like a single call:
    /// a batch and a [`get_or_load`](Cache::get_or_load) (or another batch)
    /// racing on a key share one flight, whoever started it, so one process
    /// never loads a key twice at once; the key is then answered with the
    /// flight's result (and reported [`coalesced`](Fetched::coalesced) by
    /// [`fetch_many`](Cache::fetch_many)). Across processes, the lease of
    /// each key elects one loader, as for a single call: N processes asking
    /// for the same cold keys together make one load per key fleet-wide,
    /// split between their loader calls.
    ///
    /// # Differences from the single-key calls
    ///
    /// None in what a key's value may say: each pair's value may be a
    /// [`Loaded`](crate::Loaded) one, with its own TTL and grace, or
    /// [`no_store`](crate::Loaded::no_store) (answered, not stored, its
    /// lease released at once), for its key alone. The
    /// [`soft_timeout`](crate::CallOptions::soft_timeout) too applies to
    /// each key as to a single call.
    ///
    /// # Cancellation
    ///
    /// The batch runs in a task of its own once past the L1: dropping the
    /// returned future cancels neither the load nor any lease (each is
    /// filled or released as usual), and other callers of the same keys
    /// still get their answers.
    ///
    /// # Errors
    ///
    /// One error for the call, the first in the order of `keys`: any key's
    /// error as [`get_or_load`](Cache::get_or_load) has them (the loader's
    /// error, shared by every key it was loading; a wait timeout; a cached
    /// failure), and [`Error::InvalidInput`] for an invalid key, before
    /// any I/O. Use [`fetch_many`](Cache::fetch_many) for each key's own
    /// result.
    ///
    /// # Panics
    ///
    /// Never because of the loader (a panic becomes
    /// [`Error::LoaderPanicked`] for the keys it was loading). Must be
    /// called within a tokio runtime.
    pub async fn get_or_load_many<F, T>(
        &self,
        keys: &[K],
        loader: F,
    ) -> Result<HashMap<K, V>, Error>
    where
        K: Hash + Eq,
        F: BatchLoader<K, T>,
        T: Into<Loaded<V>>,
    {
        self.many_values(keys, &NO_OPTIONS, loader).await
    }

    /// [`get_or_load_many`](Cache::get_or_load_many), answering each key on
    /// its own: its value (`None`: absent), how it was answered
    /// ([`Outcome`](crate::Outcome)) and whether it was coalesced, or its
    /// own error. One key's failure (an invalid key, a wait timeout, a
    /// cached failure) leaves the others' answers alone. Keys are answered
    /// once per string form: two different `K`s that display the same are
    /// one key, and the answer holds only the first of them (index it with
    /// `get`, not `[]`, if yours can collide).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use onefill::Outcome;
    ///
    /// let cache = onefill::Cache::<String, u32>::builder().build().unwrap();
    /// let keys = ["a".to_string(), String::new()]; // "" is not a valid key
    /// let answers = cache
    ///     .fetch_many(&keys, |keys: Vec<String>| async move {
    ///         Ok::<_, std::io::Error>(keys.into_iter().map(|k| (k, 1)).collect::<Vec<_>>())
    ///     })
    ///     .await?;
    /// let a = answers["a"].as_ref().unwrap();
    /// assert_eq!((a.value, a.outcome), (Some(1), Outcome::Loaded));
    /// assert!(matches!(answers[""], Err(onefill::Error::InvalidInput(_))));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The call fails as a whole only for invalid options (with
    /// [`with_options`](Cache::with_options): [`Error::InvalidInput`]);
    /// every key's own error is in its answer, as
    /// [`get_or_load_many`](Cache::get_or_load_many) lists them.
    pub async fn fetch_many<F, T>(
        &self,
        keys: &[K],
        loader: F,
    ) -> Result<HashMap<K, Result<Fetched<Option<V>>, Error>>, Error>
    where
        K: Hash + Eq,
        F: BatchLoader<K, T>,
        T: Into<Loaded<V>>,
    {
        self.many_answers(keys, &NO_OPTIONS, loader).await
    }

    /// This cache's calls with per-call overrides of its policy, borrowed
    /// for as long as the options: `cache.with_options(&opts).get_or_load(…)`.
    /// Every loading call and [`set`](WithOptions::set) is there, with the
    /// same meaning. Calls with options of their own skip the
    /// [`L1`](crate::L1).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use std::time::Duration;
    /// let cache = onefill::Cache::<u32, u32>::builder().build().unwrap();
    /// let options = onefill::CallOptions::new().ttl(Duration::from_secs(5)).no_lease();
    /// let v = cache
    ///     .with_options(&options)
    ///     .get_or_load(&7, |k| async move { Ok::<_, std::io::Error>(k * 2) })
    ///     .await?;
    /// assert_eq!(v, 14);
    /// # Ok(()) }
    /// ```
    pub fn with_options<'a>(&'a self, options: &'a CallOptions) -> WithOptions<'a, K, V> {
        WithOptions::new(self, options)
    }

    /// Reads the stored value (fresh, or stale within the grace window)
    /// without loading. `Ok(None)` for a miss, a cached absence or failure,
    /// and an unreadable value.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key; [`Error::Backend`] if the
    /// backend fails.
    pub async fn get<Q>(&self, key: &Q) -> Result<Option<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        if let Some(l1) = &self.shared.l1 {
            let buf = KeyBuf::new(key);
            let found = buf.checked().map(|key| l1.get(key, Instant::now()));
            if let Ok(Lookup::Fresh(value)) = found {
                self.shared.recorder.l1_hit();
                return Ok(value);
            }
        }
        let span = call_span!("onefill.get", self);
        let read = async {
            let keys = self.keys(key)?;
            let within = self.shared.policy.backend_timeout;
            let stored = self
                .call(
                    &keys,
                    "get",
                    self.shared.calls.get(&keys, within, Instant::now()),
                )
                .await?;
            Ok(stored
                .and_then(|s| self.shared.value_of(&s, keys.value(), true))
                .flatten())
        };
        let read = read.instrument(span.clone()).await;
        ended(&span, &read, |found: &Option<V>| match found {
            Some(_) => "hit",
            None => "miss",
        });
        read
    }

    /// Writes a value (with this cache's TTL, jitter and grace; a call's own
    /// through [`with_options`](Cache::with_options)) and removes any lease,
    /// so a load in flight from before this write is fenced out and cannot
    /// overwrite it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key or a value over the size limit
    /// (nothing is written); [`Error::Encode`]; [`Error::Backend`].
    pub async fn set<Q>(&self, key: &Q, value: V) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        self.write(key, value, &NO_OPTIONS, &[]).await
    }

    /// [`set`](Cache::set), the value carrying `tags` (as a loader's
    /// [`Loaded::tags`]): [`invalidate_tag`](Cache::invalidate_tag) of any
    /// of them makes it a miss everywhere.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// let cache = onefill::Cache::<String, u32>::builder().build().unwrap();
    /// cache.set_tagged("price:1", 10, ["seller:7"]).await?;
    /// cache.invalidate_tag("seller:7").await?;
    /// assert_eq!(cache.get("price:1").await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`set`](Cache::set), and [`Error::InvalidInput`] for tags out of
    /// bounds (see [`Loaded::tags`]; nothing is written).
    pub async fn set_tagged<Q, I, T>(&self, key: &Q, value: V, tags: I) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let tags: Vec<String> = tags.into_iter().map(Into::into).collect();
        self.write(key, value, &NO_OPTIONS, &tags).await
    }

    /// Removes the value and any lease. A load already in flight (here or in
    /// another process) still answers its own callers but does not store its
    /// result: it could predate the invalidation.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key; [`Error::Backend`].
    pub async fn invalidate<Q>(&self, key: &Q) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        let span = call_span!("onefill.invalidate", self);
        let invalidated = async {
            let key = self.validated(key)?;
            let keys = FillKeys::new(&self.shared.namespace, &key);
            // Done, failed or dropped mid-way: what this process remembers
            // of the key goes, and older flights cannot put it back; failed
            // or dropped, it is replayed once the backend answers.
            let writing = Writing::start(&self.shared, &key, &keys);
            let invalidated = self
                .call(
                    &keys,
                    "invalidate",
                    self.shared.calls.backend.invalidate(&keys),
                )
                .await;
            match &invalidated {
                Ok(()) => writing.deleted(),
                Err(e) => writing.failed(e),
            }
            invalidated
        };
        let invalidated = invalidated.instrument(span.clone()).await;
        ended(&span, &invalidated, |_| "ok");
        invalidated
    }

    /// Marks the value stale, in every process, without removing it: the
    /// soft form of [`invalidate`](Cache::invalidate) for a hot key.
    ///
    /// If the value was stored with a grace window (the
    /// [`grace`](crate::CacheBuilder::grace) it was written with), it stays
    /// readable for that window from now, as a value whose TTL ran out:
    /// callers get it at once (answered as [`Outcome::Stale`](crate::Outcome::Stale))
    /// while one refresh runs under the lease, fleet-wide. A value stored
    /// without grace is removed, as by `invalidate`: the next caller loads
    /// and the others wait for it. A value stale already is left as it is;
    /// a missing key is not an error. As with `invalidate`, any lease is
    /// removed, so a load in flight from before this call still answers its
    /// own callers but does not store its result, and this process's L1
    /// and outage fallback forget the key. An `expire` that fails for want
    /// of the backend is replayed as an invalidation once it answers again
    /// (see [`replay_queue_capacity`](crate::CacheBuilder::replay_queue_capacity)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use onefill::Outcome;
    ///
    /// let cache = onefill::Cache::<u32, String>::builder()
    ///     .ttl(Duration::from_secs(60))
    ///     .grace(Duration::from_secs(30))
    ///     .build()?;
    /// cache.set(&7, "old".to_string()).await?;
    /// cache.expire(&7).await?;
    /// // Answered at once from the stale value; the refresh runs behind it.
    /// let got = cache
    ///     .fetch(&7, |_| async { Ok::<_, std::io::Error>("new".to_string()) })
    ///     .await?;
    /// assert_eq!((got.outcome, got.value.as_str()), (Outcome::Stale, "old"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad key; [`Error::Backend`], and with
    /// [`BackendErrorKind::Unsupported`](crate::BackendErrorKind::Unsupported)
    /// for a backend that does not implement
    /// [`Backend::expire`](crate::backend::Backend::expire) (nothing was
    /// changed in the store; call `invalidate` instead).
    pub async fn expire<Q>(&self, key: &Q) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        let span = call_span!("onefill.expire", self);
        let expired = async {
            let key = self.validated(key)?;
            let keys = FillKeys::new(&self.shared.namespace, &key);
            // As for `invalidate`: what this process remembers of the key
            // goes, and older flights cannot put it back; failed or dropped
            // for want of the backend, it is replayed once the backend
            // answers (as an invalidation: more than was asked, never less).
            let writing = Writing::start(&self.shared, &key, &keys);
            let expired = self
                .call(&keys, "expire", self.shared.calls.backend.expire(&keys))
                .await;
            match &expired {
                Ok(()) => writing.expired(),
                Err(e) => writing.failed(e),
            }
            expired
        };
        let expired = expired.instrument(span.clone()).await;
        ended(&span, &expired, |_| "ok");
        expired
    }

    /// A snapshot of this cache's counters.
    pub fn stats(&self) -> Stats {
        self.shared.recorder.snapshot()
    }

    /// How many writes of this cache that failed for want of the backend
    /// wait to be replayed (as invalidations, once it answers again; see
    /// [`CacheBuilder::replay_queue_capacity`](crate::CacheBuilder::replay_queue_capacity)).
    /// 0 once every such write is replayed: a process about to exit may wait
    /// for it, since the queue lives only in memory.
    pub fn pending_writes(&self) -> usize {
        self.shared.replays.len()
    }

    /// The circuit breakers' state: the worst over the backend's shards in
    /// use (`Open` if the circuit of any shard called in the last 10 s is
    /// open). A Redis Cluster has one breaker per master; other backends
    /// have one. A master whose slots have all moved (a failover promoted
    /// its replica) no longer counts, from the moment the slot map says so.
    pub fn circuit_state(&self) -> CircuitState {
        let calls = &self.shared.calls;
        calls
            .breakers
            .state(|shard| calls.backend.shard_serves_keys(shard))
    }

    /// This cache's namespace.
    pub fn namespace(&self) -> &str {
        &self.shared.namespace
    }
}
