//! The batch call: many keys, one read, one lease request, one load.
//!
//! [`Cache::get_or_load_many`](crate::Cache::get_or_load_many) answers
//! every key as [`get_or_load`](crate::Cache::get_or_load) would, with the
//! backend conversation and the loader shared by the keys:
//!
//! ```text
//! L1 ── fresh ─────────────────────────────────────────► Hit (no backend)
//!  │ stale: served; refreshed together in the background (one load)
//!  ▼
//! join each key's flight (a key already in flight here: share it)
//!  ▼
//! get_many ── hit / stale / cached failure ────────────► as a single call
//!  │ misses (one round trip per master, in parallel)   (stale: refreshed
//!  ▼                                                     together, one load)
//! acquire_many ── won ───────┐
//!  │ held ── wait together   │ one load of every key won (filled, fenced
//!  │   subscribe each, then  │ on its own token) and every key to load
//!  │   re-check: get_many of │ unstored (backend failed; `no_lease` and
//!  │   the keys notified,    │ held), as one loader call
//!  │   acquire_many of the   │
//!  │   keys due; takeovers   │
//!  │   and deadline loads    │
//!  │   loaded together       │
//!  ▼                         ▼
//! every key's answer
//! ```
//!
//! A key whose lease request found a stale value under another's lease,
//! or a fresh value (someone just filled), goes on through its own flight
//! from that answer (serves the stale value, answers the hit) with no
//! further command.
//!
//! Each key joins the in-process coalescer exactly as a single call does,
//! so a single call and a batch on the same key share one flight, whoever
//! comes first; the batch's load of the keys it won is registered per key
//! too, so a degraded load of one of those keys in this process shares it.
//! The whole batch runs in a task of its own (like a flight, decision
//! 0001): dropping the caller's future cancels neither the load nor any
//! lease, and the keys' other callers still get their answers.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{
    Acquired, BackendError, BackendErrorKind, FillKeys, LeaseRequest, Stored, MAX_PIPELINE,
};
use crate::budget::Budget;
use crate::cache::Fetched;
use crate::coalesce::{Awaiter, Completion, Joined};
use crate::error::{Error, LoaderError};
use crate::flight::{Answer, FirstRead, Flight, Outcome, Pending, Recheck, Refresh};
use crate::lease::{Acquisition, Lease, LeaseToken};
use crate::loader::{self, Done, Load, Loaded};
use crate::options::Policy;
use crate::shared::Shared;
use crate::wait::{AtDeadline, Next, Wait};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;

/// The caller's batch loader, type-erased: the keys to load, and what it
/// found (a key it did not return is absent).
pub(crate) type ManyLoader<K, V> = Arc<
    dyn Fn(Vec<K>) -> Pin<Box<dyn Future<Output = Result<Vec<(K, V)>, LoaderError>> + Send>>
        + Send
        + Sync,
>;

/// One key's answer in a batch.
pub(crate) type KeyAnswer<V> = Result<Fetched<Option<V>>, Error>;

/// A batch of distinct, valid keys (their user-facing value and string
/// form), with one policy and one loader.
pub(crate) struct Batch<K, V> {
    pub(crate) shared: Arc<Shared<V>>,
    pub(crate) policy: Policy,
    pub(crate) loader: ManyLoader<K, V>,
}

impl<K, V> Clone for Batch<K, V> {
    fn clone(&self) -> Self {
        Batch {
            shared: self.shared.clone(),
            policy: self.policy.clone(),
            loader: self.loader.clone(),
        }
    }
}

/// A key won, its lease and any stale value (for fail-safe).
type Won<K, V> = (Led<K, V>, Lease, Option<Option<V>>);

/// Where the lease request sends each key it does not answer or win.
struct Sink<'a, K, V> {
    /// Keys whose own flight goes on (answers to await).
    running: &'a mut Vec<(usize, Awaiter<Answer<V>>, bool)>,
    /// Keys answered.
    answers: &'a mut [Option<KeyAnswer<V>>],
    /// Keys to load without storing.
    unstored: &'a mut Vec<Led<K, V>>,
    /// Keys another process holds: waited for together, with the holder's
    /// lease TTL.
    waiters: &'a mut Vec<(Led<K, V>, Duration)>,
}

/// A key the batch waits for.
struct Waiter<K, V> {
    l: Led<K, V>,
    wait: Wait,
    /// The holder's lease TTL when last asked (a re-check at its expiry).
    holder_ttl: Duration,
    /// A stale value seen while waiting (for the deadline's outcome).
    stale: Option<Option<V>>,
    /// The next re-check ignores freshness once (a value unreadable here).
    unreadable: bool,
}

/// A key whose flight this batch leads.
struct Led<K, V> {
    index: usize,
    key: K,
    flight: Flight<V>,
    completion: Completion<Answer<V>>,
}

impl<K, V> Batch<K, V>
where
    K: Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// A single key's loader: the batch loader called with that key alone
    /// (for what a key's flight may still load on its own: a takeover
    /// after a wait, a degraded load, a background refresh).
    pub(crate) fn load_of(&self, key: &K) -> Load<V> {
        let loader = self.loader.clone();
        let key = key.clone();
        Box::new(move || {
            Box::pin(async move {
                let wanted = crate::key::display(&key).ok();
                let found = loader(vec![key]).await?;
                Ok(Loaded::new(
                    found
                        .into_iter()
                        .find(|(k, _)| wanted.is_some() && crate::key::display(k).ok() == wanted)
                        .map(|(_, v)| v),
                ))
            })
        })
    }

    /// Answers every key (`keys`: distinct and valid, with their string
    /// form), in the order given.
    pub(crate) async fn run(self, keys: Vec<(K, String)>) -> Vec<KeyAnswer<V>> {
        let shared = self.shared.clone();
        let mut answers: Vec<Option<KeyAnswer<V>>> = keys.iter().map(|_| None).collect();
        let mut running: Vec<(usize, Awaiter<Answer<V>>, bool)> = Vec::new();
        let mut led: Vec<Led<K, V>> = Vec::new();
        for (index, (key, string)) in keys.iter().enumerate() {
            match shared.flights.join(string) {
                Joined::Follower(awaiter) => {
                    shared.recorder.coalesced();
                    running.push((index, awaiter, true));
                }
                Joined::Leader(completion) => {
                    let fill_keys = FillKeys::new(&shared.namespace, string);
                    let flight = Flight::new(
                        shared.clone(),
                        string.clone(),
                        fill_keys,
                        self.policy.clone(),
                        self.load_of(key),
                    );
                    led.push(Led {
                        index,
                        key: key.clone(),
                        flight,
                        completion,
                    });
                }
            }
        }

        // One read of every key this batch leads.
        let budget = Budget::new(self.policy.backend_timeout);
        let read_keys: Vec<FillKeys> = led.iter().map(|l| l.flight.keys().clone()).collect();
        let read_began = Instant::now();
        let read = self.get_many(&read_keys, &budget).await;
        let mut misses: Vec<(Led<K, V>, bool)> = Vec::new();
        let mut refreshes = Vec::new();
        let mut unstored: Vec<Led<K, V>> = Vec::new();
        for (mut l, stored) in led.into_iter().zip(read) {
            l.flight.read_began_at(read_began);
            match l.flight.first_read_of(stored) {
                FirstRead::Failed(error) => {
                    l.flight.charge(budget.spent());
                    match l.flight.degrade_without_load(error, None) {
                        Some(answer) => {
                            let answer = l.flight.answer(answer, l.completion);
                            answers[l.index] = Some(fetched(answer, false));
                        }
                        None => unstored.push(l),
                    }
                }
                // With a soft timeout, a stale value read here is not
                // served while the batch loads (see `fetch_many`'s docs).
                FirstRead::Miss { unreadable, stale } => {
                    if stale.is_some() {
                        l.flight.count_stale_miss();
                    }
                    misses.push((l, unreadable));
                }
                first => {
                    l.flight.charge(budget.spent());
                    let (pending, refresh) = l.flight.continue_from_batched(first, l.completion);
                    match pending {
                        Pending::Ready(answer) => answers[l.index] = Some(fetched(answer, false)),
                        Pending::Running(awaiter) => running.push((l.index, awaiter, false)),
                    }
                    if let Some((flight, why)) = refresh {
                        refreshes.push((keys[l.index].0.clone(), flight, why));
                    }
                }
            }
        }
        // Stale values served, values due for early refresh: refreshed in
        // the background, together (one lease request, one load).
        if !refreshes.is_empty() {
            tokio::spawn(Box::pin(self.clone().refresh(refreshes)));
        }

        // One lease request for every miss.
        let mut waiters = Vec::new();
        let won = if misses.is_empty() {
            Vec::new()
        } else {
            let mut sink = Sink {
                running: &mut running,
                answers: &mut answers,
                unstored: &mut unstored,
                waiters: &mut waiters,
            };
            // A budget of their own: every miss was read (its master
            // answered), so it has lost nothing yet; another master's
            // failed read is not charged to it (a single call's flight
            // has its own budget too).
            let budget = Budget::new(self.policy.backend_timeout);
            self.acquire_misses(misses, &budget, &mut sink).await
        };

        // One load of every key won (filled under its lease) and of every
        // key the backend failed or, with `no_lease`, another process holds
        // (stored nowhere, as a flight's degraded load); meanwhile, the wait
        // for the keys other processes hold.
        let (loaded, waited) = tokio::join!(
            async {
                if won.is_empty() && unstored.is_empty() {
                    Vec::new()
                } else {
                    self.load_all(won, unstored).await
                }
            },
            async {
                if waiters.is_empty() {
                    Vec::new()
                } else {
                    self.wait_for(waiters).await
                }
            }
        );
        for (index, answer) in loaded.into_iter().chain(waited) {
            answers[index] = Some(fetched(answer, false));
        }

        for (index, awaiter, coalesced) in running {
            answers[index] = Some(fetched(awaiter.outcome().await, coalesced));
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or(Err(Error::FlightAbandoned)))
            .collect()
    }

    /// Asks for the lease of every miss at once. The keys won come back
    /// with their lease; every other key's flight goes on alone from its
    /// answer (into `running`).
    async fn acquire_misses(
        &self,
        misses: Vec<(Led<K, V>, bool)>,
        budget: &Budget,
        sink: &mut Sink<'_, K, V>,
    ) -> Vec<Won<K, V>> {
        let shared = &self.shared;
        let lease_ttl = self.lease_ttl();
        let requests: Vec<LeaseRequest> = misses
            .iter()
            .map(|(l, unreadable)| {
                // As a single flight: a value fresh on the server but
                // unreadable here must not block the lease (asked once).
                let window = if *unreadable {
                    Duration::MAX
                } else {
                    Duration::ZERO
                };
                LeaseRequest::new(l.flight.keys().clone(), LeaseToken::random(), window)
            })
            .collect();
        let acquire_began = Instant::now();
        let acquired = self.acquire_many(&requests, lease_ttl, budget).await;
        let mut won = Vec::new();
        for (((mut l, _), request), acquired) in misses.into_iter().zip(requests).zip(acquired) {
            l.flight.charge(budget.spent());
            l.flight.read_began_at(acquire_began);
            let acquisition = match acquired {
                Ok(Acquired::Won { stale }) => {
                    let lease = Lease::won(shared, &request.keys, request.token, lease_ttl);
                    let stale = l.flight.stale_value(stale);
                    won.push((l, lease, stale));
                    continue;
                }
                Ok(Acquired::Fresh(stored)) => Ok(Acquisition::Fresh(stored)),
                // `no_lease`: nobody is waited for; loaded without storing,
                // with the batch's other such keys (the holder's fill will be
                // stored), as a single call's `load_without_waiting`.
                Ok(Acquired::Held { .. }) if self.policy.lease_ttl.is_none() => {
                    sink.unstored.push(l);
                    continue;
                }
                // Waited for with the batch's other such keys (with a stale
                // value, the key's flight serves it at once, as below).
                Ok(Acquired::Held {
                    stale: None,
                    lease_ttl,
                }) => {
                    sink.waiters.push((l, lease_ttl));
                    continue;
                }
                Ok(Acquired::Held { stale, lease_ttl }) => {
                    Ok(Acquisition::Held { stale, lease_ttl })
                }
                Err(error) => {
                    Lease::release_unanswered(shared, &request.keys, request.token, &error);
                    match l.flight.degrade_without_load(error, None) {
                        Some(answer) => {
                            let answer = l.flight.answer(answer, l.completion);
                            sink.answers[l.index] = Some(fetched(answer, false));
                        }
                        None => sink.unstored.push(l),
                    }
                    continue;
                }
            };
            let awaiter = l.flight.continue_from_acquire(acquisition, l.completion);
            sink.running.push((l.index, awaiter, false));
        }
        won
    }

    /// Runs the loader once for every key won and every key to load
    /// unstored (a key of those whose load already runs in this process
    /// shares it instead), then fills (or releases) each won key's lease,
    /// and answers every key's callers.
    async fn load_all(
        &self,
        won: Vec<Won<K, V>>,
        unstored: Vec<Led<K, V>>,
    ) -> Vec<(usize, Result<Answer<V>, Error>)> {
        let loads = &self.shared.loads;
        let mut wanted = Vec::with_capacity(won.len() + unstored.len());
        for (l, _, _) in &won {
            let load = self.lead_load(l.flight.keys().value());
            wanted.push((l.key.clone(), load));
        }
        let mut loading_unstored = Vec::new();
        let mut sharing = Vec::new();
        for l in unstored {
            match loads.join(l.flight.keys().value()) {
                Joined::Leader(load) => {
                    wanted.push((l.key.clone(), load));
                    loading_unstored.push(l);
                }
                Joined::Follower(awaiter) => sharing.push((l, awaiter)),
            }
        }
        let mut loaded = if wanted.is_empty() {
            Vec::new()
        } else {
            self.load_together(wanted).await
        }
        .into_iter();
        let finishing = won
            .into_iter()
            .zip(loaded.by_ref())
            .map(|((l, lease, stale), loaded)| async move {
                let index = l.index;
                let answer = l
                    .flight
                    .finish_batch_load(lease, stale, loaded, l.completion)
                    .await;
                (index, answer)
            })
            .collect::<Vec<_>>();
        let mut out = futures_util::future::join_all(finishing).await;
        for (l, loaded) in loading_unstored.into_iter().zip(loaded) {
            out.push((
                l.index,
                l.flight.finish_batch_unstored(loaded, l.completion),
            ));
        }
        for (l, awaiter) in sharing {
            let loaded = awaiter.outcome().await;
            out.push((
                l.index,
                l.flight.finish_batch_unstored(loaded, l.completion),
            ));
        }
        out
    }

    /// Waits for the keys other processes hold, together, as each key's
    /// own flight would (`lease_or_wait`): subscribed to each key's fill
    /// notifications first, then re-checked at once; woken by a
    /// notification (one read of every key notified), at a holder's lease
    /// expiry or a safety poll (one lease request for every key due), each
    /// key within its own deadline and with the wait policy's outcome at
    /// it. A key whose holder died is taken over (loaded, with the others
    /// taken over at the same re-check, in a task of its own).
    async fn wait_for(
        &self,
        waiters: Vec<(Led<K, V>, Duration)>,
    ) -> Vec<(usize, Result<Answer<V>, Error>)> {
        let shared = &self.shared;
        let timeout = self.policy.backend_timeout;
        let subscribing = waiters.iter().map(|(l, _)| {
            let keys = l.flight.keys();
            shared.call(keys, timeout, "subscribe", shared.backend.subscribe(keys))
        });
        let subscriptions = futures_util::future::join_all(subscribing).await;
        let mut slots: Vec<Option<Waiter<K, V>>> = waiters
            .into_iter()
            .zip(subscriptions)
            .map(|((l, holder_ttl), subscription)| {
                shared.recorder.lease_contended();
                Some(Waiter {
                    wait: Wait::start(shared, &self.policy.wait, subscription.ok()),
                    l,
                    holder_ttl,
                    stale: None,
                    unreadable: false,
                })
            })
            .collect();
        let mut out = Vec::new();
        let mut loading = Vec::new();
        // Subscribed: re-check every key at once, so a fill that landed
        // before its subscription is not waited for.
        let mut due: Vec<usize> = (0..slots.len()).collect();
        let mut notified: Vec<usize> = Vec::new();
        loop {
            let mut won: Vec<Won<K, V>> = Vec::new();
            let mut unstored: Vec<Led<K, V>> = Vec::new();
            let mut finish = |slots: &mut Vec<Option<Waiter<K, V>>>,
                              i: usize,
                              timed_out: bool,
                              answer: Option<Result<Answer<V>, Error>>,
                              unstored: &mut Vec<Led<K, V>>| {
                let Some(w) = slots[i].take() else {
                    return;
                };
                w.wait.finish(shared, timed_out);
                match answer {
                    Some(answer) => {
                        let index = w.l.index;
                        out.push((index, w.l.flight.answer(answer, w.l.completion)));
                    }
                    None => unstored.push(w.l),
                }
            };

            // Notified: a plain read first (the fill most likely landed).
            notified.retain(|&i| slots[i].is_some());
            if !notified.is_empty() {
                let keys: Vec<FillKeys> = notified
                    .iter()
                    .filter_map(|&i| slots[i].as_ref().map(|w| w.l.flight.keys().clone()))
                    .collect();
                let read_began = Instant::now();
                let read = self.get_many(&keys, &Budget::new(timeout)).await;
                for (i, stored) in std::mem::take(&mut notified).into_iter().zip(read) {
                    let Some(w) = slots[i].as_mut() else { continue };
                    w.l.flight.read_began_at(read_began);
                    match stored {
                        Ok(stored) => match w.l.flight.waited_read(stored) {
                            Some(answer) => {
                                finish(&mut slots, i, false, Some(answer), &mut unstored)
                            }
                            None => due.push(i),
                        },
                        Err(error) => {
                            let stale = w.stale.take();
                            let answer = w.l.flight.degrade_without_load(error, stale);
                            finish(&mut slots, i, false, answer, &mut unstored);
                        }
                    }
                }
            }

            // Due (or notified without a fresh value): one lease request.
            due.retain(|&i| slots[i].is_some());
            if !due.is_empty() {
                let lease_ttl = self.lease_ttl();
                let mut requests: Vec<LeaseRequest> = Vec::with_capacity(due.len());
                for &i in &due {
                    if let Some(w) = slots[i].as_mut() {
                        let window = if std::mem::take(&mut w.unreadable) {
                            Duration::MAX
                        } else {
                            Duration::ZERO
                        };
                        let keys = w.l.flight.keys().clone();
                        requests.push(LeaseRequest::new(keys, LeaseToken::random(), window));
                    }
                }
                let acquire_began = Instant::now();
                let acquired = self
                    .acquire_many(&requests, lease_ttl, &Budget::new(timeout))
                    .await;
                let mut again = Vec::new();
                for ((i, request), acquired) in std::mem::take(&mut due)
                    .into_iter()
                    .zip(requests)
                    .zip(acquired)
                {
                    let Some(w) = slots[i].as_mut() else { continue };
                    w.l.flight.read_began_at(acquire_began);
                    let acquisition = match acquired {
                        Ok(Acquired::Won { stale }) => Acquisition::Won {
                            lease: Lease::won(shared, &request.keys, request.token, lease_ttl),
                            stale,
                        },
                        Ok(Acquired::Fresh(stored)) => Acquisition::Fresh(stored),
                        Ok(Acquired::Held { stale, lease_ttl }) => {
                            Acquisition::Held { stale, lease_ttl }
                        }
                        Err(error) => {
                            Lease::release_unanswered(shared, &request.keys, request.token, &error);
                            let stale = w.stale.take();
                            let answer = w.l.flight.degrade_without_load(error, stale);
                            finish(&mut slots, i, false, answer, &mut unstored);
                            continue;
                        }
                    };
                    let Waiter {
                        l,
                        stale,
                        holder_ttl,
                        unreadable,
                        ..
                    } = w;
                    match l
                        .flight
                        .waited_acquire(acquisition, stale, holder_ttl, unreadable)
                    {
                        Recheck::Answered(answer) => {
                            finish(&mut slots, i, false, Some(answer), &mut unstored)
                        }
                        Recheck::Won(lease, stale) => {
                            if let Some(w) = slots[i].take() {
                                w.wait.finish(shared, false);
                                won.push((w.l, lease, stale));
                            }
                        }
                        Recheck::Held => {}
                        Recheck::Again => again.push(i),
                    }
                }
                due = again;
            }

            // Taken over, or to load at the deadline: loaded in a task of
            // their own, so the other keys' waits go on meanwhile.
            if !won.is_empty() || !unstored.is_empty() {
                let batch = self.clone();
                loading.push(tokio::spawn(
                    async move { batch.load_all(won, unstored).await },
                ));
            }
            if !due.is_empty() {
                continue;
            }
            if slots.iter().all(Option::is_none) {
                break;
            }

            // Until the next key wakes: each key's own wait (notification,
            // holder's expiry, safety poll, deadline), raced; every key
            // awake at that moment is handled in this round.
            let woke = {
                let mut waits: FuturesUnordered<_> =
                    slots
                        .iter_mut()
                        .enumerate()
                        .filter_map(|(i, w)| w.as_mut().map(|w| (i, w)))
                        .map(|(i, w)| async move {
                            (i, w.wait.until_recheck(shared, w.holder_ttl).await)
                        })
                        .collect();
                let mut woke = Vec::new();
                if let Some(first) = waits.next().await {
                    woke.push(first);
                }
                while let Some(Some(next)) = waits.next().now_or_never() {
                    woke.push(next);
                }
                woke
            };
            let mut unstored: Vec<Led<K, V>> = Vec::new();
            for (i, next) in woke {
                match next {
                    Next::Notified => notified.push(i),
                    Next::Recheck => due.push(i),
                    Next::Deadline => {
                        let Some(w) = slots[i].as_mut() else { continue };
                        let answer = match self.policy.wait.at_deadline(w.stale.take()) {
                            AtDeadline::Serve(value) => {
                                shared.recorder.stale_served();
                                Some(Ok((value, Outcome::Stale)))
                            }
                            AtDeadline::Load => None,
                            AtDeadline::Fail(error) => Some(Err(error)),
                        };
                        finish(&mut slots, i, true, answer, &mut unstored);
                    }
                }
            }
            if !unstored.is_empty() {
                let batch = self.clone();
                loading.push(tokio::spawn(async move {
                    batch.load_all(Vec::new(), unstored).await
                }));
            }
        }
        for task in loading {
            // A load task that panicked dropped its keys' completions:
            // their callers get `FlightAbandoned`, and so does the batch
            // (a key left unanswered, below).
            if let Ok(answers) = task.await {
                out.extend(answers);
            }
        }
        out
    }

    /// One load of `wanted`, each key with its place in the process's
    /// loads (so a degraded load of one of them here shares this one
    /// instead of running its own); each key's share of the result, in
    /// order, also published to its place.
    async fn load_together(
        &self,
        wanted: Vec<(K, Completion<Done<V>>)>,
    ) -> Vec<Result<Done<V>, Error>> {
        let shared = &self.shared;
        // Formatted once already, when the batch began (a `Display` that
        // fails now names no key: nothing is found for it).
        let strings: Vec<Option<String>> = wanted
            .iter()
            .map(|(k, _)| crate::key::display(k).ok())
            .collect();
        let (keys, loads): (Vec<K>, Vec<Completion<Done<V>>>) = wanted.into_iter().unzip();
        let loader = self.loader.clone();
        let label = format!("{} keys", keys.len());
        let load: loader::Detached<Vec<(K, V)>> = Box::new(move || loader(keys));
        let (mut found, took) = match loader::run_alone(shared, &self.policy, &label, load).await {
            Ok((found, took)) => {
                // A key returned twice keeps its first pair, as a single
                // key's load (`load_of`) keeps it.
                let mut first: HashMap<String, V> = HashMap::new();
                for (k, v) in found {
                    if let Ok(k) = crate::key::display(&k) {
                        first.entry(k).or_insert(v);
                    }
                }
                let found = first;
                (Ok(found), took)
            }
            Err(error) => (Err(error), Duration::ZERO),
        };
        strings
            .iter()
            .zip(loads)
            .map(|(string, load)| {
                let loaded = match &mut found {
                    Ok(found) => {
                        let value = string.as_ref().and_then(|s| found.remove(s));
                        Ok((Loaded::new(value), took))
                    }
                    Err(error) => Err(error.clone()),
                };
                load.complete(loaded.clone());
                loaded
            })
            .collect()
    }

    /// The background refresh of the keys a batch served stale (in grace)
    /// or found due for early refresh: as each key's own refresh would be
    /// (one per key per process, one fleet-wide through the lease; an
    /// early refresh that fails writes nothing), with one lease request
    /// and one load for them all.
    pub(crate) async fn refresh(self, refreshes: Vec<(K, Flight<V>, Refresh)>) {
        let shared = &self.shared;
        let mut started = Vec::new();
        for (key, mut flight, why) in refreshes {
            if let Some((guard, window)) = flight.start_batch_refresh(why) {
                started.push((key, flight, guard, window));
            }
        }
        if started.is_empty() {
            return;
        }
        let lease_ttl = self.lease_ttl();
        let requests: Vec<LeaseRequest> = started
            .iter()
            .map(|(_, flight, _, window)| {
                LeaseRequest::new(flight.keys().clone(), LeaseToken::random(), *window)
            })
            .collect();
        let budget = Budget::new(self.policy.backend_timeout);
        let acquire_began = Instant::now();
        let acquired = self.acquire_many(&requests, lease_ttl, &budget).await;
        // Held until the refreshes end: one refresh per key per process.
        let mut guards = Vec::with_capacity(started.len());
        let mut won = Vec::new();
        for ((key, flight, guard, _), (request, acquired)) in
            started.into_iter().zip(requests.into_iter().zip(acquired))
        {
            guards.push(guard);
            match acquired {
                Ok(Acquired::Won { stale }) => {
                    let lease = Lease::won(shared, &request.keys, request.token, lease_ttl);
                    flight.read_began_at(acquire_began);
                    won.push((key, flight, lease, stale));
                }
                Ok(Acquired::Held { .. }) => shared.recorder.lease_contended(),
                Ok(Acquired::Fresh(_)) => {}
                Err(error) => {
                    Lease::release_unanswered(shared, &request.keys, request.token, &error);
                }
            }
        }
        if !won.is_empty() {
            let wanted = won
                .iter()
                .map(|(key, flight, _, _)| (key.clone(), self.lead_load(flight.keys().value())))
                .collect();
            let loaded = self.load_together(wanted).await;
            let finishing =
                won.into_iter()
                    .zip(loaded)
                    .map(|((_, flight, lease, stale), loaded)| {
                        flight.finish_batch_refresh(lease, stale, loaded)
                    });
            futures_util::future::join_all(finishing).await;
        }
        drop(guards);
    }

    /// This process's place for a load of `key` under a lease just won
    /// (as `loader::run` with `Sharing::Own`): another load of the key
    /// still running here is a duplicate, counted.
    fn lead_load(&self, key: &str) -> Completion<Done<V>> {
        let (completion, replaced) = self.shared.loads.lead(key);
        if replaced {
            self.shared.recorder.duplicate_load(key);
        }
        completion
    }

    /// The lease TTL for this batch's leases, sized from recent loads.
    /// Without the lease policy (`no_lease`) a lease is still taken when it
    /// is free, as by a single call: it fences the write, and nobody waits
    /// for it.
    fn lease_ttl(&self) -> Duration {
        self.policy
            .lease_ttl
            .unwrap_or_default()
            .ttl(&self.shared.load_times)
    }

    /// `get_many` of every key: grouped by shard (each shard's circuit
    /// breaker decides for its keys), in chunks of at most
    /// [`MAX_PIPELINE`], all concurrently.
    async fn get_many(
        &self,
        keys: &[FillKeys],
        budget: &Budget,
    ) -> Vec<Result<Option<Stored>, BackendError>> {
        let shared = &self.shared;
        self.per_chunk(keys, budget, |chunk: Vec<FillKeys>, timeout| async move {
            shared
                .call(
                    &chunk[0],
                    timeout,
                    "get_many",
                    as_one(shared.backend.get_many(&chunk)),
                )
                .await
        })
        .await
    }

    /// `acquire_many` of every request, as [`get_many`](Self::get_many).
    async fn acquire_many(
        &self,
        requests: &[LeaseRequest],
        lease_ttl: Duration,
        budget: &Budget,
    ) -> Vec<Result<Acquired, BackendError>> {
        let shared = &self.shared;
        self.per_chunk(
            requests,
            budget,
            |chunk: Vec<LeaseRequest>, timeout| async move {
                let acquire = as_one(shared.backend.acquire_many(&chunk, lease_ttl));
                shared
                    .call(&chunk[0].keys, timeout, "acquire_many", acquire)
                    .await
            },
        )
        .await
    }

    /// Runs `step` on the items of each shard, in chunks of at most
    /// [`MAX_PIPELINE`], concurrently, and puts the answers back in order.
    /// A chunk that fails as a whole (its circuit is open, it timed out)
    /// fails each of its items, and its time is charged to the budget.
    async fn per_chunk<T, R, F, Fut>(
        &self,
        items: &[T],
        budget: &Budget,
        step: F,
    ) -> Vec<Result<R, BackendError>>
    where
        T: Clone + ShardOf,
        F: Fn(Vec<T>, Duration) -> Fut,
        Fut: Future<Output = Result<Vec<Result<R, BackendError>>, BackendError>>,
    {
        let mut by_shard: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let shard = self.shared.backend.shard(item.fill_keys());
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
        let timeout = budget.left();
        let started = Instant::now();
        let calls = chunks.iter().map(|positions| {
            let chunk: Vec<T> = positions.iter().map(|&i| items[i].clone()).collect();
            step(chunk, timeout)
        });
        let results = futures_util::future::join_all(calls).await;
        let mut out: Vec<Option<Result<R, BackendError>>> = items.iter().map(|_| None).collect();
        let mut charged = false;
        for (positions, result) in chunks.iter().zip(results) {
            let result = match result {
                Ok(answers) if answers.len() == positions.len() => Ok(answers),
                Ok(_) => Err(BackendError::new(
                    BackendErrorKind::Protocol,
                    "a batch step answered for a different number of keys",
                )),
                Err(e) => Err(e),
            };
            match result {
                Ok(answers) => {
                    for (&i, answer) in positions.iter().zip(answers) {
                        out[i] = Some(answer);
                    }
                }
                Err(e) => {
                    if !std::mem::replace(&mut charged, true) {
                        budget.charge(started.elapsed());
                    }
                    for &i in positions {
                        out[i] = Some(Err(e.clone()));
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

fn fetched<V>(answer: Result<Answer<V>, Error>, coalesced: bool) -> KeyAnswer<V> {
    answer.map(|(value, outcome): (Option<V>, Outcome)| Fetched {
        value,
        outcome,
        coalesced,
    })
}
