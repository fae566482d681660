//! The unsafe-release lesson: why a lease is released by token
//! (compare-and-delete), never by a bare `DEL`.
//!
//! Driven step by step through the [`Backend`] trait on a [`MemoryBackend`],
//! on tokio's paused clock (the memory backend measures TTLs with tokio's
//! clock), so the 100 ms lease expiries are exact and cost no wall time:
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

/// How A lets go of the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Release {
    /// `DEL lock`, whoever holds it (simulated with a raw write that expires
    /// at once).
    BareDel,
    /// `Backend::release(keys, A's token)`: compare-and-delete.
    TokenChecked,
}

/// One narrated event.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    /// Time since A took the lease, on the (paused) tokio clock.
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

/// Runs the lesson on its own paused, single-threaded tokio runtime. Must not
/// be called from within a runtime.
pub fn run() -> anyhow::Result<Lesson> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .context("starting the lesson's runtime")?;
    runtime.block_on(async {
        let keys = onefill::backend::FillKeys::new("lesson", "user:42");
        let (shared_steps, bare_del) = play(&keys, Release::BareDel).await?;
        let (_, token_release) = play(&keys, Release::TokenChecked).await?;
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

/// Plays the sequence on a fresh store; returns the shared steps and the
/// branch that `release` leads to.
async fn play(keys: &FillKeys, release: Release) -> anyhow::Result<(Vec<Step>, Branch)> {
    let store = MemoryBackend::new();
    let start = Instant::now();
    let mut loads = 0;
    let mut log = Narration {
        start,
        steps: Vec::new(),
    };

    let a = LeaseToken::random();
    if !matches!(
        store.acquire(keys, &a, LEASE_TTL, Duration::ZERO).await?,
        Acquired::Won { .. }
    ) {
        bail!("A should have won the lease on an empty store");
    }
    loads += 1;
    log.step(
        "A",
        format!(
            "takes the lease (TTL {} ms) and starts loading; the load will run {} ms, no watchdog",
            millis(LEASE_TTL),
            millis(A_LOAD)
        ),
        loads,
    );

    tokio::time::sleep_until(start + LEASE_TTL).await;
    if store.get_raw(keys.lock()).is_some() {
        bail!("A's lease should have expired after its TTL");
    }
    log.step(
        "-",
        "A's lease expires while A is still loading".to_owned(),
        loads,
    );

    tokio::time::sleep_until(start + B_ARRIVES).await;
    let b = LeaseToken::random();
    if !matches!(
        store.acquire(keys, &b, LEASE_TTL, Duration::ZERO).await?,
        Acquired::Won { .. }
    ) {
        bail!("B should have won the expired lease");
    }
    loads += 1;
    log.step(
        "B",
        "finds no lease, takes it and starts a second load".to_owned(),
        loads,
    );
    let shared = std::mem::take(&mut log.steps);

    tokio::time::sleep_until(start + A_LOAD).await;
    let release_returned = match release {
        Release::BareDel => {
            // `DEL lock`: a raw write that expires at once deletes the key
            // whatever it holds.
            store.put_raw(keys.lock(), b"", Duration::ZERO);
            log.step(
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
    let b_lease_intact = holder(&store, keys, &[("B", &b)]) == Some("B");

    let c = LeaseToken::random();
    let third_loader_got_in = match store.acquire(keys, &c, LEASE_TTL, Duration::ZERO).await? {
        Acquired::Won { .. } => {
            loads += 1;
            log.step(
                "C",
                "finds no lease, takes it and starts a third load of the same key".to_owned(),
                loads,
            );
            true
        }
        Acquired::Held { lease_ttl, .. } => {
            log.step(
                "C",
                format!(
                    "finds B's lease ({} ms left) and waits for B's fill instead of loading",
                    millis(lease_ttl)
                ),
                loads,
            );
            false
        }
        Acquired::Fresh(_) => bail!("nothing was stored, yet C found a fresh value"),
    };
    let lock_holder = holder(&store, keys, &[("B", &b), ("C", &c)]);

    Ok((
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
    ))
}

/// Collects the narrated steps, stamped with the tokio clock.
struct Narration {
    start: Instant,
    steps: Vec<Step>,
}

impl Narration {
    fn step(&mut self, actor: &'static str, event: String, loads: u64) {
        self.steps.push(Step {
            t_ms: millis(self.start.elapsed()),
            actor,
            event,
            loads,
        });
    }
}

/// Which of `candidates` holds the lock now.
fn holder(
    store: &MemoryBackend,
    keys: &FillKeys,
    candidates: &[(&'static str, &LeaseToken)],
) -> Option<&'static str> {
    let (bytes, _) = store.get_raw(keys.lock())?;
    candidates
        .iter()
        .find(|(_, token)| token.as_bytes() == bytes.as_slice())
        .map(|(name, _)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_del_lets_a_third_loader_in_and_the_token_release_does_not() {
        let lesson = run().expect("lesson runs");
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
