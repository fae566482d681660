//! The soft loader timeout (issue 10): with a stale value, callers wait for
//! the load up to `soft_timeout`, then get the stale value while the load
//! finishes in the background, under the lease (the watchdog extends it),
//! and fills; `max_load_time` stays the hard bound; with no stale value,
//! callers wait as always. Paused time on the embedded backend; each test
//! checks load counts, each caller's outcome, and what is stored after.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::{Backend, FillKeys};
use onefill::{Cache, CallOptions, Error, Fetched, LeaseTtl, MemoryBackend, Outcome};

const NS: &str = "soft";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A "process": its own cache on the shared store. TTL 1 s, grace 10 s,
/// soft timeout 100 ms, no jitter.
fn process(backend: &MemoryBackend, l1: bool) -> Cache<String, String> {
    let builder = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .ttl(ms(1000))
        .grace(ms(10_000))
        .jitter(0.0)
        .lease_ttl(LeaseTtl::Fixed(ms(1000)))
        .soft_timeout(ms(100));
    if l1 {
        builder.build().unwrap()
    } else {
        builder.no_l1().build().unwrap()
    }
}

/// The `n`th load takes `took[n - 1]` (the last entry for later ones) and
/// gives `v{n}`.
#[derive(Clone)]
struct Origin {
    loads: Arc<AtomicUsize>,
    took: Arc<Vec<Duration>>,
}

impl Origin {
    fn new(took: &[u64]) -> Self {
        Origin {
            loads: Arc::new(AtomicUsize::new(0)),
            took: Arc::new(took.iter().map(|&t| ms(t)).collect()),
        }
    }
    fn loads(&self) -> usize {
        self.loads.load(Ordering::SeqCst)
    }
    fn fetch(
        &self,
        c: &Cache<String, String>,
    ) -> impl std::future::Future<Output = Result<Fetched<String>, Error>> + Send + 'static {
        let (c, origin) = (c.clone(), self.clone());
        async move {
            c.fetch("k", &CallOptions::new(), move |_| async move {
                let n = origin.loads.fetch_add(1, Ordering::SeqCst) + 1;
                let took = origin.took.get(n - 1).or(origin.took.last()).copied();
                tokio::time::sleep(took.unwrap_or_default()).await;
                Ok::<_, std::io::Error>(format!("v{n}"))
            })
            .await
        }
    }
}

async fn stored(backend: &MemoryBackend) -> Option<String> {
    let stored = backend.get(&FillKeys::new(NS, "k")).await.unwrap()?;
    // The JSON payload after the 16-byte envelope header.
    serde_json::from_slice(&stored.bytes[16..]).ok()
}

/// A slow refresh: three callers get the stale value at the soft timeout,
/// the load goes on and fills; the next call hits the new value. One load.
#[tokio::test(start_paused = true)]
async fn a_slow_load_answers_stale_at_the_soft_timeout_and_fills_after() {
    for l1 in [false, true] {
        let backend = MemoryBackend::new();
        let c = process(&backend, l1);
        let origin = Origin::new(&[0, 500]);
        assert_eq!(origin.fetch(&c).await.unwrap().outcome, Outcome::Loaded);
        tokio::time::advance(ms(1500)).await; // stale, in grace

        let callers: Vec<_> = (0..3).map(|_| tokio::spawn(origin.fetch(&c))).collect();
        tokio::time::sleep(ms(150)).await; // past the soft timeout
        for t in callers {
            assert!(t.is_finished(), "answered at the soft timeout (l1 {l1})");
            let f = t.await.unwrap().unwrap();
            assert_eq!(
                (f.outcome, f.value.as_str()),
                (Outcome::Stale, "v1"),
                "l1 {l1}"
            );
        }
        assert_eq!(origin.loads(), 2);
        assert_eq!(
            stored(&backend).await.as_deref(),
            Some("v1"),
            "not filled yet"
        );
        // A call meanwhile finds the lease held: stale at once, no load.
        let during = origin.fetch(&c).await.unwrap();
        assert_eq!(
            (during.outcome, during.value.as_str()),
            (Outcome::Stale, "v1")
        );

        tokio::time::sleep(ms(400)).await; // the load ends and fills
        assert_eq!(stored(&backend).await.as_deref(), Some("v2"), "l1 {l1}");
        let after = origin.fetch(&c).await.unwrap();
        assert_eq!(
            (after.outcome, after.value.as_str()),
            (Outcome::Hit, "v2"),
            "l1 {l1}"
        );
        assert_eq!(origin.loads(), 2, "l1 {l1}");
    }
}

/// A load within the soft timeout: the callers get the new value
/// (`Loaded`), not the stale one, as a stale read without a soft timeout
/// would give.
#[tokio::test(start_paused = true)]
async fn a_fast_load_answers_fresh() {
    let backend = MemoryBackend::new();
    let c = process(&backend, true);
    let origin = Origin::new(&[0, 50]);
    origin.fetch(&c).await.unwrap();
    tokio::time::advance(ms(1500)).await;
    let callers: Vec<_> = (0..3).map(|_| tokio::spawn(origin.fetch(&c))).collect();
    for t in callers {
        let f = t.await.unwrap().unwrap();
        assert_eq!(f.value, "v2");
        assert!(matches!(f.outcome, Outcome::Loaded), "{:?}", f.outcome);
    }
    assert_eq!(origin.loads(), 2);
    assert_eq!(stored(&backend).await.as_deref(), Some("v2"));
}

/// No stale value: callers wait for the whole load.
#[tokio::test(start_paused = true)]
async fn with_no_stale_value_callers_wait() {
    let backend = MemoryBackend::new();
    let c = process(&backend, true);
    let origin = Origin::new(&[500]);
    let callers: Vec<_> = (0..3).map(|_| tokio::spawn(origin.fetch(&c))).collect();
    tokio::time::sleep(ms(150)).await;
    assert!(callers.iter().all(|t| !t.is_finished()), "still waiting");
    for t in callers {
        let f = t.await.unwrap().unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Loaded, "v1"));
    }
    assert_eq!(origin.loads(), 1);
}

/// A load longer than the lease TTL (1 s) after the soft timeout: the
/// watchdog keeps the lease, so another process finds it held (stale, no
/// second load) until the fill lands.
#[tokio::test(start_paused = true)]
async fn the_background_load_keeps_its_lease() {
    let backend = MemoryBackend::new();
    let (a, b) = (process(&backend, false), process(&backend, false));
    let origin = Origin::new(&[0, 3000]);
    origin.fetch(&a).await.unwrap();
    tokio::time::advance(ms(1500)).await;
    let first = origin.fetch(&a).await.unwrap();
    assert_eq!(
        (first.outcome, first.value.as_str()),
        (Outcome::Stale, "v1")
    );
    for _ in 0..5 {
        tokio::time::sleep(ms(500)).await;
        let other = origin.fetch(&b).await.unwrap();
        assert_eq!(
            (other.outcome, other.value.as_str()),
            (Outcome::Stale, "v1")
        );
    }
    assert_eq!(origin.loads(), 2, "the lease held: no second load");
    tokio::time::sleep(ms(500)).await;
    assert_eq!(stored(&backend).await.as_deref(), Some("v2"));
    let after = origin.fetch(&b).await.unwrap();
    assert_eq!((after.outcome, after.value.as_str()), (Outcome::Hit, "v2"));
}

/// `max_load_time` stays the hard bound: a background load over it is
/// aborted, its lease released; fail-safe keeps the stale value (re-stored
/// fresh for the throttle), and the first call after that loads again.
#[tokio::test(start_paused = true)]
async fn max_load_time_still_bounds_the_background_load() {
    let backend = MemoryBackend::new();
    let c = process(&backend, false);
    let opts_c = c.clone();
    let origin = Origin::new(&[0, 60_000, 0]);
    origin.fetch(&c).await.unwrap();
    tokio::time::advance(ms(1500)).await;
    let opts = CallOptions::new().max_load_time(ms(2000));
    let load_origin = origin.clone();
    let first = opts_c
        .fetch("k", &opts, move |_| async move {
            let n = load_origin.loads.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(ms(60_000)).await;
            Ok::<_, std::io::Error>(format!("v{n}"))
        })
        .await
        .unwrap();
    assert_eq!(
        (first.outcome, first.value.as_str()),
        (Outcome::Stale, "v1")
    );
    tokio::time::sleep(ms(2500)).await; // aborted at 2 s
    let keys = FillKeys::new(NS, "k");
    assert_eq!(
        stored(&backend).await.as_deref(),
        Some("v1"),
        "fail-safe kept it"
    );
    assert!(
        !onefill::testing::lease_held(&backend, &keys).await,
        "released"
    );
    // Re-stored fresh for the fail-safe throttle (5 s): the origin rests.
    let next = origin.fetch(&c).await.unwrap();
    assert_eq!((next.outcome, next.value.as_str()), (Outcome::Hit, "v1"));
    assert_eq!(origin.loads(), 2);
    tokio::time::advance(ms(5000)).await;
    let next = origin.fetch(&c).await.unwrap();
    assert_eq!((next.outcome, next.value.as_str()), (Outcome::Loaded, "v3"));
}

/// Out of range: refused before anything runs.
#[tokio::test(start_paused = true)]
async fn a_zero_soft_timeout_is_refused() {
    let c = process(&MemoryBackend::new(), false);
    let opts = CallOptions::new().soft_timeout(Duration::ZERO);
    let err = c
        .fetch("k", &opts, |_| async {
            Ok::<_, std::io::Error>(String::new())
        })
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert!(Cache::<String, String>::builder()
        .soft_timeout(Duration::ZERO)
        .build()
        .is_err());
}

/// Another process's `set` during the background load fences its fill out:
/// afterwards both processes answer the value set, and the background
/// load's value, which was never stored, is not served from the L1.
#[tokio::test(start_paused = true)]
async fn a_set_during_the_background_load_wins() {
    let backend = MemoryBackend::new();
    let (a, b) = (process(&backend, true), process(&backend, true));
    let origin = Origin::new(&[0, 500]);
    origin.fetch(&a).await.unwrap();
    tokio::time::advance(ms(1500)).await;
    let first = origin.fetch(&a).await.unwrap();
    assert_eq!(
        (first.outcome, first.value.as_str()),
        (Outcome::Stale, "v1")
    );
    b.set("k", "from-b".to_owned()).await.unwrap();
    tokio::time::sleep(ms(600)).await; // the load ends; its fill is fenced out
    assert_eq!(origin.loads(), 2);
    assert_eq!(stored(&backend).await.as_deref(), Some("from-b"));
    for c in [&a, &b] {
        let f = origin.fetch(c).await.unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Hit, "from-b"));
    }
}

/// With `no_lease`, a stale read whose key another process is loading is
/// answered stale at once (that process fills), not with a load of its own.
#[tokio::test(start_paused = true)]
async fn no_lease_serves_stale_while_another_process_loads() {
    let backend = MemoryBackend::new();
    let (a, b) = (process(&backend, false), process(&backend, false));
    let origin = Origin::new(&[0, 500]);
    origin.fetch(&a).await.unwrap();
    tokio::time::advance(ms(1500)).await;
    let first = origin.fetch(&a).await.unwrap(); // A loads in the background
    assert_eq!(first.outcome, Outcome::Stale);
    let cheap = CallOptions::new().no_lease();
    let load = origin.clone();
    let f = b
        .fetch("k", &cheap, move |_| async move {
            load.loads.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>("b".to_owned())
        })
        .await
        .unwrap();
    assert_eq!((f.outcome, f.value.as_str()), (Outcome::Stale, "v1"));
    assert_eq!(origin.loads(), 2, "no load of B's own");
}
