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
//!   failure, or a health-check `PING` that fails), its push connection
//!   (`push.rs`) reconnects with jittered exponential backoff, and the task
//!   subscribes every live channel again;
//! - on a cluster, the `redis` crate reconnects lost nodes; it subscribes
//!   their channels again in one `SSUBSCRIBE` per node, which a node
//!   refuses when they span two slots, so on a lost node connection (a
//!   `Disconnection` push) the task subscribes every channel again, one
//!   by one;
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
//! reached is retried every [`SUBSCRIBE_RETRY`](task::SUBSCRIBE_RETRY), and for a while after each
//! change of the slot map no channel counts as confirmed
//! ([`unsettled_for`](task::unsettled_for)): the driver's subscriptions are unreliable while it
//! moves them.
//!
//! The task ends once the backend and every subscription are gone: it holds
//! the shared state only weakly, and the wake channel's sender lives in it.
//!
//! Here: the shared state and the subscriptions; the task in `task.rs`, its
//! connection in `link.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::mpsc::{self, unbounded_channel, UnboundedSender};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::options::RedisOptions;
use crate::backend::FillSubscription;
use crate::backoff::Backoff;
use crate::wait::WaitPolicy;

mod link;
mod task;

pub(super) use link::{ClusterLink, Link, SingleLink};
use task::run_subscriber;

/// How long [`subscribe`](PubSubShared::subscribe) waits for the server's
/// confirmation (a round trip, normally) before it returns a subscription
/// that fires once the confirmation comes: a slow node must not hold the
/// waiter (nor count against the backend), its polling covers the gap.
pub(super) const CONFIRM_PATIENCE: Duration = Duration::from_millis(20);

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
    /// Asks the subscriber task whether its connection delivers
    /// ([`PubSubShared::delivers`]).
    checks: UnboundedSender<oneshot::Sender<bool>>,
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
    /// Where the messages' payloads go, for the one channel whose
    /// messages say something (a holder's presence: who asks about which
    /// lease); the others only wake their subscriptions.
    inbox: Option<mpsc::Sender<Vec<u8>>>,
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
            inbox: None,
        }
    }

    fn fire(&self) {
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A message: its subscriptions woken, its payload handed to the
    /// inbox if the channel has one. A full inbox drops it: whoever sent
    /// it asks again when its answer does not come.
    fn deliver(&self, payload: &[u8]) {
        self.fire();
        if let Some(inbox) = &self.inbox {
            let _ = inbox.try_send(payload.to_vec());
        }
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
        let (checks_tx, checks_rx) = unbounded_channel();
        let pubsub = Arc::new(PubSubShared {
            state: Mutex::new(SubState {
                connected: true,
                channels: HashMap::new(),
                unsettled_until: None,
            }),
            wake: wake_tx,
            checks: checks_tx,
        });
        tokio::spawn(run_subscriber(
            Arc::downgrade(&pubsub),
            wake_rx,
            checks_rx,
            link,
            options,
        ));
        pubsub
    }

    /// A subscription to `channel`, confirmed by the server unless the
    /// subscriber is disconnected (then it fires once the channel is
    /// subscribed again).
    pub(super) async fn subscribe(self: &Arc<Self>, channel: String) -> Box<dyn FillSubscription> {
        Box::new(self.subscription(channel).await)
    }

    /// Whether the server confirmed a subscription to `channel` (and has
    /// not lost it since), whether or not a cluster's slot map settled.
    pub(super) fn subscribed(&self, channel: &str) -> bool {
        self.state
            .lock()
            .channels
            .get(channel)
            .is_some_and(|c| c.confirmed)
    }

    /// Whether the server confirmed `channel` (and has not lost it since).
    pub(super) fn confirmed(&self, channel: &str) -> bool {
        RedisSubscription::confirmed(self, channel)
    }

    /// Whether the subscriber connection delivers what the server sends
    /// it, asked now: on a standalone server a `PING` on it, whose answer
    /// comes after every message the server sent before it; one that is
    /// not answered within the response timeout takes the connection for
    /// lost (it reconnects). For a silence that must be told from a
    /// connection that went half-open (no reset reached us: messages are
    /// lost, nothing fails). A cluster's driver-owned connection is not
    /// asked: `true`.
    pub(super) async fn delivers(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.checks.send(tx).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// Subscribes `channel` again, in the background, if it is subscribed
    /// and no subscription of it is under way: on a cluster the driver
    /// routes the `SSUBSCRIBE` by its slot map of now. For a channel whose
    /// receivers a publish counts (a holder's presence): a master demoted
    /// to a replica keeps its sharded subscriptions, which still receive
    /// what the new master publishes but are not counted by it. Until the
    /// server confirms it again the channel is not confirmed.
    pub(super) fn resubscribe(&self, channel: &str) {
        let mut state = self.state.lock();
        let Some(chan) = state.channels.get_mut(channel) else {
            return;
        };
        if chan.subscribing || !chan.confirmed {
            return;
        }
        chan.confirmed = false;
        drop(state);
        let _ = self.wake.send(());
    }

    /// Waits (a round trip normally, at most `patience`) for the
    /// confirmation of `channel` if a subscription to it awaits one;
    /// returns at once if it is confirmed or nobody subscribes to it.
    pub(super) async fn confirmation(&self, channel: &str, patience: Duration) {
        let confirmed = {
            let mut state = self.state.lock();
            let Some(chan) = state.channels.get_mut(channel) else {
                return;
            };
            if chan.confirmed {
                return;
            }
            let (tx, rx) = oneshot::channel();
            chan.waiters.push(tx);
            rx
        };
        let _ = tokio::time::timeout(patience, confirmed).await;
    }

    /// As [`subscription`](Self::subscription), with the payloads of the
    /// channel's messages (at most `capacity` unread) handed to the
    /// returned receiver.
    pub(super) async fn subscription_with_inbox(
        self: &Arc<Self>,
        channel: String,
        capacity: usize,
    ) -> (RedisSubscription, mpsc::Receiver<Vec<u8>>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.state
            .lock()
            .channels
            .entry(channel.clone())
            .or_insert_with(Channel::new)
            .inbox = Some(tx);
        (self.subscription(channel).await, rx)
    }

    /// As [`subscribe`](Self::subscribe), the subscription itself.
    pub(super) async fn subscription(self: &Arc<Self>, channel: String) -> RedisSubscription {
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
            // One turn of the caller's task before the subscriber task is
            // woken: a caller subscribing to two channels at once (a waiter:
            // the key's channel and its holder's beats) registers both
            // first, and they go out in one `SUBSCRIBE`.
            tokio::task::yield_now().await;
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
        subscription
    }
}

/// One subscription to a channel (see [`PubSubShared::subscribe`]).
pub(super) struct RedisSubscription {
    shared: Arc<PubSubShared>,
    channel: String,
    rx: Option<watch::Receiver<u64>>,
    /// Paces the spurious wake-ups while the channel is not confirmed.
    unconfirmed: Backoff,
}

impl RedisSubscription {
    /// Whether this subscription's channel is confirmed (see
    /// [`confirmed`](Self::confirmed)).
    pub(super) fn is_confirmed(&self) -> bool {
        Self::confirmed(&self.shared, &self.channel)
    }

    /// Whether the connection it comes through delivers (see
    /// [`PubSubShared::delivers`]).
    pub(super) async fn delivers(&self) -> bool {
        self.shared.delivers().await
    }

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
