//! The Redis backend: standalone Redis or Redis Cluster (7.0 or later).
//!
//! Every [`Backend`] step is one server-side Lua script, so it is atomic
//! exactly like the [`MemoryBackend`](crate::MemoryBackend)'s critical
//! sections; the hit path [`get`](Backend::get) is a pipelined `GET` + `PTTL`
//! (one round trip, no script).
//!
//! | step | server side |
//! | --- | --- |
//! | `acquire` | value readable and `PTTL > grace + window`? return it : `SET lock token NX PX ttl` |
//! | `fill` | `GET lock == token`? `SET value PX ttl`, `DEL lock`, publish |
//! | `release` | `GET lock == token`? `DEL lock` (+ `SET value PX ttl`), publish |
//! | `extend` | `GET lock == token`? `PEXPIRE lock ttl` |
//! | `set` / `invalidate` | `SET value PX ttl` / `DEL value`, `DEL lock`, publish |
//!
//! The scripts read the grace period from the envelope header (bytes 4..12,
//! big-endian milliseconds); bytes that are not a version-1 envelope are
//! never fresh. Scripts are sent with `EVALSHA` and loaded again on
//! `NOSCRIPT` (after a server restart or failover).
//!
//! # Connections
//!
//! - **Standalone**: a [`ConnectionManager`] (one multiplexed connection that
//!   reconnects by itself) for commands, plus one dedicated RESP3 connection
//!   for fill notifications (`SUBSCRIBE`/`PUBLISH`).
//! - **Cluster**: an async [`ClusterConnection`] for commands (routed by the
//!   hash-tagged key, so all keys of one script share a slot), plus a second
//!   RESP3 cluster connection for notifications through **sharded** pub/sub
//!   (`SSUBSCRIBE`/`SPUBLISH`, Redis 7.0+), routed by the channel's slot.
//!
//! Authentication (`redis://user:password@host:port`), the database
//! (`redis://host/2`, standalone only) and the protocol (`?protocol=resp3`)
//! come from the URL. TLS (`rediss://`) needs one of the `redis` crate's TLS
//! features, which this crate does not enable.
//!
//! # Fill notifications
//!
//! One subscriber connection per backend is shared by every waiting key: the
//! first [`subscribe`](Backend::subscribe) for a channel subscribes on the
//! server (and returns only once the server confirmed it), later ones for the
//! same channel share it, and the channel is unsubscribed once its last
//! subscription is dropped. A background task owns the connection:
//!
//! - after the standalone subscriber connection drops (a restart, a network
//!   failure, or a health-check `PING` that fails), it reconnects with
//!   jittered exponential backoff and subscribes every live channel again;
//! - on a cluster, the `redis` crate reconnects lost nodes and resubscribes
//!   their channels itself;
//! - either way every subscription is woken once when its channel is
//!   subscribed again, because fills announced meanwhile were lost.
//!
//! While the subscriber is disconnected, `subscribe` returns at once with a
//! subscription that fires only after the channel is subscribed again; the
//! cache's polling covers the gap. On a cluster, a channel whose node cannot
//! be reached is retried every half second.
//!
//! Limits: notifications are best effort (Redis pub/sub has no delivery
//! guarantee; callers poll as well). On a cluster, while a node is
//! unreachable, each retry round waits up to the response timeout for it,
//! which can delay new subscriptions on healthy nodes by as much; a slot that
//! migrates relies on the `redis` crate moving its subscriptions.
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

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, FromRedisValue, ProtocolVersion, PushInfo, PushKind, RedisError,
    Script, ScriptInvocation, Value,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::{Acquired, Backend, BackendError, FillKeys, FillSubscription, LeaseToken, Stored};
use crate::error::BackendErrorKind;

/// The TTL reported for a key that has no expiry (`PTTL` answers -1): 100
/// years. Values written through onefill always expire; this only shows up
/// for keys written by someone else.
pub const NO_EXPIRY_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Millisecond arguments are capped here (about 35 700 years), so that Lua's
/// doubles compare them exactly and `PX` never overflows the server clock.
const MAX_MS: u64 = 1 << 50;

/// How long a cluster subscription that failed waits before it is retried.
const SUBSCRIBE_RETRY: Duration = Duration::from_millis(500);

/// First delay before the standalone subscriber reconnects.
const MIN_BACKOFF: Duration = Duration::from_millis(50);

/// Timeouts and reconnection settings of a [`RedisBackend`].
///
/// The cache above wraps every backend call in its own timeout
/// ([`CacheBuilder::backend_timeout`](crate::CacheBuilder::backend_timeout)),
/// so these are a second line of defence; keep them at or below it.
///
/// ```
/// use std::time::Duration;
/// let options = onefill::redis::RedisOptions::new()
///     .connection_timeout(Duration::from_millis(500))
///     .response_timeout(Duration::from_millis(300));
/// # drop(options);
/// ```
#[derive(Debug, Clone)]
pub struct RedisOptions {
    connection_timeout: Duration,
    response_timeout: Duration,
    reconnect_retries: usize,
    max_backoff: Duration,
    ping_interval: Duration,
    /// Extra trust roots and a client certificate for `rediss://` (its
    /// `Debug` redacts them).
    #[cfg(feature = "tls")]
    tls: Option<redis::TlsCertificates>,
}

impl Default for RedisOptions {
    /// 1 s connection timeout, 1 s response timeout, 2 reconnection retries
    /// per failed command, backoff capped at 2 s, subscriber `PING` every 5 s.
    fn default() -> Self {
        RedisOptions {
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            reconnect_retries: 2,
            max_backoff: Duration::from_secs(2),
            ping_interval: Duration::from_secs(5),
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl RedisOptions {
    /// The defaults (see [`Default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// How long one attempt to open a connection may take.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long the driver waits for one reply before failing the command
    /// with a timeout.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How many times a reconnection is retried (with backoff) before the
    /// commands waiting for it fail; the next command starts a new one.
    /// Standalone: the connection manager's retries; cluster: the number of
    /// retries of a redirected or failed request (at most 16).
    pub fn reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// The longest delay between two reconnection attempts.
    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max.max(MIN_BACKOFF);
        self
    }

    /// How often the standalone subscriber connection is checked with `PING`
    /// (a connection that silently died is replaced).
    pub fn ping_interval(mut self, interval: Duration) -> Self {
        self.ping_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// Trusts this CA certificate (PEM) for `rediss://` URLs instead of the
    /// system's trust store (feature `tls`).
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        let certs = self.tls.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        });
        certs.root_cert = Some(pem.into());
        self
    }

    /// Presents this client certificate and key (PEM) for mutual TLS
    /// (feature `tls`).
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        let certs = self.tls.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        });
        certs.client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }
}

/// Opens a client for `url`, with the TLS settings of `options`.
fn open_client(url: &str, options: &RedisOptions) -> Result<Client, BackendError> {
    check_tls_support(url)?;
    #[cfg(feature = "tls")]
    if let Some(certs) = &options.tls {
        return Client::build_with_tls(url, certs.clone()).map_err(|e| classify("connect", e));
    }
    let _ = options;
    Client::open(url).map_err(|e| classify("connect", e))
}

/// `rediss://` needs the `tls` feature; say so instead of the driver's
/// generic error. With the feature, make sure rustls has its crypto
/// provider (ring) installed, once per process.
fn check_tls_support(url: &str) -> Result<(), BackendError> {
    if !url.starts_with("rediss://") {
        return Ok(());
    }
    #[cfg(feature = "tls")]
    {
        // Fails only if a provider is already installed: fine either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(())
    }
    #[cfg(not(feature = "tls"))]
    Err(BackendError::new(
        BackendErrorKind::Command,
        "rediss:// URLs need onefill's `tls` cargo feature",
    ))
}

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
    scripts: &'static Scripts,
    pubsub: Arc<PubSubShared>,
    /// Where we are connected, without credentials (for `Debug`).
    target: String,
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
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
    /// (or `redis+unix:///path`). Fails if the server cannot be reached.
    pub async fn connect(url: &str) -> Result<RedisBackend, BackendError> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to a standalone Redis with the given options.
    pub async fn connect_with(
        url: &str,
        options: RedisOptions,
    ) -> Result<RedisBackend, BackendError> {
        let client = open_client(url, &options)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connection_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(options.reconnect_retries)
            .set_max_delay(options.max_backoff);
        let manager = with_deadline(
            "connect",
            connect_deadline(&options),
            client.get_connection_manager_with_config(config),
        )
        .await?;

        // Fill notifications use RESP3 pushes on a connection of their own.
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let sub_client =
            Client::open(info.set_redis_settings(settings)).map_err(|e| classify("connect", e))?;
        let mut link = SingleLink {
            client: sub_client,
            options: options.clone(),
            conn: None,
            pushes: None,
            backoff: MIN_BACKOFF,
        };
        link.connect().await?;

        Ok(Self::assemble(
            Conn::Single(manager),
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
            check_tls_support(url)?;
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
        let client = builder(urls).build().map_err(|e| classify("connect", e))?;
        let conn = with_deadline("connect", deadline, client.get_async_connection()).await?;

        let (push_tx, push_rx) = unbounded_channel();
        let sub_client = builder(urls)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(push_tx)
            .build()
            .map_err(|e| classify("connect", e))?;
        let sub_conn =
            with_deadline("connect", deadline, sub_client.get_async_connection()).await?;
        let link = ClusterLink {
            conn: sub_conn,
            pushes: Some(push_rx),
            options: options.clone(),
        };

        let target = urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",");
        Ok(Self::assemble(
            Conn::Cluster(conn),
            &CLUSTER_SCRIPTS,
            Link::Cluster(link),
            options,
            target,
        ))
    }

    fn assemble(
        conn: Conn,
        scripts: &'static Scripts,
        link: Link,
        options: RedisOptions,
        target: String,
    ) -> RedisBackend {
        let (wake_tx, wake_rx) = unbounded_channel();
        let pubsub = Arc::new(PubSubShared {
            state: Mutex::new(SubState {
                connected: true,
                channels: HashMap::new(),
            }),
            wake: wake_tx,
        });
        tokio::spawn(run_subscriber(
            Arc::downgrade(&pubsub),
            wake_rx,
            link,
            options,
        ));
        RedisBackend {
            inner: Arc::new(Inner {
                conn,
                scripts,
                pubsub,
                target,
            }),
        }
    }

    async fn eval<T: FromRedisValue>(
        &self,
        op: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, BackendError> {
        let result = match self.inner.conn.clone() {
            Conn::Single(mut c) => invocation.invoke_async(&mut c).await,
            Conn::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        };
        result.map_err(|e| classify(op, e))
    }

    async fn eval_flag(
        &self,
        op: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<bool, BackendError> {
        match self.eval::<i64>(op, invocation).await? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("{op}: the script answered {other}, expected 0 or 1"),
            )),
        }
    }
}

#[async_trait]
impl Backend for RedisBackend {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET")
            .arg(keys.value())
            .cmd("PTTL")
            .arg(keys.value());
        let result: Result<(Option<Vec<u8>>, i64), RedisError> = match self.inner.conn.clone() {
            Conn::Single(mut c) => pipe.query_async(&mut c).await,
            Conn::Cluster(mut c) => pipe.query_async(&mut c).await,
        };
        let (bytes, pttl) = result.map_err(|e| classify("get", e))?;
        // A value that expired between GET and PTTL (-2) is gone.
        Ok(bytes.and_then(|bytes| ttl_from_ms(pttl).map(|ttl| Stored { bytes, ttl })))
    }

    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let mut invocation = self.inner.scripts.acquire.prepare_invoke();
        invocation
            .key(keys.value())
            .key(keys.lock())
            .arg(token.as_bytes())
            .arg(px(lease_ttl))
            .arg(ms_ceil(refresh_window))
            .arg(NO_EXPIRY_TTL.as_millis() as u64);
        let (status, bytes, value_ttl, lease_ms): (i64, Option<Vec<u8>>, i64, i64) =
            self.eval("acquire", &invocation).await?;
        let value = bytes.and_then(|bytes| ttl_from_ms(value_ttl).map(|ttl| Stored { bytes, ttl }));
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

    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let mut invocation = self.inner.scripts.fill.prepare_invoke();
        invocation
            .key(keys.value())
            .key(keys.lock())
            .key(keys.channel())
            .arg(token.as_bytes())
            .arg(bytes)
            .arg(px(ttl));
        self.eval_flag("fill", &invocation).await
    }

    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        let mut invocation = self.inner.scripts.release.prepare_invoke();
        invocation
            .key(keys.value())
            .key(keys.lock())
            .key(keys.channel())
            .arg(token.as_bytes());
        if let Some((bytes, ttl)) = entry {
            invocation.arg(bytes).arg(px(ttl));
        }
        self.eval_flag("release", &invocation).await
    }

    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        let mut invocation = self.inner.scripts.extend.prepare_invoke();
        invocation
            .key(keys.lock())
            .arg(token.as_bytes())
            .arg(px(lease_ttl));
        self.eval_flag("extend", &invocation).await
    }

    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        let mut invocation = self.inner.scripts.set.prepare_invoke();
        invocation
            .key(keys.value())
            .key(keys.lock())
            .key(keys.channel())
            .arg(bytes)
            .arg(px(ttl));
        self.eval_flag("set", &invocation).await.map(drop)
    }

    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let mut invocation = self.inner.scripts.invalidate.prepare_invoke();
        invocation
            .key(keys.value())
            .key(keys.lock())
            .key(keys.channel());
        self.eval_flag("invalidate", &invocation).await.map(drop)
    }

    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        let shared = &self.inner.pubsub;
        let channel = keys.channel().to_owned();
        let (subscription, confirmed) = {
            let mut state = shared.state();
            let connected = state.connected;
            let chan = state
                .channels
                .entry(channel.clone())
                .or_insert_with(Channel::new);
            let rx = chan.tx.subscribe();
            let confirmed = if chan.confirmed {
                None
            } else if !connected {
                // Subscribed (and this subscription woken) once the
                // subscriber is back.
                chan.fire_on_confirm = true;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                chan.waiters.push(tx);
                Some(rx)
            };
            // Built before any await: if this future is dropped, the
            // subscription's `Drop` still releases the channel.
            let subscription = RedisSubscription {
                shared: shared.clone(),
                channel,
                rx: Some(rx),
            };
            (subscription, confirmed)
        };
        if let Some(confirmed) = confirmed {
            let _ = shared.wake.send(());
            // An error means the subscriber lost its connection meanwhile:
            // the channel is marked to fire once it is subscribed again.
            let _ = confirmed.await;
        }
        Ok(Box::new(subscription))
    }
}

// ---------------------------------------------------------------------------
// Scripts

/// The Lua scripts; `__PUBLISH__` is `PUBLISH` or, on a cluster, `SPUBLISH`.
struct Scripts {
    acquire: Script,
    fill: Script,
    release: Script,
    extend: Script,
    set: Script,
    invalidate: Script,
}

static STANDALONE_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("PUBLISH"));
static CLUSTER_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("SPUBLISH"));

/// KEYS: value, lock. ARGV: token, lease ms, refresh window ms, the ms that
/// stand for "no expiry". Returns {status, value or nil, value PTTL, lease
/// PTTL}; status 0 fresh, 1 won, 2 held.
const ACQUIRE: &str = r#"
local v = redis.call('GET', KEYS[1])
local vttl = -2
if v then
  vttl = redis.call('PTTL', KEYS[1])
  if #v >= 16 and string.byte(v, 1) == 241 and string.byte(v, 2) == 1
      and string.byte(v, 3) <= 2 then
    local grace = 0
    for i = 5, 12 do
      grace = grace * 256 + string.byte(v, i)
    end
    local left = vttl
    if left == -1 then
      left = tonumber(ARGV[4])
    end
    if left > grace + tonumber(ARGV[3]) then
      return {0, v, vttl, 0}
    end
  end
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, v, vttl, 0}
end
return {2, v, vttl, redis.call('PTTL', KEYS[2])}
"#;

/// KEYS: value, lock, channel. ARGV: token, bytes, ttl ms.
const FILL: &str = r#"
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('DEL', KEYS[2])
  redis.call('__PUBLISH__', KEYS[3], 'fill')
  return 1
end
return 0
"#;

/// KEYS: value, lock, channel. ARGV: token[, bytes, ttl ms].
const RELEASE: &str = r#"
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  if #ARGV >= 3 then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  end
  redis.call('__PUBLISH__', KEYS[3], 'release')
  return 1
end
return 0
"#;

/// KEYS: lock. ARGV: token, ttl ms.
const EXTEND: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

/// KEYS: value, lock, channel. ARGV: bytes, ttl ms.
const SET: &str = r#"
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[2])
redis.call('__PUBLISH__', KEYS[3], 'set')
return 1
"#;

/// KEYS: value, lock, channel.
const INVALIDATE: &str = r#"
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('__PUBLISH__', KEYS[3], 'invalidate')
return 1
"#;

impl Scripts {
    fn new(publish: &str) -> Scripts {
        let script = |lua: &str| Script::new(&lua.replace("__PUBLISH__", publish));
        Scripts {
            acquire: script(ACQUIRE),
            fill: script(FILL),
            release: script(RELEASE),
            extend: script(EXTEND),
            set: script(SET),
            invalidate: script(INVALIDATE),
        }
    }
}

// ---------------------------------------------------------------------------
// Conversions

/// Whole milliseconds, rounded up, capped at [`MAX_MS`].
fn ms_ceil(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).min(MAX_MS)
}

/// A `PX` argument: at least 1 ms.
fn px(d: Duration) -> u64 {
    ms_ceil(d).max(1)
}

/// A `PTTL` answer as a TTL: -1 (no expiry) is [`NO_EXPIRY_TTL`], -2 (no
/// such key) is `None`.
fn ttl_from_ms(ms: i64) -> Option<Duration> {
    match ms {
        -1 => Some(NO_EXPIRY_TTL),
        ms if ms >= 0 => Some(Duration::from_millis(ms as u64)),
        _ => None,
    }
}

/// The URL without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

fn connect_deadline(options: &RedisOptions) -> Duration {
    options
        .connection_timeout
        .saturating_mul(2)
        .saturating_add(options.response_timeout)
        .saturating_mul(u32::try_from(options.reconnect_retries + 1).unwrap_or(u32::MAX))
}

async fn with_deadline<T>(
    op: &'static str,
    deadline: Duration,
    fut: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, BackendError> {
    match tokio::time::timeout(deadline, fut).await {
        Ok(result) => result.map_err(|e| classify(op, e)),
        Err(_) => Err(BackendError::new(
            BackendErrorKind::Timeout,
            format!("{op}: no answer within {deadline:?}"),
        )),
    }
}

/// Sorts a driver error into a [`BackendErrorKind`].
fn classify(op: &str, e: RedisError) -> BackendError {
    use redis::ErrorKind as K;
    // A failed pipeline (the `get` path) carries its server errors apart.
    let code = e.code().map(str::to_owned).or_else(|| {
        e.clone()
            .into_server_errors()
            .and_then(|errors| errors.first().map(|(_, error)| error.code().to_owned()))
    });
    let kind = if e.is_timeout() {
        BackendErrorKind::Timeout
    } else if let Some(code) = code {
        match code.as_str() {
            "LOADING" | "BUSY" | "TRYAGAIN" | "MOVED" | "ASK" | "CLUSTERDOWN" | "MASTERDOWN"
            | "READONLY" => BackendErrorKind::Busy,
            _ => BackendErrorKind::Command,
        }
    } else {
        match e.kind() {
            K::Io | K::ClusterConnectionNotFound => BackendErrorKind::Connection,
            K::AuthenticationFailed | K::InvalidClientConfig => BackendErrorKind::Command,
            _ if e.is_connection_dropped() || e.is_connection_refusal() => {
                BackendErrorKind::Connection
            }
            _ => BackendErrorKind::Protocol,
        }
    };
    BackendError::new(kind, format!("{op}: {e}"))
}

fn timed_out(op: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{op} timed out"),
    ))
}

// ---------------------------------------------------------------------------
// Fill notifications

/// State shared by the backend, its subscriptions and the subscriber task.
struct PubSubShared {
    state: Mutex<SubState>,
    /// Wakes the subscriber task to (un)subscribe. Held only here, so the
    /// task ends when the backend and all its subscriptions are gone.
    wake: UnboundedSender<()>,
}

impl PubSubShared {
    fn state(&self) -> MutexGuard<'_, SubState> {
        // Every critical section leaves the map consistent, so a poisoned
        // lock is safe to keep using.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct SubState {
    /// Whether the subscriber connection is up (always true on a cluster,
    /// whose connection reconnects nodes by itself).
    connected: bool,
    channels: HashMap<String, Channel>,
}

struct Channel {
    /// Bumped at every message; one receiver per subscription.
    tx: watch::Sender<u64>,
    /// The server confirmed the subscription (and has not lost it since).
    confirmed: bool,
    /// Subscriptions may have missed messages: wake them once confirmed.
    fire_on_confirm: bool,
    /// `subscribe` calls waiting for the confirmation.
    waiters: Vec<oneshot::Sender<()>>,
    /// Cluster: `ssubscribe` confirmations we asked for and have not seen
    /// yet (other confirmations are the driver's resubscriptions).
    expected_confirmations: u32,
}

impl Channel {
    fn new() -> Channel {
        Channel {
            tx: watch::channel(0).0,
            confirmed: false,
            fire_on_confirm: false,
            waiters: Vec::new(),
            expected_confirmations: 0,
        }
    }

    fn fire(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn in_use(&self) -> bool {
        self.tx.receiver_count() > 0 || !self.waiters.is_empty()
    }
}

struct RedisSubscription {
    shared: Arc<PubSubShared>,
    channel: String,
    rx: Option<watch::Receiver<u64>>,
}

#[async_trait]
impl FillSubscription for RedisSubscription {
    async fn notified(&mut self) {
        let fired = match self.rx.as_mut() {
            Some(rx) => rx.changed().await.is_ok(),
            None => false,
        };
        if !fired {
            // Unreachable in practice (the sender lives while we hold a
            // receiver); never resolve rather than spin.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for RedisSubscription {
    fn drop(&mut self) {
        let unused = {
            let state = self.shared.state();
            drop(self.rx.take());
            state
                .channels
                .get(&self.channel)
                .is_some_and(|c| !c.in_use())
        };
        if unused {
            // The subscriber task unsubscribes channels nobody uses.
            let _ = self.shared.wake.send(());
        }
    }
}

/// The subscriber connection, owned by the subscriber task.
enum Link {
    Single(Box<SingleLink>),
    Cluster(ClusterLink),
}

struct SingleLink {
    client: Client,
    options: RedisOptions,
    conn: Option<MultiplexedConnection>,
    /// The pushes of the current connection (each connection gets its own
    /// channel, so a dead one's late messages cannot be mistaken).
    pushes: Option<UnboundedReceiver<PushInfo>>,
    backoff: Duration,
}

struct ClusterLink {
    conn: ClusterConnection,
    /// `None` once the driver dropped its push sender (it never should).
    pushes: Option<UnboundedReceiver<PushInfo>>,
    options: RedisOptions,
}

impl SingleLink {
    async fn connect(&mut self) -> Result<(), BackendError> {
        let (tx, rx) = unbounded_channel();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.options.connection_timeout))
            .set_response_timeout(Some(self.options.response_timeout))
            .set_push_sender(tx);
        let deadline = self
            .options
            .connection_timeout
            .saturating_add(self.options.response_timeout);
        let conn = with_deadline(
            "subscriber connect",
            deadline,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await?;
        self.conn = Some(conn);
        self.pushes = Some(rx);
        Ok(())
    }

    fn disconnect(&mut self) {
        self.conn = None;
        self.pushes = None;
    }

    async fn command(
        &mut self,
        op: &'static str,
        channels: &[String],
        subscribe: bool,
    ) -> Result<(), RedisError> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "subscriber disconnected",
            )));
        };
        let call = async {
            if subscribe {
                conn.subscribe(channels).await
            } else {
                conn.unsubscribe(channels).await
            }
        };
        match tokio::time::timeout(self.options.response_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(timed_out(op)),
        }
    }

    async fn ping(&mut self) -> Result<(), RedisError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<Value>(conn);
        match tokio::time::timeout(self.options.response_timeout, ping).await {
            Ok(result) => result.map(drop),
            Err(_) => Err(timed_out("subscriber ping")),
        }
    }
}

impl ClusterLink {
    /// `SSUBSCRIBE`/`SUNSUBSCRIBE` one channel at a time (each is routed to
    /// its slot's node), concurrently. Returns the channels that failed.
    async fn command(&self, channels: Vec<String>, subscribe: bool) -> Vec<String> {
        let mut calls = tokio::task::JoinSet::new();
        for channel in channels {
            let mut conn = self.conn.clone();
            let timeout = self.options.response_timeout;
            calls.spawn(async move {
                let call = async {
                    if subscribe {
                        conn.ssubscribe(&channel).await
                    } else {
                        conn.sunsubscribe(&channel).await
                    }
                };
                let ok = matches!(tokio::time::timeout(timeout, call).await, Ok(Ok(())));
                (channel, ok)
            });
        }
        let mut failed = Vec::new();
        while let Some(joined) = calls.join_next().await {
            if let Ok((channel, false)) = joined {
                failed.push(channel);
            }
        }
        failed
    }
}

/// What the subscriber task should do next.
enum Step {
    Wake(Option<()>),
    Push(Option<PushInfo>),
    Retry,
    Ping,
}

/// The subscriber task: (un)subscribes channels as subscriptions come and
/// go, dispatches messages, and keeps the connection alive.
async fn run_subscriber(
    shared: Weak<PubSubShared>,
    mut wake: UnboundedReceiver<()>,
    mut link: Link,
    options: RedisOptions,
) {
    let mut ping = tokio::time::interval_at(
        Instant::now() + options.ping_interval,
        options.ping_interval,
    );
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When to reconnect (standalone) or retry failed subscriptions.
    let mut retry_at: Option<Instant> = None;
    loop {
        let retry_sleep = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now));
        let step = {
            let pushes = match &mut link {
                Link::Single(l) => l.pushes.as_mut(),
                Link::Cluster(l) => l.pushes.as_mut(),
            };
            let has_pushes = pushes.is_some();
            let next_push = async move {
                match pushes {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                w = wake.recv() => Step::Wake(w),
                p = next_push, if has_pushes => Step::Push(p),
                _ = retry_sleep, if retry_at.is_some() => Step::Retry,
                _ = ping.tick() => Step::Ping,
            }
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match step {
            Step::Wake(None) => return,
            Step::Wake(Some(())) => {
                while wake.try_recv().is_ok() {}
                retry_at = reconcile(&shared, &mut link).await.or(retry_at);
            }
            Step::Push(Some(push)) => handle_push(&shared, push),
            Step::Push(None) => {
                // The connection's driver is gone: treat as a disconnection.
                retry_at = lost(&shared, &mut link);
            }
            Step::Retry => {
                if let Link::Single(l) = &mut link {
                    if l.conn.is_none() {
                        retry_at = reconnect(&shared, l).await;
                        if retry_at.is_some() {
                            continue;
                        }
                    }
                }
                retry_at = reconcile(&shared, &mut link).await;
            }
            Step::Ping => {
                if let Link::Single(l) = &mut link {
                    if l.conn.is_some() {
                        if let Err(e) = l.ping().await {
                            tracing::debug!(error = %e, "redis subscriber ping failed");
                            retry_at = lost(&shared, &mut link);
                        }
                    }
                }
            }
        }
    }
}

/// Dispatches one push message.
fn handle_push(shared: &PubSubShared, push: PushInfo) {
    let channel = match push.data.first() {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        _ => String::new(),
    };
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            if let Some(chan) = shared.state().channels.get(&channel) {
                chan.fire();
            }
        }
        PushKind::SSubscribe => {
            let mut state = shared.state();
            if let Some(chan) = state.channels.get_mut(&channel) {
                if chan.expected_confirmations > 0 {
                    chan.expected_confirmations -= 1;
                } else if chan.confirmed {
                    // The driver resubscribed after a reconnection: fills
                    // announced meanwhile were lost, so wake everyone once.
                    chan.fire();
                }
            }
        }
        _ => {}
    }
}

/// The standalone subscriber connection is gone: mark every channel
/// unconfirmed (to be subscribed and fired again) and schedule a reconnect.
/// Returns when to retry.
fn lost(shared: &PubSubShared, link: &mut Link) -> Option<Instant> {
    let l = match link {
        Link::Single(l) => l,
        Link::Cluster(l) => {
            // The driver reconnects nodes itself; its push channel closes
            // only if it is torn down. Notifications are gone for good then
            // (callers still poll).
            if l.pushes.take().is_some() {
                tracing::error!("redis cluster subscriber stopped delivering messages");
            }
            return None;
        }
    };
    if l.conn.is_some() {
        tracing::warn!("redis subscriber connection lost; reconnecting");
    }
    l.disconnect();
    let mut state = shared.state();
    state.connected = false;
    for chan in state.channels.values_mut() {
        chan.confirmed = false;
        chan.fire_on_confirm = true;
        // Dropping the senders lets waiting `subscribe` calls return.
        chan.waiters.clear();
    }
    Some(Instant::now() + jittered(l.backoff))
}

/// One reconnection attempt of the standalone subscriber. Returns when to
/// retry, or `None` once connected and resubscribed.
async fn reconnect(shared: &PubSubShared, l: &mut SingleLink) -> Option<Instant> {
    match l.connect().await {
        Ok(()) => {
            tracing::info!("redis subscriber reconnected");
            l.backoff = MIN_BACKOFF;
            shared.state().connected = true;
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "redis subscriber reconnection failed");
            l.backoff = l.backoff.saturating_mul(2).min(l.options.max_backoff);
            Some(Instant::now() + jittered(l.backoff))
        }
    }
}

fn jittered(d: Duration) -> Duration {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(2);
    Duration::from_millis(rand::random_range(ms / 2..=ms))
}

/// Brings the server's subscriptions in line with the channels in use:
/// unsubscribes the unused ones and subscribes the new (or lost) ones.
/// Returns when to try again if something failed.
async fn reconcile(shared: &PubSubShared, link: &mut Link) -> Option<Instant> {
    let cluster = matches!(link, Link::Cluster(_));
    let (to_unsubscribe, to_subscribe) = {
        let mut state = shared.state();
        if !state.connected {
            return None;
        }
        let mut to_unsubscribe = Vec::new();
        state.channels.retain(|name, chan| {
            if chan.in_use() {
                return true;
            }
            if chan.confirmed {
                to_unsubscribe.push(name.clone());
            }
            false
        });
        let mut to_subscribe = Vec::new();
        for (name, chan) in state.channels.iter_mut() {
            if !chan.confirmed {
                if cluster {
                    chan.expected_confirmations += 1;
                }
                to_subscribe.push(name.clone());
            }
        }
        (to_unsubscribe, to_subscribe)
    };

    let failed = match link {
        Link::Single(l) => {
            let mut result = Ok(());
            if !to_unsubscribe.is_empty() {
                result = l.command("unsubscribe", &to_unsubscribe, false).await;
            }
            if result.is_ok() && !to_subscribe.is_empty() {
                result = l.command("subscribe", &to_subscribe, true).await;
            }
            if let Err(e) = result {
                tracing::debug!(error = %e, "redis subscriber command failed");
                return lost(shared, link);
            }
            Vec::new()
        }
        Link::Cluster(l) => {
            if !to_unsubscribe.is_empty() {
                // A failure leaves a subscription nobody listens to; it goes
                // with the connection.
                let _ = l.command(to_unsubscribe, false).await;
            }
            if to_subscribe.is_empty() {
                Vec::new()
            } else {
                l.command(to_subscribe.clone(), true).await
            }
        }
    };

    let mut state = shared.state();
    for name in &to_subscribe {
        let Some(chan) = state.channels.get_mut(name) else {
            continue;
        };
        let ok = !failed.contains(name);
        if ok {
            chan.confirmed = true;
            for waiter in chan.waiters.drain(..) {
                let _ = waiter.send(());
            }
            if chan.fire_on_confirm {
                chan.fire_on_confirm = false;
                chan.fire();
            }
        } else {
            chan.fire_on_confirm = true;
            chan.expected_confirmations = chan.expected_confirmations.saturating_sub(1);
            chan.waiters.clear();
        }
    }
    let unused = state.channels.values().any(|c| !c.in_use());
    drop(state);
    if unused {
        // Subscriptions dropped while we were busy: clean up next round.
        let _ = shared.wake.send(());
    }
    if failed.is_empty() {
        None
    } else {
        tracing::debug!(
            channels = failed.len(),
            "redis subscriptions failed; retrying"
        );
        Some(Instant::now() + SUBSCRIBE_RETRY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_become_whole_milliseconds() {
        assert_eq!(ms_ceil(Duration::ZERO), 0);
        assert_eq!(px(Duration::ZERO), 1);
        assert_eq!(px(Duration::from_micros(1)), 1);
        assert_eq!(px(Duration::from_micros(1001)), 2);
        assert_eq!(px(Duration::from_secs(3)), 3000);
        assert_eq!(ms_ceil(Duration::MAX), MAX_MS);
        assert!(NO_EXPIRY_TTL.as_millis() < u128::from(MAX_MS));
    }

    #[test]
    fn pttl_answers_become_ttls() {
        assert_eq!(ttl_from_ms(1500), Some(Duration::from_millis(1500)));
        assert_eq!(ttl_from_ms(0), Some(Duration::ZERO));
        assert_eq!(ttl_from_ms(-1), Some(NO_EXPIRY_TTL));
        assert_eq!(ttl_from_ms(-2), None);
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact("redis://user:pw@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
    }

    #[test]
    fn errors_are_classified() {
        let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
        assert_eq!(
            classify("t", io(std::io::ErrorKind::TimedOut)).kind(),
            BackendErrorKind::Timeout
        );
        assert_eq!(
            classify("t", io(std::io::ErrorKind::ConnectionRefused)).kind(),
            BackendErrorKind::Connection
        );
        let parsed = |s: &str| match redis::parse_redis_value(s.as_bytes()) {
            Ok(Value::ServerError(e)) => RedisError::from(e),
            other => panic!("not a server error: {other:?}"),
        };
        for (reply, kind) in [
            ("-LOADING loading\r\n", BackendErrorKind::Busy),
            ("-BUSY script\r\n", BackendErrorKind::Busy),
            ("-MOVED 1 127.0.0.1:1\r\n", BackendErrorKind::Busy),
            ("-CLUSTERDOWN down\r\n", BackendErrorKind::Busy),
            ("-TRYAGAIN again\r\n", BackendErrorKind::Busy),
            ("-WRONGTYPE wrong\r\n", BackendErrorKind::Command),
            ("-ERR Error running script\r\n", BackendErrorKind::Command),
        ] {
            assert_eq!(classify("t", parsed(reply)).kind(), kind, "{reply}");
        }
    }

    #[test]
    fn both_script_sets_publish_the_right_way() {
        assert!(!STANDALONE_SCRIPTS.fill.get_hash().is_empty());
        assert_ne!(
            STANDALONE_SCRIPTS.fill.get_hash(),
            CLUSTER_SCRIPTS.fill.get_hash()
        );
        assert_eq!(
            STANDALONE_SCRIPTS.acquire.get_hash(),
            CLUSTER_SCRIPTS.acquire.get_hash()
        );
        for lua in [FILL, RELEASE, SET, INVALIDATE] {
            assert!(lua.contains("__PUBLISH__"));
        }
    }
}
