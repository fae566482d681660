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

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

use crate::answer::{Answer, Outcome};
use crate::backend::Stored;
use crate::budget::Budget;
use crate::coalesce::{Awaiter, Completion};
use crate::envelope::{self, Kind};
use crate::error::{BackendError, Error};
use crate::freshness;
use crate::group::{step_dropped, Group};
use crate::key::FillKeys;
use crate::l1::Ticket;
use crate::lease::{Acquisition, Lease, LeaseTtl};
use crate::loader::{self, Done, Load, Loaded, Place, Sharing};
use crate::options::{Policy, MAX_TTL};
use crate::shared::{Read, Shared};
use crate::stats::Recorder;
use crate::wait::{AtDeadline, Next, Wait};

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
    /// cache's (review of issue 10, finding 8).
    stale_grace: Mutex<Option<Duration>>,
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

/// What the L1 needs of the value stored for the answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoredFreshness {
    /// When it stops being fresh.
    pub fresh_until: Instant,
    /// How long its load took.
    pub delta: Duration,
    /// At most the fresh TTL it was written with, if recorded.
    pub written_ttl: Option<Duration>,
    /// The grace window it was written with.
    pub grace: Duration,
    /// Its encoded size.
    pub size: usize,
}

impl StoredFreshness {
    /// The freshness of `stored`, read at `now` with `fresh_for` left (the
    /// other fields from its envelope, see [`Read::Value`]).
    pub(crate) fn read(
        stored: &Stored,
        now: Instant,
        fresh_for: Duration,
        delta: Duration,
        written_ttl: Option<Duration>,
        grace: Duration,
    ) -> Self {
        StoredFreshness {
            fresh_until: now + fresh_for,
            delta,
            written_ttl,
            grace,
            size: stored.bytes.len(),
        }
    }

    /// The L1 entry of `value`, stored with this freshness and living on
    /// the server until `expires_at`. The one place an L1 entry's deadlines
    /// are decided (the hit path and a flight's answer).
    pub(crate) fn l1_entry<V>(
        self,
        policy: &Policy,
        value: Option<V>,
        expires_at: Instant,
    ) -> crate::l1::Entry<V> {
        let StoredFreshness {
            fresh_until,
            delta,
            written_ttl,
            grace,
            size,
        } = self;
        // With no freshness left, the window is the one a read would use.
        let window = early_refresh(policy, Duration::ZERO, delta, written_ttl, grace);
        let refresh_at = window
            .and_then(|w| fresh_until.checked_sub(w))
            .unwrap_or(fresh_until);
        crate::l1::Entry {
            value,
            fresh_until,
            refresh_at,
            expires_at,
            weight: u32::try_from(size).unwrap_or(u32::MAX),
        }
    }
}

/// The early-refresh window of a value with `fresh_for` left whose load
/// took `delta`, if it is due (see `freshness::early_refresh`), capped by
/// the fresh TTL it was written with if recorded (a loader may have chosen
/// it), else by the policy's.
///
/// Early refresh and the grace window answer the same question (who pays
/// for the refresh at expiry): with a grace window the first stale read
/// refreshes in the background, so early refresh would only add loads.
/// The grace is the value's own (from its envelope: a loader may have
/// chosen it), not the reader's policy's: a value stored without one has
/// no stale window on the server, whatever the cache says (review of
/// issue 10, finding 6). The one place this is decided,
/// for reads and for the L1's refresh point.
pub(crate) fn early_refresh(
    policy: &Policy,
    fresh_for: Duration,
    delta: Duration,
    written_ttl: Option<Duration>,
    grace: Duration,
) -> Option<Duration> {
    if !grace.is_zero() {
        return None;
    }
    let cap = match written_ttl {
        Some(ttl) => freshness::early_refresh_cap(ttl, 0.0),
        None => freshness::early_refresh_cap(policy.ttl, policy.jitter),
    };
    freshness::early_refresh(fresh_for, delta, policy.early_refresh_beta, cap)
}

/// A load under way, owned (not borrowing the flight), so it can go on
/// after the callers' answer.
type Loading<V> = Pin<Box<dyn Future<Output = Result<Done<V>, Error>> + Send>>;

/// A load the soft timeout left running: its lease (the watchdog still
/// extending it) and the stale value the callers got.
struct DeferredLoad<V> {
    lease: Lease,
    loading: Loading<V>,
    stale: Option<Option<V>>,
}

/// A fill to run once the callers have their answer.
struct DeferredFill {
    lease: Lease,
    bytes: Vec<u8>,
    ttl: Duration,
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
    /// (its TTL was read after; review of issue 9's second pass: counted
    /// from after the reply, an L1 entry or the outage fallback outlived
    /// the server's copy by the reply's latency).
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
            refreshing_fresh: false,
            group: None,
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

    /// Keeps an answer for outages and in the L1.
    fn keep(&self, answer: &Result<Answer<V>, Error>, refreshing: bool) {
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

    /// Runs the conversation up to the callers' answer, and says whether a
    /// background refresh should follow it.
    async fn run(&mut self) -> (Result<Answer<V>, Error>, Option<Refresh>) {
        let first = self.first_read().await;
        self.after_first_read(first).await
    }

    /// The rest of the conversation after its first read.
    async fn after_first_read(
        &mut self,
        first: FirstRead<V>,
    ) -> (Result<Answer<V>, Error>, Option<Refresh>) {
        match first {
            FirstRead::Answered(answer, refresh) => (answer, refresh),
            FirstRead::Failed(e) => (self.degrade(e, None).await, None),
            FirstRead::Miss { unreadable, stale } => {
                // A stale value read (with a soft timeout) was not counted
                // by the read: answered stale, it counts as a stale answer
                // only; anything else, as a miss (review of issue 10,
                // finding 7).
                let stale_read = stale.is_some();
                let answer = match self.policy.lease_ttl {
                    Some(lease) => self.lease_or_wait(lease, unreadable, stale).await,
                    None => self.load_without_waiting(unreadable, stale).await,
                };
                if stale_read && !matches!(answer, Ok((_, Outcome::Stale))) {
                    self.rec().miss();
                }
                (answer, None)
            }
        }
    }

    /// The first read of a flight started over (its leader was dropped
    /// during the read `hit.rs` makes): a hit (or stale in grace, or a
    /// cached failure) answers at once; a miss goes on to the lease.
    async fn first_read(&mut self) -> FirstRead<V> {
        let stored = self.read_stored().await;
        self.first_read_of(stored)
    }

    /// What the first read's answer means (the leader's read, or the
    /// flight's own).
    pub(crate) fn first_read_of(
        &mut self,
        stored: Result<Option<Stored>, BackendError>,
    ) -> FirstRead<V> {
        match stored {
            Ok(Some(stored)) => {
                let read = self.shared.read(&stored, Some(self.keys.value()));
                self.first_read_found(&stored, read)
            }
            Ok(None) => {
                self.rec().flight();
                self.rec().miss();
                FirstRead::Miss {
                    unreadable: false,
                    stale: None,
                }
            }
            Err(e) => {
                self.rec().flight();
                FirstRead::Failed(e)
            }
        }
    }

    /// What the first read found in `stored` (`read`, what
    /// [`Shared::read`] made of it) means.
    pub(crate) fn first_read_found(&mut self, stored: &Stored, read: Read<V>) -> FirstRead<V> {
        self.rec().flight();
        self.note_read(stored, &read);
        let mut unreadable = false;
        match read {
            Read::Value {
                value,
                fresh_for,
                delta,
                written_ttl,
                grace,
            } if !fresh_for.is_zero() => {
                self.rec().hit();
                let early = self.early_refresh(fresh_for, delta, written_ttl, grace);
                return FirstRead::Answered(Ok((value, Outcome::Hit)), early.map(Refresh::Early));
            }
            Read::Value { value, .. } if self.policy.soft_timeout.is_none() => {
                self.rec().stale_served();
                return FirstRead::Answered(Ok((value, Outcome::Stale)), Some(Refresh::Stale));
            }
            // With a soft timeout, a stale value waits for a load (up to
            // the soft timeout) before it is served. Counted by how it is
            // answered (see `after_first_read`, `count_stale_miss`).
            Read::Value { value, .. } => {
                return FirstRead::Miss {
                    unreadable: false,
                    stale: Some(value),
                };
            }
            Read::Failure {
                message,
                fresh: true,
            } => {
                self.rec().negative_hit();
                return FirstRead::Answered(Err(Error::CachedFailure(message)), None);
            }
            Read::Failure { fresh: false, .. } => {}
            Read::Unreadable => unreadable = true,
        }
        self.rec().miss();
        FirstRead::Miss {
            unreadable,
            stale: None,
        }
    }

    /// The miss path: take the lease and load, or wait for whoever has it.
    async fn lease_or_wait(
        &mut self,
        lease: LeaseTtl,
        mut unreadable: bool,
        mut stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        let mut waiting: Option<Wait> = None;
        let mut notified = false;
        // When the holder's lease runs out, as the last re-check saw it, and
        // whether a notification (a fill, a release, an invalidation) came
        // since: a lease won after that moment with no notice was taken
        // over from a holder that died or stalled.
        let mut holder_expires: Option<Instant> = None;
        let mut told = false;
        loop {
            // Notified: the fill has most likely landed, and a plain read
            // (`GET` + `PTTL`, as a hit) is cheaper than the acquire script.
            // Anything but a fresh answer goes on to acquire, which decides.
            if std::mem::take(&mut notified) {
                told = true;
                match self.read_stored().await {
                    Err(e) => {
                        self.finish_wait(waiting, false);
                        return self.degrade(e, stale).await;
                    }
                    Ok(Some(stored)) => match self.shared.read(&stored, None) {
                        Read::Value {
                            value, fresh_for, ..
                        } if !fresh_for.is_zero() => {
                            self.note_value_ttl(stored.ttl);
                            self.finish_wait(waiting, false);
                            return Ok((value, Outcome::Waited));
                        }
                        Read::Failure {
                            message,
                            fresh: true,
                        } => {
                            self.finish_wait(waiting, false);
                            self.rec().negative_hit();
                            return Err(Error::CachedFailure(message));
                        }
                        _ => {}
                    },
                    Ok(None) => {}
                }
            }
            // A value that is fresh on the server but unreadable here (another
            // type or version) must not block the lease: ask for it regardless,
            // once. Only once: if someone else holds the lease, they are
            // replacing it, and their fill must count as fresh again, or this
            // flight would win the lease they just freed and load a second
            // time (issue 8, fault 2).
            let window = if std::mem::take(&mut unreadable) {
                Duration::MAX
            } else {
                Duration::ZERO
            };
            let acquired = self.acquire(lease, window).await;
            let (held_stale, holder_ttl) = match acquired {
                Err(e) => {
                    self.finish_wait(waiting, false);
                    return self.degrade(e, stale).await;
                }
                Ok(Acquisition::Fresh(stored)) => match self.read(&stored) {
                    Read::Value { value, .. } => {
                        let outcome = if waiting.is_some() {
                            Outcome::Waited
                        } else {
                            Outcome::Hit
                        };
                        self.finish_wait(waiting, false);
                        return Ok((value, outcome));
                    }
                    Read::Failure { message, .. } => {
                        self.finish_wait(waiting, false);
                        self.rec().negative_hit();
                        return Err(Error::CachedFailure(message));
                    }
                    Read::Unreadable => {
                        unreadable = true;
                        continue;
                    }
                },
                Ok(Acquisition::Won {
                    lease,
                    stale: won_stale,
                }) => {
                    if !told && holder_expires.is_some_and(|at| Instant::now() >= at) {
                        self.rec().lease_takeover();
                    }
                    self.finish_wait(waiting, false);
                    let stale = self.stale_value(won_stale).or(stale);
                    return self.load_leased(lease, stale).await;
                }
                Ok(Acquisition::Held { stale, lease_ttl }) => (stale, lease_ttl),
            };
            holder_expires = Some(Instant::now() + holder_ttl);
            told = false;
            self.rec().lease_contended();
            if let Some(value) = self.stale_value(held_stale) {
                stale = Some(value);
            }
            let Some(wait) = waiting.as_mut() else {
                // First contention: serve stale if there is one (the holder is
                // refreshing it), else subscribe and re-check at once, so a
                // fill between this acquire and the subscription is not lost.
                if let Some(value) = stale.take() {
                    self.rec().stale_served();
                    return Ok((value, Outcome::Stale));
                }
                let subscribe = self.shared.calls.backend.subscribe(&self.keys);
                let subscription = self.call("subscribe", subscribe).await.ok();
                waiting = Some(Wait::start(self.rec(), &self.policy.wait, subscription));
                continue;
            };
            match wait.until_recheck(self.rec(), holder_ttl).await {
                Next::Notified => notified = true,
                Next::Recheck => {}
                Next::Deadline => {
                    self.finish_wait(waiting, true);
                    return match self.policy.wait.at_deadline(stale) {
                        AtDeadline::Serve(value) => {
                            self.rec().stale_served();
                            Ok((value, Outcome::Stale))
                        }
                        AtDeadline::Load => self.load_unstored().await,
                        AtDeadline::Fail(error) => Err(error),
                    };
                }
            }
        }
    }

    fn finish_wait(&self, waiting: Option<Wait>, timed_out: bool) {
        if let Some(wait) = waiting {
            wait.finish(self.rec(), timed_out);
        }
    }

    /// The backend failed: strict mode surfaces it; otherwise serve stale,
    /// else load without the lease (the coalescer keeps it to one per
    /// process).
    async fn degrade(
        &mut self,
        error: BackendError,
        stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        if self.policy.strict {
            return Err(Error::Backend(error));
        }
        if let Some(value) = stale {
            self.rec().stale_served();
            return Ok((value, Outcome::Stale));
        }
        if let Some(value) = self.shared.fallback.get(self.keys.value()) {
            self.from_fallback = true;
            self.rec().stale_served();
            return Ok((value, Outcome::Stale));
        }
        self.load_unstored().await
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
            let epoch = self.epoch;
            self.shared
                .fallback
                .record(self.keys.value(), value, usable_until, epoch);
        }
    }

    /// Runs the loader under our lease (its watchdog already running), then
    /// fills (fenced on the token) or releases.
    async fn load_leased(
        &mut self,
        lease: Lease,
        stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        let Some((soft, value)) = self.policy.soft_timeout.zip(stale.clone()) else {
            let loaded = self.run_loader(Sharing::Own).await;
            return self.store_loaded(lease, loaded, stale).await;
        };
        // A stale value exists: the callers wait for the load up to the
        // soft timeout, then get the stale value while the load goes on
        // (see `after_answer`).
        let mut loading = self.start_loader(Sharing::Own);
        match tokio::time::timeout(soft, &mut loading).await {
            Ok(loaded) => {
                // A load that failed before the soft timeout stores what a
                // failed background refresh of the stale value stores (the
                // same `store_loaded`: fail-safe re-store, cached failure or
                // release), and the callers still get the stale value, as
                // they would have at once without a soft timeout (review of
                // issue 10, finding 3).
                let load_failed = loaded.is_err();
                let answer = self.store_loaded(lease, loaded, stale).await;
                match answer {
                    Err(_) if load_failed && self.value_still_lives() => {
                        self.rec().stale_served();
                        Ok((value, Outcome::Stale))
                    }
                    answer => answer,
                }
            }
            // The stale value expired on the server during the wait (past
            // `ttl + grace`): it is not served past that, as fail-safe does
            // not serve it (review of issue 10, finding 10). The callers
            // wait for the load as with no stale value (`max_load_time`
            // bounds it), and its failure follows the usual rules.
            Err(_) if !self.value_still_lives() => {
                let loaded = loading.await;
                self.store_loaded(lease, loaded, stale).await
            }
            Err(_) => {
                *self.deferred_load.lock() = Some(Box::new(DeferredLoad {
                    lease,
                    loading,
                    stale,
                }));
                self.rec().stale_served();
                Ok((value, Outcome::Stale))
            }
        }
    }

    /// After a load under our lease: fills (fenced on the token) or
    /// releases, and answers.
    async fn store_loaded(
        &mut self,
        mut lease: Lease,
        loaded: Result<Done<V>, Error>,
        stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        lease.loader_done();
        let (loaded, took) = match loaded {
            Ok(loaded) => loaded,
            Err(error) => return self.after_failed_load(Some(lease), error, stale).await,
        };
        // The loader's choice of freshness, then the bytes that record it;
        // if they cannot be made, nothing is stored and the callers get the
        // error.
        self.choose(&loaded);
        let value = loaded.into_value();
        let ttl = self.written_ttl(value.is_some());
        let fresh = ttl.saturating_sub(self.policy.grace);
        let encoded = self
            .shared
            .encode(&self.key, &self.policy, &value, took, Some(fresh));
        let bytes = match encoded {
            Ok(bytes) => bytes,
            Err(error) => {
                let _ = self
                    .budget
                    .run("release", |t| lease.release(&self.shared.calls, t, None))
                    .await;
                return Err(error);
            }
        };
        // Written with `ttl` by the fill below, after now: sooner than the
        // server's expiry, never later.
        *self.value_expires.lock() = Some(server_expiry(Instant::now(), ttl));
        // Only this fill, if it lands, vouches for the L1 entry: not a
        // stale value read before the load (with a soft timeout, the first
        // read's).
        *self.l1_fresh.lock() = None;
        // `Ok(false)`: expired or invalidated while we loaded; our callers
        // still get the value, but it must not overwrite what is there now
        // (counted as a lost lease). An error: unknown whether it landed.
        if self.budget.left().is_zero() {
            self.deferred_fill = Some(Box::new(DeferredFill { lease, bytes, ttl }));
        } else {
            let filled = self
                .budget
                .run("fill", |t| lease.fill(&self.shared.calls, t, &bytes, ttl))
                .await;
            if let Ok(true) = filled {
                // From when the fill began (it set the key's TTL on the
                // server before its reply).
                *self.l1_fresh.lock() = Some(StoredFreshness {
                    fresh_until: self.read_began() + fresh,
                    delta: took,
                    written_ttl: Some(fresh),
                    grace: self.policy.grace,
                    size: bytes.len(),
                });
            }
        }
        Ok((value, Outcome::Loaded))
    }

    /// The `no_lease` policy: load without waiting for anyone, but store
    /// only under a lease taken on the way if it was free, so the write is
    /// fenced on our token like every fill (a `set`, an `invalidate` or a
    /// newer holder fences it out). If another process holds the lease, the
    /// result is not stored: that holder's fill will be (issue 8, fault 4).
    async fn load_without_waiting(
        &mut self,
        unreadable: bool,
        known_stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        let window = if unreadable {
            Duration::MAX
        } else {
            Duration::ZERO
        };
        match self.acquire(LeaseTtl::default(), window).await {
            Ok(Acquisition::Won { lease, stale }) => {
                let stale = self.stale_value(stale).or(known_stale);
                self.load_leased(lease, stale).await
            }
            // Another process is refreshing the stale value read first
            // (with a soft timeout): it answers, as in `lease_or_wait`.
            Ok(Acquisition::Held { .. }) if known_stale.is_some() => {
                self.rec().stale_served();
                let value = known_stale.unwrap_or_default();
                Ok((value, Outcome::Stale))
            }
            Ok(Acquisition::Fresh(stored)) => match self.read(&stored) {
                Read::Value { value, .. } => Ok((value, Outcome::Hit)),
                Read::Failure { message, .. } => {
                    self.rec().negative_hit();
                    Err(Error::CachedFailure(message))
                }
                Read::Unreadable => self.load_unstored().await,
            },
            Ok(Acquisition::Held { .. }) => self.load_unstored().await,
            Err(e) => self.degrade(e, None).await,
        }
    }

    /// Loads without a lease and without storing the result: a degraded
    /// load (the wait deadline passed, the backend failed, or another
    /// process holds the lease), so it can never overwrite a newer fill.
    async fn load_unstored(&mut self) -> Result<Answer<V>, Error> {
        self.rec().degraded_load();
        match self.run_loader(Sharing::MayJoin).await {
            Ok((loaded, _)) => {
                self.choose(&loaded);
                // A new value, not the one read before: `ttl + grace`.
                *self.value_expires.lock() = None;
                Ok((loaded.into_value(), Outcome::Degraded))
            }
            Err(error) => self.after_failed_load(None, error, None).await,
        }
    }

    /// A load failed: serve stale (fail-safe, re-stored for the throttle
    /// period so the origin is not retried at once), or cache the failure
    /// (negative caching), or just release; then answer.
    async fn after_failed_load(
        &mut self,
        lease: Option<Lease>,
        error: Error,
        stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        if self.refreshing_fresh {
            // An early refresh failed: the value is still fresh and stays as
            // it is, for its remaining TTL (review of issue 9: a cached
            // failure or a fail-safe re-store replaced it, shortening or
            // stretching its life). Nobody waits for this answer.
            if let Some(lease) = lease {
                let _ = self
                    .budget
                    .run("release", |t| lease.release(&self.shared.calls, t, None))
                    .await;
            }
            return Err(error);
        }
        // Fail-safe serves (and re-stores for the throttle) the stale value
        // read before the load only while it still lives on the server: not
        // one that expired during the failed load.
        let stale = stale.filter(|_| self.value_still_lives());
        if let (true, Some(value)) = (self.policy.fail_safe, stale) {
            if let Some(lease) = lease {
                // Re-stored with the stale value's own grace window (in the
                // envelope and the TTL), so the grace it was stored with
                // still follows the throttle.
                let mut policy = self.policy.clone();
                if let Some(grace) = *self.stale_grace.lock() {
                    policy.grace = grace;
                }
                let throttled = self
                    .shared
                    .encode(
                        &self.key,
                        &policy,
                        &value,
                        Duration::ZERO,
                        Some(policy.fail_safe_throttle),
                    )
                    .ok()
                    .map(|bytes| (bytes, policy.fail_safe_throttle + policy.grace));
                let entry = throttled.as_ref().map(|(b, t)| (b.as_slice(), *t));
                let _ = self
                    .budget
                    .run("release", |t| lease.release(&self.shared.calls, t, entry))
                    .await;
            }
            tracing::warn!(key = self.keys.value(), %error, "loader failed; serving the stale value (fail-safe)");
            self.rec().stale_served();
            return Ok((value, Outcome::Stale));
        }
        if let Some(lease) = lease {
            let negative = match (self.policy.negative_ttl, &error) {
                (
                    Some(ttl),
                    Error::Loader(_) | Error::LoaderPanicked(_) | Error::LoadTimedOut(_),
                ) => {
                    let message = error.to_string();
                    let bytes = envelope::encode(
                        Kind::Failure,
                        Duration::ZERO,
                        Duration::ZERO,
                        None,
                        message.as_bytes(),
                    );
                    Some((bytes, ttl))
                }
                _ => None,
            };
            let entry = negative.as_ref().map(|(b, t)| (b.as_slice(), *t));
            let _ = self
                .budget
                .run("release", |t| lease.release(&self.shared.calls, t, entry))
                .await;
        }
        Err(error)
    }

    /// Runs this flight's one load.
    async fn run_loader(&mut self, sharing: Sharing) -> Result<Done<V>, Error> {
        self.start_loader(sharing).await
    }

    /// This flight's one load, as a future of its own (owning what it
    /// needs), so it can outlive the callers' answer: its place in the
    /// process's loads of the key, then the loader, alone or with the
    /// flight's group.
    fn start_loader(&mut self, sharing: Sharing) -> Loading<V> {
        let taken = self.load.lock().take();
        let shared = self.shared.clone();
        let policy = self.policy.clone();
        let key = self.key.clone();
        let value_key = self.keys.value().to_owned();
        let group = self.group.clone();
        Box::pin(async move {
            // One flight runs at most one load; reaching here without it is
            // a bug in this module, reported as an abandoned flight rather
            // than a panic.
            let Some(load) = taken else {
                return Err(Error::FlightAbandoned);
            };
            let rec = &shared.recorder;
            let completion = match loader::place(&shared.loads, rec, &value_key, sharing) {
                Place::Joined(awaiter) => return awaiter.outcome().await,
                Place::Leads(completion) => completion,
            };
            let loaded = match group {
                None => {
                    let times = &shared.load_times;
                    let (max, ttl) = (policy.max_load_time, policy.ttl);
                    loader::run_alone(rec, times, max, ttl, &value_key, load).await
                }
                Some(group) => {
                    let (reply, answer) = oneshot::channel();
                    group.load(&key, reply);
                    answer.await.unwrap_or(Err(Error::FlightAbandoned))
                }
            };
            completion.complete(loaded.clone());
            loaded
        })
    }

    /// A background refresh after the callers were answered: one per key per
    /// process (the `refreshing` set), one fleet-wide (the lease).
    async fn refresh(mut self, why: Refresh) {
        // Nobody waits for a refresh: no soft timeout to answer anyone at.
        self.policy.soft_timeout = None;
        let key = self.keys.value().to_owned();
        if !self.shared.refreshing.lock().insert(key.clone()) {
            return;
        }
        let _done = RefreshingGuard {
            shared: self.shared.clone(),
            key,
        };
        let window = match why {
            Refresh::Stale => {
                self.rec().background_refresh();
                Duration::ZERO
            }
            Refresh::Early(window) => {
                self.refreshing_fresh = true;
                window
            }
        };
        // Without the lease policy the refresh still needs a free lease: it
        // fences the write, and nobody waits for it anyway.
        let lease = self.policy.lease_ttl.unwrap_or_default();
        match self.acquire(lease, window).await {
            Ok(Acquisition::Won { lease, stale }) => {
                // Counted when it starts for real (not at each attempt that
                // found the lease held).
                if self.refreshing_fresh {
                    self.rec().early_refresh();
                }
                let stale = self.stale_value(stale);
                let _ = self.load_leased(lease, stale).await;
            }
            Ok(Acquisition::Held { .. }) => self.rec().lease_contended(),
            Ok(Acquisition::Fresh(_)) | Err(_) => {}
        }
    }

    /// The early-refresh window of a value with `fresh_for` left whose load
    /// took `delta`, if it is due (see [`early_refresh`]).
    fn early_refresh(
        &self,
        fresh_for: Duration,
        delta: Duration,
        written_ttl: Option<Duration>,
        grace: Duration,
    ) -> Option<Duration> {
        early_refresh(&self.policy, fresh_for, delta, written_ttl, grace)
    }

    /// Asks for the lease, with a TTL sized from recent load times.
    async fn acquire(
        &self,
        lease: LeaseTtl,
        refresh_window: Duration,
    ) -> Result<Acquisition, BackendError> {
        let lease_ttl = lease.ttl(&self.shared.load_times);
        let (shared, keys) = (&self.shared, &self.keys);
        self.budget
            .run("acquire", |timeout| async move {
                let Some(group) = &self.group else {
                    return Lease::acquire(&shared.calls, keys, lease_ttl, refresh_window, timeout)
                        .await;
                };
                let (reply, answer) = oneshot::channel();
                group.acquire(keys, lease_ttl, refresh_window, timeout, reply);
                answer.await.unwrap_or_else(|_| Err(step_dropped()))
            })
            .await
    }

    /// Reads the key, alone or with the flight's group.
    async fn read_stored(&self) -> Result<Option<Stored>, BackendError> {
        let (shared, keys) = (&self.shared, &self.keys);
        self.budget
            .run("get", |timeout| async move {
                let Some(group) = &self.group else {
                    let began = Instant::now();
                    let get = || shared.calls.get(keys, timeout, began);
                    return shared
                        .calls
                        .call_with(keys, began, timeout, "get", get)
                        .await;
                };
                let (reply, answer) = oneshot::channel();
                group.read(keys, timeout, reply);
                answer.await.unwrap_or_else(|_| Err(step_dropped()))
            })
            .await
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

    /// Reads stored bytes, counting an unreadable value against the key.
    fn read(&self, stored: &Stored) -> Read<V> {
        let read = self.shared.read(stored, Some(self.keys.value()));
        self.note_read(stored, &read);
        read
    }

    /// Notes what a read of `stored` found, for the outage fallback, a
    /// fail-safe re-store and the L1.
    fn note_read(&self, stored: &Stored, read: &Read<V>) {
        if let Read::Value {
            fresh_for,
            delta,
            written_ttl,
            grace,
            ..
        } = read
        {
            self.note_value_ttl(stored.ttl);
            *self.stale_grace.lock() = Some(*grace);
            let fresh = StoredFreshness::read(
                stored,
                self.read_began(),
                *fresh_for,
                *delta,
                *written_ttl,
                *grace,
            );
            *self.l1_fresh.lock() = Some(fresh);
        }
    }

    /// A usable stale value from an acquire answer. Unreadable bytes were
    /// already counted when the flight first read them, so not again here.
    fn stale_value(&self, stored: Option<Stored>) -> Option<Option<V>> {
        let stored = stored?;
        let value = self.shared.value_of(&stored, None)?;
        self.note_value_ttl(stored.ttl);
        *self.stale_grace.lock() = envelope::grace_of(&stored.bytes);
        Some(value)
    }

    /// Notes how long the value just read or written lives on the server.
    fn note_value_ttl(&self, ttl: Duration) {
        *self.value_expires.lock() = Some(server_expiry(self.read_began(), ttl));
    }

    /// Whether the value last read still lives on the server (a stale value
    /// read before a load that then failed may have expired meanwhile).
    fn value_still_lives(&self) -> bool {
        self.value_expires
            .lock()
            .is_none_or(|expires| expires > Instant::now())
    }

    /// Adopts the freshness the loader chose for its value, if any.
    fn choose<T>(&mut self, loaded: &Loaded<T>) {
        self.policy
            .choose(loaded.chosen_ttl(), loaded.chosen_grace());
    }

    fn written_ttl(&self, is_value: bool) -> Duration {
        let ttl = if is_value {
            self.policy.ttl
        } else {
            self.policy.negative_ttl.unwrap_or(self.policy.ttl)
        };
        freshness::written_ttl(ttl, self.policy.jitter, self.policy.grace)
    }
}

/// Takes the key out of the `refreshing` set when the refresh ends, however
/// it ends.
pub(crate) struct RefreshingGuard<V> {
    shared: Arc<Shared<V>>,
    key: String,
}

impl<V> Drop for RefreshingGuard<V> {
    fn drop(&mut self) {
        self.shared.refreshing.lock().remove(&self.key);
    }
}
