//! Waiting: losers woken by the fill notification, and the configured
//! outcome at the deadline.

use std::time::Duration;

use tokio::time::Instant;

use super::start_slow_load;
use crate::backend::FillKeys;
use crate::testing::{cache, cache_with, herd, unique_ns, Harness, Origin};
use crate::{CallOptions, Error, LeaseToken, OnWaitTimeout, Outcome, WaitPolicy};

scenarios! { $ __onefill_conformance_waiting;

    /// Waiters in another pod return as soon as the fill lands (woken by the
    /// notification), not at their next poll tick: with polls set 20 s apart,
    /// a waiter that returns at all within the test was notified.
    pub async fn waiters_wake_on_fill_notification(h: &dyn Harness) {
        let ns = unique_ns("notify");
        let slow_polls = WaitPolicy::default()
            .polling(Duration::from_secs(20), Duration::from_secs(20))
            .deadline(Duration::from_secs(60));
        let holder = cache(h, &ns).await;
        let waiter = cache_with(h, &ns, |b| b.wait(slow_polls)).await;
        let origin = Origin::default();
        let load = Duration::from_millis(500);
        // Let the holder take the lease first.
        let h1 = start_slow_load(&holder, &origin, load).await;
        let started = Instant::now();
        let waited = waiter
            .fetch("k", origin.loader(load))
            .await
            .expect("waiter answered");
        let elapsed = started.elapsed();
        let held = h1.await.unwrap().unwrap();
        assert_eq!(held.outcome, Outcome::Loaded);
        assert_eq!(waited.outcome, Outcome::Waited);
        assert_eq!(waited.value, "k-v1");
        assert_eq!(origin.count(), 1);
        let s = waiter.stats();
        assert_eq!(s.wait_polls, 0, "no poll tick was needed");
        assert!(s.wait_notified >= 1);
        assert!(
            elapsed < Duration::from_secs(20),
            "well before the first poll: {elapsed:?}"
        );
        if h.paused() {
            assert!(elapsed <= load, "returned at the fill: {elapsed:?}");
        }
    }

    /// The configured outcome at the wait deadline, for each policy, when the
    /// holder never fills.
    pub async fn deadline_outcomes(h: &dyn Harness) {
        let cases = [
            (OnWaitTimeout::Error, None),
            (OnWaitTimeout::StaleOrError, None),
            (OnWaitTimeout::Load, Some(Outcome::Degraded)),
            (OnWaitTimeout::StaleOrLoad, Some(Outcome::Degraded)),
        ];
        for (policy, expected) in cases {
            let ns = unique_ns("deadline");
            let backend = h.backend().await;
            let keys = FillKeys::new(&ns, "k");
            // A live holder that never fills (a long lease).
            backend
                .acquire(
                    &keys,
                    &LeaseToken::random(),
                    Duration::from_secs(60),
                    Duration::ZERO,
                )
                .await
                .unwrap();
            let deadline = Duration::from_millis(700);
            let mut pods = Vec::new();
            for _ in 0..3 {
                pods.push(
                    cache_with(h, &ns, |b| {
                        b.wait(WaitPolicy::default().deadline(deadline).on_timeout(policy))
                    })
                    .await,
                );
            }
            let origin = Origin::default();
            let start = Instant::now();
            let results = herd(
                &pods,
                30,
                "k",
                &origin,
                Duration::from_millis(10),
                CallOptions::new(),
            )
            .await;
            match expected {
                None => {
                    assert_eq!(origin.count(), 0, "{policy:?}: no load");
                    for r in &results {
                        assert!(
                            matches!(r, Err(Error::WaitTimedOut(d)) if *d == deadline),
                            "{policy:?}: {r:?}"
                        );
                    }
                }
                Some(outcome) => {
                    assert_eq!(origin.count(), 3, "{policy:?}: one degraded load per pod");
                    for r in &results {
                        assert_eq!(r.as_ref().unwrap().outcome, outcome, "{policy:?}");
                    }
                    let degraded: u64 = pods.iter().map(|p| p.stats().degraded_loads).sum();
                    assert_eq!(degraded, 3);
                }
            }
            let timeouts: u64 = pods.iter().map(|p| p.stats().wait_timeouts).sum();
            assert_eq!(timeouts, 3, "{policy:?}: one timed-out wait per pod");
            if h.paused() {
                let took = start.elapsed();
                assert!(
                    took >= deadline && took <= deadline + Duration::from_millis(100),
                    "{took:?}"
                );
            }
            // The degraded loads did not write: the live holder's fill wins later.
            assert!(backend.get(&keys).await.unwrap().is_none());
        }
    }
}
