//! The batch call: many keys, each through the one per-key protocol, their
//! steps made together.
//!
//! [`Cache::get_or_load_many`](crate::Cache::get_or_load_many) answers
//! every key as [`get_or_load`](crate::Cache::get_or_load) would, because
//! every key runs the same protocol: a [`Flight`] of its own, joined to
//! the process's flight of the key exactly as a single call's (a single
//! call and a batch on the same key share one flight, whoever comes
//! first). The batch is a driver, not a second protocol: it runs its
//! flights side by side in one task and, through the [`Group`] they share,
//! makes the steps they take at the same moment together:
//!
//! ```text
//! the flights' first reads ─────────► one get_many (a pipeline per shard)
//! the misses' lease requests ───────► one acquire_many
//! the loads of the keys won, and of the keys loaded unstored
//!   (the backend failed them; `no_lease` found them held) ─► one loader call
//! the keys other processes hold: each flight waits for its own holder;
//!   flights woken together re-read, re-ask and take over together
//! refreshes after the answers (stale in grace, early, the L1's stale
//!   entries): one lease request, one load
//! ```
//!
//! Steps are due "at the same moment" when every flight of the batch is
//! waiting (on a step, a fill notification, a timer): the batch's task
//! then makes every step queued since the last round. That is the whole
//! of the grouping; what a step's answer means is the flight's business.
//!
//! The batch runs in a task of its own (as a single call's flight does):
//! dropping the caller's future cancels neither a load nor a lease, and
//! the keys' other callers still get their answers.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use parking_lot::Mutex;
use tracing::Instrument;

use crate::answer::{Answer, Fetched};
use crate::backend::{
    BackendError, BackendErrorKind, FillKeys, LeaseRequest, Stored, MAX_PIPELINE,
};
use crate::coalesce::{Awaiter, Joined};
use crate::error::{Error, LoaderError};
use crate::flight::Flight;
use crate::group::{Group, Reply};
use crate::lease::Acquisition;
use crate::loader::{self, Done, Load, Loaded};
use crate::options::Policy;
use crate::shared::Shared;
use crate::token::LeaseToken;

/// The caller's batch loader, type-erased: the keys to load, and what it
/// found, each value with the freshness its loader chose (a key it did not
/// return is absent).
pub(crate) type ManyLoader<K, V> = Arc<
    dyn Fn(Vec<K>) -> Pin<Box<dyn Future<Output = Result<Found<K, V>, LoaderError>> + Send>>
        + Send
        + Sync,
>;

/// What a batch loader found.
pub(crate) type Found<K, V> = Vec<(K, Loaded<V>)>;

/// One key's answer in a batch.
pub(crate) type KeyAnswer<V> = Result<Fetched<Option<V>>, Error>;

/// A key's answer to await, and whether the key joined another call's
/// flight.
pub(crate) type Answering<V> = (Awaiter<Answer<V>>, bool);

/// A batch: one policy and one loader for its keys.
pub(crate) struct Batch<K, V> {
    pub(crate) shared: Arc<Shared<V>>,
    pub(crate) policy: Policy,
    pub(crate) loader: ManyLoader<K, V>,
}

/// A flight's future, or a step's, as the batch's task polls it.
type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

impl<K, V> Batch<K, V>
where
    K: std::fmt::Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Starts the batch in a task of its own: a flight for each of `keys`
    /// (distinct and valid, with their string form) that no call of this
    /// process is answering already, and the background refresh of each of
    /// `stale` (keys the L1 served stale). Returns each of `keys`' answers
    /// to await, in order.
    pub(crate) fn start(
        self,
        keys: Vec<(K, String)>,
        stale: Vec<(K, String)>,
    ) -> Vec<Answering<V>> {
        let Batch {
            shared,
            policy,
            loader,
        } = self;
        let strings = keys.iter().chain(&stale);
        let together = Arc::new(Together {
            keys: strings.map(|(k, s)| (s.clone(), k.clone())).collect(),
            shared: shared.clone(),
            policy,
            loader,
            queue: Mutex::default(),
        });
        let group: Arc<dyn Group<V>> = together.clone();
        let call = tracing::Span::current();
        let mut flights: Vec<Task> = Vec::new();
        let mut answers = Vec::with_capacity(keys.len());
        for (key, string) in &keys {
            match shared.flights.join(string) {
                Joined::Follower(awaiter) => {
                    shared.recorder.coalesced();
                    answers.push((awaiter, true));
                }
                Joined::Leader(completion) => {
                    answers.push((completion.awaiter(), false));
                    let flight = together.flight(key, string).in_group(group.clone());
                    flights.push(Box::pin(flight.drive(None, completion, call.clone())));
                }
            }
        }
        for (key, string) in &stale {
            let flight = together.flight(key, string).in_group(group.clone());
            flights.push(Box::pin(flight.refresh_stale()));
        }
        if !flights.is_empty() {
            tokio::spawn(Box::pin(together.run(flights).instrument(call)));
        }
        answers
    }
}

/// The flights of one batch, and the steps they queued for the next round.
struct Together<K, V> {
    shared: Arc<Shared<V>>,
    policy: Policy,
    loader: ManyLoader<K, V>,
    /// The batch's keys, by their string form: what a flight's load is
    /// made of.
    keys: HashMap<String, K>,
    queue: Mutex<Queue<V>>,
}

/// The steps queued since the last round.
struct Queue<V> {
    reads: Vec<ReadStep>,
    acquires: Vec<AcquireStep>,
    loads: Vec<LoadStep<V>>,
}

impl<V> Default for Queue<V> {
    fn default() -> Self {
        Queue {
            reads: Vec::new(),
            acquires: Vec::new(),
            loads: Vec::new(),
        }
    }
}

impl<V> Queue<V> {
    fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.acquires.is_empty() && self.loads.is_empty()
    }
}

/// A read queued by a flight: its keys, the time it has, where to answer.
type ReadStep = (
    FillKeys,
    Duration,
    Reply<Result<Option<Stored>, BackendError>>,
);

/// A load queued by a flight: its user key, where to answer (each key
/// gets its own value's `Loaded`: its freshness, or `no_store`).
type LoadStep<V> = (String, Reply<Result<Done<V>, Error>>);

/// A lease request queued by a flight.
struct AcquireStep {
    request: LeaseRequest,
    lease_ttl: Duration,
    timeout: Duration,
    reply: Reply<Result<Acquisition, BackendError>>,
}

impl<K, V> Group<V> for Together<K, V>
where
    K: Send + Sync,
    V: Send + Sync,
{
    fn read(
        &self,
        keys: &FillKeys,
        timeout: Duration,
        reply: Reply<Result<Option<Stored>, BackendError>>,
    ) {
        self.queue.lock().reads.push((keys.clone(), timeout, reply));
    }

    fn acquire(
        &self,
        keys: &FillKeys,
        token: LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
        timeout: Duration,
        reply: Reply<Result<Acquisition, BackendError>>,
    ) {
        let request = LeaseRequest::new(keys.clone(), token, refresh_window);
        self.queue.lock().acquires.push(AcquireStep {
            request,
            lease_ttl,
            timeout,
            reply,
        });
    }

    fn load(&self, key: &str, reply: Reply<Result<Done<V>, Error>>) {
        self.queue.lock().loads.push((key.to_owned(), reply));
    }
}

impl<K, V> Together<K, V>
where
    K: std::fmt::Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The flight of `key` (its string form `string`), with the batch's
    /// policy. Its own loader (the batch loader with that key alone) is
    /// never called while the flight is in the batch's group; it is there
    /// because a flight always owns its one load.
    fn flight(&self, key: &K, string: &str) -> Flight<V> {
        let loader = self.loader.clone();
        let key = key.clone();
        let wanted = string.to_owned();
        let load: Load<V> = Box::new(move || {
            Box::pin(async move {
                let found = loader(vec![key]).await?;
                let loaded = found
                    .into_iter()
                    .find(|(k, _)| crate::key::display(k).ok().as_deref() == Some(&wanted))
                    .map_or_else(|| Loaded::new(None), |(_, v)| v.map(Some));
                Ok(loaded)
            })
        });
        let fill_keys = FillKeys::new(&self.shared.namespace, string);
        let policy = self.policy.clone();
        Flight::new(
            self.shared.clone(),
            string.to_owned(),
            fill_keys,
            policy,
            load,
        )
    }

    /// Polls every flight until each waits, then makes the steps they
    /// queued, round after round, until every flight has ended.
    async fn run(self: Arc<Self>, flights: Vec<Task>) {
        let mut flights: FuturesUnordered<Task> = flights.into_iter().collect();
        let mut steps: FuturesUnordered<Task> = FuturesUnordered::new();
        // Unconstrained by tokio's cooperative budget: a resource that finds
        // the budget spent wakes its task only after the task yields, which
        // the check below cannot see, so a round would be made while
        // flights could still go on (and split into rounds of 128).
        // FuturesUnordered yields by itself after polling each flight once.
        let rounds = std::future::poll_fn(|cx| loop {
            // Whether anything woke a flight while they were polled: then
            // one of them can still go on (and queue a step) before the
            // round is made, and the task is polled again at once.
            let woken = Arc::new(Woken {
                flag: AtomicBool::new(false),
                task: cx.waker().clone(),
            });
            let waker = Waker::from(woken.clone());
            let mut flights_cx = Context::from_waker(&waker);
            while let Poll::Ready(Some(())) = flights.poll_next_unpin(&mut flights_cx) {}
            while let Poll::Ready(Some(())) = steps.poll_next_unpin(cx) {}
            if woken.flag.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
            // Every flight waits: this round's steps are all queued.
            let queue = std::mem::take(&mut *self.queue.lock());
            if queue.is_empty() {
                return if flights.is_empty() && steps.is_empty() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                };
            }
            steps.extend(self.clone().steps(queue));
        });
        tokio::task::unconstrained(rounds).await;
    }

    /// The round's steps, one task each: one read of every key queued,
    /// one lease request, one load.
    fn steps(self: Arc<Self>, queue: Queue<V>) -> Vec<Task> {
        let Queue {
            reads,
            acquires,
            loads,
        } = queue;
        let mut steps: Vec<Task> = Vec::new();
        if !reads.is_empty() {
            let this = self.clone();
            steps.push(Box::pin(async move { this.read_all(reads).await }));
        }
        if !acquires.is_empty() {
            let this = self.clone();
            steps.push(Box::pin(async move { this.acquire_all(acquires).await }));
        }
        if !loads.is_empty() {
            steps.push(Box::pin(async move { self.load_all(loads).await }));
        }
        steps
    }

    /// `get_many` of every key queued, within the shortest time any of
    /// their flights has left.
    async fn read_all(&self, reads: Vec<ReadStep>) {
        let shared = &self.shared;
        let timeout = reads.iter().map(|(_, t, _)| *t).min().unwrap_or_default();
        let keys: Vec<FillKeys> = reads.iter().map(|(k, _, _)| k.clone()).collect();
        let answers = per_chunk(shared, &keys, |chunk: Vec<FillKeys>| async move {
            let read = as_one(shared.calls.backend.get_many(&chunk));
            shared
                .calls
                .call(&chunk[0], timeout, "get_many", read)
                .await
        })
        .await;
        for ((_, _, reply), answer) in reads.into_iter().zip(answers) {
            let _ = reply.send(answer);
        }
    }

    /// `acquire_many` of every lease request queued (one per lease TTL
    /// asked for), each answer made an acquisition as a single request's.
    /// A lease won for a flight that is gone is released by its drop.
    async fn acquire_all(&self, acquires: Vec<AcquireStep>) {
        let mut by_ttl: HashMap<Duration, Vec<AcquireStep>> = HashMap::new();
        for step in acquires {
            by_ttl.entry(step.lease_ttl).or_default().push(step);
        }
        let shared = &self.shared;
        let asking = by_ttl.into_iter().map(|(lease_ttl, steps)| async move {
            let timeout = steps.iter().map(|s| s.timeout).min().unwrap_or_default();
            let requests: Vec<LeaseRequest> = steps.iter().map(|s| s.request.clone()).collect();
            let answers = per_chunk(shared, &requests, |chunk: Vec<LeaseRequest>| async move {
                let acquire = as_one(shared.calls.backend.acquire_many(&chunk, lease_ttl));
                shared
                    .calls
                    .call(&chunk[0].keys, timeout, "acquire_many", acquire)
                    .await
            })
            .await;
            for (step, answer) in steps.into_iter().zip(answers) {
                let LeaseRequest { keys, token, .. } = step.request;
                let acquisition =
                    Acquisition::of_answer(&shared.calls, &keys, token, lease_ttl, answer);
                let _ = step.reply.send(acquisition);
            }
        });
        futures_util::future::join_all(asking).await;
    }

    /// One call of the batch's loader for every key queued, each key's
    /// share of the result sent to its flight (a key the loader did not
    /// return is absent; a key returned twice keeps its first pair).
    async fn load_all(&self, loads: Vec<LoadStep<V>>) {
        let shared = &self.shared;
        let keys: Vec<K> = loads
            .iter()
            .filter_map(|(string, _)| self.keys.get(string).cloned())
            .collect();
        let label = format!("{} keys", keys.len());
        let loader = self.loader.clone();
        let load: loader::Detached<Found<K, V>> = Box::new(move || loader(keys));
        let (rec, times) = (&shared.recorder, &shared.load_times);
        let max = self.policy.max_load_time;
        // Before the loader reads anything (see `Flight::start_loader`).
        let as_of = shared.marks.generation();
        let found = loader::run_alone(rec, times, max, self.policy.ttl, &label, load)
            .await
            .map(|(found, took)| {
                let mut first: HashMap<String, Loaded<V>> = HashMap::new();
                for (k, mut v) in found {
                    v.as_of = as_of;
                    if let Ok(k) = crate::key::display(&k) {
                        first.entry(k).or_insert(v);
                    }
                }
                (first, took)
            });
        for (string, reply) in loads {
            let loaded = match &found {
                Ok((found, took)) => {
                    let loaded = found.get(&string).cloned();
                    let loaded = loaded.map_or_else(|| Loaded::new(None), |v| v.map(Some));
                    Ok((loaded, *took))
                }
                Err(error) => Err(error.clone()),
            };
            let _ = reply.send(loaded);
        }
    }
}

/// Wakes the batch's task, and notes that something woke a flight.
struct Woken {
    flag: AtomicBool,
    task: Waker,
}

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.flag.store(true, Ordering::SeqCst);
        self.task.wake_by_ref();
    }
}

/// Runs `step` on the items of each shard, in chunks of at most
/// [`MAX_PIPELINE`], concurrently, and puts the answers back in order. A
/// chunk that fails as a whole (its circuit is open, it timed out) fails
/// each of its items.
async fn per_chunk<V, T, R, F, Fut>(
    shared: &Shared<V>,
    items: &[T],
    step: F,
) -> Vec<Result<R, BackendError>>
where
    T: Clone + ShardOf,
    F: Fn(Vec<T>) -> Fut,
    Fut: Future<Output = Result<Vec<Result<R, BackendError>>, BackendError>>,
{
    let mut by_shard: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let shard = shared.calls.backend.shard(item.fill_keys());
        by_shard.entry(shard).or_default().push(i);
    }
    let chunks: Vec<Vec<usize>> = by_shard
        .into_values()
        .flat_map(|indices| {
            indices
                .chunks(MAX_PIPELINE)
                .map(<[usize]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect();
    let calls = chunks.iter().map(|positions| {
        let chunk: Vec<T> = positions.iter().map(|&i| items[i].clone()).collect();
        step(chunk)
    });
    let results = futures_util::future::join_all(calls).await;
    let mut out: Vec<Option<Result<R, BackendError>>> = items.iter().map(|_| None).collect();
    for (positions, result) in chunks.iter().zip(results) {
        match result {
            Ok(answers) if answers.len() == positions.len() => {
                for (&i, answer) in positions.iter().zip(answers) {
                    out[i] = Some(answer);
                }
            }
            result => {
                let error = result.err().unwrap_or_else(|| {
                    BackendError::new(
                        BackendErrorKind::Protocol,
                        "a batch step answered for a different number of keys",
                    )
                });
                for &i in positions {
                    out[i] = Some(Err(error.clone()));
                }
            }
        }
    }
    out.into_iter()
        .map(|a| {
            a.unwrap_or_else(|| {
                Err(BackendError::new(
                    BackendErrorKind::Protocol,
                    "a batch step left a key unanswered",
                ))
            })
        })
        .collect()
}

/// A batch step's answers as one result for the circuit breaker: failed
/// if every key failed (then with the first key's error, which each key
/// gets), answered otherwise.
async fn as_one<R>(
    step: impl Future<Output = Vec<Result<R, BackendError>>>,
) -> Result<Vec<Result<R, BackendError>>, BackendError> {
    let answers = step.await;
    match answers.first() {
        Some(Err(first)) if answers.iter().all(Result::is_err) => Err(first.clone()),
        _ => Ok(answers),
    }
}

/// What a batch item is about (for grouping by shard).
trait ShardOf {
    fn fill_keys(&self) -> &FillKeys;
}

impl ShardOf for FillKeys {
    fn fill_keys(&self) -> &FillKeys {
        self
    }
}

impl ShardOf for LeaseRequest {
    fn fill_keys(&self) -> &FillKeys {
        &self.keys
    }
}
