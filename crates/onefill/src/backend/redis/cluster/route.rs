//! Running a command on the master of its slot: following `MOVED` and
//! `ASK`, retrying a busy cluster within the response timeout, and
//! counting a node that does not answer against it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{ErrorKind, RedisError};
use tokio::time::Instant;

use super::node::{with_host_of, Node};
use super::reaction::{is_try_again, Reaction};
use super::{ClusterRouter, RouterInner};

/// The first pause before a command answered `TRYAGAIN`/`CLUSTERDOWN` is
/// sent again (doubling, up to [`RETRY_PAUSE_MAX`]).
const RETRY_PAUSE: Duration = Duration::from_millis(5);
const RETRY_PAUSE_MAX: Duration = Duration::from_millis(100);
/// Redirections followed for one command before giving up (a loop of
/// `MOVED` between two nodes that disagree).
const MAX_REDIRECTS: u32 = 8;
/// A command abandoned by its caller after this long without an answer
/// counts as unanswered (the cache's backend timeout usually fires before
/// the driver's). One abandoned sooner says nothing about the node: a
/// healthy Redis answers in well under a millisecond.
pub(super) const ABANDONED_AFTER: Duration = Duration::from_millis(100);

impl ClusterRouter {
    /// Runs `op` on a connection to the master of `slot`, following
    /// redirections and retrying transient cluster states (see the module
    /// docs). `op`'s flag says it runs after an `ASK`: each of its commands
    /// must be sent right after an `ASKING`, in one pipeline (the
    /// connection is shared; a pipeline is written in one piece).
    pub(in super::super) async fn run<T, F, Fut>(&self, slot: u16, op: F) -> Result<T, RedisError>
    where
        F: Fn(MultiplexedConnection, bool) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.route(slot, true, op).await
    }

    /// [`run`](Self::run), but a `TRYAGAIN` (a multi-key command whose
    /// keys a migrating slot has split, or that are missing on the
    /// importing node) is handed back at once: it lasts as long as the
    /// migration, which a retry within the response timeout rarely
    /// outlives, and the caller has a way without it.
    pub(in super::super) async fn run_unless_split<T, F, Fut>(
        &self,
        slot: u16,
        op: F,
    ) -> Result<T, RedisError>
    where
        F: Fn(MultiplexedConnection, bool) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        self.route(slot, false, op).await
    }

    async fn route<T, F, Fut>(&self, slot: u16, retry_split: bool, op: F) -> Result<T, RedisError>
    where
        F: Fn(MultiplexedConnection, bool) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let inner = &self.inner;
        let started = Instant::now();
        let mut redirect: Option<(Arc<Node>, bool)> = None;
        let mut redirects = 0;
        let mut pause = RETRY_PAUSE;
        loop {
            let (node, asking) = match redirect.take() {
                Some(target) => target,
                None => match inner.owner(slot) {
                    Some(node) => (node, false),
                    None => {
                        inner.refresh.notify_one();
                        return Err(unrouted(slot));
                    }
                },
            };
            // Armed until the node answers: a call abandoned without an
            // answer for long enough counts as unanswered.
            let mut attempt = Attempt::start(inner, &node);
            let (result, generation) = match node.connection().await {
                Ok((generation, conn)) => {
                    attempt.generation = Some(generation);
                    (op(conn, asking).await, Some(generation))
                }
                Err(e) => (Err(e), None),
            };
            attempt.disarm();
            let error = match result {
                Ok(value) => {
                    node.answered();
                    return Ok(value);
                }
                Err(error) => error,
            };
            let reaction = Reaction::to(&error);
            if let Reaction::Unreachable { dropped } = reaction {
                if dropped {
                    if let Some(generation) = generation {
                        node.drop_connection(generation);
                    }
                }
                tracing::debug!(node = %node.addr, error = %error, "redis cluster node unreachable");
                inner.unanswered(&node, generation);
                return Err(error);
            }
            // Any other error is an answer: the node is up.
            node.answered();
            match reaction {
                Reaction::Redirect { addr, ask } => {
                    if redirects >= MAX_REDIRECTS {
                        return Err(error);
                    }
                    redirects += 1;
                    let addr = with_host_of(&addr, &node.addr);
                    let target = inner.node(&addr).map_err(|_| error)?;
                    if !ask {
                        inner.learned(slot, &target);
                    }
                    redirect = Some((target, ask));
                }
                Reaction::Retry { .. } if !retry_split && is_try_again(&error) => {
                    return Err(error);
                }
                Reaction::Retry { refresh } => {
                    // The cluster is busy (or its map is changing).
                    if refresh {
                        inner.refresh.notify_one();
                    }
                    if started.elapsed() + pause > inner.options.response_timeout {
                        return Err(error);
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_PAUSE_MAX);
                }
                Reaction::Unreachable { .. } | Reaction::Fail => return Err(error),
            }
        }
    }
}

/// One attempt of a command on a node, armed until it is answered: dropped
/// unanswered after [`ABANDONED_AFTER`] (the caller gave up waiting), it
/// counts against the node as a timeout would have.
struct Attempt<'a> {
    pub(super) router: &'a RouterInner,
    pub(super) node: Option<&'a Arc<Node>>,
    pub(super) generation: Option<u64>,
    started: Instant,
}

impl<'a> Attempt<'a> {
    pub(super) fn start(router: &'a RouterInner, node: &'a Arc<Node>) -> Self {
        Attempt {
            router,
            node: Some(node),
            generation: None,
            started: Instant::now(),
        }
    }
    fn disarm(&mut self) {
        self.node = None;
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            if self.started.elapsed() >= ABANDONED_AFTER {
                self.router.unanswered(node, self.generation);
            }
        }
    }
}

fn unrouted(slot: u16) -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "no master known for the slot",
        format!("slot {slot}"),
    ))
}
