//! In-process coalescing: per key, one flight per process talks to the
//! backend and every other local caller shares its answer.
//!
//! The map lookup and insert happen under one mutex, so exactly one caller
//! becomes the leader however many arrive together. The leader holds the
//! [`Completion`]: it makes the flight's first read in its own task and
//! hands the rest to a spawned [`Flight`](crate::flight::Flight); if it is
//! dropped during that read, the flight starts over in a task of its own
//! (`flight.rs`, `LeaderGuard`). So dropping any caller (the leader
//! included) neither cancels the load nor strands the others (the trap of
//! moka#240 and of several single-flight crates).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::error::Error;

/// Where a flight's outcome is published: set once, then every awaiter is
/// woken. Lighter than a `watch` channel (built for every flight, hits
/// included): one allocation, no lock-free version machinery.
struct Slot<T> {
    outcome: Mutex<Option<Result<T, Error>>>,
    published: Notify,
    /// Callers that joined the flight after its leader (for the
    /// `onefill_flight_callers` histogram).
    followers: AtomicU64,
    /// The leader's call span, if a subscriber records it: the followers'
    /// spans follow from it. Valid while the flight is in the map, which
    /// is when followers join (the flight holds the span until it answers).
    leader_span: Option<tracing::Id>,
}

impl<T> Slot<T> {
    fn new(leader_span: Option<tracing::Id>) -> Arc<Self> {
        Arc::new(Slot {
            leader_span,
            outcome: Mutex::new(None),
            published: Notify::new(),
            followers: AtomicU64::new(0),
        })
    }

    fn publish(&self, outcome: Result<T, Error>) {
        *self.outcome.lock() = Some(outcome);
        self.published.notify_waiters();
    }
}

impl<T> std::fmt::Debug for Slot<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("published", &self.outcome.lock().is_some())
            .finish()
    }
}

/// ahash (quick_cache's hasher, randomly keyed) rather than SipHash: the
/// map is looked up on every call that misses the L1.
type Entries<T> = HashMap<String, (u64, Arc<Slot<T>>), quick_cache::DefaultHashBuilder>;
type Map<T> = Arc<Mutex<Entries<T>>>;

/// The map of flights under way in one [`Cache`](crate::Cache).
#[derive(Debug)]
pub(crate) struct Coalescer<T> {
    map: Map<T>,
    next_id: AtomicU64,
}

impl<T> Default for Coalescer<T> {
    fn default() -> Self {
        Coalescer {
            map: Arc::default(),
            next_id: AtomicU64::new(0),
        }
    }
}

/// The caller's role in a flight.
pub(crate) enum Joined<T> {
    /// This caller started the flight: it must hand the `Completion` to the
    /// flight that runs it (and may await it with [`Completion::awaiter`]).
    Leader(Completion<T>),
    /// A flight for the key was already under way.
    Follower(Awaiter<T>),
}

/// Publishes the flight's outcome once. Dropped without publishing, it still
/// removes the flight and the waiters get [`Error::FlightAbandoned`].
pub(crate) struct Completion<T> {
    map: Map<T>,
    key: String,
    id: u64,
    slot: Arc<Slot<T>>,
    /// Whether the outcome was published (else `Drop` publishes
    /// `FlightAbandoned`).
    published: bool,
}

/// Awaits a flight's outcome.
pub(crate) struct Awaiter<T> {
    slot: Arc<Slot<T>>,
}

impl<T> Coalescer<T> {
    /// Detaches the key's flight (if any): it still answers the callers
    /// that joined it, but later callers start a new one. `set` and
    /// `invalidate` call this once their write is done, so no call that
    /// starts after they return gets an answer from before them.
    pub(crate) fn detach(&self, key: &str) {
        self.map.lock().remove(key);
    }
}

impl<T: Clone> Coalescer<T> {
    /// Joins the key's flight, or starts it.
    pub(crate) fn join(&self, key: &str) -> Joined<T> {
        self.join_in_span(key, None)
    }

    /// Joins the key's flight, or starts it with `span` (the caller's
    /// span's id, if recorded) as the span its followers follow from.
    pub(crate) fn join_in_span(&self, key: &str, span: Option<tracing::Id>) -> Joined<T> {
        let mut map = self.map.lock();
        if let Some((_, slot)) = map.get(key) {
            slot.followers.fetch_add(1, Ordering::Relaxed);
            return Joined::Follower(Awaiter { slot: slot.clone() });
        }
        Joined::Leader(self.start(&mut map, key, span))
    }

    /// Starts a flight for the key whatever is under way: an older one is
    /// detached (it still answers its own callers), and later callers join
    /// this one. The flag says whether an older one was under way.
    pub(crate) fn lead(&self, key: &str) -> (Completion<T>, bool) {
        let mut map = self.map.lock();
        let replaced = map.contains_key(key);
        (self.start(&mut map, key, None), replaced)
    }

    fn start(&self, map: &mut Entries<T>, key: &str, span: Option<tracing::Id>) -> Completion<T> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Slot::new(span);
        map.insert(key.to_owned(), (id, slot.clone()));
        Completion {
            map: self.map.clone(),
            key: key.to_owned(),
            id,
            slot,
            published: false,
        }
    }

    /// Flights under way.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }
}

impl<T> Completion<T> {
    /// Removes the flight from the map, then publishes the outcome. In that
    /// order: a caller that arrives once the outcome is visible must start a
    /// new flight (and read the backend), never pick up a finished answer;
    /// otherwise a call made right after an `invalidate` or `set` could get
    /// an answer from before it. Regression test: `coalesce::tests::
    /// a_caller_after_completion_starts_a_new_flight`.
    pub(crate) fn complete(mut self, outcome: Result<T, Error>) {
        self.remove();
        self.published = true;
        self.slot.publish(outcome);
    }

    /// Like [`complete`](Self::complete), for a leader that has the outcome
    /// itself: returns it, and clones it only if another caller joined.
    pub(crate) fn complete_shared(mut self, outcome: Result<T, Error>) -> Result<T, Error>
    where
        T: Clone,
    {
        self.remove();
        self.published = true;
        // Removed from the map first: nobody can join any more, so if this
        // completion holds the only reference, nobody ever will.
        if Arc::strong_count(&self.slot) > 1 {
            self.slot.publish(outcome.clone());
        }
        outcome
    }

    /// The callers of this flight so far: its leader and those that joined.
    pub(crate) fn callers(&self) -> u64 {
        1 + self.slot.followers.load(Ordering::Relaxed)
    }

    /// An awaiter of this flight.
    pub(crate) fn awaiter(&self) -> Awaiter<T> {
        Awaiter {
            slot: self.slot.clone(),
        }
    }

    fn remove(&self) {
        let mut map = self.map.lock();
        if map
            .get(&self.key)
            .is_some_and(|(current, _)| *current == self.id)
        {
            map.remove(&self.key);
        }
    }
}

impl<T> Drop for Completion<T> {
    fn drop(&mut self) {
        self.remove();
        if !self.published {
            self.slot.publish(Err(Error::FlightAbandoned));
        }
    }
}

impl<T> Awaiter<T> {
    /// The span of the flight's leader, if recorded.
    pub(crate) fn leader_span(&self) -> Option<&tracing::Id> {
        self.slot.leader_span.as_ref()
    }
}

impl<T: Clone> Awaiter<T> {
    pub(crate) async fn outcome(self) -> Result<T, Error> {
        loop {
            let published = self.slot.published.notified();
            tokio::pin!(published);
            // Registered before the check: a publication between the check
            // and the wait still wakes it.
            published.as_mut().enable();
            if let Some(outcome) = self.slot.outcome.lock().as_ref() {
                return outcome.clone();
            }
            published.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_leader_and_shared_outcome() {
        let flights = Coalescer::<u32>::default();
        let Joined::Leader(done) = flights.join("k") else {
            panic!("first caller leads")
        };
        let w1 = done.awaiter();
        let Joined::Follower(w2) = flights.join("k") else {
            panic!("second caller follows")
        };
        assert_eq!(flights.len(), 1);
        done.complete(Ok(7));
        assert_eq!(flights.len(), 0);
        assert_eq!(w1.outcome().await.unwrap(), 7);
        assert_eq!(w2.outcome().await.unwrap(), 7);
        assert!(
            matches!(flights.join("k"), Joined::Leader(..)),
            "a new flight after completion"
        );
    }

    /// Regression: the outcome used to be published before the flight left
    /// the map, so a caller arriving in between (on another worker thread)
    /// joined a finished flight and got a stale answer (seen as a flaky
    /// "expected Hit, got Loaded" on real Redis). A thread that sees the
    /// outcome must always find the flight gone.
    #[test]
    fn a_caller_after_completion_starts_a_new_flight() {
        let flights = Arc::new(Coalescer::<u32>::default());
        for _ in 0..2_000 {
            let Joined::Leader(done) = flights.join("k") else {
                panic!("previous flight still registered")
            };
            let observer = {
                let flights = flights.clone();
                let slot = done.slot.clone();
                std::thread::spawn(move || {
                    while slot.outcome.lock().is_none() {
                        std::hint::spin_loop();
                    }
                    matches!(flights.join("k"), Joined::Leader(..))
                })
            };
            done.complete(Ok(1));
            assert!(observer.join().unwrap(), "joined a finished flight");
        }
    }

    #[tokio::test]
    async fn abandoned_flight_releases_waiters() {
        let flights = Coalescer::<u32>::default();
        let Joined::Leader(done) = flights.join("k") else {
            panic!()
        };
        let w1 = done.awaiter();
        drop(done);
        assert!(matches!(w1.outcome().await, Err(Error::FlightAbandoned)));
        assert_eq!(flights.len(), 0);
    }
}
