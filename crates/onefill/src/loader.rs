//! The caller's loader: type-erased, run detached and bounded.
//!
//! The loader runs in a task of its own, so a panic is caught by the runtime
//! (and becomes [`Error::LoaderPanicked`] for every caller) instead of
//! unwinding through the flight, and a loader that never finishes is
//! aborted at the maximum load time.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tracing::Instrument;

use crate::coalesce::{Awaiter, Coalescer, Completion, Joined};
use crate::error::{Error, IntoLoaderError, LoaderError};
use crate::stats::Recorder;

/// The caller's loader, type-erased, with the key already captured: `None`
/// is "nothing there" (the optional variant).
pub(crate) type Load<V> = Detached<Loaded<Option<V>>>;

/// A load, type-erased, before it is spawned.
pub(crate) type Detached<T> =
    Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = Result<T, LoaderError>> + Send>> + Send>;

/// A load's result and how long it took.
pub(crate) type Done<V> = (Loaded<Option<V>>, Duration);

/// A loaded value, and the freshness its loader chose for it (FusionCache's
/// "adaptive caching"): a short TTL for a draft, a long one for a
/// published page. What the loader leaves unset is the call's policy.
///
/// Any loader may return one instead of the plain value (a plain value
/// converts into one with the call's freshness, through `From`).
/// The chosen TTL is written (shortened by the policy's jitter, as every
/// TTL), recorded in the stored value so every process sizes the value's
/// early refresh from it, and bounds the L1 entry; the chosen grace is the
/// value's grace window everywhere (kept by a fail-safe re-store), and
/// decides whether the value is refreshed early (only without a grace
/// window, whatever the cache's).
///
/// A loader may also say its value must not be stored at all
/// ([`no_store`](Loaded::no_store)): an error page, a partial result.
///
/// ```
/// use std::time::Duration;
/// let draft = onefill::Loaded::new("draft").ttl(Duration::from_secs(5));
/// let page = onefill::Loaded::new("page")
///     .ttl(Duration::from_secs(3600))
///     .grace(Duration::from_secs(600));
/// assert_eq!(draft.chosen_ttl(), Some(Duration::from_secs(5)));
/// assert_eq!(page.into_value(), "page");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded<V> {
    value: V,
    ttl: Option<Duration>,
    grace: Option<Duration>,
    no_store: bool,
    tags: Vec<String>,
    /// The namespace's mark generation when the load began (set by the
    /// cache, not the loader).
    pub(crate) as_of: u64,
}

impl<V> Loaded<V> {
    /// A value with the call's freshness.
    pub fn new(value: V) -> Self {
        Loaded {
            value,
            ttl: None,
            grace: None,
            no_store: false,
            tags: Vec::new(),
            as_of: 0,
        }
    }
    /// Tags this value: [`Cache::invalidate_tag`](crate::Cache::invalidate_tag)
    /// of any of them makes it a miss in every process, and
    /// [`Cache::expire_tag`](crate::Cache::expire_tag) makes it stale. Up
    /// to [`MAX_TAGS`](crate::MAX_TAGS) tags of 1 to
    /// [`MAX_TAG_BYTES`](crate::MAX_TAG_BYTES) bytes each (others fail the
    /// load's write: nothing is stored, and its callers get
    /// [`Error::InvalidInput`](crate::Error::InvalidInput)). A tagged value is stored for at most
    /// [`TAG_RETENTION`](crate::TAG_RETENTION), TTL and grace together.
    /// Tags are stored as they are, beside the value: a codec's encryption
    /// does not cover them.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use onefill::Loaded;
    ///
    /// let pages = onefill::Cache::<String, String>::builder().build().unwrap();
    /// let page = pages
    ///     .get_or_load("product:1", |id| async move {
    ///         let page = format!("{id}, sold by seller 7");
    ///         Ok::<_, std::io::Error>(Loaded::new(page).tags(["seller:7", "category:3"]))
    ///     })
    ///     .await?;
    /// // Seller 7 changed: every page that shows it goes, fleet-wide.
    /// pages.invalidate_tag("seller:7").await?;
    /// assert_eq!(pages.get("product:1").await?, None);
    /// # drop(page); Ok(()) }
    /// ```
    pub fn tags<I, T>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.tags.extend(tags.into_iter().map(Into::into));
        self
    }
    /// The tags the loader gave this value.
    pub fn chosen_tags(&self) -> &[String] {
        &self.tags
    }
    /// How long this value stays fresh, clamped to 1 ms ..=
    /// [`MAX_TTL`](crate::MAX_TTL) (a TTL computed from the data, such as a
    /// row's `expires_at - now`, may come out zero: the value is still
    /// answered, and stored for 1 ms). For an absent value (`None` from an
    /// optional loader), how long the absence is cached.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// How long after its TTL this value is still served stale while one
    /// refresh runs (as [`CallOptions::grace`](crate::CallOptions::grace);
    /// at most [`MAX_TTL`](crate::MAX_TTL), longer is clamped).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }
    /// This value must not be stored (the idea of Varnish's "hit-for-pass",
    /// without its memory of the pass: the next load asks again): an error
    /// page, a partial result. The callers that shared the load get it
    /// ([`Outcome::Loaded`](crate::Outcome::Loaded)), and nothing outlives
    /// the load: no fill (the lease is released at once, so waiters in
    /// other processes wake and one of them loads), no L1 entry, no copy
    /// for backend outages, and the chosen TTL and grace are moot. The next
    /// call of the key loads again (or shares a load under way).
    ///
    /// It is an answer, not a failure: fail-safe does not answer a stale
    /// value instead, and negative caching does not remember it. What was
    /// stored before stays as it was: a background or early refresh whose
    /// load says `no_store` leaves the stale or fresh value in place, with
    /// its own expiry. From an optional loader, `Loaded::new(None).no_store()`
    /// is an absence that is not cached either; from a batch loader, it
    /// concerns its key alone. Counted in
    /// [`Stats::loads_not_stored`](crate::Stats::loads_not_stored).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use onefill::{Loaded, Outcome};
    ///
    /// let cache = onefill::Cache::<String, String>::builder().build().unwrap();
    /// let load = |page: String| async move {
    ///     // The origin answered with an error page: show it, do not keep it.
    ///     Ok::<_, std::io::Error>(Loaded::new(format!("{page}: try again")).no_store())
    /// };
    /// let first = cache.fetch("home", load).await?;
    /// assert_eq!((first.value.as_str(), first.outcome), ("home: try again", Outcome::Loaded));
    /// let second = cache.fetch("home", load).await?;
    /// assert_eq!(second.outcome, Outcome::Loaded, "loaded again: nothing was stored");
    /// assert_eq!(cache.stats().loads_not_stored, 2);
    /// # Ok(()) }
    /// ```
    pub fn no_store(mut self) -> Self {
        self.no_store = true;
        self
    }
    /// Whether the loader said this value must not be stored
    /// ([`no_store`](Loaded::no_store)).
    pub fn is_no_store(&self) -> bool {
        self.no_store
    }
    /// The value.
    pub fn value(&self) -> &V {
        &self.value
    }
    /// The value, without its freshness.
    pub fn into_value(self) -> V {
        self.value
    }
    /// The TTL the loader chose, if any.
    pub fn chosen_ttl(&self) -> Option<Duration> {
        self.ttl
    }
    /// The grace the loader chose, if any.
    pub fn chosen_grace(&self) -> Option<Duration> {
        self.grace
    }
    /// The same freshness around another value.
    pub(crate) fn map<W>(self, f: impl FnOnce(V) -> W) -> Loaded<W> {
        Loaded {
            value: f(self.value),
            ttl: self.ttl,
            grace: self.grace,
            no_store: self.no_store,
            tags: self.tags,
            as_of: self.as_of,
        }
    }
}

/// A plain value, with the call's freshness: what lets a loader return
/// `V` or `Loaded<V>` alike (as `Option<T>` is `From<T>`).
impl<V> From<V> for Loaded<V> {
    fn from(value: V) -> Self {
        Loaded::new(value)
    }
}

/// A loader of one key: any `FnOnce(K) -> impl Future<Output = Result<T,
/// E>>` that is `Send + 'static`, where `T` is the value or a [`Loaded`]
/// one and `E` any error a loader may return ([`IntoLoaderError`]: your
/// own error type, `anyhow::Error`, a boxed error…).
///
/// Implemented for every such closure or function; it only names the
/// bound, so each loading call states it once.
pub trait Loader<K, T>: FnOnce(K) -> <Self as Loader<K, T>>::Future + Send + 'static {
    /// What the loader returns.
    type Future: Future<Output = Result<T, Self::Error>> + Send + 'static;
    /// The loader's error.
    type Error: IntoLoaderError;
}

impl<K, T, F, Fut, E> Loader<K, T> for F
where
    F: FnOnce(K) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    E: IntoLoaderError,
{
    type Future = Fut;
    type Error = E;
}

/// A loader of many keys: any `Fn(Vec<K>) -> impl Future<Output =
/// Result<I, E>>` that is `Send + Sync + 'static`, where `I` is any
/// `IntoIterator` of `(key, value)` pairs (a `HashMap<K, V>`, a `Vec<(K,
/// V)>`…; each value plain or a [`Loaded`] one) and `E` any error a loader
/// may return ([`IntoLoaderError`]).
///
/// Implemented for every such closure or function; it only names the
/// bound, so each batch call states it once.
pub trait BatchLoader<K, V>:
    Fn(Vec<K>) -> <Self as BatchLoader<K, V>>::Future + Send + Sync + 'static
{
    /// What the loader returns.
    type Future: Future<Output = Result<Self::Found, Self::Error>> + Send + 'static;
    /// The pairs it found.
    type Found: IntoIterator<Item = (K, V)>;
    /// The loader's error.
    type Error: IntoLoaderError;
}

impl<K, V, F, Fut, I, E> BatchLoader<K, V> for F
where
    F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<I, E>> + Send + 'static,
    I: IntoIterator<Item = (K, V)>,
    E: IntoLoaderError,
{
    type Future = Fut;
    type Found = I;
    type Error = E;
}

/// Whether a load may share one already under way in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// Share one under way if there is one: the result only answers this
    /// flight's callers (a degraded load, not stored).
    MayJoin,
    /// Run its own: the result will be filled under a lease just won, and a
    /// load under way may predate an `invalidate` elsewhere in the fleet
    /// (the very thing that took its lease). Later loads may share this one.
    Own,
}

/// A flight's place in this process's loads of its key.
pub(crate) enum Place<V> {
    /// A load of the key already runs here: its result is this one's.
    Joined(Awaiter<Done<V>>),
    /// This flight loads; the completion hands its result to any load of
    /// the key that joins meanwhile.
    Leads(Completion<Done<V>>),
}

/// Takes the flight's place in the process's loads of `key`: with
/// [`Sharing::MayJoin`], the load of the key already under way here (a
/// background refresh's, say), so one process never runs two loads of a
/// key at once for callers it answers without storing; with
/// [`Sharing::Own`], a load of its own (another still running here is a
/// duplicate, counted).
pub(crate) fn place<V: Clone>(
    loads: &Coalescer<Done<V>>,
    recorder: &Recorder,
    key: &str,
    sharing: Sharing,
) -> Place<V> {
    match sharing {
        Sharing::Own => {
            let (completion, replaced) = loads.lead(key);
            if replaced {
                // Another load of the key still runs here (its lease was
                // lost, or it is a degraded load): two loads at once.
                recorder.duplicate_load(key);
            }
            Place::Leads(completion)
        }
        Sharing::MayJoin => match loads.join(key) {
            Joined::Follower(awaiter) => Place::Joined(awaiter),
            Joined::Leader(completion) => Place::Leads(completion),
        },
    }
}

/// What a load returns, as far as [`run_alone`] cares: the TTL its loader
/// chose, if one applies to the whole load (a batch's values each have
/// their own), and how many of its values must not be stored.
pub(crate) trait LoadResult: Send + 'static {
    fn chosen_ttl(&self) -> Option<Duration> {
        None
    }
    fn not_stored(&self) -> u64;
}

impl<V: Send + 'static> LoadResult for Loaded<Option<V>> {
    fn chosen_ttl(&self) -> Option<Duration> {
        self.ttl
    }
    fn not_stored(&self) -> u64 {
        u64::from(self.no_store)
    }
}

impl<K: Send + 'static, V: Send + 'static> LoadResult for Vec<(K, Loaded<V>)> {
    fn not_stored(&self) -> u64 {
        self.iter()
            .map(|(_, loaded)| u64::from(loaded.no_store))
            .sum()
    }
}

/// Runs `load` detached, bounded by `max_load_time`, and records how long
/// it took (for the adaptive lease TTL and the counters); warns if it took
/// longer than the TTL its value will have (`ttl`, unless the loader chose
/// one).
///
/// Generic in what the load returns: a batch's load of many keys runs here
/// too, as one load.
pub(crate) async fn run_alone<T: LoadResult>(
    recorder: &Recorder,
    load_times: &LoadTimes,
    max_load_time: Duration,
    ttl: Duration,
    key: &str,
    load: Detached<T>,
) -> Result<(T, Duration), Error> {
    let started = Instant::now();
    // A child of the current span (the leader's call), though the load
    // runs in a task of its own.
    let span = tracing::info_span!(
        "onefill.load",
        key,
        outcome = tracing::field::Empty,
        not_stored = tracing::field::Empty,
    );
    let load_span = span.clone();
    let mut task = tokio::spawn(async move { load().await }.instrument(load_span));
    let max = max_load_time;
    let result = match tokio::time::timeout(max, &mut task).await {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(error))) => Err(Error::Loader(error)),
        Ok(Err(join)) => Err(Error::LoaderPanicked(panic_message(join))),
        Err(_) => {
            task.abort();
            Err(Error::LoadTimedOut(max))
        }
    };
    let took = started.elapsed();
    span.record("outcome", if result.is_ok() { "ok" } else { "error" });
    recorder.load_finished(result.is_ok(), took);
    if let Ok(loaded) = &result {
        let not_stored = loaded.not_stored();
        span.record("not_stored", not_stored);
        recorder.loads_not_stored(not_stored);
    }
    load_times.record(took);
    let ttl = match &result {
        Ok(loaded) => loaded.chosen_ttl().unwrap_or(ttl),
        Err(_) => Duration::MAX,
    };
    if took > ttl {
        tracing::warn!(
            key,
            ?took,
            ?ttl,
            "the load took longer than the TTL: values expire before waiters can use them"
        );
    }
    result.map(|value| (value, took))
}

fn panic_message(join: tokio::task::JoinError) -> String {
    if !join.is_panic() {
        return "the load task was cancelled".to_owned();
    }
    let payload = join.into_panic();
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// A window of recent load durations of one cache, for the adaptive lease
/// TTL and the "TTL shorter than the load" guard rail.
#[derive(Debug, Default)]
pub(crate) struct LoadTimes {
    state: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    recent: VecDeque<Duration>,
    /// The p99 of `recent`, computed when a load is recorded (once per
    /// load) rather than at every acquire: the sort cost about 50,000
    /// instructions per miss.
    p99: Option<Duration>,
}

const LOAD_WINDOW: usize = 128;

impl LoadTimes {
    pub(crate) fn record(&self, d: Duration) {
        let mut window = self.state.lock();
        if window.recent.len() == LOAD_WINDOW {
            window.recent.pop_front();
        }
        window.recent.push_back(d);
        let mut sorted: Vec<Duration> = window.recent.iter().copied().collect();
        sorted.sort_unstable();
        let idx = ((sorted.len() as f64) * 0.99).ceil() as usize;
        window.p99 = sorted
            .get(idx.saturating_sub(1).min(sorted.len() - 1))
            .copied();
    }
    pub(crate) fn p99(&self) -> Option<Duration> {
        self.state.lock().p99
    }
}
