//! The subscriber task: it owns the subscriber connection, brings the
//! server's subscriptions in line with the channels in use, dispatches
//! pushes, and on a standalone server keeps the connection up (through its
//! push connection) and subscribes every channel again after a loss.

use std::sync::Weak;
use std::time::Duration;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::super::options::RedisOptions;
use super::super::push::Due;
use super::link::{Ended, Link};
use super::PubSubShared;

/// How long a subscription that failed (a cluster's) or that the server
/// refused (an ACL's) waits before it is retried.
pub(super) const SUBSCRIBE_RETRY: Duration = Duration::from_millis(500);

/// How long after a change of a cluster's slot map (as the command path's
/// router sees it) no channel counts as confirmed: fills the driver's
/// subscriptions miss while it moves them to the slots' new owners are
/// then found by polling. A subscription the driver confirmed right after
/// a hung master's replica was promoted can miss the fill's message (seen
/// with 4 processes under load: a waiter woken only by the lease expiry,
/// a second later); the driver's requests stuck on the old master give up
/// within its response timeout, so twice that.
pub(super) fn unsettled_for(options: &RedisOptions) -> Duration {
    options.response_timeout.saturating_mul(2)
}

/// What the subscriber task should do next.
enum Step {
    Wake(Option<()>),
    /// The cluster's slot map changed.
    Topology,
    /// A cluster (un)subscription sent in the background ended.
    Subscribed(Option<Ended>),
    /// A cluster push, or `None` once the driver stopped delivering them.
    Push(Option<PushInfo>),
    /// The standalone connection's news.
    Single(Due),
    /// Time to retry the subscriptions that failed or were refused.
    Retry,
    /// Asked whether the connection delivers (`PubSubShared::delivers`).
    Check(oneshot::Sender<bool>),
}

/// The subscriber task: (un)subscribes channels as subscriptions come and
/// go, dispatches messages, and keeps the connection alive.
pub(super) async fn run_subscriber(
    shared: Weak<PubSubShared>,
    mut wake: UnboundedReceiver<()>,
    mut checks: UnboundedReceiver<oneshot::Sender<bool>>,
    mut link: Link,
    options: RedisOptions,
) {
    // When to retry failed (cluster) or refused subscriptions (a standalone
    // connection paces its own reconnections).
    let mut retry_at: Option<Instant> = None;
    // Cluster subscriptions run apart (one slow node must not hold the
    // others) and report here.
    let (subscribed_tx, mut subscribed) = unbounded_channel::<Ended>();
    let mut topology = match &link {
        Link::Cluster(l) => Some(l.topology_changes()),
        Link::Single(_) => None,
    };
    loop {
        let retry_sleep = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now));
        let step = {
            let has_topology = topology.is_some();
            let topology_change = async {
                match topology.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let link_news = async {
                match &mut link {
                    Link::Single(l) => Step::Single(l.push.due().await),
                    Link::Cluster(l) => match l.pushes.as_mut() {
                        Some(rx) => Step::Push(rx.recv().await),
                        None => std::future::pending().await,
                    },
                }
            };
            tokio::select! {
                w = wake.recv() => Step::Wake(w),
                Some(check) = checks.recv() => Step::Check(check),
                changed = topology_change, if has_topology => {
                    if changed {
                        Step::Topology
                    } else {
                        // The router is gone: so is the backend.
                        topology = None;
                        continue;
                    }
                }
                d = subscribed.recv() => Step::Subscribed(d),
                news = link_news => news,
                _ = retry_sleep, if retry_at.is_some() => Step::Retry,
            }
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match step {
            Step::Wake(None) => return,
            Step::Topology => {
                // Wake every waiter once: its next wait polls until the
                // slot map has settled.
                let mut state = shared.state.lock();
                state.unsettled_until = Some(Instant::now() + unsettled_for(&options));
                for chan in state.channels.values() {
                    chan.fire();
                }
            }
            Step::Wake(Some(())) => {
                while wake.try_recv().is_ok() {}
                retry_at = reconcile(&shared, &mut link, &subscribed_tx)
                    .await
                    .or(retry_at);
            }
            Step::Subscribed(None) => {}
            Step::Subscribed(Some(Ended::Unsubscribed(channel))) => {
                // Its subscription may have waited for this.
                let waiting = shared
                    .state
                    .lock()
                    .channels
                    .get(&channel)
                    .is_some_and(|c| !c.confirmed);
                if waiting {
                    retry_at = reconcile(&shared, &mut link, &subscribed_tx)
                        .await
                        .or(retry_at);
                }
            }
            Step::Subscribed(Some(Ended::Subscribed(channel, ok))) => {
                if let Some(at) = subscribed_to(&shared, &link, &channel, ok, &subscribed_tx) {
                    retry_at = Some(retry_at.map_or(at, |r| r.min(at)));
                }
            }
            Step::Push(Some(push)) | Step::Single(Due::Push(push)) => handle_push(&shared, push),
            Step::Push(None) => {
                // The driver reconnects nodes itself; its push channel
                // closes only if it is torn down. Notifications are gone for
                // good then (waiters still re-check at lease expiries and
                // safety polls).
                if let Link::Cluster(l) = &mut link {
                    if l.pushes.take().is_some() {
                        tracing::error!("redis cluster subscriber stopped delivering messages");
                    }
                }
            }
            Step::Single(Due::Lost) => lost(&shared),
            Step::Single(Due::Connect) => {
                if let Link::Single(l) = &mut link {
                    match l.push.connect().await {
                        Ok(()) => {
                            tracing::info!("redis subscriber reconnected");
                            shared.state.lock().connected = true;
                            retry_at = reconcile(&shared, &mut link, &subscribed_tx).await;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "redis subscriber reconnection failed");
                        }
                    }
                }
            }
            Step::Single(Due::Ping) => {
                if let Link::Single(l) = &mut link {
                    if let Err(e) = l.push.ping(|push| handle_push(&shared, push)).await {
                        tracing::debug!(error = %e, "redis subscriber ping failed");
                        lost(&shared);
                    }
                }
            }
            Step::Retry => {
                retry_at = reconcile(&shared, &mut link, &subscribed_tx).await;
            }
            Step::Check(reply) => {
                let delivers = match &mut link {
                    Link::Single(l) => {
                        let connected = shared.state.lock().connected;
                        let answered = connected
                            && l.push.ping(|push| handle_push(&shared, push)).await.is_ok();
                        if connected && !answered {
                            // The push connection has taken itself down.
                            tracing::debug!("redis subscriber ping unanswered: reconnecting");
                            lost(&shared);
                        }
                        answered
                    }
                    Link::Cluster(_) => true,
                };
                let _ = reply.send(delivers);
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
            if let Some(chan) = shared.state.lock().channels.get(&channel) {
                let payload = match push.data.get(1) {
                    Some(Value::BulkString(b)) => &b[..],
                    Some(Value::SimpleString(s)) => s.as_bytes(),
                    _ => &[],
                };
                chan.deliver(payload);
            }
        }
        PushKind::SUnsubscribe => {
            // Redis 7 unsubscribes the channels of a slot its node lost (a
            // failover, a migration): subscribe again, on the new owner, and
            // wake the subscriptions once that is confirmed. (Our own
            // `SUNSUBSCRIBE`s concern channels no longer in use: ignored.)
            let mut state = shared.state.lock();
            if let Some(chan) = state.channels.get_mut(&channel) {
                if chan.confirmed && !chan.subscribing {
                    chan.confirmed = false;
                    chan.fire_on_confirm = true;
                    drop(state);
                    let _ = shared.wake.send(());
                }
            }
        }
        PushKind::Disconnection => {
            // One of the cluster driver's node connections closed (a
            // standalone link takes its own losses apart). The driver
            // connects again and subscribes the node's channels again in
            // one `SSUBSCRIBE`, which the node refuses (`CROSSSLOT`) as
            // soon as they are in two slots: a restarted node would be left
            // with none. So every channel is subscribed again here, one by
            // one, and its subscriptions woken once that is confirmed (the
            // node's messages meanwhile were lost).
            let mut state = shared.state.lock();
            let mut any = false;
            for chan in state.channels.values_mut() {
                if chan.confirmed && !chan.subscribing {
                    chan.confirmed = false;
                    chan.fire_on_confirm = true;
                    any = true;
                }
            }
            drop(state);
            if any {
                let _ = shared.wake.send(());
            }
        }
        PushKind::SSubscribe => {
            let mut state = shared.state.lock();
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

/// The standalone subscriber connection is gone (it reconnects by itself):
/// every channel is unconfirmed, to be subscribed and fired again once it
/// is back.
fn lost(shared: &PubSubShared) {
    let mut state = shared.state.lock();
    if state.connected {
        tracing::warn!("redis subscriber connection lost; reconnecting");
    }
    state.connected = false;
    for chan in state.channels.values_mut() {
        chan.confirmed = false;
        chan.fire_on_confirm = true;
        // Dropping the senders lets waiting `subscribe` calls return.
        chan.waiters.clear();
    }
}

/// A cluster `SSUBSCRIBE` of `channel` ended (`ok`: confirmed). Returns
/// when to retry it if it failed.
fn subscribed_to(
    shared: &PubSubShared,
    link: &Link,
    channel: &str,
    ok: bool,
    done: &UnboundedSender<Ended>,
) -> Option<Instant> {
    let mut state = shared.state.lock();
    let Some(chan) = state.channels.get_mut(channel) else {
        drop(state);
        if ok {
            // Nobody wants it any more.
            if let Link::Cluster(l) = link {
                l.unsubscribe(vec![channel.to_owned()], done);
            }
        }
        return None;
    };
    chan.subscribing = false;
    if ok {
        chan.confirm();
        let unused = !chan.in_use();
        drop(state);
        if unused {
            let _ = shared.wake.send(());
        }
        None
    } else {
        chan.not_subscribed();
        tracing::debug!(channel, "redis subscription failed; retrying");
        Some(Instant::now() + SUBSCRIBE_RETRY)
    }
}

/// Brings the server's subscriptions in line with the channels in use:
/// unsubscribes the unused ones and subscribes the new (or lost) ones.
/// Returns when to try again if something failed.
async fn reconcile(
    shared: &PubSubShared,
    link: &mut Link,
    subscribed: &UnboundedSender<Ended>,
) -> Option<Instant> {
    let cluster = matches!(link, Link::Cluster(_));
    let (to_unsubscribe, to_subscribe) = {
        let mut state = shared.state.lock();
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
        let unsubscribing = |name: &str| match &*link {
            Link::Cluster(l) => l.unsubscribing(name),
            Link::Single(_) => false,
        };
        for (name, chan) in state.channels.iter_mut() {
            // A channel with an `SUNSUBSCRIBE` under way waits for it (see
            // `ClusterLink::unsubscribing`).
            if !chan.confirmed && !chan.subscribing && !unsubscribing(name) {
                if cluster {
                    chan.expected_confirmations += 1;
                    chan.subscribing = true;
                }
                to_subscribe.push(name.clone());
            }
        }
        (to_unsubscribe, to_subscribe)
    };

    let failed = match link {
        Link::Single(l) => {
            let mut result = Ok(Vec::new());
            if !to_unsubscribe.is_empty() {
                result = l
                    .command("unsubscribe", &to_unsubscribe, false)
                    .await
                    .map(|()| Vec::new());
            }
            if result.is_ok() && !to_subscribe.is_empty() {
                result = l.subscribe(&to_subscribe).await;
            }
            match result {
                Ok(refused) => refused,
                Err(e) => {
                    tracing::debug!(error = %e, "redis subscriber command failed");
                    l.push.lost();
                    lost(shared);
                    return None;
                }
            }
        }
        Link::Cluster(l) => {
            // A failed unsubscription leaves a subscription nobody listens
            // to; it goes with the connection.
            l.unsubscribe(to_unsubscribe, subscribed);
            for channel in to_subscribe {
                l.subscribe(channel, subscribed.clone());
            }
            // Their outcomes come back one by one (`subscribed_to`).
            return None;
        }
    };

    let mut state = shared.state.lock();
    for name in &to_subscribe {
        let Some(chan) = state.channels.get_mut(name) else {
            continue;
        };
        let ok = !failed.contains(name);
        if ok {
            chan.confirm();
        } else {
            chan.not_subscribed();
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
