//! Connecting a [`RedisBackend`]: to a standalone server (a connection
//! manager for commands, a push connection for fill notifications) or to a
//! cluster (onefill's router for commands, the driver's RESP3 cluster
//! connection for sharded fill notifications).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{Client, ProtocolVersion};
use tokio::sync::mpsc::unbounded_channel;
use tokio::time::Instant;

use super::cluster::ClusterRouter;
use super::durability::Wait;
use super::errors::{classify, with_deadline};
use super::liveness::{Liveness, Publisher, Release};
use super::options::{check_url_and_tls, connect_deadline, RedisOptions};
use super::primary::{Commands, Primary};
use super::scripts::{Scripts, CLUSTER_SCRIPTS, STANDALONE_SCRIPTS};
use super::server_clock::{Plan, ServerClock};
use super::subscriber::{ClusterLink, Link, PubSubShared, SingleLink};
use super::tracking;
use super::urls::redact;
use super::{Conn, Inner, RedisBackend};
use crate::backend::Backend as _;
use crate::backend::BackendError;
use crate::error::BackendErrorKind;

impl RedisBackend {
    /// The backend of a standalone server (`primary`, followed through its
    /// URL or under Sentinel),
    /// its command connection open: the fill notifications' connection,
    /// the first clock sample, the holders' liveness.
    pub(super) async fn standalone(
        primary: Primary,
        options: RedisOptions,
        target: String,
        clock: Arc<ServerClock>,
    ) -> Result<RedisBackend, BackendError> {
        // Fill notifications use RESP3 pushes on a connection of their own.
        let mut link = SingleLink::new(&primary, options.clone());
        link.push.connect().await?;

        let backend = Self::assemble(
            Conn::Single(primary.clone()),
            &STANDALONE_SCRIPTS,
            Link::Single(Box::new(link)),
            options.clone(),
            target,
            clock,
        );
        backend.sample_clock().await;
        let mut conn = primary.manager();
        backend.refused_tracking(&mut conn).await;
        let liveness = Liveness::start(
            backend.inner.pubsub.clone(),
            Publisher::Single(primary),
            options.response_timeout,
            backend.releaser(),
        )
        .await;
        let _ = backend.inner.liveness.set(liveness);
        Ok(backend)
    }

    /// What the holders' liveness does when asked about a lease that none
    /// of this backend's flights holds any more (its fill or release did
    /// not reach the server that has it now: a failover): releases it
    /// there, in the background (compare-and-delete on its token, which
    /// announces the release to its waiters).
    fn releaser(&self) -> Release {
        let inner = Arc::downgrade(&self.inner);
        // Releases under way: past a bound, an ask is dropped (its waiter
        // asks again when nothing comes), so a flood of asks cannot pile
        // up tasks.
        let under_way = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        Box::new(move |keys, token| {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            use std::sync::atomic::Ordering::Relaxed;
            if under_way.fetch_add(1, Relaxed) >= RELEASES_UNDER_WAY {
                under_way.fetch_sub(1, Relaxed);
                return;
            }
            let backend = RedisBackend { inner };
            let under_way = under_way.clone();
            tokio::spawn(async move {
                let released = backend.release(&keys, &token, None).await;
                under_way.fetch_sub(1, Relaxed);
                tracing::debug!(
                    key = keys.value(),
                    ?released,
                    "asked about a lease no flight here holds any more: released"
                );
            });
        })
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
        let backend = Self::assemble(
            Conn::Cluster(router.clone()),
            &CLUSTER_SCRIPTS,
            Link::Cluster(Box::new(link)),
            options,
            target,
            Arc::default(),
        );
        let timeout = backend.inner.options.response_timeout;
        let asked = router
            .run(0, |mut c, _| async move {
                Ok(tracking::refused(&mut c, timeout).await)
            })
            .await;
        if let Ok(Some(refusal)) = asked {
            let _ = backend.inner.untracked.set(refusal);
        }
        let liveness = Liveness::start(
            backend.inner.pubsub.clone(),
            Publisher::Cluster(router),
            timeout,
            backend.releaser(),
        )
        .await;
        let _ = backend.inner.liveness.set(liveness);
        Ok(backend)
    }

    /// Asks whether the server refuses `CLIENT TRACKING` (see
    /// `tracking.rs`), for the L1s built on this backend.
    async fn refused_tracking<C: redis::aio::ConnectionLike + Send>(&self, conn: &mut C) {
        let timeout = self.inner.options.response_timeout;
        if let Some(refusal) = tracking::refused(conn, timeout).await {
            let _ = self.inner.untracked.set(refusal);
        }
    }

    /// Takes the first sample of the server's clock (see
    /// `server_clock.rs`), so the first hits need no `TIME` of their own. A
    /// server that does not answer or refuses is left to the hits, which
    /// sample on their own.
    async fn sample_clock(&self) {
        let Conn::Single(primary) = &self.inner.conn else {
            return;
        };
        let Plan::Sample(sampling) = self.inner.clock.plan(Instant::now()) else {
            return;
        };
        let (cmd, mut conn) = (redis::cmd("TIME"), primary.manager());
        let time = cmd.query_async::<(u64, u64)>(&mut conn);
        match with_deadline("connect", self.inner.options.response_timeout, time).await {
            Ok((seconds, micros)) => {
                sampling.record(seconds, micros);
            }
            Err(e) if !e.is_transient() => sampling.refused(),
            Err(_) => {}
        }
    }

    fn assemble(
        conn: Conn,
        scripts: &'static Scripts,
        link: Link,
        options: RedisOptions,
        target: String,
        clock: Arc<ServerClock>,
    ) -> RedisBackend {
        RedisBackend {
            inner: Arc::new(Inner {
                conn,
                scripts,
                clock,
                kept: Default::default(),
                pubsub: PubSubShared::start(link, options.clone()),
                liveness: std::sync::OnceLock::new(),
                untracked: std::sync::OnceLock::new(),
                tracked: Arc::new(super::tracked::Tracked::new()),
                shortfall: Default::default(),
                checked: Default::default(),
                options,
                target,
            }),
        }
    }
}

/// The command connections of a standalone server, with every script
/// loaded: one, and a second for the writes that wait for replicas when
/// the options ask for them (see [`Commands::durable`]).
pub(super) async fn command_connection(
    client: &Client,
    options: &RedisOptions,
) -> Result<Commands, BackendError> {
    let manager = one_command_connection(client, options, true).await?;
    let durable = match Wait::of(options.durability, options.response_timeout) {
        // The scripts are the server's: loaded once is enough.
        Some(_) => Some(one_command_connection(client, options, false).await?),
        None => None,
    };
    Ok(Commands { manager, durable })
}

/// The most releases of leases asked about (see `RedisBackend::releaser`)
/// under way at once.
const RELEASES_UNDER_WAY: usize = 64;

/// The driver's first pause between two attempts of one reconnection (see
/// `one_command_connection`).
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(10);

async fn one_command_connection(
    client: &Client,
    options: &RedisOptions,
    load_scripts: bool,
) -> Result<ConnectionManager, BackendError> {
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
        // The driver's own pause before its first retry is 100 ms at
        // most by default, and a call waits out the whole reconnection: a
        // server back during that pause would be seen that much later by
        // the circuit breaker's probe, whose pace already keeps a server
        // that is down from being hammered.
        .set_min_delay(RECONNECT_MIN_DELAY)
        .set_max_delay(options.max_backoff);
    let manager = with_deadline(
        "connect",
        connect_deadline(options),
        client.get_connection_manager_with_config(config),
    )
    .await?;
    // Every script known to the server before a call needs it (see
    // `scripts.rs`). A server that does not answer fails the connect, and
    // so does an ACL that refuses the loads: every call would meet the
    // same refusal, and an operator learns it best where the backend is
    // built. Any other refusal is left to the calls that need a script.
    if !load_scripts {
        return Ok(manager);
    }
    let loads = STANDALONE_SCRIPTS.load_all(&manager);
    match with_deadline("connect", options.response_timeout, loads).await {
        Err(e) if e.is_transient() || e.kind() == BackendErrorKind::NotPermitted => Err(e),
        _ => Ok(manager),
    }
}
