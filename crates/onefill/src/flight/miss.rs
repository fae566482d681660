//! The miss path: take the lease and load, or wait for whoever holds it
//! (woken by its fill, re-checking at its lease's expiry), up to the wait
//! deadline and its outcome; and what a backend failure degrades to.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::answer::{Answer, Outcome};
use crate::backend::{Gone, Watch};
use crate::error::{BackendError, BackendErrorKind, Error};
use crate::group::step_dropped;
use crate::lease::{Acquisition, Ask, Lease, LeaseTtl};
use crate::shared::Read;
use crate::token::LeaseToken;
use crate::wait::{AtDeadline, Next, Wait};

use super::Flight;

impl<V: Clone + Send + Sync + 'static> Flight<V> {
    /// The miss path: take the lease and load, or wait for whoever has it.
    pub(super) async fn lease_or_wait(
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
        // The token of a holder judged gone: the next acquire takes its
        // lease over if it still holds that token.
        let mut gone_holder: Option<(LeaseToken, Gone)> = None;
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
                    Ok(Some(stored)) => match self.shared.read(&stored, self.keys.value(), false) {
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
            // time.
            let window = if std::mem::take(&mut unreadable) {
                Duration::MAX
            } else {
                Duration::ZERO
            };
            let taking_over = gone_holder.is_some();
            let gone = gone_holder.take();
            let gone = gone.as_ref().map(|(holder, verdict)| (holder, *verdict));
            let acquired = self.acquire(lease, window, gone).await;
            let (held_stale, holder_ttl, holder) = match acquired {
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
                    if taking_over || !told && holder_expires.is_some_and(|at| Instant::now() >= at)
                    {
                        self.rec().lease_takeover();
                    }
                    self.finish_wait(waiting, false);
                    // The stale value to fall back on (and, fail-safe,
                    // re-store) is what this acquire found: one read in an
                    // earlier round may have been deleted or replaced since
                    // (an `invalidate` frees the lease it was won from).
                    let stale = self.stale_value(won_stale);
                    return self.load_leased(lease, stale).await;
                }
                Ok(Acquisition::Held {
                    stale,
                    lease_ttl,
                    holder,
                }) => (stale, lease_ttl, holder),
            };
            holder_expires = Some(Instant::now() + holder_ttl);
            told = false;
            self.rec().lease_contended();
            if let Some(value) = self.stale_value(held_stale) {
                stale = Some(value);
            }
            // The lease changed hands since the holder watched (if any) was
            // found in it: that watch no longer tells about this lease.
            let moved_on = waiting.as_ref().and_then(Wait::watched) != holder.as_ref();
            // A holder not watched yet, named by its token (a token that
            // names none cannot be watched).
            let unwatched = holder.filter(|h| {
                h.holder().is_some() && waiting.as_ref().and_then(Wait::watched) != Some(h)
            });
            let backend = &self.shared.calls.backend;
            let first = waiting.is_none();
            let mut watched = None;
            if first {
                // First contention: serve stale if there is one (the holder is
                // refreshing it), else subscribe, then re-check, so a fill
                // between this acquire and the subscription is not lost. The
                // holder's watch is the re-check where the backend has one:
                // asked for with the subscription (one round trip on Redis,
                // the watch waiting for the subscription's confirmation), so
                // a first contention whose holder is alive needs no second
                // acquire.
                if let Some(value) = stale.take() {
                    self.rec().stale_served();
                    return Ok((value, Outcome::Stale));
                }
                let subscribe = self.call("subscribe", backend.subscribe(&self.keys));
                let watch = async {
                    match &unwatched {
                        Some(h) => Some(
                            self.call("watch holder", backend.watch_holder(&self.keys, h))
                                .await,
                        ),
                        None => None,
                    }
                };
                let (subscription, watch) = tokio::join!(subscribe, watch);
                waiting = Some(Wait::start(
                    self.rec(),
                    &self.policy.wait,
                    subscription.ok(),
                ));
                watched = watch;
            } else if let Some(h) = &unwatched {
                watched = Some(
                    self.call("watch holder", backend.watch_holder(&self.keys, h))
                        .await,
                );
            }
            let Some(wait) = waiting.as_mut() else {
                continue;
            };
            match (unwatched, watched) {
                (Some(holder), Some(Ok(Watch::Alive(watch)))) => wait.watch(holder, watch),
                (Some(holder), Some(Ok(Watch::Gone(gone)))) => {
                    if let Some(taken) = self.verdict(gone, holder) {
                        gone_holder = Some(taken);
                        continue;
                    }
                    wait.unwatch();
                    if first {
                        continue;
                    }
                }
                (_, Some(Ok(Watch::Moved))) => {
                    wait.unwatch();
                    continue;
                }
                (_, Some(_)) => {
                    wait.unwatch();
                    if first {
                        continue;
                    }
                }
                (_, None) if first => continue,
                (_, None) => {
                    if moved_on {
                        wait.unwatch();
                    }
                }
            }
            match wait.until_recheck(self.rec(), holder_ttl).await {
                Next::Notified => notified = true,
                Next::Recheck => {}
                Next::Gone(gone, holder) => gone_holder = self.verdict(gone, holder),
                Next::Deadline => {
                    self.finish_wait(waiting, true);
                    // The stale value read during the wait may have expired
                    // since: served only while the server still keeps it.
                    let stale = stale.filter(|_| self.value_still_lives());
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

    /// The watch's verdict on `holder`: counted and acted on (its lease
    /// is taken over), unless it says frozen a holder that took its lease
    /// over from a frozen one itself. A loader that blocks its executor
    /// looks frozen from outside, and each process that took over would run
    /// it and look frozen in turn; that holder is waited for as one the
    /// backend cannot watch (to its lease's expiry), so a wrong frozen
    /// verdict costs one more load, not one per process.
    fn verdict(&self, gone: Gone, holder: LeaseToken) -> Option<(LeaseToken, Gone)> {
        match gone {
            Gone::Frozen if holder.is_taken_from_frozen() => return None,
            Gone::Frozen => self.rec().holder_frozen(),
            Gone::Dead => self.rec().holder_dead(),
        }
        Some((holder, gone))
    }

    pub(super) fn finish_wait(&self, waiting: Option<Wait>, timed_out: bool) {
        if let Some(wait) = waiting {
            wait.finish(self.rec(), timed_out);
        }
    }

    /// The backend failed: strict mode surfaces it; otherwise serve stale,
    /// else load without the lease (the coalescer keeps it to one per
    /// process). A refusal by the server's ACL is surfaced in every mode:
    /// it is a configuration error that lasts, and degrading would load
    /// every call on the origin, uncoordinated and unannounced.
    pub(super) async fn degrade(
        &mut self,
        error: BackendError,
        stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        if self.policy.strict || error.kind() == BackendErrorKind::NotPermitted {
            return Err(Error::Backend(error));
        }
        // A stale value read earlier in the flight (before a wait) is served
        // only while the server still keeps it, as the fallback's copy is.
        if let Some(value) = stale.filter(|_| self.value_still_lives()) {
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

    /// The `no_lease` policy: load without waiting for anyone, but store
    /// only under a lease taken on the way if it was free, so the write is
    /// fenced on our token like every fill (a `set`, an `invalidate` or a
    /// newer holder fences it out). If another process holds the lease, the
    /// result is not stored: that holder's fill will be.
    pub(super) async fn load_without_waiting(
        &mut self,
        unreadable: bool,
        known_stale: Option<Option<V>>,
    ) -> Result<Answer<V>, Error> {
        let window = if unreadable {
            Duration::MAX
        } else {
            Duration::ZERO
        };
        match self.acquire(LeaseTtl::default(), window, None).await {
            Ok(Acquisition::Won { lease, stale }) => {
                // Not `known_stale`: a write between the first read and
                // this acquire may have deleted or replaced it.
                let stale = self.stale_value(stale);
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

    /// Asks for the lease, with a TTL sized from recent load times (and
    /// for whether the backend watches its holder); with `gone`, the token
    /// of a holder judged gone and the verdict, takes that holder's lease
    /// over if it still holds it (sent on its own even in a batch:
    /// takeovers are rare), with a token marked if the holder was judged
    /// frozen ([`LeaseToken::taken_from_frozen`]).
    pub(super) async fn acquire(
        &self,
        lease: LeaseTtl,
        refresh_window: Duration,
        gone: Option<(&LeaseToken, Gone)>,
    ) -> Result<Acquisition, BackendError> {
        let (shared, keys) = (&self.shared, &self.keys);
        let op = if gone.is_some() {
            "take over"
        } else {
            "acquire"
        };
        self.budget
            .run(op, |timeout| async move {
                // A fresh token for every try (a try that timed out has its
                // token released behind it), and the lease sized for it.
                let mut token = shared.calls.backend.new_token(keys);
                if let Some((_, Gone::Frozen)) = gone {
                    token = token.taken_from_frozen();
                }
                let lease_ttl = lease.ttl(&shared.load_times, token.holder().is_some());
                let ask = Ask {
                    token,
                    lease_ttl,
                    refresh_window,
                    gone: gone.map(|(holder, _)| holder),
                };
                let group = self.group.as_ref().filter(|_| gone.is_none());
                let Some(group) = group else {
                    return Lease::acquire(&shared.calls, keys, ask, timeout).await;
                };
                let (reply, answer) = oneshot::channel();
                group.acquire(keys, ask.token, lease_ttl, refresh_window, timeout, reply);
                answer.await.unwrap_or_else(|_| Err(step_dropped()))
            })
            .await
    }
}
