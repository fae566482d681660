//! A loaded value that must not be stored (`Loaded::no_store`, Varnish's
//! "hit-for-pass"): the callers that shared the load get it, nothing
//! outlives the load (no fill, no L1 entry, no copy for outages), the lease
//! is released at once so waiters in other processes wake and one of them
//! loads, and a refresh that says so leaves the stored value as it was.
//! Single, optional and batch loaders; fail-safe, negative caching and the
//! soft timeout beside it. Paused time on the embedded backend.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::{Backend, FillKeys, Stored};
use onefill::testing::{lease_held, BoxFuture, OriginError};
use onefill::{CallOptions, LeaseTtl, Loaded, Outcome, WaitPolicy};
use tokio::time::Instant;

use crate::support::loaders::ms;
use crate::support::{
    fetch_loading, fetch_now, key, keys, pod, spawn_fetch, switched, Switched, Switches, NS, REFUSE,
};

/// A loader that counts its load into `loads`, takes `took`, and answers
/// `"{key}-unstored{n}"`, a value that must not be stored.
fn no_store(
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

/// What the store holds for [`key`].
async fn stored(backend: &Switched) -> Option<Stored> {
    backend.store().get(&keys()).await.unwrap()
}

async fn lease_free(backend: &Switched) -> bool {
    !lease_held(backend.store(), &keys()).await
}

/// Three callers share one load that says `no_store`: each gets its value
/// as loaded, nothing is written, the lease is free at once, and the next
/// call loads again (no L1 entry either).
#[tokio::test(start_paused = true)]
async fn the_callers_that_shared_the_load_get_it_and_nothing_is_stored() {
    for l1 in [false, true] {
        let backend = switched();
        let c = pod(&backend, |b| if l1 { b } else { b.no_l1() });
        let loads = Arc::new(AtomicUsize::new(0));
        let callers: Vec<_> = (0..3)
            .map(|_| {
                let (c, load) = (c.clone(), no_store(&loads, ms(100)));
                tokio::spawn(async move { c.fetch(&key(), load).await })
            })
            .collect();
        let mut coalesced = 0;
        for t in callers {
            let f = t.await.unwrap().unwrap();
            assert_eq!(
                (f.value.as_str(), f.outcome),
                ("k-unstored1", Outcome::Loaded)
            );
            coalesced += usize::from(f.coalesced);
        }
        assert_eq!((loads.load(Ordering::SeqCst), coalesced), (1, 2), "l1 {l1}");
        assert_eq!(stored(&backend).await, None, "nothing written (l1 {l1})");
        assert!(lease_free(&backend).await, "released at once (l1 {l1})");

        let f = c.fetch(&key(), no_store(&loads, ms(100))).await.unwrap();
        assert_eq!(
            (f.value.as_str(), f.outcome),
            ("k-unstored2", Outcome::Loaded),
            "the next call loads again (l1 {l1})"
        );
        let s = c.stats();
        assert_eq!((s.loads_ok, s.loads_not_stored), (2, 2), "l1 {l1}");
        assert_eq!(
            s.lease_acquired, 2,
            "each call won the free lease (l1 {l1})"
        );
    }
}

/// A `no_store` value is not kept for backend outages: in an outage that
/// follows, the next call loads (degraded) instead of answering it stale;
/// and a degraded load that says `no_store` is not kept either.
#[tokio::test(start_paused = true)]
async fn nothing_is_kept_for_an_outage() {
    let backend = switched();
    let c = pod(&backend, |b| b.no_l1());
    let loads = Arc::new(AtomicUsize::new(0));
    c.fetch(&key(), no_store(&loads, ms(10))).await.unwrap();
    backend.set_mode(REFUSE);
    for n in 2..4 {
        let f = c.fetch(&key(), no_store(&loads, ms(10))).await.unwrap();
        assert_eq!(
            (f.value, f.outcome),
            (format!("k-unstored{n}"), Outcome::Degraded),
            "loaded again, not answered from the outage copy"
        );
    }
    assert_eq!(c.stats().stale_served, 0);
}

/// Waiters in two other processes (slow polls, a holder's lease of a
/// minute) wake at the release of a `no_store` load, find the lease free:
/// one loads, the other waits for its fill. Nobody waits out the lease,
/// a poll or the deadline.
#[tokio::test(start_paused = true)]
async fn waiters_elsewhere_wake_at_the_release_and_one_of_them_loads() {
    let backend = switched();
    let holder = pod(&backend, |b| b.lease_ttl(LeaseTtl::Fixed(ms(60_000))));
    let slow_polls = WaitPolicy::default()
        .polling(ms(20_000), ms(20_000))
        .deadline(ms(60_000));
    let waiters: Vec<_> = (0..2)
        .map(|_| pod(&backend.peer(), |b| b.wait(slow_polls)))
        .collect();
    let unstored = Arc::new(AtomicUsize::new(0));
    let held = {
        let (c, load) = (holder.clone(), no_store(&unstored, ms(1000)));
        tokio::spawn(async move { c.fetch(&key(), load).await })
    };
    tokio::time::sleep(ms(10)).await; // the holder loads
    let started = Instant::now();
    let loads = Arc::new(AtomicUsize::new(0));
    let waiting: Vec<_> = waiters
        .iter()
        .map(|w| spawn_fetch(w, CallOptions::new(), &loads, ms(200)))
        .collect();
    let f = held.await.unwrap().unwrap();
    assert_eq!(
        (f.value.as_str(), f.outcome),
        ("k-unstored1", Outcome::Loaded)
    );
    let mut outcomes = Vec::new();
    for w in waiting {
        let f = w.await.unwrap().unwrap();
        assert_eq!(f.value, "k-v1");
        outcomes.push(f.outcome);
    }
    // The rest of the holder's load, then one waiter's load: at once.
    assert_eq!(started.elapsed(), ms(990 + 200));
    outcomes.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(outcomes, [Outcome::Loaded, Outcome::Waited]);
    assert_eq!(
        loads.load(Ordering::SeqCst),
        1,
        "one load after the release"
    );
    for w in &waiters {
        let s = w.stats();
        assert_eq!(
            (s.wait_polls, s.lease_takeovers, s.wait_timeouts),
            (0, 0, 0)
        );
        assert!(s.wait_notified >= 1);
    }
    let f = fetch_now(&holder, "k", &loads).await;
    assert_eq!((f.value.as_str(), f.outcome), ("k-v1", Outcome::Hit));
}

/// From an optional loader, `Loaded::new(None).no_store()` is an absence
/// that is not cached, even with negative caching on.
#[tokio::test(start_paused = true)]
async fn an_absence_marked_no_store_is_not_cached() {
    let backend = switched();
    let c = pod(&backend, |b| b.negative_ttl(ms(60_000)));
    let loads = Arc::new(AtomicUsize::new(0));
    for n in 1..3 {
        let counted = loads.clone();
        let f = c
            .fetch_optional(&key(), move |_| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, OriginError>(Loaded::new(None).no_store())
            })
            .await
            .unwrap();
        assert_eq!((f.value, f.outcome), (None, Outcome::Loaded));
        assert_eq!(loads.load(Ordering::SeqCst), n, "loaded again");
    }
    assert_eq!(stored(&backend).await, None);
    assert!(lease_free(&backend).await);
}

/// In a batch, `no_store` is per key: `a` is stored (with the TTL its
/// value chose), `b` is answered and not stored; the next batch hits `a`
/// and loads `b` alone.
#[tokio::test(start_paused = true)]
async fn a_batch_loader_marks_keys_one_by_one() {
    let backend = switched();
    let c = pod(&backend, |b| b.ttl(ms(60_000)).no_l1());
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let loader = {
        let asked = asked.clone();
        move |ks: Vec<String>| {
            asked.lock().unwrap().push(ks.clone());
            async move {
                let found = ks.into_iter().map(|k| {
                    let loaded = Loaded::new(format!("v{k}"));
                    let loaded = if k == "b" {
                        loaded.no_store()
                    } else {
                        loaded.ttl(ms(5000))
                    };
                    (k, loaded)
                });
                Ok::<_, OriginError>(found.collect::<Vec<_>>())
            }
        }
    };
    let wanted = ["a".to_owned(), "b".to_owned()];
    let first = c.fetch_many(&wanted, loader.clone()).await.unwrap();
    for k in &wanted {
        let f = first[k].as_ref().unwrap();
        assert_eq!(
            (f.value.clone(), f.outcome),
            (Some(format!("v{k}")), Outcome::Loaded)
        );
    }
    let store = backend.store();
    let a_keys = FillKeys::new(NS, "a");
    let a = store.get(&a_keys).await.unwrap().expect("a is stored");
    assert!(a.ttl <= ms(5000), "with its value's own TTL: {:?}", a.ttl);
    let b_keys = FillKeys::new(NS, "b");
    assert_eq!(store.get(&b_keys).await.unwrap(), None);
    assert!(!lease_held(store, &b_keys).await);

    let second = c.fetch_many(&wanted, loader).await.unwrap();
    let (a, b) = (second["a"].as_ref().unwrap(), second["b"].as_ref().unwrap());
    assert_eq!((a.outcome, b.outcome), (Outcome::Hit, Outcome::Loaded));
    assert_eq!(asked.lock().unwrap().last().unwrap(), &["b".to_owned()]);
    assert_eq!(c.stats().loads_not_stored, 2);
}

/// A background refresh (stale in grace) whose load says `no_store` ends
/// there: the stale value stays as it was (same bytes, same expiry: no
/// fail-safe re-store), the lease is free, and the next caller gets the
/// stale value again and refreshes again.
#[tokio::test(start_paused = true)]
async fn a_background_refresh_that_says_no_store_leaves_the_stale_value() {
    for l1 in [false, true] {
        let backend = switched();
        let c = pod(&backend, |b| {
            let b = b.ttl(ms(1000)).grace(ms(10_000)).fail_safe(true);
            if l1 {
                b
            } else {
                b.no_l1()
            }
        });
        let loads = Arc::new(AtomicUsize::new(0));
        fetch_now(&c, "k", &loads).await;
        tokio::time::advance(ms(1500)).await; // stale, in grace
        let before = stored(&backend).await.unwrap();
        let unstored = Arc::new(AtomicUsize::new(0));
        for n in 1..3 {
            let f = c.fetch(&key(), no_store(&unstored, ms(10))).await.unwrap();
            assert_eq!(
                (f.value.as_str(), f.outcome),
                ("k-v1", Outcome::Stale),
                "l1 {l1}"
            );
            tokio::time::sleep(ms(50)).await; // the refresh ends
            assert_eq!(unstored.load(Ordering::SeqCst), n, "refreshed (l1 {l1})");
            let after = stored(&backend).await.unwrap();
            assert_eq!(after.bytes, before.bytes, "l1 {l1}");
            assert!(after.ttl < before.ttl, "not re-stored (l1 {l1})");
            assert!(lease_free(&backend).await, "l1 {l1}");
        }
        let s = c.stats();
        assert_eq!(
            (s.background_refreshes, s.loads_not_stored),
            (2, 2),
            "l1 {l1}"
        );
    }
}

/// An early refresh whose load says `no_store` leaves the fresh value as
/// it was, with its own expiry.
#[tokio::test(start_paused = true)]
async fn an_early_refresh_that_says_no_store_leaves_the_fresh_value() {
    let backend = switched();
    let c = pod(&backend, |b| {
        b.ttl(ms(2000)).early_refresh_beta(100.0).no_l1()
    });
    let loads = Arc::new(AtomicUsize::new(0));
    // A load of 100 ms: with beta 100 the window is as large as its cap.
    fetch_loading(&c, "k", &loads, ms(100)).await;
    tokio::time::advance(ms(1200)).await; // in the early-refresh window
    let before = stored(&backend).await.unwrap();
    let unstored = Arc::new(AtomicUsize::new(0));
    let f = c.fetch(&key(), no_store(&unstored, ms(10))).await.unwrap();
    assert_eq!((f.value.as_str(), f.outcome), ("k-v1", Outcome::Hit));
    tokio::time::sleep(ms(50)).await; // the refresh ends
    assert_eq!(unstored.load(Ordering::SeqCst), 1);
    assert_eq!(c.stats().early_refreshes, 1);
    let after = stored(&backend).await.unwrap();
    assert_eq!(after.bytes, before.bytes);
    assert!(after.ttl < before.ttl, "its own expiry");
    assert!(lease_free(&backend).await);
}

/// With a soft timeout and fail-safe: a `no_store` load that ends before
/// the soft timeout answers its value (an answer, not a failure: no stale
/// value instead, no fail-safe re-store); one that ends after it answered
/// the stale value leaves that value as it was, and nothing of it in the
/// L1: the next caller gets the stale value again.
#[tokio::test(start_paused = true)]
async fn with_a_soft_timeout_and_fail_safe_the_stale_value_stays_as_it_was() {
    for l1 in [false, true] {
        let backend = switched();
        let c = pod(&backend, |b| {
            let b = b
                .ttl(ms(1000))
                .grace(ms(10_000))
                .soft_timeout(ms(100))
                .fail_safe(true)
                .fail_safe_throttle(ms(30_000));
            if l1 {
                b
            } else {
                b.no_l1()
            }
        });
        let loads = Arc::new(AtomicUsize::new(0));
        fetch_now(&c, "k", &loads).await;
        tokio::time::advance(ms(1500)).await; // stale, in grace
        let before = stored(&backend).await.unwrap();
        let unstored = Arc::new(AtomicUsize::new(0));

        let f = c.fetch(&key(), no_store(&unstored, ms(10))).await.unwrap();
        assert_eq!(
            (f.value.as_str(), f.outcome),
            ("k-unstored1", Outcome::Loaded),
            "l1 {l1}"
        );
        assert_eq!(
            stored(&backend).await.unwrap().bytes,
            before.bytes,
            "l1 {l1}"
        );
        assert!(lease_free(&backend).await, "l1 {l1}");

        let f = c.fetch(&key(), no_store(&unstored, ms(500))).await.unwrap();
        assert_eq!(
            (f.value.as_str(), f.outcome),
            ("k-v1", Outcome::Stale),
            "l1 {l1}"
        );
        tokio::time::sleep(ms(500)).await; // the deferred load ends
        assert_eq!(unstored.load(Ordering::SeqCst), 2, "l1 {l1}");
        let after = stored(&backend).await.unwrap();
        assert_eq!(after.bytes, before.bytes, "l1 {l1}");
        assert!(after.ttl < before.ttl, "not re-stored (l1 {l1})");
        assert!(lease_free(&backend).await, "l1 {l1}");
        let f = c.fetch(&key(), no_store(&unstored, ms(500))).await.unwrap();
        assert_eq!(
            (f.value.as_str(), f.outcome),
            ("k-v1", Outcome::Stale),
            "l1 {l1}"
        );
    }
}
