//! One flight: a key's backend conversation in this process, from the first
//! read to the answer every local caller shares, then any refresh.
//!
//! The leader makes the first read in its own task (`hit.rs`: a fresh hit
//! ends there, without a flight); anything else becomes a flight that goes
//! on from what the read found ([`Flight::from_start`],
//! [`Flight::first_read_found`]), in a task of its own past an answer, so
//! no caller's cancellation can stop it. The flight owns its whole
//! lifecycle: run the protocol, remember the answer for outages, keep it
//! in the L1, complete the callers, refresh in the background if asked.
//!
//! ```text
//! read ───── fresh ──────────────────────────────► Hit (maybe refresh early)
//!    │ stale (in grace) ──────────────────────────► Stale + background refresh
//!    ▼ miss
//! acquire ── fresh (someone just filled) ─────────► Hit
//!    │ won ── load (watchdog) ── fill (fenced) ───► Loaded
//!    ▼ held
//! subscribe, re-check: on a notification (a read first, then acquire
//!    │ unless fresh), at the holder's lease expiry, at a safety-net poll
//!    │ fresh ─────────────────────────────────────► Waited
//!    │ won (holder died or failed) ── load ───────► Loaded
//!    ▼ deadline
//! OnWaitTimeout: stale / one degraded load / error
//! ```
//!
//! A backend failure at any step degrades (stale, else a load without the
//! lease, at most one per process per key thanks to the coalescer) unless
//! the policy is strict.
//!
//! The flight is driven alone (a single call) or with the other flights
//! of a batch, which make their reads, lease requests and loads together
//! through a [`Group`]; the protocol is this one either way. Its parts:
//! this file holds the flight's state and lifecycle (start, publication,
//! what follows the answer); `read.rs` the reads and what they mean;
//! `miss.rs` the lease or the wait, and degradation; `load.rs` the load,
//! the fill or release, the soft timeout and the refresh; `stored.rs` an
//! L1 entry's deadlines and the early-refresh window.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tracing::Instrument;

use crate::answer::{Answer, Outcome};
use crate::budget::Budget;
use crate::coalesce::{Awaiter, Completion};
use crate::error::{BackendError, Error};
use crate::group::Group;
use crate::key::FillKeys;
use crate::l1::Ticket;
use crate::loader::Load;
use crate::options::{Policy, MAX_TTL};
use crate::shared::Shared;
use crate::stats::Recorder;

mod load;
mod miss;
mod read;
mod stored;

use load::{DeferredFill, DeferredLoad};
pub(crate) use stored::{early_refresh, StoredFreshness};

/// What a flight notes before its first read: the cache's write epoch (see
/// `fallback.rs`) and the L1's ticket for the key (see `l1.rs`), so that
/// nothing written or reported meanwhile is overwritten by its answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    pub epoch: u64,
    pub l1_ticket: Option<Ticket>,
}

impl Start {
    pub(crate) fn now<V: Clone + Send + Sync + 'static>(shared: &Shared<V>, key: &str) -> Start {
        Start {
            epoch: shared.epoch.load(Ordering::SeqCst),
            l1_ticket: shared.l1.as_ref().map(|l1| l1.ticket(key)),
        }
    }
}

/// When a value the server reported `ttl` left for at `now` expires there
/// (the outage fallback serves it no longer, fail-safe not past it).
pub(crate) fn server_expiry(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl).unwrap_or(now + MAX_TTL * 2)
}

/// Why a background refresh runs (for the counters).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refresh {
    /// Served stale in the grace window.
    Stale,
    /// The value is due for early refresh; the window is handed to `acquire`.
    Early(Duration),
}

/// One flight: a key, its policy and its (not yet run) loader.
pub(crate) struct Flight<V> {
    shared: Arc<Shared<V>>,
    keys: FillKeys,
    policy: Policy,
    /// Taken by the one load this flight may run. In a mutex only to make
    /// the flight `Sync` (its methods hold `&self` across awaits inside a
    /// spawned task), since the caller's loader need not be.
    load: Mutex<Option<Load<V>>>,
    /// The cache's write epoch when the flight started (see `fallback.rs`).
    epoch: u64,
    /// The answer came from the outage fallback: not recorded again, so
    /// serving a value never renews its life (see `value_expires`).
    from_fallback: bool,
    /// The backend time left before the callers must be answered.
    budget: Budget,
    /// When the value last read or written expires on the server (from the
    /// remaining hard TTL it reported, or the TTL it was written with;
    /// `None` before any, and for a new value not stored): the outage
    /// fallback serves the answer no longer than that, and fail-safe does
    /// not serve a stale value past it.
    value_expires: Mutex<Option<Instant>>,
    /// The grace window of the stale value last read (from its envelope: a
    /// loader may have chosen it): a fail-safe re-store keeps it, not the
    /// cache's, so the grace it was stored with still follows the throttle.
    stale_grace: Mutex<Option<Duration>>,
    /// The marks of the stale value last read (the generation it was
    /// loaded at, its tags): a fail-safe re-store keeps them, so a tag's
    /// later invalidation still reaches it and an earlier one is not
    /// forgotten.
    stale_marks: Mutex<(u64, Vec<String>)>,
    /// The namespace's mark generation when this flight's load began: a
    /// cached failure records it.
    load_as_of: std::sync::atomic::AtomicU64,
    /// A fill put off until after the callers were answered, because the
    /// budget was spent by then.
    deferred_fill: Option<Box<DeferredFill>>,
    /// A load still running when the soft timeout answered the callers
    /// stale: finished (filled or released) after the answer. In a mutex
    /// only to keep the flight `Sync`, as `load`.
    deferred_load: Mutex<Option<Box<DeferredLoad<V>>>>,
    /// The user key (the L1's key).
    key: String,
    /// Taken before the first read: the L1 keeps the answer only if no
    /// change of the key was reported since (see `l1.rs`).
    l1_ticket: Option<Ticket>,
    /// The answer's value as stored: set by a read or a successful fill,
    /// for the L1.
    l1_fresh: Mutex<Option<StoredFreshness>>,
    /// This flight refreshes a value that is still fresh (early refresh):
    /// if its load fails, nothing is written (no fail-safe re-store, no
    /// cached failure over a fresh value).
    refreshing_fresh: bool,
    /// The group this flight makes its reads, lease requests and load
    /// with (a batch's), or `None`: it makes them alone.
    group: Option<Arc<dyn Group<V>>>,
    /// The loader said its value must not be stored
    /// ([`Loaded::no_store`](crate::Loaded::no_store)): the answer outlives
    /// the flight nowhere (no L1 entry, no copy for outages).
    not_stored: bool,
}

/// A flight's answer, or where it will be published.
pub(crate) enum Pending<V> {
    /// Answered at once (the first read answered).
    Ready(Result<Answer<V>, Error>),
    /// The flight goes on in a task of its own.
    Running(Awaiter<Answer<V>>),
}

/// What the first read of a flight found.
pub(crate) enum FirstRead<V> {
    /// The answer (a hit, stale in grace, a cached failure), and any
    /// refresh to run after it.
    Answered(Result<Answer<V>, Error>, Option<Refresh>),
    /// Nothing usable: the lease is next. `stale`: a stale value read (with
    /// a soft timeout, it waits for a load before it is served).
    Miss {
        unreadable: bool,
        stale: Option<Option<V>>,
    },
    /// The backend failed.
    Failed(BackendError),
}

impl<V: Clone + Send + Sync + 'static> Flight<V> {
    /// Runs the flight in a task of its own from `first` (its first read,
    /// already made by the leader), or from the start.
    pub(crate) fn spawn_from(self, first: Option<FirstRead<V>>, completion: Completion<Answer<V>>) {
        // The leader's call span: the task's spans (lease, wait, load,
        // backend calls) are its children, up to the answer.
        let call = tracing::Span::current();
        // Boxed: the flight's state machine is large, and a box is cheaper
        // to hand to the task than a copy of it (measured with callgrind).
        tokio::spawn(Box::pin(self.drive(first, completion, call)));
    }

    /// The flight's whole life from `first` (or from the start): the
    /// protocol up to the callers' answer (in `call`, the span of the call
    /// that started it), its publication, then whatever follows the answer
    /// (a deferred fill or load, a background refresh). A single call's
    /// flight runs it in a task of its own; a batch runs its flights'
    /// side by side in its task.
    pub(crate) async fn drive(
        mut self,
        first: Option<FirstRead<V>>,
        completion: Completion<Answer<V>>,
        call: tracing::Span,
    ) {
        let to_answer = async {
            match first {
                Some(first) => self.after_first_read(first).await,
                None => self.run().await,
            }
        };
        let (answer, refresh) = to_answer.instrument(call.clone()).await;
        self.publish(answer, refresh.is_some(), |answer| {
            ((), completion.complete(answer))
        });
        self.after_answer(refresh, call).await;
    }

    /// After the first read: a read that answered completes the callers
    /// here (and starts any refresh in the background); anything else goes
    /// on in a task of its own.
    pub(crate) fn continue_from(
        self,
        first: FirstRead<V>,
        completion: Completion<Answer<V>>,
    ) -> Pending<V> {
        let FirstRead::Answered(answer, refresh) = first else {
            let awaiter = completion.awaiter();
            self.spawn_from(Some(first), completion);
            return Pending::Running(awaiter);
        };
        let answer = self.publish(answer, refresh.is_some(), |answer| {
            completion.complete_shared(answer)
        });
        if refresh.is_some() {
            let call = tracing::Span::current();
            tokio::spawn(Box::pin(self.after_answer(refresh, call)));
        }
        Pending::Ready(answer)
    }

    /// Charges the flight's backend budget with time its leader spent on
    /// its first read (failures only, as the budget counts).
    pub(crate) fn charge(&self, spent: Duration) {
        self.budget.charge(spent);
    }

    /// The read about to be handed to this flight (its leader's first
    /// read) began at `at`.
    pub(crate) fn read_began_at(&self, at: Instant) {
        self.budget.began(at);
    }

    /// When the read being noted began: the deadlines of what it found
    /// count from then, so they are the server's or sooner, never later
    /// (its TTL was read after: counted from the reply, an L1 entry or the
    /// outage fallback would outlive the server's copy by the reply's
    /// latency).
    fn read_began(&self) -> Instant {
        self.budget.last_began().unwrap_or_else(Instant::now)
    }

    /// The background refresh of a value the L1 served stale (one per key
    /// per process, one fleet-wide, as for a stale read): a root span of
    /// its own that follows from the current one.
    pub(crate) fn refresh_stale(self) -> impl Future<Output = ()> + Send {
        let span = self.refresh_span(Refresh::Stale, &tracing::Span::current());
        self.refresh(Refresh::Stale).instrument(span)
    }

    pub(crate) fn new(
        shared: Arc<Shared<V>>,
        key: String,
        keys: FillKeys,
        policy: Policy,
        load: Load<V>,
    ) -> Self {
        let start = Start::now(&shared, &key);
        Self::from_start(shared, key, keys, policy, load, start)
    }

    /// A flight whose [`Start`] was noted already (its first read was made
    /// without it, see `hit.rs`).
    pub(crate) fn from_start(
        shared: Arc<Shared<V>>,
        key: String,
        keys: FillKeys,
        policy: Policy,
        load: Load<V>,
        start: Start,
    ) -> Self {
        Flight {
            epoch: start.epoch,
            l1_ticket: start.l1_ticket,
            l1_fresh: Mutex::new(None),
            key,
            shared,
            keys,
            budget: Budget::new(policy.backend_timeout),
            load: Mutex::new(Some(load)),
            from_fallback: false,
            deferred_fill: None,
            deferred_load: Mutex::new(None),
            value_expires: Mutex::new(None),
            stale_grace: Mutex::new(None),
            stale_marks: Mutex::default(),
            load_as_of: std::sync::atomic::AtomicU64::new(0),
            refreshing_fresh: false,
            group: None,
            not_stored: false,
            policy,
        }
    }

    /// This flight makes its reads, lease requests and load with `group`.
    pub(crate) fn in_group(mut self, group: Arc<dyn Group<V>>) -> Self {
        self.group = Some(group);
        self
    }

    /// After the callers' answer: the deferred fill, then any refresh,
    /// each in a span of its own that follows from the call's (`call`),
    /// not inside it: the call's span ends with its answer.
    async fn after_answer(mut self, refresh: Option<Refresh>, call: tracing::Span) {
        // Off the callers' path from here: a full budget again.
        self.budget.refill();
        let deferred = self.deferred_load.lock().take().map(|d| *d);
        if let Some(DeferredLoad {
            lease,
            loading,
            stale,
        }) = deferred
        {
            let span = tracing::info_span!(
                parent: None,
                "onefill.deferred_load",
                namespace = self.shared.namespace.as_str(),
            );
            span.follows_from(&call);
            let finish = async {
                let loaded = loading.await;
                let answer = self.store_loaded(lease, loaded, stale).await;
                if answer.is_ok() {
                    self.keep(&answer, false);
                }
            };
            finish.instrument(span).await;
        }
        if let Some(fill) = self.deferred_fill.take() {
            let timeout = self.policy.backend_timeout;
            let span = tracing::info_span!(
                parent: None,
                "onefill.deferred_fill",
                namespace = self.shared.namespace.as_str(),
            );
            span.follows_from(&call);
            let _ = fill
                .lease
                .fill(&self.shared.calls, timeout, &fill.bytes, fill.ttl)
                .instrument(span)
                .await;
        }
        if let Some(why) = refresh {
            let span = self.refresh_span(why, &call);
            drop(call);
            self.refresh(why).instrument(span).await;
        }
    }

    /// The span of a background refresh: a root (nobody waits for it)
    /// that follows from the span that caused it.
    fn refresh_span(&self, why: Refresh, cause: &tracing::Span) -> tracing::Span {
        let reason = match why {
            Refresh::Stale => "stale",
            Refresh::Early(_) => "early",
        };
        let span = tracing::info_span!(
            parent: None,
            "onefill.refresh",
            namespace = self.shared.namespace.as_str(),
            reason,
        );
        span.follows_from(cause);
        span
    }

    /// Publishes the answer: kept for outages and in the L1
    /// (`refreshing`: a refresh follows it), then handed to the callers by
    /// `complete` (which says how many they were), and counted. The one
    /// place an answer is published, whoever drives the flight.
    fn publish<R>(
        &self,
        answer: Result<Answer<V>, Error>,
        refreshing: bool,
        complete: impl FnOnce(Result<Answer<V>, Error>) -> (R, u64),
    ) -> R {
        self.keep(&answer, refreshing);
        let (answered, callers) = complete(answer);
        self.rec().flight_callers(callers);
        answered
    }

    /// Keeps an answer for outages and in the L1, unless its loader said
    /// it must not be stored.
    fn keep(&self, answer: &Result<Answer<V>, Error>, refreshing: bool) {
        if self.not_stored {
            return;
        }
        self.remember(answer);
        self.keep_in_l1(answer, refreshing);
    }

    /// Keeps the answer in the L1, with the freshness the backend gave it:
    /// a value read (fresh, or stale in grace with a refresh under way) or
    /// stored by this flight's fill. Nothing else (a degraded load, an
    /// outage's or fail-safe's stale value) is known to be what the backend
    /// holds.
    fn keep_in_l1(&self, answer: &Result<Answer<V>, Error>, refreshing: bool) {
        let (Some(l1), Some(ticket)) = (&self.shared.l1, self.l1_ticket) else {
            return;
        };
        let Ok((value, outcome)) = answer else {
            return;
        };
        let eligible = match outcome {
            Outcome::Hit | Outcome::Loaded | Outcome::Waited => true,
            Outcome::Stale => refreshing && !self.from_fallback,
            Outcome::Degraded => false,
        };
        let fresh = *self.l1_fresh.lock();
        let expires = *self.value_expires.lock();
        let (true, Some(stored), Some(expires_at)) = (eligible, fresh, expires) else {
            return;
        };
        let entry = stored.l1_entry(&self.policy, value.clone(), expires_at);
        l1.insert(&self.key, entry, ticket);
    }

    fn rec(&self) -> &Recorder {
        &self.shared.recorder
    }

    /// Remembers the answer for outages (see `fallback.rs`).
    fn remember(&self, answer: &Result<Answer<V>, Error>) {
        if self.from_fallback {
            return;
        }
        if let Ok((value, _)) = answer {
            let usable_until = self
                .value_expires
                .lock()
                .unwrap_or_else(|| Instant::now() + self.policy.ttl + self.policy.grace);
            self.shared.remember(
                &self.key,
                self.keys.value(),
                value,
                usable_until,
                self.epoch,
                self.l1_ticket,
            );
        }
    }

    async fn call<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        self.budget
            .run(op, |timeout| {
                self.shared.calls.call(&self.keys, timeout, op, fut)
            })
            .await
    }
}

/// Takes the key out of the `refreshing` set when the refresh ends, however
/// it ends.
pub(crate) struct RefreshingGuard<V> {
    shared: Arc<Shared<V>>,
    key: String,
    /// The mark's number ([`Refreshing::start`](crate::refreshing::Refreshing::start)).
    id: u64,
}

impl<V> RefreshingGuard<V> {
    /// The refresh only waits out another process's lease now.
    pub(crate) fn pause(&self) {
        self.shared.refreshing.pause(&self.key, self.id);
    }
}

impl<V> Drop for RefreshingGuard<V> {
    fn drop(&mut self) {
        self.shared.refreshing.end(&self.key, self.id);
    }
}
