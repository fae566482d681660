//! A flight's lease: the watchdog extends it within the backend timeout, a
//! fill whose request was lost releases it, a dropped leader neither
//! cancels its load nor orphans its lease, a panicking loader releases it,
//! and a lease lost under a failing load is counted. Memory backend behind
//! switches (`crate::support::Switched`), in paused time. A test whose case once
//! broke the library says what used to happen.
//!
//! Two limits are accepted, and documented where they live: a lease whose
//! flight is dropped by runtime shutdown cannot be released (nothing can be
//! sent), so it expires within its TTL (the lease guard's docs); and
//! `CodecError` is transparent over the codec's error, which `get_ref`
//! gives back, rather than a link of the source chain.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{
    counting_loader, fetch_now, fixed_lease, key, keys, pod, spawn_fetch, switched, two_pods,
    Switches,
};
use onefill::testing::{lease_held, OriginError};
use onefill::{CallOptions, Error, Outcome};
use tokio::time::Instant;

/// The watchdog's extend used to be bounded by what was left of the
/// *flight's* budget at the acquire (here 80 ms), not by the backend
/// timeout. A waiter that took over a dead holder's lease after a few
/// 40 ms calls then saw its extends (100 ms, well under the 200 ms timeout)
/// all time out, its lease expired mid-load and a third process loaded
/// again. The watchdog now renews with the full backend timeout: the lease
/// lives through the load, and the third process waits for it.
#[tokio::test(start_paused = true)]
async fn lease_the_watchdog_extends_within_the_backend_timeout() {
    let server = switched();
    let w_wire = server.peer();
    w_wire.delay(40);
    let c_wire = server.peer();
    let lease = fixed_lease(Duration::from_millis(300));
    let (w, c) = (pod(&w_wire, lease), pod(&c_wire, lease));
    // A holder that died: its lease lives 500 ms more.
    server
        .store()
        .put_raw(keys().lock(), b"dead holder", Duration::from_millis(500));
    let loads = Arc::new(AtomicUsize::new(0));
    let w_loader = {
        let loads = loads.clone();
        let w_wire = w_wire.clone();
        move |_k: String| async move {
            loads.fetch_add(1, Ordering::SeqCst);
            w_wire.delay(100); // the network slows down (still < timeout)
            tokio::time::sleep(Duration::from_secs(3)).await;
            w_wire.delay(40); // and recovers before the fill
            Ok::<_, OriginError>("from-w".to_string())
        }
    };
    let w_task = {
        let w = w.clone();
        tokio::spawn(async move { w.fetch(&key(), w_loader).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(loads.load(Ordering::SeqCst), 1, "w took over and loads");
    let c_loader = {
        let loads = loads.clone();
        move |_k: String| async move {
            loads.fetch_add(1, Ordering::SeqCst);
            Ok::<_, OriginError>("from-c".to_string())
        }
    };
    let from_c = c.fetch(&key(), c_loader).await.unwrap();
    let from_w = w_task.await.unwrap().unwrap();
    assert_eq!(from_w.outcome, Outcome::Loaded);
    assert_eq!(
        (from_c.outcome, loads.load(Ordering::SeqCst)),
        (Outcome::Waited, 1),
        "w's lease was kept alive (w stats: {:?})",
        w.stats()
    );
}

// ---------------------------------------------------------------------------
// Lease (lease.rs)
// ---------------------------------------------------------------------------

/// The lost `acquire` reply's twin on the fill side: the fill request was lost (a timeout,
/// it never ran). `Lease::end` used to disarm the drop guard on any error,
/// so the token was never released and the next process waited out the
/// whole lease TTL (here up to its 10 s wait deadline) and degraded. A fill
/// that fails now releases the lease in the background: the next process
/// loads at once.
#[tokio::test(start_paused = true)]
async fn lease_a_fill_whose_request_was_lost_releases_its_lease() {
    let [(a_wire, a), (_, b)] = two_pods(fixed_lease(Duration::from_secs(10)));
    let loads = Arc::new(AtomicUsize::new(0));
    a_wire.lose_fill(true);
    let first = fetch_now(&a, "k", &loads).await;
    assert_eq!(first.outcome, Outcome::Loaded);
    a_wire.lose_fill(false);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let start = Instant::now();
    let second = fetch_now(&b, "k", &loads).await;
    assert!(
        second.outcome == Outcome::Loaded && start.elapsed() < Duration::from_secs(1),
        "the orphaned lease was released: got {:?} after {:?}",
        second.outcome,
        start.elapsed()
    );
}

/// A guard: a caller's timeout around get_or_load (the
/// leader's) cancels neither the load nor the fill; a follower still gets
/// the value, and the lease is filled, not orphaned.
#[tokio::test(start_paused = true)]
async fn a_dropped_leader_neither_cancels_the_load_nor_orphans_the_lease() {
    let wire = switched();
    let c = pod(&wire, |b| b);
    let loads = Arc::new(AtomicUsize::new(0));
    let gave_up = tokio::time::timeout(
        Duration::from_millis(10),
        c.get_or_load(&key(), counting_loader(&loads, Duration::from_millis(500))),
    )
    .await;
    assert!(gave_up.is_err());
    let f = fetch_now(&c, "k", &loads).await;
    assert!(f.coalesced);
    assert_eq!(f.value, "k-v1");
    assert!(!lease_held(wire.store(), &keys()).await);
    let again = fetch_now(&c, "k", &loads).await;
    assert_eq!(
        (again.outcome, loads.load(Ordering::SeqCst)),
        (Outcome::Hit, 1)
    );
}

/// The leader's first read runs in the caller's own task (a hit
/// needs no task). A leader dropped during that read must not strand the
/// caller that joined it: the flight starts over in a task of its own.
#[tokio::test(start_paused = true)]
async fn a_leader_dropped_during_its_first_read_does_not_strand_its_followers() {
    let wire = switched();
    let c = pod(&wire, |b| b);
    let loads = Arc::new(AtomicUsize::new(0));
    wire.delay(50);
    let leader = spawn_fetch(&c, CallOptions::new(), &loads, Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let follower = spawn_fetch(&c, CallOptions::new(), &loads, Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(10)).await;
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    let f = follower.await.unwrap().unwrap();
    assert!(f.coalesced);
    assert_eq!((f.value.as_str(), f.outcome), ("k-v1", Outcome::Loaded));
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert!(!lease_held(wire.store(), &keys()).await);
}

/// A guard: a loader that panics under the lease releases it,
/// every caller gets LoaderPanicked, and the next call loads at once.
#[tokio::test(start_paused = true)]
async fn a_panicking_loader_releases_the_lease_for_everyone() {
    let wire = switched();
    let c = pod(&wire, |b| b);
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.get_or_load(&key(), |_k| async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if true {
                    panic!("boom");
                }
                Ok::<_, OriginError>(String::new())
            })
            .await
        }));
    }
    for t in tasks {
        let err = t.await.unwrap().unwrap_err();
        assert!(
            matches!(err, Error::LoaderPanicked(ref m) if m == "boom"),
            "{err}"
        );
    }
    assert!(!lease_held(wire.store(), &keys()).await);
    let loads = Arc::new(AtomicUsize::new(0));
    let f = fetch_now(&c, "k", &loads).await;
    assert_eq!(f.outcome, Outcome::Loaded);
}

/// A lease lost under a failing load is counted.
mod lost_lease_counted {
    use std::time::Duration;

    use crate::support::loaders::after;
    use crate::support::{spawn_get_or_load, two_pods};

    /// A lease lost under a load that then fails is counted too: the holder
    /// learns it when its release answers that the lease is not its own any
    /// more, and another process may have loaded meanwhile (a duplicate load).
    /// Only a fill or a renewal answering so was counted (simulation seed 72).
    #[tokio::test(start_paused = true)]
    async fn a_lease_lost_under_a_failing_load_is_counted() {
        let [(_, a), (_, b)] = two_pods(|b| b);
        let key = "k".to_string();
        let failing = spawn_get_or_load(&a, &key, after(300, Err("db down")));
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Another process revokes the lease mid-load (before any renewal).
        b.invalidate(&key).await.unwrap();
        assert!(failing.await.unwrap().is_err());
        assert_eq!(a.stats().lease_lost, 1, "the lost lease was counted");
    }
}
