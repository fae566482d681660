//! Writes: undecodable values, fills fenced out by `invalidate` and `set`,
//! the size limit.

use std::time::Duration;

use super::{fetch_now, start_slow_load};
use crate::backend::{Acquired, FillKeys};
use crate::testing::{cache, cache_with, lease_held, unique_ns, Harness, Origin, OriginError};
use crate::token::LeaseToken;
use crate::{Cache, Error, Outcome};

scenarios! { $ __onefill_conformance_writes;

    /// Bytes that are not our envelope (or not our type) are a counted miss and
    /// are overwritten by the next fill; never an error.
    pub async fn undecodable_value_is_a_miss(h: &dyn Harness) {
        let ns = unique_ns("corrupt");
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        let c = cache(h, &ns).await;
        let origin = Origin::default();
        for garbage in [&b"\xff\x00garbage"[..], &b""[..]] {
            backend
                .set(&keys, garbage, Duration::from_secs(60))
                .await
                .unwrap();
            let got = fetch_now(&c, "k", &origin).await;
            assert_eq!(got.outcome, Outcome::Loaded);
        }
        // A valid envelope whose payload is another type (a deploy changed V):
        // fresh on the server, unreadable here; it must not block the lease.
        let other: Cache<String, Vec<u64>> = Cache::builder()
            .namespace(&ns)
            .shared_backend(h.backend().await)
            .build()
            .unwrap();
        other.set(&"k".to_string(), vec![1, 2, 3]).await.unwrap();
        let got = fetch_now(&c, "k", &origin).await;
        assert_eq!(got.outcome, Outcome::Loaded);
        assert_eq!(origin.count(), 3);
        assert_eq!(c.stats().decode_errors, 3);
        // ...and the fill replaced it.
        let hit = fetch_now(&c, "k", &origin).await;
        assert_eq!(hit.outcome, Outcome::Hit);
        assert_eq!(hit.value, "k-v3");
    }

    /// `invalidate` during a slow load: its callers get the value, but it is
    /// not stored (the fill is fenced out) and the lease loss is counted.
    pub async fn invalidate_fences_a_fill_in_flight(h: &dyn Harness) {
        let ns = unique_ns("fence");
        let c = cache(h, &ns).await;
        let origin = Origin::default();
        let task = start_slow_load(&c, &origin, Duration::from_millis(500)).await;
        c.invalidate("k").await.unwrap();
        assert_eq!(task.await.unwrap().unwrap().value, "k-v1");
        let keys = FillKeys::new(&ns, "k");
        assert!(
            h.backend().await.get(&keys).await.unwrap().is_none(),
            "fenced out"
        );
        assert_eq!(c.stats().lease_lost, 1);
    }

    /// `set` during a slow load: the load's callers get its value, the stored
    /// value is the one that was set.
    pub async fn set_fences_a_fill_in_flight(h: &dyn Harness) {
        let ns = unique_ns("setfence");
        let c = cache(h, &ns).await;
        let origin = Origin::default();
        let key = "k".to_string();
        let task = start_slow_load(&c, &origin, Duration::from_millis(400)).await;
        c.set(&key, "manual".to_string()).await.unwrap();
        assert_eq!(task.await.unwrap().unwrap().value, "k-v1");
        assert_eq!(c.get(&key).await.unwrap().as_deref(), Some("manual"));
        assert_eq!(c.stats().lease_lost, 1);
    }

    /// The replay's invalidation (`invalidate_older_than`): a value written
    /// longer ago than the age is deleted; one written within it is kept by
    /// a backend that can tell when it was written (it answers `false`) and
    /// deleted by one that cannot (`true`): its answer is what it did. The
    /// lease goes either way, and the change is announced.
    pub async fn a_replayed_invalidation_answers_what_it_did(h: &dyn Harness) {
        let ns = unique_ns("older");
        let c = cache(h, &ns).await;
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        let key = "k".to_string();
        c.set(&key, "v".to_string()).await.unwrap();
        let taken = backend
            .acquire(&keys, &LeaseToken::random(), Duration::from_secs(5), Duration::MAX)
            .await
            .unwrap();
        assert!(matches!(taken, Acquired::Won { .. }), "{taken:?}");
        let deleted = backend
            .invalidate_older_than(&keys, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(backend.get(&keys).await.unwrap().is_none(), deleted);
        assert!(!lease_held(&*backend, &keys).await, "the lease stayed");
        c.set(&key, "w".to_string()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(backend
            .invalidate_older_than(&keys, Duration::from_millis(10))
            .await
            .unwrap());
        assert!(backend.get(&keys).await.unwrap().is_none(), "an older value kept");
    }

    /// A value over the size limit is a clear error; nothing is written and the
    /// lease is released.
    pub async fn oversize_value_writes_nothing(h: &dyn Harness) {
        let ns = unique_ns("oversize");
        let c = cache_with(h, &ns, |b| b.max_value_bytes(64)).await;
        let err = c
            .get_or_load("k", |_| async {
                Ok::<_, OriginError>("x".repeat(100))
            })
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidInput(crate::InputError::ValueTooLarge { max: 64, .. })
            ),
            "{err}"
        );
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        assert!(backend.get(&keys).await.unwrap().is_none());
        assert!(!lease_held(&*backend, &keys).await);
        assert!(c
            .set("k", "y".repeat(100))
            .await
            .unwrap_err()
            .is_invalid_input());
        assert!(backend.get(&keys).await.unwrap().is_none());
    }
}
