//! Leases: the watchdog, a dead holder's takeover, token checks, the
//! adaptive TTL.

use std::time::Duration;

use tokio::time::Instant;

use super::all_ok_with;
use crate::backend::{Acquired, FillKeys};
use crate::testing::{cache, cache_with, herd, lease_held, unique_ns, Harness, Origin};
use crate::{CallOptions, LeaseToken, LeaseTtl, Outcome, WaitPolicy};

scenarios! { $ __onefill_conformance_leases;

    /// A loader three times slower than the lease TTL still gives exactly one
    /// load: the watchdog keeps the lease alive.
    pub async fn watchdog_holds_a_slow_load(h: &dyn Harness) {
        let ns = unique_ns("watchdog");
        let lease = Duration::from_millis(300);
        let mut caches = Vec::new();
        for _ in 0..3 {
            caches.push(
                cache_with(h, &ns, |b| {
                    b.lease_ttl(LeaseTtl::Fixed(lease))
                        .wait(WaitPolicy::default().deadline(Duration::from_secs(30)))
                })
                .await,
            );
        }
        let origin = Origin::default();
        let results = herd(&caches, 30, "slow", &origin, lease * 4, CallOptions::new()).await;
        assert_eq!(origin.count(), 1, "the watchdog kept the lease");
        all_ok_with(&results, "slow-v1");
        let extended: u64 = caches.iter().map(|c| c.stats().lease_extended).sum();
        assert!(
            extended >= 3,
            "renewed every third of the TTL, got {extended}"
        );
        let lost: u64 = caches.iter().map(|c| c.stats().lease_lost).sum();
        assert_eq!(lost, 0);
        // The watchdog stopped with the load: the lease is gone, not extended forever.
        let keys = FillKeys::new(&ns, "slow");
        assert!(!lease_held(&*h.backend().await, &keys).await);
    }

    /// A holder that died mid-load (its lease planted, never extended nor
    /// released) is taken over by a waiter within the lease TTL plus one poll.
    pub async fn dead_holder_is_taken_over(h: &dyn Harness) {
        let ns = unique_ns("dead");
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        let lease = Duration::from_millis(800);
        let dead = LeaseToken::random();
        assert!(matches!(
            backend
                .acquire(&keys, &dead, lease, Duration::ZERO)
                .await
                .unwrap(),
            Acquired::Won { .. }
        ));
        let start = Instant::now();
        let c = cache(h, &ns).await;
        let origin = Origin::default();
        let results = herd(
            std::slice::from_ref(&c),
            20,
            "k",
            &origin,
            Duration::from_millis(50),
            CallOptions::new(),
        )
        .await;
        assert_eq!(origin.count(), 1);
        all_ok_with(&results, "k-v1");
        assert!(results
            .iter()
            .all(|r| r.as_ref().unwrap().outcome == Outcome::Loaded));
        assert_eq!(c.stats().waits, 1, "one flight waited, then took over");
        if h.paused() {
            let poll_max = WaitPolicy::default().poll_max;
            let took = start.elapsed();
            assert!(
                took <= lease + poll_max + Duration::from_millis(50) + Duration::from_millis(10),
                "took over after {took:?}"
            );
            assert!(took >= lease, "not before the dead lease expired: {took:?}");
        }
    }

    /// `take_over` replaces a lease only while it holds the token of the
    /// holder judged gone: a second waiter that judged the same holder
    /// finds the winner's lease. A backend whose tokens name their holder
    /// (so its waiters watch them) must implement it; one that does not
    /// may keep `acquire`'s answer (the lease then holds until it expires).
    pub async fn take_over_replaces_only_the_gone_holders_lease(h: &dyn Harness) {
        let backend = h.backend().await;
        let keys = FillKeys::new(&unique_ns("takeover"), "k");
        let ttl = Duration::from_secs(10);
        let gone = backend.new_token(&keys);
        assert!(matches!(
            backend.acquire(&keys, &gone, ttl, Duration::ZERO).await.unwrap(),
            Acquired::Won { .. }
        ));
        let holder_of = |answer: &Acquired| match answer {
            Acquired::Held { holder, .. } => holder.clone(),
            other => panic!("expected the lease held, got {other:?}"),
        };
        // Another token judged gone: the lease stays the holder's.
        let stranger = LeaseToken::random();
        let first = backend.new_token(&keys);
        let answer = backend
            .take_over(&keys, &stranger, &first, ttl, Duration::ZERO)
            .await
            .unwrap();
        let reported = holder_of(&answer);
        assert!(reported.is_none() || reported == Some(gone.clone()), "{answer:?}");
        // The holder judged gone: the first waiter wins...
        let answer = backend
            .take_over(&keys, &gone, &first, ttl, Duration::ZERO)
            .await
            .unwrap();
        let named = gone.holder().is_some();
        match answer {
            Acquired::Won { .. } => {
                // ...the second finds the first's lease, not a free one.
                let second = backend.new_token(&keys);
                let answer = backend
                    .take_over(&keys, &gone, &second, ttl, Duration::ZERO)
                    .await
                    .unwrap();
                let reported = holder_of(&answer);
                assert!(reported.is_none() || reported == Some(first.clone()), "{answer:?}");
                assert!(backend.release(&keys, &first, None).await.unwrap());
            }
            other => {
                assert!(!named, "a backend that names its holders takes over: {other:?}");
                assert!(backend.release(&keys, &gone, None).await.unwrap());
            }
        }
    }

    /// Release and extend are compare-and-X: a wrong token changes nothing.
    pub async fn wrong_token_cannot_release_or_extend(h: &dyn Harness) {
        let backend = h.backend().await;
        let keys = FillKeys::new(&unique_ns("token"), "k");
        let mine = LeaseToken::random();
        let theirs = LeaseToken::random();
        let ttl = Duration::from_secs(10);
        assert!(matches!(
            backend
                .acquire(&keys, &mine, ttl, Duration::ZERO)
                .await
                .unwrap(),
            Acquired::Won { stale: None }
        ));
        assert!(!backend.release(&keys, &theirs, None).await.unwrap());
        assert!(!backend.extend(&keys, &theirs, ttl).await.unwrap());
        assert!(!backend.fill(&keys, &theirs, b"x", ttl).await.unwrap());
        assert!(
            backend.get(&keys).await.unwrap().is_none(),
            "a foreign fill wrote nothing"
        );
        match backend
            .acquire(&keys, &theirs, ttl, Duration::ZERO)
            .await
            .unwrap()
        {
            Acquired::Held { lease_ttl, .. } => {
                assert!(lease_ttl <= ttl && lease_ttl > Duration::from_secs(5))
            }
            other => panic!("lease should still be held: {other:?}"),
        }
        assert!(backend.release(&keys, &mine, None).await.unwrap());
        assert!(!lease_held(&*backend, &keys).await);
    }

    /// The adaptive lease TTL follows measured load times.
    pub async fn adaptive_lease_ttl_follows_load_times(h: &dyn Harness) {
        let ns = unique_ns("adaptive");
        let policy = LeaseTtl::Adaptive {
            factor: 3.0,
            floor: Duration::from_millis(100),
            ceiling: Duration::from_secs(30),
        };
        let c = cache_with(h, &ns, |b| b.lease_ttl(policy)).await;
        let origin = Origin::default();
        for i in 0..3 {
            c.get_or_load(
                &format!("warm{i}"),
                origin.loader(Duration::from_millis(400)),
            )
            .await
            .unwrap();
        }
        // Now p99 ≈ 400 ms: the next lease should be ≈ 1.2 s. Observe it from
        // outside while the next load runs.
        let backend = h.backend().await;
        let c2 = c.clone();
        let loader = origin.loader(Duration::from_millis(400));
        let task = tokio::spawn(async move { c2.get_or_load("probe", loader).await });
        while origin.count() < 4 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let keys = FillKeys::new(&ns, "probe");
        match backend
            .acquire(
                &keys,
                &LeaseToken::random(),
                Duration::from_secs(1),
                Duration::MAX,
            )
            .await
            .unwrap()
        {
            // A backend that watches its holders (its tokens name them)
            // gets a lease of at least 10 s: the watch, not the TTL, tells
            // its waiters of a dead holder.
            Acquired::Held {
                lease_ttl, holder, ..
            } if holder.as_ref().and_then(|h| h.holder()).is_some() => {
                assert!(
                    lease_ttl > Duration::from_millis(9_500)
                        && lease_ttl <= Duration::from_secs(10),
                    "lease ttl {lease_ttl:?} should be the watched lease's 10 s"
                );
            }
            Acquired::Held { lease_ttl, .. } => {
                assert!(
                    lease_ttl > Duration::from_millis(900) && lease_ttl <= Duration::from_millis(1300),
                    "lease ttl {lease_ttl:?} should be ≈ 3 × 400 ms"
                );
            }
            other => panic!("expected the probe to find the lease: {other:?}"),
        }
        task.await.unwrap().unwrap();
    }
}
