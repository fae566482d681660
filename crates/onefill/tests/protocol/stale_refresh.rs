//! Stale while one refresh runs: a process whose refresh found another
//! process's lease asks for it again at most once a second while it
//! serves the stale value, not at every stale read. Two "processes" on one
//! embedded store, the reader's calls counted behind a pass-through
//! injector; paused time.

use std::time::Duration;

use onefill::testing::{FaultyBackend, Op, Origin};
use onefill::{Cache, LeaseTtl, MemoryBackend, Outcome};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// TTL 1 s, grace 10 s, no jitter nor early refresh, a 5 s lease.
fn process(backend: impl onefill::backend::Backend) -> Cache<String, String> {
    process_with_grace(backend, ms(10_000))
}

fn process_with_grace(
    backend: impl onefill::backend::Backend,
    grace: Duration,
) -> Cache<String, String> {
    Cache::builder()
        .namespace("stale-refresh")
        .backend(backend)
        .ttl(ms(1000))
        .grace(grace)
        .jitter(0.0)
        .early_refresh_beta(0.0)
        .lease_ttl(LeaseTtl::Fixed(ms(5000)))
        .no_l1()
        .build()
        .unwrap()
}

/// `holder` loads `k`; 100 ms after it went stale, `holder` refreshes it
/// (a 3 s load), then `reader` reads it stale and its refresh finds the
/// holder's lease: paused.
async fn refresh_held_elsewhere(
    holder: &Cache<String, String>,
    reader: &Cache<String, String>,
    origin: &Origin,
) {
    holder.fetch("k", origin.loader(ms(10))).await.unwrap();
    tokio::time::sleep(ms(1100)).await;
    let stale = holder.fetch("k", origin.loader(ms(3000))).await.unwrap();
    assert_eq!(stale.outcome, Outcome::Stale);
    tokio::time::sleep(ms(1)).await;
    let got = reader.fetch("k", origin.loader(ms(10))).await.unwrap();
    assert_eq!(got.outcome, Outcome::Stale);
    tokio::time::sleep(ms(1)).await;
    assert_eq!(origin.count(), 2);
}

/// A hot key read 100 times a second by a process while another one's
/// 3 s refresh runs: every read answered stale at once, the lease asked
/// for once a second (the first read, then one per pause), one load.
#[tokio::test(start_paused = true)]
async fn a_refresh_held_elsewhere_is_asked_for_once_a_second_not_at_every_read() {
    let store = MemoryBackend::new();
    let holder = process(store.clone());
    let counted = FaultyBackend::new(store.clone());
    let faults = counted.faults().clone();
    let reader = process(counted);
    let origin = Origin::default();
    let first = holder.fetch("k", origin.loader(ms(10))).await.unwrap();
    assert_eq!(first.outcome, Outcome::Loaded);
    tokio::time::sleep(ms(1100)).await;
    // The holder reads it stale and refreshes it, slowly.
    let stale = holder.fetch("k", origin.loader(ms(3000))).await.unwrap();
    assert_eq!(stale.outcome, Outcome::Stale);
    tokio::task::yield_now().await;
    faults.reset_calls();
    for _ in 0..250 {
        let got = reader.fetch("k", origin.loader(ms(10))).await.unwrap();
        assert_eq!((got.outcome, got.value.as_str()), (Outcome::Stale, "k-v1"));
        tokio::time::sleep(ms(10)).await;
    }
    // 2.5 s of reads: the first stale read's request, then one after each
    // second's pause.
    assert_eq!(faults.calls(Op::Acquire), 3, "lease requests");
    assert_eq!(faults.calls(Op::Get), 250);
    tokio::time::sleep(ms(1000)).await;
    let fresh = reader.fetch("k", origin.loader(ms(10))).await.unwrap();
    assert_eq!(
        (fresh.outcome, fresh.value.as_str()),
        (Outcome::Hit, "k-v2")
    );
    assert_eq!(origin.count(), 2, "one refresh");
}

/// The pause ends with the holder's lease when that comes first: a holder
/// that died with a short lease is replaced as soon as it lapses.
#[tokio::test(start_paused = true)]
async fn a_refresh_held_elsewhere_is_retried_when_the_holder_s_lease_lapses() {
    let store = MemoryBackend::new();
    let writer = process(store.clone());
    let reader = process(store.clone());
    let origin = Origin::default();
    writer.fetch("k", origin.loader(ms(10))).await.unwrap();
    tokio::time::sleep(ms(1100)).await;
    // A holder that took the lease for 300 ms and died.
    let keys = onefill::backend::FillKeys::new("stale-refresh", "k");
    let token = onefill::backend::LeaseToken::random();
    onefill::backend::Backend::acquire(&store, &keys, &token, ms(300), Duration::ZERO)
        .await
        .unwrap();
    let got = reader.fetch("k", origin.loader(ms(10))).await.unwrap();
    assert_eq!(got.outcome, Outcome::Stale);
    // Read again past the dead holder's lease (and the pause it set): the
    // reader's refresh takes the lease and loads.
    tokio::time::sleep(ms(350)).await;
    let got = reader.fetch("k", origin.loader(ms(10))).await.unwrap();
    assert_eq!(got.outcome, Outcome::Stale);
    tokio::time::sleep(ms(50)).await;
    assert_eq!(origin.count(), 2, "refreshed once the lease lapsed");
}

/// An `expire` made here ends this process's pause: it removed the
/// holder's lease (that load will not be stored), so nobody refreshes the
/// value it left stale unless this process does; its next stale read
/// refreshes at once, as without the pause. The pause that ended leaves
/// the new refresh's mark alone.
#[tokio::test(start_paused = true)]
async fn an_expire_made_here_ends_the_pause_of_a_refresh_held_elsewhere() {
    let store = MemoryBackend::new();
    let holder = process(store.clone());
    let counted = FaultyBackend::new(store.clone());
    let faults = counted.faults().clone();
    let reader = process(counted);
    let origin = Origin::default();
    refresh_held_elsewhere(&holder, &reader, &origin).await;
    // The origin changed: the reader expires the key.
    reader.expire("k").await.unwrap();
    let got = reader.fetch("k", origin.loader(ms(1500))).await.unwrap();
    assert_eq!((got.outcome, got.value.as_str()), (Outcome::Stale, "k-v1"));
    tokio::time::sleep(ms(50)).await;
    assert_eq!(origin.count(), 3, "the reader refreshed at once");
    // Past the end of the pause, the reader's refresh still runs: its
    // stale reads ask for no lease.
    tokio::time::sleep(ms(1000)).await;
    faults.reset_calls();
    let got = reader.fetch("k", origin.loader(ms(10))).await.unwrap();
    assert_eq!(got.outcome, Outcome::Stale);
    tokio::time::sleep(ms(1)).await;
    assert_eq!(faults.calls(Op::Acquire), 0, "lease requests");
    tokio::time::sleep(ms(500)).await;
    let got = reader.fetch("k", origin.loader(ms(10))).await.unwrap();
    assert_eq!((got.outcome, got.value.as_str()), (Outcome::Hit, "k-v3"));
    assert_eq!(origin.count(), 3);
}

/// The pause is at most half of what the value has left: with a short
/// grace, a holder whose lease another process's write removed is
/// replaced while the value is still served, and nobody waits for a load.
#[tokio::test(start_paused = true)]
async fn a_pause_ends_within_the_value_s_grace() {
    let store = MemoryBackend::new();
    let short = |store: &MemoryBackend| process_with_grace(store.clone(), ms(400));
    let (holder, reader, writer) = (short(&store), short(&store), short(&store));
    let origin = Origin::default();
    // 300 ms of grace left when the holder's refresh starts.
    refresh_held_elsewhere(&holder, &reader, &origin).await;
    // Another process's write removes the holder's lease (its load will
    // never be stored); the value keeps its expiry.
    writer.expire("k").await.unwrap();
    // 200 ms on (100 ms of grace left), the reader's pause is over: its
    // refresh takes the lease and stores before the value runs out.
    tokio::time::sleep(ms(200)).await;
    let got = reader.fetch("k", origin.loader(ms(10))).await.unwrap();
    assert_eq!((got.outcome, got.value.as_str()), (Outcome::Stale, "k-v1"));
    tokio::time::sleep(ms(150)).await;
    let got = reader.fetch("k", origin.loader(ms(10))).await.unwrap();
    assert_eq!((got.outcome, got.value.as_str()), (Outcome::Hit, "k-v3"));
}
