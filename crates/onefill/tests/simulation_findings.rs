//! Regression tests for bugs found by the simulation (`tests/simulation/`),
//! each minimized to a small deterministic scenario in paused time.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use onefill::{Cache, CacheBuilder, CallOptions, Error, MemoryBackend, Outcome};
use tokio::task::JoinHandle;

/// A cache (a process) on `backend`, without jitter nor early refresh,
/// adjusted by `f`.
fn pod(
    backend: &MemoryBackend,
    f: impl FnOnce(CacheBuilder<String, String>) -> CacheBuilder<String, String>,
) -> Cache<String, String> {
    f(Cache::builder()
        .namespace("findings")
        .backend(backend.clone())
        .jitter(0.0)
        .early_refresh_beta(0.0))
    .build()
    .unwrap()
}

/// A loader's boxed future.
type Loaded = Pin<Box<dyn Future<Output = Result<String, std::io::Error>> + Send>>;

/// A loader that answers after `took` ms: a value, or an error with that
/// message.
fn slow(took: u64, answer: Result<&'static str, &'static str>) -> impl FnOnce(String) -> Loaded {
    move |_| {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(took)).await;
            answer.map(str::to_owned).map_err(std::io::Error::other)
        })
    }
}

/// `get_or_load` in a task of its own.
fn spawn_get_or_load(
    c: &Cache<String, String>,
    key: &str,
    loader: impl FnOnce(String) -> Loaded + Send + 'static,
) -> JoinHandle<Result<String, Error>> {
    let (c, key) = (c.clone(), key.to_owned());
    tokio::spawn(async move { c.get_or_load(&key, loader).await })
}

/// `invalidate` (and `set`) detach the key's in-process load, so a call
/// that starts after them runs a load of its own. The detach used the user
/// key while loads are coalesced under the backend key, so it did nothing:
/// the new flight won the lease (the invalidation had revoked the old one),
/// joined the load from before the invalidation, and answered, and stored,
/// its value (simulation seed 161).
#[tokio::test(start_paused = true)]
async fn a_call_after_invalidate_never_shares_a_load_from_before_it() {
    let c = pod(&MemoryBackend::new(), |b| b);
    let key = "k".to_string();
    let before = spawn_get_or_load(&c, &key, slow(500, Ok("old")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    c.invalidate(&key).await.unwrap();
    let after = c
        .fetch(&key, &CallOptions::new(), slow(0, Ok("new")))
        .await
        .unwrap();
    assert_eq!(
        (after.value.as_str(), after.outcome),
        ("new", Outcome::Loaded),
        "the call after the invalidation ran its own load"
    );
    assert_eq!(before.await.unwrap().unwrap(), "old");
    assert_eq!(
        c.get(&key).await.unwrap().as_deref(),
        Some("new"),
        "the load from before the invalidation did not overwrite the new value"
    );
}

/// A flight that wins the lease while a load of the key is already under
/// way in its process (a background refresh's) used to share that load, so
/// the process loaded the key once; but that load started before the lease
/// was won, and its value may predate a `set` or `invalidate` made since in
/// another process (which revoked the refresh's lease). It was filled under
/// the new lease all the same: an invalidated value landed after the
/// invalidation (simulation seed 16). Now a flight holding a lease it just
/// won runs a load of its own (`Sharing::Own` in `loader.rs`): the two
/// loads overlap in the process, explained by the revoked lease, and only
/// the new one's value is stored.
#[tokio::test(start_paused = true)]
async fn a_new_lease_is_filled_by_its_own_load_not_one_from_before_an_invalidation() {
    let backend = MemoryBackend::new();
    let stale_while_refresh = |b: CacheBuilder<String, String>| {
        b.ttl(Duration::from_secs(1)).grace(Duration::from_secs(10))
    };
    let (a, b) = (
        pod(&backend, stale_while_refresh),
        pod(&backend, stale_while_refresh),
    );
    let key = "k".to_string();
    a.get_or_load(&key, slow(0, Ok("v1"))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Stale: answered at once; the background refresh loads "before" for 1 s.
    let stale = a
        .fetch(&key, &CallOptions::new(), slow(1000, Ok("before")))
        .await
        .unwrap();
    assert_eq!(stale.outcome, Outcome::Stale);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Another process invalidates: the value and the refresh's lease go.
    b.invalidate(&key).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A miss in the first process wins a new lease and runs its own load,
    // though the refresh's (from before the invalidation) is under way.
    let fresh = a
        .fetch(&key, &CallOptions::new(), slow(0, Ok("after")))
        .await
        .unwrap();
    assert_eq!(
        (fresh.value.as_str(), fresh.outcome, fresh.coalesced),
        ("after", Outcome::Loaded, false),
        "the flight under the new lease ran its own load"
    );
    assert_eq!(b.get(&key).await.unwrap().as_deref(), Some("after"));
    // The refresh ends: its fill is fenced out (its lease was revoked).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        b.get(&key).await.unwrap().as_deref(),
        Some("after"),
        "a value loaded before the invalidation was stored after it"
    );
    let stats = a.stats();
    assert_eq!(
        (stats.loads_ok, stats.lease_lost),
        (3, 1),
        "v1, before and after loaded; the refresh's fill found its lease lost"
    );
}

/// A lease lost under a load that then fails is counted too: the holder
/// learns it when its release answers that the lease is not its own any
/// more, and another process may have loaded meanwhile (a duplicate load).
/// Only a fill or a renewal answering so was counted (simulation seed 72).
#[tokio::test(start_paused = true)]
async fn a_lease_lost_under_a_failing_load_is_counted() {
    let backend = MemoryBackend::new();
    let (a, b) = (pod(&backend, |b| b), pod(&backend, |b| b));
    let key = "k".to_string();
    let failing = spawn_get_or_load(&a, &key, slow(300, Err("db down")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Another process revokes the lease mid-load (before any renewal).
    b.invalidate(&key).await.unwrap();
    assert!(failing.await.unwrap().is_err());
    assert_eq!(a.stats().lease_lost, 1, "the lost lease was counted");
}
