//! The standalone server a backend talks to, followed across failovers:
//! the primary the Sentinels name (`sentinel.rs` does the following), or
//! whatever server a plain [`connect`](super::RedisBackend::connect)'s URL
//! leads to now (a managed service's primary endpoint, whose name moves to
//! the promoted replica: `endpoint.rs`).
//!
//! Everything that opens connections to the server asks this for them: the
//! command connection (a [`ConnectionManager`]) for each call, and the
//! RESP3 client for the push connections (fill notifications, holders'
//! presence, the L1's tracking) at each of their (re)connections. When the
//! primary changes, its epoch moves on: the push connections drop
//! and reconnect to the new primary at once (which empties the L1, as any
//! reconnection of its tracking does: writes the old primary acknowledged
//! may be lost), and each epoch is a shard of its own, so the circuit
//! breaker of the old primary stays behind with it.

use std::sync::Arc;

use parking_lot::RwLock;
use redis::aio::ConnectionManager;
use redis::Client;
use tokio::sync::{watch, Notify};

use crate::error::{BackendError, BackendErrorKind};

/// Where a standalone backend's connections go: the primary of the
/// moment, which a failover changes.
#[derive(Clone)]
pub(super) struct Primary(Arc<Followed>);

/// Who tells a backend that its primary changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Following {
    /// The Sentinels (`sentinel.rs`): any sign of a dead or demoted primary
    /// (a connection failure, `READONLY`, a timeout) makes the follower
    /// ask them.
    Sentinel,
    /// The URL itself (`endpoint.rs`): `READONLY` alone, the one sign that
    /// a connection outlived its server's time as the primary; a server
    /// that fails or hangs is the driver's to reconnect, through the same
    /// URL.
    Endpoint,
}

/// A server's command connections.
#[derive(Clone)]
pub(super) struct Commands {
    /// Every command, unless:
    pub(super) manager: ConnectionManager,
    /// The writes sent with a `WAIT` (`RedisOptions::durability`), when
    /// they ask for replicas: a connection of their own, since the server
    /// holds back every command sent behind a `WAIT` on its connection,
    /// and a replica that is slow or down would hold the hits back too.
    pub(super) durable: Option<ConnectionManager>,
}

/// A primary that can change (see the module docs).
pub(super) struct Followed {
    following: Following,
    current: RwLock<Current>,
    /// The current epoch, for the push connections to follow.
    epoch: watch::Sender<u64>,
    /// Bumped after each look of the follower that moved nothing, so a
    /// call waiting for a move ([`Primary::moved_from`]) stops waiting.
    looked: watch::Sender<u64>,
    /// Calls that met a sign of a demoted or dead primary (a connection
    /// failure, `READONLY`, a timeout) ask the follower to look again.
    /// Shared with the follower, which holds no strong reference while it
    /// waits: the backend's drop ends it at once.
    suspect: Arc<Notify>,
}

/// The primary of one epoch.
#[derive(Clone)]
pub(super) struct Current {
    pub(super) epoch: u64,
    pub(super) commands: Commands,
    pub(super) resp3: Client,
    /// `host:port`, for logs.
    pub(super) addr: String,
}

impl Followed {
    /// Follows from `first` (epoch 1).
    pub(super) fn new(
        following: Following,
        commands: Commands,
        resp3: Client,
        addr: String,
    ) -> Arc<Followed> {
        let first = Current {
            epoch: 1,
            commands,
            resp3,
            addr,
        };
        Arc::new(Followed {
            following,
            current: RwLock::new(first),
            epoch: watch::channel(1).0,
            looked: watch::channel(0).0,
            suspect: Arc::new(Notify::new()),
        })
    }

    pub(super) fn current(&self) -> Current {
        self.current.read().clone()
    }

    /// A new primary: its connections replace the old one's, and the push
    /// connections are told to move. Returns the new epoch.
    pub(super) fn switch(&self, commands: Commands, resp3: Client, addr: String) -> u64 {
        let epoch = {
            let mut current = self.current.write();
            let epoch = current.epoch + 1;
            *current = Current {
                epoch,
                commands,
                resp3,
                addr,
            };
            epoch
        };
        self.epoch.send_replace(epoch);
        epoch
    }

    /// The follower looked and did not move (see [`Primary::moved_from`]).
    pub(super) fn stayed(&self) {
        self.looked.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Notified when a call asks the follower to look again.
    pub(super) fn suspicion(&self) -> Arc<Notify> {
        self.suspect.clone()
    }

    /// Tells of each change of primary; closed once this is dropped (with
    /// its backend).
    pub(super) fn epochs(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }
}

impl Primary {
    /// The connections of `followed`.
    pub(super) fn new(followed: Arc<Followed>) -> Primary {
        Primary(followed)
    }

    /// Who follows it.
    pub(super) fn following(&self) -> Following {
        self.0.following
    }

    /// The command connection (a clone: cheap, it shares the connection).
    pub(super) fn manager(&self) -> ConnectionManager {
        self.0.current.read().commands.manager.clone()
    }

    /// The connection for a write: its own when it waits for replicas (see
    /// [`Commands::durable`]).
    pub(super) fn writer(&self, waits: bool) -> ConnectionManager {
        let current = self.0.current.read();
        match (&current.commands.durable, waits) {
            (Some(durable), true) => durable.clone(),
            _ => current.commands.manager.clone(),
        }
    }

    /// The RESP3 client for a push connection, and the epoch it belongs to.
    pub(super) fn resp3(&self) -> (Client, u64) {
        let current = self.0.current.read();
        (current.resp3.clone(), current.epoch)
    }

    /// Tells of each change of primary.
    pub(super) fn epochs(&self) -> Option<watch::Receiver<u64>> {
        Some(self.0.epoch.subscribe())
    }

    /// The shard a call goes to: the epoch (each primary has a circuit
    /// breaker of its own).
    pub(super) fn shard(&self) -> u64 {
        *self.0.epoch.borrow()
    }

    /// Whether `shard` is the current primary's.
    pub(super) fn serves(&self, shard: u64) -> bool {
        self.shard() == shard
    }

    /// Whether the backend moves on from the primary of `epoch` within
    /// `patience` (at once if it has already); `false` as soon as the
    /// follower has looked and not moved, rather than at the end of
    /// `patience` (a look that began before the call's error may say so
    /// too soon: the call then fails, and the look its error asked for
    /// comes next).
    pub(super) async fn moved_from(&self, epoch: u64, patience: std::time::Duration) -> bool {
        let mut epochs = self.0.epoch.subscribe();
        let mut looks = self.0.looked.subscribe();
        looks.mark_unchanged();
        let moved = tokio::time::timeout(patience, async {
            loop {
                if *epochs.borrow_and_update() != epoch {
                    return true;
                }
                tokio::select! {
                    changed = epochs.changed() => if changed.is_err() { return false },
                    changed = looks.changed() => {
                        if changed.is_err() {
                            return false;
                        }
                        if *epochs.borrow() == epoch {
                            return false;
                        }
                    }
                }
            }
        })
        .await;
        moved.unwrap_or(false)
    }

    /// A call to the server, until [`InFlight::answered`]: under Sentinel,
    /// a call dropped before its answer after [`SLOW_CALL`] or more (a
    /// cache's own timeout, shorter than the response timeout by default,
    /// drops the call rather than failing it) counts as a sign of a dead or
    /// frozen primary, as a timeout does. A call dropped sooner is no sign:
    /// a cache drops calls in its normal course (a waiter woken while it
    /// polls), and each look at the sentinels costs a question to each.
    pub(super) fn in_flight(&self) -> InFlight<'_> {
        match self.0.following {
            Following::Sentinel => InFlight(Some((&*self.0, std::time::Instant::now()))),
            Following::Endpoint => InFlight(None),
        }
    }

    /// A call's error: one that may mean the primary is gone or demoted
    /// asks the follower to look again (at most so often; see
    /// [`Following`] for which errors).
    pub(super) fn saw(&self, error: &BackendError) {
        let suspect = match self.0.following {
            Following::Sentinel => matches!(
                error.kind(),
                BackendErrorKind::Connection | BackendErrorKind::Busy | BackendErrorKind::Timeout
            ),
            Following::Endpoint => is_readonly(error),
        };
        if suspect {
            self.0.suspect.notify_one();
        }
    }
}

/// Whether the server refused a write as a replica (`READONLY`, alone or
/// from inside a script).
pub(super) fn is_readonly(error: &BackendError) -> bool {
    use std::error::Error as _;
    error.kind() == BackendErrorKind::Busy
        && error
            .source()
            .and_then(|source| source.downcast_ref::<redis::RedisError>())
            .is_some_and(is_readonly_reply)
}

/// Whether the driver's error is the server's `READONLY`.
pub(super) fn is_readonly_reply(e: &redis::RedisError) -> bool {
    e.code() == Some("READONLY")
        || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

/// Resolves once `epochs` is closed: the followed primary was dropped
/// with its backend (a follower ends then).
pub(super) async fn closed(epochs: &mut watch::Receiver<u64>) {
    while epochs.changed().await.is_ok() {}
}

/// Whether the server behind `conn` answers `ROLE` as a master.
pub(super) async fn answers_as_master<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    op: &'static str,
    timeout: std::time::Duration,
) -> Result<bool, BackendError> {
    let role: redis::Value =
        super::errors::with_deadline(op, timeout, redis::cmd("ROLE").query_async(conn)).await?;
    Ok(match role {
        redis::Value::Array(parts) => matches!(
            parts.first(),
            Some(redis::Value::BulkString(b)) if b == b"master"
        ),
        _ => false,
    })
}

/// How long a call dropped before its answer must have been in flight to
/// count as a sign of a dead or frozen primary: a server that answers
/// takes well under this (a cache's timeout is 250 ms by default).
const SLOW_CALL: std::time::Duration = std::time::Duration::from_millis(100);

/// A call in flight to a followed primary (see [`Primary::in_flight`]).
pub(super) struct InFlight<'a>(Option<(&'a Followed, std::time::Instant)>);

impl InFlight<'_> {
    /// The call has its answer (whatever it is: errors go to
    /// [`Primary::saw`]).
    pub(super) fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some((followed, sent)) = self.0 {
            if sent.elapsed() >= SLOW_CALL {
                followed.suspect.notify_one();
            }
        }
    }
}
