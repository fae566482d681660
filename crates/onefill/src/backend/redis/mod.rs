//! The Redis backend: standalone Redis or Redis Cluster (7.0 or later).
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
//! | `fill` | `GET lock == token`? `SET value PXAT at`, `DEL lock`, publish |
//! | `release` | `GET lock == token`? `DEL lock` (+ `SET value PXAT at`), publish |
//! | `extend` | `GET lock == token`? `PEXPIRE lock ttl` |
//! | `set` / `invalidate` | `SET value PXAT at` / `DEL value`, `DEL lock`, publish |
//!
//! The scripts read the grace period from the envelope header; bytes that
//! are not an envelope are never fresh. A script that writes a value takes
//! `at = TIME + ttl` from the server's clock and stores the envelope as
//! version 2, which records `at` (decision 0011).
//!
//! # The hit
//!
//! A standalone backend estimates the server's clock from a `TIME` that
//! rides on a hit about once a second (the answer and when it was asked and
//! answered, on the local monotonic clock; no wall clock is read). A hit
//! then sends `GET` alone: if the value records its expiry and the latest
//! the server's clock can read says it is fresh, that is its TTL (never
//! more than `PTTL` would say); if not (stale or about to be, a version-1
//! value, another client's bytes, no sample yet), the pipelined
//! `GET` + `PTTL` follows and the server's TTL decides, as before. A
//! cluster's masters each have their own clock: its hits are the pair. Scripts are sent with
//! `EVALSHA` and loaded again on `NOSCRIPT` (after a server restart or
//! failover).
//!
//! # Connections
//!
//! - **Standalone**: a [`ConnectionManager`] (one multiplexed connection that
//!   reconnects by itself) for commands, plus one dedicated RESP3 connection
//!   for fill notifications (`SUBSCRIBE`/`PUBLISH`).
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
//! # L1 coherence
//!
//! A cache built with an [`L1`](crate::L1) on this backend gets a RESP3
//! connection of its own (one per master on a cluster, following the slot
//! map) with `CLIENT TRACKING ON BCAST PREFIX <namespace>:{`: Redis pushes
//! an invalidation for every key of the namespace that changes, whoever
//! changed it (onefill, another client, an expiry, an eviction; a
//! `FLUSHALL` empties the L1). A `PING` on that connection every fifth of
//! [`L1::sync_bound`](crate::L1::sync_bound) confirms that every change
//! before it was reported; without a confirmation younger than the bound
//! the L1 does not serve, and after a reconnection it is emptied first.
//! The backend also tells the L1s of its own process of its own writes
//! before they return. `SWAPDB` sends no invalidation. Redis 6 or later
//! (RESP3); see `docs/decisions/0009-l1-coherence.md`.
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
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{Client, FromRedisValue, ProtocolVersion, RedisError, Script};
use tokio::sync::mpsc::unbounded_channel;
use tokio::time::Instant;

use super::Listeners;
use super::{
    Acquired, Backend, BackendError, ChangeListener, FillKeys, FillSubscription, LeaseRequest,
    LeaseToken, Stored,
};
use crate::deadline;
use crate::envelope;
use crate::error::BackendErrorKind;

mod batch;
mod cluster;
mod errors;
mod link;
mod options;
mod push;
mod scripts;
mod server_clock;
mod subscriber;
mod tracking;
mod ttl;
mod urls;

pub use options::RedisOptions;
pub use ttl::NO_EXPIRY_TTL;

use cluster::{slot_of, ClusterRouter};
use errors::{classify, with_deadline};
use link::{ClusterLink, Link, SingleLink};
use options::{check_url_and_tls, connect_deadline, open_client};
use scripts::{ScriptCall, Scripts, CLUSTER_SCRIPTS, STANDALONE_SCRIPTS};
use server_clock::{Plan, ServerClock};
use subscriber::PubSubShared;
use ttl::{ms_ceil, px, ttl_from_ms};
use urls::redact;

/// A [`Backend`] on Redis: standalone or Redis Cluster.
///
/// Cheap to clone; clones share the connections. See the
/// [module docs](self) for the scripts, the connections and how fill
/// notifications work.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    /// Standalone: a RESP3 client of the server, for L1 tracking
    /// connections (a cluster's come from the router's nodes).
    resp3: Option<Client>,
    /// The L1s of this process on this backend: told of this backend's own
    /// writes before they return (their tracking pushes come later).
    listeners: Listeners,
    options: RedisOptions,
    scripts: &'static Scripts,
    /// Standalone hits read the TTL from the envelope with this estimate
    /// (decision 0011); unused on a cluster.
    clock: ServerClock,
    pubsub: Arc<PubSubShared>,
    /// Where we are connected, without credentials (for `Debug`).
    target: String,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    /// onefill's own routing (see `cluster/`): the driver's cluster
    /// connection never leaves a hung master.
    Cluster(ClusterRouter),
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.inner.conn {
            Conn::Single(_) => "standalone",
            Conn::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisBackend")
            .field("mode", &mode)
            .field("target", &self.inner.target)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Connects to a standalone Redis with the default [`RedisOptions`].
    ///
    /// `url` is a redis-rs connection URL: `redis://[user:password@]host[:port][/db]`
    /// (or `redis+unix:///path`). Fails if the server cannot be reached, or
    /// if the URL is malformed (the error says what is wrong with it,
    /// without quoting it).
    pub async fn connect(url: &str) -> Result<RedisBackend, BackendError> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to a standalone Redis with the given options.
    pub async fn connect_with(
        url: &str,
        options: RedisOptions,
    ) -> Result<RedisBackend, BackendError> {
        let client = open_client(url, &options)?;
        // No response timeout on the command connection: the `Backend`
        // methods bound their commands by it themselves, but a cache's hit
        // calls `read` directly, bounded by the cache's own timeout alone
        // (a second timer per hit cost about a tenth of a Redis hit's
        // instructions, measured with callgrind). A reply that comes after its
        // caller gave up is read and dropped, as before.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connection_timeout))
            .set_response_timeout(None)
            .set_number_of_retries(options.reconnect_retries)
            .set_max_delay(options.max_backoff);
        let manager = with_deadline(
            "connect",
            connect_deadline(&options),
            client.get_connection_manager_with_config(config),
        )
        .await?;

        // Fill notifications use RESP3 pushes on a connection of their own.
        let sub_client = push::resp3(&client).map_err(|e| classify("connect", e))?;
        let mut link = SingleLink::new(sub_client.clone(), options.clone());
        link.push.connect().await?;

        Ok(Self::assemble(
            Conn::Single(manager),
            Some(sub_client),
            &STANDALONE_SCRIPTS,
            Link::Single(Box::new(link)),
            options,
            redact(url),
        ))
    }

    /// Connects to a Redis Cluster with the default [`RedisOptions`].
    ///
    /// `urls` are some of the cluster's nodes (`redis://[user:password@]host:port`);
    /// the rest of the topology is discovered. Fails if no node can be
    /// reached.
    pub async fn connect_cluster(urls: &[&str]) -> Result<RedisBackend, BackendError> {
        Self::connect_cluster_with(urls, RedisOptions::default()).await
    }

    /// Connects to a Redis Cluster with the given options.
    pub async fn connect_cluster_with(
        urls: &[&str],
        options: RedisOptions,
    ) -> Result<RedisBackend, BackendError> {
        for url in urls {
            check_url_and_tls(url)?;
        }
        let builder = |urls: &[&str]| {
            let builder = ClusterClientBuilder::new(urls.iter().copied());
            #[cfg(feature = "tls")]
            let builder = match &options.tls {
                Some(certs) => builder.certs(certs.clone()),
                None => builder,
            };
            builder
                .connection_timeout(options.connection_timeout)
                .response_timeout(options.response_timeout)
                // The driver computes `2^retry`: keep it far from overflowing.
                .retries(options.reconnect_retries.min(16) as u32)
                .min_retry_wait(10)
                .max_retry_wait(
                    u64::try_from(options.max_backoff.as_millis())
                        .unwrap_or(u64::MAX)
                        .max(11),
                )
        };
        let deadline = connect_deadline(&options);
        let router = ClusterRouter::connect(urls, options.clone()).await?;

        let (push_tx, push_rx) = unbounded_channel();
        let sub_client = builder(urls)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(push_tx)
            .build()
            .map_err(|e| classify("connect", e))?;
        let sub_conn =
            with_deadline("connect", deadline, sub_client.get_async_connection()).await?;
        let link = ClusterLink::new(sub_conn, push_rx, options.clone(), router.clone());

        let target = urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
        Ok(Self::assemble(
            Conn::Cluster(router),
            None,
            &CLUSTER_SCRIPTS,
            Link::Cluster(link),
            options,
            target,
        ))
    }

    fn assemble(
        conn: Conn,
        resp3: Option<Client>,
        scripts: &'static Scripts,
        link: Link,
        options: RedisOptions,
        target: String,
    ) -> RedisBackend {
        RedisBackend {
            inner: Arc::new(Inner {
                conn,
                resp3,
                listeners: Listeners::default(),
                scripts,
                clock: ServerClock::default(),
                pubsub: PubSubShared::start(link, options.clone()),
                options,
                target,
            }),
        }
    }

    /// Runs `invocation`, whose keys all share `keys`' hash tag.
    async fn eval<T: FromRedisValue>(
        &self,
        op: &'static str,
        keys: &FillKeys,
        invocation: &ScriptCall<'_>,
    ) -> Result<T, BackendError> {
        match &self.inner.conn {
            // The command connection has no response timeout of its own
            // (see `connect_with`): a `Backend` method called directly is
            // bounded here, by the response timeout.
            Conn::Single(c) => {
                let limit = self.inner.options.response_timeout;
                with_deadline(op, limit, invocation.invoke(&mut c.clone(), false)).await
            }
            Conn::Cluster(router) => {
                let slot = slot_of(keys.value().as_bytes());
                router
                    .run(slot, |mut c, asking| async move {
                        invocation.invoke(&mut c, asking).await
                    })
                    .await
                    .map_err(|e| classify(op, e))
            }
        }
    }

    async fn eval_flag(
        &self,
        op: &'static str,
        keys: &FillKeys,
        invocation: &ScriptCall<'_>,
    ) -> Result<bool, BackendError> {
        match self.eval::<i64>(op, keys, invocation).await? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("{op}: the script answered {other}, expected 0 or 1"),
            )),
        }
    }
}

/// The acquire script's reply: status, value, value PTTL, lease PTTL.
type AcquireAnswer = (i64, Option<Vec<u8>>, i64, i64);

/// The acquire script's reply (see `scripts/acquire.lua`) as an [`Acquired`].
fn acquired_from(
    (status, bytes, value_ttl, lease_ms): AcquireAnswer,
) -> Result<Acquired, BackendError> {
    let value = stored(bytes, value_ttl);
    match status {
        0 => value.map(Acquired::Fresh).ok_or_else(|| {
            BackendError::new(
                BackendErrorKind::Protocol,
                "acquire: the script answered fresh without a value",
            )
        }),
        1 => Ok(Acquired::Won { stale: value }),
        2 => Ok(Acquired::Held {
            stale: value,
            // The lease vanished between the `SET NX` and the `PTTL`
            // only if it had expired: report it as expiring now.
            lease_ttl: ttl_from_ms(lease_ms).unwrap_or(Duration::ZERO),
        }),
        other => Err(BackendError::new(
            BackendErrorKind::Protocol,
            format!("acquire: unknown status {other} from the script"),
        )),
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

impl RedisBackend {
    /// A standalone hit: a plain `GET` when the value's envelope records
    /// its expiry and the server's clock is known well enough to tell that
    /// it is fresh; the pipelined `GET` + `PTTL` otherwise (see
    /// `server_clock.rs`, decision 0011).
    async fn get_standalone(
        &self,
        conn: &ConnectionManager,
        keys: &FillKeys,
        began: Instant,
    ) -> Result<Option<Stored>, BackendError> {
        // The rare paths are boxed: the hit's future stays small, and a
        // cache moves it (into its timeout) on every hit.
        let estimate = match self.inner.clock.plan(began) {
            Plan::Get(estimate) => estimate,
            Plan::GetPttl => return Box::pin(self.get_pttl(keys)).await,
            Plan::Sample(sampling) => {
                return Box::pin(self.get_sampling(conn, keys, sampling)).await
            }
        };
        let bytes: Option<Vec<u8>> = redis::cmd("GET")
            .arg(keys.value())
            .query_async(&mut conn.clone())
            .await
            .map_err(|e| classify("get", e))?;
        let Some(mut bytes) = bytes else {
            return Ok(None);
        };
        let now = Instant::now();
        // Fresh by the lower bound is fresh by the server's clock too; at
        // or below the grace (stale, or in its last moments) the server's
        // own `PTTL` decides, as before.
        let fresh = envelope::expires_at_ms(&bytes).and_then(|at| {
            let ttl = estimate.remaining(at, now)?;
            (ttl > envelope::grace_of(&bytes)?).then_some(ttl)
        });
        match fresh {
            Some(ttl) => {
                envelope::strip_expiry(&mut bytes);
                Ok(Some(Stored { bytes, ttl }))
            }
            None => Box::pin(self.get_pttl(keys)).await,
        }
    }

    /// A standalone read that samples the server's clock: `GET` + `TIME`,
    /// two commands, as the pair was. `TIME` runs right after the `GET`, so
    /// a version-2 value's TTL is read against the server's own clock, as
    /// `PTTL` would be.
    async fn get_sampling(
        &self,
        conn: &ConnectionManager,
        keys: &FillKeys,
        sampling: server_clock::Sampling<'_>,
    ) -> Result<Option<Stored>, BackendError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(keys.value()).cmd("TIME");
        let answer: Result<SampledRead, RedisError> = pipe.query_async(&mut conn.clone()).await;
        match answer {
            Ok((bytes, (secs, micros))) => {
                let server_us = sampling.record(secs, micros);
                let Some(mut bytes) = bytes else {
                    return Ok(None);
                };
                match envelope::expires_at_ms(&bytes) {
                    Some(at) => {
                        let left_us = at.saturating_mul(1_000).saturating_sub(server_us);
                        envelope::strip_expiry(&mut bytes);
                        Ok(Some(Stored {
                            bytes,
                            ttl: Duration::from_micros(left_us),
                        }))
                    }
                    // Version 1 or another client's bytes: the server's
                    // `PTTL` (a second round trip, rare).
                    None => self.get_pttl(keys).await,
                }
            }
            // The server refused (a `TIME` renamed away, say): the hit is
            // still answered, by the pair, and the next sample is tried a
            // second later.
            Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {
                sampling.refused();
                self.get_pttl(keys).await
            }
            Err(e) => Err(classify("get", e)),
        }
    }

    /// [`Backend::get`] as a cache calls it, directly (see `Shared::get`),
    /// within `limit` (the cache's own timeout): bounded by the response
    /// timeout too where that is shorter, so a hit waits no longer for a
    /// reply than any other command; with the defaults the cache's timeout
    /// is the shorter, and a hit has one timer.
    ///
    /// `now` is when the call began (one clock read serves the caller's
    /// timer and this read's plan).
    pub(crate) async fn read_within(
        &self,
        keys: &FillKeys,
        limit: Duration,
        now: Instant,
    ) -> Result<Option<Stored>, BackendError> {
        let response = self.inner.options.response_timeout;
        match &self.inner.conn {
            // Boxed: not the defaults' path, and the hit's future stays
            // small (see `get_standalone`).
            Conn::Single(_) if response < limit => {
                Box::pin(deadline::within("get", now, response, self.read(keys, now))).await
            }
            _ => self.read(keys, now).await,
        }
    }

    /// [`Backend::get`], unboxed and unbounded.
    async fn read(&self, keys: &FillKeys, now: Instant) -> Result<Option<Stored>, BackendError> {
        match &self.inner.conn {
            Conn::Single(c) => self.get_standalone(c, keys, now).await,
            Conn::Cluster(_) => Box::pin(self.get_pttl(keys)).await,
        }
    }

    /// The pipelined `GET` + `PTTL`: the server's own TTL (one round trip,
    /// two commands).
    async fn get_pttl(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET")
            .arg(keys.value())
            .cmd("PTTL")
            .arg(keys.value());
        let result: Result<(Option<Vec<u8>>, i64), RedisError> = match &self.inner.conn {
            Conn::Single(c) => pipe.query_async(&mut c.clone()).await,
            Conn::Cluster(router) => {
                let slot = slot_of(keys.value().as_bytes());
                let pipe = &pipe;
                // After an `ASK`: `ASKING` before each command.
                let mut asking_pipe = redis::pipe();
                asking_pipe
                    .cmd("ASKING")
                    .ignore()
                    .cmd("GET")
                    .arg(keys.value())
                    .cmd("ASKING")
                    .ignore()
                    .cmd("PTTL")
                    .arg(keys.value());
                let asking_pipe = &asking_pipe;
                router
                    .run(slot, |mut c, asking| async move {
                        let pipe = if asking { asking_pipe } else { pipe };
                        pipe.query_async(&mut c).await
                    })
                    .await
            }
        };
        let (bytes, pttl) = result.map_err(|e| classify("get", e))?;
        Ok(stored(bytes, pttl))
    }
}

/// A clock sample's answer: `GET`, `TIME` (seconds, microseconds).
type SampledRead = (Option<Vec<u8>>, (u64, u64));

/// A `GET` and a `PTTL` answer: a value that expired between the two (-2)
/// is gone. The bytes are those written (a version-2 envelope's expiry,
/// stamped by the script, is taken back out).
fn stored(bytes: Option<Vec<u8>>, pttl: i64) -> Option<Stored> {
    bytes.and_then(|mut bytes| {
        envelope::strip_expiry(&mut bytes);
        ttl_from_ms(pttl).map(|ttl| Stored { bytes, ttl })
    })
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
        let mut invocation = ScriptCall::new(&self.inner.scripts.acquire);
        invocation
            .key(keys.value())
            .key(keys.lock())
            .arg(token.as_bytes())
            .arg(px(lease_ttl))
            .arg(ms_ceil(refresh_window))
            .arg(NO_EXPIRY_TTL.as_millis() as u64);
        let answer: AcquireAnswer = self.eval("acquire", keys, &invocation).await?;
        acquired_from(answer)
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
        let mut invocation = announcing(&self.inner.scripts.fill, keys);
        invocation.arg(token.as_bytes()).arg(bytes).arg(px(ttl));
        let filled = self.eval_flag("fill", keys, &invocation).await;
        if let Ok(true) = filled {
            self.inner.listeners.changed(keys.value());
        }
        filled
    }

    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        let mut invocation = announcing(&self.inner.scripts.release, keys);
        invocation.arg(token.as_bytes());
        if let Some((bytes, ttl)) = entry {
            invocation.arg(bytes).arg(px(ttl));
        }
        let released = self.eval_flag("release", keys, &invocation).await;
        if let (Ok(true), Some(_)) = (&released, entry) {
            self.inner.listeners.changed(keys.value());
        }
        released
    }

    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        let mut invocation = ScriptCall::new(&self.inner.scripts.extend);
        invocation
            .key(keys.lock())
            .arg(token.as_bytes())
            .arg(px(lease_ttl));
        self.eval_flag("extend", keys, &invocation).await
    }

    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        let mut invocation = announcing(&self.inner.scripts.set, keys);
        invocation.arg(bytes).arg(px(ttl));
        let set = self.eval_flag("set", keys, &invocation).await.map(drop);
        // Failed or not, the write may have landed.
        self.inner.listeners.changed(keys.value());
        set
    }

    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let invocation = announcing(&self.inner.scripts.invalidate, keys);
        let invalidated = self
            .eval_flag("invalidate", keys, &invocation)
            .await
            .map(drop);
        self.inner.listeners.changed(keys.value());
        invalidated
    }

    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        let channel = keys.channel().to_owned();
        Ok(self.inner.pubsub.subscribe(channel).await)
    }

    /// `CLIENT TRACKING ... BCAST PREFIX prefix` on a RESP3 connection of
    /// its own (one per master on a cluster), confirmed by a `PING` every
    /// `confirm_every`; see the module docs' [L1 coherence](self#l1-coherence).
    fn track_changes(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: Weak<dyn ChangeListener>,
    ) -> Result<(), BackendError> {
        self.inner.listeners.register(prefix, listener.clone());
        let tracking = tracking::Tracking {
            prefix: prefix.to_owned(),
            confirm_every,
            options: self.inner.options.clone(),
            listener,
        };
        match (&self.inner.conn, &self.inner.resp3) {
            (Conn::Single(_), Some(client)) => {
                tracking::track_standalone(client.clone(), tracking);
                Ok(())
            }
            (Conn::Cluster(router), _) => {
                tracking::track_cluster(router.downgrade(), tracking);
                Ok(())
            }
            (Conn::Single(_), None) => Err(BackendError::new(
                BackendErrorKind::Connection,
                "no RESP3 client for the L1's tracking connection",
            )),
        }
    }

    /// Standalone: one shard. Cluster: the master that serves the key's
    /// slot now.
    fn shard(&self, keys: &FillKeys) -> u64 {
        match &self.inner.conn {
            Conn::Single(_) => 0,
            Conn::Cluster(router) => router.shard_of(slot_of(keys.value().as_bytes())),
        }
    }
}
