//! Fill notifications: one subscriber connection per backend, shared by
//! every waiting key, owned by a background task.
//!
//! The first [`subscribe`](PubSubShared::subscribe) for a channel
//! subscribes on the server (and returns only once the server confirmed
//! it), later ones for the same channel share it, and the channel is
//! unsubscribed once its last subscription is dropped. The task
//! ([`run_subscriber`]) owns the connection:
//!
//! - after the standalone subscriber connection drops (a restart, a network
//!   failure, or a health-check `PING` that fails), it reconnects with
//!   jittered exponential backoff (see [`link`](super::link)) and
//!   subscribes every live channel again;
//! - on a cluster, the `redis` crate reconnects lost nodes and resubscribes
//!   their channels itself;
//! - either way every subscription is woken once when its channel is
//!   subscribed again, because fills announced meanwhile were lost.
//!
//! While the subscriber is disconnected, `subscribe` returns at once with a
//! subscription that fires only after the channel is subscribed again. A
//! waiter that holds a subscription re-checks only when it fires (its
//! polling is a slow safety net), so while its channel is not confirmed
//! (before the first confirmation, or after the connection or the channel
//! was lost) the subscription also resolves at the default waiters'
//! polling pace ([`unconfirmed_pace`]): such a waiter polls as one without
//! a subscription would. On a cluster, a channel whose node cannot be
//! reached is retried every [`SUBSCRIBE_RETRY`], and for a while after each
//! change of the slot map no channel counts as confirmed
//! ([`unsettled_for`]): the driver's subscriptions are unreliable while it
//! moves them.
//!
//! The task ends once the backend and every subscription are gone: it holds
//! the shared state only weakly, and the wake channel's sender lives in it.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::link::{Ended, Link};
use super::options::RedisOptions;
use super::push::Due;
use crate::backend::FillSubscription;
use crate::backoff::Backoff;
use crate::wait::WaitPolicy;

/// How long a cluster subscription that failed waits before it is retried.
const SUBSCRIBE_RETRY: Duration = Duration::from_millis(500);

/// How long [`subscribe`](PubSubShared::subscribe) waits for the server's
/// confirmation (a round trip, normally) before it returns a subscription
/// that fires once the confirmation comes: a slow node must not hold the
/// waiter (nor count against the backend), its polling covers the gap.
const CONFIRM_PATIENCE: Duration = Duration::from_millis(20);

/// How long after a change of a cluster's slot map (as the command path's
/// router sees it) no channel counts as confirmed: fills the driver's
/// subscriptions miss while it moves them to the slots' new owners are
/// then found by polling. A subscription the driver confirmed right after
/// a hung master's replica was promoted can miss the fill's message (seen
/// with 4 processes under load: a waiter woken only by the lease expiry,
/// a second later); the driver's requests stuck on the old master give up
/// within its response timeout, so twice that.
fn unsettled_for(options: &RedisOptions) -> Duration {
    options.response_timeout.saturating_mul(2)
}

/// How often a subscription whose channel is not confirmed resolves (a
/// spurious wake-up, which makes its waiter re-check): the default
/// waiters' polling without a subscription, since fills may go unannounced
/// until the channel is confirmed.
fn unconfirmed_pace() -> Backoff {
    let policy = WaitPolicy::default();
    Backoff::new(policy.poll_initial, policy.poll_max)
}

/// State shared by the backend, its subscriptions and the subscriber task.
pub(super) struct PubSubShared {
    state: Mutex<SubState>,
    /// Wakes the subscriber task to (un)subscribe. Held only here, so the
    /// task ends when the backend and all its subscriptions are gone.
    wake: UnboundedSender<()>,
}

struct SubState {
    /// Whether the subscriber connection is up (always true on a cluster,
    /// whose connection reconnects nodes by itself).
    connected: bool,
    channels: HashMap<String, Channel>,
    /// Cluster: until when no channel counts as confirmed, after a change
    /// of the slot map (see [`unsettled_for`]).
    unsettled_until: Option<Instant>,
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
    /// Cluster: an `SSUBSCRIBE` is under way (its outcome comes back to
    /// the subscriber task on its own).
    subscribing: bool,
}

impl Channel {
    fn new() -> Channel {
        Channel {
            tx: watch::channel(0).0,
            confirmed: false,
            fire_on_confirm: false,
            waiters: Vec::new(),
            expected_confirmations: 0,
            subscribing: false,
        }
    }

    fn fire(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The server confirmed the subscription: the `subscribe` calls
    /// waiting for it return, and the subscriptions that may have missed a
    /// fill meanwhile are woken once.
    fn confirm(&mut self) {
        self.confirmed = true;
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(());
        }
        if self.fire_on_confirm {
            self.fire_on_confirm = false;
            self.fire();
        }
    }

    /// The subscription failed: the `subscribe` calls waiting for it
    /// return (their waiters poll), and the subscriptions are woken once it
    /// is confirmed on a later try.
    fn not_subscribed(&mut self) {
        self.fire_on_confirm = true;
        self.expected_confirmations = self.expected_confirmations.saturating_sub(1);
        self.waiters.clear();
    }

    fn in_use(&self) -> bool {
        self.tx.receiver_count() > 0 || !self.waiters.is_empty()
    }
}

impl PubSubShared {
    /// The shared state of a backend whose subscriber connection is `link`
    /// (already connected), with its subscriber task started.
    pub(super) fn start(link: Link, options: RedisOptions) -> Arc<PubSubShared> {
        let (wake_tx, wake_rx) = unbounded_channel();
        let pubsub = Arc::new(PubSubShared {
            state: Mutex::new(SubState {
                connected: true,
                channels: HashMap::new(),
                unsettled_until: None,
            }),
            wake: wake_tx,
        });
        tokio::spawn(run_subscriber(
            Arc::downgrade(&pubsub),
            wake_rx,
            link,
            options,
        ));
        pubsub
    }

    /// A subscription to `channel`, confirmed by the server unless the
    /// subscriber is disconnected (then it fires once the channel is
    /// subscribed again).
    pub(super) async fn subscribe(self: &Arc<Self>, channel: String) -> Box<dyn FillSubscription> {
        let (subscription, confirmed) = {
            let mut state = self.state.lock();
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
                shared: self.clone(),
                channel,
                rx: Some(rx),
                unconfirmed: unconfirmed_pace(),
            };
            (subscription, confirmed)
        };
        if let Some(confirmed) = confirmed {
            let _ = self.wake.send(());
            // An error means the subscriber lost its connection meanwhile:
            // the channel is marked to fire once it is subscribed again.
            if tokio::time::timeout(CONFIRM_PATIENCE, confirmed)
                .await
                .is_err()
            {
                // Not confirmed yet: fire once it is, so a fill announced
                // before that is not missed.
                if let Some(chan) = self.state.lock().channels.get_mut(&subscription.channel) {
                    if !chan.confirmed {
                        chan.fire_on_confirm = true;
                    }
                }
            }
        }
        Box::new(subscription)
    }
}

struct RedisSubscription {
    shared: Arc<PubSubShared>,
    channel: String,
    rx: Option<watch::Receiver<u64>>,
    /// Paces the spurious wake-ups while the channel is not confirmed.
    unconfirmed: Backoff,
}

impl RedisSubscription {
    /// Whether the server confirmed the channel (and has not lost it
    /// since), and the cluster's slot map has not changed just now.
    fn confirmed(shared: &PubSubShared, channel: &str) -> bool {
        let state = shared.state.lock();
        let settled = state
            .unsettled_until
            .is_none_or(|until| Instant::now() >= until);
        settled && state.channels.get(channel).is_some_and(|c| c.confirmed)
    }
}

#[async_trait]
impl FillSubscription for RedisSubscription {
    /// Resolves at the next message on the channel; and, while the channel
    /// is not confirmed, at the polling pace (see the module docs): a pace
    /// tick that finds it confirmed by then waits on for a message (the
    /// confirmation itself wakes it if a fill may have been missed).
    async fn notified(&mut self) {
        let RedisSubscription {
            shared,
            channel,
            rx,
            unconfirmed,
        } = self;
        let Some(rx) = rx.as_mut() else {
            // Unreachable in practice (the receiver lives until `Drop`);
            // never resolve rather than spin.
            return std::future::pending().await;
        };
        loop {
            if Self::confirmed(shared, channel) {
                break;
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_ok() {
                        return;
                    }
                    break;
                }
                _ = tokio::time::sleep(unconfirmed.next_interval()) => {
                    if !Self::confirmed(shared, channel) {
                        return;
                    }
                }
            }
        }
        if rx.changed().await.is_err() {
            // Unreachable in practice (the sender lives while we hold a
            // receiver); never resolve rather than spin.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for RedisSubscription {
    fn drop(&mut self) {
        let unused = {
            let state = self.shared.state.lock();
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
    /// Time to retry the cluster subscriptions that failed.
    Retry,
}

/// The subscriber task: (un)subscribes channels as subscriptions come and
/// go, dispatches messages, and keeps the connection alive.
async fn run_subscriber(
    shared: Weak<PubSubShared>,
    mut wake: UnboundedReceiver<()>,
    mut link: Link,
    options: RedisOptions,
) {
    // Cluster: when to retry failed subscriptions (a standalone connection
    // paces its own reconnections).
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
                chan.fire();
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
            let mut result = Ok(());
            if !to_unsubscribe.is_empty() {
                result = l.command("unsubscribe", &to_unsubscribe, false).await;
            }
            if result.is_ok() && !to_subscribe.is_empty() {
                result = l.command("subscribe", &to_subscribe, true).await;
            }
            if let Err(e) = result {
                tracing::debug!(error = %e, "redis subscriber command failed");
                l.push.lost();
                lost(shared);
                return None;
            }
            Vec::new()
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
