//! The unsafe-release lesson: why a lease is released by token
//! (compare-and-delete), never by a bare `DEL`.
//!
//! Driven step by step through the [`Backend`] trait alone, on a
//! [`MemoryBackend`] and tokio's (real) clock, to this schedule:
//!
//! 1. loader A takes the lease (TTL 100 ms) and starts a 200 ms load, with no
//!    watchdog to extend the lease;
//! 2. at 100 ms A's lease expires; at 150 ms loader B finds no lease, takes
//!    it and starts a second load;
//! 3. at 200 ms A's load gives up (it has nothing to store) and A lets go of
//!    the lock. Then loader C arrives:
//!    - bare `DEL`: the lock held B's token, so B's lease is gone and C
//!      takes it: a third load of the same key;
//!    - `Backend::release` with A's token: returns false, B's lease stays,
//!      C finds it and waits: two loads.
//!
//! (A's load fails rather than succeeds because with a value stored C would
//! simply hit it; a failed or cancelled load is exactly when `release` runs.)
//!
//! The outcome does not depend on how fast the machine is. Sleeps never end
//! early, and the schedule starts once A holds its lease, so A's lease has
//! expired when B asks. What follows from A letting go must happen while
//! B's lease lives, in the 50 ms from t = 200 ms to B's expiry at t >= 250
//! ms; a play that the scheduler held up past that is played again (see
//! [`ATTEMPTS`]). The steps are stamped with their time on the schedule.

use std::time::Duration;

use anyhow::{bail, Context};
use onefill::backend::{Acquired, FillKeys};
use onefill::{Backend, LeaseToken, MemoryBackend};
use serde::Serialize;
use tokio::time::Instant;

/// The lease TTL every loader asks for.
pub const LEASE_TTL: Duration = Duration::from_millis(100);
/// When B arrives (after A's lease expired).
pub const B_ARRIVES: Duration = Duration::from_millis(150);
/// How long A's load runs before it gives up: longer than the lease TTL.
pub const A_LOAD: Duration = Duration::from_millis(200);
/// How many times one play may run before the lesson gives up on a machine
/// too busy to keep its schedule.
const ATTEMPTS: usize = 5;

/// How A lets go of the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Release {
    /// `DEL lock`, whoever holds it ([`Backend::invalidate`]: with no value
    /// stored yet, it deletes just the lock).
    BareDel,
    /// `Backend::release(keys, A's token)`: compare-and-delete.
    TokenChecked,
}

/// One narrated event.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Time since A took the lease, on the lesson's schedule.
    pub t_ms: u64,
    /// Who acts: "A", "B", "C", or "-" for the clock.
    pub actor: &'static str,
    /// What happened.
    pub event: String,
    /// Loads of the key started so far.
    pub loads: u64,
}

/// How one way of releasing played out, from the moment A lets go.
#[derive(Debug, Clone, Serialize)]
pub struct Branch {
    /// How A let go.
    pub release: Release,
    /// What `Backend::release` returned (only for the token-checked release).
    pub release_returned: Option<bool>,
    /// Whether B's lease was still in place after A let go.
    pub b_lease_intact: bool,
    /// Whether C became a loader.
    pub third_loader_got_in: bool,
    /// Loads of the key in the end.
    pub loads: u64,
    /// Who holds the lock in the end: "B", "C", or null.
    pub lock_holder: Option<&'static str>,
    /// The narrated steps from A letting go on.
    pub steps: Vec<Step>,
}

/// The whole lesson.
#[derive(Debug, Clone, Serialize)]
pub struct Lesson {
    /// The lease TTL every loader asks for, in ms.
    pub lease_ttl_ms: u64,
    /// How long A's load runs, in ms.
    pub a_load_ms: u64,
    /// When B arrives, in ms.
    pub b_arrives_ms: u64,
    /// The steps common to both ways of releasing (up to B's load).
    pub shared_steps: Vec<Step>,
    /// A lets go with a bare DEL.
    pub bare_del: Branch,
    /// A lets go with the token-checked release.
    pub token_release: Branch,
}

/// Runs the lesson (about 0.2 s: both ways of releasing play at once) on its
/// own single-threaded tokio runtime. Must not be called from within a
/// runtime.
pub fn run() -> anyhow::Result<Lesson> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .context("starting the lesson's runtime")?;
    runtime.block_on(async {
        let keys = FillKeys::new("lesson", "user:42");
        let (bare_del, token_release) = tokio::join!(
            play_on_time(&keys, Release::BareDel),
            play_on_time(&keys, Release::TokenChecked)
        );
        let (shared_steps, bare_del) = bare_del?;
        let (_, token_release) = token_release?;
        Ok(Lesson {
            lease_ttl_ms: millis(LEASE_TTL),
            a_load_ms: millis(A_LOAD),
            b_arrives_ms: millis(B_ARRIVES),
            shared_steps,
            bare_del,
            token_release,
        })
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Plays the sequence until one play keeps to the schedule.
async fn play_on_time(keys: &FillKeys, release: Release) -> anyhow::Result<(Vec<Step>, Branch)> {
    for _ in 0..ATTEMPTS {
        if let Some(played) = play(keys, release).await? {
            return Ok(played);
        }
    }
    bail!(
        "the machine was too busy for the unsafe-release lesson: {ATTEMPTS} times, A letting go \
         and C arriving took longer than the {} ms that B's lease outlives A's load",
        millis(B_ARRIVES + LEASE_TTL - A_LOAD)
    )
}

/// Plays the sequence on a fresh store; returns the shared steps and the
/// branch that `release` leads to, or `None` if B's lease may have expired
/// before the play was over (then the outcome would not be the lesson's).
async fn play(keys: &FillKeys, release: Release) -> anyhow::Result<Option<(Vec<Step>, Branch)>> {
    let store = MemoryBackend::new();
    let mut loads = 0;
    let mut log = Narration::default();

    let a = LeaseToken::random();
    if !won(&store, keys, &a).await? {
        bail!("A should have won the lease on an empty store");
    }
    // A's lease ends at most LEASE_TTL after this: t = 0 of the schedule.
    let start = Instant::now();
    loads += 1;
    log.step(
        Duration::ZERO,
        "A",
        format!(
            "takes the lease (TTL {} ms) and starts loading; the load will run {} ms, no watchdog",
            millis(LEASE_TTL),
            millis(A_LOAD)
        ),
        loads,
    );

    tokio::time::sleep_until(start + LEASE_TTL).await;
    if lease_held(&store, keys).await? {
        bail!("A's lease should have expired after its TTL");
    }
    log.step(
        LEASE_TTL,
        "-",
        "A's lease expires while A is still loading".to_owned(),
        loads,
    );

    tokio::time::sleep_until(start + B_ARRIVES).await;
    let b = LeaseToken::random();
    // B's lease lasts at least LEASE_TTL from here.
    let b_lease_lives_until = Instant::now() + LEASE_TTL;
    if !won(&store, keys, &b).await? {
        bail!("B should have won the expired lease");
    }
    loads += 1;
    log.step(
        B_ARRIVES,
        "B",
        "finds no lease, takes it and starts a second load".to_owned(),
        loads,
    );
    let shared = std::mem::take(&mut log.steps);

    tokio::time::sleep_until(start + A_LOAD).await;
    let release_returned = match release {
        Release::BareDel => {
            // Deletes the value and the lock; there is no value yet, so this
            // is exactly `DEL lock`, whatever token the lock holds.
            store.invalidate(keys).await?;
            log.step(
                A_LOAD,
                "A",
                "load gives up; A deletes the lock with a bare DEL, but the lock held B's token: \
                 B's lease is gone"
                    .to_owned(),
                loads,
            );
            None
        }
        Release::TokenChecked => {
            let ours = store.release(keys, &a, None).await?;
            log.step(
                A_LOAD,
                "A",
                format!(
                    "load gives up; Backend::release(A's token) returns {ours}: the lock holds \
                     B's token, nothing is deleted"
                ),
                loads,
            );
            Some(ours)
        }
    };
    // A's lease is long gone and C has not asked yet: a lease now is B's.
    let b_lease_intact = lease_held(&store, keys).await?;

    let c = LeaseToken::random();
    let third_loader_got_in = match store.acquire(keys, &c, LEASE_TTL, Duration::ZERO).await? {
        Acquired::Won { .. } => {
            loads += 1;
            log.step(
                A_LOAD,
                "C",
                "finds no lease, takes it and starts a third load of the same key".to_owned(),
                loads,
            );
            true
        }
        Acquired::Held { .. } => {
            log.step(
                A_LOAD,
                "C",
                format!(
                    "finds B's lease ({} ms left) and waits for B's fill instead of loading",
                    millis(B_ARRIVES + LEASE_TTL - A_LOAD)
                ),
                loads,
            );
            false
        }
        Acquired::Fresh(_) => bail!("nothing was stored, yet C found a fresh value"),
    };
    let lock_holder = holder_at_the_end(&store, keys, &[("B", &b), ("C", &c)]).await?;
    if Instant::now() >= b_lease_lives_until {
        return Ok(None);
    }

    Ok(Some((
        shared,
        Branch {
            release,
            release_returned,
            b_lease_intact,
            third_loader_got_in,
            loads,
            lock_holder,
            steps: log.steps,
        },
    )))
}

/// Whether `token` takes the lease (on a store without a value).
async fn won(store: &MemoryBackend, keys: &FillKeys, token: &LeaseToken) -> anyhow::Result<bool> {
    Ok(matches!(
        store
            .acquire(keys, token, LEASE_TTL, Duration::ZERO)
            .await?,
        Acquired::Won { .. }
    ))
}

/// Whether anybody holds the lease: asks for it with a throwaway token, and
/// lets go at once if that got it.
async fn lease_held(store: &MemoryBackend, keys: &FillKeys) -> anyhow::Result<bool> {
    let probe = LeaseToken::random();
    if won(store, keys, &probe).await? {
        store.release(keys, &probe, None).await?;
        return Ok(false);
    }
    Ok(true)
}

/// Which of `candidates` holds the lock, found by releasing with each token
/// in turn (only the holder's release succeeds): the play's last step.
async fn holder_at_the_end(
    store: &MemoryBackend,
    keys: &FillKeys,
    candidates: &[(&'static str, &LeaseToken)],
) -> anyhow::Result<Option<&'static str>> {
    for (name, token) in candidates {
        if store.release(keys, token, None).await? {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// Collects the narrated steps, stamped with their time on the schedule.
#[derive(Default)]
struct Narration {
    steps: Vec<Step>,
}

impl Narration {
    fn step(&mut self, at: Duration, actor: &'static str, event: String, loads: u64) {
        self.steps.push(Step {
            t_ms: millis(at),
            actor,
            event,
            loads,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_del_lets_a_third_loader_in_and_the_token_release_does_not() {
        let started = std::time::Instant::now();
        let lesson = run().expect("lesson runs");
        assert!(started.elapsed() >= A_LOAD, "played on the real clock");
        assert_eq!(lesson.shared_steps.len(), 3);
        assert_eq!(lesson.shared_steps[2].t_ms, 150);

        let bare = &lesson.bare_del;
        assert!(!bare.b_lease_intact);
        assert!(bare.third_loader_got_in);
        assert_eq!((bare.loads, bare.lock_holder), (3, Some("C")));

        let token = &lesson.token_release;
        assert_eq!(token.release_returned, Some(false));
        assert!(token.b_lease_intact);
        assert!(!token.third_loader_got_in);
        assert_eq!((token.loads, token.lock_holder), (2, Some("B")));
        assert!(token.steps.iter().all(|s| s.t_ms == 200));
    }
}
