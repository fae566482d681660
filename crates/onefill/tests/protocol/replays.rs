//! Writes that fail for want of the backend are queued and replayed, as
//! invalidations, once it answers (decision 0017): the failed write still
//! returns its error and drops the key here at once; the replay reaches the
//! store in order, newest write per key, within the queue's bound; a write
//! that lands retires the queued ones from before it; a cache dropped with
//! writes pending ends its task. Memory backend behind switches, two pods
//! on one store, in paused time.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{
    assert_the_fallback_forgot, fetch_now, key, pod, switched, two_pods, Switched, Switches,
    COMMAND, HANG, HEALTHY, NS, REFUSE,
};
use onefill::backend::FillKeys;
use onefill::testing::{Fault, Op};
use onefill::{Cache, L1};

/// Longer than the replay task may take to replay once the backend
/// answers again: a circuit opened by the outage stays open for up to its
/// `open_for` (2 s by default), then the task's pause (at most 1 s ±25 %).
const REPLAYED: Duration = Duration::from_secs(4);

/// Two pods with "k" stored ("k-v1", loaded by the first), the first's
/// backend then refusing every call.
async fn stored_then_a_refuses() -> ([(Switched, Cache<String, String>); 2], Arc<AtomicUsize>) {
    let pods = two_pods(|b| b);
    let loads = Arc::new(AtomicUsize::new(0));
    assert_eq!(fetch_now(&pods[0].1, "k", &loads).await.value, "k-v1");
    pods[0].0.set_mode(REFUSE);
    (pods, loads)
}

/// The store's value of `key`, past every switch.
fn stored(wire: &Switched, key: &str) -> Option<Vec<u8>> {
    wire.store()
        .get_raw(FillKeys::new(NS, key).value())
        .map(|(bytes, _)| bytes)
}

/// The keys of the invalidations that reach the store from now on, in
/// order (every call still meets the wire's other faults).
fn log_invalidations(wire: &Switched) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    wire.faults().decide_with(move |op, keys| {
        if let (Op::Invalidate, Some(keys)) = (op, keys) {
            log.lock().unwrap().push(keys.value().to_owned());
        }
        None
    });
    seen
}

/// Each key's value key, as [`log_invalidations`] reports them.
fn value_keys(keys: &[&str]) -> Vec<String> {
    keys.iter()
        .map(|k| FillKeys::new(NS, k).value().to_owned())
        .collect()
}

/// The case the queue is for: an invalidate fails while the backend is
/// out of reach. It returns its error and the other process still reads
/// the old value meanwhile; this process forgot it at once (its outage
/// fallback does not answer it); once the backend answers, the replay
/// deletes it and the other process misses. (Before the queue, the
/// invalidation was lost: the other process read "k-v1" until it expired.)
#[tokio::test(start_paused = true)]
async fn a_failed_invalidate_is_replayed_once_the_backend_answers() {
    let ([(a_wire, a), (_, b)], loads) = stored_then_a_refuses().await;
    let err = a.invalidate(&key()).await.unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert_eq!(a.pending_writes(), 1);
    assert_eq!(b.get(&key()).await.unwrap().as_deref(), Some("k-v1"));
    // Still refusing: the fallback does not answer the invalidated value
    // (a degraded load does), and the replay waits.
    assert_the_fallback_forgot(&a_wire, &a, &loads, "forgotten at once").await;
    tokio::time::sleep(REPLAYED * 3).await;
    assert_eq!(a.pending_writes(), 1, "retried, still queued");
    assert_eq!(b.get(&key()).await.unwrap().as_deref(), Some("k-v1"));

    a_wire.set_mode(HEALTHY);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(a.pending_writes(), 0);
    assert_eq!(
        b.get(&key()).await.unwrap(),
        None,
        "the other process misses"
    );
    let stats = a.stats();
    assert_eq!((stats.writes_queued, stats.writes_replayed), (1, 1));
    assert_eq!((stats.writes_dropped, stats.writes_refused), (0, 0));
}

/// With an L1, the failed invalidate drops the key from it at once: the
/// next call of the process reads the store (which still holds the value,
/// the write having failed) rather than answer from memory.
#[tokio::test(start_paused = true)]
async fn a_failed_invalidate_drops_the_key_from_the_l1_at_once() {
    // In process as its store is: the memory backend's own reports keep
    // the L1 coherent.
    let wire = switched().in_process_as_inner();
    let c = pod(&wire, |b| b.l1(L1::new(100)));
    let loads = Arc::new(AtomicUsize::new(0));
    // Loaded, then read from the store: the read is what the L1 keeps.
    fetch_now(&c, "k", &loads).await;
    fetch_now(&c, "k", &loads).await;
    assert_eq!(c.get(&key()).await.unwrap().as_deref(), Some("k-v1"));
    let l1_hits = c.stats().l1_hits;
    assert_eq!(l1_hits, 1, "answered from the L1");
    wire.faults().set(Op::WRITES, Fault::Refuse);
    assert!(c.invalidate(&key()).await.is_err());
    let reads = wire.faults().calls(Op::Get);
    assert_eq!(c.get(&key()).await.unwrap().as_deref(), Some("k-v1"));
    assert_eq!(c.stats().l1_hits, l1_hits, "not from the L1");
    assert_eq!(wire.faults().calls(Op::Get), reads + 1, "from the store");
}

/// A failed `set` is replayed as an invalidation, not as itself: its value
/// may be older than what another process wrote meanwhile. Here the other
/// process sets "newer" while the first is cut off; the replay keeps it
/// (written after the failed write began) rather than putting back
/// "older" over it, or deleting it as it did before.
#[tokio::test(start_paused = true)]
async fn a_failed_set_is_replayed_as_an_invalidation_that_keeps_a_newer_value() {
    let ([(a_wire, a), (_, b)], _) = stored_then_a_refuses().await;
    assert!(a.set(&key(), "older".into()).await.is_err());
    tokio::time::sleep(Duration::from_millis(10)).await;
    b.set(&key(), "newer".into()).await.unwrap();
    a_wire.set_mode(HEALTHY);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(a.pending_writes(), 0);
    assert_eq!(b.get(&key()).await.unwrap().as_deref(), Some("newer"));
    assert_eq!(a.stats().writes_replayed, 1);
}

/// Without another write, the failed `set`'s replay deletes the value
/// that was there before it (the fleet reloads from the source of truth).
#[tokio::test(start_paused = true)]
async fn a_failed_set_s_replay_deletes_the_value_from_before_it() {
    let ([(a_wire, a), (_, _)], _) = stored_then_a_refuses().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(a.set(&key(), "lost".into()).await.is_err());
    a_wire.set_mode(HEALTHY);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(a.pending_writes(), 0);
    assert_eq!(stored(&a_wire, "k"), None, "deleted, neither value written");
    assert_eq!(a.stats().writes_replayed, 1);
}

/// The caller gives up on an invalidate that hangs (its future dropped
/// mid-call, the outcome unknown): queued all the same, and replayed.
#[tokio::test(start_paused = true)]
async fn a_write_whose_future_is_dropped_is_queued_too() {
    let ([(a_wire, a), (_, b)], _) = stored_then_a_refuses().await;
    a_wire.set_mode(HANG);
    let gave_up = tokio::time::timeout(Duration::from_millis(50), a.invalidate(&key())).await;
    assert!(gave_up.is_err(), "the caller gave up");
    assert_eq!(a.pending_writes(), 1);
    a_wire.set_mode(HEALTHY);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(b.get(&key()).await.unwrap(), None);
}

/// The newest write of a key takes the place of the one queued, at the
/// back; the queue is replayed in order, each key once.
#[tokio::test(start_paused = true)]
async fn the_queue_keeps_the_newest_write_per_key_in_order() {
    let wire = switched();
    let c = pod(&wire, |b| b);
    wire.set_mode(REFUSE);
    for k in ["k1", "k2"] {
        assert!(c.invalidate(&k.to_owned()).await.is_err());
    }
    assert!(c.set(&"k1".to_owned(), "v".into()).await.is_err());
    assert!(c.invalidate(&"k3".to_owned()).await.is_err());
    assert_eq!(c.pending_writes(), 3);
    wire.set_mode(HEALTHY);
    let replayed = log_invalidations(&wire);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(*replayed.lock().unwrap(), value_keys(&["k2", "k1", "k3"]));
    let stats = c.stats();
    assert_eq!((stats.writes_queued, stats.writes_replayed), (4, 3));
}

/// Past its capacity the queue drops its oldest writes, counted; the
/// others are replayed.
#[tokio::test(start_paused = true)]
async fn a_full_queue_drops_its_oldest_writes_and_counts_them() {
    let wire = switched();
    let c = pod(&wire, |b| b.replay_queue_capacity(2));
    wire.set_mode(REFUSE);
    for k in ["k1", "k2", "k3", "k4"] {
        assert!(c.invalidate(&k.to_owned()).await.is_err());
    }
    assert_eq!(c.pending_writes(), 2);
    assert_eq!(c.stats().writes_dropped, 2);
    wire.set_mode(HEALTHY);
    let replayed = log_invalidations(&wire);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(*replayed.lock().unwrap(), value_keys(&["k3", "k4"]));
    assert_eq!(c.stats().writes_replayed, 2);
}

/// A write of the key that lands after the failed one retires it: the
/// replay would only delete the value just written.
#[tokio::test(start_paused = true)]
async fn a_write_that_lands_retires_the_queued_write_of_its_key() {
    let ([(a_wire, a), _], _) = stored_then_a_refuses().await;
    assert!(a.invalidate(&key()).await.is_err());
    a_wire.set_mode(HEALTHY);
    a.set(&key(), "after".into()).await.unwrap();
    assert_eq!(a.pending_writes(), 0);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(a.get(&key()).await.unwrap().as_deref(), Some("after"));
    assert_eq!(a.stats().writes_replayed, 0);
}

/// A write the server refused (a command error: it answered) is not
/// queued; a replay it refuses is dropped and counted, not retried.
#[tokio::test(start_paused = true)]
async fn refusals_are_not_replayed() {
    let ([(a_wire, a), (_, b)], _) = stored_then_a_refuses().await;
    a_wire.set_mode(COMMAND);
    assert!(a.invalidate(&key()).await.is_err());
    assert_eq!(a.pending_writes(), 0, "a refusal is not queued");

    a_wire.set_mode(REFUSE);
    assert!(a.invalidate(&key()).await.is_err());
    assert_eq!(a.pending_writes(), 1);
    a_wire.set_mode(COMMAND);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(a.pending_writes(), 0);
    assert_eq!(a.stats().writes_refused, 1);
    let tried = a_wire.faults().calls(Op::Invalidate);
    tokio::time::sleep(REPLAYED * 5).await;
    assert_eq!(a_wire.faults().calls(Op::Invalidate), tried, "not retried");
    assert_eq!(b.get(&key()).await.unwrap().as_deref(), Some("k-v1"));
}

/// Every handle of a cache dropped with writes pending: no panic, the
/// replay task ends at its next attempt (it holds the cache weakly) and
/// makes no more calls; what was pending is lost.
#[tokio::test(start_paused = true)]
async fn a_cache_dropped_with_writes_pending_ends_its_task() {
    let runtime = tokio::runtime::Handle::current().metrics();
    let ([(a_wire, a), _], _) = stored_then_a_refuses().await;
    assert!(a.invalidate(&key()).await.is_err());
    assert_eq!(runtime.num_alive_tasks(), 1, "the replay task");
    tokio::time::sleep(REPLAYED).await;
    drop(a);
    let tried = a_wire.faults().calls(Op::Invalidate);
    a_wire.set_mode(HEALTHY);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(runtime.num_alive_tasks(), 0, "the replay task ended");
    assert_eq!(a_wire.faults().calls(Op::Invalidate), tried);
    assert!(stored(&a_wire, "k").is_some(), "lost with its process");
}

/// The replay task drains through the circuit breaker like every call:
/// while it is open the replay is rejected (and counted as such), and the
/// write waits.
#[tokio::test(start_paused = true)]
async fn replays_go_through_the_circuit_breaker() {
    let wire = switched();
    let c = pod(&wire, |b| {
        b.circuit_breaker(onefill::CircuitBreaker::new(1, Duration::from_secs(30)))
    });
    wire.faults().set(Op::WRITES, Fault::Refuse);
    assert!(c.invalidate(&key()).await.is_err(), "opens the breaker");
    wire.set_mode(HEALTHY);
    tokio::time::sleep(REPLAYED * 5).await;
    assert_eq!(c.pending_writes(), 1, "the breaker is open");
    assert!(c.stats().circuit_rejected >= 5, "{:?}", c.stats());
    assert_eq!(wire.faults().calls(Op::Invalidate), 1, "not sent");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(c.pending_writes(), 0, "replayed by the half-open probe");
    assert_eq!(wire.faults().calls(Op::Invalidate), 2);
}

/// Marks are queued and replayed too: a failed `invalidate_tag` or `clear`
/// returns its error and is replayed once the backend answers, so the
/// other process stops answering the values it judges (before, the mark
/// was lost). A failed `expire_tag` of the same tag does not replace the
/// queued invalidation: both are replayed.
#[tokio::test(start_paused = true)]
async fn a_failed_mark_is_replayed_once_the_backend_answers() {
    let pods = two_pods(|b| b);
    let ((a_wire, a), (_, b)) = (&pods[0], &pods[1]);
    let loads = Arc::new(AtomicUsize::new(0));
    fetch_now(a, "k", &loads).await;
    a.set_tagged("tagged", "t-v1".to_owned(), ["seller:7"])
        .await
        .unwrap();
    a_wire.set_mode(REFUSE);
    for err in [
        a.invalidate_tag("seller:7").await.unwrap_err(),
        a.expire_tag("seller:7").await.unwrap_err(),
    ] {
        assert!(err.is_backend(), "{err}");
    }
    assert_eq!(
        a.pending_writes(),
        2,
        "the expiry does not replace the invalidation"
    );
    assert_eq!(b.get("tagged").await.unwrap().as_deref(), Some("t-v1"));
    a.clear().await.unwrap_err();
    assert_eq!(a.pending_writes(), 3);
    assert_eq!(b.get("k").await.unwrap().as_deref(), Some("k-v1"));
    a_wire.set_mode(HEALTHY);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(a.pending_writes(), 0);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for key in ["tagged", "k"] {
        assert_eq!(b.get(key).await.unwrap(), None, "{key}: replayed");
        assert_eq!(a.get(key).await.unwrap(), None, "{key}: replayed");
    }
}

/// An `expire` that lands queues nothing (it said it ran); one that fails
/// while the backend is out of reach is replayed as an invalidation once
/// it answers. (A landed expire that queued a replay would turn every
/// expire into a deletion a moment later.)
#[tokio::test(start_paused = true)]
async fn an_expire_is_replayed_only_if_it_failed() {
    let pods = two_pods(|b| b.grace(Duration::from_secs(30)));
    let loads = Arc::new(AtomicUsize::new(0));
    let [(a_wire, a), (_, b)] = &pods;
    assert_eq!(fetch_now(a, "k", &loads).await.value, "k-v1");
    a.expire(&key()).await.unwrap();
    assert_eq!(a.pending_writes(), 0, "landed: nothing to replay");
    tokio::time::sleep(REPLAYED).await;
    assert!(stored(a_wire, "k").is_some(), "kept, stale");
    assert_eq!(b.get(&key()).await.unwrap().as_deref(), Some("k-v1"));

    a_wire.set_mode(REFUSE);
    assert!(a.expire(&key()).await.unwrap_err().is_backend());
    assert_eq!(a.pending_writes(), 1);
    a_wire.set_mode(HEALTHY);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(a.pending_writes(), 0);
    assert!(stored(a_wire, "k").is_none(), "replayed as an invalidation");
}
