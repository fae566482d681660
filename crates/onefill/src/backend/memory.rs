//! The embedded backend: the whole protocol in one process's memory.
//!
//! It has the semantics Redis has (TTLs measured by the server, tokens,
//! atomic steps) so that every behaviour can be tested here first. Its clock
//! is tokio's, so tests under `tokio::time::pause` drive expiry.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Listeners;
use super::{
    Acquired, Backend, BackendError, ChangeListener, FillKeys, FillSubscription, LeaseRequest,
    LeaseToken, Mark, MarkKind, Stored,
};
use crate::envelope;

/// An in-process [`Backend`]: the embedded default.
///
/// Cheap to clone; clones share one store, so several [`Cache`](crate::Cache)
/// instances built on clones of one `MemoryBackend` behave like processes
/// sharing one Redis.
///
/// ```
/// let backend = onefill::MemoryBackend::new();
/// let users = onefill::Cache::<u64, String>::builder()
///     .namespace("users")
///     .backend(backend.clone())
///     .build()
///     .unwrap();
/// let groups = onefill::Cache::<u64, Vec<u64>>::builder()
///     .namespace("groups")
///     .backend(backend)
///     .build()
///     .unwrap();
/// # drop((users, groups));
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    channels: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// L1s to tell of changed values (see [`Backend::track_changes`]).
    listeners: Listeners,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("state", &self.state)
            .field("listeners", &self.listeners.len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    writes_since_sweep: usize,
}

#[derive(Debug, Clone)]
struct Entry {
    bytes: Vec<u8>,
    expires_at: Instant,
    /// When it was written (an expiry in place keeps it); a fill's value,
    /// when its lease was taken (see `State::as_of`).
    written_at: Instant,
}

/// Expired entries are dropped lazily on access and by a sweep every this
/// many writes, so memory stays bounded by the live keys.
const SWEEP_EVERY: usize = 1024;

impl State {
    fn live(&mut self, key: &str, now: Instant) -> Option<&Entry> {
        if self.entries.get(key).is_some_and(|e| e.expires_at <= now) {
            self.entries.remove(key);
        }
        self.entries.get(key)
    }
    fn get(&mut self, key: &str, now: Instant) -> Option<Stored> {
        self.live(key, now).map(|e| Stored {
            bytes: e.bytes.clone(),
            ttl: e.expires_at - now,
        })
    }
    fn put(&mut self, key: &str, bytes: Vec<u8>, ttl: Duration, now: Instant) {
        self.writes_since_sweep += 1;
        if self.writes_since_sweep >= SWEEP_EVERY {
            self.writes_since_sweep = 0;
            self.entries.retain(|_, e| e.expires_at > now);
        }
        self.entries.insert(
            key.to_owned(),
            Entry {
                bytes,
                expires_at: expiry(now, ttl),
                written_at: now,
            },
        );
    }
    /// The `acquire` step (see [`Backend::acquire`]).
    fn acquire(
        &mut self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
        now: Instant,
    ) -> Acquired {
        let value = self.get(keys.value(), now);
        if let Some(fresh) = value.as_ref().filter(|v| is_fresh(v, refresh_window)) {
            return Acquired::Fresh(fresh.clone());
        }
        match self.get(keys.lock(), now) {
            Some(lease) => Acquired::Held {
                stale: value,
                lease_ttl: lease.ttl,
                holder: LeaseToken::from_stored(&lease.bytes),
            },
            None => {
                self.put(keys.lock(), token.as_bytes().to_vec(), lease_ttl, now);
                Acquired::Won { stale: value }
            }
        }
    }
    /// The value part of the `expire` step (see [`Backend::expire`]): a
    /// fresh value with grace lives only its grace from `now`; one without
    /// grace, or bytes that are no envelope, go.
    fn expire(&mut self, key: &str, now: Instant) {
        let Some(entry) = self.live(key, now) else {
            return;
        };
        match envelope::grace_of(&entry.bytes) {
            Some(grace) if !grace.is_zero() => {
                let soft = expiry(now, grace);
                if let Some(entry) = self.entries.get_mut(key) {
                    // Already stale: its expiry is no later than that.
                    entry.expires_at = entry.expires_at.min(soft);
                }
            }
            _ => {
                self.entries.remove(key);
            }
        }
    }
    /// When the lease at `lock` was taken (its entry's write: an
    /// extension keeps it).
    fn lease_taken(&self, lock: &str) -> Option<Instant> {
        self.entries.get(lock).map(|e| e.written_at)
    }
    /// A fill's value is as old as its load, which began once its lease
    /// was taken: what a replayed invalidation judges it by.
    fn as_of(&mut self, key: &str, when: Instant) {
        if let Some(e) = self.entries.get_mut(key) {
            e.written_at = when;
        }
    }
    fn holds(&mut self, lock: &str, token: &LeaseToken, now: Instant) -> bool {
        self.live(lock, now)
            .is_some_and(|e| e.bytes == token.as_bytes())
    }
}

impl MemoryBackend {
    /// A new, empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock()
    }

    /// Tells the L1s listening to `key`'s prefix that it changed, before
    /// the write that changed it returns (so a `set` is seen by every cache
    /// on this store as soon as it is done).
    fn changed(&self, key: &str) {
        self.inner.listeners.changed(key);
    }

    fn publish(&self, channel: &str) {
        let mut channels = self.inner.channels.lock();
        if let Some(tx) = channels.get(channel) {
            if tx.receiver_count() == 0 {
                channels.remove(channel);
            } else {
                tx.send_modify(|n| *n += 1);
            }
        }
    }

    /// Number of live (unexpired) backend keys, values and leases alike.
    /// For tests and diagnostics.
    pub fn len(&self) -> usize {
        let now = Instant::now();
        self.state()
            .entries
            .values()
            .filter(|e| e.expires_at > now)
            .count()
    }

    /// Whether the store holds no live key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes raw bytes under a backend key (a value, a lease: any key of
    /// [`FillKeys`]) with a TTL, bypassing the protocol: no token check, no
    /// fill notification. For tests that plant corrupt data or the lease of
    /// a process that died.
    ///
    /// Only with the `test-support` feature.
    ///
    /// ```
    /// use std::time::Duration;
    /// use onefill::backend::FillKeys;
    ///
    /// let store = onefill::MemoryBackend::new();
    /// let keys = FillKeys::new("users", "42");
    /// store.put_raw(keys.lock(), b"a dead process's token", Duration::from_secs(5));
    /// let (bytes, ttl) = store.get_raw(keys.lock()).unwrap();
    /// assert_eq!(bytes, b"a dead process's token");
    /// assert!(ttl <= Duration::from_secs(5));
    /// ```
    #[cfg(feature = "test-support")]
    pub fn put_raw(&self, key: &str, bytes: &[u8], ttl: Duration) {
        self.state().put(key, bytes.to_vec(), ttl, Instant::now());
        self.changed(key);
    }

    /// Reads the raw bytes and the remaining TTL of a backend key, if it is
    /// live, bypassing the protocol.
    ///
    /// Only with the `test-support` feature.
    #[cfg(feature = "test-support")]
    pub fn get_raw(&self, key: &str) -> Option<(Vec<u8>, Duration)> {
        self.state()
            .get(key, Instant::now())
            .map(|s| (s.bytes, s.ttl))
    }

    /// Deletes a backend key, bypassing the protocol (another client's
    /// `DEL`: no lease is touched, no fill notification is sent). The
    /// change is reported to the L1s listening, as Redis's tracking
    /// reports a `DEL`. Returns whether the key was live.
    ///
    /// Only with the `test-support` feature.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let store = onefill::MemoryBackend::new();
    /// store.put_raw("k", b"v", Duration::from_secs(5));
    /// assert!(store.delete_raw("k"));
    /// assert!(store.get_raw("k").is_none());
    /// assert!(!store.delete_raw("k"));
    /// ```
    #[cfg(feature = "test-support")]
    pub fn delete_raw(&self, key: &str) -> bool {
        let live = {
            let mut state = self.state();
            let live = state.live(key, Instant::now()).is_some();
            state.entries.remove(key);
            live
        };
        if live {
            self.changed(key);
        }
        live
    }

    /// Sets the remaining TTL of a live backend key, bypassing the protocol
    /// (another client's `PEXPIRE`, which may shorten or lengthen it; a
    /// very long TTL stands for `PERSIST`). The bytes are left as they
    /// are, so a TTL recorded in them no longer tells the key's. The change
    /// is reported to the L1s listening, as Redis's tracking reports a
    /// `PEXPIRE`. Returns whether the key was live (a missing key is left
    /// missing).
    ///
    /// Only with the `test-support` feature.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let store = onefill::MemoryBackend::new();
    /// store.put_raw("k", b"v", Duration::from_secs(60));
    /// assert!(store.expire_raw("k", Duration::from_secs(1)));
    /// assert!(store.get_raw("k").unwrap().1 <= Duration::from_secs(1));
    /// assert!(!store.expire_raw("missing", Duration::from_secs(1)));
    /// ```
    #[cfg(feature = "test-support")]
    pub fn expire_raw(&self, key: &str, ttl: Duration) -> bool {
        let live = {
            let now = Instant::now();
            let mut state = self.state();
            state.live(key, now).is_some()
                && state.entries.get_mut(key).is_some_and(|e| {
                    e.expires_at = expiry(now, ttl);
                    true
                })
        };
        if live {
            self.changed(key);
        }
        live
    }
}

/// When a key written at `now` for `ttl` expires; a TTL past what the
/// clock can count (a test's "forever") is a century.
fn expiry(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}

fn is_fresh(stored: &Stored, refresh_window: Duration) -> bool {
    match envelope::grace_of(&stored.bytes) {
        Some(grace) => stored.ttl > grace.saturating_add(refresh_window),
        None => false,
    }
}

impl MemoryBackend {
    /// `invalidate`, or with `older_than` its replay's form (a value
    /// written within it is kept; one written at its very start is not:
    /// which of the two came first is unknown, and the replay is there to
    /// delete what was there before): whether the value was deleted.
    fn invalidate_if_older(&self, keys: &FillKeys, older_than: Option<Duration>) -> bool {
        let now = Instant::now();
        let deleted = {
            let mut state = self.state();
            state.entries.remove(keys.lock());
            let newer = older_than.is_some_and(|age| {
                state
                    .live(keys.value(), now)
                    .is_some_and(|e| now.saturating_duration_since(e.written_at) < age)
            });
            if !newer {
                state.entries.remove(keys.value());
            }
            !newer
        };
        self.changed(keys.value());
        self.publish(keys.channel());
        deleted
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        Ok(self.state().get(keys.value(), Instant::now()))
    }

    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let now = Instant::now();
        Ok(self
            .state()
            .acquire(keys, token, lease_ttl, refresh_window, now))
    }

    /// One step: the gone holder's lease is deleted if it still holds
    /// `gone`, then the acquire runs.
    async fn take_over(
        &self,
        keys: &FillKeys,
        gone: &LeaseToken,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let now = Instant::now();
        let mut state = self.state();
        if state.holds(keys.lock(), gone, now) {
            state.entries.remove(keys.lock());
        }
        Ok(state.acquire(keys, token, lease_ttl, refresh_window, now))
    }

    /// Every key under one lock: one step, as one pipeline is on Redis.
    async fn get_many(&self, keys: &[FillKeys]) -> Vec<Result<Option<Stored>, BackendError>> {
        let now = Instant::now();
        let mut state = self.state();
        keys.iter().map(|k| Ok(state.get(k.value(), now))).collect()
    }

    async fn acquire_many(
        &self,
        requests: &[LeaseRequest],
        lease_ttl: Duration,
    ) -> Vec<Result<Acquired, BackendError>> {
        let now = Instant::now();
        let mut state = self.state();
        requests
            .iter()
            .map(|r| Ok(state.acquire(&r.keys, &r.token, lease_ttl, r.refresh_window, now)))
            .collect()
    }

    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let now = Instant::now();
        {
            let mut state = self.state();
            if !state.holds(keys.lock(), token, now) {
                drop(state);
                self.publish(keys.channel());
                return Ok(false);
            }
            let as_of = state.lease_taken(keys.lock()).unwrap_or(now);
            state.put(keys.value(), bytes.to_vec(), ttl, now);
            state.as_of(keys.value(), as_of);
            state.entries.remove(keys.lock());
        }
        self.changed(keys.value());
        self.publish(keys.channel());
        Ok(true)
    }

    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        let now = Instant::now();
        {
            let mut state = self.state();
            if !state.holds(keys.lock(), token, now) {
                return Ok(false);
            }
            let as_of = state.lease_taken(keys.lock()).unwrap_or(now);
            state.entries.remove(keys.lock());
            if let Some((bytes, ttl)) = entry {
                state.put(keys.value(), bytes.to_vec(), ttl, now);
                state.as_of(keys.value(), as_of);
            }
        }
        if entry.is_some() {
            self.changed(keys.value());
        }
        self.publish(keys.channel());
        Ok(true)
    }

    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        let now = Instant::now();
        let mut state = self.state();
        if !state.holds(keys.lock(), token, now) {
            drop(state);
            self.publish(keys.channel());
            return Ok(false);
        }
        if let Some(e) = state.entries.get_mut(keys.lock()) {
            e.expires_at = now + lease_ttl;
        }
        Ok(true)
    }

    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        {
            let mut state = self.state();
            state.put(keys.value(), bytes.to_vec(), ttl, Instant::now());
            state.entries.remove(keys.lock());
        }
        self.changed(keys.value());
        self.publish(keys.channel());
        Ok(())
    }

    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        self.invalidate_if_older(keys, None);
        Ok(())
    }

    async fn invalidate_older_than(
        &self,
        keys: &FillKeys,
        age: Duration,
    ) -> Result<bool, BackendError> {
        Ok(self.invalidate_if_older(keys, Some(age)))
    }

    async fn expire(&self, keys: &FillKeys) -> Result<(), BackendError> {
        {
            let mut state = self.state();
            state.expire(keys.value(), Instant::now());
            state.entries.remove(keys.lock());
        }
        self.changed(keys.value());
        self.publish(keys.channel());
        Ok(())
    }

    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        let mut channels = self.inner.channels.lock();
        if channels.len() >= SWEEP_EVERY {
            channels.retain(|_, tx| tx.receiver_count() > 0);
        }
        let rx = channels
            .entry(keys.channel().to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Ok(Box::new(MemorySubscription { rx }))
    }

    /// The generation counts up by one per mark: the store lives as long
    /// as the process, so it cannot lose it and go back.
    async fn mark(
        &self,
        gen_key: &str,
        mark_key: &str,
        kind: MarkKind,
        retention: Option<Duration>,
    ) -> Result<u64, BackendError> {
        let gen = {
            let mut state = self.state();
            let now = Instant::now();
            let gen = state.get(gen_key, now).map_or(0, |s| stored_gen(&s.bytes)) + 1;
            state.put(gen_key, gen.to_string().into_bytes(), Duration::MAX, now);
            let old = state.get(mark_key, now);
            let kept = old.as_ref().map_or(Duration::ZERO, |s| s.ttl);
            let mark = old.map_or_else(Mark::default, |s| Mark::from_stored(&s.bytes));
            let ttl = retention.map_or(Duration::MAX, |r| r.max(kept));
            let bytes = mark.after(kind, gen).to_stored().into_bytes();
            state.put(mark_key, bytes, ttl, now);
            gen
        };
        self.changed(gen_key);
        self.changed(mark_key);
        Ok(gen)
    }

    async fn read_marks(
        &self,
        gen_key: &str,
        mark_keys: &[&str],
    ) -> Result<(u64, Vec<Mark>), BackendError> {
        let mut state = self.state();
        let now = Instant::now();
        let gen = state.get(gen_key, now).map_or(0, |s| stored_gen(&s.bytes));
        let marks = mark_keys
            .iter()
            .map(|key| {
                state
                    .get(key, now)
                    .map_or_else(Mark::default, |s| Mark::from_stored(&s.bytes))
            })
            .collect();
        Ok((gen, marks))
    }

    fn in_process(&self) -> bool {
        true
    }

    /// Every change is reported before the write returns, so the listener
    /// is always in sync (expiry needs no report: an L1 entry expires with
    /// the value it copies).
    fn track_changes(
        &self,
        prefix: &str,
        _confirm_every: Duration,
        listener: Weak<dyn ChangeListener>,
    ) -> Result<(), BackendError> {
        if let Some(live) = listener.upgrade() {
            let now = Instant::now();
            live.synced(Some(expiry(now, Duration::MAX)));
        }
        self.inner.listeners.register(prefix, listener);
        Ok(())
    }
}

/// A stored generation (0 for anything else: another client's bytes).
fn stored_gen(bytes: &[u8]) -> u64 {
    super::generation_from_stored(bytes)
}

struct MemorySubscription {
    rx: watch::Receiver<u64>,
}

#[async_trait]
impl FillSubscription for MemorySubscription {
    async fn notified(&mut self) {
        if self.rx.changed().await.is_err() {
            // The channel was dropped (no publisher left): nothing will ever
            // arrive, so wait forever; callers always race this with a poll.
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replay's invalidation keeps a value written within its age and
    /// deletes an older one; the lease goes either way.
    #[tokio::test(start_paused = true)]
    async fn a_replayed_invalidation_keeps_a_newer_value() {
        let backend = MemoryBackend::new();
        let keys = FillKeys::new("t", "k");
        let ttl = Duration::from_secs(60);
        backend.set(&keys, b"v", ttl).await.unwrap();
        let token = LeaseToken::random();
        let taken = backend
            .acquire(&keys, &token, ttl, Duration::MAX)
            .await
            .unwrap();
        assert!(matches!(taken, Acquired::Won { .. }), "{taken:?}");
        tokio::time::advance(Duration::from_millis(100)).await;
        let age = Duration::from_millis(150);
        assert!(!backend.invalidate_older_than(&keys, age).await.unwrap());
        assert!(backend.get(&keys).await.unwrap().is_some(), "kept");
        assert!(
            !backend.extend(&keys, &token, ttl).await.unwrap(),
            "the lease stayed"
        );
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(backend.invalidate_older_than(&keys, age).await.unwrap());
        assert!(backend.get(&keys).await.unwrap().is_none(), "deleted");

        // A fill's value is as old as its lease: its load read the source
        // then, before a write that began while it ran.
        let token = LeaseToken::random();
        backend
            .acquire(&keys, &token, ttl, Duration::MAX)
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(backend.fill(&keys, &token, b"old", ttl).await.unwrap());
        assert!(backend.invalidate_older_than(&keys, age).await.unwrap());
        assert!(
            backend.get(&keys).await.unwrap().is_none(),
            "a stale fill kept"
        );
    }
}
