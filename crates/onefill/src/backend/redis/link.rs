//! The subscriber's connection, owned by the subscriber task: on a
//! standalone server one RESP3 connection that the task replaces when it
//! drops, paced by a [`Backoff`]; on a cluster a RESP3 cluster connection
//! that the driver keeps alive itself. Both deliver their pushes (messages,
//! subscription confirmations) on a channel of their own.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, Client, PushInfo, RedisError, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;

use super::cluster::{slot_of, ClusterRouter, WeakRouter};
use super::errors::{classify, with_deadline};
use super::options::{RedisOptions, MIN_BACKOFF};
use crate::backoff::Backoff;
use crate::error::BackendError;

/// The subscriber connection, owned by the subscriber task.
pub(super) enum Link {
    Single(Box<SingleLink>),
    Cluster(ClusterLink),
}

/// How often a failed cluster subscription may make the driver refresh
/// its slot map.
const NUDGE_INTERVAL: Duration = Duration::from_secs(1);

pub(super) struct SingleLink {
    client: Client,
    options: RedisOptions,
    pub(super) conn: Option<MultiplexedConnection>,
    /// The pushes of the current connection (each connection gets its own
    /// channel, so a dead one's late messages cannot be mistaken).
    pub(super) pushes: Option<UnboundedReceiver<PushInfo>>,
    /// Paces reconnections; reset once connected.
    backoff: Backoff,
}

pub(super) struct ClusterLink {
    conn: ClusterConnection,
    /// The command path's slot map, which leaves a hung master behind; the
    /// driver's own does not (see [`ClusterLink::subscribe`]).
    router: ClusterRouter,
    /// When the driver was last made to refresh its slot map.
    last_nudge: Arc<Mutex<Option<Instant>>>,
    /// Channels with an `SUNSUBSCRIBE` under way.
    unsubscribing: Arc<Mutex<HashSet<String>>>,
    /// `None` once the driver dropped its push sender (it never should).
    pub(super) pushes: Option<UnboundedReceiver<PushInfo>>,
    options: RedisOptions,
}

impl SingleLink {
    /// A link for `client` (which must speak RESP3, for pushes), not yet
    /// connected.
    pub(super) fn new(client: Client, options: RedisOptions) -> SingleLink {
        let backoff = Backoff::new(MIN_BACKOFF, options.max_backoff);
        SingleLink {
            client,
            options,
            conn: None,
            pushes: None,
            backoff,
        }
    }

    pub(super) async fn connect(&mut self) -> Result<(), BackendError> {
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
        // The next loss of this connection is retried quickly again.
        self.backoff.reset();
        Ok(())
    }

    pub(super) fn disconnect(&mut self) {
        self.conn = None;
        self.pushes = None;
    }

    /// When to try to reconnect next. The jitter keeps a fleet that lost
    /// the same server from reconnecting in lockstep; the interval never
    /// exceeds [`RedisOptions::max_backoff`], as documented there.
    pub(super) fn retry_at(&mut self) -> Instant {
        let wait = self.backoff.next_interval().min(self.options.max_backoff);
        let now = Instant::now();
        // A `max_backoff` of centuries must not panic on overflow: a year
        // is as good as never.
        now.checked_add(wait)
            .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
    }

    pub(super) async fn command(
        &mut self,
        op: &'static str,
        channels: &[String],
        subscribe: bool,
    ) -> Result<(), BackendError> {
        let Some(conn) = self.conn.as_mut() else {
            let disconnected =
                std::io::Error::new(std::io::ErrorKind::NotConnected, "subscriber disconnected");
            return Err(classify(op, RedisError::from(disconnected)));
        };
        let call = async {
            if subscribe {
                conn.subscribe(channels).await
            } else {
                conn.unsubscribe(channels).await
            }
        };
        with_deadline(op, self.options.response_timeout, call).await
    }

    pub(super) async fn ping(&mut self) -> Result<(), BackendError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<Value>(conn);
        with_deadline("subscriber ping", self.options.response_timeout, ping)
            .await
            .map(drop)
    }
}

impl ClusterLink {
    /// A link on `conn`, a RESP3 cluster connection whose pushes arrive on
    /// `pushes`.
    pub(super) fn new(
        conn: ClusterConnection,
        pushes: UnboundedReceiver<PushInfo>,
        options: RedisOptions,
        router: ClusterRouter,
    ) -> ClusterLink {
        tokio::spawn(nudge_on_changes(
            router.downgrade(),
            conn.clone(),
            options.response_timeout,
        ));
        ClusterLink {
            conn,
            router,
            last_nudge: Arc::new(Mutex::new(None)),
            unsubscribing: Arc::new(Mutex::new(HashSet::new())),
            pushes: Some(pushes),
            options,
        }
    }

    /// `SSUBSCRIBE` of `channel` (routed to its slot's node) in a task of
    /// its own, which reports on `done`: a node that hangs holds its own
    /// channels only. Not sent while an `SUNSUBSCRIBE` of the same channel
    /// is under way (see [`ClusterLink::unsubscribing`]).
    ///
    /// The driver retries a timed-out command on the same node and never
    /// refreshes its slot map for it, so after a hung master's replica is
    /// promoted its channels would never be subscribed again. When a
    /// subscription fails (at most once a second), and whenever onefill's
    /// own slot map changes, the driver is made to refresh its slot map
    /// ([`nudge`]).
    pub(super) fn subscribe(&self, channel: String, done: UnboundedSender<Ended>) {
        let mut conn = self.conn.clone();
        let timeout = self.options.response_timeout;
        let router = self.router.clone();
        let last_nudge = self.last_nudge.clone();
        tokio::spawn(async move {
            let ok = with_deadline("ssubscribe", timeout, conn.ssubscribe(&channel))
                .await
                .is_ok();
            let _ = done.send(Ended::Subscribed(channel.clone(), ok));
            if ok {
                return;
            }
            {
                let mut last = last_nudge.lock();
                if last.is_some_and(|at| at.elapsed() < NUDGE_INTERVAL) {
                    return;
                }
                *last = Some(Instant::now());
            }
            nudge(&router, &mut conn, slot_of(channel.as_bytes()), timeout).await;
        });
    }

    /// `SUNSUBSCRIBE` of `channels`, in the background; each reports on
    /// `done` when it ends. A failure leaves a subscription nobody listens
    /// to, which goes with the connection.
    pub(super) fn unsubscribe(&self, channels: Vec<String>, done: &UnboundedSender<Ended>) {
        for channel in channels {
            self.unsubscribing.lock().insert(channel.clone());
            let mut conn = self.conn.clone();
            let timeout = self.options.response_timeout;
            let unsubscribing = self.unsubscribing.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let _ = with_deadline("sunsubscribe", timeout, conn.sunsubscribe(&channel)).await;
                unsubscribing.lock().remove(&channel);
                let _ = done.send(Ended::Unsubscribed(channel));
            });
        }
    }

    /// Changes of the command path's slot map (see
    /// [`ClusterRouter::changes`]).
    pub(super) fn topology_changes(&self) -> tokio::sync::watch::Receiver<(u64, u16)> {
        self.router.changes()
    }

    /// Whether an `SUNSUBSCRIBE` of `channel` is under way: a subscription
    /// sent meanwhile could reach the server first and be undone by it,
    /// leaving the channel deaf while it looks subscribed.
    pub(super) fn unsubscribing(&self, channel: &str) -> bool {
        self.unsubscribing.lock().contains(channel)
    }
}

/// How a cluster (un)subscription sent in the background ended.
pub(super) enum Ended {
    /// The channel, and whether the server confirmed it.
    Subscribed(String, bool),
    Unsubscribed(String),
}

/// Makes the driver refresh its slot map: a harmless `EXISTS` of a key of
/// `slot`, routed to a master that does not serve it, answers `MOVED`,
/// which the driver follows and answers with a refresh (and moves its
/// subscriptions to the slots' new masters).
async fn nudge(router: &ClusterRouter, conn: &mut ClusterConnection, slot: u16, timeout: Duration) {
    let (Some((host, port)), Some(key)) = (router.another_master(slot), key_in_slot(slot)) else {
        return;
    };
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
    let mut exists = redis::cmd("EXISTS");
    exists.arg(key);
    let _ = with_deadline("EXISTS", timeout, conn.route_command(exists, routing)).await;
}

/// A key whose slot is `slot` (found by trying hash tags; a few thousand
/// tries on average).
fn key_in_slot(slot: u16) -> Option<String> {
    (0..2_000_000u32)
        .map(|i| format!("{{onefill-nudge-{i}}}"))
        .find(|key| slot_of(key.as_bytes()) == slot)
}

/// Nudges the driver at every change of onefill's slot map, until the
/// router is gone.
async fn nudge_on_changes(router: WeakRouter, mut conn: ClusterConnection, timeout: Duration) {
    let Some(mut changes) = router.upgrade().map(|r| r.changes()) else {
        return;
    };
    while changes.changed().await.is_ok() {
        let (_, slot) = *changes.borrow_and_update();
        let Some(router) = router.upgrade() else {
            return;
        };
        nudge(&router, &mut conn, slot, timeout).await;
    }
}
