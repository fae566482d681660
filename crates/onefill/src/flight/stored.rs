//! What the L1 needs of a value as stored, and the early-refresh window:
//! the one place an L1 entry's deadlines and a value's refresh point are
//! decided, for the hit path and a flight's answer alike.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Stored;
use crate::freshness;
use crate::options::Policy;

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
/// no stale window on the server, whatever the cache says. The one place
/// this is decided,
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
