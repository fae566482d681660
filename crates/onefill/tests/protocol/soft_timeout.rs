//! The soft loader timeout: with a stale value, callers wait for
//! the load up to `soft_timeout`, then get the stale value while the load
//! finishes in the background, under the lease (the watchdog extends it),
//! and fills; `max_load_time` stays the hard bound; with no stale value,
//! callers wait as always. Paused time on the embedded backend; each test
//! checks load counts, each caller's outcome, and what is stored after.
//!
//! Longer than most files on purpose: the soft timeout meets every other
//! part of a flight (leases and their watchdog, early refresh, fail-safe,
//! negative caching, the L1, batches), and each meeting has its case here.

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
            c.fetch("k", move |_| async move {
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
    // The JSON payload after the 16-byte envelope header and the 9-byte
    // marks block of an untagged value.
    serde_json::from_slice(&stored.bytes[25..]).ok()
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
        .with_options(&opts)
        .fetch("k", move |_| async move {
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
        .with_options(&opts)
        .fetch("k", |_| async { Ok::<_, std::io::Error>(String::new()) })
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
        .with_options(&cheap)
        .fetch("k", move |_| async move {
            load.loads.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>("b".to_owned())
        })
        .await
        .unwrap();
    assert_eq!((f.outcome, f.value.as_str()), (Outcome::Stale, "v1"));
    assert_eq!(origin.loads(), 2, "no load of B's own");
}

/// The background load after a soft timeout: dropped callers, failures
/// (cached, fail-safe), `no_lease`, the L1, per-call options, writes during
/// it, grace limits, and on a private Redis.
mod background_loads {
    use crate::support::loaders::{fetch_then as fetch, load, ms, stored_bytes, Then};

    use std::io;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use onefill::backend::FillKeys;
    use onefill::{Cache, CallOptions, Error, LeaseTtl, MemoryBackend, Outcome};

    const NS: &str = "soft";

    // ---------------------------------------------------------------------
    // Soft timeout
    // ---------------------------------------------------------------------

    /// TTL 1 s, grace 10 s, soft timeout 100 ms, fixed lease 1 s, no jitter.
    fn soft(backend: &MemoryBackend) -> onefill::CacheBuilder<String, String> {
        Cache::builder()
            .namespace(NS)
            .backend(backend.clone())
            .ttl(ms(1000))
            .grace(ms(10_000))
            .jitter(0.0)
            .lease_ttl(LeaseTtl::Fixed(ms(1000)))
            .soft_timeout(ms(100))
            .no_l1()
    }

    fn payload(bytes: &[u8]) -> String {
        serde_json::from_slice(&bytes[25..]).unwrap_or_else(|_| format!("{:?}", &bytes[..3]))
    }

    async fn lease_held(backend: &MemoryBackend) -> bool {
        onefill::testing::lease_held(backend, &FillKeys::new(NS, "k")).await
    }

    /// Every caller's future is dropped before the soft timeout: the load
    /// still finishes and fills, the lease ends, and the key is not stuck
    /// (the next call hits the new value, with no load of its own).
    #[tokio::test(start_paused = true)]
    async fn dropped_callers_during_a_soft_timeout_load() {
        let backend = MemoryBackend::new();
        let c = soft(&backend).build().unwrap();
        let loads = Arc::new(AtomicUsize::new(0));
        fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        tokio::time::advance(ms(1500)).await; // stale, in grace
        let callers: Vec<_> = (0..3)
            .map(|_| {
                let (c, loads) = (c.clone(), loads.clone());
                tokio::spawn(async move { fetch(&c, &loads, ms(500), Then::Value).await })
            })
            .collect();
        tokio::time::sleep(ms(50)).await;
        for t in &callers {
            t.abort();
        }
        tokio::time::sleep(ms(100)).await; // past the soft timeout, nobody listening
        assert!(lease_held(&backend).await, "the load still holds its lease");
        tokio::time::sleep(ms(500)).await;
        assert_eq!(payload(&stored_bytes(&backend, NS).await.unwrap()), "v2");
        assert!(!lease_held(&backend).await, "the fill ended the lease");
        let after = fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        assert_eq!((after.outcome, after.value.as_str()), (Outcome::Hit, "v2"));
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }

    /// The background load fails after the soft timeout, fail-safe off,
    /// negative caching on: the failure is cached (as a background refresh's
    /// would be), the lease released; later callers get the cached failure.
    #[tokio::test(start_paused = true)]
    async fn a_background_failure_after_the_soft_timeout_is_cached() {
        for then in [Then::Fail, Then::Panic] {
            let backend = MemoryBackend::new();
            let c = soft(&backend)
                .fail_safe(false)
                .negative_ttl(ms(2000))
                .build()
                .unwrap();
            let loads = Arc::new(AtomicUsize::new(0));
            fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
            tokio::time::advance(ms(1500)).await;
            let first = fetch(&c, &loads, ms(500), then).await.unwrap();
            assert_eq!(
                (first.outcome, first.value.as_str()),
                (Outcome::Stale, "v1")
            );
            tokio::time::sleep(ms(600)).await;
            assert!(!lease_held(&backend).await);
            let err = fetch(&c, &loads, ms(0), Then::Value).await.unwrap_err();
            assert!(matches!(err, Error::CachedFailure(_)), "{err:?}");
            assert_eq!(loads.load(Ordering::SeqCst), 2);
        }
    }

    /// The background load fails after the soft timeout with fail-safe on:
    /// the stale value is re-stored fresh for the throttle, the lease freed,
    /// the next call a hit on the stale value (no load).
    #[tokio::test(start_paused = true)]
    async fn a_background_failure_after_the_soft_timeout_is_fail_safe() {
        for then in [Then::Fail, Then::Panic] {
            let backend = MemoryBackend::new();
            let c = soft(&backend).build().unwrap();
            let loads = Arc::new(AtomicUsize::new(0));
            fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
            tokio::time::advance(ms(1500)).await;
            let first = fetch(&c, &loads, ms(500), then).await.unwrap();
            assert_eq!(first.outcome, Outcome::Stale);
            tokio::time::sleep(ms(600)).await;
            assert!(!lease_held(&backend).await);
            let next = fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
            assert_eq!((next.outcome, next.value.as_str()), (Outcome::Hit, "v1"));
            assert_eq!(loads.load(Ordering::SeqCst), 2);
        }
    }

    /// A stale value in grace, fail-safe off, an origin that fails fast
    /// (before the soft timeout). Without a soft timeout the caller gets the
    /// stale value (the grace window's promise); with one, the README says
    /// the stale value is what callers get when the load is slow, and says
    /// nothing about turning a grace-window read into an error.
    #[tokio::test(start_paused = true)]
    async fn a_fast_failure_with_a_stale_value_still_answers_stale() {
        for soft_timeout in [None, Some(ms(100))] {
            let backend = MemoryBackend::new();
            let mut b = soft(&backend).fail_safe(false);
            if soft_timeout.is_none() {
                b = b.no_soft_timeout();
            }
            let c = b.build().unwrap();
            let loads = Arc::new(AtomicUsize::new(0));
            fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
            tokio::time::advance(ms(1500)).await;
            let r = fetch(&c, &loads, ms(10), Then::Fail).await;
            let r = r.map(|f| (f.outcome, f.value));
            assert_eq!(
                r.as_ref().ok(),
                Some(&(Outcome::Stale, "v1".to_owned())),
                "soft timeout {soft_timeout:?}: {r:?}"
            );
        }
    }

    /// `soft_timeout` at or over `max_load_time` could never fire (a slow
    /// origin would give `LoadTimedOut` where a stale value was there to
    /// serve), so it is refused, not capped: by the builder, naming both
    /// options, and per call as invalid input before anything runs (no load,
    /// nothing stored, no lease taken). Just under the bound is accepted.
    #[tokio::test(start_paused = true)]
    async fn soft_timeout_at_or_over_max_load_time_is_refused() {
        let backend = MemoryBackend::new();
        for soft_ms in [2000, 5000] {
            let built = soft(&backend)
                .fail_safe(false)
                .soft_timeout(ms(soft_ms))
                .max_load_time(ms(2000))
                .build();
            let Err(refused) = built else {
                panic!("soft_timeout {soft_ms} ms with max_load_time 2000 ms was accepted");
            };
            let text = refused.to_string();
            assert!(
                text.contains("soft_timeout") && text.contains("max_load_time"),
                "{text}"
            );
        }
        assert!(soft(&backend)
            .soft_timeout(ms(1999))
            .max_load_time(ms(2000))
            .build()
            .is_ok());
        // Per call too.
        let c = soft(&backend).build().unwrap();
        let loads = Arc::new(AtomicUsize::new(0));
        for soft_ms in [2000, 5000] {
            let options = CallOptions::new()
                .soft_timeout(ms(soft_ms))
                .max_load_time(ms(2000));
            let counted = loads.clone();
            let err = c
                .with_options(&options)
                .fetch("k", move |k| async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, io::Error>(k)
                })
                .await
                .unwrap_err();
            assert!(err.is_invalid_input(), "{err:?}");
            assert!(err.to_string().contains("soft_timeout"), "{err}");
        }
        assert_eq!(loads.load(Ordering::SeqCst), 0, "refused before loading");
        assert!(stored_bytes(&backend, NS).await.is_none(), "nothing stored");
        assert!(!lease_held(&backend).await, "no lease taken");
    }

    /// Soft timeout with `no_lease`: the background load still fills under
    /// the lease it took on the way; another no-lease caller meanwhile gets
    /// stale at once, no second load.
    #[tokio::test(start_paused = true)]
    async fn soft_timeout_with_no_lease_fills_in_the_background() {
        let backend = MemoryBackend::new();
        let c = soft(&backend).no_lease().build().unwrap();
        let loads = Arc::new(AtomicUsize::new(0));
        fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        tokio::time::advance(ms(1500)).await;
        let first = fetch(&c, &loads, ms(500), Then::Value).await.unwrap();
        assert_eq!(
            (first.outcome, first.value.as_str()),
            (Outcome::Stale, "v1")
        );
        let during = fetch(&c, &loads, ms(500), Then::Value).await.unwrap();
        assert_eq!(
            (during.outcome, during.value.as_str()),
            (Outcome::Stale, "v1")
        );
        tokio::time::sleep(ms(600)).await;
        assert_eq!(payload(&stored_bytes(&backend, NS).await.unwrap()), "v2");
        assert!(!lease_held(&backend).await);
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }

    /// Soft timeout with the L1: after the background fill, the L1 answers
    /// the new value, never the stale one it held.
    #[tokio::test(start_paused = true)]
    async fn soft_timeout_with_l1_serves_the_new_value_after_the_fill() {
        let backend = MemoryBackend::new();
        let c = soft(&backend).l1(onefill::L1::new(1000)).build().unwrap();
        let loads = Arc::new(AtomicUsize::new(0));
        fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        tokio::time::advance(ms(1500)).await;
        let first = fetch(&c, &loads, ms(500), Then::Value).await.unwrap();
        assert_eq!(first.outcome, Outcome::Stale);
        tokio::time::sleep(ms(600)).await;
        for _ in 0..3 {
            let f = fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
            assert_eq!((f.outcome, f.value.as_str()), (Outcome::Hit, "v2"));
        }
        assert_eq!(c.get("k").await.unwrap().as_deref(), Some("v2"));
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }

    /// Soft timeout per call on a cache without one, and `no_soft_timeout`
    /// per call on a cache with one.
    #[tokio::test(start_paused = true)]
    async fn soft_timeout_per_call() {
        let backend = MemoryBackend::new();
        let c = soft(&backend).no_soft_timeout().build().unwrap();
        let loads = Arc::new(AtomicUsize::new(0));
        fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        tokio::time::advance(ms(1500)).await;
        let opts = CallOptions::new().soft_timeout(ms(100));
        let f = c
            .with_options(&opts)
            .fetch("k", load(&loads, ms(50), Then::Value))
            .await
            .unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Loaded, "v2"));
    }

    /// `invalidate` in the same process while the soft timeout's background
    /// load runs: the load's value is neither stored nor served from the L1.
    #[tokio::test(start_paused = true)]
    async fn invalidate_during_the_background_load_with_l1() {
        let backend = MemoryBackend::new();
        let c = soft(&backend).l1(onefill::L1::new(100)).build().unwrap();
        let loads = Arc::new(AtomicUsize::new(0));
        fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        tokio::time::advance(ms(1500)).await;
        let first = fetch(&c, &loads, ms(500), Then::Value).await.unwrap();
        assert_eq!(first.outcome, Outcome::Stale);
        c.invalidate("k").await.unwrap();
        tokio::time::sleep(ms(600)).await;
        assert!(stored_bytes(&backend, NS).await.is_none(), "fenced out");
        assert!(!lease_held(&backend).await);
        assert_eq!(c.get("k").await.unwrap(), None, "not from the L1");
        let f = fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Loaded, "v3"));
    }

    /// The soft timeout on a private Redis: a background load three times
    /// longer than its lease TTL keeps the lease (the watchdog), another
    /// process gets stale with no load of its own, the fill lands, the lease
    /// key is gone.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn on_redis_the_background_load_keeps_its_lease_and_fills() {
        // Seconds of work on a private server; past this it hangs.
        let _limit = onefill_testkit::time_limit(std::time::Duration::from_secs(60));
        use onefill::redis::RedisBackend;
        use onefill_testkit::RedisServer;

        let server = RedisServer::start();
        let mk = || async {
            Cache::<String, String>::builder()
                .namespace(NS)
                .backend(RedisBackend::connect(&server.url()).await.unwrap())
                .ttl(ms(1000))
                .grace(ms(30_000))
                .jitter(0.0)
                .lease_ttl(LeaseTtl::Fixed(ms(300)))
                .soft_timeout(ms(100))
                .build()
                .unwrap()
        };
        let (a, b) = (mk().await, mk().await);
        let loads = Arc::new(AtomicUsize::new(0));
        fetch(&a, &loads, ms(0), Then::Value).await.unwrap();
        tokio::time::sleep(ms(1100)).await; // stale
        let first = fetch(&a, &loads, ms(1000), Then::Value).await.unwrap();
        assert_eq!(
            (first.outcome, first.value.as_str()),
            (Outcome::Stale, "v1")
        );
        let keys = FillKeys::new(NS, "k");
        for _ in 0..3 {
            tokio::time::sleep(ms(250)).await;
            let other = fetch(&b, &loads, ms(0), Then::Value).await.unwrap();
            assert_eq!(
                (other.outcome, other.value.as_str()),
                (Outcome::Stale, "v1")
            );
            assert_eq!(server.query(&["EXISTS", keys.lock()]).as_int(), Some(1));
        }
        tokio::time::sleep(ms(400)).await; // filled at ~1 s, fresh for 1 s
        assert_eq!(server.query(&["EXISTS", keys.lock()]).as_int(), Some(0));
        let after = fetch(&b, &loads, ms(0), Then::Value).await.unwrap();
        assert_eq!((after.outcome, after.value.as_str()), (Outcome::Hit, "v2"));
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }

    /// Counters: a stale-in-grace read answered stale counts one
    /// `stale_served` and no miss without a soft timeout; with one, the same
    /// flight (answered stale at the soft timeout) counts a miss *and* a stale
    /// answer, so `misses` (documented as "found no usable value") rises with
    /// every stale read and a hit ratio over flights counts it twice.
    #[tokio::test(start_paused = true)]
    async fn a_stale_read_is_not_a_miss_with_a_soft_timeout() {
        for soft_timeout in [false, true] {
            let backend = MemoryBackend::new();
            let mut b = soft(&backend);
            if !soft_timeout {
                b = b.no_soft_timeout();
            }
            let c = b.build().unwrap();
            let loads = Arc::new(AtomicUsize::new(0));
            fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
            tokio::time::advance(ms(1500)).await;
            let before = c.stats();
            let f = fetch(&c, &loads, ms(500), Then::Value).await.unwrap();
            assert_eq!(f.outcome, Outcome::Stale);
            let after = c.stats();
            assert_eq!(
                (
                    after.stale_served - before.stale_served,
                    after.misses - before.misses
                ),
                (1, 0),
                "soft timeout {soft_timeout}"
            );
        }
    }

    /// A stale value with 50 ms of grace left, a soft timeout of 100 ms and
    /// a slow load: at the soft timeout the value has expired on the server
    /// (past `ttl + grace`), yet callers get it; fail-safe, in the same spot,
    /// refuses a stale value that expired during the load
    /// (`value_still_lives`).
    #[tokio::test(start_paused = true)]
    async fn the_soft_timeout_does_not_serve_a_value_past_its_grace() {
        let backend = MemoryBackend::new();
        let c = soft(&backend).build().unwrap();
        let loads = Arc::new(AtomicUsize::new(0));
        fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        tokio::time::advance(ms(10_950)).await; // 50 ms of grace left
        let f = fetch(&c, &loads, ms(500), Then::Value).await.unwrap();
        assert_ne!(
            (f.outcome, f.value.as_str()),
            (Outcome::Stale, "v1"),
            "served 50 ms past its hard TTL"
        );
    }

    /// On a private Redis: the soft timeout's background load fails after the
    /// answer; fail-safe re-stores the stale value for the throttle (the
    /// release-with-entry script), the lease key is gone, the next call is a
    /// hit on the stale value with no load.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn on_redis_a_background_failure_is_fail_safe() {
        // Seconds of work on a private server; past this it hangs.
        let _limit = onefill_testkit::time_limit(std::time::Duration::from_secs(60));
        use onefill::redis::RedisBackend;
        use onefill_testkit::RedisServer;

        let server = RedisServer::start();
        let c = Cache::<String, String>::builder()
            .namespace(NS)
            .backend(RedisBackend::connect(&server.url()).await.unwrap())
            .ttl(ms(500))
            .grace(ms(30_000))
            .jitter(0.0)
            .lease_ttl(LeaseTtl::Fixed(ms(300)))
            .soft_timeout(ms(100))
            .fail_safe_throttle(ms(5000))
            .build()
            .unwrap();
        let loads = Arc::new(AtomicUsize::new(0));
        fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        tokio::time::sleep(ms(600)).await; // stale
        let first = fetch(&c, &loads, ms(700), Then::Fail).await.unwrap();
        assert_eq!(
            (first.outcome, first.value.as_str()),
            (Outcome::Stale, "v1")
        );
        let keys = FillKeys::new(NS, "k");
        tokio::time::sleep(ms(900)).await; // failed at ~0.7 s, re-stored
        assert_eq!(server.query(&["EXISTS", keys.lock()]).as_int(), Some(0));
        let pttl = server.query(&["PTTL", keys.value()]).as_int().unwrap();
        assert!(pttl > 30_000, "throttle + grace: {pttl}");
        let next = fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        assert_eq!((next.outcome, next.value.as_str()), (Outcome::Hit, "v1"));
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }

    /// Each failure rule: a load failing before the soft
    /// timeout answers the stale value (counted once as a stale answer, not a
    /// miss) and stores what a failed background refresh stores: fail-safe
    /// re-stores the stale value (the next call a hit on it), negative caching
    /// the failure (the next call gets it), neither nothing (the next call
    /// loads again).
    #[tokio::test(start_paused = true)]
    async fn a_fast_failure_stores_what_a_failed_refresh_stores() {
        for rule in ["fail-safe", "negative", "neither"] {
            let backend = MemoryBackend::new();
            let mut b = soft(&backend);
            if rule != "fail-safe" {
                b = b.fail_safe(false);
            }
            if rule == "negative" {
                b = b.negative_ttl(ms(2000));
            }
            let c = b.build().unwrap();
            let loads = Arc::new(AtomicUsize::new(0));
            fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
            tokio::time::advance(ms(1500)).await;
            let before = c.stats();
            let f = fetch(&c, &loads, ms(10), Then::Fail).await.unwrap();
            assert_eq!(
                (f.outcome, f.value.as_str()),
                (Outcome::Stale, "v1"),
                "{rule}"
            );
            let after = c.stats();
            assert_eq!(
                (
                    after.stale_served - before.stale_served,
                    after.misses - before.misses
                ),
                (1, 0),
                "{rule}"
            );
            assert!(!lease_held(&backend).await, "{rule}");
            let next = fetch(&c, &loads, ms(0), Then::Value).await;
            match rule {
                "fail-safe" => {
                    let next = next.unwrap();
                    assert_eq!((next.outcome, next.value.as_str()), (Outcome::Hit, "v1"));
                    assert_eq!(loads.load(Ordering::SeqCst), 2);
                }
                "negative" => {
                    let err = next.unwrap_err();
                    assert!(matches!(err, Error::CachedFailure(_)), "{err:?}");
                    assert_eq!(loads.load(Ordering::SeqCst), 2);
                }
                _ => {
                    // The stale value is still there (in grace): the soft
                    // timeout loads again, and this load succeeds.
                    let next = next.unwrap();
                    assert_eq!((next.outcome, next.value.as_str()), (Outcome::Loaded, "v3"));
                    assert_eq!(loads.load(Ordering::SeqCst), 3);
                }
            }
        }
    }

    /// With a failing load: the stale value expired during
    /// the wait, so it is neither served at the soft timeout nor by fail-safe
    /// after the failure; the caller gets the loader's error and no lease is
    /// left.
    #[tokio::test(start_paused = true)]
    async fn a_value_expired_during_the_soft_wait_is_not_served_on_failure() {
        let backend = MemoryBackend::new();
        let c = soft(&backend).build().unwrap();
        let loads = Arc::new(AtomicUsize::new(0));
        fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        tokio::time::advance(ms(10_950)).await; // 50 ms of grace left
        let err = fetch(&c, &loads, ms(500), Then::Fail).await.unwrap_err();
        assert!(matches!(err, Error::Loader(_)), "{err:?}");
        assert!(!lease_held(&backend).await);
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }
}
