//! Writes confirmed by replicas: [`Durability`], and the `WAIT` that
//! follows a write when it asks for replicas (decision 0020).
//!
//! Redis replicates asynchronously: a primary answers a write before any
//! replica has it, so a failover (Sentinel, Cluster) can promote a replica
//! that never saw it. With [`Durability::Replicas`], every write of a
//! value or a mark is sent with `WAIT count timeout` right behind it, in
//! one pipeline on the same connection (one round trip; on a cluster,
//! resent with the script to the node a redirection names): `WAIT` answers
//! how many replicas acknowledged every write of that connection so far,
//! once `count` have or the timeout passed. Fewer than `count` is a
//! [`BackendErrorKind::NotReplicated`] error: the write ran on the
//! primary, only its replication is not confirmed.
//!
//! A primary left without enough replicas (a failover promoted the only
//! replica, which has none of its own) would make every write wait out its
//! `WAIT`, and the writes that wait share a connection, which the server
//! holds back behind each `WAIT`: they would queue, their calls time out,
//! and the cache would stop being one. So once a `WAIT` comes back short,
//! writes are sent without one and reported
//! [`NotReplicated`](BackendErrorKind::NotReplicated) at once (they ran;
//! their replication was not waited for), and a `WAIT` of its own, in the
//! background every [`SHORT_FOR`], finds when the replicas are back
//! ([`Shortfall`]): no caller waits for it.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use redis::Pipeline;
use tokio::time::Instant;

use super::errors::with_deadline;
use super::ttl::px;
use crate::error::{BackendError, BackendErrorKind};

/// How many replicas must confirm a write before a
/// [`RedisBackend`](super::RedisBackend) reports it done; set with
/// [`RedisOptions::durability`](super::RedisOptions::durability).
///
/// Covers the writes of values and marks: fills (and the releases that
/// leave a value, a cached failure or a fail-safe copy, behind), `set`,
/// `invalidate`, `expire`, and the marks of `invalidate_tag`,
/// `expire_tag` and `clear`. Leases (`acquire`, `extend`, a release that
/// leaves nothing) are not covered: a lease lost in a failover lets a
/// second process load, and that process's fill and the first one's are
/// each fenced by their own token, so the cost is one load more, never a
/// wrong value.
///
/// ```
/// use std::time::Duration;
/// use onefill::redis::{Durability, RedisOptions};
///
/// let options = RedisOptions::new().durability(Durability::Replicas {
///     count: 1,
///     timeout: Duration::from_millis(50),
/// });
/// # drop(options);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// A write is done when the primary ran it (Redis's own guarantee, and
    /// the default): no `WAIT` is sent. A failover may lose the writes
    /// its replicas had not received yet.
    #[default]
    Primary,
    /// A write is done when the primary ran it and at least `count`
    /// replicas confirmed it, which a `WAIT count timeout` sent right
    /// behind it asks. When fewer confirm within `timeout` the write still
    /// ran on the primary; a `set`, `invalidate`, `expire` or mark returns
    /// [`BackendErrorKind::NotReplicated`](crate::BackendErrorKind::NotReplicated),
    /// and a fill's value is answered all the same; either way the
    /// shortfall is counted in
    /// [`Stats::writes_unreplicated`](crate::Stats::writes_unreplicated).
    ///
    /// `timeout` is at least 1 ms (`WAIT` with 0 would wait for ever) and
    /// at most half the [response
    /// timeout](super::RedisOptions::response_timeout). Keep it, plus
    /// 100 ms, below the cache's
    /// [`backend_timeout`](crate::CacheBuilder::backend_timeout) (250 ms
    /// by default), which bounds the write and its `WAIT` together: an
    /// idle server ends a `WAIT` only at its next tick, up to `1000 / hz`
    /// ms after its timeout (100 ms at Redis's default `hz`), and a `WAIT`
    /// that outlasts the backend timeout makes the write a timeout at the
    /// cache, queued for replay, rather than a reported shortfall. A cache
    /// built on a backend whose timeout does not fit logs a warning.
    /// `count` 0 is [`Primary`](Durability::Primary).
    ///
    /// While a `WAIT` waits, the server holds back the commands sent
    /// after it on the same connection. On a standalone server and under
    /// Sentinel the writes that wait go on a connection of their own, so a
    /// replica that is down or frozen slows those writes alone. On a
    /// cluster they share each master's one connection with its reads: a
    /// read or lease request queued behind a durable write waits until the
    /// `WAIT` ends (decision 0020 has the figures).
    Replicas {
        /// Replicas that must confirm each write (not counting the primary).
        count: u32,
        /// How long the primary waits for them.
        timeout: Duration,
    },
}

/// How late after its timeout an idle Redis may end a `WAIT`: it checks
/// blocked clients' timeouts when its event loop wakes, at the latest at
/// its next `serverCron`, every `1000 / hz` ms (100 ms at the default `hz`
/// of 10). Measured with the replica frozen: a write waiting 10 ms
/// answered after about 100 ms.
const SERVER_TICK: Duration = Duration::from_millis(100);

/// How long after a `WAIT` that came back short the writes are sent
/// without one (see the module docs).
pub(super) const SHORT_FOR: Duration = Duration::from_secs(1);

/// The `WAIT` a write is sent with: replicas to wait for, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Wait {
    replicas: u32,
    timeout: Duration,
    /// `false`: not sent, the primary being short of replicas lately
    /// ([`Shortfall`]); the write is reported unconfirmed.
    sent: bool,
}

/// Whether a write is sent with a `WAIT` behind it.
pub(super) fn sends(wait: Option<Wait>) -> bool {
    wait.is_some_and(|w| w.sent)
}

/// Whether the primary is short of replicas: while it is, writes are sent
/// without their `WAIT`, and a `WAIT` alone, sent in the background every
/// [`SHORT_FOR`] on the connection of the writes that wait, finds when the
/// replicas are back (it answers at once once they have every write of
/// that connection).
#[derive(Default)]
pub(super) struct Shortfall {
    state: Mutex<Short>,
}

#[derive(Default)]
struct Short {
    short: bool,
    /// When the next probe is due, while short.
    probe_at: Option<Instant>,
    /// A probe is under way.
    probing: bool,
}

impl Shortfall {
    /// `wait`, not to be sent while the primary is short of replicas; and
    /// whether a probe is due (the caller sends it, and reports its answer
    /// to [`probed`](Self::probed)).
    pub(super) fn apply(&self, wait: Option<Wait>) -> (Option<Wait>, bool) {
        let Some(wait) = wait else {
            return (None, false);
        };
        let mut state = self.state.lock();
        if !state.short {
            return (Some(wait), false);
        }
        let due = !state.probing && state.probe_at.is_none_or(|at| Instant::now() >= at);
        if due {
            state.probing = true;
        }
        (
            Some(Wait {
                sent: false,
                ..wait
            }),
            due,
        )
    }

    /// A `WAIT` sent behind a write with `wait` answered `acked`.
    pub(super) fn record(&self, wait: Wait, acked: i64) {
        let mut state = self.state.lock();
        if acked >= i64::from(wait.replicas) {
            state.short = false;
        } else if !state.short {
            tracing::warn!(
                acked,
                wanted = wait.replicas,
                "the primary is short of replicas: writes are not waited for (and are reported \
                 unreplicated) until they are back"
            );
            state.short = true;
            state.probe_at = Some(Instant::now() + SHORT_FOR);
        }
    }

    /// A probe of `wait`'s replicas answered `acked` (`None`: it failed).
    pub(super) fn probed(&self, wait: Wait, acked: Option<i64>) {
        let mut state = self.state.lock();
        state.probing = false;
        if acked.is_some_and(|acked| acked >= i64::from(wait.replicas)) {
            if state.short {
                tracing::info!("the primary has its replicas again: writes wait for them again");
            }
            state.short = false;
        } else {
            state.probe_at = Some(Instant::now() + SHORT_FOR);
        }
    }
}

/// Sends `wait`'s `WAIT` alone on `conn` (the connection of the writes
/// that wait), in the background: whether the primary has its replicas
/// again. Reported to `shortfall` (see [`Shortfall::apply`]).
pub(super) fn probe(
    shortfall: &Arc<Shortfall>,
    mut conn: ConnectionManager,
    wait: Wait,
    limit: Duration,
) {
    let shortfall = shortfall.clone();
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime to send it from: the next write's asks again.
        shortfall.probed(wait, None);
        return;
    };
    runtime.spawn(async move {
        let mut pipe = redis::pipe();
        wait.append(&mut pipe);
        let acked: Result<(i64,), _> =
            with_deadline("wait", limit, pipe.query_async(&mut conn)).await;
        shortfall.probed(wait, acked.ok().map(|(acked,)| acked));
    });
}

impl Wait {
    /// The `WAIT` of `durability`, its timeout clamped to 1 ms ..= half of
    /// `response_timeout`; `None` when nothing is waited for.
    pub(super) fn of(durability: Durability, response_timeout: Duration) -> Option<Wait> {
        match durability {
            Durability::Primary | Durability::Replicas { count: 0, .. } => None,
            Durability::Replicas { count, timeout } => {
                let most = (response_timeout / 2).max(Duration::from_millis(1));
                Some(Wait {
                    replicas: count,
                    timeout: timeout.clamp(Duration::from_millis(1), most),
                    sent: true,
                })
            }
        }
    }

    /// How long the primary waits for the replicas.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether a write waiting for its replicas may not answer within
    /// `limit` (the cache's backend timeout): an idle server ends a `WAIT`
    /// at its timeout only at its next tick, up to [`SERVER_TICK`] later,
    /// and the write itself needs a round trip more.
    pub(super) fn outlasts(&self, limit: Duration) -> bool {
        self.timeout + SERVER_TICK >= limit
    }

    /// Appends `WAIT replicas timeout_ms` to `pipe` (never a timeout of 0,
    /// which would block the connection for ever).
    pub(super) fn append(&self, pipe: &mut Pipeline) {
        pipe.cmd("WAIT").arg(self.replicas).arg(px(self.timeout));
    }

    /// The write `op` ran without its `WAIT` (not sent: the primary is short):
    /// its replication is not confirmed.
    pub(super) fn unconfirmed(&self, op: &str) -> BackendError {
        BackendError::new(
            BackendErrorKind::NotReplicated,
            format!(
                "{op}: not waited for: the primary has had fewer than {} replicas since a write \
                 found it short",
                self.replicas
            ),
        )
    }

    /// The write `op` ran; `acked` replicas confirmed it: an error if too
    /// few did.
    pub(super) fn check(&self, op: &str, acked: i64) -> Result<(), BackendError> {
        if acked >= i64::from(self.replicas) {
            return Ok(());
        }
        Err(BackendError::new(
            BackendErrorKind::NotReplicated,
            format!(
                "{op}: {acked} of {} replicas confirmed the write within {:?}",
                self.replicas, self.timeout
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_short_wait_skips_the_waits_until_a_probe_finds_the_replicas_back() {
        let durability = Durability::Replicas {
            count: 1,
            timeout: Duration::from_millis(50),
        };
        let wait = Wait::of(durability, Duration::from_secs(1));
        let shortfall = Shortfall::default();
        assert_eq!(shortfall.apply(wait), (wait, false));
        shortfall.record(wait.unwrap(), 0);
        let (skipped, probe) = shortfall.apply(wait);
        assert!(skipped.is_some() && !sends(skipped) && !probe);
        let err = skipped.unwrap().unconfirmed("fill");
        assert_eq!(err.kind(), BackendErrorKind::NotReplicated);
        tokio::time::advance(SHORT_FOR).await;
        // One probe at a time; the writes are not waited for meanwhile.
        let (skipped, probe) = shortfall.apply(wait);
        assert!(!sends(skipped) && probe);
        assert!(!shortfall.apply(wait).1, "a second probe");
        // Still short: the next probe a while later.
        shortfall.probed(wait.unwrap(), Some(0));
        assert!(!shortfall.apply(wait).1);
        tokio::time::advance(SHORT_FOR).await;
        assert!(shortfall.apply(wait).1);
        shortfall.probed(wait.unwrap(), Some(1));
        assert_eq!(shortfall.apply(wait), (wait, false));
    }

    #[test]
    fn a_wait_is_sent_only_for_replicas_and_never_unbounded() {
        let second = Duration::from_secs(1);
        assert_eq!(Wait::of(Durability::Primary, second), None);
        let none = Durability::Replicas {
            count: 0,
            timeout: second,
        };
        assert_eq!(Wait::of(none, second), None);
        let zero = Durability::Replicas {
            count: 1,
            timeout: Duration::ZERO,
        };
        let wait = Wait::of(zero, second).expect("a wait");
        assert_eq!(wait.timeout, Duration::from_millis(1));
        let mut pipe = redis::pipe();
        wait.append(&mut pipe);
        let packed = String::from_utf8(pipe.get_packed_pipeline()).unwrap();
        assert!(
            packed.ends_with("$4\r\nWAIT\r\n$1\r\n1\r\n$1\r\n1\r\n"),
            "{packed:?}"
        );
        // Longer than half the response timeout: cut to it.
        let long = Durability::Replicas {
            count: 2,
            timeout: Duration::from_secs(5),
        };
        let wait = Wait::of(long, second).expect("a wait");
        assert_eq!(wait.timeout, Duration::from_millis(500));
    }

    #[test]
    fn a_wait_that_may_outlast_the_backend_timeout_is_told() {
        let wait = |ms| {
            let durability = Durability::Replicas {
                count: 1,
                timeout: Duration::from_millis(ms),
            };
            Wait::of(durability, Duration::from_secs(1)).expect("a wait")
        };
        let limit = Duration::from_millis(250);
        assert!(!wait(50).outlasts(limit));
        assert!(!wait(149).outlasts(limit));
        assert!(wait(150).outlasts(limit));
        assert!(wait(400).outlasts(limit));
    }

    #[test]
    fn too_few_confirmations_are_an_error_of_their_own() {
        let wait = Wait {
            replicas: 2,
            timeout: Duration::from_millis(50),
            sent: true,
        };
        assert!(wait.check("set", 2).is_ok());
        assert!(wait.check("set", 3).is_ok());
        let err = wait.check("set", 1).unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::NotReplicated);
        assert!(!err.is_transient());
        assert_eq!(
            err.message(),
            "set: 1 of 2 replicas confirmed the write within 50ms"
        );
    }
}
