//! Every call to the backend: bounded by a timeout from when it began,
//! through the circuit breaker of its shard, counted, in a span. The layer
//! every protocol step calls the backend through; it knows nothing of
//! values, leases or flights.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{Backend, FillKeys, Stored};
use crate::circuit::Breakers;
use crate::deadline;
use crate::error::{BackendError, BackendErrorKind};
#[cfg(feature = "redis")]
use crate::marks::{Beside, Judged, Marks};
use crate::stats::Recorder;

/// A cache's way to the backend.
pub(crate) struct Calls {
    pub backend: Arc<dyn Backend>,
    /// `backend`, when it is a `RedisBackend`: called directly for `get`
    /// (see [`Calls::get`]).
    #[cfg(feature = "redis")]
    pub redis: Option<crate::backend::redis::RedisBackend>,
    /// What every read is judged by (`backend` judges its own reads; the
    /// direct Redis `get` is judged here).
    #[cfg(feature = "redis")]
    pub marks: Arc<Marks>,
    /// One circuit breaker per shard of the backend.
    pub breakers: Breakers,
    pub recorder: Recorder,
    /// The cache's backend timeout: a call cut shorter than that (by its
    /// flight's budget) is no evidence against the backend.
    pub timeout: Duration,
}

impl Calls {
    /// The backend's `get` of `keys`, the one call of a hit past the L1. On
    /// a `RedisBackend` it is called directly, not through the trait: an
    /// `async_trait` method boxes its future, which cost a Redis hit an
    /// allocation and a copy of that future (measured with callgrind).
    /// `limit` is the timeout the call is made within, `began` when it
    /// began.
    pub(crate) async fn get(
        &self,
        keys: &FillKeys,
        limit: Duration,
        began: Instant,
    ) -> Result<Option<Stored>, BackendError> {
        #[cfg(feature = "redis")]
        if let Some(redis) = &self.redis {
            // The hit's case, without a future of the judgement's: the
            // marks it needs are held. The others are boxed (rare: a
            // process's first read, a tag's first read after it changed),
            // so they do not grow every hit's future.
            if !self.marks.namespace_held_at(began) {
                return Box::pin(self.get_beside_marks(redis, keys, limit, began)).await;
            }
            let stored = redis.read_within(keys, limit, began).await?;
            let Some(stored) = stored else {
                return Ok(None);
            };
            if let Some(verdict) = self.marks.held_judgement(&stored) {
                return Ok(Marks::apply(stored, verdict));
            }
            let backend = &*self.backend;
            let judged = async move {
                let beside = Beside::default();
                Judged::judge_one(&self.marks, backend, Some(stored), &beside).await
            };
            return Box::pin(judged).await;
        }
        let _ = (limit, began);
        self.backend.get(keys).await
    }

    /// The direct Redis read with the namespace's marks read beside it,
    /// then judged.
    #[cfg(feature = "redis")]
    async fn get_beside_marks(
        &self,
        redis: &crate::backend::redis::RedisBackend,
        keys: &FillKeys,
        limit: Duration,
        began: Instant,
    ) -> Result<Option<Stored>, BackendError> {
        let marks = self.marks.namespace_beside(&self.backend);
        let (stored, beside) =
            futures_util::future::join(redis.read_within(keys, limit, began), marks).await;
        Judged::judge_one(&self.marks, &*self.backend, stored?, &beside).await
    }

    /// The check that `shard` is still the server its calls go to, where
    /// a call may be left on a server that was replaced: a Redis primary
    /// followed across failovers (Sentinel, an endpoint). `None` elsewhere,
    /// and a call's timer then is its deadline alone: a cluster call
    /// follows a moved slot itself (its router retries where `MOVED`
    /// says), and other backends are not replaced under a call.
    fn replaced_check(&self, shard: u64) -> Option<impl FnMut() -> bool + '_> {
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis.as_ref().filter(|r| r.is_standalone()) {
            return Some(move || redis.still_primary(shard));
        }
        let _ = shard;
        #[cfg(not(feature = "redis"))]
        return None::<fn() -> bool>;
        #[cfg(feature = "redis")]
        None
    }

    /// `work` (a read of the backend made outside [`call_with`](Calls::call_with):
    /// the marks' before a call joins a flight), given up if a failover
    /// replaces the primary meanwhile, as a call is: its own limit is all
    /// that would end it on a primary that hung.
    pub(crate) async fn unless_replaced(&self, work: impl Future<Output = ()>) {
        #[cfg(feature = "redis")]
        if let Some(redis) = &self.redis {
            let serves = self.replaced_check(redis.primary_shard());
            let _ = deadline::checked(Instant::now(), Duration::MAX, serves, work).await;
            return;
        }
        work.await;
    }

    /// Calls the backend about `keys` through the circuit breaker of their
    /// shard, bounded by `timeout` (the driver's own timeouts are not
    /// trusted to fire), with counters and a span.
    pub(crate) async fn call<T>(
        &self,
        keys: &FillKeys,
        timeout: Duration,
        op: &'static str,
        fut: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        self.call_with(keys, Instant::now(), timeout, op, move || fut)
            .await
    }

    /// [`call`](Shared::call) with the backend's future made when the
    /// breaker admits the call: the future is then held once in the call's
    /// state (an async fn keeps its arguments for its whole life), which a
    /// hit moves through every layer of its own future. `began`: now, read
    /// once by a caller that needs it too (each read of the clock counts
    /// on a hit).
    pub(crate) async fn call_with<T, F>(
        &self,
        keys: &FillKeys,
        began: Instant,
        timeout: Duration,
        op: &'static str,
        make: impl FnOnce() -> F,
    ) -> Result<T, BackendError>
    where
        F: Future<Output = Result<T, BackendError>>,
    {
        let shard = self.backend.shard(keys);
        let breaker = self.breakers.of(shard);
        let Some(permit) = breaker.admit() else {
            self.recorder.circuit_rejected();
            return Err(BackendError::new(
                BackendErrorKind::CircuitOpen,
                "circuit breaker open",
            ));
        };
        let span = tracing::debug_span!("onefill.backend", op);
        // A call still out when a failover replaces its server is given up
        // then, not at its timeout: that server may hold it to the end.
        let serves = self.replaced_check(shard);
        // Without a subscriber for the span, the call is not wrapped:
        // entering and leaving a disabled span on every poll and drop cost
        // about 400 instructions of a Redis hit (callgrind).
        let answered = if span.is_disabled() {
            deadline::checked(began, timeout, serves, make()).await
        } else {
            deadline::checked(began, timeout, serves, make().instrument(span)).await
        };
        let result = match answered {
            Ok(answer) => answer,
            Err(deadline::Cut::Elapsed) => Err(deadline::timed_out(op, timeout)),
            Err(deadline::Cut::Moved) => Err(deadline::moved(op, began.elapsed())),
        };
        match &result {
            Ok(_) => permit.succeeded(),
            // A write that ran but that too few replicas confirmed: an
            // answer (the server is up), counted apart from the failures.
            Err(e) if e.is_not_replicated() => {
                self.recorder.write_unreplicated(op, e);
                permit.succeeded();
            }
            Err(e) => {
                self.recorder.backend_error(op, e);
                // A non-transient error (a script error, OOM, NOAUTH) is an
                // answer: the server is up, so the breaker closes (and a
                // half-open probe ends) rather than waiting for a success.
                if !e.is_transient() {
                    permit.succeeded();
                } else if e.is_timeout() && timeout < self.timeout || deadline::is_moved(e) {
                    // Cut short by the flight's budget, not a full timeout,
                    // or given up because its server was replaced:
                    // no evidence against the backend (the permit is dropped
                    // unreported; a probe's slot is freed).
                } else if permit.failed() {
                    self.recorder.circuit_opened();
                }
            }
        }
        result
    }
}
