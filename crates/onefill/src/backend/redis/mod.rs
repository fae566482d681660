// Longer than most files: a third of it is the module's overview of the
// whole backend (its steps, the hit, connections, Sentinel, cluster), the
// page its users read; the rest is the `Backend` face, each step handing
// its work to a file of its own.

//! The Redis backend: standalone Redis, Redis under Sentinel, or Redis
//! Cluster (7.0 or later).
//!
//! Every [`Backend`] step is one server-side Lua script, so it is atomic
//! exactly like the [`MemoryBackend`](crate::MemoryBackend)'s critical
//! sections; the hit path [`get`](Backend::get) is no script: on a
//! standalone server a plain `GET` when the value is fresh (below), else a
//! pipelined `GET` + `PTTL`; on a cluster always the pipelined pair.
//!
//! | step | server side |
//! | --- | --- |
//! | `acquire` | value readable and `PTTL > grace + window`? return it : `SET lock token NX PX ttl` |
//! | `fill` | `GET lock == token`? `SET value PXAT at`, `DEL lock`, publish : publish the loss |
//! | `release` | `GET lock == token`? `DEL lock` (+ `SET value PXAT at`), publish |
//! | `extend` | `GET lock == token`? `PEXPIRE lock ttl` : publish the loss |
//! | `set` / `invalidate` | `SET value PXAT at` / `DEL value`, `DEL lock`, publish |
//! | `expire` | value readable, grace > 0 and `PTTL > grace`? `at = TIME + grace`: `SETRANGE value 16 at` (version 2 or 4), `PEXPIREAT value at` : grace 0 or unreadable? `DEL value`; `DEL lock`, publish |
//!
//! With [`RedisOptions::durability`] asking for replicas, every step that
//! writes a value or a mark (`fill`, `release` with an entry, `set`,
//! `invalidate`, `expire`, `mark`) is sent with a `WAIT` in the same
//! pipeline (`durability.rs`, decision 0020); on a standalone server and
//! under Sentinel, on a connection of their own, which a `WAIT` blocks
//! without holding back the hits.
//!
//! The scripts read the grace period from the envelope header; bytes that
//! are not an envelope are never fresh. A script that writes a value takes
//! `at = TIME + ttl` from the server's clock and stores the envelope as
//! version 2, which records `at` (decision 0011).
//!
//! # The hit
//!
//! A standalone backend estimates the server's clock from a `TIME` sent
//! when it connects and then riding on a hit every ten seconds (the answer and when it was asked and
//! answered, on the local monotonic clock; no wall clock is read). A hit
//! then sends `GET` alone: if the value records its expiry and the latest
//! the server's clock can read says it is fresh, that is its TTL (never
//! more than `PTTL` would say); if not (stale or about to be, a version-1
//! value, another client's bytes, no sample yet), the pipelined
//! `GET` + `PTTL` follows and the server's TTL decides, as before. A
//! cluster's masters each have their own clock: its hits are the pair. Scripts are sent with
//! `EVALSHA`; every script is loaded when a standalone backend connects,
//! and all of them whenever one meets `NOSCRIPT` (after a server restart
//! or failover, and a cluster node's first script call), so that a call whose caller gave up still runs when it
//! reaches the server late (see `scripts.rs`).
//!
//! # Connections
//!
//! - **Standalone**: a [`ConnectionManager`](redis::aio::ConnectionManager) (one multiplexed connection that
//!   reconnects by itself) for commands, plus one dedicated RESP3 connection
//!   for fill notifications (`SUBSCRIBE`/`PUBLISH`).
//! - **Sentinel** ([`RedisBackend::connect_sentinel`]): standalone
//!   connections to the primary that the sentinels name, which follow it
//!   across failovers (see [Sentinel](#sentinel) below).
//! - **Cluster**: onefill's own routing (`cluster/`): a slot map read
//!   with `CLUSTER SLOTS`, one multiplexed connection per master, commands
//!   routed by the hash-tagged key (so all keys of one script share a
//!   slot). `MOVED` and `ASK` are followed and `TRYAGAIN`/`CLUSTERDOWN`
//!   retried within the response timeout, so routing never reaches
//!   callers; a master that times out or refuses connections keeps the slot
//!   map refreshing (every 100–200 ms, asking the other masters) until its
//!   slots move, so a promoted replica takes over even from a master that
//!   hangs. Each master is a [shard](Backend::shard): the cache keeps one
//!   circuit breaker per master. Fill notifications use a RESP3 cluster
//!   connection of the `redis` crate with **sharded** pub/sub
//!   (`SSUBSCRIBE`/`SPUBLISH`, Redis 7.0+), routed by the channel's slot.
//!
//! Authentication (`redis://user:password@host:port`), the database
//! (`redis://host/2`, standalone only) and the protocol (`?protocol=resp3`)
//! come from the URL. A URL that does not parse is an error that says what
//! is wrong with it, without quoting it (it may hold a password).
//!
//! TLS (`rediss://`) needs onefill's `tls` cargo feature (rustls with the
//! ring provider). The server's certificate is checked against the system's
//! trust store, or against the CA given to `RedisOptions::tls_root_cert`;
//! `RedisOptions::tls_client_cert` adds a client certificate for mutual TLS.
//! Without the feature, a `rediss://` URL is an error that says so.
//!
//! # Sentinel
//!
//! [`connect_sentinel`](RedisBackend::connect_sentinel) asks every sentinel
//! for the primary (`SENTINEL MASTER`: the answer of the highest config
//! epoch wins, and the server must say `ROLE` master) and connects to it as
//! to a standalone server. Each sentinel is kept subscribed to
//! `+switch-master`; the sentinels are asked again when one announces a
//! switch, when a call meets a connection failure, a timeout or `READONLY`
//! (at most every 250 ms), and every 5 s. A new primary gets new
//! connections: commands, fill notifications (subscriptions made again,
//! waiters woken) and the L1's tracking, which empties the L1 (writes the
//! old primary acknowledged may be lost in the failover: replication is
//! asynchronous). The estimate of the server's clock starts over, and
//! calls go to a new [shard](Backend::shard): the circuit breaker the old
//! primary opened is left behind. Credentials and TLS of the sentinels are
//! in their URLs, those of the data nodes in [`SentinelOptions`]. See
//! `docs/decisions/0019-sentinel.md`.
//!
//! A plain URL is followed too (`endpoint.rs`): behind a managed service's
//! primary endpoint, a failover leaves the connections made before on the
//! demoted node; a call refused with `READONLY` makes the backend check
//! `ROLE`, open new connections through the URL and move every connection
//! there once their server answers as a master. A script refused with
//! `READONLY` is sent again once the backend has moved, within the same
//! response timeout. See `docs/decisions/0024-failover-with-loads-under-way.md`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), onefill::BackendError> {
//! use onefill::redis::{RedisBackend, SentinelOptions};
//!
//! let backend = RedisBackend::connect_sentinel(
//!     &["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
//!     "mymaster",
//! )
//! .await?;
//! // With a password on the data nodes (the sentinels' is in their URLs):
//! let options = SentinelOptions::new().password("secret");
//! let protected = RedisBackend::connect_sentinel_with(
//!     &["redis://:sentinel-secret@10.0.0.1:26379"],
//!     "mymaster",
//!     options,
//! )
//! .await?;
//! # drop((backend, protected));
//! # Ok(()) }
//! ```
//!
//! # Fill notifications
//!
//! One subscriber connection per backend is shared by every waiting key; a
//! background task keeps it subscribed to the channels in use. After the
//! connection drops (a restart, a network failure, a failed health-check
//! `PING`), it reconnects with jittered exponential backoff and subscribes
//! again; on a cluster the `redis` crate reconnects nodes and resubscribes
//! itself. Either way every subscription is woken once when its channel is
//! subscribed again, because fills announced meanwhile were lost. While the
//! subscriber is disconnected, [`subscribe`](Backend::subscribe) returns at
//! once, and while a channel is not confirmed its subscriptions wake their
//! waiters at the default waiters' polling pace (20 ms doubling to
//! 500 ms): a waiter whose subscription is confirmed re-checks only when
//! notified, at the holder's lease expiry and at its slow safety poll.
//!
//! Limits: notifications are best effort (Redis pub/sub has no delivery
//! guarantee; the safety poll covers a lost one). A subscription not
//! confirmed within 20 ms is handed to the waiter anyway and fires once
//! confirmed. On a
//! cluster, each channel is subscribed on its own, so a node that hangs
//! delays only its own channels, which are retried every half second; a
//! slot that migrates relies on the `redis` crate moving its subscriptions.
//!
//! # Lease holders' liveness
//!
//! A waiter watches the process holding the lease
//! (`liveness.rs`, decision 0015): each backend names itself in its lease
//! tokens and keeps its notification connection subscribed to
//! `onefill:holder:<id>`; a waiter subscribes to `onefill:holder:<id>:beats`
//! and publishes to the presence channel (nobody received it: the holder's
//! connection closed, it is dead); the holder then beats every 90 ms while
//! anyone listens. A late beat makes the waiter ask again, a second of
//! silence makes the holder frozen; either way the waiter takes the lease
//! over (the acquire script, told the gone token). The waiter's question
//! names the lease, and a holder asked about one none of its flights holds
//! any more (a failover kept the lease and lost its fill) releases it
//! (decision 0024). An ACL must let the
//! backend publish and subscribe to `onefill:holder:*` as well as to its
//! namespaces' channels. On a cluster the channels are sharded, one pair
//! per master a holder holds leases on (`onefill:holder:{<tag>}:<id>`),
//! so a key's liveness fails over with the key.
//!
//! # L1 coherence
//!
//! The caches built with an [`L1`](crate::L1) on this backend share one
//! RESP3 connection (one per master on a cluster, following the slot map)
//! with `CLIENT TRACKING ON BCAST PREFIX <namespace>:{` for each of their
//! namespaces (a cache built later adds its prefix to the live
//! connection; `tracked.rs`): Redis pushes
//! an invalidation for every key of the namespace that changes, whoever
//! changed it (onefill, another client, an expiry, an eviction; a
//! `FLUSHALL` empties the L1). A `PING` on that connection every fifth of
//! [`L1::sync_bound`](crate::L1::sync_bound) confirms that every change
//! before it was reported; without a confirmation younger than the bound
//! the L1 does not serve, and after a reconnection it is emptied first.
//! Every Redis backend also tells every L1 of its process (on this
//! backend or another) of its writes before they return. `SWAPDB` sends no invalidation. Redis 6 or later
//! (RESP3); see `docs/decisions/0009-l1-coherence.md`.
//!
//! A server that refuses `CLIENT TRACKING` (asked with `CLIENT TRACKING
//! OFF` when the backend connects, and met by the tracking connection
//! itself) leaves the L1 the changes onefill announces: every script that
//! changes a value publishes its key's channel (the one fill notifications
//! use; on a cluster a plain `PUBLISH` of it besides the sharded one), and
//! the L1's connection pattern-subscribes to them instead of tracking,
//! confirmed the same way; see [`Untracked`](crate::Untracked) and
//! `docs/decisions/0021-l1-without-tracking.md`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), onefill::BackendError> {
//! use std::time::Duration;
//! use onefill::redis::{RedisBackend, RedisOptions};
//!
//! // Standalone, with the default timeouts (1 s connect, 1 s response).
//! let backend = RedisBackend::connect("redis://:secret@127.0.0.1:6379/0").await?;
//!
//! // Cluster: any reachable nodes; the rest of the topology is discovered.
//! let options = RedisOptions::new().response_timeout(Duration::from_millis(250));
//! let cluster = RedisBackend::connect_cluster_with(
//!     &["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"],
//!     options,
//! )
//! .await?;
//!
//! let users = onefill::Cache::<u64, String>::builder()
//!     .namespace("users")
//!     .backend(backend)
//!     .build()
//!     .expect("valid options");
//! # drop((users, cluster));
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use redis::{FromRedisValue, Script};
use tokio::time::Instant;

use super::Listeners;
use super::{
    Acquired, Backend, BackendError, ChangeListener, FillKeys, FillSubscription, LeaseRequest,
    LeaseToken, Mark, MarkKind, Stored, Watch,
};
use crate::error::BackendErrorKind;

mod access;
mod acquire;
mod batch;
mod cluster;
mod connect;
mod durability;
mod endpoint;
mod errors;
mod liveness;
mod marks;
mod options;
mod primary;
mod push;
mod read;
mod scripts;
mod sentinel;
mod server_clock;
mod subscriber;
mod tracked;
mod tracking;
mod ttl;
mod urls;
mod write;

pub use durability::Durability;
pub use options::RedisOptions;
pub use sentinel::SentinelOptions;
pub use ttl::NO_EXPIRY_TTL;

use acquire::{acquired_from, AcquireAnswer};
use cluster::{slot_of, ClusterRouter};
use durability::{sends, Shortfall, Wait};
use errors::{classify, with_deadline};
use liveness::Liveness;
use primary::{is_readonly, Following, Primary};
use read::stored;
use scripts::{ScriptCall, Scripts};
use server_clock::ServerClock;
use subscriber::PubSubShared;
use ttl::{ms_ceil, px};
use write::Unconditional;

/// A [`Backend`] on Redis: standalone, under Sentinel, or Redis Cluster.
///
/// Cheap to clone; clones share the connections. See the
/// [module docs](self) for the scripts, the connections and how fill
/// notifications work.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

/// The L1s of this process on any Redis backend, by namespace prefix: told
/// of a write by any Redis backend of the process before it returns (their
/// tracking pushes come later). One registry for the process, not one per
/// backend: two caches of one namespace on two `RedisBackend`s (two
/// `connect` calls) must each see the other's writes at once too. A
/// listener on another server that shares a namespace hears of writes it
/// did not need to: one read more, never a stale answer.
fn process_listeners() -> &'static Listeners {
    static PROCESS: std::sync::LazyLock<Listeners> = std::sync::LazyLock::new(Listeners::default);
    &PROCESS
}

/// `op` on the master of `keys`' slot ([`ClusterRouter::run`]). An answer
/// that came through an `ASK` (the slot is migrating) is from a node this
/// process may not track, so no push would ever tell an L1 that the value
/// changed there: it is reported as a change, and an L1, which takes back
/// what it inserts for a key changed since its read began, never keeps it
/// (and drops what it had).
async fn run_about<T, F, Fut>(
    router: &ClusterRouter,
    keys: &FillKeys,
    op: F,
) -> Result<T, redis::RedisError>
where
    F: Fn(redis::aio::MultiplexedConnection, bool) -> Fut,
    Fut: std::future::Future<Output = Result<T, redis::RedisError>>,
{
    let asked = AtomicBool::new(false);
    let answer = router
        .run(slot_of(keys.value().as_bytes()), |c, asking| {
            asked.fetch_or(asking, Ordering::Relaxed);
            op(c, asking)
        })
        .await;
    if asked.load(Ordering::Relaxed) {
        process_listeners().changed(keys.value());
    }
    answer
}

struct Inner {
    conn: Conn,
    options: RedisOptions,
    scripts: &'static Scripts,
    /// Standalone hits read the TTL from the envelope with this estimate
    /// (decision 0011); unused on a cluster. Shared with a Sentinel
    /// follower, which starts it over when the primary changes.
    clock: Arc<ServerClock>,
    /// Prefixes an L1 keeps: their hits read the server's TTL.
    kept: read::KeptPrefixes,
    pubsub: Arc<PubSubShared>,
    /// Standalone: whether this backend's lease holders are alive
    /// (`liveness.rs`); set once connected.
    liveness: std::sync::OnceLock<Arc<Liveness>>,
    /// Where we are connected, without credentials (for `Debug`).
    target: String,
    /// The server's refusal of `CLIENT TRACKING`, if it refused when the
    /// backend connected (an L1 then starts on announced changes, or its
    /// cache fails to build: `tracking.rs`).
    untracked: std::sync::OnceLock<BackendError>,
    /// What the L1s of the caches on this backend track, through one
    /// connection per server (`tracked.rs`).
    tracked: Arc<tracked::Tracked>,
    /// Whether its primary is short of replicas (`durability.rs`).
    shortfall: Arc<Shortfall>,
    /// The namespaces whose ACL needs were checked (`access.rs`).
    checked: access::Checked,
}

#[derive(Clone)]
enum Conn {
    /// A standalone server, followed through its URL or under Sentinel.
    Single(Primary),
    /// onefill's own routing (see `cluster/`): the driver's cluster
    /// connection never leaves a hung master.
    Cluster(ClusterRouter),
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match &self.inner.conn {
            Conn::Single(p) if p.following() == Following::Endpoint => "standalone",
            Conn::Single(_) => "sentinel",
            Conn::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisBackend")
            .field("mode", &mode)
            .field("target", &self.inner.target)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Whether `shard` (an answer of [`Backend::shard`]) is still the
    /// current primary: false once a followed primary (Sentinel, an
    /// endpoint) has moved away from it. Always true on a cluster, whose
    /// calls follow a moved slot themselves. Cheap: for calls still out.
    pub(crate) fn still_primary(&self, shard: u64) -> bool {
        match &self.inner.conn {
            Conn::Single(primary) => primary.serves(shard),
            Conn::Cluster(_) => true,
        }
    }

    /// Whether this is a standalone server (under Sentinel, behind an
    /// endpoint, or plain): one primary, which a failover can replace.
    pub(crate) fn is_standalone(&self) -> bool {
        matches!(self.inner.conn, Conn::Single(_))
    }

    /// The current primary's shard (for [`still_primary`](Self::still_primary));
    /// 0 on a cluster.
    pub(crate) fn primary_shard(&self) -> u64 {
        match &self.inner.conn {
            Conn::Single(primary) => primary.shard(),
            Conn::Cluster(_) => 0,
        }
    }

    /// `error`, after a followed primary's follower has seen it (see
    /// [`Primary::saw`]).
    fn saw(&self, error: BackendError) -> BackendError {
        if let Conn::Single(primary) = &self.inner.conn {
            primary.saw(&error);
        }
        error
    }

    /// Runs `invocation`, whose keys all share `keys`' hash tag.
    async fn eval<T: FromRedisValue>(
        &self,
        op: &'static str,
        keys: &FillKeys,
        invocation: &ScriptCall<'_>,
    ) -> Result<T, BackendError> {
        let (answer, _) = self.eval_then_wait(op, keys, invocation, None).await?;
        Ok(answer)
    }

    /// [`eval`](Self::eval), with `wait`'s `WAIT` behind the script in the
    /// same pipeline (on a cluster, resent with it wherever a redirection
    /// sends it): the script's answer and how many replicas confirmed.
    async fn eval_then_wait<T: FromRedisValue>(
        &self,
        op: &'static str,
        keys: &FillKeys,
        invocation: &ScriptCall<'_>,
        wait: Option<Wait>,
    ) -> Result<(T, Option<i64>), BackendError> {
        match &self.inner.conn {
            // The command connection has no response timeout of its own
            // (see `connect_with`): a `Backend` method called directly is
            // bounded here, by the response timeout.
            Conn::Single(c) => self.single_eval_then_wait(c, op, invocation, wait).await,
            Conn::Cluster(router) => {
                let scripts = self.inner.scripts;
                run_about(router, keys, |mut c, asking| async move {
                    invocation
                        .invoke_then_wait(scripts, &mut c, asking, wait)
                        .await
                })
                .await
                .map_err(|e| classify(op, e))
            }
        }
    }

    /// [`eval_then_wait`](Self::eval_then_wait) on a standalone server,
    /// bounded by the response timeout: a script refused with `READONLY`
    /// by a server that is no longer the primary (nothing ran: a replica
    /// writes nothing) is sent again once the backend has moved to the new
    /// one, within the same limit.
    async fn single_eval_then_wait<T: FromRedisValue>(
        &self,
        c: &Primary,
        op: &'static str,
        invocation: &ScriptCall<'_>,
        wait: Option<Wait>,
    ) -> Result<(T, Option<i64>), BackendError> {
        let limit = self.inner.options.response_timeout;
        let began = Instant::now();
        let scripts = self.inner.scripts;
        let epoch = c.shard();
        let mut answer = {
            let mut conn = c.writer(sends(wait));
            let flight = c.in_flight();
            let sent = invocation.invoke_then_wait(scripts, &mut conn, false, wait);
            let answer = with_deadline(op, limit, sent).await;
            flight.answered();
            answer
        };
        if let Err(e) = &answer {
            c.saw(e);
            let left = limit.saturating_sub(began.elapsed());
            if is_readonly(e) && c.moved_from(epoch, left).await {
                let mut conn = c.writer(sends(wait));
                let sent = invocation.invoke_then_wait(scripts, &mut conn, false, wait);
                let left = limit.saturating_sub(began.elapsed());
                answer = with_deadline(op, left, sent).await;
                if let Err(e) = &answer {
                    c.saw(e);
                }
            }
        }
        answer
    }

    async fn eval_flag(
        &self,
        op: &'static str,
        keys: &FillKeys,
        invocation: &ScriptCall<'_>,
    ) -> Result<bool, BackendError> {
        self.eval_write(op, keys, invocation, None).await
    }

    /// A script that answers 0 or 1, sent with `wait`'s `WAIT`: when it
    /// answers 1 (it wrote), too few confirmations are its error.
    async fn eval_write(
        &self,
        op: &'static str,
        keys: &FillKeys,
        invocation: &ScriptCall<'_>,
        wait: Option<Wait>,
    ) -> Result<bool, BackendError> {
        let (answer, acked) = self
            .eval_then_wait::<i64>(op, keys, invocation, wait)
            .await?;
        let wrote = flag(op, answer)?;
        if wrote {
            self.confirmed(op, wait, acked)?;
        }
        Ok(wrote)
    }

    /// The step that ends the lease with `token` (its fill or release)
    /// is under way: once it is over, landed or not, no flight of this
    /// backend holds the lease (see `liveness.rs`).
    fn ending(&self, token: &LeaseToken) -> Option<liveness::Ending> {
        self.inner.liveness.get().map(|l| l.ending(token))
    }

    /// How old the value a flight holding `token` writes may be, in ms, for
    /// its stamp (`stamp.lua`): since its acquire began, the earliest its
    /// load can have read its source; empty if unknown (an anonymous
    /// token), which stamps it as written at the epoch. A replay keeps a
    /// value written after the write it replays began, and a load that
    /// read the source before that write is not after it.
    fn load_age(&self, token: &LeaseToken) -> String {
        self.inner
            .liveness
            .get()
            .and_then(|l| l.held_for(token))
            .map(|age| ms_ceil(age).to_string())
            .unwrap_or_default()
    }

    /// The `WAIT` every write of a value or a mark is sent with, if any
    /// (not sent while the primary is short of replicas: `durability.rs`).
    fn wait(&self) -> Option<Wait> {
        let options = &self.inner.options;
        let wait = Wait::of(options.durability, options.response_timeout);
        match &self.inner.conn {
            Conn::Single(primary) => {
                let (wait, probe) = self.inner.shortfall.apply(wait);
                if let (Some(wait), true) = (wait, probe) {
                    let limit = self.inner.options.response_timeout;
                    durability::probe(&self.inner.shortfall, primary.writer(true), wait, limit);
                }
                wait
            }
            // Each master has replicas of its own: one short of them says
            // nothing of the others (and its writes, on the connection it
            // shares with its reads, are bounded by the response timeout).
            Conn::Cluster(_) => wait,
        }
    }

    /// A write of `op` that ran: an error if `wait` asked for more replicas
    /// than the `acked` that confirmed it, or was not sent.
    fn confirmed(
        &self,
        op: &str,
        wait: Option<Wait>,
        acked: Option<i64>,
    ) -> Result<(), BackendError> {
        match (wait, acked) {
            (Some(wait), Some(acked)) => {
                // Only a standalone server's writes skip their `WAIT` while
                // it is short (see `wait`).
                if let Conn::Single(_) = &self.inner.conn {
                    self.inner.shortfall.record(wait, acked);
                }
                wait.check(op, acked)
            }
            (Some(wait), None) if !sends(Some(wait)) => Err(wait.unconfirmed(op)),
            _ => Ok(()),
        }
    }

    /// Warns when a cache with `backend_timeout` would see this backend's
    /// shortfalls as timeouts (see [`Wait::outlasts`]).
    pub(crate) fn check_durability_against(&self, backend_timeout: Duration) {
        let options = &self.inner.options;
        // The configured `WAIT`, not this moment's (which asks for a probe
        // while the primary is short, and may be called outside a runtime).
        if let Some(wait) = Wait::of(options.durability, options.response_timeout) {
            if wait.outlasts(backend_timeout) {
                tracing::warn!(
                    wait = ?wait.timeout(),
                    ?backend_timeout,
                    "the durability timeout, plus up to 100 ms before the server ends a WAIT, \
                     is not below the cache's backend timeout: a write whose replicas are slow \
                     would time out (and be queued for replay) instead of reporting the shortfall"
                );
            }
        }
    }
}

impl RedisBackend {
    /// `invalidate`, or with `older_than` its replay's form: whether the
    /// value was deleted.
    async fn invalidate_if_older(
        &self,
        keys: &FillKeys,
        older_than: Option<Duration>,
    ) -> Result<bool, BackendError> {
        let mut invocation = announcing(&self.inner.scripts.invalidate, keys);
        if let Some(age) = older_than {
            invocation.arg(px(age));
        }
        let apart = Unconditional::Invalidate { older_than };
        let invalidated = self.write("invalidate", keys, &invocation, apart).await;
        process_listeners().changed(keys.value());
        invalidated
    }
}

/// A script's 0 or 1.
fn flag(op: &str, answer: i64) -> Result<bool, BackendError> {
    match answer {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(BackendError::new(
            BackendErrorKind::Protocol,
            format!("{op}: the script answered {other}, expected 0 or 1"),
        )),
    }
}

/// Whether a write's answer says it ran (whatever its replicas did).
fn ran(answer: &Result<bool, BackendError>) -> bool {
    match answer {
        Ok(wrote) => *wrote,
        Err(e) => e.is_not_replicated(),
    }
}

/// An invocation of `script` on the key's value, lock and channel: the
/// `KEYS` of every script that announces a change, in that order.
fn announcing<'a>(script: &'a Script, keys: &FillKeys) -> ScriptCall<'a> {
    let mut invocation = ScriptCall::new(script);
    invocation
        .key(keys.value())
        .key(keys.lock())
        .key(keys.channel());
    invocation
}

#[async_trait]
impl Backend for RedisBackend {
    /// Standalone: `GET` alone when the envelope's expiry (the server's
    /// clock) tells it is fresh, else `GET` + `PTTL` (decision 0011).
    /// Cluster: `GET` + `PTTL` (each master has its own clock).
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        // Bounded by the response timeout alone (the command connection has
        // none of its own, see `connect_with`); a cache calls `read_within`
        // with its own timeout.
        self.read_within(keys, Duration::MAX, Instant::now()).await
    }

    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        self.acquire_replacing(keys, None, token, lease_ttl, refresh_window)
            .await
    }

    /// The acquire script, told the gone holder's token.
    async fn take_over(
        &self,
        keys: &FillKeys,
        gone: &LeaseToken,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        self.acquire_replacing(keys, Some(gone), token, lease_ttl, refresh_window)
            .await
    }

    /// One pipeline of `GET` + `PTTL` per key (per master on a cluster,
    /// the masters in parallel); see `batch.rs`.
    async fn get_many(&self, keys: &[FillKeys]) -> Vec<Result<Option<Stored>, BackendError>> {
        self.pipelined_get_many(keys).await
    }

    /// One pipeline of the acquire script per key (per master on a
    /// cluster, the masters in parallel); see `batch.rs`.
    async fn acquire_many(
        &self,
        requests: &[LeaseRequest],
        lease_ttl: Duration,
    ) -> Vec<Result<Acquired, BackendError>> {
        self.pipelined_acquire_many(requests, lease_ttl).await
    }

    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let age = self.load_age(token);
        let _ending = self.ending(token);
        let mut invocation = announcing(&self.inner.scripts.fill, keys);
        invocation
            .arg(token.as_bytes())
            .arg(bytes)
            .arg(px(ttl))
            .arg(age);
        let filled = self
            .eval_write("fill", keys, &invocation, self.wait())
            .await;
        if ran(&filled) {
            process_listeners().changed(keys.value());
        }
        filled
    }

    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        let age = self.load_age(token);
        let _ending = self.ending(token);
        let mut invocation = announcing(&self.inner.scripts.release, keys);
        invocation.arg(token.as_bytes());
        if let Some((bytes, ttl)) = entry {
            invocation.arg(bytes).arg(px(ttl)).arg(age);
        }
        // Only a release that leaves an entry writes a value: a lease
        // alone is not waited for.
        let wait = entry.and(self.wait());
        let released = self.eval_write("release", keys, &invocation, wait).await;
        if ran(&released) && entry.is_some() {
            process_listeners().changed(keys.value());
        }
        released
    }

    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        let mut invocation = announcing(&self.inner.scripts.extend, keys);
        invocation.arg(token.as_bytes()).arg(px(lease_ttl));
        self.eval_flag("extend", keys, &invocation).await
    }

    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        let mut invocation = announcing(&self.inner.scripts.set, keys);
        invocation.arg(bytes).arg(px(ttl));
        let set = self
            .write("set", keys, &invocation, Unconditional::Set { bytes, ttl })
            .await;
        // Failed or not, the write may have landed.
        process_listeners().changed(keys.value());
        set.map(drop)
    }

    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        self.invalidate_if_older(keys, None).await.map(drop)
    }

    /// `invalidate.lua` with the age: a value whose version-6 envelope
    /// records a write within it is kept (the lease is deleted).
    async fn invalidate_older_than(
        &self,
        keys: &FillKeys,
        age: Duration,
    ) -> Result<bool, BackendError> {
        self.invalidate_if_older(keys, Some(age)).await
    }

    /// The expire script (`soften.lua`: the new expiry is written both as
    /// the key's `PEXPIREAT` and in a stamped envelope, which a one-`GET`
    /// hit trusts). On a cluster whose slot migrates it runs apart, as
    /// `set` and `invalidate` do (`write.rs`).
    async fn expire(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let invocation = announcing(&self.inner.scripts.expire, keys);
        let expired = self
            .write("expire", keys, &invocation, Unconditional::Expire)
            .await;
        // Failed or not, the change may have landed.
        process_listeners().changed(keys.value());
        expired.map(drop)
    }

    async fn mark(
        &self,
        gen_key: &str,
        mark_key: &str,
        kind: MarkKind,
        retention: Option<Duration>,
    ) -> Result<u64, BackendError> {
        self.write_mark(gen_key, mark_key, kind, retention).await
    }

    async fn read_marks(
        &self,
        gen_key: &str,
        mark_keys: &[&str],
    ) -> Result<(u64, Vec<Mark>), BackendError> {
        self.mget_marks(gen_key, mark_keys).await
    }

    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        let channel = keys.channel().to_owned();
        Ok(self.inner.pubsub.subscribe(channel).await)
    }

    /// A token naming this backend (on a cluster, with the master of
    /// `keys`' slot): see `liveness.rs`.
    fn new_token(&self, keys: &FillKeys) -> LeaseToken {
        match self.inner.liveness.get() {
            Some(liveness) => liveness.new_token(keys),
            None => LeaseToken::random(),
        }
    }

    /// The holder's beats and presence (see `liveness.rs`).
    async fn watch_holder(
        &self,
        keys: &FillKeys,
        holder: &LeaseToken,
    ) -> Result<Watch, BackendError> {
        match self.inner.liveness.get() {
            Some(liveness) => liveness.watch(keys, holder).await,
            None => Ok(Watch::Unsupported),
        }
    }

    /// `CLIENT TRACKING ... BCAST PREFIX prefix` on the backend's tracking
    /// connection (one per master on a cluster, shared by every listener
    /// of the backend: the first starts it), confirmed by a `PING` every
    /// `confirm_every`; see the module docs' [L1 coherence](self#l1-coherence).
    /// If the server refuses tracking, the listener is asked whether
    /// onefill's announced changes will do
    /// ([`ChangeListener::untracked`]); if it refused when the backend
    /// connected and the listener says no, an error of kind
    /// [`Unsupported`](BackendErrorKind::Unsupported).
    fn track_changes(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: Weak<dyn ChangeListener>,
    ) -> Result<(), BackendError> {
        let start = self.inner.tracked.add(
            prefix,
            confirm_every,
            listener.clone(),
            self.inner.untracked.get(),
        )?;
        process_listeners().register(prefix, listener);
        self.inner.kept.add(prefix);
        if start {
            let tracking = tracking::Tracking {
                tracked: self.inner.tracked.clone(),
                options: self.inner.options.clone(),
            };
            match &self.inner.conn {
                Conn::Single(primary) => tracking::track_standalone(primary.clone(), tracking),
                Conn::Cluster(router) => tracking::track_cluster(router.downgrade(), tracking),
            }
        }
        Ok(())
    }

    /// Every change is reported (`CLIENT TRACKING`, or where the server
    /// refuses it, onefill's announcements: see `track_changes`), so a
    /// cache on Redis has an L1 unless told otherwise.
    fn default_l1(&self) -> bool {
        true
    }

    /// Standalone: one shard (under Sentinel, one per primary in turn).
    /// Cluster: the master that serves the key's slot now.
    fn shard(&self, keys: &FillKeys) -> u64 {
        match &self.inner.conn {
            Conn::Single(primary) => primary.shard(),
            Conn::Cluster(router) => router.shard_of(slot_of(keys.value().as_bytes())),
        }
    }

    /// Standalone: its one shard (under Sentinel, the current primary's).
    /// Cluster: a master that owns a slot in the router's slot map now (a
    /// scan of the slot map: for health reports, not for calls).
    fn shard_serves_keys(&self, shard: u64) -> bool {
        match &self.inner.conn {
            Conn::Single(primary) => primary.serves(shard),
            Conn::Cluster(router) => shard == 0 || router.serves_keys(shard),
        }
    }
}
