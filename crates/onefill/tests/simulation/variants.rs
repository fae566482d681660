//! Broken variants of the protocol, to prove the checker can fail (see
//! "Proving it can fail" in the crate docs), and the tests that each is
//! caught.

use crate::checker::{Invariant, Violation};
use crate::run_seeds;
use crate::scenario::{OpKind, Scenario};

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
    /// `take_over` deletes whatever lease it finds, not only the gone
    /// holder's.
    TakeOverAny,
    /// `expire` cuts the key's TTL but leaves the expiry written in the
    /// value as it was (a script without its `SETRANGE`): a one-`GET` hit
    /// keeps reading the value as fresh.
    ExpireUnstamped,
    /// Writes that fail for want of the store are not queued for replay
    /// (`replay_queue_capacity(0)`: as before decision 0017).
    NoReplay,
    /// `read_marks` answers each mark one generation older than it is: the
    /// values as of the generation just before a mark (every value loaded
    /// since the one before) escape it, as a `<=` for a `<` would let them.
    MarksOffByOne,
}

impl Variant {
    /// Whether the variant can behave unlike the protocol in `scenario`:
    /// the L1 variants only where the instances have an L1 (without one,
    /// reads report the written TTL and no listener waits for a write, in
    /// the protocol too), the takeover variant where the store watches
    /// holders. Proving a variant is caught skips the seeds it
    /// cannot change.
    pub(crate) fn can_differ(self, scenario: &Scenario) -> bool {
        match self {
            Variant::StampedTtl | Variant::PerBackendListeners => scenario.l1,
            // Takeovers happen only where the store watches holders.
            Variant::TakeOverAny => scenario.liveness.is_some(),
            Variant::MarksOffByOne => scenario
                .ops
                .iter()
                .any(|op| matches!(op.kind, OpKind::Mark(_))),
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
            Ok("take-over-any") => Variant::TakeOverAny,
            Ok("expire-unstamped") => Variant::ExpireUnstamped,
            Ok("no-replay") => Variant::NoReplay,
            Ok("marks-off-by-one") => Variant::MarksOffByOne,
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
            Variant::TakeOverAny => Some("take-over-any"),
            Variant::ExpireUnstamped => Some("expire-unstamped"),
            Variant::NoReplay => Some("no-replay"),
            Variant::MarksOffByOne => Some("marks-off-by-one"),
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

/// A broken variant must be caught within a few hundred seeds, by the
/// invariant it breaks: a checker that flagged it only through a side
/// effect elsewhere (the stats, say) would pass while blind to the break
/// itself.
fn caught(variant: Variant, by: Invariant) {
    caught_where(variant, by, "", 400);
}

/// As [`caught`], by a violation of `by` whose text has `what`, within
/// `limit` seeds.
fn caught_where(variant: Variant, by: Invariant, what: &str, limit: u64) {
    let picks = |v: &Violation| v.invariant == by && v.what.contains(what);
    let (failures, _) = run_seeds(0, limit, variant, Some(&picks));
    let hit = failures
        .iter()
        .find(|(_, violations)| violations.iter().any(picks));
    let Some((seed, violations)) = hit else {
        let seen: Vec<String> = failures
            .iter()
            .take(5)
            .map(|(seed, v)| format!("seed {seed}: {}", v[0]))
            .collect();
        panic!(
            "{variant:?} was not caught by {by:?} ({what:?}) in {limit} seeds; {} seeds failed otherwise: {seen:#?}",
            failures.len()
        );
    };
    let violation = violations.iter().find(|v| picks(v)).unwrap();
    println!(
        "{variant:?} caught at seed {seed} ({} seeds): {violation}",
        seed + 1
    );
}

/// Another token's `DEL` ends a running load's lease, so a second leased
/// load starts beside it with nothing to explain it.
#[test]
fn catches_release_by_bare_del() {
    caught(Variant::BareDelRelease, Invariant::OneLoader);
}

/// A fill that ignores the token lands after a write that revoked its
/// lease.
#[test]
fn catches_unfenced_fill() {
    caught(Variant::UnfencedFill, Invariant::WritesFinal);
}

/// Without the re-check, a lease is won over a fresh value: a duplicate
/// load.
#[test]
fn catches_acquire_without_recheck() {
    caught(Variant::NoRecheck, Invariant::OneLoader);
}

/// A waiter without a deadline outlives its caller's bound.
#[test]
fn catches_waiter_without_deadline() {
    caught(Variant::WaiterNoDeadline, Invariant::BoundedCallers);
}

/// Reads that report the TTL written in the value let an L1 entry outlive
/// a TTL another client shortened (the push drops the entry, the next read
/// puts it back with the written TTL, and no push comes at expiry).
#[test]
fn catches_stamped_ttl_in_the_l1() {
    caught_where(Variant::StampedTtl, Invariant::Copies, "an L1 copy", 10_000);
}

/// The same reads let the outage fallback's copy outlive the server's.
#[test]
fn catches_stamped_ttl_in_the_fallback() {
    caught_where(
        Variant::StampedTtl,
        Invariant::Copies,
        "a fallback copy",
        30_000,
    );
}

/// A write that tells only the L1s of its own backend object at once: the
/// other cache of the process answers the replaced value from its L1 until
/// the push comes.
#[test]
fn catches_per_backend_listeners() {
    caught_where(
        Variant::PerBackendListeners,
        Invariant::WritesFinal,
        "from the L1",
        10_000,
    );
}

/// A take-over that deletes whatever lease it finds (not only the one
/// still holding the gone holder's token) ends a live holder's lease
/// nobody judged: a second leased load (of another process, or of the
/// holder's own) starts beside its load, the first one's lease ended by
/// another token.
#[test]
fn catches_take_over_of_any_lease() {
    // Few seeds show it (the first at 6,702 in a release build), and on a
    // loaded machine a debug build's run can miss that one: room for more.
    caught_where(
        Variant::TakeOverAny,
        Invariant::OneLoader,
        "lease ended by",
        40_000,
    );
}

/// An `expire` that leaves the expiry written in the value as it was: a
/// later one-`GET` hit of the writer's process reads the expired version
/// as fresh.
#[test]
fn catches_expire_that_leaves_the_stamp() {
    caught(Variant::ExpireUnstamped, Invariant::WritesFinal);
}

/// Writes that failed in an outage, never replayed: once the faults end,
/// another instance still answers the value such a write replaced.
#[test]
fn catches_writes_not_replayed() {
    caught_where(Variant::NoReplay, Invariant::Replayed, "", 2_000);
}

/// Marks read one generation old: a value loaded before a mark (as of the
/// generation before it) is answered after the mark returned, in the
/// process that made it.
#[test]
fn catches_marks_judged_one_generation_late() {
    caught(Variant::MarksOffByOne, Invariant::MarksFinal);
}
