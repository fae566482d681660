//! Broken variants of the protocol, to prove the checker can fail (see
//! "Proving it can fail" in the crate docs).

use crate::scenario::Scenario;

/// The protocol as the library implements it, or broken on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    Correct,
    /// `release` deletes the lease whatever its token (a bare `DEL`).
    BareDelRelease,
    /// `fill` writes (and ends the lease) whatever the token.
    UnfencedFill,
    /// `acquire` never answers `Fresh`: it always tries `SET NX`.
    NoRecheck,
    /// Waiters wait up to an hour; the checker keeps the scenario's deadline.
    WaiterNoDeadline,
    /// Every read reports the TTL written in the value, even for a key an
    /// L1 keeps (the L1 entry and the outage fallback's copy then outlive
    /// a TTL another client shortened).
    StampedTtl,
    /// A write tells synchronously only the L1s registered through the
    /// backend object that made it; another cache of the process hears of
    /// it by the tracking push.
    PerBackendListeners,
}

impl Variant {
    /// Whether the variant can behave unlike the protocol in `scenario`:
    /// the L1 variants only where the instances have an L1 (without one,
    /// reads report the written TTL and no listener waits for a write, in
    /// the protocol too). Proving a variant is caught skips the seeds it
    /// cannot change.
    pub(crate) fn can_differ(self, scenario: &Scenario) -> bool {
        match self {
            Variant::StampedTtl | Variant::PerBackendListeners => scenario.l1,
            _ => true,
        }
    }

    pub(crate) fn from_env() -> Variant {
        match std::env::var("ONEFILL_SIM_VARIANT").as_deref() {
            Ok("bare-del-release") => Variant::BareDelRelease,
            Ok("unfenced-fill") => Variant::UnfencedFill,
            Ok("no-recheck") => Variant::NoRecheck,
            Ok("waiter-no-deadline") => Variant::WaiterNoDeadline,
            Ok("stamped-ttl") => Variant::StampedTtl,
            Ok("per-backend-listeners") => Variant::PerBackendListeners,
            _ => Variant::Correct,
        }
    }

    fn env_name(self) -> Option<&'static str> {
        match self {
            Variant::Correct => None,
            Variant::BareDelRelease => Some("bare-del-release"),
            Variant::UnfencedFill => Some("unfenced-fill"),
            Variant::NoRecheck => Some("no-recheck"),
            Variant::WaiterNoDeadline => Some("waiter-no-deadline"),
            Variant::StampedTtl => Some("stamped-ttl"),
            Variant::PerBackendListeners => Some("per-backend-listeners"),
        }
    }
    pub(crate) fn replay_command(self, seed: u64) -> String {
        let variant = self
            .env_name()
            .map(|v| format!("ONEFILL_SIM_VARIANT={v} "))
            .unwrap_or_default();
        format!(
            "{variant}ONEFILL_SIM_SEED={seed} cargo test -p onefill --test simulation replay -- --nocapture"
        )
    }
}
