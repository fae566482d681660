//! Writes that ran but that too few replicas confirmed (a backend asked
//! for durability answers `NotReplicated`, decision 0020): the caller of a
//! `set`, `invalidate`, `expire` or mark gets the error, a fill's callers
//! get the value; either way it is counted, the breaker takes it for an
//! answer, it is not replayed, and it retires the writes of its target
//! queued before it (it ran: their replays would undo it). Memory backend
//! behind the fault injector, in paused time.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use crate::support::{fetch_now, key, pod, switched, two_pods, Switches, HEALTHY, NS, REFUSE};
use onefill::backend::FillKeys;
use onefill::testing::{Fault, Op};
use onefill::{CircuitBreaker, CircuitState, Error};

/// Longer than a replay takes once the backend answers (see `replays.rs`).
const REPLAYED: Duration = Duration::from_secs(4);

fn unreplicated(result: Result<(), Error>) -> bool {
    matches!(&result, Err(Error::Backend(e)) if e.is_not_replicated() && !e.is_transient())
}

#[tokio::test(start_paused = true)]
async fn an_unreplicated_write_is_an_answer_not_an_outage() {
    let wire = switched();
    // One failure would open this breaker.
    let c = pod(&wire, |b| {
        b.circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(30)))
    });
    wire.faults().set(
        [Op::Set, Op::Invalidate, Op::Expire, Op::Mark],
        Fault::Unreplicated,
    );
    assert!(unreplicated(c.set(&key(), "v".into()).await));
    let value_key = FillKeys::new(NS, &key()).value().to_owned();
    assert!(wire.store().get_raw(&value_key).is_some(), "it ran");
    assert!(unreplicated(c.expire(&key()).await));
    assert!(unreplicated(c.invalidate(&key()).await));
    assert!(wire.store().get_raw(&value_key).is_none(), "it ran");
    assert!(unreplicated(c.invalidate_tag("t").await));
    assert!(unreplicated(c.clear().await));

    let stats = c.stats();
    assert_eq!(stats.writes_unreplicated, 5, "{stats:?}");
    assert_eq!(stats.backend_errors, 0, "{stats:?}");
    assert_eq!(stats.writes_queued, 0, "{stats:?}");
    assert_eq!(c.pending_writes(), 0);
    assert_eq!(c.circuit_state(), CircuitState::Closed);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(wire.faults().calls(Op::Invalidate), 1, "not replayed");
    assert_eq!(wire.faults().calls(Op::Mark), 2, "not replayed");
}

/// A fill that ran without its replicas' confirmation answers the loaded
/// value, and its lease is over (no release follows it).
#[tokio::test(start_paused = true)]
async fn an_unreplicated_fill_answers_its_value() {
    let wire = switched();
    let c = pod(&wire, |b| b);
    wire.faults().set([Op::Fill], Fault::Unreplicated);
    let loads = Arc::new(AtomicUsize::new(0));
    assert_eq!(fetch_now(&c, "k", &loads).await.value, "k-v1");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        wire.faults().calls(Op::Release),
        0,
        "the fill ended the lease"
    );
    // Stored: read back without a second load.
    assert_eq!(fetch_now(&c, "k", &loads).await.value, "k-v1");
    let stats = c.stats();
    assert_eq!(stats.loads_ok, 1, "{stats:?}");
    assert_eq!(stats.writes_unreplicated, 1, "{stats:?}");
    assert_eq!(stats.backend_errors, 0, "{stats:?}");
}

/// An invalidate queued in an outage, then a `set` of the key that ran
/// unconfirmed: the replay would delete the newer value, so it is retired.
#[tokio::test(start_paused = true)]
async fn an_unreplicated_write_retires_the_queued_write_of_its_key() {
    let wire = switched();
    let c = pod(&wire, |b| b);
    wire.set_mode(REFUSE);
    assert!(c.invalidate(&key()).await.is_err());
    assert_eq!(c.pending_writes(), 1);
    wire.set_mode(HEALTHY);
    wire.faults().set([Op::Set], Fault::Unreplicated);
    assert!(unreplicated(c.set(&key(), "after".into()).await));
    assert_eq!(c.pending_writes(), 0);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(c.get(&key()).await.unwrap().as_deref(), Some("after"));
    assert_eq!(c.stats().writes_replayed, 0);
}

/// The same for a mark: a mark queued in an outage, then the same mark
/// made unconfirmed; the other process judges by it.
#[tokio::test(start_paused = true)]
async fn an_unreplicated_mark_retires_the_queued_one_and_judges() {
    let pods = two_pods(|b| b);
    let ((a_wire, a), (_, b)) = (&pods[0], &pods[1]);
    a.set_tagged("tagged", "t-v1".to_owned(), ["seller:7"])
        .await
        .unwrap();
    a_wire.set_mode(REFUSE);
    assert!(a.invalidate_tag("seller:7").await.is_err());
    assert_eq!(a.pending_writes(), 1);
    a_wire.set_mode(HEALTHY);
    a_wire.faults().set([Op::Mark], Fault::Unreplicated);
    assert!(unreplicated(a.invalidate_tag("seller:7").await));
    assert_eq!(a.pending_writes(), 0);
    // A write right after the mark is not judged by it: the generation
    // the mark was given is read before it.
    a.set_tagged("after", "a-v1".to_owned(), ["seller:7"])
        .await
        .unwrap();
    assert_eq!(a.get("after").await.unwrap().as_deref(), Some("a-v1"));
    assert_eq!(a.get("tagged").await.unwrap(), None);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(b.get("tagged").await.unwrap(), None);
    assert_eq!(a_wire.faults().calls(Op::Mark), 2, "not replayed");
}

/// A replay that runs unconfirmed is done: dropped from the queue, counted
/// as replayed, not sent again.
#[tokio::test(start_paused = true)]
async fn an_unreplicated_replay_is_done() {
    let wire = switched();
    let c = pod(&wire, |b| b);
    wire.set_mode(REFUSE);
    assert!(c.invalidate(&key()).await.is_err());
    wire.set_mode(HEALTHY);
    wire.faults().set([Op::Invalidate], Fault::Unreplicated);
    tokio::time::sleep(REPLAYED).await;
    assert_eq!(c.pending_writes(), 0);
    let stats = c.stats();
    assert_eq!(stats.writes_replayed, 1, "{stats:?}");
    assert_eq!(stats.writes_refused, 0, "{stats:?}");
    assert_eq!(stats.writes_unreplicated, 1, "{stats:?}");
    let tried = wire.faults().calls(Op::Invalidate);
    tokio::time::sleep(REPLAYED * 3).await;
    assert_eq!(wire.faults().calls(Op::Invalidate), tried, "not sent again");
}
