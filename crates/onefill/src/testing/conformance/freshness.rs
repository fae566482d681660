//! Freshness: stale-while-refresh, early refresh, negative caching,
//! fail-safe, TTL jitter, and a loaded value that must not be stored.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{fetch_now, pods_with};
use crate::backend::FillKeys;
use crate::testing::{
    cache, cache_with, eventually, failing_loader, herd, lease_held, unique_ns, BoxFuture, Harness,
    Origin, OriginError,
};
use crate::{CallOptions, Error, LeaseTtl, Loaded, Outcome, WaitPolicy};

scenarios! { $ __onefill_conformance_freshness;

    /// In the grace window every caller gets the stale value at once, and one
    /// background refresh runs fleet-wide.
    pub async fn stale_while_refresh_runs_once(h: &dyn Harness) {
        let ns = unique_ns("swr");
        let pods = pods_with(h, &ns, 3, |b| {
            b.ttl(Duration::from_secs(1))
                .grace(Duration::from_secs(10))
                .early_refresh_beta(0.0)
        })
        .await;
        let origin = Origin::default();
        let key = "k".to_string();
        let first = pods[0]
            .fetch(
                &key,
                origin.loader(Duration::from_millis(100)),
)
            .await
            .unwrap();
        assert_eq!(first.outcome, Outcome::Loaded);
        tokio::time::sleep(Duration::from_millis(1300)).await;
        let results = herd(
            &pods,
            60,
            "k",
            &origin,
            Duration::from_millis(300),
            CallOptions::new(),
        )
        .await;
        for r in &results {
            let f = r.as_ref().unwrap();
            assert_eq!(
                (f.outcome, f.value.as_str()),
                (Outcome::Stale, "k-v1"),
                "no caller waits for the refresh"
            );
        }
        eventually(Duration::from_secs(5), || origin.count() == 2).await;
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        // Wait for the refresh's fill to land, then everyone hits the new value.
        let start = Instant::now();
        loop {
            let f = fetch_now(&pods[1], &key, &origin).await;
            if f.outcome == Outcome::Hit {
                assert_eq!(f.value, "k-v2");
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(5));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(origin.count(), 2, "exactly one refresh across 3 pods");
        assert!(!lease_held(&*backend, &keys).await);
        let refreshes: u64 = pods.iter().map(|p| p.stats().background_refreshes).sum();
        assert!(refreshes >= 1);
    }

    /// Early refresh refreshes a hot key before it expires, once fleet-wide,
    /// and no caller ever sees a miss. With `beta = 0` it never does.
    pub async fn early_refresh_before_expiry(h: &dyn Harness) {
        for beta in [100.0, 0.0] {
            let ns = unique_ns("xfetch");
            let pods = pods_with(h, &ns, 3, |b| {
                b.ttl(Duration::from_secs(2)).early_refresh_beta(beta)
            })
            .await;
            let origin = Origin::default();
            let key = "k".to_string();
            pods[0]
                .get_or_load(&key, origin.loader(Duration::from_millis(100)))
                .await
                .unwrap();
            // 0.6–0.8 s of freshness left (the TTL written is 1.8–2 s): inside
            // the window, which beta 100 makes as large as its cap (half the
            // shortest TTL, 0.9 s).
            tokio::time::sleep(Duration::from_millis(1200)).await;
            let results = herd(
                &pods,
                30,
                "k",
                &origin,
                Duration::from_millis(100),
                CallOptions::new(),
            )
            .await;
            assert!(
                results
                    .iter()
                    .all(|r| r.as_ref().unwrap().outcome == Outcome::Hit),
                "beta {beta}"
            );
            if beta > 0.0 {
                // The first call in the window refreshes, once fleet-wide.
                eventually(Duration::from_secs(3), || origin.count() == 2).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert_eq!(origin.count(), 2, "one early refresh fleet-wide");
                let early: u64 = pods.iter().map(|p| p.stats().early_refreshes).sum();
                assert!(early >= 1);
                // The refreshed value is fresh again past the old expiry.
                tokio::time::sleep(Duration::from_millis(1200)).await;
                let f = pods[2]
                    .with_options(&CallOptions::new().early_refresh_beta(0.0)).fetch(
                        &key,
                        origin.loader(Duration::ZERO),
)
                    .await
                    .unwrap();
                assert_eq!((f.outcome, f.value.as_str()), (Outcome::Hit, "k-v2"));
            } else {
                tokio::time::sleep(Duration::from_millis(300)).await;
                assert_eq!(origin.count(), 1, "beta 0: no early refresh");
            }
            let misses: u64 = pods.iter().map(|p| p.stats().misses).sum();
            assert_eq!(misses, 1, "only the cold miss");
        }
    }

    /// A failing origin is remembered for `negative_ttl`: later callers, in any
    /// pod, get the cached failure without calling it; after the TTL it is
    /// called again.
    pub async fn negative_caching_spares_a_failing_origin(h: &dyn Harness) {
        let ns = unique_ns("negative");
        let pods = pods_with(h, &ns, 2, |b| b.negative_ttl(Duration::from_secs(1))).await;
        let calls = Arc::new(AtomicUsize::new(0));
        let key = "k".to_string();
        let err = pods[0]
            .get_or_load(&key, failing_loader(&calls))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Loader(_)));
        for pod in &pods {
            let err = pod
                .get_or_load(&key, failing_loader(&calls))
                .await
                .unwrap_err();
            match err {
                Error::CachedFailure(msg) => assert!(msg.contains("db down"), "{msg}"),
                other => panic!("expected a cached failure, got {other:?}"),
            }
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let negative: u64 = pods.iter().map(|p| p.stats().negative_hits).sum();
        assert_eq!(negative, 2);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let err = pods[1]
            .get_or_load(&key, failing_loader(&calls))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Loader(_)));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "called again after negative_ttl"
        );
    }

    /// The optional variant caches a key's absence.
    pub async fn absence_is_cached(h: &dyn Harness) {
        let ns = unique_ns("absent");
        let c = cache(h, &ns).await;
        let calls = Arc::new(AtomicUsize::new(0));
        let key = "missing".to_string();
        for _ in 0..3 {
            let calls = calls.clone();
            let found = c
                .get_or_load_optional(&key, move |_| async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<Option<String>, OriginError>(None)
                })
                .await
                .unwrap();
            assert_eq!(found, None);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let err = c
            .get_or_load(&key, Origin::default().loader(Duration::ZERO))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NotFound));
    }

    /// Fail-safe: the loader fails while a stale value exists: callers get the
    /// stale value, and the origin is not retried until the throttle passes.
    pub async fn fail_safe_serves_stale_and_throttles(h: &dyn Harness) {
        let ns = unique_ns("failsafe");
        let c = cache_with(h, &ns, |b| {
            b.ttl(Duration::from_secs(1))
                .grace(Duration::from_secs(30))
                .early_refresh_beta(0.0)
                .fail_safe_throttle(Duration::from_secs(2))
        })
        .await;
        let key = "k".to_string();
        let good = Origin::default();
        c.get_or_load(&key, good.loader(Duration::ZERO))
            .await
            .unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let f = c
            .fetch(&key, failing_loader(&calls))
            .await
            .unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Stale, "k-v1"));
        eventually(Duration::from_secs(3), || calls.load(Ordering::SeqCst) == 1).await;
        // The failed refresh re-stored the stale value for the throttle period:
        // callers hit it and the origin is left alone.
        let start = Instant::now();
        loop {
            let f = c
                .fetch(&key, failing_loader(&calls))
                .await
                .unwrap();
            assert_eq!(f.value, "k-v1");
            if f.outcome == Outcome::Hit {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "throttle entry not written"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for _ in 0..5 {
            let f = c
                .fetch(&key, failing_loader(&calls))
                .await
                .unwrap();
            assert_eq!(f.value, "k-v1");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "throttled");
        tokio::time::sleep(Duration::from_millis(2200)).await;
        let f = c
            .fetch(&key, failing_loader(&calls))
            .await
            .unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Stale, "k-v1"));
        eventually(Duration::from_secs(3), || calls.load(Ordering::SeqCst) == 2).await;
        assert!(c.stats().stale_served >= 2);
    }

    /// Jitter spreads the TTLs written for keys filled together, never
    /// beyond the TTL.
    pub async fn jitter_spreads_expiry(h: &dyn Harness) {
        let ns = unique_ns("jitter");
        let c = cache_with(h, &ns, |b| b.ttl(Duration::from_secs(100)).jitter(0.2)).await;
        let origin = Origin::default();
        let backend = h.backend().await;
        let mut ttls = Vec::new();
        for i in 0..30 {
            let key = format!("k{i}");
            c.get_or_load(&key, origin.loader(Duration::ZERO))
                .await
                .unwrap();
            let stored = backend
                .get(&FillKeys::new(&ns, &key))
                .await
                .unwrap()
                .unwrap();
            ttls.push(stored.ttl);
        }
        let min = *ttls.iter().min().unwrap();
        let max = *ttls.iter().max().unwrap();
        assert!(
            min >= Duration::from_secs(79) && max <= Duration::from_secs(100),
            "never longer than the TTL: {min:?}..{max:?}"
        );
        assert!(
            max - min >= Duration::from_secs(10),
            "spread {min:?}..{max:?}"
        );
    }

    /// A value its loader says must not be stored (`Loaded::no_store`):
    /// the callers that shared the load get it, nothing is written, and
    /// the lease is released at once, so the next caller loads again and
    /// the waiters of other pods wake at the release (polls are 20 s apart,
    /// the holder's lease is a minute long): one of them loads, the other
    /// waits for its fill.
    pub async fn no_store_answers_and_frees_the_lease_at_once(h: &dyn Harness) {
        let ns = unique_ns("nostore");
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        let key = "k".to_string();
        let holder = cache_with(h, &ns, |b| b.lease_ttl(LeaseTtl::Fixed(Duration::from_secs(60)))).await;
        let unstored = Arc::new(AtomicUsize::new(0));

        let f = holder.fetch(&key, no_store_loader(&unstored, Duration::ZERO)).await.unwrap();
        assert_eq!((f.value.as_str(), f.outcome), ("k-unstored1", Outcome::Loaded));
        assert_eq!(backend.get(&keys).await.unwrap(), None, "nothing written");
        assert!(!lease_held(&*backend, &keys).await, "the lease is free");
        let f = holder.fetch(&key, no_store_loader(&unstored, Duration::ZERO)).await.unwrap();
        assert_eq!((f.value.as_str(), f.outcome), ("k-unstored2", Outcome::Loaded), "loaded again");
        assert_eq!(holder.stats().loads_not_stored, 2);

        let slow_polls = WaitPolicy::default()
            .polling(Duration::from_secs(20), Duration::from_secs(20))
            .deadline(Duration::from_secs(60));
        let waiters = pods_with(h, &ns, 2, |b| b.wait(slow_polls)).await;
        let load = Duration::from_millis(500);
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let (holder, key) = (holder.clone(), key.clone());
                let loader = no_store_loader(&unstored, load);
                tokio::spawn(async move { holder.fetch(&key, loader).await })
            })
            .collect();
        eventually(Duration::from_secs(5), || unstored.load(Ordering::SeqCst) == 3).await;
        let origin = Origin::default();
        let started = Instant::now();
        let waiting: Vec<_> = waiters
            .iter()
            .map(|w| {
                let (w, key) = (w.clone(), key.clone());
                let loader = origin.loader(Duration::from_millis(100));
                tokio::spawn(async move { w.fetch(&key, loader).await })
            })
            .collect();
        let mut coalesced = 0;
        for c in callers {
            let f = c.await.expect("caller task").expect("an answer");
            assert_eq!((f.value.as_str(), f.outcome), ("k-unstored3", Outcome::Loaded));
            coalesced += usize::from(f.coalesced);
        }
        assert_eq!(coalesced, 1, "the holder's callers shared one load");
        let mut outcomes = Vec::new();
        for w in waiting {
            let f = w.await.expect("waiter task").expect("an answer");
            assert_eq!(f.value, "k-v1", "the one load after the release");
            outcomes.push(f.outcome);
        }
        let elapsed = started.elapsed();
        outcomes.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(outcomes, [Outcome::Loaded, Outcome::Waited]);
        assert_eq!(origin.count(), 1, "one waiter loaded, the other waited for it");
        assert_eq!(unstored.load(Ordering::SeqCst), 3);
        for w in &waiters {
            let s = w.stats();
            assert_eq!(s.wait_polls, 0, "woken by the release, not at a poll or the lease's expiry");
            assert_eq!(s.lease_takeovers, 0);
        }
        assert!(elapsed < Duration::from_secs(20), "well before a poll: {elapsed:?}");
        if h.paused() {
            // The holder's load (less the moment the waiters started late),
            // then the waiter's own load.
            assert!(elapsed <= load + Duration::from_millis(100), "{elapsed:?}");
        }
        let f = holder.fetch(&key, no_store_loader(&unstored, Duration::ZERO)).await.unwrap();
        assert_eq!((f.value.as_str(), f.outcome), ("k-v1", Outcome::Hit), "the waiter's fill stands");
        assert!(!lease_held(&*backend, &keys).await);
    }
}

/// A loader that counts its load into `loads`, takes `took`, and answers
/// `"{key}-unstored{n}"`, a value that must not be stored.
fn no_store_loader(
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> impl FnOnce(String) -> BoxFuture<Result<Loaded<String>, OriginError>> + Send + 'static {
    let loads = loads.clone();
    move |key: String| {
        Box::pin(async move {
            let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(took).await;
            Ok(Loaded::new(format!("{key}-unstored{n}")).no_store())
        })
    }
}
