//! A stale value a flight read is answered only while it still lives on
//! the server: a waiter that read one during its wait does not serve it at
//! the wait deadline, nor when the backend then fails, once the server has
//! dropped it. Memory backend (behind faults for the second), paused
//! time; another client's raw writes stand in for what the simulation's
//! foreign writer does (a value written for less than its grace, so stale
//! at once, that expires during the wait).

use std::time::Duration;

use onefill::backend::{Backend, FillKeys};
use onefill::testing::{Fault, FaultyBackend, Op};
use onefill::{BackendErrorKind, Cache, MemoryBackend, OnWaitTimeout, Outcome, WaitPolicy};

const NS: &str = "stale-lives";

fn cache(backend: impl Backend) -> Cache<String, String> {
    Cache::builder()
        .namespace(NS)
        .backend(backend)
        .ttl(Duration::from_secs(1))
        .grace(Duration::from_secs(60))
        .jitter(0.0)
        .wait(
            WaitPolicy::default()
                .deadline(Duration::from_millis(500))
                .polling(Duration::from_millis(10), Duration::from_millis(10))
                .on_timeout(OnWaitTimeout::StaleOrError),
        )
        .no_l1()
        .build()
        .unwrap()
}

/// Another process's lease runs out at 20 ms, when the waiter re-checks;
/// by then its holder has extended it and another client has written "old"
/// for 30 ms (less than its grace: stale). The waiter reads it at that
/// re-check and waits on; "old" expires at about 40 ms. At the deadline
/// (500 ms) the waiter used to serve it anyway, 460 ms after the server
/// dropped it (the simulation's foreign writer, seeds 25137, 92686 and
/// 96898 of a wide run); now it has no stale value left to serve.
#[tokio::test(start_paused = true)]
async fn a_stale_value_that_expired_during_the_wait_is_not_served_at_the_deadline() {
    let backend = MemoryBackend::new();
    let waiting = cache(backend.clone());
    let keys = FillKeys::new(NS, "k");
    backend.put_raw(keys.lock(), b"another process", Duration::from_millis(20));
    let waiter = {
        let waiting = waiting.clone();
        tokio::spawn(async move {
            let never = |_| std::future::pending::<Result<String, std::io::Error>>();
            waiting.fetch("k", never).await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let scratch = MemoryBackend::new();
    cache(scratch.clone())
        .set("k", "old".to_owned())
        .await
        .unwrap();
    let (bytes, _) = scratch.get_raw(keys.value()).unwrap();
    backend.put_raw(keys.value(), &bytes, Duration::from_millis(30));
    backend.put_raw(keys.lock(), b"another process", Duration::from_secs(30));
    let answer = waiter.await.unwrap();
    assert!(
        answer.is_err(),
        "served a value the server dropped long before: {answer:?}"
    );
    assert_eq!(
        waiting.stats().wait_timeouts,
        1,
        "it waited to the deadline"
    );
}

/// Writes "old" for 30 ms (stale at once) on `backend` at 10 ms, as
/// another client would.
async fn old_written_for_30_ms(backend: &MemoryBackend) {
    tokio::time::sleep(Duration::from_millis(10)).await;
    let scratch = MemoryBackend::new();
    cache(scratch.clone())
        .set("k", "old".to_owned())
        .await
        .unwrap();
    let keys = FillKeys::new(NS, "k");
    let (bytes, _) = scratch.get_raw(keys.value()).unwrap();
    backend.put_raw(keys.value(), &bytes, Duration::from_millis(30));
}

/// As above, but the holder extends its lease only to 100 ms, and the
/// backend fails from then on: the waiter's re-check at 100 ms fails, and
/// it used to serve "old", which the server dropped 60 ms before; now it
/// loads without the lease, as with no stale value.
#[tokio::test(start_paused = true)]
async fn a_stale_value_that_expired_during_the_wait_is_not_served_when_the_backend_fails() {
    let store = MemoryBackend::new();
    let faulty = FaultyBackend::new(store.clone());
    let waiting = cache(faulty.clone());
    let keys = FillKeys::new(NS, "k");
    store.put_raw(keys.lock(), b"another process", Duration::from_millis(20));
    let waiter = {
        let waiting = waiting.clone();
        tokio::spawn(async move {
            let load = |_| async { Ok::<_, std::io::Error>("loaded".to_owned()) };
            waiting.fetch("k", load).await
        })
    };
    old_written_for_30_ms(&store).await;
    store.put_raw(keys.lock(), b"another process", Duration::from_millis(90));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let failed = Fault::Fail(BackendErrorKind::Connection);
    faulty.faults().set([Op::Get, Op::Acquire], failed);
    let answer = waiter.await.unwrap().unwrap();
    assert_eq!(
        (answer.value.as_str(), answer.outcome),
        ("loaded", Outcome::Degraded),
        "served a value the server dropped before"
    );
}
