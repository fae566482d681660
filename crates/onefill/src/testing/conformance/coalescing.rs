//! Coalescing: one load per herd, in one process and across pods, and the
//! counters that say so.

use std::time::Duration;

use super::all_ok_with;
use crate::testing::{cache, herd, unique_ns, CacheUnderTest, Harness, Origin};
use crate::{Cache, CallOptions, Outcome};

scenarios! { $ __onefill_conformance_coalescing;

    /// 1,000 tasks on one cold key in one process: exactly one loader call.
    pub async fn herd_in_process(h: &dyn Harness) {
        let c = cache(h, &unique_ns("herd")).await;
        let origin = Origin::default();
        let results = herd(
            std::slice::from_ref(&c),
            1000,
            "hot",
            &origin,
            Duration::from_millis(200),
            CallOptions::new(),
        )
        .await;
        assert_eq!(origin.count(), 1, "one load for 1000 callers");
        all_ok_with(&results, "hot-v1");
        let stats = c.stats();
        assert_eq!(stats.loads_ok, 1);
        assert_eq!(stats.lease_acquired, 1);
        let led = results
            .iter()
            .filter(|r| !r.as_ref().unwrap().coalesced)
            .count();
        assert!(led >= 1);
        assert_eq!(stats.coalesced as usize, 1000 - led, "all others coalesced");
    }

    /// 8 independent caches (pods) × 100 callers sharing one store: one load.
    pub async fn herd_across_pods(h: &dyn Harness) {
        let ns = unique_ns("pods");
        let mut caches = Vec::new();
        for _ in 0..8 {
            caches.push(cache(h, &ns).await);
        }
        let origin = Origin::default();
        let results = herd(
            &caches,
            800,
            "hot",
            &origin,
            Duration::from_millis(200),
            CallOptions::new(),
        )
        .await;
        assert_eq!(origin.count(), 1, "one load for 8 pods × 100 callers");
        all_ok_with(&results, "hot-v1");
        let loaded = results
            .iter()
            .filter(|r| r.as_ref().unwrap().outcome == Outcome::Loaded)
            .count();
        let waited = results
            .iter()
            .filter(|r| r.as_ref().unwrap().outcome == Outcome::Waited)
            .count();
        if h.blocking() {
            // Threads of synchronous callers start over a while (the pool
            // caps them below 800): a late caller of the winning pod finds
            // the value filled, a hit.
            assert!((1..=100).contains(&loaded), "{loaded} callers got Loaded");
        } else {
            assert_eq!(loaded, 100, "the winning pod's 100 callers got Loaded");
        }
        assert_eq!(
            loaded
                + waited
                + results
                    .iter()
                    .filter(|r| r.as_ref().unwrap().outcome == Outcome::Hit)
                    .count(),
            800
        );
        let acquired: u64 = caches.iter().map(|c| c.stats().lease_acquired).sum();
        assert_eq!(acquired, 1);
    }

    /// Defaults: a 6 s loader (longer than the default lease floor, shorter than
    /// the wait deadline) across 4 pods × 50 callers is one load.
    pub async fn six_second_loader_with_defaults(h: &dyn Harness) {
        let ns = unique_ns("six");
        let mut pods = Vec::new();
        for _ in 0..4 {
            let cache = Cache::<String, String>::builder()
                .namespace(&ns)
                .shared_backend(h.backend().await)
                .build()
                .unwrap();
            pods.push(CacheUnderTest::new(cache, h.blocking()));
        }
        let origin = Origin::default();
        let results = herd(
            &pods,
            200,
            "k",
            &origin,
            Duration::from_secs(6),
            CallOptions::new(),
        )
        .await;
        assert_eq!(origin.count(), 1);
        all_ok_with(&results, "k-v1");
        let timeouts: u64 = pods.iter().map(|p| p.stats().wait_timeouts).sum();
        assert_eq!(timeouts, 0);
    }

    /// Counters tell the story of a herd and a hit.
    pub async fn stats_count_what_happened(h: &dyn Harness) {
        let c = cache(h, &unique_ns("stats")).await;
        let origin = Origin::default();
        herd(
            std::slice::from_ref(&c),
            10,
            "k",
            &origin,
            Duration::from_millis(50),
            CallOptions::new(),
        )
        .await;
        c.get_or_load("k", origin.loader(Duration::ZERO))
            .await
            .unwrap();
        let s = c.stats();
        assert_eq!(s.loads_ok, 1);
        assert_eq!(s.loads_error, 0);
        assert_eq!(s.misses, 1);
        assert_eq!(s.hits, 1);
        assert_eq!(s.lease_acquired, 1);
        assert_eq!(s.lease_contended, 0);
        assert_eq!(s.coalesced, 9);
        assert_eq!(s.waits, 0);
    }
}
