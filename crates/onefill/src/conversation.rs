//! One flight's conversation with the backend: the protocol of DESIGN.md,
//! decided step by step.
//!
//! ```text
//! GET+PTTL ── fresh ──────────────────────────────► Hit (maybe refresh early)
//!    │ stale (in grace) ──────────────────────────► Stale + background refresh
//!    ▼ miss
//! acquire ── fresh (someone just filled) ─────────► Hit
//!    │ won ── load (watchdog) ── fill (fenced) ───► Loaded
//!    ▼ held
//! subscribe, re-check with acquire on every notification or poll tick
//!    │ fresh ─────────────────────────────────────► Waited
//!    │ won (holder died or failed) ── load ───────► Loaded
//!    ▼ deadline
//! OnWaitTimeout: stale / one degraded load / error
//! ```
//!
//! A backend failure at any step degrades (stale, else a load without the
//! lease, at most one per process per key thanks to the flight) unless the
//! policy is strict.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{Acquired, Backend, FillSubscription, Stored};
use crate::circuit::{Admit, Breaker};
use crate::codec::Codec;
use crate::envelope::{self, Kind};
use crate::error::{BackendError, BackendErrorKind, Error, InputError, LoaderError};
use crate::fallback::Fallback;
use crate::flight::Flights;
use crate::freshness;
use crate::key::FillKeys;
use crate::lease::{LeaseToken, LeaseTtl, LoadTimes, Watchdog};
use crate::options::Policy;
use crate::stats::Recorder;
use crate::wait::{Backoff, OnWaitTimeout};

/// What the loader returns once type-erased: `None` is "nothing there"
/// (the optional variant).
pub(crate) type Loaded<V> = Result<Option<V>, LoaderError>;
/// The caller's loader, type-erased, with the key already captured.
pub(crate) type Load<V> =
    Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = Loaded<V>> + Send>> + Send>;
/// What a flight hands every caller on success.
pub(crate) type Answer<V> = (Option<V>, Outcome);

/// How a call was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// A fresh value was already stored.
    Hit,
    /// A stale value was served: within the grace window (a refresh runs in
    /// the background), after a failed load (fail-safe), or while the backend
    /// was failing.
    Stale,
    /// This process ran the loader under the lease and stored the result.
    Loaded,
    /// Another process loaded; this one waited for its fill.
    Waited,
    /// The loader ran without a lease: the wait deadline passed or the
    /// backend failed. The result was not stored.
    Degraded,
}

/// Shared state of one cache: everything a flight needs.
pub(crate) struct Inner<V> {
    pub namespace: String,
    pub backend: Arc<dyn Backend>,
    pub codec: Arc<dyn Codec<V>>,
    pub policy: Policy,
    pub recorder: Recorder,
    pub load_times: LoadTimes,
    pub flights: Flights<Answer<V>>,
    pub refreshing: Mutex<HashSet<String>>,
    pub breaker: Breaker,
    pub fallback: Fallback<V>,
}

/// What a stored value turned out to be, for this cache's codec.
enum Read<V> {
    Value {
        value: Option<V>,
        fresh_for: Duration,
        delta: Duration,
    },
    Failure {
        message: String,
        fresh: bool,
    },
    Unreadable,
}

/// Why a background refresh runs (for the counters).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refresh {
    /// Served stale in the grace window.
    Stale,
    /// XFetch drew an early refresh; the window is handed to `acquire`.
    Early(Duration),
}

/// The state of waiting for another process's fill.
struct Waiting {
    subscription: Option<Box<dyn FillSubscription>>,
    started: Instant,
    deadline: Instant,
    backoff: Backoff,
}

/// One flight: a key, its policy and its (not yet run) loader.
pub(crate) struct Flight<V> {
    inner: Arc<Inner<V>>,
    keys: FillKeys,
    policy: Policy,
    /// In a mutex only to make the flight `Sync` (the loader need not be).
    load: Mutex<Option<Load<V>>>,
}

impl<V: Clone + Send + Sync + 'static> Flight<V> {
    pub(crate) fn new(inner: Arc<Inner<V>>, keys: FillKeys, policy: Policy, load: Load<V>) -> Self {
        Flight {
            inner,
            keys,
            policy,
            load: Mutex::new(Some(load)),
        }
    }

    fn rec(&self) -> &Recorder {
        &self.inner.recorder
    }

    /// Runs the conversation up to the callers' answer. A returned
    /// [`Refresh`] asks the caller to run [`Flight::refresh`] after
    /// publishing the answer.
    pub(crate) async fn run(&mut self) -> (Result<Answer<V>, Error>, Option<Refresh>) {
        self.rec().flight();
        let stored = match self.call("get", self.inner.backend.get(&self.keys)).await {
            Ok(stored) => stored,
            Err(e) => return (self.degrade(e, None).await, None),
        };
        let mut unreadable = false;
        if let Some(stored) = stored {
            match self.read(&stored) {
                Read::Value {
                    value,
                    fresh_for,
                    delta,
                } if !fresh_for.is_zero() => {
                    self.rec().hit();
                    // XFetch and the grace window answer the same question
                    // (who pays for the refresh at expiry); with a grace
                    // window the first stale read refreshes in the
                    // background, so early refresh would only add loads.
                    let early = if self.policy.grace.is_zero() {
                        freshness::early_refresh(fresh_for, delta, self.policy.beta)
                    } else {
                        None
                    };
                    return (Ok((value, Outcome::Hit)), early.map(Refresh::Early));
                }
                Read::Value { value, .. } => {
                    self.rec().stale_served();
                    return (Ok((value, Outcome::Stale)), Some(Refresh::Stale));
                }
                Read::Failure {
                    message,
                    fresh: true,
                } => {
                    self.rec().negative_hit();
                    return (Err(Error::CachedFailure(message)), None);
                }
                Read::Failure { fresh: false, .. } => {}
                Read::Unreadable => unreadable = true,
            }
        }
        self.rec().miss();
        let answer = match self.policy.lease {
            Some(lease) => self.lease_or_wait(lease, unreadable).await,
            None => self.load_unleased(true).await,
        };
        (answer, None)
    }

    /// The miss path: take the lease and load, or wait for whoever has it.
    async fn lease_or_wait(
        &mut self,
        lease: LeaseTtl,
        mut unreadable: bool,
    ) -> Result<Answer<V>, Error> {
        let mut waiting: Option<Waiting> = None;
        let mut stale: Option<Option<V>> = None;
        loop {
            let lease_ttl = lease.ttl(&self.inner.load_times);
            let token = LeaseToken::random();
            // A value that is fresh on the server but unreadable here (another
            // type or version) must not block the lease: ask for it regardless.
            let window = if unreadable {
                Duration::MAX
            } else {
                Duration::ZERO
            };
            let acquired = self
                .call(
                    "acquire",
                    self.inner
                        .backend
                        .acquire(&self.keys, &token, lease_ttl, window),
                )
                .await;
            let (held_stale, holder_ttl) = match acquired {
                Err(e) => {
                    self.finish_wait(&waiting, false);
                    return self.degrade(e, stale).await;
                }
                Ok(Acquired::Fresh(stored)) => match self.read(&stored) {
                    Read::Value { value, .. } => {
                        self.finish_wait(&waiting, false);
                        let outcome = if waiting.is_some() {
                            Outcome::Waited
                        } else {
                            Outcome::Hit
                        };
                        return Ok((value, outcome));
                    }
                    Read::Failure { message, .. } => {
                        self.finish_wait(&waiting, false);
                        self.rec().negative_hit();
                        return Err(Error::CachedFailure(message));
                    }
                    Read::Unreadable => {
                        unreadable = true;
                        continue;
                    }
                },
                Ok(Acquired::Won { stale: won_stale }) => {
                    self.finish_wait(&waiting, false);
                    self.rec().lease_acquired();
                    let stale = self.stale_value(won_stale).or(stale);
                    return self.load_leased(token, lease_ttl, stale).await;
                }
                Ok(Acquired::Held { stale, lease_ttl }) => (stale, lease_ttl),
            };
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
                waiting = Some(self.start_wait().await);
                continue;
            };
            let now = Instant::now();
            if now >= wait.deadline {
                self.finish_wait(&waiting, true);
                return self.at_deadline(stale).await;
            }
            // Re-check at the next poll, at the moment the holder's lease
            // would expire (a dead holder is taken over without delay), or as
            // soon as the fill is announced, whichever comes first.
            let nap = wait
                .backoff
                .next_interval()
                .min(holder_ttl + Duration::from_millis(1))
                .min(wait.deadline - now);
            let notified = match wait.subscription.as_mut() {
                Some(sub) => tokio::select! {
                    _ = sub.notified() => true,
                    _ = tokio::time::sleep(nap) => false,
                },
                None => {
                    tokio::time::sleep(nap).await;
                    false
                }
            };
            self.rec().wait_poll(notified);
        }
    }

    async fn start_wait(&self) -> Waiting {
        self.rec().wait_started();
        let subscription = self
            .call("subscribe", self.inner.backend.subscribe(&self.keys))
            .await
            .ok();
        let started = Instant::now();
        Waiting {
            subscription,
            started,
            deadline: started + self.policy.wait.deadline,
            backoff: Backoff::new(&self.policy.wait),
        }
    }

    fn finish_wait(&self, waiting: &Option<Waiting>, timed_out: bool) {
        if let Some(w) = waiting {
            self.rec().wait_finished(w.started.elapsed(), timed_out);
        }
    }

    /// The configured outcome when the wait deadline passes.
    async fn at_deadline(&mut self, stale: Option<Option<V>>) -> Result<Answer<V>, Error> {
        let deadline = self.policy.wait.deadline;
        match (self.policy.wait.on_timeout, stale) {
            (OnWaitTimeout::StaleOrLoad | OnWaitTimeout::StaleOrError, Some(value)) => {
                self.rec().stale_served();
                Ok((value, Outcome::Stale))
            }
            (OnWaitTimeout::StaleOrLoad | OnWaitTimeout::Load, _) => {
                self.load_unleased(false).await
            }
            (OnWaitTimeout::StaleOrError | OnWaitTimeout::Error, _) => {
                Err(Error::WaitTimedOut(deadline))
            }
        }
    }

    /// The backend failed: strict mode surfaces it; otherwise serve stale,
    /// else load without the lease (the flight keeps it to one per process).
    async fn degrade(
        &mut self,
        error: BackendError,
        stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        if self.policy.strict {
            return Err(Error::Backend(error));
        }
        if let Some(value) = stale.or_else(|| self.inner.fallback.get(self.keys.value())) {
            self.rec().stale_served();
            return Ok((value, Outcome::Stale));
        }
        self.load_unleased(false).await
    }

    /// Remembers the answer for outages (see `fallback.rs`).
    pub(crate) fn remember(&self, answer: &Result<Answer<V>, Error>) {
        if let Ok((value, _)) = answer {
            let usable_for = self.policy.ttl + self.policy.grace;
            self.inner
                .fallback
                .record(self.keys.value(), value, usable_for);
        }
    }

    /// Runs the loader under our lease, with the watchdog, then fills
    /// (fenced on the token) or releases.
    async fn load_leased(
        &mut self,
        token: LeaseToken,
        lease_ttl: Duration,
        stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        let mut guard =
            HeldLease::new(self.inner.backend.clone(), self.keys.clone(), token.clone());
        let watchdog = Watchdog::start(
            self.inner.backend.clone(),
            self.keys.clone(),
            token.clone(),
            lease_ttl,
            self.policy.backend_timeout,
            self.inner.recorder.clone(),
        );
        let (result, took) = self.run_loader().await;
        drop(watchdog);
        let value = match result {
            Ok(value) => value,
            Err(error) => return self.after_failed_load(Some(guard), error, stale).await,
        };
        let bytes = match self.encode(&value, took) {
            Ok(bytes) => bytes,
            Err(error) => {
                self.release(guard, None).await;
                return Err(error);
            }
        };
        let ttl = self.written_ttl(value.is_some());
        match self
            .call(
                "fill",
                self.inner.backend.fill(&self.keys, &token, &bytes, ttl),
            )
            .await
        {
            Ok(true) => {}
            // Expired or invalidated while we loaded: our callers still get
            // the value, but it must not overwrite what is there now.
            Ok(false) => self.rec().lease_lost(self.keys.value()),
            // Unknown whether it landed; the lease expires by itself.
            Err(_) => {}
        }
        guard.disarm();
        Ok((value, Outcome::Loaded))
    }

    /// Loads without a lease. `store` writes the result unconditionally
    /// (the no-lease policy); degraded loads (deadline, backend failure) do
    /// not write, so they can never overwrite a newer fill.
    async fn load_unleased(&mut self, store: bool) -> Result<Answer<V>, Error> {
        if !store {
            self.rec().degraded_load();
        }
        let (result, took) = self.run_loader().await;
        let value = match result {
            Ok(value) => value,
            Err(error) => return self.after_failed_load(None, error, None).await,
        };
        if store {
            let bytes = self.encode(&value, took)?;
            let ttl = self.written_ttl(value.is_some());
            let _ = self
                .call("set", self.inner.backend.set(&self.keys, &bytes, ttl))
                .await;
            return Ok((value, Outcome::Loaded));
        }
        Ok((value, Outcome::Degraded))
    }

    /// A load failed: serve stale (fail-safe, re-stored for the throttle
    /// period so the origin is not retried at once), or cache the failure
    /// (negative caching), or just release; then answer.
    async fn after_failed_load(
        &mut self,
        lease: Option<HeldLease>,
        error: Error,
        stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        if let (true, Some(value)) = (self.policy.fail_safe, stale) {
            if let Some(lease) = lease {
                let throttled = self
                    .encode(&value, Duration::ZERO)
                    .ok()
                    .map(|bytes| (bytes, self.policy.fail_safe_throttle + self.policy.grace));
                self.release(lease, throttled.as_ref().map(|(b, t)| (b.as_slice(), *t)))
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
                    Some((
                        envelope::encode(
                            Kind::Failure,
                            Duration::ZERO,
                            Duration::ZERO,
                            message.as_bytes(),
                        ),
                        ttl,
                    ))
                }
                _ => None,
            };
            self.release(lease, negative.as_ref().map(|(b, t)| (b.as_slice(), *t)))
                .await;
        }
        Err(error)
    }

    async fn release(&self, mut lease: HeldLease, entry: Option<(&[u8], Duration)>) {
        let token = lease.token.clone();
        lease.disarm();
        let _ = self
            .call(
                "release",
                self.inner.backend.release(&self.keys, &token, entry),
            )
            .await;
    }

    /// Runs the loader detached (a panic is caught by the runtime, not
    /// propagated) and bounded by the maximum load time.
    async fn run_loader(&mut self) -> (Result<Option<V>, Error>, Duration) {
        let started = Instant::now();
        let taken = self.load.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(load) = taken else {
            // One flight runs at most one load; reaching here is a bug in
            // this module, reported as an abandoned flight rather than a panic.
            return (Err(Error::FlightAbandoned), Duration::ZERO);
        };
        let span = tracing::debug_span!("onefill.load", key = self.keys.value());
        let mut task = tokio::spawn(async move { load().await }.instrument(span));
        let max = self.policy.max_load_time;
        let result = match tokio::time::timeout(max, &mut task).await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(error))) => Err(Error::Loader(error)),
            Ok(Err(join)) => Err(Error::LoaderPanicked(panic_message(join))),
            Err(_) => {
                task.abort();
                Err(Error::LoadTimedOut(max))
            }
        };
        let took = started.elapsed();
        self.rec().load_finished(result.is_ok(), took);
        self.inner.load_times.record(took);
        if result.is_ok() && took > self.policy.ttl {
            tracing::warn!(
                key = self.keys.value(),
                ?took,
                ttl = ?self.policy.ttl,
                "the load took longer than the TTL: values expire before waiters can use them"
            );
        }
        (result, took)
    }

    /// A background refresh after the callers were answered: one per key per
    /// process (the `refreshing` set), one fleet-wide (the lease).
    pub(crate) async fn refresh(mut self, why: Refresh) {
        let key = self.keys.value().to_owned();
        {
            let mut refreshing = self
                .inner
                .refreshing
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if !refreshing.insert(key.clone()) {
                return;
            }
        }
        let _done = RefreshingGuard {
            inner: self.inner.clone(),
            key,
        };
        let window = match why {
            Refresh::Stale => {
                self.rec().background_refresh();
                Duration::ZERO
            }
            Refresh::Early(window) => {
                self.rec().early_refresh();
                window
            }
        };
        let Some(lease) = self.policy.lease else {
            let _ = self.load_unleased(true).await;
            return;
        };
        let lease_ttl = lease.ttl(&self.inner.load_times);
        let token = LeaseToken::random();
        match self
            .call(
                "acquire",
                self.inner
                    .backend
                    .acquire(&self.keys, &token, lease_ttl, window),
            )
            .await
        {
            Ok(Acquired::Won { stale }) => {
                self.rec().lease_acquired();
                let stale = self.stale_value(stale);
                let _ = self.load_leased(token, lease_ttl, stale).await;
            }
            Ok(Acquired::Held { .. }) => self.rec().lease_contended(),
            Ok(Acquired::Fresh(_)) | Err(_) => {}
        }
    }

    /// Calls the backend through the circuit breaker, bounded by the backend
    /// timeout (the driver's own timeouts are not trusted to fire).
    async fn call<T>(
        &self,
        op: &'static str,
        fut: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        call_backend(&self.inner, self.policy.backend_timeout, op, fut).await
    }

    fn read(&self, stored: &Stored) -> Read<V> {
        read_stored(&self.inner, stored, Some(self.keys.value()))
    }

    /// A usable stale value from an acquire answer. Unreadable bytes were
    /// already counted when the flight first read them, so not again here.
    fn stale_value(&self, stored: Option<Stored>) -> Option<Option<V>> {
        match read_stored(&self.inner, &stored?, None) {
            Read::Value { value, .. } => Some(value),
            _ => None,
        }
    }

    fn encode(&self, value: &Option<V>, took: Duration) -> Result<Vec<u8>, Error> {
        encode_value(&self.inner, &self.policy, value, took)
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

/// Backend call with breaker, timeout, counters and a span.
pub(crate) async fn call_backend<V, T>(
    inner: &Inner<V>,
    timeout: Duration,
    op: &'static str,
    fut: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    if inner.breaker.admit() == Admit::Reject {
        inner.recorder.circuit_rejected();
        return Err(BackendError::new(
            BackendErrorKind::CircuitOpen,
            "circuit breaker open",
        ));
    }
    let span = tracing::trace_span!("onefill.backend", op);
    let result = match tokio::time::timeout(timeout, fut.instrument(span)).await {
        Ok(result) => result,
        Err(_) => Err(BackendError::new(
            BackendErrorKind::Timeout,
            format!("{op} did not answer within {timeout:?}"),
        )),
    };
    match &result {
        Ok(_) => inner.breaker.success(),
        Err(e) => {
            inner.recorder.backend_error(op, e);
            if e.is_transient() && inner.breaker.failure() {
                inner.recorder.circuit_opened();
            }
        }
    }
    result
}

/// Decodes stored bytes; `count_as` names the key when an unreadable value
/// should be counted (once per flight, not at every re-read).
fn read_stored<V: 'static>(inner: &Inner<V>, stored: &Stored, count_as: Option<&str>) -> Read<V> {
    let env = match envelope::decode(&stored.bytes) {
        Ok(env) => env,
        Err(why) => {
            if let Some(key) = count_as {
                inner.recorder.decode_error(key, &format!("{why:?}"));
            }
            return Read::Unreadable;
        }
    };
    let fresh_for = stored.ttl.saturating_sub(env.grace);
    match env.kind {
        Kind::Value => match inner.codec.decode(env.payload) {
            Ok(value) => Read::Value {
                value: Some(value),
                fresh_for,
                delta: env.delta,
            },
            Err(why) => {
                if let Some(key) = count_as {
                    inner.recorder.decode_error(key, &why);
                }
                Read::Unreadable
            }
        },
        Kind::Absent => Read::Value {
            value: None,
            fresh_for,
            delta: env.delta,
        },
        Kind::Failure => Read::Failure {
            message: String::from_utf8_lossy(env.payload).into_owned(),
            fresh: !fresh_for.is_zero(),
        },
    }
}

/// Reads a stored envelope as a value, for the read-only `get`.
pub(crate) fn stored_value<V: 'static>(
    inner: &Inner<V>,
    stored: &Stored,
    key: &str,
) -> Option<Option<V>> {
    match read_stored(inner, stored, Some(key)) {
        Read::Value { value, .. } => Some(value),
        _ => None,
    }
}

pub(crate) fn encode_value<V: 'static>(
    inner: &Inner<V>,
    policy: &Policy,
    value: &Option<V>,
    took: Duration,
) -> Result<Vec<u8>, Error> {
    let (kind, payload) = match value {
        Some(v) => (Kind::Value, inner.codec.encode(v).map_err(Error::Encode)?),
        None => (Kind::Absent, Vec::new()),
    };
    let bytes = envelope::encode(kind, policy.grace, took, &payload);
    if bytes.len() > policy.max_value_bytes {
        return Err(Error::InvalidInput(InputError::ValueTooLarge {
            len: bytes.len(),
            max: policy.max_value_bytes,
        }));
    }
    Ok(bytes)
}

fn panic_message(join: tokio::task::JoinError) -> String {
    if !join.is_panic() {
        return "the load task was cancelled".to_owned();
    }
    let payload = join.into_panic();
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Releases the lease (compare-and-delete) if dropped while still armed: the
/// flight's task was cancelled (runtime shutdown) between acquire and fill.
struct HeldLease {
    backend: Arc<dyn Backend>,
    keys: FillKeys,
    token: LeaseToken,
    armed: bool,
}

impl HeldLease {
    fn new(backend: Arc<dyn Backend>, keys: FillKeys, token: LeaseToken) -> Self {
        HeldLease {
            backend,
            keys,
            token,
            armed: true,
        }
    }
    /// The lease was filled or released explicitly: nothing to do on drop.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let backend = self.backend.clone();
            let keys = self.keys.clone();
            let token = self.token.clone();
            handle.spawn(async move {
                let _ = backend.release(&keys, &token, None).await;
            });
        }
    }
}

struct RefreshingGuard<V> {
    inner: Arc<Inner<V>>,
    key: String,
}

impl<V> Drop for RefreshingGuard<V> {
    fn drop(&mut self) {
        self.inner
            .refreshing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}
