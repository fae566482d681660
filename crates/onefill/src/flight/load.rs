//! A flight's one load and what follows it: the fenced fill or the
//! release (fail-safe re-store, cached failure), the soft timeout that
//! answers stale while the load goes on, and the background refresh.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::answer::{Answer, Outcome};
use crate::error::{BackendErrorKind, Error};
use crate::freshness;
use crate::lease::{Acquisition, Lease};
use crate::loader::{self, Done, Loaded, Place, Sharing};

use super::{early_refresh, server_expiry, Flight, Refresh, RefreshingGuard, StoredFreshness};

/// The longest a refresh that found the lease held keeps its key marked as
/// refreshing in this process (shorter if the holder's lease ends sooner,
/// or if the value has less than twice that left on the server):
/// a holder that dies or gives up is retried within it, and a hot key
/// costs each other process one lease request per pause while the holder
/// loads, not one per stale read.
const REFRESH_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A load under way, owned (not borrowing the flight), so it can go on
/// after the callers' answer.
pub(super) type Loading<V> = Pin<Box<dyn Future<Output = Result<Done<V>, Error>> + Send>>;

/// A load the soft timeout left running: its lease (the watchdog still
/// extending it) and the stale value the callers got.
pub(super) struct DeferredLoad<V> {
    pub(super) lease: Lease,
    pub(super) loading: Loading<V>,
    pub(super) stale: Option<Option<V>>,
}

/// A fill to run once the callers have their answer.
pub(super) struct DeferredFill {
    pub(super) lease: Lease,
    pub(super) bytes: Vec<u8>,
    pub(super) ttl: Duration,
}

impl<V: Clone + Send + Sync + 'static> Flight<V> {
    /// Runs the loader under our lease (its watchdog already running), then
    /// fills (fenced on the token) or releases.
    pub(super) async fn load_leased(
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
                // they would have at once without a soft timeout: a soft
                // timeout only ever shortens a caller's wait.
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
            // not serve it. The callers
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

    /// Releases our lease (leaving `entry`, a cached failure or a
    /// fail-safe re-store, if given) within the flight's budget; what
    /// becomes of a release that fails or finds the budget spent is the
    /// lease's business (`lease.rs`).
    async fn release(&self, lease: Lease, entry: Option<(&[u8], Duration)>) {
        let _ = self
            .budget
            .run("release", |t| lease.release(&self.shared.calls, t, entry))
            .await;
    }

    /// After a load under our lease: fills (fenced on the token) or
    /// releases, and answers.
    pub(super) async fn store_loaded(
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
        if loaded.is_no_store() {
            return self.release_not_stored(lease, loaded.into_value()).await;
        }
        // The loader's choice of freshness, then the bytes that record it;
        // if they cannot be made, nothing is stored and the callers get the
        // error.
        self.choose(&loaded);
        let as_of = loaded.as_of;
        let tags = loaded.chosen_tags().to_vec();
        let value = loaded.into_value();
        let mut ttl = self.written_ttl(value.is_some());
        if !tags.is_empty() {
            // A tag's mark is kept this long: the value must not outlive it.
            ttl = ttl.min(crate::marks::TAG_RETENTION);
        }
        let fresh = ttl.saturating_sub(self.policy.grace);
        let encoded = self.shared.encode(
            &self.key,
            self.keys.value(),
            &self.policy,
            &value,
            took,
            Some(fresh),
            (as_of, &tags),
        );
        let bytes = match encoded {
            Ok(bytes) => bytes,
            Err(error) => {
                self.release(lease, None).await;
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
            match filled {
                Ok(true) => {
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
                // The server's ACL refused a command of the fill (its
                // announcement, say, after the value was written): the
                // waiters of other processes were told nothing, and every
                // fill will meet the same refusal. A configuration error
                // that lasts is surfaced, as a refused read is, not
                // answered as if all went well.
                Err(error) if error.kind() == BackendErrorKind::NotPermitted => {
                    return Err(Error::Backend(error));
                }
                _ => {}
            }
        }
        Ok((value, Outcome::Loaded))
    }

    /// The loader said its value must not be stored: the lease is released
    /// at once, writing nothing (its notification wakes the waiters of
    /// other processes, who find it free and one of whom loads), and the
    /// callers get the value. Whatever was stored stays as it was: a stale
    /// value (a background refresh, a soft timeout's deferred load) or a
    /// fresh one (an early refresh) keeps its expiry, and nothing is
    /// written over what another process stored meanwhile.
    async fn release_not_stored(
        &mut self,
        lease: Lease,
        value: Option<V>,
    ) -> Result<Answer<V>, Error> {
        self.not_stored = true;
        *self.value_expires.lock() = None;
        *self.l1_fresh.lock() = None;
        // With the budget spent the release is not attempted here; the
        // lease's drop then releases it in the background, at once still.
        self.release(lease, None).await;
        Ok((value, Outcome::Loaded))
    }

    /// Loads without a lease and without storing the result: a degraded
    /// load (the wait deadline passed, the backend failed, or another
    /// process holds the lease), so it can never overwrite a newer fill.
    pub(super) async fn load_unstored(&mut self) -> Result<Answer<V>, Error> {
        self.rec().degraded_load();
        match self.run_loader(Sharing::MayJoin).await {
            Ok((loaded, _)) => {
                self.choose(&loaded);
                // Not kept for outages either if its loader said so.
                self.not_stored = loaded.is_no_store();
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
    pub(super) async fn after_failed_load(
        &mut self,
        lease: Option<Lease>,
        error: Error,
        stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        if self.refreshing_fresh {
            // An early refresh failed: the value is still fresh and stays as
            // it is, for its remaining TTL (a cached failure or a fail-safe
            // re-store would replace it, shortening or stretching its
            // life). Nobody waits for this answer.
            if let Some(lease) = lease {
                self.release(lease, None).await;
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
                let (as_of, tags) = self.stale_marks.lock().clone();
                let throttled = self
                    .shared
                    .encode(
                        &self.key,
                        self.keys.value(),
                        &policy,
                        &value,
                        Duration::ZERO,
                        Some(policy.fail_safe_throttle),
                        (as_of, &tags),
                    )
                    .ok()
                    .map(|bytes| (bytes, policy.fail_safe_throttle + policy.grace));
                let entry = throttled.as_ref().map(|(b, t)| (b.as_slice(), *t));
                self.release(lease, entry).await;
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
                    self.shared
                        .encode_failure(
                            self.keys.value(),
                            &message,
                            self.load_as_of.load(std::sync::atomic::Ordering::SeqCst),
                        )
                        .map(|bytes| (bytes, ttl))
                }
                _ => None,
            };
            let entry = negative.as_ref().map(|(b, t)| (b.as_slice(), *t));
            self.release(lease, entry).await;
        }
        Err(error)
    }

    /// Runs this flight's one load.
    pub(super) async fn run_loader(&mut self, sharing: Sharing) -> Result<Done<V>, Error> {
        self.start_loader(sharing).await
    }

    /// This flight's one load, as a future of its own (owning what it
    /// needs), so it can outlive the callers' answer: its place in the
    /// process's loads of the key, then the loader, alone or with the
    /// flight's group.
    pub(super) fn start_loader(&mut self, sharing: Sharing) -> Loading<V> {
        let taken = self.load.lock().take();
        // Before the loader reads anything: a mark made after this judges
        // the value, one made before does not.
        let as_of = self.shared.marks.generation();
        self.load_as_of
            .store(as_of, std::sync::atomic::Ordering::SeqCst);
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
                    loader::run_alone(rec, times, max, ttl, &value_key, load)
                        .await
                        .map(|(mut loaded, took)| {
                            loaded.as_of = as_of;
                            (loaded, took)
                        })
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
    pub(super) async fn refresh(mut self, why: Refresh) {
        // Nobody waits for a refresh: no soft timeout to answer anyone at.
        self.policy.soft_timeout = None;
        let key = self.keys.value().to_owned();
        let Some(id) = self.shared.refreshing.start(&key) else {
            return;
        };
        let done = RefreshingGuard {
            shared: self.shared.clone(),
            key,
            id,
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
        // The answer (and the stale value it may carry) goes before any
        // pause: nothing of it is needed while the key waits.
        let pause = match self.acquire(lease, window, None).await {
            Ok(Acquisition::Won { lease, stale }) => {
                // Counted when it starts for real (not at each attempt that
                // found the lease held).
                if self.refreshing_fresh {
                    self.rec().early_refresh();
                }
                let stale = self.stale_value(stale);
                let _ = self.load_leased(lease, stale).await;
                None
            }
            Ok(Acquisition::Held {
                lease_ttl, stale, ..
            }) => {
                self.rec().lease_contended();
                // Half of what the value has left, too: a holder that gives
                // up (its load failed, another process's write removed its
                // lease) is replaced while the value is still served.
                let left = stale.as_ref().map_or(Duration::MAX, |s| s.ttl / 2);
                Some(lease_ttl.min(REFRESH_RETRY_AFTER).min(left))
            }
            Ok(Acquisition::Fresh(_)) | Err(_) => None,
        };
        if let Some(pause) = pause {
            // Another process refreshes: the key stays marked as
            // refreshing here for a while, so this process's next stale
            // reads (every read of a hot key until the holder fills) do
            // not each ask for the lease again. Without the pause, a
            // refresh under way drew one lease request per stale read from
            // every other process. A write of the key here ends the pause
            // (see `refreshing.rs`).
            done.pause();
            drop(self);
            tokio::time::sleep(pause).await;
        }
        drop(done);
    }

    /// The early-refresh window of a value with `fresh_for` left whose load
    /// took `delta`, if it is due (see [`early_refresh`]).
    pub(super) fn early_refresh(
        &self,
        fresh_for: Duration,
        delta: Duration,
        written_ttl: Option<Duration>,
        grace: Duration,
    ) -> Option<Duration> {
        early_refresh(&self.policy, fresh_for, delta, written_ttl, grace)
    }

    /// Adopts the freshness the loader chose for its value, if any.
    pub(super) fn choose<T>(&mut self, loaded: &Loaded<T>) {
        self.policy
            .choose(loaded.chosen_ttl(), loaded.chosen_grace());
    }

    pub(super) fn written_ttl(&self, is_value: bool) -> Duration {
        let ttl = if is_value {
            self.policy.ttl
        } else {
            self.policy.negative_ttl.unwrap_or(self.policy.ttl)
        };
        freshness::written_ttl(ttl, self.policy.jitter, self.policy.grace)
    }
}
