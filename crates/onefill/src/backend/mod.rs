//! The storage protocol: where values and leases live.
//!
//! A [`Backend`] stores opaque envelopes and leases under the keys of
//! [`FillKeys`]. Every method is one atomic step on the server (a Lua script
//! on Redis, one critical section in memory), so the cache above can reason
//! about races with the same rules on every backend:
//!
//! | method | atomic step |
//! | --- | --- |
//! | [`get`](Backend::get) | the value and its TTL (Redis: a `GET`, plus `PTTL` unless the server-stamped expiry tells it, decision 0011) |
//! | [`acquire`](Backend::acquire) | fresh value? return it : `SET lock token NX PX ttl` |
//! | [`fill`](Backend::fill) | lock == token ? write value, delete lock, publish : publish the loss |
//! | [`release`](Backend::release) | lock == token ? delete lock (+ optional short entry), publish : nothing |
//! | [`extend`](Backend::extend) | lock == token ? `PEXPIRE lock ttl` : publish the loss |
//! | [`set`](Backend::set) / [`invalidate`](Backend::invalidate) | write / delete the value and delete any lease, publish |
//! | [`expire`](Backend::expire) | value fresh with grace > 0 ? hard expiry = now + grace : (grace 0, unreadable) delete it; delete any lease, publish |
//! | [`get_many`](Backend::get_many) / [`acquire_many`](Backend::acquire_many) | `get` / `acquire` of each key, sent together (each key's step atomic on its own) |
//! | [`mark`](Backend::mark) | the namespace's generation moves past the server's clock; a tag's (or the namespace's) mark records it |
//! | [`read_marks`](Backend::read_marks) | the generation and some marks, read together |
//!
//! A value is *fresh* when its remaining TTL exceeds the grace period recorded
//! in its envelope header by more than the caller's `refresh_window`. Bytes
//! that are not a readable envelope are never fresh.

use std::fmt::Debug;
use std::sync::Weak;
use std::time::Duration;

use async_trait::async_trait;

pub use crate::error::{BackendError, BackendErrorKind};
pub use crate::key::FillKeys;
pub use crate::token::LeaseToken;

mod liveness;
mod marks;
pub mod memory;
mod tracking;
pub use liveness::{Gone, HolderWatch, Watch};
pub(crate) use marks::generation_from_stored;
pub use marks::{Mark, MarkKind};
pub use tracking::ChangeListener;
pub(crate) use tracking::Listeners;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

/// Stored bytes plus the server's remaining TTL for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The envelope bytes.
    pub bytes: Vec<u8>,
    /// The remaining (hard) TTL, as the server measures it.
    pub ttl: Duration,
}

/// The answer of [`Backend::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The value is fresh (beyond the refresh window): no lease was taken.
    Fresh(Stored),
    /// We hold the lease with our token. `stale` is whatever value existed.
    Won {
        /// A stale (or unreadable) value present at the time, if any.
        stale: Option<Stored>,
    },
    /// Someone else holds the lease.
    Held {
        /// A stale (or unreadable) value present at the time, if any.
        stale: Option<Stored>,
        /// The lease's remaining TTL.
        lease_ttl: Duration,
        /// The holder's token, if the backend reads it back (a waiter
        /// watches the holder it names: [`Backend::watch_holder`]).
        holder: Option<LeaseToken>,
    },
}

/// The most keys the cache sends to a backend in one
/// [`get_many`](Backend::get_many) or [`acquire_many`](Backend::acquire_many)
/// call: a bigger batch is sent in chunks of this size (concurrently), so no
/// pipeline grows without bound in the server's or the client's buffers.
pub const MAX_PIPELINE: usize = 1_000;

/// One key's part of [`Backend::acquire_many`]: what
/// [`acquire`](Backend::acquire) takes for it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseRequest {
    /// The key.
    pub keys: FillKeys,
    /// The token the lease is taken with, if it is free.
    pub token: LeaseToken,
    /// As `acquire`'s `refresh_window`.
    pub refresh_window: Duration,
}

impl LeaseRequest {
    /// A request for `keys`' lease with `token`.
    pub fn new(keys: FillKeys, token: LeaseToken, refresh_window: Duration) -> Self {
        LeaseRequest {
            keys,
            token,
            refresh_window,
        }
    }
}

/// A subscription to one key's fill notifications.
///
/// Created by [`Backend::subscribe`] *before* the caller re-checks the value,
/// so a fill that lands between the check and the wait is not missed.
#[async_trait]
pub trait FillSubscription: Send {
    /// Resolves at the next fill, release or invalidation of the key after the
    /// subscription was made (or after the previous call returned). May also
    /// resolve spuriously; callers re-check.
    async fn notified(&mut self);
}

/// A store for envelopes and leases. See the module docs for the contract.
///
/// Implemented by [`MemoryBackend`](crate::MemoryBackend) and, with the
/// `redis` feature, by `onefill::redis::RedisBackend`. Several caches
/// (namespaces) may share one backend. Another store can implement it too:
/// the conformance suite (feature `test-support`) checks an implementation
/// against the contract.
///
/// A wrapper over another backend (to count or log its calls, say) must
/// forward every method, the provided ones included: one that keeps a
/// default answers for the store as if it lacked the step. Over a store
/// where other processes mark, a wrapper that keeps the default
/// [`read_marks`](Backend::read_marks) answers values their
/// `invalidate_tag` and `clear` judged gone (the cache logs an error once
/// when it sees one), and one that keeps the default
/// [`expire`](Backend::expire) makes `Cache::expire` fail.
#[async_trait]
pub trait Backend: Debug + Send + Sync + 'static {
    /// The value and its remaining TTL, if present.
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError>;

    /// Returns the value if it is fresh for at least `refresh_window` beyond
    /// its grace; otherwise tries to take the lease with `token` for
    /// `lease_ttl`.
    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError>;

    /// [`get`](Backend::get) of every key, in one round trip where the store
    /// allows (a pipeline on Redis; per node, the nodes in parallel, on a
    /// cluster). One answer per key, in the order of `keys`; a key's error
    /// leaves the others' answers alone.
    ///
    /// The cache sends at most [`MAX_PIPELINE`]
    /// keys per call. The default calls `get` for every key concurrently,
    /// so a backend written before batches existed keeps working.
    async fn get_many(&self, keys: &[FillKeys]) -> Vec<Result<Option<Stored>, BackendError>> {
        futures_util::future::join_all(keys.iter().map(|k| self.get(k))).await
    }

    /// [`acquire`](Backend::acquire) of every request's key (each key
    /// atomic on its own, not the batch as a whole), in one round trip
    /// where the store allows. One answer per request, in order; a key's
    /// error leaves the others' answers alone. A key whose answer is an
    /// error may or may not have been leased with its token: the cache
    /// releases the token of a key that timed out or lost its connection.
    ///
    /// The default calls `acquire` for every request concurrently.
    async fn acquire_many(
        &self,
        requests: &[LeaseRequest],
        lease_ttl: Duration,
    ) -> Vec<Result<Acquired, BackendError>> {
        futures_util::future::join_all(
            requests
                .iter()
                .map(|r| self.acquire(&r.keys, &r.token, lease_ttl, r.refresh_window)),
        )
        .await
    }

    /// If the lease still holds `token`: stores `bytes` with TTL `ttl`,
    /// deletes the lease and announces the fill. Returns whether the lease was
    /// ours (false: nothing was written, and the loss is announced on the
    /// key's channel all the same, so waiters who watch this holder alive
    /// re-check rather than wait for a fill that never comes).
    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError>;

    /// If the lease still holds `token`: deletes it, optionally stores a short
    /// entry (a cached failure) and announces the release. Returns whether
    /// the lease was ours.
    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError>;

    /// If the lease still holds `token`: sets its TTL to `lease_ttl`. Returns
    /// whether the lease was ours; if not, announces the loss on the key's
    /// channel (as [`fill`](Backend::fill) does).
    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError>;

    /// Writes `bytes` unconditionally, deletes any lease (fencing out a fill
    /// in flight) and announces it.
    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError>;

    /// Deletes the value and any lease (fencing out a fill in flight) and
    /// announces it.
    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError>;

    /// [`invalidate`](Backend::invalidate) for the replay of a write that
    /// may not have run (sent `age` ago): a value written since, by
    /// anyone, is newer than that write and is kept; the lease is deleted
    /// and the change announced all the same. Returns whether the value
    /// was deleted (or there was none).
    ///
    /// Default: [`invalidate`](Backend::invalidate), for a backend that
    /// cannot tell when a value was written (a newer value is then deleted:
    /// one more load, never an older one kept).
    async fn invalidate_older_than(
        &self,
        keys: &FillKeys,
        age: Duration,
    ) -> Result<bool, BackendError> {
        let _ = age;
        self.invalidate(keys).await.map(|()| true)
    }

    /// Makes the value stale without deleting it, in one atomic step: if it
    /// is a readable envelope whose grace is above zero and its remaining
    /// TTL exceeds that grace, its hard expiry becomes now + grace (it is
    /// stale at once and lives out the grace window); a value stale already
    /// is left as it is; a value without grace (or bytes that are not a
    /// readable envelope) is deleted. A missing value stays missing. In
    /// every case any lease is deleted (fencing out a fill in flight, as
    /// [`set`](Backend::set) does) and the change is announced on the key's
    /// channel and to the change listeners.
    ///
    /// A store that records the expiry in the value too (the Redis
    /// backend's version-2 envelopes) must rewrite it with the TTL, or
    /// readers that trust it keep reading the value as fresh.
    ///
    /// # Errors
    ///
    /// The default: [`BackendErrorKind::Unsupported`], for a backend written
    /// before this method existed (nothing is changed).
    async fn expire(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let _ = keys;
        Err(BackendError::new(
            BackendErrorKind::Unsupported,
            "expire: this backend cannot make a value stale in place",
        ))
    }

    /// Subscribes to the key's fill notifications.
    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError>;

    /// A fresh token for a lease on `keys` this backend's caller is about
    /// to ask for. A backend that watches holders names itself in it
    /// ([`LeaseToken::for_holder`]); it may name itself differently by key
    /// (a Redis Cluster backend names the master the key lives on, so a
    /// waiter asks about the holder where its lease is). Default:
    /// [`LeaseToken::random`].
    fn new_token(&self, keys: &FillKeys) -> LeaseToken {
        let _ = keys;
        LeaseToken::random()
    }

    /// Starts watching the holder that `holder` (a token found in `keys`'
    /// lease) names, for a waiter that subscribes to the key's fills (the
    /// cache calls it together with [`subscribe`](Backend::subscribe), so
    /// both can share a round trip; its check of the lease must come after
    /// that subscription is in place):
    /// [`Watch::Moved`] if the lease no longer holds `holder`, so the
    /// waiter re-checks the key at once; [`Watch::Gone`] if the holder is
    /// gone already; else [`Watch::Alive`]. See [`HolderWatch`].
    ///
    /// Default: [`Watch::Unsupported`] (waiters re-check at the lease's
    /// expiry).
    async fn watch_holder(
        &self,
        keys: &FillKeys,
        holder: &LeaseToken,
    ) -> Result<Watch, BackendError> {
        let _ = (keys, holder);
        Ok(Watch::Unsupported)
    }

    /// [`acquire`](Backend::acquire), but a lease that still holds `gone`
    /// (the token of a holder judged gone) counts as free: it is replaced
    /// by `token`. Of several waiters that judged the same holder gone,
    /// one wins; the others find the winner's lease.
    ///
    /// Default: `acquire` (the gone holder's lease then holds until it
    /// expires).
    async fn take_over(
        &self,
        keys: &FillKeys,
        gone: &LeaseToken,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let _ = gone;
        self.acquire(keys, token, lease_ttl, refresh_window).await
    }

    /// The failure domain that holds `keys`: the part of the store that
    /// fails as one (a Redis Cluster master). The cache keeps one circuit
    /// breaker per shard, so a failing shard does not degrade the keys of
    /// the healthy ones.
    ///
    /// A cheap, synchronous lookup (it runs before every backend call). The
    /// numbers only need to tell shards apart; a key's shard may change
    /// (a failover moves its slot to another node). The default, for a
    /// store that fails as a whole, is one shard: `0`.
    fn shard(&self, keys: &FillKeys) -> u64 {
        let _ = keys;
        0
    }

    /// Whether `shard` (an answer of [`shard`](Backend::shard)) still serves
    /// keys. A Redis Cluster master whose slots have all moved (a failover
    /// promoted its replica, a reshard emptied it) no longer does: its
    /// circuit breaker then no longer counts in
    /// [`Cache::circuit_state`](crate::Cache::circuit_state), since no call
    /// will ever go to it, or probe it, again. Default: every shard does.
    fn shard_serves_keys(&self, shard: u64) -> bool {
        let _ = shard;
        true
    }

    /// Starts reporting changes of the keys that begin with `prefix` to
    /// `listener`, for as long as it lives (the backend holds it weakly and
    /// stops when it is gone), confirming the sync at least every
    /// `confirm_every` (see [`ChangeListener::synced`]). This is what keeps
    /// an in-process [`L1`](crate::L1) coherent.
    ///
    /// Must be called within a tokio runtime (a backend may start a task).
    /// Until the first [`synced`](ChangeListener::synced), the listener
    /// must assume nothing is in sync.
    ///
    /// # Errors
    ///
    /// The default: [`BackendErrorKind::Command`], for a backend that cannot
    /// report changes (a cache with an L1 then fails to build).
    fn track_changes(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: Weak<dyn ChangeListener>,
    ) -> Result<(), BackendError> {
        let _ = (prefix, confirm_every, listener);
        Err(BackendError::new(
            BackendErrorKind::Command,
            "this backend cannot report changes of values, so it cannot keep an L1 coherent",
        ))
    }

    /// Marks every value written before now with a tag (`mark_key` a tag's
    /// mark) or in the whole namespace (its clear mark) as invalid
    /// ([`MarkKind::Hard`]) or stale ([`MarkKind::Soft`]), in one atomic
    /// step: the generation under `gen_key` becomes the larger of itself
    /// plus one and the server's clock in microseconds (so it never goes
    /// back, even if the key is lost), and the mark records it (see
    /// [`Mark`]); the mark is kept at least `retention` (`None`: for
    /// ever). Both keys share a slot. The change of `mark_key` is reported
    /// to the [`ChangeListener`]s that track it, as a write's is. Returns
    /// the new generation.
    ///
    /// # Errors
    ///
    /// The default: [`BackendErrorKind::Unsupported`] (the cache's
    /// `invalidate_tag`, `expire_tag` and `clear` then fail with it; no
    /// value of such a backend carries a mark, so reads are unaffected).
    async fn mark(
        &self,
        gen_key: &str,
        mark_key: &str,
        kind: MarkKind,
        retention: Option<Duration>,
    ) -> Result<u64, BackendError> {
        let _ = (gen_key, mark_key, kind, retention);
        Err(marks::unsupported("mark"))
    }

    /// The generation under `gen_key` (0 if none) and the mark under each
    /// of `mark_keys` ([`Mark::default`] if none), read together (one
    /// atomic read: the keys share a slot).
    ///
    /// # Errors
    ///
    /// The default: [`BackendErrorKind::Unsupported`].
    async fn read_marks(
        &self,
        gen_key: &str,
        mark_keys: &[&str],
    ) -> Result<(u64, Vec<Mark>), BackendError> {
        let _ = (gen_key, mark_keys);
        Err(marks::unsupported("read_marks"))
    }

    /// Whether the store lives in this process and reports every change
    /// before the write returns (the [`MemoryBackend`](crate::MemoryBackend)).
    /// The default: `false`.
    fn in_process(&self) -> bool {
        false
    }

    /// Whether a cache on this backend has an [`L1`](crate::L1) unless
    /// told otherwise (`CacheBuilder::l1`, `CacheBuilder::no_l1`): the
    /// backend reports every change of a value through
    /// [`track_changes`](Backend::track_changes), cheaply enough that every
    /// cache may ask. The embedded backend and the Redis backend say yes.
    /// If `track_changes` then fails anyway, the cache is built without an
    /// L1 (an L1 asked for explicitly fails the build instead).
    ///
    /// The default: [`in_process`](Backend::in_process), so a backend
    /// written before this method keeps the L1 default it had (and a
    /// wrapper that forwards every call but this one gives no default L1).
    fn default_l1(&self) -> bool {
        self.in_process()
    }
}
