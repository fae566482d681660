//! How often a waiter re-checks (fewer Redis commands per
//! herd), on the memory backend in paused time, so every interval is
//! exact: a subscribed waiter re-checks at the notification, at the
//! holder's lease expiry and at the slow safety-net poll, never at the
//! 20 ms-doubling backoff; only a waiter without a subscription polls.

use std::time::Duration;

use onefill::backend::{Acquired, Backend, FillKeys};
use onefill::testing::{Fault, FaultyBackend, Op};
use onefill::{Cache, LeaseToken, LeaseTtl, MemoryBackend, Outcome, WaitPolicy};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A process's cache on `backend`, every option at its default except the
/// lease TTL when given.
/// One process's view of a shared [`MemoryBackend`], counting the
/// re-checks it is asked for (`get`, `acquire`); its faults can make
/// subscribing fail or notifications get lost.
type Counted = FaultyBackend<MemoryBackend>;

fn counted() -> Counted {
    FaultyBackend::new(MemoryBackend::new())
}

fn process(backend: &Counted, lease: Option<Duration>) -> Cache<String, String> {
    let mut b = Cache::builder()
        .namespace("pacing")
        .backend(backend.clone());
    if let Some(lease) = lease {
        b = b.lease_ttl(LeaseTtl::Fixed(lease));
    }
    b.build().unwrap()
}

/// The holder: takes the lease at once and loads for `load`.
async fn hold(cache: &Cache<String, String>, load: Duration) -> JoinHandle<Outcome> {
    let c = cache.clone();
    let handle = tokio::spawn(async move {
        c.fetch(&"k".to_string(), move |_k: String| async move {
            tokio::time::sleep(load).await;
            Ok::<_, std::io::Error>("v1".to_string())
        })
        .await
        .unwrap()
        .outcome
    });
    // Let it take the lease before anyone else asks.
    tokio::time::sleep(Duration::from_millis(1)).await;
    handle
}

/// The waiter: asks for the key (its loader must not run) and says how it
/// was answered and after how long.
async fn wait(cache: &Cache<String, String>) -> (Outcome, Duration) {
    let started = Instant::now();
    let fetched = cache
        .fetch(&"k".to_string(), |_k: String| async {
            Ok::<_, std::io::Error>("never".to_string())
        })
        .await
        .unwrap();
    assert_eq!(fetched.value, "v1");
    (fetched.outcome, started.elapsed())
}

/// A subscribed waiter behind an 8 s load whose lease never nears expiry
/// (fixed 60 s) re-checks only at the safety-net poll (3 s ±25 %: two or
/// three times in 8 s) and when notified, and is answered at the fill.
/// The backoff (20 ms doubling to 500 ms) would have polled ~20 times.
#[tokio::test(start_paused = true)]
async fn a_subscribed_waiter_does_not_poll_at_the_backoff() {
    let store = counted();
    let waiter_view = store.peer();
    let holder = process(&store, Some(Duration::from_secs(60)));
    let waiter = process(&waiter_view, Some(Duration::from_secs(60)));
    let load = Duration::from_secs(8);
    let held = hold(&holder, load).await;
    let (outcome, took) = wait(&waiter).await;
    assert_eq!(held.await.unwrap(), Outcome::Loaded);
    assert_eq!(outcome, Outcome::Waited);
    assert!(
        took <= load && took >= load - Duration::from_millis(2),
        "answered at the fill: {took:?}"
    );
    let s = waiter.stats();
    assert_eq!(s.wait_notified, 1, "{s:?}");
    assert!(
        (2..=3).contains(&s.wait_polls),
        "safety-net polls only: {s:?}"
    );
    // The first acquire, the re-check once subscribed, one per poll; the
    // notification is read with a plain get (after the flight's first one).
    assert_eq!(
        waiter_view.faults().calls(Op::Acquire),
        2 + s.wait_polls as usize
    );
    assert_eq!(waiter_view.faults().calls(Op::Get), 2);
}

/// The same wait without a subscription (subscribing failed) polls at the
/// backoff, as before: 20, 40, 80, 160, 320 ms, then every 500 ms (±25 %),
/// and learns of the fill within a poll interval of it.
#[tokio::test(start_paused = true)]
async fn without_a_subscription_a_waiter_polls_at_the_backoff() {
    let store = counted();
    let waiter_view = store.peer();
    waiter_view.faults().set([Op::Subscribe], Fault::Refuse);
    let holder = process(&store, Some(Duration::from_secs(60)));
    let waiter = process(&waiter_view, Some(Duration::from_secs(60)));
    let load = Duration::from_secs(8);
    let held = hold(&holder, load).await;
    let (outcome, took) = wait(&waiter).await;
    assert_eq!(held.await.unwrap(), Outcome::Loaded);
    assert_eq!(outcome, Outcome::Waited);
    assert!(
        took <= load + Duration::from_millis(625),
        "within a poll of the fill: {took:?}"
    );
    let s = waiter.stats();
    assert_eq!(s.wait_notified, 0);
    assert!(s.wait_polls >= 14, "polled at the backoff: {s:?}");
}

/// Behind a live holder with the default adaptive lease (3 s before any
/// load was measured, extended every second), a subscribed waiter
/// re-checks when the lease would expire, finds it extended and waits for
/// the new expiry: a handful of re-checks over a 6 s load, and the answer
/// at the fill.
#[tokio::test(start_paused = true)]
async fn a_subscribed_waiter_follows_the_lease_expiry_of_a_live_holder() {
    let store = counted();
    let waiter_view = store.peer();
    let holder = process(&store, None);
    let waiter = process(&waiter_view, None);
    let load = Duration::from_secs(6);
    let held = hold(&holder, load).await;
    let (outcome, took) = wait(&waiter).await;
    assert_eq!(held.await.unwrap(), Outcome::Loaded);
    assert_eq!(outcome, Outcome::Waited);
    assert!(took <= load, "answered at the fill: {took:?}");
    let s = waiter.stats();
    assert_eq!(s.wait_notified, 1);
    assert!(
        (1..=3).contains(&s.wait_polls),
        "one re-check per lease expiry or safety poll: {s:?}"
    );
    assert_eq!(holder.stats().lease_lost, 0);
}

/// A dead holder (its lease planted, never extended nor filled) is taken
/// over the moment its lease expires, by a subscribed waiter that did not
/// poll meanwhile.
#[tokio::test(start_paused = true)]
async fn a_subscribed_waiter_takes_over_at_the_lease_expiry() {
    let store = counted();
    // Shorter than the earliest safety poll (3 s − 25 %): the expiry
    // re-check always comes first. (It was 2.5 s, and one run in six drew
    // a safety poll before it: a second poll, and a failed test in CI.)
    let lease = Duration::from_millis(2000);
    let dead = LeaseToken::random();
    let keys = FillKeys::new("pacing", "k");
    assert!(matches!(
        store.acquire(&keys, &dead, lease, Duration::ZERO).await,
        Ok(Acquired::Won { .. })
    ));
    let waiter = process(&store, None);
    let started = Instant::now();
    let fetched = waiter
        .fetch(&"k".to_string(), |_k: String| async {
            Ok::<_, std::io::Error>("v1".to_string())
        })
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(fetched.outcome, Outcome::Loaded);
    assert!(
        took >= lease && took <= lease + Duration::from_millis(5),
        "taken over at the expiry: {took:?}"
    );
    let s = waiter.stats();
    assert_eq!(s.wait_polls, 1, "the expiry re-check only: {s:?}");
}

/// A lost notification costs a subscribed waiter at most one safety-net
/// poll (3 s ±25 %), not its deadline.
#[tokio::test(start_paused = true)]
async fn a_lost_notification_is_caught_by_the_safety_poll() {
    let store = counted();
    let waiter_view = store.peer();
    waiter_view.faults().set([Op::Subscribe], Fault::Deaf);
    let holder = process(&store, Some(Duration::from_secs(60)));
    let waiter = process(&waiter_view, Some(Duration::from_secs(60)));
    let held = hold(&holder, Duration::from_millis(500)).await;
    let (outcome, took) = wait(&waiter).await;
    assert_eq!(held.await.unwrap(), Outcome::Loaded);
    assert_eq!(outcome, Outcome::Waited);
    assert!(
        took >= Duration::from_millis(2250) && took <= Duration::from_millis(3750),
        "the first safety poll found the fill: {took:?}"
    );
    let s = waiter.stats();
    assert_eq!((s.wait_polls, s.wait_notified), (1, 0), "{s:?}");
}

/// The safety-net poll is a policy: set shorter, it catches a lost
/// notification sooner.
#[tokio::test(start_paused = true)]
async fn the_safety_poll_is_configurable() {
    let store = counted();
    let waiter_view = store.peer();
    waiter_view.faults().set([Op::Subscribe], Fault::Deaf);
    let holder = process(&store, Some(Duration::from_secs(60)));
    let waiter = Cache::<String, String>::builder()
        .namespace("pacing")
        .backend(waiter_view.clone())
        .lease_ttl(LeaseTtl::Fixed(Duration::from_secs(60)))
        .wait(WaitPolicy::default().safety_poll(Duration::from_millis(400)))
        .build()
        .unwrap();
    let held = hold(&holder, Duration::from_millis(500)).await;
    let (outcome, took) = wait(&waiter).await;
    assert_eq!(held.await.unwrap(), Outcome::Loaded);
    assert_eq!(outcome, Outcome::Waited);
    assert!(
        took <= Duration::from_millis(500 + 500),
        "a poll within 300–500 ms of the fill found it: {took:?}"
    );
}
