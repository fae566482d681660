//! The leader's first read, in the caller's own task: a fresh hit is
//! answered right there, without a [`Flight`].
//!
//! A hit is most calls past the L1, so it carries nothing it does not use:
//! no task, no channel, no copy of the policy, no flight state (a flight
//! is 600 bytes of mutexes and options for the miss path), no copy of the
//! key beyond the coalescer's. Anything else the read finds (a miss, a
//! stale or unreadable value, a cached failure, a backend error, a hit due
//! for early refresh) becomes a [`Flight`] that goes on from it, as if the
//! flight had made the read itself: the same counters, the same budget
//! charged, the same epoch and L1 ticket (taken before the read).
//!
//! If the caller's future is dropped during the read, [`LeaderGuard`]
//! starts the conversation over in a task of its own, so the callers that
//! joined still get their answer (moka#240's trap); a panic of the backend
//! or the codec during the read gives every caller `FlightAbandoned`.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;

use crate::answer::{Answer, Outcome};
use crate::backend::Stored;
use crate::coalesce::Completion;
use crate::error::Error;
use crate::flight::{self, Flight, Pending, Start, StoredFreshness};
use crate::key::FillKeys;
use crate::loader::Load;
use crate::options::PolicyRef;
use crate::shared::{Read, Shared};

/// The leader of a key's flight in this process, before its first read.
pub(crate) struct Leader<'a, V, L: FnOnce() -> Load<V>> {
    pub shared: &'a Arc<Shared<V>>,
    /// The cache's own policy when the call has no options (not copied).
    pub policy: PolicyRef<'a>,
    pub keys: FillKeys,
    /// Makes the loader, erased: only a flight needs it.
    pub load: L,
    pub completion: Completion<Answer<V>>,
}

/// The leader during its first read; dropped armed (the caller's future
/// was dropped), it starts the flight over in a task of its own for the
/// callers that joined.
struct LeaderGuard<'a, V: Clone + Send + Sync + 'static, L: FnOnce() -> Load<V>> {
    armed: Option<Leader<'a, V, L>>,
}

impl<V: Clone + Send + Sync + 'static, L: FnOnce() -> Load<V>> Drop for LeaderGuard<'_, V, L> {
    fn drop(&mut self) {
        let Some(leader) = self.armed.take() else {
            return;
        };
        // Unwinding from a panic of the read itself: running it again would
        // panic again; the callers get `FlightAbandoned`.
        if std::thread::panicking() {
            return;
        }
        // Outside a runtime (it is shutting down) nobody is left to answer:
        // the completion is dropped and the others get `FlightAbandoned`.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        // From the start, as a flight of its own would.
        let start = Start::now(leader.shared, leader.completion.key());
        let (flight, completion) = leader.into_flight(start, None);
        flight.spawn_from(None, completion);
    }
}

/// Polls a pinned future, turning a panic into an `Err` (no allocation).
struct CatchUnwind<'a, F>(Pin<&'a mut F>);

impl<F: Future> Future for CatchUnwind<'_, F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// A first read that panicked (the codec or the backend): as when the whole
/// flight ran in a task of its own, every caller gets `FlightAbandoned`,
/// and the panic stays here (not passed on to the caller, and not run again
/// by the guard in a task, where it would only panic again).
fn abandoned<T>() -> Result<T, Error> {
    tracing::error!("a flight's first read panicked (the codec or the backend)");
    Err(Error::FlightAbandoned)
}

impl<'a, V: Clone + Send + Sync + 'static, L: FnOnce() -> Load<V>> Leader<'a, V, L> {
    /// Makes the first read and answers every caller of the flight: at once
    /// for a fresh hit, else through a [`Flight`] (in a task of its own
    /// past an answer the read gave).
    pub(crate) async fn answer(self) -> Result<Answer<V>, Error> {
        match self.first_read().await {
            Pending::Ready(answer) => answer,
            Pending::Running(awaiter) => awaiter.outcome().await,
        }
    }

    /// The first read: the answer of a fresh hit, else the flight that goes
    /// on from what it found.
    ///
    /// Not an `async fn`: one keeps its arguments for its whole life next to
    /// what it makes of them, so the leader would be held twice (and the
    /// hit's future is moved by every layer above it). The leader is in its
    /// guard before the future is made, and held there alone.
    pub(crate) fn first_read(self) -> impl Future<Output = Pending<V>> + use<'a, V, L> {
        let shared = self.shared;
        let start = Start::now(shared, self.completion.key());
        let timeout = self.policy.backend_timeout;
        let mut guard = LeaderGuard { armed: Some(self) };
        async move {
            let began = Instant::now();
            let got = match &guard.armed {
                Some(leader) => {
                    let keys = &leader.keys;
                    let get = shared.calls.call_with(keys, began, timeout, "get", || {
                        shared.calls.get(keys, timeout, began)
                    });
                    CatchUnwind(std::pin::pin!(get)).await
                }
                None => return Pending::Ready(Err(Error::FlightAbandoned)),
            };
            let Some(leader) = guard.armed.take() else {
                return Pending::Ready(Err(Error::FlightAbandoned));
            };
            let Ok(got) = got else {
                return Pending::Ready(abandoned());
            };
            let ((flight, completion), first) = match got {
                Ok(Some(stored)) => {
                    let read = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        shared.read(&stored, leader.keys.value(), true)
                    }));
                    let Ok(read) = read else {
                        return Pending::Ready(abandoned());
                    };
                    match read {
                        Read::Value {
                            value,
                            fresh_for,
                            delta,
                            written_ttl,
                            grace,
                        } if !fresh_for.is_zero()
                            && flight::early_refresh(
                                &leader.policy,
                                fresh_for,
                                delta,
                                written_ttl,
                                grace,
                            )
                            .is_none() =>
                        {
                            // The deadlines count from before the read (the
                            // TTL was read after it): sooner than the
                            // server's by the round trip, never later, and
                            // one read of the clock fewer.
                            let fresh = StoredFreshness::read(
                                &stored,
                                began,
                                fresh_for,
                                delta,
                                written_ttl,
                                grace,
                            );
                            return Pending::Ready(
                                leader.answer_hit(value, &stored, fresh, start, began),
                            );
                        }
                        read => {
                            let (mut flight, completion) = leader.into_flight(start, Some(began));
                            let first = flight.first_read_found(&stored, read);
                            ((flight, completion), first)
                        }
                    }
                }
                // A miss or a failure: the flight's business. A failed read
                // takes its time from the flight's budget, as the flight's own
                // reads do.
                other => {
                    let (mut flight, completion) = leader.into_flight(start, Some(began));
                    if other.is_err() {
                        flight.charge(began.elapsed());
                    }
                    let first = flight.first_read_of(other);
                    ((flight, completion), first)
                }
            };
            flight.continue_from(first, completion)
        }
    }

    /// A fresh hit, read from `began`: what a flight does with one
    /// (counted, remembered for outages, kept in the L1, shared with the
    /// callers that joined), without the flight.
    fn answer_hit(
        self,
        value: Option<V>,
        stored: &Stored,
        fresh: StoredFreshness,
        start: Start,
        began: Instant,
    ) -> Result<Answer<V>, Error> {
        let Leader {
            shared,
            policy,
            keys,
            completion,
            ..
        } = self;
        let recorder = &shared.recorder;
        recorder.flight();
        recorder.hit();
        // As `Flight::remember`: the outage fallback serves the value no
        // longer than the server keeps it.
        let expires_at = flight::server_expiry(began, stored.ttl);
        shared.remember(
            completion.key(),
            keys.value(),
            &value,
            expires_at,
            start.epoch,
            start.l1_ticket,
        );
        if let (Some(l1), Some(ticket)) = (&shared.l1, start.l1_ticket) {
            let entry = fresh.l1_entry(&policy, value.clone(), expires_at);
            l1.insert(completion.key(), entry, ticket);
        }
        let (answer, callers) = completion.complete_shared(Ok((value, Outcome::Hit)));
        recorder.flight_callers(callers);
        answer
    }

    /// The flight that goes on from the first read (`began`: when it began,
    /// if it was made), and its completion.
    fn into_flight(
        self,
        start: Start,
        began: Option<Instant>,
    ) -> (Flight<V>, Completion<Answer<V>>) {
        let Leader {
            shared,
            policy,
            keys,
            load,
            completion,
        } = self;
        let key = completion.key().to_owned();
        let policy = policy.into_owned();
        let flight = Flight::from_start(shared.clone(), key, keys, policy, load(), start);
        if let Some(began) = began {
            flight.read_began_at(began);
        }
        (flight, completion)
    }
}
