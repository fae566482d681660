//! A push connection that stays up: one RESP3 connection to one server,
//! whose pushes (pub/sub messages, tracking invalidations) are handed to
//! the task that owns it. It is what the fill notifications of a
//! standalone server and every L1 tracking connection have in common:
//!
//! - connecting: a multiplexed connection with a push channel of its own
//!   (a dead connection's late pushes cannot be mistaken for the new
//!   one's), bounded by the connection plus the response timeout (the
//!   owner then sets it up: turns tracking on, subscribes);
//! - a `PING` every interval (the first right after connecting if the
//!   owner asks: the L1's tracking confirms itself with it), while the
//!   pushes that come meanwhile are handed over (a slow answer must not
//!   hold back a push already received); the answer comes after every
//!   push the server sent before handling the `PING`, so an answered
//!   `PING` reports when the connection was last known to be complete;
//! - losing it (its pushes end, a `Disconnection` push, a `PING` that fails,
//!   a command of the owner's that fails): down at once, and connected
//!   again after a jittered exponential backoff, so that a fleet that lost
//!   the same server does not reconnect in lockstep; the backoff starts
//!   over once connected.
//!
//! The owner drives it from its own loop: [`PushConnection::due`] says
//! what happened or is due next (it is cancel-safe, so it can sit in the
//! owner's `select!` among the owner's other work), and the owner decides
//! what a push, a loss or a reconnection means for it (a subscriber
//! subscribes its channels again, the L1 empties itself).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ProtocolVersion, PushInfo, PushKind, RedisError, Value,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::errors::{classify, with_deadline};
use super::options::{RedisOptions, MIN_BACKOFF};
use super::primary::Primary;
use crate::backoff::Backoff;
use crate::error::BackendError;

/// What a push connection's owner calls it in errors and logs.
#[derive(Clone, Copy)]
pub(super) struct Names {
    /// Opening the connection.
    pub connect: &'static str,
    /// The health-check `PING`.
    pub ping: &'static str,
}

/// What happened to a [`PushConnection`], or is due.
pub(super) enum Due {
    /// A push from the server (never a `Disconnection`: that is [`Due::Lost`]).
    Push(PushInfo),
    /// The connection dropped; it is down, and reconnects when due.
    Lost,
    /// It is down and may connect again: call [`PushConnection::connect`].
    Connect,
    /// It is up and due a health check: call [`PushConnection::ping`].
    Ping,
}

/// A RESP3 connection whose pushes its owner handles, kept up; see the
/// module docs.
pub(super) struct PushConnection {
    client: Client,
    /// A primary followed across failovers: each connection goes to the
    /// current one, and a change of primary drops the connection at once
    /// (see [`following`](Self::following)).
    following: Option<(Primary, tokio::sync::watch::Receiver<u64>)>,
    options: RedisOptions,
    names: Names,
    conn: Option<MultiplexedConnection>,
    /// The pushes of the current connection.
    pushes: Option<UnboundedReceiver<PushInfo>>,
    /// Paces reconnections; reset once connected.
    backoff: Backoff,
    /// While down: when to connect again.
    retry_at: Instant,
    ping_every: Duration,
    ping_timeout: Duration,
    /// While up: when the next `PING` is due.
    ping: Interval,
    /// The first `PING` right after each connection (see
    /// [`ping_at_connect`](PushConnection::ping_at_connect)).
    ping_at_connect: bool,
    /// What is sent as the `PING` (see [`health_check`](Self::health_check)).
    check: Cmd,
    /// Skip a `PING` when a push came since the last one (see
    /// [`ping_when_quiet`](Self::ping_when_quiet)).
    when_quiet: bool,
    /// A push came since the last `PING` was due.
    heard: bool,
}

impl PushConnection {
    /// A connection to the server of `client` (which must speak RESP3, for
    /// pushes), not yet connected: [`due`](Self::due) says
    /// [`Connect`](Due::Connect) at once. It is pinged every `ping_every`,
    /// each `PING` given `ping_timeout`.
    pub(super) fn new(
        client: Client,
        options: RedisOptions,
        names: Names,
        ping_every: Duration,
        ping_timeout: Duration,
    ) -> PushConnection {
        PushConnection {
            client,
            following: None,
            backoff: Backoff::new(MIN_BACKOFF, options.max_backoff),
            options,
            names,
            conn: None,
            pushes: None,
            retry_at: Instant::now(),
            ping_every,
            ping_timeout,
            ping: ping_interval(ping_every, false),
            ping_at_connect: false,
            check: redis::cmd("PING"),
            when_quiet: false,
            heard: false,
        }
    }

    /// Pings every `every` from now on, each given `timeout` (unchanged:
    /// the schedule goes on as it was).
    pub(super) fn pace(&mut self, every: Duration, timeout: Duration) {
        if (every, timeout) != (self.ping_every, self.ping_timeout) {
            self.ping_every = every;
            self.ping_timeout = timeout;
            self.ping = ping_interval(every, false);
        }
    }

    /// A `PING` only when no push came during the last interval: pushes
    /// arriving show the connection works, for an owner that needs no more
    /// of the `PING` than that (a subscriber, whose messages are the
    /// pushes; not the L1's tracking, which counts its `PING`s as
    /// confirmations).
    pub(super) fn ping_when_quiet(mut self) -> PushConnection {
        self.when_quiet = true;
        self
    }

    /// `cmd` is sent in place of each `PING`: a command answered at once,
    /// after the pushes sent before it, as `PING` is, which can also fail
    /// where a `PING` would not (an owner's way of saying what the server
    /// must still be for its answer to count).
    pub(super) fn health_check(mut self, cmd: Cmd) -> PushConnection {
        self.check = cmd;
        self
    }

    /// The first `PING` right after each connection, not one interval
    /// later: for an owner whose confirmation comes from it (the L1's
    /// tracking may serve only once its connection answered).
    pub(super) fn ping_at_connect(mut self) -> PushConnection {
        self.ping_at_connect = true;
        self.ping = ping_interval(self.ping_every, true);
        self
    }

    /// Connects to `primary`'s current server rather than the client's;
    /// when the primary changes (a followed one, under Sentinel) the
    /// connection counts as lost at once and connects again without
    /// waiting, to the new primary: the owner reacts as to any loss and
    /// reconnection (a subscriber subscribes again, the L1 empties).
    pub(super) fn following(mut self, primary: &Primary) -> PushConnection {
        if let Some(epochs) = primary.epochs() {
            self.following = Some((primary.clone(), epochs));
        }
        self
    }

    /// The connection, while it is up (for the owner's commands).
    pub(super) fn conn(&mut self) -> Option<&mut MultiplexedConnection> {
        self.conn.as_mut()
    }

    /// What happened, or is due next. Cancel-safe: nothing is lost if the
    /// future is dropped before it answers.
    pub(super) async fn due(&mut self) -> Due {
        let following = &mut self.following;
        let moved = async {
            match following {
                // An error: the follower is gone with its backend; wait
                // for nothing more.
                Some((_, epochs)) => {
                    if epochs.changed().await.is_err() {
                        std::future::pending::<()>().await
                    }
                }
                None => std::future::pending().await,
            }
        };
        let (Some(pushes), true) = (self.pushes.as_mut(), self.conn.is_some()) else {
            let moved = tokio::select! {
                _ = tokio::time::sleep_until(self.retry_at) => false,
                _ = moved => true,
            };
            if moved {
                // A new primary: connect to it now, not after the backoff
                // that the old one's failures built up.
                self.backoff.reset();
            }
            return Due::Connect;
        };
        let received = {
            tokio::pin!(moved);
            loop {
                let received = tokio::select! {
                    push = pushes.recv() => Some(Some(push)),
                    _ = self.ping.tick() => Some(None),
                    _ = &mut moved => None,
                };
                if matches!(received, Some(None))
                    && self.when_quiet
                    && std::mem::take(&mut self.heard)
                {
                    continue;
                }
                break received;
            }
        };
        match received {
            // The primary changed: this connection is the old one's.
            None => {
                self.moved();
                Due::Lost
            }
            Some(None) => Due::Ping,
            Some(Some(Some(push))) if push.kind != PushKind::Disconnection => {
                self.heard = true;
                Due::Push(push)
            }
            Some(Some(_)) => {
                self.lost();
                Due::Lost
            }
        }
    }

    /// Connects. Down with a retry scheduled if it fails.
    ///
    /// A followed primary that moves while this connects to the old one is
    /// connected to at once: a hung old primary accepts the connection and
    /// then answers nothing until the connection timeout (a second, by
    /// default), which would keep this connection's owner (the waiters'
    /// notifications, the L1) on a server that is gone for that long.
    pub(super) async fn connect(&mut self) -> Result<(), BackendError> {
        self.conn = None;
        self.pushes = None;
        let opened = loop {
            // The primary connected to now: a change seen from here on is
            // a move away from it.
            let client = match self.following.as_mut() {
                Some((primary, epochs)) => {
                    epochs.borrow_and_update();
                    primary.resp3().0
                }
                None => self.client.clone(),
            };
            let opening = open(client, &self.options, self.names.connect);
            let Some((_, epochs)) = self.following.as_mut() else {
                break opening.await;
            };
            tokio::pin!(opening);
            let moved = tokio::select! {
                opened = &mut opening => break opened,
                changed = epochs.changed() => changed.is_ok(),
            };
            if !moved {
                // The follower is gone with its backend: nothing moves.
                break opening.await;
            }
        };
        match opened {
            Ok((conn, pushes)) => {
                self.conn = Some(conn);
                self.pushes = Some(pushes);
                // The next loss of this connection is retried quickly again.
                self.backoff.reset();
                self.ping = ping_interval(self.ping_every, self.ping_at_connect);
                self.heard = false;
                Ok(())
            }
            Err(e) => {
                self.retry_later();
                Err(e)
            }
        }
    }

    /// Sends a `PING`, handing `on_push` the pushes that come before its
    /// answer (those received while it is out, then those already queued
    /// when it answers). Returns when it was sent: every push the server
    /// sent before then has been handed over. If it fails, the connection
    /// is down (a retry scheduled).
    pub(super) async fn ping(
        &mut self,
        mut on_push: impl FnMut(PushInfo),
    ) -> Result<Instant, BackendError> {
        let PushConnection {
            conn,
            pushes,
            following,
            check,
            names,
            ping_timeout,
            ..
        } = self;
        let (Some(conn), Some(pushes)) = (conn.as_mut(), pushes.as_mut()) else {
            return Err(disconnected(names.ping));
        };
        let sent = Instant::now();
        let mut moved = false;
        let answered = {
            let ping = with_deadline(names.ping, *ping_timeout, check.query_async::<Value>(conn));
            tokio::pin!(ping);
            // A followed primary that moves meanwhile ends the `PING`: this
            // connection is the old primary's, and a hung one would keep
            // its owner there until the `PING` timed out.
            let changed = async {
                if let Some((_, epochs)) = following.as_mut() {
                    if epochs.changed().await.is_ok() {
                        return;
                    }
                }
                std::future::pending::<()>().await
            };
            tokio::pin!(changed);
            loop {
                tokio::select! {
                    biased;
                    answer = &mut ping => break answer.map(drop),
                    push = pushes.recv() => match push {
                        Some(push) if push.kind != PushKind::Disconnection => on_push(push),
                        _ => break Err(disconnected(names.ping)),
                    },
                    () = &mut changed => {
                        moved = true;
                        break Err(disconnected(names.ping));
                    }
                }
            }
        };
        if moved {
            self.moved();
            return answered.map(|()| sent);
        }
        let answered = answered.and_then(|()| {
            while let Ok(push) = pushes.try_recv() {
                if push.kind == PushKind::Disconnection {
                    return Err(disconnected(self.names.ping));
                }
                on_push(push);
            }
            Ok(sent)
        });
        if answered.is_err() {
            self.lost();
        }
        answered
    }

    /// The followed primary changed: the connection is the old one's, down
    /// and connected again at once, to the new one (not after the backoff
    /// the old one's failures built up).
    fn moved(&mut self) {
        self.conn = None;
        self.pushes = None;
        self.backoff.reset();
        self.retry_at = Instant::now();
    }

    /// The connection is unusable (a command of the owner's failed on it,
    /// or it dropped): down, and connected again after the backoff. Does
    /// nothing while it is down already.
    pub(super) fn lost(&mut self) {
        if self.conn.take().is_some() {
            self.pushes = None;
            self.retry_later();
        }
    }

    /// Schedules the next connection attempt. The interval never exceeds
    /// [`RedisOptions::max_backoff`], as documented there.
    fn retry_later(&mut self) {
        let wait = self.backoff.next_interval().min(self.options.max_backoff);
        let now = Instant::now();
        // A `max_backoff` of centuries must not panic on overflow: a year
        // is as good as never.
        self.retry_at = now
            .checked_add(wait)
            .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600));
    }
}

/// A multiplexed RESP3 connection of `client` whose pushes come to the
/// receiver returned, bounded by the connection plus the response timeout.
async fn open(
    client: Client,
    options: &RedisOptions,
    op: &'static str,
) -> Result<(MultiplexedConnection, UnboundedReceiver<PushInfo>), BackendError> {
    let (tx, rx) = unbounded_channel();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.connection_timeout))
        .set_response_timeout(Some(options.response_timeout))
        .set_push_sender(tx);
    let limit = options
        .connection_timeout
        .saturating_add(options.response_timeout);
    let connecting = client.get_multiplexed_async_connection_with_config(&config);
    let conn = with_deadline(op, limit, connecting).await?;
    Ok((conn, rx))
}

/// A `PING` every `every`, the first right away if `at_once`, else one
/// interval from now; a late one is not made up for.
fn ping_interval(every: Duration, at_once: bool) -> Interval {
    let start = if at_once {
        tokio::time::Instant::now()
    } else {
        tokio::time::Instant::now() + every
    };
    let mut interval = tokio::time::interval_at(start, every);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    interval
}

/// A RESP3 client (which pushes need) for the server `client` points to.
pub(super) fn resp3(client: &Client) -> Result<Client, RedisError> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Client::open(info.set_redis_settings(settings))
}

/// The error of a command on a connection that is down.
pub(super) fn disconnected(op: &'static str) -> BackendError {
    let disconnected = std::io::Error::new(std::io::ErrorKind::NotConnected, "disconnected");
    classify(op, RedisError::from(disconnected))
}
