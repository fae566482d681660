//! Loader failures: errors, panics, cancellation and a hung loader strand
//! nobody and leave no lease behind.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;
use tokio::time::Instant;

use super::{fetch_now, start_slow_load};
use crate::backend::FillKeys;
use crate::testing::{cache, cache_with, lease_held, unique_ns, Harness, Origin, OriginError};
use crate::{Error, Outcome};

scenarios! { $ __onefill_conformance_loader_failures;

    /// A failing loader: every coalesced caller gets the loader's own error
    /// (downcastable), one call, and the lease is released.
    pub async fn loader_error_reaches_every_caller(h: &dyn Harness) {
        let ns = unique_ns("err");
        let c = cache(h, &ns).await;
        let calls = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(50));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (c, calls, barrier) = (c.clone(), calls.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                c.get_or_load("k", move |_| async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err::<String, _>(OriginError("db down".into()))
                })
                .await
            }));
        }
        for t in tasks {
            let err = t.await.unwrap().unwrap_err();
            assert!(err.is_loader());
            let original = err.loader_error::<OriginError>().expect("typed error");
            assert_eq!(original.0, "db down");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(c.stats().loads_error, 1);
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        assert!(!lease_held(&*backend, &keys).await, "released on error");
        assert!(
            backend.get(&keys).await.unwrap().is_none(),
            "nothing cached without negative_ttl"
        );
    }

    /// A panicking loader: every waiter gets an error, none hangs, the lease is
    /// released.
    pub async fn loader_panic_releases_everyone(h: &dyn Harness) {
        let ns = unique_ns("panic");
        let c = cache(h, &ns).await;
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                c.get_or_load("k", |_| async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if true {
                        panic!("loader bug");
                    }
                    Ok::<String, OriginError>(String::new())
                })
                .await
            }));
        }
        for t in tasks {
            match t.await.unwrap() {
                Err(Error::LoaderPanicked(msg)) => assert!(msg.contains("loader bug")),
                other => panic!("expected LoaderPanicked, got {other:?}"),
            }
        }
        let keys = FillKeys::new(&ns, "k");
        assert!(!lease_held(&*h.backend().await, &keys).await);
    }

    /// Cancelling the caller whose loader runs cancels neither the load nor the
    /// lease: the other callers get the value, and it is stored.
    pub async fn cancelling_the_leader_strands_nobody(h: &dyn Harness) {
        let ns = unique_ns("cancel");
        let c = cache(h, &ns).await;
        let origin = Origin::default();
        let leader = start_slow_load(&c, &origin, Duration::from_millis(300)).await;
        let follower = {
            let c = c.clone();
            let loader = origin.loader(Duration::from_millis(300));
            tokio::spawn(async move { c.fetch("k", loader).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        leader.abort();
        let got = follower.await.unwrap().unwrap();
        assert_eq!(got.value, "k-v1");
        assert!(got.coalesced);
        assert_eq!(origin.count(), 1);
        let again = fetch_now(&c, "k", &origin).await;
        assert_eq!(
            again.outcome,
            Outcome::Hit,
            "the cancelled leader's load was stored"
        );
    }

    /// A loader that hangs is aborted at the maximum load time, its lease
    /// released, its callers answered.
    pub async fn hung_loader_is_bounded(h: &dyn Harness) {
        let ns = unique_ns("hung");
        let max = Duration::from_millis(600);
        let c = cache_with(h, &ns, |b| b.max_load_time(max)).await;
        let start = Instant::now();
        let err = c
            .get_or_load("k", |_| async {
                std::future::pending::<()>().await;
                Ok::<String, OriginError>(String::new())
            })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::LoadTimedOut(d) if d == max), "{err:?}");
        assert!(err.is_timeout());
        if h.paused() {
            assert_eq!(start.elapsed(), max);
        }
        assert!(!lease_held(&*h.backend().await, &FillKeys::new(&ns, "k")).await);
    }
}
