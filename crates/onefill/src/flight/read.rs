//! A flight's reads: the first read and what it means (a hit, stale in
//! grace, a cached failure, a miss), and what every read of the key notes
//! for later (how long the value lives on the server, its grace, its
//! freshness for the L1).

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::answer::{Answer, Outcome};
use crate::backend::Stored;
use crate::deadline;
use crate::envelope;
use crate::error::{BackendError, Error};
use crate::group::step_dropped;
use crate::shared::Read;

use super::{server_expiry, FirstRead, Flight, Refresh, StoredFreshness};

/// The marks stored bytes record, owned (none for bytes without them).
fn marks_of(bytes: &[u8]) -> (u64, Vec<String>) {
    envelope::marks_of(bytes).map_or_else(Default::default, |m| {
        let tags = m.tags().map(|t| String::from_utf8_lossy(t).into_owned());
        (m.as_of, tags.collect())
    })
}

impl<V: Clone + Send + Sync + 'static> Flight<V> {
    /// Runs the conversation up to the callers' answer, and says whether a
    /// background refresh should follow it.
    pub(super) async fn run(&mut self) -> (Result<Answer<V>, Error>, Option<Refresh>) {
        let first = self.first_read().await;
        self.after_first_read(first).await
    }

    /// The rest of the conversation after its first read.
    pub(super) async fn after_first_read(
        &mut self,
        mut first: FirstRead<V>,
    ) -> (Result<Answer<V>, Error>, Option<Refresh>) {
        if matches!(&first, FirstRead::Failed(e) if deadline::is_moved(e)) {
            // The read went to a server that stopped serving the key while
            // it ran (a failover moved the primary): read once more, from
            // the one that serves it now.
            first = self.first_read().await;
            if matches!(&first, FirstRead::Failed(e) if deadline::is_moved(e)) {
                self.rec().flight();
            }
        }
        match first {
            FirstRead::Answered(answer, refresh) => (answer, refresh),
            FirstRead::Failed(e) => (self.degrade(e, None).await, None),
            FirstRead::Miss { unreadable, stale } => {
                // A stale value read (with a soft timeout) was not counted
                // by the read: answered stale, it counts as a stale answer
                // only; anything else, as a miss (counted once, by how it
                // ended).
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
    pub(super) async fn first_read(&mut self) -> FirstRead<V> {
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
                let read = self.shared.read(&stored, self.keys.value(), true);
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
                // A read given up because its server was replaced is made
                // again (`after_first_read`): the flight is counted then.
                if !deadline::is_moved(&e) {
                    self.rec().flight();
                }
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

    /// Reads the key, alone or with the flight's group.
    pub(super) async fn read_stored(&self) -> Result<Option<Stored>, BackendError> {
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

    /// Reads stored bytes, counting an unreadable value against the key.
    pub(super) fn read(&self, stored: &Stored) -> Read<V> {
        let read = self.shared.read(stored, self.keys.value(), true);
        self.note_read(stored, &read);
        read
    }

    /// Notes what a read of `stored` found, for the outage fallback, a
    /// fail-safe re-store and the L1.
    pub(super) fn note_read(&self, stored: &Stored, read: &Read<V>) {
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
            *self.stale_marks.lock() = marks_of(&stored.bytes);
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
    pub(super) fn stale_value(&self, stored: Option<Stored>) -> Option<Option<V>> {
        let stored = stored?;
        let value = self.shared.value_of(&stored, self.keys.value(), false)?;
        self.note_value_ttl(stored.ttl);
        *self.stale_grace.lock() = envelope::grace_of(&stored.bytes);
        *self.stale_marks.lock() = marks_of(&stored.bytes);
        Some(value)
    }

    /// Notes how long the value just read or written lives on the server.
    pub(super) fn note_value_ttl(&self, ttl: Duration) {
        *self.value_expires.lock() = Some(server_expiry(self.read_began(), ttl));
    }

    /// Whether the value last read still lives on the server (a stale value
    /// read before a load that then failed may have expired meanwhile).
    pub(super) fn value_still_lives(&self) -> bool {
        self.value_expires
            .lock()
            .is_none_or(|expires| expires > Instant::now())
    }
}
