//! The L1: decoded values in this process, in front of the backend, kept
//! coherent by the backend's change reports (see `backend/tracking.rs`).
//! (About 800 lines, its unit tests included: the entry's whole
//! lifecycle, the public configuration and the store, belong together.)
//!
//! [`L1`] is the public configuration; [`Local`] is the store one cache
//! owns. Its whole lifecycle lives here:
//!
//! - **filled** by flights, with the freshness the backend gave the value
//!   (its remaining TTL when it was read, or the TTL it was written with),
//!   and only if no change of the key (and no reset) was reported since the
//!   flight started reading: [`Local::ticket`] is taken before the read,
//!   [`Local::insert`] inserts, then checks the ticket and takes the entry
//!   back out if a report came in between (inserting first and checking
//!   after closes the race with a report that arrives during the insert);
//! - **served** ([`Local::get`]) only while the backend vouches for it
//!   ([`ChangeListener::synced`](crate::backend::ChangeListener::synced)
//!   within the sync bound) and only until the
//!   value's own freshness ends;
//! - **emptied** by the backend's reports: a changed key is dropped, a
//!   reset drops everything;
//! - **capped by age** once the backend reports only the changes onefill
//!   announces (its server refused tracking, [`Untracked::Announced`]):
//!   an entry ends `max_age` after the read that found it began.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::error::InvalidOption;
use crate::stats::Recorder;

/// An in-process L1 for a [`Cache`](crate::Cache): decoded values served
/// without a backend round trip, kept coherent across the fleet by the
/// backend.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cache: onefill::Cache<u64, String> = onefill::Cache::builder()
///     .l1(onefill::L1::new(10_000))
///     .build()?;
/// let load = |id: u64| async move { Ok::<_, std::io::Error>(format!("user {id}")) };
/// cache.get_or_load(&7, load).await?; // loaded and stored
/// cache.get_or_load(&7, load).await?; // read from the backend, kept in L1
/// cache.get_or_load(&7, load).await?; // an L1 hit: no backend call
/// assert_eq!(cache.stats().l1_hits, 1);
/// # Ok(()) }
/// ```
///
/// # Coherence
///
/// An entry is dropped when the backend reports that its key changed,
/// whoever changed it: a fill, `set` or `invalidate` by any process, and on
/// Redis also a plain `SET`/`DEL`/`EXPIRE` by another client, an eviction,
/// an expiry (Redis's server-assisted client-side caching, `CLIENT TRACKING`
/// in `BCAST` mode, on a connection the backend's L1s share; one per
/// master on a cluster). On loopback a change reaches every process's L1 within about
/// a millisecond.
///
/// An entry never outlives the freshness the backend gave the value (its
/// remaining TTL at read time): a value in its grace window is served from
/// the L1 as `Stale` while one refresh runs, fleet-wide, exactly as from the
/// backend.
///
/// # When the backend cannot vouch for it
///
/// The backend confirms that it is in sync (on Redis, a `PING` on the
/// tracking connection, answered after every invalidation sent before it)
/// every fifth of the [sync bound](L1::sync_bound). The L1 serves only
/// while the last confirmation is younger than the bound (250 ms by
/// default): if the tracking connection is lost or the server hangs, the L1
/// stops serving within the bound, and calls go to the backend (and its
/// outage handling) as without an L1. When the connection is back, the L1
/// is emptied before it serves again, since changes made meanwhile were
/// not reported. So a value changed while the connection is down is served
/// from the L1 for at most the bound after the change.
///
/// # Without `CLIENT TRACKING`
///
/// Some servers refuse `CLIENT TRACKING` (a managed service or a proxy,
/// a renamed `CLIENT`, an ACL without it). What the L1 does then
/// is [`L1::untracked`]'s choice: by default ([`Untracked::Announced`]) it
/// keeps going on the changes onefill's own writes announce (every fill,
/// `set`, `invalidate`, `expire` and mark publishes the key it changed),
/// confirmed like tracking, and since another client's writes are then not
/// heard of, each entry lives at most `max_age` (1 s by default) after the
/// read that found it; a warning says so once. With [`Untracked::Refuse`]
/// the cache fails to build instead, and if the refusal comes only later
/// (a server that changed), the L1 stops serving for good and an error
/// says why.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct L1 {
    /// The most entries kept.
    pub max_entries: usize,
    /// If set, the most bytes kept (counted as the stored, encoded size of
    /// the values plus their keys); `max_entries` then only sizes the table.
    pub max_bytes: Option<u64>,
    /// How long the L1 keeps serving after the backend last confirmed it
    /// was in sync.
    pub sync_bound: Duration,
    /// What the L1 does on a backend that cannot report every change (a
    /// Redis server that refuses `CLIENT TRACKING`).
    pub untracked: Untracked,
}

/// What an [`L1`] does when its backend cannot report every change of a
/// value, only those onefill's own writes announce: on Redis, when the
/// server refuses `CLIENT TRACKING` (a managed service or proxy that does
/// not offer it, `rename-command CLIENT ""`, an ACL user without
/// `client|tracking`). See the L1 guide's "Without client tracking".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Untracked {
    /// Keep going on the changes onefill's writes announce (over pub/sub,
    /// on the channels fill notifications already use): a fill, `set`,
    /// `invalidate`, `expire` or mark by any process drops the entry
    /// everywhere within the [sync bound](L1::sync_bound), as with
    /// tracking. A write by another client (`redis-cli`, another program),
    /// an eviction or a flush is not heard of: each entry is served at
    /// most `max_age` after the read that found it (and never past the
    /// value's own freshness). A warning says so once.
    Announced {
        /// The longest an entry is served after the read that found it.
        max_age: Duration,
    },
    /// The cache fails to build ([`ConfigError`](crate::ConfigError) on
    /// `l1`) when the backend already knows tracking is refused (a Redis
    /// backend asks when it connects); a refusal met later makes the L1
    /// stop serving for good (calls go to the backend, as without an L1),
    /// with an error logged.
    Refuse,
}

/// The default `max_age` of [`Untracked::Announced`]: foreign writes are
/// seen within a second, as a cache without an L1 sees another process's
/// marks (within about two), while a hot key costs each process one read a
/// second.
pub const DEFAULT_UNTRACKED_MAX_AGE: Duration = Duration::from_secs(1);

impl Default for Untracked {
    fn default() -> Self {
        Untracked::Announced {
            max_age: DEFAULT_UNTRACKED_MAX_AGE,
        }
    }
}

/// The default [`L1::sync_bound`].
const DEFAULT_SYNC_BOUND: Duration = Duration::from_millis(250);

impl L1 {
    /// An L1 of at most `max_entries` values, with the default sync bound
    /// (250 ms).
    pub fn new(max_entries: usize) -> Self {
        L1 {
            max_entries,
            max_bytes: None,
            sync_bound: DEFAULT_SYNC_BOUND,
            untracked: Untracked::default(),
        }
    }

    /// What the L1 does when the backend cannot report every change (a
    /// Redis server that refuses `CLIENT TRACKING`); see [`Untracked`].
    /// Default: [`Untracked::Announced`] with a `max_age` of 1 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use onefill::{Untracked, L1};
    ///
    /// let strict = L1::new(10_000).untracked(Untracked::Refuse);
    /// let relaxed = L1::new(10_000).untracked(Untracked::Announced {
    ///     max_age: Duration::from_millis(500),
    /// });
    /// # drop((strict, relaxed));
    /// ```
    pub fn untracked(mut self, untracked: Untracked) -> Self {
        self.untracked = untracked;
        self
    }

    /// Bounds the L1 by bytes (the encoded size of the values plus their
    /// keys) rather than by entries.
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// How long the L1 keeps serving after the backend last confirmed that
    /// every change was reported (see [Coherence](L1#when-the-backend-cannot-vouch-for-it)).
    /// The backend confirms every fifth of it. At least 10 ms.
    pub fn sync_bound(mut self, bound: Duration) -> Self {
        self.sync_bound = bound;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), InvalidOption> {
        if self.max_entries == 0 {
            return Err(InvalidOption::new("l1", "needs max_entries of at least 1"));
        }
        if self.max_bytes == Some(0) {
            return Err(InvalidOption::new("l1", "needs max_bytes of at least 1"));
        }
        if self.sync_bound < Duration::from_millis(10) || self.sync_bound > Duration::from_secs(60)
        {
            return Err(InvalidOption::new(
                "l1",
                format!(
                    "needs a sync_bound between 10 ms and 60 s, got {:?}",
                    self.sync_bound
                ),
            ));
        }
        if let Untracked::Announced { max_age } = self.untracked {
            if max_age < Duration::from_millis(10) || max_age > Duration::from_secs(3600) {
                return Err(InvalidOption::new(
                    "l1",
                    format!("needs an untracked max_age between 10 ms and 1 h, got {max_age:?}"),
                ));
            }
        }
        Ok(())
    }

    /// How often the backend confirms the sync.
    pub(crate) fn confirm_every(&self) -> Duration {
        self.sync_bound / 5
    }
}

/// One L1 entry: a decoded value (`None`: a cached absence) and its life.
#[derive(Clone)]
pub(crate) struct Entry<V> {
    pub value: Option<V>,
    /// Served as a hit until then.
    pub fresh_until: Instant,
    /// From then on a call goes to the backend instead (early refresh is
    /// decided there); at most `fresh_until`.
    pub refresh_at: Instant,
    /// Served as stale (grace) until then: the server's hard expiry.
    pub expires_at: Instant,
    /// The weight for a byte-bounded L1.
    pub weight: u32,
}

/// What the L1 has for a key.
pub(crate) enum Lookup<V> {
    Fresh(Option<V>),
    /// Past its freshness, within grace.
    Stale(Option<V>),
    Miss,
}

#[derive(Clone)]
struct Weigher {
    by_bytes: bool,
}

impl<V> quick_cache::Weighter<String, Entry<V>> for Weigher {
    fn weight(&self, key: &String, entry: &Entry<V>) -> u64 {
        if self.by_bytes {
            u64::from(entry.weight) + key.len() as u64
        } else {
            1
        }
    }
}

type Store<V> = quick_cache::sync::Cache<String, Entry<V>, Weigher>;

/// Stripes of the change counters: a report bumps the stripe of its key,
/// and an insert checks the stripe of its own.
const STRIPES: usize = 1024;

/// What an insert checks: no reset and no change of its stripe since the
/// ticket was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    resets: u64,
    stripe: usize,
    changes: u64,
    /// When it was taken (what the flight inserts was read after it), once
    /// entries are capped by age; before, the L1's epoch.
    taken: Instant,
}

/// A cache's L1 store. The backend's reports reach it through its cache
/// (`coherence.rs`), which keeps the outage fallback in step too.
pub(crate) struct Local<V> {
    store: Store<V>,
    /// `namespace:{`: the value keys of this cache.
    prefix: String,
    changes: Box<[AtomicU64]>,
    /// Held by an insert across its check and its store, and by a change
    /// across its count and its removal, per stripe: a change is either
    /// seen by the insert or removes what it stored, with no moment in
    /// between when a reader finds the older entry (it did: "inserted
    /// first, checked after" let a call made after `set` returned read the
    /// entry an older flight was putting back, `writes::
    /// stress_no_answer_older_than_a_returned_set` once in ~100 runs).
    writers: Box<[Mutex<()>]>,
    resets: AtomicU64,
    /// Milliseconds after `epoch` until which the L1 may serve (0: not now).
    trusted_until: AtomicU64,
    epoch: Instant,
    sync_bound: Duration,
    /// What to do if the backend cannot report every change.
    untracked: Untracked,
    /// Once the backend reports only announced changes: the longest an
    /// entry lives after the read that found it, in milliseconds (0: no
    /// cap, every change is reported).
    max_age_ms: AtomicU64,
    recorder: Recorder,
}

impl<V: Clone> fmt::Debug for Local<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Local")
            .field("entries", &self.store.len())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl<V: Clone> Local<V> {
    pub(crate) fn new(config: &L1, namespace: &str, recorder: Recorder) -> Self {
        let weigher = Weigher {
            by_bytes: config.max_bytes.is_some(),
        };
        let capacity = config.max_bytes.unwrap_or(config.max_entries as u64);
        Local {
            store: Store::with_weighter(config.max_entries, capacity, weigher),
            prefix: format!("{namespace}:{{"),
            changes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            writers: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            resets: AtomicU64::new(0),
            trusted_until: AtomicU64::new(0),
            epoch: Instant::now(),
            sync_bound: config.sync_bound,
            untracked: config.untracked,
            max_age_ms: AtomicU64::new(0),
            recorder,
        }
    }

    /// The prefix of the backend keys this L1 listens to.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    fn trusted(&self, now: Instant) -> bool {
        self.millis(now) < self.trusted_until.load(Ordering::Acquire)
    }

    /// The entry for `key` as of `now`: the hit path (a lookup and a clone).
    pub(crate) fn get(&self, key: &str, now: Instant) -> Lookup<V> {
        if !self.trusted(now) {
            return Lookup::Miss;
        }
        match self.store.get(key) {
            // Never past the hard expiry: without grace a value's last
            // millisecond reads as fresh (`Shared::read`), so `refresh_at`
            // may lie just beyond it, and the L1 must not outlive the server's copy.
            Some(entry) if now < entry.refresh_at && now < entry.expires_at => {
                Lookup::Fresh(entry.value)
            }
            Some(entry) if now >= entry.fresh_until && now < entry.expires_at => {
                Lookup::Stale(entry.value)
            }
            _ => Lookup::Miss,
        }
    }

    /// Taken before a flight's first read of `key`.
    pub(crate) fn ticket(&self, key: &str) -> Ticket {
        let stripe = stripe_of(key);
        Ticket {
            resets: self.resets.load(Ordering::SeqCst),
            stripe,
            changes: self.changes[stripe].load(Ordering::SeqCst),
            // The clock is read only when entries are capped by age; a
            // ticket taken just before the cap begins reads as taken at
            // the epoch, and its entry ends at once: the safe side.
            taken: if self.max_age_ms.load(Ordering::Relaxed) == 0 {
                self.epoch
            } else {
                Instant::now()
            },
        }
    }

    /// Keeps `entry` for `key`, unless a change of the key (or a reset) was
    /// reported since `ticket`.
    pub(crate) fn insert(&self, key: &str, mut entry: Entry<V>, ticket: Ticket) {
        entry.refresh_at = self.capped(entry.refresh_at, ticket);
        entry.fresh_until = self.capped(entry.fresh_until, ticket);
        entry.expires_at = self.capped(entry.expires_at, ticket);
        let _writer = self.writers[ticket.stripe].lock();
        if !self.current(ticket) {
            return;
        }
        self.store.insert(key.to_owned(), entry);
        // A reset is not counted under the stripe's lock (it clears every
        // stripe): one that came in during the insert either is seen
        // here, or clears the entry after it.
        if !self.current(ticket) {
            self.store.remove(key);
        }
    }

    /// `until`, or earlier if the backend reports only announced changes:
    /// a foreign write after the read that `ticket` began is never heard
    /// of, so what it read is kept at most `max_age` after.
    pub(crate) fn capped(&self, until: Instant, ticket: Ticket) -> Instant {
        match self.max_age_ms.load(Ordering::Relaxed) {
            0 => until,
            ms => until.min(ticket.taken + Duration::from_millis(ms)),
        }
    }

    /// Whether no change of `key` (nor a reset) was reported since
    /// `ticket` was taken for it (a change of another key of its stripe
    /// counts too: the answer errs on the side of "changed").
    pub(crate) fn unchanged_since(&self, key: &str, ticket: Ticket) -> bool {
        debug_assert_eq!(ticket.stripe, stripe_of(key));
        self.current(ticket)
    }

    fn current(&self, ticket: Ticket) -> bool {
        self.resets.load(Ordering::SeqCst) == ticket.resets
            && self.changes[ticket.stripe].load(Ordering::SeqCst) == ticket.changes
    }

    /// This process changed `key` (`set`, `invalidate`): its entry goes at
    /// once, and flights that read before the change cannot put it back.
    pub(crate) fn forget(&self, key: &str) {
        let stripe = stripe_of(key);
        let _writer = self.writers[stripe].lock();
        self.changes[stripe].fetch_add(1, Ordering::SeqCst);
        self.store.remove(key);
    }

    /// Entries held now (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.store.len()
    }
}

/// The backend's reports, as the cache's listener hands them on (see
/// `coherence.rs`).
impl<V: Clone> Local<V> {
    /// The backend reported that `value_key` changed: its entry goes. The
    /// user key, if it was a value key of this cache (not a lease or
    /// channel key, nor another namespace's).
    pub(crate) fn changed(&self, value_key: &[u8]) -> Option<String> {
        let key = user_key_of(&self.prefix, value_key)?;
        self.forget(&key);
        self.recorder.l1_invalidation();
        Some(key)
    }

    /// Anything may have changed: every entry goes.
    pub(crate) fn reset(&self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
        self.store.clear();
        self.recorder.l1_reset();
    }

    /// See [`ChangeListener::untracked`](crate::backend::ChangeListener::untracked):
    /// whether this L1 goes on with announced changes only (its entries
    /// then capped by `max_age`).
    pub(crate) fn untracked(&self, refusal: &crate::error::BackendError) -> bool {
        match self.untracked {
            Untracked::Announced { max_age } => {
                let ms = u64::try_from(max_age.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1);
                let before = self.max_age_ms.swap(ms, Ordering::SeqCst);
                if before == 0 {
                    // What was kept so far was not capped.
                    self.reset();
                    tracing::warn!(
                        prefix = self.prefix,
                        error = %refusal,
                        max_age = ?max_age,
                        "L1: the server refuses client tracking; the L1 goes on with the \
                         changes onefill's writes announce, and since writes by other \
                         clients (and evictions, flushes) are no longer seen, each entry \
                         is served at most max_age after its read"
                    );
                }
                true
            }
            Untracked::Refuse => {
                tracing::error!(
                    prefix = self.prefix,
                    error = %refusal,
                    "L1: the server refuses client tracking and the L1 was told to refuse \
                     to run without it (Untracked::Refuse): it does not serve"
                );
                false
            }
        }
    }

    /// See [`ChangeListener::synced`](crate::backend::ChangeListener::synced).
    pub(crate) fn synced(&self, as_of: Option<Instant>) {
        let until = match as_of {
            Some(at) => self
                .millis(at)
                .saturating_add(u64::try_from(self.sync_bound.as_millis()).unwrap_or(u64::MAX)),
            None => 0,
        };
        self.trusted_until.store(until, Ordering::Release);
    }
}

fn stripe_of(key: &str) -> usize {
    let mut hasher = Fnv(0xcbf2_9ce4_8422_2325);
    key.hash(&mut hasher);
    (hasher.finish() as usize) % STRIPES
}

/// FNV-1a: the stripe only needs a cheap, even spread.
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// The user key of a value key `prefix` + escaped key + `}`; `None` for a
/// lease or channel key (something after the `}`) or another namespace's.
fn user_key_of(prefix: &str, value_key: &[u8]) -> Option<String> {
    let rest = value_key.strip_prefix(prefix.as_bytes())?;
    let escaped = rest.strip_suffix(b"}")?;
    if escaped.contains(&b'}') || escaped.contains(&b'{') {
        return None;
    }
    let escaped = std::str::from_utf8(escaped).ok()?;
    if !escaped.contains('%') {
        return Some(escaped.to_owned());
    }
    Some(
        escaped
            .replace("%7B", "{")
            .replace("%7D", "}")
            .replace("%25", "%"),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::key::FillKeys;

    fn local() -> Local<u32> {
        let local = Local::new(&L1::new(100), "ns", Recorder::new("ns"));
        local.synced(Some(Instant::now() + Duration::from_secs(3600)));
        local
    }

    fn entry(v: u32) -> Entry<u32> {
        let far = Instant::now() + Duration::from_secs(60);
        Entry {
            value: Some(v),
            fresh_until: far,
            refresh_at: far,
            expires_at: far,
            weight: 1,
        }
    }

    #[test]
    fn value_keys_map_back_to_user_keys() {
        for key in ["42", "a{b}c", "%7B", "100%", "}{"] {
            let keys = FillKeys::new("ns", key);
            assert_eq!(
                user_key_of("ns:{", keys.value().as_bytes()).as_deref(),
                Some(key)
            );
            assert_eq!(user_key_of("ns:{", keys.lock().as_bytes()), None);
            assert_eq!(user_key_of("ns:{", keys.channel().as_bytes()), None);
            assert_eq!(user_key_of("other:{", keys.value().as_bytes()), None);
        }
    }

    /// Regression: an insert checked its ticket, stored, then checked
    /// again; a change made between its first check and its store was seen
    /// only by the second check, and a read in between found the older
    /// entry although the change had returned (a call after `set` answered
    /// an older value). A writer thread takes a ticket, then reads the
    /// version (so a ticket taken after a change carries that change's
    /// version or a later one); the main thread publishes a version,
    /// changes the key and reads it back: never older.
    #[test]
    fn a_change_is_never_followed_by_an_older_entry() {
        let l1 = Arc::new(local());
        let version = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (l1, version, stop) = (l1.clone(), version.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let ticket = l1.ticket("k");
                    let seen = version.load(Ordering::SeqCst) as u32;
                    l1.insert("k", entry(seen), ticket);
                }
            })
        };
        let now = Instant::now();
        let mut older = None;
        for v in 1..=300_000u32 {
            version.store(u64::from(v), Ordering::SeqCst);
            l1.forget("k");
            if let Lookup::Fresh(Some(found)) = l1.get("k", now) {
                if found < v {
                    older = Some((v, found));
                    break;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert_eq!(older, None, "(changed at, then read)");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_reported_during_a_read_keeps_the_read_out() {
        let l1 = local();
        let ticket = l1.ticket("k");
        l1.changed(FillKeys::new("ns", "k").value().as_bytes());
        l1.insert("k", entry(1), ticket);
        assert!(matches!(l1.get("k", Instant::now()), Lookup::Miss));
        // A change of another stripe's key does not matter.
        let ticket = l1.ticket("k");
        l1.changed(FillKeys::new("ns", "other").value().as_bytes());
        l1.insert("k", entry(2), ticket);
        assert!(matches!(
            l1.get("k", Instant::now()),
            Lookup::Fresh(Some(2))
        ));
        // A reset keeps every read out, and empties the store.
        let ticket = l1.ticket("k2");
        l1.reset();
        assert_eq!(l1.len(), 0);
        l1.insert("k2", entry(3), ticket);
        assert_eq!(l1.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn serves_only_within_the_sync_bound() {
        let l1 = Local::new(&L1::new(10), "ns", Recorder::new("ns"));
        l1.insert("k", entry(1), l1.ticket("k"));
        assert!(
            matches!(l1.get("k", Instant::now()), Lookup::Miss),
            "never confirmed: not served"
        );
        l1.synced(Some(Instant::now()));
        assert!(matches!(l1.get("k", Instant::now()), Lookup::Fresh(_)));
        tokio::time::advance(DEFAULT_SYNC_BOUND).await;
        assert!(
            matches!(l1.get("k", Instant::now()), Lookup::Miss),
            "a confirmation older than the bound: not served"
        );
        l1.synced(Some(Instant::now()));
        assert!(matches!(l1.get("k", Instant::now()), Lookup::Fresh(_)));
        l1.synced(None);
        assert!(matches!(l1.get("k", Instant::now()), Lookup::Miss));
    }

    #[tokio::test(start_paused = true)]
    async fn freshness_then_grace_then_gone() {
        let l1 = local();
        let now = Instant::now();
        let entry = Entry {
            value: Some(1),
            refresh_at: now + Duration::from_millis(80),
            fresh_until: now + Duration::from_millis(100),
            expires_at: now + Duration::from_millis(200),
            weight: 1,
        };
        l1.insert("k", entry, l1.ticket("k"));
        assert!(matches!(l1.get("k", now), Lookup::Fresh(_)));
        let at = |ms| now + Duration::from_millis(ms);
        assert!(
            matches!(l1.get("k", at(90)), Lookup::Miss),
            "due for refresh"
        );
        assert!(matches!(l1.get("k", at(150)), Lookup::Stale(Some(1))));
        assert!(matches!(l1.get("k", at(200)), Lookup::Miss));
    }

    /// Regression: with grace 0 a value read in its
    /// last millisecond got a freshness 1 ms past its hard expiry, and the
    /// L1 answered it as a hit after the backend had dropped it.
    #[tokio::test(start_paused = true)]
    async fn never_fresh_past_the_hard_expiry() {
        let l1 = local();
        let now = Instant::now();
        let entry = Entry {
            value: Some(1),
            refresh_at: now + Duration::from_millis(1),
            fresh_until: now + Duration::from_millis(1),
            expires_at: now + Duration::from_micros(300),
            weight: 1,
        };
        l1.insert("k", entry, l1.ticket("k"));
        assert!(matches!(l1.get("k", now), Lookup::Fresh(_)));
        assert!(matches!(
            l1.get("k", now + Duration::from_micros(600)),
            Lookup::Miss
        ));
    }

    /// Once only announced changes are reported, an entry ends `max_age`
    /// after the read that found it began (its ticket), even if its value
    /// is fresh for longer; before, nothing caps it.
    #[tokio::test(start_paused = true)]
    async fn announced_only_caps_entries_by_max_age() {
        let config = L1::new(100).untracked(Untracked::Announced {
            max_age: Duration::from_millis(500),
        });
        let l1 = Local::new(&config, "ns", Recorder::new("ns"));
        l1.synced(Some(Instant::now() + Duration::from_secs(3600)));
        let start = Instant::now();
        l1.insert("before", entry(1), l1.ticket("before"));
        let refusal =
            crate::error::BackendError::new(crate::error::BackendErrorKind::Command, "refused");
        assert!(l1.untracked(&refusal));
        assert_eq!(l1.len(), 0, "what was kept uncapped goes");
        let ticket = l1.ticket("k");
        tokio::time::advance(Duration::from_millis(100)).await;
        l1.insert("k", entry(2), ticket);
        assert!(matches!(
            l1.get("k", start + Duration::from_millis(499)),
            Lookup::Fresh(Some(2))
        ));
        assert!(
            matches!(
                l1.get("k", start + Duration::from_millis(500)),
                Lookup::Miss
            ),
            "max_age after the read began, not after the insert"
        );
        // Refuse: never accepted.
        let strict = Local::<u32>::new(
            &L1::new(10).untracked(Untracked::Refuse),
            "ns",
            Recorder::new("ns"),
        );
        assert!(!strict.untracked(&refusal));
    }

    #[test]
    fn bounded_by_entries() {
        let l1 = local();
        for i in 0..1_000 {
            let key = i.to_string();
            l1.insert(&key, entry(i), l1.ticket(&key));
        }
        assert!(l1.len() <= 100, "{} entries", l1.len());
    }

    #[test]
    fn bounded_by_bytes() {
        let l1 = Local::new(&L1::new(1_000).max_bytes(10_000), "ns", Recorder::new("ns"));
        l1.synced(Some(Instant::now() + Duration::from_secs(3600)));
        for i in 0..1_000 {
            let key = format!("{i:04}");
            let mut e = entry(i);
            e.weight = 96; // + 4 bytes of key: 100 per entry
            l1.insert(&key, e, l1.ticket(&key));
        }
        let weight = l1.store.weight();
        assert!(weight <= 10_000, "{weight} bytes kept");
        assert!(l1.len() <= 100, "{} entries of 100 bytes", l1.len());
        assert!(l1.len() >= 50, "the bound is bytes, not fewer entries");
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(L1::new(0).validate().is_err());
        assert!(L1::new(1).max_bytes(0).validate().is_err());
        assert!(L1::new(1)
            .sync_bound(Duration::from_millis(1))
            .validate()
            .is_err());
        assert!(L1::new(1).validate().is_ok());
        for max_age in [Duration::from_millis(1), Duration::from_secs(7200)] {
            assert!(L1::new(1)
                .untracked(Untracked::Announced { max_age })
                .validate()
                .is_err());
        }
        assert!(L1::new(1).untracked(Untracked::Refuse).validate().is_ok());
    }
}
