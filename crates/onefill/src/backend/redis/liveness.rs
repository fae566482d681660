//! Whether a lease's holder is alive, on a standalone server (decision
//! 0015): a waiter learns that the process holding a lease died within
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

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::errors::with_deadline;
use super::primary::Primary;
use super::subscriber::{PubSubShared, RedisSubscription, CONFIRM_PATIENCE};
use crate::backend::{BackendError, FillKeys, FillSubscription, Gone, HolderWatch, Watch};
use crate::token::LeaseToken;

/// How often a holder beats while someone waits for it.
pub(super) const BEAT: Duration = Duration::from_millis(90);
/// How late a beat may be before a waiter asks whether the holder's
/// connection is still there.
pub(super) const BEAT_SLACK: Duration = Duration::from_millis(10);
/// How long a holder whose connection is there may stay silent before it
/// is taken for frozen.
pub(super) const FROZEN_AFTER: Duration = Duration::from_secs(1);
/// How long `connect` waits for the presence channel's confirmation
/// before it returns anyway (leases are anonymous until it comes).
const PRESENCE_PATIENCE: Duration = Duration::from_millis(500);

/// How many asks a holder keeps unread before it drops the newest (their
/// waiters ask again when no beat comes).
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

/// The presence channel of the backend named `id`.
fn presence(id: &str) -> String {
    format!("onefill:holder:{id}")
}

/// The beats channel of the backend named `id`.
fn beats(id: &str) -> String {
    format!("onefill:holder:{id}:beats")
}

/// One standalone backend's liveness: its name, its presence, its beats.
pub(super) struct Liveness {
    id: String,
    pubsub: Arc<PubSubShared>,
    conn: Primary,
    response_timeout: Duration,
    beating: Mutex<Beating>,
    /// The tokens of the leases this backend's flights hold: from before
    /// the acquire that won was sent to the end of the fill or release
    /// that ended it.
    held: Mutex<HashSet<LeaseToken>>,
    /// What an ask about a lease no flight holds any more does.
    release: Release,
    /// Dropped with the backend: ends the presence task.
    _stop: oneshot::Sender<()>,
}

#[derive(Default)]
struct Beating {
    /// A beat task runs.
    running: bool,
    /// Someone asked since the last beat.
    asked: bool,
}

impl Liveness {
    /// Names the backend and subscribes its presence channel (waiting up
    /// to half a second for the confirmation).
    pub(super) async fn start(
        pubsub: Arc<PubSubShared>,
        conn: Primary,
        response_timeout: Duration,
        release: Release,
    ) -> Arc<Liveness> {
        let id = format!("{:016x}", rand::random::<u64>());
        let (stop, stopped) = oneshot::channel();
        let liveness = Arc::new(Liveness {
            id,
            pubsub,
            conn,
            response_timeout,
            beating: Mutex::new(Beating::default()),
            held: Mutex::new(HashSet::new()),
            release,
            _stop: stop,
        });
        let (subscription, asks) = liveness
            .pubsub
            .subscription_with_inbox(presence(&liveness.id), ASKS_UNREAD)
            .await;
        tokio::spawn(answer_asks(
            Arc::downgrade(&liveness),
            subscription,
            asks,
            stopped,
        ));
        liveness
            .pubsub
            .confirmation(&presence(&liveness.id), PRESENCE_PATIENCE)
            .await;
        liveness
    }

    /// A token naming this backend, while its presence channel is
    /// confirmed; else an anonymous one (its waiters then rely on the
    /// lease's expiry).
    pub(super) fn new_token(&self) -> LeaseToken {
        if self.pubsub.confirmed(&presence(&self.id)) {
            LeaseToken::for_holder(&self.id)
        } else {
            LeaseToken::random()
        }
    }

    /// A flight of this backend asks for the lease with `token`: held from
    /// before the request is sent (a waiter may ask about it as soon as the
    /// server has set it, before its answer is back here) until the guard
    /// is dropped, unless [`Acquiring::won`] keeps it.
    pub(super) fn acquiring(self: &Arc<Self>, token: &LeaseToken) -> Acquiring {
        if token.holder().is_some() {
            self.held.lock().insert(token.clone());
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

    /// Whether a flight of this backend holds the lease with `token`.
    fn holds(&self, token: &LeaseToken) -> bool {
        self.held.lock().contains(token)
    }

    /// Starts watching the holder `holder` names (see the module docs).
    pub(super) async fn watch(
        &self,
        keys: &FillKeys,
        holder: &LeaseToken,
    ) -> Result<Watch, BackendError> {
        let Some(id) = holder.holder() else {
            return Ok(Watch::Unsupported);
        };
        // Subscribed with the key's channel (the waiter asks for both at
        // once: one `SUBSCRIBE`), and the lease read only once both are in
        // place, so a fill announced after the read is heard.
        let beats = self.pubsub.subscription(beats(id)).await;
        self.pubsub
            .confirmation(keys.channel(), CONFIRM_PATIENCE)
            .await;
        let ask = ask(holder, keys);
        let mut pipe = redis::pipe();
        pipe.cmd("GET")
            .arg(keys.lock())
            .cmd("PUBLISH")
            .arg(presence(id))
            .arg(&ask);
        let mut conn = self.conn.manager();
        let (lock, receivers): (Option<Vec<u8>>, i64) = with_deadline(
            "watch holder",
            self.response_timeout,
            pipe.query_async(&mut conn),
        )
        .await?;
        if lock.as_deref() != Some(holder.as_bytes()) {
            return Ok(Watch::Moved);
        }
        if receivers == 0 {
            return Ok(Watch::Gone(Gone::Dead));
        }
        Ok(Watch::Alive(Box::new(Watching {
            beats,
            presence: presence(id),
            ask,
            conn: self.conn.clone(),
            response_timeout: self.response_timeout,
            last_beat: Instant::now(),
            asked_since_beat: false,
        })))
    }

    /// Someone waits for this backend: beat until nobody receives the
    /// beats.
    fn asked(self: &Arc<Self>) {
        let mut beating = self.beating.lock();
        beating.asked = true;
        if beating.running {
            return;
        }
        beating.running = true;
        tokio::spawn(beat(Arc::downgrade(self)));
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

/// The presence task: answers every ask on the presence channel, by
/// beating, or, asked about a lease no flight of this backend holds any
/// more, by releasing it; ends with the backend.
async fn answer_asks(
    liveness: Weak<Liveness>,
    // Kept subscribed while the task runs; its payloads come through `asks`.
    _presence: RedisSubscription,
    mut asks: mpsc::Receiver<Vec<u8>>,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        let payload = tokio::select! {
            _ = &mut stopped => return,
            payload = asks.recv() => match payload {
                Some(payload) => payload,
                None => return,
            },
        };
        let Some(liveness) = liveness.upgrade() else {
            return;
        };
        match asked_about(&payload) {
            Some((token, keys))
                if token.holder() == Some(liveness.id.as_str()) && !liveness.holds(&token) =>
            {
                (liveness.release)(keys, token);
            }
            _ => liveness.asked(),
        }
    }
}

/// The beat task: a beat every [`BEAT`] while someone receives them or
/// asked since the last one.
async fn beat(liveness: Weak<Liveness>) {
    let mut every = tokio::time::interval(BEAT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(live) = liveness.upgrade() else {
            return;
        };
        live.beating.lock().asked = false;
        let mut conn = live.conn.manager();
        let publish = redis::cmd("PUBLISH").arg(beats(&live.id)).arg("").clone();
        let receivers: Result<i64, _> = with_deadline(
            "beat",
            live.response_timeout,
            publish.query_async(&mut conn),
        )
        .await;
        let mut beating = live.beating.lock();
        // A beat that failed reached nobody: waiting processes cannot be
        // told anything while the server does not answer, and a server
        // that is down is not sent a beat every tenth of a second.
        if !matches!(receivers, Ok(n) if n > 0) && !beating.asked {
            beating.running = false;
            return;
        }
    }
}

/// A waiter's watch of one holder.
struct Watching {
    beats: RedisSubscription,
    presence: String,
    /// What it publishes there: the lease it waits on.
    ask: String,
    conn: Primary,
    response_timeout: Duration,
    last_beat: Instant,
    /// Asked the holder's presence since its last beat (it was there).
    asked_since_beat: bool,
}

impl Watching {
    /// Whether the holder's connection is still subscribed to its presence
    /// channel (`None`: the server did not answer).
    async fn present(&self) -> Option<bool> {
        let mut conn = self.conn.manager();
        let publish = redis::cmd("PUBLISH")
            .arg(&self.presence)
            .arg(&self.ask)
            .clone();
        let asked: Result<i64, _> = with_deadline(
            "watch holder",
            self.response_timeout,
            publish.query_async(&mut conn),
        )
        .await;
        asked.ok().map(|receivers| receivers > 0)
    }
}

#[async_trait]
impl HolderWatch for Watching {
    async fn gone(&mut self) -> Option<Gone> {
        loop {
            let due = if self.asked_since_beat {
                self.last_beat + FROZEN_AFTER
            } else {
                self.last_beat + BEAT + BEAT_SLACK
            };
            tokio::select! {
                () = self.beats.notified() => {
                    if self.beats.is_confirmed() {
                        self.last_beat = Instant::now();
                        self.asked_since_beat = false;
                    }
                    continue;
                }
                () = tokio::time::sleep_until(due) => {}
            }
            // Woken a beat or more after it was due: this process was not
            // running (a blocked executor, a stalled machine), so the beats
            // that came meanwhile may not have been read yet. Its own stall
            // is no silence of the holder's: listen afresh.
            if Instant::now() >= due + BEAT {
                self.last_beat = Instant::now();
                self.asked_since_beat = false;
                continue;
            }
            // Silence is a verdict only if the beats could have come.
            if !self.beats.is_confirmed() {
                return None;
            }
            if self.asked_since_beat {
                return Some(Gone::Frozen);
            }
            match self.present().await {
                Some(true) => self.asked_since_beat = true,
                Some(false) => return Some(Gone::Dead),
                None => return None,
            }
        }
    }
}
