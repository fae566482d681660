//! In-process coalescing: per key, one flight per process talks to the
//! backend and every other local caller shares its answer.
//!
//! The map lookup and insert happen under one lock (the key's shard's), so
//! exactly one caller becomes the leader however many arrive together. The
//! leader holds the [`Completion`]: it makes the flight's first read in its
//! own task and hands the rest to a spawned [`Flight`](crate::flight::Flight);
//! if it is dropped during that read, the flight starts over in a task of
//! its own (`hit.rs`, `LeaderGuard`). So dropping any caller (the leader
//! included) neither cancels the load nor strands the others (the trap of
//! moka#240 and of several single-flight crates).
//!
//! A flight is on the path of every hit past the L1, so it costs what it
//! must and no more: one allocation (the key, shared by the map and the
//! completion) and two short critical sections on one of [`SHARDS`] locks
//! (two worker threads rarely meet on one). The [`Slot`] the outcome is
//! published in is made only when somebody will wait for it: the first
//! follower, or the leader handing the flight to a task.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::error::Error;

/// The shards of a coalescer's map (a power of two).
const SHARDS: usize = 16;

/// Where a flight's outcome is published: set once, then every awaiter is
/// woken.
struct Slot<T> {
    outcome: Mutex<Option<Result<T, Error>>>,
    published: Notify,
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

/// A flight under way.
#[derive(Debug)]
struct Entry<T> {
    /// Made by the first caller that waits for the outcome.
    slot: Option<Arc<Slot<T>>>,
    /// Callers that joined after the leader (for the
    /// `onefill_flight_callers` histogram).
    followers: u64,
    leader_span: Option<tracing::Id>,
}

impl<T> Entry<T> {
    fn slot(&mut self) -> Arc<Slot<T>> {
        let leader_span = &self.leader_span;
        self.slot
            .get_or_insert_with(|| Slot::new(leader_span.clone()))
            .clone()
    }
}

/// One shard: the flights callers can join, keyed by an `Arc<str>` the
/// flight's [`Completion`] shares, and the detached ones, which still
/// answer the callers that joined them. A flight is told from another of
/// the same key by that `Arc`'s address (its id: unique while the
/// completion holds it, and no counter shared by every flight).
#[derive(Debug)]
struct Shard<T> {
    live: HashMap<Arc<str>, Entry<T>, quick_cache::DefaultHashBuilder>,
    detached: HashMap<usize, Entry<T>, quick_cache::DefaultHashBuilder>,
}

/// A flight's id: the address of its key's `Arc`.
fn id_of(key: &Arc<str>) -> usize {
    Arc::as_ptr(key).cast::<u8>() as usize
}

impl<T> Default for Shard<T> {
    fn default() -> Self {
        Shard {
            live: HashMap::default(),
            detached: HashMap::default(),
        }
    }
}

impl<T> Shard<T> {
    /// Moves the key's live flight (if any) to the detached ones.
    fn detach(&mut self, key: &str) -> bool {
        match self.live.remove_entry(key) {
            Some((key, entry)) => {
                self.detached.insert(id_of(&key), entry);
                true
            }
            None => false,
        }
    }

    /// The flight of `key` (the completion's `Arc`), live or detached.
    fn find(&mut self, key: &Arc<str>) -> Option<&mut Entry<T>> {
        match self.live.get_key_value(&**key) {
            Some((live, _)) if Arc::ptr_eq(live, key) => self.live.get_mut(&**key),
            _ => self.detached.get_mut(&id_of(key)),
        }
    }

    /// Takes the flight of `key` (the completion's `Arc`) out, live or
    /// detached (one lookup for a live one: the common case, every hit's).
    fn take(&mut self, key: &Arc<str>) -> Option<Entry<T>> {
        match self.live.remove_entry(&**key) {
            Some((live, entry)) if Arc::ptr_eq(&live, key) => Some(entry),
            Some((live, newer)) => {
                self.live.insert(live, newer);
                self.detached.remove(&id_of(key))
            }
            None => self.detached.remove(&id_of(key)),
        }
    }
}

/// ahash (quick_cache's hasher, randomly keyed) rather than SipHash: the
/// map is looked up on every call that misses the L1.
#[derive(Debug)]
struct Shards<T> {
    shards: Box<[Mutex<Shard<T>>]>,
    hasher: quick_cache::DefaultHashBuilder,
}

impl<T> Shards<T> {
    fn of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) & (SHARDS - 1)
    }
}

/// The map of flights under way in one [`Cache`](crate::Cache).
#[derive(Debug)]
pub(crate) struct Coalescer<T> {
    map: Arc<Shards<T>>,
}

impl<T> Default for Coalescer<T> {
    fn default() -> Self {
        Coalescer {
            map: Arc::new(Shards {
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                hasher: quick_cache::DefaultHashBuilder::default(),
            }),
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
    map: Arc<Shards<T>>,
    shard: usize,
    /// The flight's key, and its id (see [`Shard`]).
    key: Arc<str>,
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
        self.map.shards[self.map.of(key)].lock().detach(key);
    }

    /// Detaches every flight under way (a mark of the namespace may judge
    /// what any of them read).
    pub(crate) fn detach_all(&self) {
        for shard in &self.map.shards {
            let mut shard = shard.lock();
            let live: Vec<Arc<str>> = shard.live.keys().cloned().collect();
            for key in live {
                shard.detach(&key);
            }
        }
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
        let shard = self.map.of(key);
        let mut map = self.map.shards[shard].lock();
        if let Some(entry) = map.live.get_mut(key) {
            entry.followers += 1;
            return Joined::Follower(Awaiter { slot: entry.slot() });
        }
        Joined::Leader(self.start(&mut map, shard, key, span))
    }

    /// Starts a flight for the key whatever is under way: an older one is
    /// detached (it still answers its own callers), and later callers join
    /// this one. The flag says whether an older one was under way.
    pub(crate) fn lead(&self, key: &str) -> (Completion<T>, bool) {
        let shard = self.map.of(key);
        let mut map = self.map.shards[shard].lock();
        let replaced = map.detach(key);
        (self.start(&mut map, shard, key, None), replaced)
    }

    fn start(
        &self,
        map: &mut Shard<T>,
        shard: usize,
        key: &str,
        leader_span: Option<tracing::Id>,
    ) -> Completion<T> {
        let key: Arc<str> = Arc::from(key);
        let entry = Entry {
            slot: None,
            followers: 0,
            leader_span,
        };
        map.live.insert(key.clone(), entry);
        Completion {
            map: self.map.clone(),
            shard,
            key,
            published: false,
        }
    }

    /// Flights under way (detached ones included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map
            .shards
            .iter()
            .map(|s| {
                let s = s.lock();
                s.live.len() + s.detached.len()
            })
            .sum()
    }
}

impl<T> Completion<T> {
    /// The flight's key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Removes the flight from the map, then publishes the outcome, and
    /// says how many callers the flight had (its leader and those that
    /// joined). In that order: a caller that arrives once the outcome is
    /// visible must start a new flight (and read the backend), never pick
    /// up a finished answer; otherwise a call made right after an
    /// `invalidate` or `set` could get an answer from before it. Regression
    /// test: `coalesce::tests::a_caller_after_completion_starts_a_new_flight`.
    pub(crate) fn complete(mut self, outcome: Result<T, Error>) -> u64 {
        let entry = self.remove();
        self.published = true;
        let (slot, callers) = Self::parts(entry);
        if let Some(slot) = slot {
            slot.publish(outcome);
        }
        callers
    }

    /// Like [`complete`](Self::complete), for a leader that has the outcome
    /// itself: returns it, and clones it only if somebody waits for it.
    pub(crate) fn complete_shared(mut self, outcome: Result<T, Error>) -> (Result<T, Error>, u64)
    where
        T: Clone,
    {
        let entry = self.remove();
        self.published = true;
        // Removed from the map first: nobody can join any more, so without
        // a slot nobody ever will wait.
        let (slot, callers) = Self::parts(entry);
        if let Some(slot) = slot {
            slot.publish(outcome.clone());
        }
        (outcome, callers)
    }

    fn parts(entry: Option<Entry<T>>) -> (Option<Arc<Slot<T>>>, u64) {
        match entry {
            Some(entry) => (entry.slot, 1 + entry.followers),
            None => (None, 1),
        }
    }

    /// An awaiter of this flight.
    pub(crate) fn awaiter(&self) -> Awaiter<T> {
        let mut map = self.map.shards[self.shard].lock();
        match map.find(&self.key) {
            Some(entry) => Awaiter { slot: entry.slot() },
            // Not reachable: only this completion takes its entry out.
            None => {
                let slot = Slot::new(None);
                slot.publish(Err(Error::FlightAbandoned));
                Awaiter { slot }
            }
        }
    }

    /// Takes this flight's entry out of the map (one lookup on a hit).
    fn remove(&self) -> Option<Entry<T>> {
        self.map.shards[self.shard].lock().take(&self.key)
    }
}

impl<T> Drop for Completion<T> {
    fn drop(&mut self) {
        // A published flight was taken out when it was published.
        if !self.published {
            if let Some(slot) = self.remove().and_then(|entry| entry.slot) {
                slot.publish(Err(Error::FlightAbandoned));
            }
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
                let slot = done.awaiter().slot;
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

    /// A detached flight that completes leaves the newer flight of its key
    /// in place (detached flights are kept apart, by id).
    #[test]
    fn a_detached_flight_completing_keeps_the_newer_one() {
        let flights = Coalescer::<u32>::default();
        let Joined::Leader(old) = flights.join("k") else {
            panic!("no flight yet")
        };
        flights.detach("k");
        let Joined::Leader(new) = flights.join("k") else {
            panic!("the detached flight was joined")
        };
        assert_eq!(old.complete_shared(Ok(1)).0.unwrap(), 1);
        assert!(
            matches!(flights.join("k"), Joined::Follower(..)),
            "the newer flight was removed with the old one"
        );
        assert_eq!(flights.len(), 1);
        assert_eq!(new.complete_shared(Ok(2)).0.unwrap(), 2);
        assert_eq!(flights.len(), 0);
    }

    /// The callers count (`onefill_flight_callers`) comes from the entry,
    /// whether or not anybody made a slot; a lone leader makes none.
    #[tokio::test]
    async fn completion_counts_its_callers() {
        let flights = Coalescer::<u32>::default();
        let Joined::Leader(alone) = flights.join("a") else {
            panic!("no flight yet")
        };
        let (answer, callers) = alone.complete_shared(Ok(1));
        assert_eq!((answer.unwrap(), callers), (1, 1));
        let Joined::Leader(done) = flights.join("k") else {
            panic!("no flight yet")
        };
        let Joined::Follower(f1) = flights.join("k") else {
            panic!("joins")
        };
        let Joined::Follower(f2) = flights.join("k") else {
            panic!("joins")
        };
        assert_eq!(done.complete(Ok(3)), 3);
        assert_eq!(f1.outcome().await.unwrap(), 3);
        assert_eq!(f2.outcome().await.unwrap(), 3);
        assert_eq!(flights.len(), 0);
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
