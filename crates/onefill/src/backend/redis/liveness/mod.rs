//! Whether a lease's holder is alive (decision 0015): a waiter learns that the process holding a lease died within
//! about a beat, and that it froze within [`FROZEN_AFTER`], instead of
//! when its lease expires.
//!
//! Redis tells nobody when a connection closes, but it knows at once: a
//! `PUBLISH` answers how many connections are subscribed to the channel.
//! So each backend names itself in its lease tokens (a random id) and
//! keeps its subscriber connection subscribed to a *presence* channel of
//! its own, which nobody else subscribes to. A waiter
//!
//! 1. subscribes to the holder's *beats* channel (with the key's fill
//!    channel: one `SUBSCRIBE`), then sends `GET lock` and
//!    a `PUBLISH` to the holder's presence channel in one round trip: the
//!    lease moved on (re-check), or nobody received it (the holder's
//!    connection is closed: dead), or the holder now knows someone waits;
//! 2. the holder, told so by that message, publishes a beat every
//!    [`BEAT`] for as long as someone receives them (its beats answer how
//!    many do), and stops when nobody does;
//! 3. a beat later than [`BEAT`] + [`BEAT_SLACK`] makes the waiter publish
//!    to the presence channel again: nobody received it, dead; else the
//!    holder is alive but slow, and if its beats stay away for
//!    [`FROZEN_AFTER`], frozen (a stopped process, a stalled machine). A
//!    waiter that was not running itself when a beat was due (its own
//!    executor blocked) cannot tell: it listens afresh.
//!
//! Costs: nothing while nobody waits; a beat per [`BEAT`] per holding
//! process while any process waits for it, whatever the number of waiters
//! and leases; two commands and one subscription per waiting process.
//!
//! A lease names its holder only while the holder's presence channel is
//! confirmed, so a waiter never finds a holder "dead" because it had not
//! subscribed yet. A holder whose subscriber connection drops (a network
//! blip) is taken for dead: its lease is taken over and its fill fenced,
//! one more load at most, as for a holder whose lease expired.
//!
//! A live process is not a live load. Across a failover a lease can
//! outlive the flight that took it: the lease reached the replica that was
//! promoted, its fill or its release did not (it went to the old primary,
//! or failed on the way). Its holder's process still answers and beats, so
//! a watch of the process alone would keep its waiters until the lease
//! expires, seconds later. So each ask names the lease it is about (its
//! token and its key), and the holder keeps the tokens of the leases its
//! flights still hold (`Liveness::held`: from before the acquire is sent,
//! if it wins, to the end of the fill or release that ended it): asked
//! about one it no longer
//! holds, it releases it where it is now (compare-and-delete on the token,
//! which announces the release), and its waiters take the lease in the
//! next round trip.
//!
//! On a Redis Cluster a `PUBLISH` counts the receivers of the node that
//! took it, so presence and beats are sharded channels (`SSUBSCRIBE`,
//! `SPUBLISH`), which live on the master of their slot. One such channel
//! for the whole backend would tie every holder's liveness to one random
//! master: while that master fails over, the holder is not subscribed
//! anywhere, and waiters of keys on every healthy master would find it
//! "dead" and take over live loads. So a holder names itself per master:
//! a presence channel in the first slot of each master it holds leases on
//! (`onefill:holder:{<tag>}:<id>`, the tag a name in that slot), and a
//! lease's token names the one of the master its key lives on
//! (`<id>_<tag>`). A key's liveness then fails over with the key: a
//! waiter finds its holder missing only while the key's own master is
//! replaced, when the lease and its fill are in question anyway.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};

use super::cluster::slot_of;
use super::subscriber::{PubSubShared, RedisSubscription, CONFIRM_PATIENCE};
use crate::backend::{BackendError, FillKeys, Gone, Watch};
use crate::token::LeaseToken;

mod names;
mod publisher;
mod watching;

pub(super) use publisher::Publisher;
use watching::Watching;

/// How often a holder beats while someone waits for it.
pub(super) const BEAT: Duration = Duration::from_millis(90);
/// How late a beat may be before a waiter asks whether the holder's
/// connection is still there.
pub(super) const BEAT_SLACK: Duration = Duration::from_millis(10);
/// How long a holder whose connection is there may stay silent before it
/// is taken for frozen.
pub(super) const FROZEN_AFTER: Duration = Duration::from_secs(1);
/// How long `connect` waits for the presence channels' confirmation
/// before it returns anyway (leases are anonymous until it comes).
const PRESENCE_PATIENCE: Duration = Duration::from_millis(500);

/// How many asks a holder keeps unread on one presence channel before it
/// drops the newest (their waiters ask again when no beat comes).
const ASKS_UNREAD: usize = 1024;

/// What a waiter publishes on a holder's presence channel about the lease
/// `holder` holds on `keys`: the token, a space, the value key.
fn ask(holder: &LeaseToken, keys: &FillKeys) -> String {
    format!("{} {}", holder.as_str(), keys.value())
}

/// The lease an ask names, if it names one ([`ask`]'s shape).
fn asked_about(payload: &[u8]) -> Option<(LeaseToken, FillKeys)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (token, value_key) = text.split_once(' ')?;
    let token = LeaseToken::from_stored(token.as_bytes())?;
    Some((token, FillKeys::from_value_key(value_key)?))
}

/// Releases a lease this backend no longer holds, in the background
/// (compare-and-delete on the token, announced).
pub(super) type Release = Box<dyn Fn(FillKeys, LeaseToken) + Send + Sync>;

/// One backend's liveness: its id, its presence channels (one on a
/// standalone server; on a cluster one per master it holds leases on),
/// its beats, the leases its flights hold.
pub(super) struct Liveness {
    id: String,
    pubsub: Arc<PubSubShared>,
    conn: Publisher,
    response_timeout: Duration,
    /// The names this backend gives itself in tokens, by the master a
    /// cluster key lives on (its failure domain); unused standalone.
    names: Mutex<HashMap<u64, String>>,
    /// Cluster: the names whose presence a publish on its master has not
    /// counted since the slot map last changed (see [`names::verify_presence`]);
    /// tokens stay anonymous on them meanwhile.
    unverified: Mutex<HashSet<String>>,
    /// By name: whether it beats.
    beating: Mutex<HashMap<String, Beating>>,
    /// The tokens of the leases this backend's flights hold: from before
    /// the acquire that won was sent to the end of the fill or release
    /// that ended it.
    /// With when the acquire began: a fill's value is as old as its
    /// load, which began after that (see [`Liveness::held_for`]).
    held: Mutex<HashMap<LeaseToken, tokio::time::Instant>>,
    /// What an ask about a lease no flight holds any more does.
    release: Release,
    /// Dropped with the backend: ends the presence tasks.
    stop: watch::Sender<()>,
}

#[derive(Default)]
struct Beating {
    /// A beat task runs.
    running: bool,
    /// Someone asked since the last beat.
    asked: bool,
}

impl Liveness {
    /// Names the backend and subscribes its presence channels (on a
    /// cluster, one for each master of the slot map now), waiting up to
    /// half a second for their confirmation.
    pub(super) async fn start(
        pubsub: Arc<PubSubShared>,
        conn: Publisher,
        response_timeout: Duration,
        release: Release,
    ) -> Arc<Liveness> {
        let id = format!("{:016x}", rand::random::<u64>());
        let liveness = Arc::new(Liveness {
            id,
            pubsub,
            conn,
            response_timeout,
            names: Mutex::default(),
            unverified: Mutex::default(),
            beating: Mutex::default(),
            held: Mutex::default(),
            release,
            stop: watch::channel(()).0,
        });
        let names = match &liveness.conn {
            Publisher::Single(_) => vec![liveness.id.clone()],
            Publisher::Cluster(router) => liveness.name_masters(&router.first_slots()),
        };
        let mut presences = Vec::with_capacity(names.len());
        for name in names {
            if let Some(presence) = liveness.present_as(name).await {
                presences.push(presence);
            }
        }
        let confirmations = presences
            .iter()
            .map(|presence| liveness.pubsub.confirmation(presence, PRESENCE_PATIENCE));
        futures_util::future::join_all(confirmations).await;
        if let Publisher::Cluster(router) = &liveness.conn {
            tokio::spawn(names::verify_presence(
                Arc::downgrade(&liveness),
                router.changes(),
            ));
        }
        liveness
    }

    /// A token naming this backend (on a cluster, with the master of
    /// `keys`' slot), while the presence channel of that name is
    /// confirmed; else an anonymous one (its waiters then rely on the
    /// lease's expiry).
    pub(super) fn new_token(self: &Arc<Self>, keys: &FillKeys) -> LeaseToken {
        let name = match &self.conn {
            Publisher::Single(_) => Some(self.id.clone()),
            Publisher::Cluster(router) => {
                let shard = router.shard_of(slot_of(keys.value().as_bytes()));
                let named = self.names.lock().get(&shard).cloned();
                if named.is_none() && shard != 0 {
                    // A master this backend has not named itself on yet (it
                    // joined the slot map since): this lease stays anonymous,
                    // the next ones on it are named once the channel is
                    // confirmed.
                    self.name_new_masters(router.first_slots());
                }
                named
            }
        };
        match name.and_then(|name| Some((self.conn.channels(&name)?, name))) {
            Some((channels, name))
                if self.pubsub.confirmed(&channels.presence)
                    && !self.unverified.lock().contains(&name) =>
            {
                LeaseToken::for_holder(&name)
            }
            _ => LeaseToken::random(),
        }
    }

    /// Subscribes the presence channel of `name` and starts answering its
    /// asks: the channel, if `name` has one.
    async fn present_as(self: &Arc<Self>, name: String) -> Option<String> {
        let presence = self.conn.channels(&name)?.presence;
        let (subscription, asks) = self
            .pubsub
            .subscription_with_inbox(presence.clone(), ASKS_UNREAD)
            .await;
        tokio::spawn(answer_asks(
            Arc::downgrade(self),
            name,
            subscription,
            asks,
            self.stop.subscribe(),
        ));
        Some(presence)
    }

    /// A flight of this backend asks for the lease with `token`: held from
    /// before the request is sent (a waiter may ask about it as soon as the
    /// server has set it, before its answer is back here) until the guard
    /// is dropped, unless [`Acquiring::won`] keeps it.
    pub(super) fn acquiring(self: &Arc<Self>, token: &LeaseToken) -> Acquiring {
        if token.holder().is_some() {
            self.held
                .lock()
                .insert(token.clone(), tokio::time::Instant::now());
        }
        Acquiring(Ending {
            liveness: Some(Arc::downgrade(self)),
            token: token.clone(),
        })
    }

    /// The flight that holds `token` is ending it (a fill or a release):
    /// from the guard's drop on, whether the step landed or not, no flight
    /// of this process holds it, and an ask about it releases it.
    pub(super) fn ending(self: &Arc<Self>, token: &LeaseToken) -> Ending {
        Ending {
            liveness: Some(Arc::downgrade(self)),
            token: token.clone(),
        }
    }

    /// Whether this backend's presence is heard where waiters ask: its
    /// presence channel (one of them, on a cluster) published to and
    /// counted. `NotPermitted` if the ACL refuses the publish, or if
    /// nobody is subscribed (the subscription was refused).
    pub(super) async fn present(&self) -> Result<(), BackendError> {
        let name = match &self.conn {
            Publisher::Single(_) => Some(self.id.clone()),
            // One whose channel was counted since the slot map last changed.
            Publisher::Cluster(_) => {
                let unverified = self.unverified.lock().clone();
                let names = self.names.lock();
                names
                    .values()
                    .find(|name| !unverified.contains(*name))
                    .or_else(|| names.values().next())
                    .cloned()
            }
        };
        let Some(name) = name else {
            return Ok(());
        };
        match self.self_check(&name).await {
            Some((_, Ok(counted))) if counted > 0 => Ok(()),
            // Subscribed, but not where the publish went: a master that a
            // failover demoted still holds it; the slot-map check moves it.
            Some((presence, Ok(_))) if self.pubsub.subscribed(&presence) => Ok(()),
            Some((presence, Ok(_))) => Err(BackendError::new(
                crate::error::BackendErrorKind::NotPermitted,
                format!("SUBSCRIBE {presence}: not subscribed (refused)"),
            )),
            Some((_, Err(e))) => Err(e),
            None => Ok(()),
        }
    }

    /// Publishes [`SELF_CHECK`] on the presence channel of `name`: the
    /// channel and how many received it (`None`: `name` has no channel).
    async fn self_check(&self, name: &str) -> Option<(String, Result<i64, BackendError>)> {
        let presence = self.conn.channels(name)?.presence;
        let counted = self
            .conn
            .publish("presence", &presence, SELF_CHECK, self.response_timeout)
            .await;
        Some((presence, counted))
    }

    /// Whether `token` names this backend (under any of its names).
    fn names_me(&self, token: &LeaseToken) -> bool {
        token.holder().is_some_and(|name| {
            name.strip_prefix(self.id.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
        })
    }

    /// How long ago the acquire of the lease with `token` began, while a
    /// flight of this backend holds it (`None` for a lease not held here,
    /// or an anonymous one: its value's age is then unknown).
    pub(super) fn held_for(&self, token: &LeaseToken) -> Option<std::time::Duration> {
        self.held.lock().get(token).map(|since| since.elapsed())
    }

    /// Whether a flight of this backend holds the lease with `token`.
    fn holds(&self, token: &LeaseToken) -> bool {
        self.held.lock().contains_key(token)
    }

    /// Starts watching the holder `holder` names (see the module docs).
    pub(super) async fn watch(
        &self,
        keys: &FillKeys,
        holder: &LeaseToken,
    ) -> Result<Watch, BackendError> {
        let Some(channels) = holder.holder().and_then(|name| self.conn.channels(name)) else {
            return Ok(Watch::Unsupported);
        };
        // Subscribed with the key's channel (the waiter asks for both at
        // once: one `SUBSCRIBE`), and the lease read only once both are in
        // place, so a fill announced after the read is heard.
        let beats = self.pubsub.subscription(channels.beats).await;
        self.pubsub
            .confirmation(keys.channel(), CONFIRM_PATIENCE)
            .await;
        let ask = ask(holder, keys);
        let (lock, receivers) = self
            .conn
            .lease_and_ask(keys, &channels.presence, &ask, self.response_timeout)
            .await?;
        if lock.as_deref() != Some(holder.as_bytes()) {
            return Ok(Watch::Moved);
        }
        if receivers == 0 {
            return Ok(Watch::Gone(Gone::Dead));
        }
        Ok(Watch::Alive(Box::new(Watching::new(
            beats,
            channels.presence,
            ask,
            self.conn.clone(),
            self.response_timeout,
        ))))
    }

    /// Someone waits for this backend under `name`: beat on that name's
    /// channel until nobody receives the beats.
    fn asked(self: &Arc<Self>, name: &str) {
        let mut beating = self.beating.lock();
        let beating = beating.entry(name.to_owned()).or_default();
        beating.asked = true;
        if beating.running {
            return;
        }
        beating.running = true;
        tokio::spawn(beat(Arc::downgrade(self), name.to_owned()));
    }
}

/// A lease request under way (see [`Liveness::acquiring`]).
pub(super) struct Acquiring(Ending);

impl Acquiring {
    /// The request won: the lease is held until its fill or release.
    pub(super) fn won(mut self) {
        self.0.liveness = None;
    }
}

/// Ends a held lease's entry in [`Liveness::held`] when dropped: at the
/// end of its fill or release (or when that step is given up on), or of a
/// request that did not win.
pub(super) struct Ending {
    /// `None` once disarmed.
    liveness: Option<Weak<Liveness>>,
    token: LeaseToken,
}

impl Drop for Ending {
    fn drop(&mut self) {
        if let Some(liveness) = self.liveness.take().and_then(|l| l.upgrade()) {
            liveness.held.lock().remove(&self.token);
        }
    }
}

/// A presence task: answers every ask on the presence channel of `name`,
/// by beating, or, asked about a lease no flight of this backend holds any
/// more, by releasing it; ends with the backend.
async fn answer_asks(
    liveness: Weak<Liveness>,
    name: String,
    // Kept subscribed while the task runs; its payloads come through `asks`.
    _presence: RedisSubscription,
    mut asks: mpsc::Receiver<Vec<u8>>,
    mut stopped: watch::Receiver<()>,
) {
    loop {
        let payload = tokio::select! {
            // The sender is only ever dropped, never sent on.
            _ = stopped.changed() => return,
            payload = asks.recv() => match payload {
                Some(payload) => payload,
                None => return,
            },
        };
        let Some(liveness) = liveness.upgrade() else {
            return;
        };
        if payload == SELF_CHECK.as_bytes() {
            continue;
        }
        match asked_about(&payload) {
            Some((token, keys)) if liveness.names_me(&token) && !liveness.holds(&token) => {
                (liveness.release)(keys, token);
            }
            _ => liveness.asked(&name),
        }
    }
}

/// What a holder publishes on its own presence channel to learn whether
/// the channel's master counts its subscription (see [`names::verify_presence`]);
/// ignored when it comes back.
const SELF_CHECK: &str = "?";

/// The beat task of `name`: a beat every [`BEAT`] while someone receives
/// them or asked since the last one.
async fn beat(liveness: Weak<Liveness>, name: String) {
    let mut every = tokio::time::interval(BEAT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(live) = liveness.upgrade() else {
            return;
        };
        let Some(channels) = live.conn.channels(&name) else {
            return;
        };
        if let Some(beating) = live.beating.lock().get_mut(&name) {
            beating.asked = false;
        }
        let receivers = live
            .conn
            .publish("beat", &channels.beats, "", live.response_timeout)
            .await;
        let mut beating = live.beating.lock();
        let beating = beating.entry(name.clone()).or_default();
        // A beat that failed reached nobody: waiting processes cannot be
        // told anything while the server does not answer, and a server
        // that is down is not sent a beat every tenth of a second.
        if !matches!(receivers, Ok(n) if n > 0) && !beating.asked {
            beating.running = false;
            return;
        }
    }
}
