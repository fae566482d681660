//! What a call is answered with: the value, how it was answered, and
//! whether it shared another call's flight. The lowest layer of the
//! protocol's vocabulary: the coalescers, the flight and the face all speak
//! it, and it imports none of them.

/// What a flight hands every caller on success.
pub(crate) type Answer<V> = (Option<V>, Outcome);

/// How a call was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// A fresh value was already stored.
    Hit,
    /// A stale value was served: within the grace window (a refresh runs in
    /// the background), at the soft timeout of a slow load (which goes on
    /// in the background, see `CallOptions::soft_timeout`), after a failed
    /// load (fail-safe), or while the backend was failing.
    Stale,
    /// This process ran the loader under the lease and stored the result.
    Loaded,
    /// Another process loaded; this one waited for its fill.
    Waited,
    /// The loader ran without a lease: the wait deadline passed, the
    /// backend failed, or (with `no_lease`) another process held the lease.
    /// The result was not stored.
    Degraded,
}

impl Outcome {
    /// The outcome's name in spans: `hit`, `stale`, `loaded`, `waited`,
    /// `degraded`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Hit => "hit",
            Outcome::Stale => "stale",
            Outcome::Loaded => "loaded",
            Outcome::Waited => "waited",
            Outcome::Degraded => "degraded",
        }
    }
}

/// A value and how the call got it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fetched<V> {
    /// The value.
    pub value: V,
    /// How the flight answered.
    pub outcome: Outcome,
    /// Whether this call shared a flight another local call had started
    /// (no backend conversation of its own).
    pub coalesced: bool,
}
