//! The subscriber's connection, owned by the subscriber task: on a
//! standalone server a [`PushConnection`] (one RESP3 connection kept up,
//! see `push.rs`) on which the task subscribes its channels; on a cluster
//! a RESP3 cluster connection that the driver keeps alive itself. Both
//! deliver their pushes (messages, subscription confirmations) on a
//! channel of their own.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::PushInfo;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;

use super::super::cluster::{slot_of, ClusterRouter, WeakRouter};
use super::super::errors::{is_refusal, with_deadline};
use super::super::options::RedisOptions;
use super::super::primary::Primary;
use super::super::push::{disconnected, Names, PushConnection};
use crate::error::BackendError;

/// The subscriber connection, owned by the subscriber task.
pub(in super::super) enum Link {
    Single(Box<SingleLink>),
    Cluster(Box<ClusterLink>),
}

/// How often a failed cluster subscription may make the driver refresh
/// its slot map.
const NUDGE_INTERVAL: Duration = Duration::from_secs(1);

/// The standalone subscriber: a push connection, pinged every
/// [`RedisOptions::ping_interval`], and the channels' (un)subscriptions.
pub(in super::super) struct SingleLink {
    pub(in super::super) push: PushConnection,
    response_timeout: Duration,
    /// When a refused subscription was last logged: refused ones are
    /// retried every [`SUBSCRIBE_RETRY`](super::task::SUBSCRIBE_RETRY),
    /// and a configuration error is worth a warning a minute, not a flood.
    warned_refusal: Option<Instant>,
}

/// How often a refused subscription is logged.
const REFUSAL_WARNING_EVERY: Duration = Duration::from_secs(60);

pub(in super::super) struct ClusterLink {
    conn: ClusterConnection,
    /// The command path's slot map, which leaves a hung master behind; the
    /// driver's own does not (see [`ClusterLink::subscribe`]).
    router: ClusterRouter,
    /// When the driver was last made to refresh its slot map.
    last_nudge: Arc<Mutex<Option<Instant>>>,
    /// Channels with an `SUNSUBSCRIBE` under way.
    unsubscribing: Arc<Mutex<HashSet<String>>>,
    /// `None` once the driver dropped its push sender (it never should).
    pub(in super::super) pushes: Option<UnboundedReceiver<PushInfo>>,
    options: RedisOptions,
}

impl SingleLink {
    /// A link for `client` (which must speak RESP3, for pushes), not yet
    /// connected.
    pub(in super::super) fn new(primary: &Primary, options: RedisOptions) -> SingleLink {
        let names = Names {
            connect: "subscriber connect",
            ping: "subscriber ping",
        };
        let (every, timeout) = (options.ping_interval, options.response_timeout);
        SingleLink {
            push: PushConnection::new(primary.resp3().0, options, names, every, timeout)
                .following(primary)
                .ping_when_quiet(),
            response_timeout: timeout,
            warned_refusal: None,
        }
    }

    /// `SUBSCRIBE` (or `UNSUBSCRIBE`) of `channels`.
    pub(in super::super) async fn command(
        &mut self,
        op: &'static str,
        channels: &[String],
        subscribe: bool,
    ) -> Result<(), BackendError> {
        let Some(conn) = self.push.conn() else {
            return Err(disconnected(op));
        };
        let call = async {
            if subscribe {
                conn.subscribe(channels).await
            } else {
                conn.unsubscribe(channels).await
            }
        };
        with_deadline(op, self.response_timeout, call).await
    }

    /// `SUBSCRIBE` of `channels`, answering the channels the server
    /// refused. A server refuses the whole command for one channel its ACL
    /// does not grant (a deployment that grants its namespaces' channels
    /// but not the holders' presence channels): the channels are then
    /// subscribed one by one, so that the refused ones alone go without
    /// (and are retried later) and the connection stays up for the others.
    /// An error: the connection is unusable.
    pub(in super::super) async fn subscribe(
        &mut self,
        channels: &[String],
    ) -> Result<Vec<String>, BackendError> {
        match self.command("subscribe", channels, true).await {
            Err(e) if is_refusal(&e) && channels.len() > 1 => {}
            Err(e) if is_refusal(&e) => {
                self.refused(&e, channels);
                return Ok(channels.to_vec());
            }
            other => return other.map(|()| Vec::new()),
        }
        let mut refused = Vec::new();
        for channel in channels {
            match self
                .command("subscribe", std::slice::from_ref(channel), true)
                .await
            {
                Ok(()) => {}
                Err(e) if is_refusal(&e) => {
                    self.refused(&e, std::slice::from_ref(channel));
                    refused.push(channel.clone());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(refused)
    }
}

impl SingleLink {
    /// The server refused `channels` (an ACL without them): what waits on
    /// them goes without (fill notifications, a holder's presence) and
    /// falls back on its polls and the lease's expiry, slower but bounded,
    /// so it is a warning naming the channel rather than an error.
    fn refused(&mut self, error: &BackendError, channels: &[String]) {
        let now = Instant::now();
        if self
            .warned_refusal
            .is_some_and(|at| now.duration_since(at) < REFUSAL_WARNING_EVERY)
        {
            return;
        }
        self.warned_refusal = Some(now);
        tracing::warn!(
            channel = channels.first().map(String::as_str).unwrap_or(""),
            %error,
            "redis refused a subscription: waiters on it fall back on polls and the lease's \
             expiry; grant the channel to the ACL user (see the Redis guide)"
        );
    }
}

impl ClusterLink {
    /// A link on `conn`, a RESP3 cluster connection whose pushes arrive on
    /// `pushes`.
    pub(in super::super) fn new(
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
    pub(in super::super) fn subscribe(&self, channel: String, done: UnboundedSender<Ended>) {
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
    pub(in super::super) fn unsubscribe(
        &self,
        channels: Vec<String>,
        done: &UnboundedSender<Ended>,
    ) {
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
    pub(in super::super) fn topology_changes(&self) -> tokio::sync::watch::Receiver<(u64, u16)> {
        self.router.changes()
    }

    /// Whether an `SUNSUBSCRIBE` of `channel` is under way: a subscription
    /// sent meanwhile could reach the server first and be undone by it,
    /// leaving the channel deaf while it looks subscribed.
    pub(in super::super) fn unsubscribing(&self, channel: &str) -> bool {
        self.unsubscribing.lock().contains(channel)
    }
}

/// How a cluster (un)subscription sent in the background ended.
pub(in super::super) enum Ended {
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
