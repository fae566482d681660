//! Regressions: the faults found when onefill was tried adversarially,
//! each a scenario named after its case, so every backend proves
//! it stays fixed.

use std::time::Duration;

use super::{fetch_now, start_slow_load};
use crate::backend::FillKeys;
use crate::testing::{cache, cache_with, herd, lease_held, unique_ns, Harness, Origin};
use crate::{Cache, CallOptions, LeaseTtl, Outcome};

scenarios! { $ __onefill_conformance_regressions;

    /// Regression: a value this version of `V` cannot read, then 4 pods × 10
    /// callers: one load fleet-wide (it used to be one per pod: the flag
    /// that widens the acquire never reset, so each pod won the lease the
    /// previous one had just freed).
    pub async fn one_unreadable_value_costs_one_load_fleet_wide(h: &dyn Harness) {
        let ns = unique_ns("unreadable");
        let other: Cache<String, Vec<u64>> = Cache::builder()
            .namespace(&ns)
            .shared_backend(h.backend().await)
            .build()
            .expect("valid options");
        other.set(&"k".to_string(), vec![1, 2, 3]).await.expect("set");
        let mut pods = Vec::new();
        for _ in 0..4 {
            pods.push(cache(h, &ns).await);
        }
        let origin = Origin::default();
        let results = herd(&pods, 40, "k", &origin, Duration::from_millis(200), CallOptions::new()).await;
        for r in &results {
            assert_eq!(r.as_ref().expect("an answer").value, "k-v1");
        }
        assert_eq!(origin.count(), 1, "one load fleet-wide");
    }

    /// Regression: a call made after `set` returned, while an older flight was
    /// still loading, used to join that flight and get its older value.
    pub async fn a_call_after_set_never_joins_an_older_flight(h: &dyn Harness) {
        let ns = unique_ns("ryw-set");
        let c = cache(h, &ns).await;
        let origin = Origin::default();
        let older = start_slow_load(&c, &origin, Duration::from_millis(500)).await;
        c.set("k", "manual".to_string()).await.expect("set");
        let after = fetch_now(&c, "k", &origin).await;
        assert!(!after.coalesced, "joined a flight from before the set");
        assert_eq!((after.value.as_str(), after.outcome), ("manual", Outcome::Hit));
        assert_eq!(older.await.expect("task").expect("answer").value, "k-v1");
        assert_eq!(fetch_now(&c, "k", &origin).await.value, "manual", "the old fill was fenced out");
    }

    /// Regression: the same after `invalidate`: the later call loads anew.
    pub async fn a_call_after_invalidate_never_joins_an_older_flight(h: &dyn Harness) {
        let ns = unique_ns("ryw-inv");
        let c = cache(h, &ns).await;
        let origin = Origin::default();
        let older = start_slow_load(&c, &origin, Duration::from_millis(500)).await;
        c.invalidate("k").await.expect("invalidate");
        let after = fetch_now(&c, "k", &origin).await;
        assert!(!after.coalesced, "joined a flight from before the invalidate");
        assert_eq!((after.value.as_str(), after.outcome), ("k-v2", Outcome::Loaded));
        assert_eq!(older.await.expect("task").expect("answer").value, "k-v1");
        assert_eq!(fetch_now(&c, "k", &origin).await.value, "k-v2");
    }

    /// Regression: a `no_lease` load that started before an `invalidate` used
    /// to write its value after it (a plain `SET`).
    pub async fn a_no_lease_load_is_fenced_by_invalidate(h: &dyn Harness) {
        let ns = unique_ns("nolease-fence");
        let c = cache_with(h, &ns, |b| b.no_lease()).await;
        let origin = Origin::default();
        let older = start_slow_load(&c, &origin, Duration::from_millis(500)).await;
        c.invalidate("k").await.expect("invalidate");
        assert_eq!(older.await.expect("task").expect("answer").value, "k-v1");
        let keys = FillKeys::new(&ns, "k");
        let stored = h.backend().await.get(&keys).await.expect("get");
        assert!(stored.is_none(), "a load from before the invalidate was stored");
    }

    /// Regression: a `no_lease` load used to delete another process's lease
    /// (its `SET` removed the lock); now, with the lease held elsewhere, it
    /// answers its callers without storing, and the holder fills.
    pub async fn a_no_lease_load_leaves_other_leases_alone(h: &dyn Harness) {
        let ns = unique_ns("nolease-lease");
        let holder = cache(h, &ns).await;
        let origin = Origin::default();
        let held = start_slow_load(&holder, &origin, Duration::from_millis(500)).await;
        let cheap = cache_with(h, &ns, |b| b.no_lease()).await;
        let got = fetch_now(&cheap, "k", &origin).await;
        assert_eq!((got.value.as_str(), got.outcome), ("k-v2", Outcome::Degraded));
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        assert!(lease_held(backend.as_ref(), &keys).await, "the holder's lease was removed");
        assert_eq!(held.await.expect("task").expect("answer").outcome, Outcome::Loaded);
        assert_eq!(fetch_now(&holder, "k", &origin).await.value, "k-v1", "the holder filled");
    }

    /// Regression: keys with braces of their own (one starting with `}` made an
    /// empty hash tag, splitting value and lease across cluster slots), and
    /// newline, NUL and 1 KiB keys: loaded, hit, set and invalidated like
    /// any other.
    pub async fn hostile_keys_work_like_any_other(h: &dyn Harness) {
        let ns = unique_ns("hostile");
        let c = cache(h, &ns).await;
        let origin = Origin::default();
        let long = "}{".repeat(512);
        for key in ["}", "{", "}{", "{}", "}x{y}", "%7D", "new\nline", "nul\0byte", long.as_str()] {
            let first = fetch_now(&c, key, &origin).await;
            assert_eq!(first.outcome, Outcome::Loaded, "{key:?}");
            assert_eq!(fetch_now(&c, key, &origin).await.outcome, Outcome::Hit, "{key:?}");
            c.set(key, "manual".to_string()).await.expect("set");
            assert_eq!(fetch_now(&c, key, &origin).await.value, "manual", "{key:?}");
            c.invalidate(key).await.expect("invalidate");
            assert_eq!(fetch_now(&c, key, &origin).await.outcome, Outcome::Loaded, "{key:?}");
        }
    }

    /// Regression: without a lease, a grace refresh still loading when the hard
    /// TTL expired, and the next caller loaded too: two loads at once in one
    /// process. The next caller now shares the refresh's load.
    pub async fn one_load_per_process_while_a_refresh_runs(h: &dyn Harness) {
        let ns = unique_ns("refresh-once");
        let c = cache_with(h, &ns, |b| {
            b.no_lease()
                .ttl(Duration::from_millis(300))
                .grace(Duration::from_millis(300))
        })
        .await;
        let origin = Origin::default();
        let k = "k".to_string();
        assert_eq!(fetch_now(&c, "k", &origin).await.outcome, Outcome::Loaded);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let slow = origin.loader(Duration::from_millis(800));
        let stale = c.fetch(&k, slow).await.expect("stale");
        assert_eq!(stale.outcome, Outcome::Stale, "a background refresh starts");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let expired = fetch_now(&c, "k", &origin).await;
        assert_eq!(expired.value, "k-v2", "shared the refresh's load");
        assert_eq!(origin.count(), 2, "no second load in this process");
    }

    /// Regression: a lost lease was counted twice, once by the watchdog's
    /// failed renewal and once by the fenced-out fill.
    pub async fn a_lost_lease_is_counted_once(h: &dyn Harness) {
        let ns = unique_ns("lost-once");
        let c = cache_with(h, &ns, |b| {
            b.lease_ttl(LeaseTtl::Fixed(Duration::from_millis(300)))
        })
        .await;
        let origin = Origin::default();
        let task = start_slow_load(&c, &origin, Duration::from_millis(700)).await;
        c.invalidate("k").await.expect("invalidate");
        task.await.expect("task").expect("answer");
        assert_eq!(c.stats().lease_lost, 1);
    }
}
