//! Loader-chosen freshness (FusionCache's "adaptive caching"):
//! the loader sets the TTL and grace of what it returns ([`Loaded`]); the
//! value is written, refreshed early and kept in the L1 by that TTL;
//! values out of range are an error with nothing stored; `set` through
//! `with_options` takes the same options. Paused time on the embedded
//! backend, each test with and without the L1. (A little over 600 lines:
//! its edge cases, limits and a damaged freshness byte, sit beside the
//! behaviour they bound.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::{Backend, FillKeys};
use onefill::{Cache, CallOptions, Fetched, Loaded, MemoryBackend, Outcome, MAX_TTL};

const NS: &str = "fresh";

fn cache(backend: &MemoryBackend, l1: bool) -> Cache<String, String> {
    let builder = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .ttl(Duration::from_secs(60))
        .jitter(0.0);
    if l1 {
        builder.build().unwrap()
    } else {
        builder.no_l1().build().unwrap()
    }
}

/// What [`loader`] returns.
type LoadFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Loaded<String>>> + Send>>;

/// A loader that counts its loads, takes `took` and gives its value the
/// freshness `choose` picks.
fn loader(
    loads: &Arc<AtomicUsize>,
    took: Duration,
    choose: fn(Loaded<String>) -> Loaded<String>,
) -> impl FnOnce(String) -> LoadFuture + Send + 'static {
    let loads = loads.clone();
    move |key| {
        Box::pin(async move {
            let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(took).await;
            Ok(choose(Loaded::new(format!("{key}#{n}"))))
        })
    }
}

async fn fetch(
    c: &Cache<String, String>,
    key: &str,
    loads: &Arc<AtomicUsize>,
    choose: fn(Loaded<String>) -> Loaded<String>,
) -> Fetched<String> {
    c.fetch(key, loader(loads, Duration::ZERO, choose))
        .await
        .unwrap()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn draft(l: Loaded<String>) -> Loaded<String> {
    l.ttl(secs(2))
}
fn published(l: Loaded<String>) -> Loaded<String> {
    l.ttl(secs(3600))
}

/// A draft lives 2 s, a published page an hour, in the same cache (TTL
/// 60 s): on the server, and in the L1.
#[tokio::test(start_paused = true)]
async fn the_loader_chooses_each_values_ttl() {
    for l1 in [false, true] {
        let backend = MemoryBackend::new();
        let c = cache(&backend, l1);
        let loads = Arc::new(AtomicUsize::new(0));
        assert_eq!(
            fetch(&c, "draft", &loads, draft).await.outcome,
            Outcome::Loaded
        );
        assert_eq!(
            fetch(&c, "page", &loads, published).await.outcome,
            Outcome::Loaded
        );
        let stored = backend
            .get(&FillKeys::new(NS, "draft"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.ttl, secs(2), "l1 {l1}");
        let stored = backend
            .get(&FillKeys::new(NS, "page"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.ttl, secs(3600), "l1 {l1}");

        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(
            fetch(&c, "draft", &loads, draft).await.outcome,
            Outcome::Hit
        );
        tokio::time::advance(secs(1)).await;
        let again = fetch(&c, "draft", &loads, draft).await;
        assert_eq!(
            (again.outcome, again.value.as_str()),
            (Outcome::Loaded, "draft#3"),
            "l1 {l1}"
        );
        let page = fetch(&c, "page", &loads, published).await;
        assert_eq!(
            (page.outcome, page.value.as_str()),
            (Outcome::Hit, "page#2"),
            "l1 {l1}"
        );
        assert_eq!(loads.load(Ordering::SeqCst), 3, "l1 {l1}");
    }
}

/// A chosen grace: the value is served stale while one refresh runs, though
/// the cache has no grace window.
#[tokio::test(start_paused = true)]
async fn the_loader_chooses_a_grace_window() {
    for l1 in [false, true] {
        let backend = MemoryBackend::new();
        let c = cache(&backend, l1);
        let loads = Arc::new(AtomicUsize::new(0));
        let choose = |l: Loaded<String>| l.ttl(secs(1)).grace(secs(10));
        fetch(&c, "k", &loads, choose).await;
        let stored = backend.get(&FillKeys::new(NS, "k")).await.unwrap().unwrap();
        assert_eq!(stored.ttl, secs(11));
        tokio::time::advance(secs(2)).await;
        let stale = fetch(&c, "k", &loads, choose).await;
        assert_eq!(
            (stale.outcome, stale.value.as_str()),
            (Outcome::Stale, "k#1"),
            "l1 {l1}"
        );
        // The refresh lands in the background.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(loads.load(Ordering::SeqCst), 2, "l1 {l1}");
        let fresh = fetch(&c, "k", &loads, choose).await;
        assert_eq!(
            (fresh.outcome, fresh.value.as_str()),
            (Outcome::Hit, "k#2"),
            "l1 {l1}"
        );
    }
}

/// Early refresh follows the chosen TTL: with beta 100 and a 100 ms load,
/// the window is capped at half the value's own TTL (2 s), not half the
/// cache's (60 s), so the value is not refreshed as soon as it is stored.
#[tokio::test(start_paused = true)]
async fn early_refresh_follows_the_chosen_ttl() {
    for l1 in [false, true] {
        let backend = MemoryBackend::new();
        let c = cache(&backend, l1);
        let loads = Arc::new(AtomicUsize::new(0));
        let opts = CallOptions::new().early_refresh_beta(100.0);
        let call = |c: Cache<String, String>| {
            let load = loader(&loads, Duration::from_millis(100), draft);
            let opts = opts.clone();
            async move { c.with_options(&opts).fetch("k", load).await.unwrap() }
        };
        assert_eq!(call(c.clone()).await.outcome, Outcome::Loaded);
        for _ in 0..5 {
            tokio::time::advance(Duration::from_millis(100)).await;
            assert_eq!(call(c.clone()).await.outcome, Outcome::Hit);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            loads.load(Ordering::SeqCst),
            1,
            "not due in the first half (l1 {l1})"
        );
        // In the last half of its 2 s, it is due: refreshed once, in the
        // background, before it expires.
        tokio::time::advance(Duration::from_millis(900)).await;
        assert_eq!(call(c.clone()).await.outcome, Outcome::Hit);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(loads.load(Ordering::SeqCst), 2, "l1 {l1}");
        assert_eq!(call(c.clone()).await.value, "k#2", "l1 {l1}");
    }
}

/// Out of range: clamped, never an error. A TTL of zero (a row's
/// `expires_at - now` once it passed) answers the value to every coalesced
/// caller, stores it for 1 ms, and the next call loads again; a grace over
/// `MAX_TTL` is `MAX_TTL`.
#[tokio::test(start_paused = true)]
async fn a_choice_out_of_range_is_clamped() {
    fn zero_ttl(l: Loaded<String>) -> Loaded<String> {
        l.ttl(Duration::ZERO)
    }
    fn long_grace(l: Loaded<String>) -> Loaded<String> {
        l.grace(MAX_TTL + secs(1))
    }
    for (choose, gone_after_2_ms) in [
        (zero_ttl as fn(_) -> _, true),
        (long_grace as fn(_) -> _, false),
    ] {
        let backend = MemoryBackend::new();
        let c = cache(&backend, true);
        let loads = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let (c, load) = (c.clone(), loader(&loads, Duration::from_millis(50), choose));
            tasks.push(tokio::spawn(async move { c.fetch("k", load).await }));
        }
        for t in tasks {
            let f = t.await.unwrap().expect("answered");
            assert_eq!(f.value, "k#1");
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        tokio::time::advance(Duration::from_millis(2)).await;
        let keys = FillKeys::new(NS, "k");
        assert_eq!(
            backend.get(&keys).await.unwrap().is_none(),
            gone_after_2_ms,
            "stored for 1 ms (TTL 0) or kept (grace clamped)"
        );
    }
}

/// An absence's chosen TTL is how long it is cached.
#[tokio::test(start_paused = true)]
async fn an_absence_takes_its_chosen_ttl() {
    let backend = MemoryBackend::new();
    let c = cache(&backend, true);
    let loads = Arc::new(AtomicUsize::new(0));
    let opts = CallOptions::new();
    let call = || {
        let loads = loads.clone();
        c.with_options(&opts)
            .fetch_optional("gone", move |_| async move {
                loads.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Loaded::new(None).ttl(secs(1)))
            })
    };
    assert_eq!(call().await.unwrap().value, None);
    let stored = backend
        .get(&FillKeys::new(NS, "gone"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.ttl, secs(1));
    assert_eq!(call().await.unwrap().outcome, Outcome::Hit);
    tokio::time::advance(Duration::from_millis(1500)).await;
    assert_eq!(call().await.unwrap().outcome, Outcome::Loaded);
    assert_eq!(loads.load(Ordering::SeqCst), 2);
}

/// `set_with` writes with the call's TTL and grace; out of range, nothing.
#[tokio::test(start_paused = true)]
async fn set_with_takes_the_same_options() {
    for l1 in [false, true] {
        let backend = MemoryBackend::new();
        let c = cache(&backend, l1);
        let opts = CallOptions::new().ttl(secs(2)).grace(secs(3));
        c.with_options(&opts)
            .set("k", "v".to_owned())
            .await
            .unwrap();
        let stored = backend.get(&FillKeys::new(NS, "k")).await.unwrap().unwrap();
        assert_eq!(stored.ttl, secs(5));
        tokio::time::advance(Duration::from_millis(2500)).await;
        let loads = Arc::new(AtomicUsize::new(0));
        let stale = fetch(&c, "k", &loads, draft).await;
        assert_eq!(
            (stale.outcome, stale.value.as_str()),
            (Outcome::Stale, "v"),
            "l1 {l1}"
        );

        let bad = CallOptions::new().ttl(Duration::ZERO);
        let err = c
            .with_options(&bad)
            .set("other", "v".to_owned())
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "{err:?}");
        let keys = FillKeys::new(NS, "other");
        assert!(backend.get(&keys).await.unwrap().is_none());
    }
}

/// The same on a real Redis: the chosen TTL is the key's `PTTL`, the value
/// reloads after it (through the L1 too), a zero TTL is clamped to 1 ms
/// (answered, gone at once, the lease free), `set_with` writes its TTL and grace.
#[cfg(feature = "redis")]
#[tokio::test]
async fn on_redis_the_chosen_ttl_is_the_keys_ttl() {
    // Seconds of work on a private server; past this it hangs.
    let _limit = onefill_testkit::time_limit(Duration::from_secs(60));
    use onefill::redis::RedisBackend;
    use onefill::L1;
    use onefill_testkit::RedisServer;

    let server = RedisServer::start();
    for l1 in [false, true] {
        let ns = format!("fresh-{l1}");
        let backend = RedisBackend::connect(&server.url()).await.unwrap();
        let builder = Cache::<String, String>::builder()
            .namespace(&ns)
            .backend(backend)
            .ttl(secs(60))
            .jitter(0.0);
        let c = if l1 {
            builder.l1(L1::new(100)).build().unwrap()
        } else {
            builder.build().unwrap()
        };
        let pttl = |key: &str| {
            let keys = FillKeys::new(&ns, key);
            server.query(&["PTTL", keys.value()]).as_int().unwrap()
        };
        let loads = Arc::new(AtomicUsize::new(0));
        let short = |l: Loaded<String>| l.ttl(Duration::from_millis(800));
        assert_eq!(
            fetch(&c, "draft", &loads, short).await.outcome,
            Outcome::Loaded
        );
        assert_eq!(
            fetch(&c, "page", &loads, published).await.outcome,
            Outcome::Loaded
        );
        assert!((1..=800).contains(&pttl("draft")), "{}", pttl("draft"));
        assert!(pttl("page") > 3_500_000, "{}", pttl("page"));
        assert_eq!(
            fetch(&c, "draft", &loads, short).await.outcome,
            Outcome::Hit
        );
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let again = fetch(&c, "draft", &loads, short).await;
        assert_eq!(
            (again.outcome, again.value.as_str()),
            (Outcome::Loaded, "draft#3"),
            "l1 {l1}"
        );
        assert_eq!(
            fetch(&c, "page", &loads, published).await.outcome,
            Outcome::Hit
        );

        // A TTL of zero is clamped to 1 ms: answered, gone at once, and
        // the lease released.
        let zero = |l: Loaded<String>| l.ttl(Duration::ZERO);
        let answered = c
            .fetch("zero", loader(&loads, Duration::ZERO, zero))
            .await
            .unwrap();
        assert_eq!(answered.outcome, Outcome::Loaded);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let keys = FillKeys::new(&ns, "zero");
        assert_eq!(
            server
                .query(&["EXISTS", keys.value(), keys.lock()])
                .as_int(),
            Some(0)
        );

        let opts = CallOptions::new().ttl(secs(2)).grace(secs(3));
        c.with_options(&opts)
            .set("set", "v".to_owned())
            .await
            .unwrap();
        assert!((4_000..=5_000).contains(&pttl("set")), "{}", pttl("set"));
    }
}

/// Edges of loader-chosen freshness: TTLs at their limits, a computed TTL
/// of zero, grace against early refresh and fail-safe, and a damaged
/// freshness byte in the envelope.
mod edges {
    use crate::support::loaders::{fetch_then as fetch, ms, Then};

    use std::io;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use onefill::backend::FillKeys;
    use onefill::{Cache, Loaded, MemoryBackend, Outcome};

    const NS: &str = "edges";

    async fn lease_held(backend: &MemoryBackend) -> bool {
        onefill::testing::lease_held(backend, &FillKeys::new(NS, "k")).await
    }

    // ---------------------------------------------------------------------
    // Loader-chosen freshness and envelope byte 3
    // ---------------------------------------------------------------------

    fn fresh_cache(backend: &MemoryBackend, grace: Duration) -> Cache<String, String> {
        Cache::builder()
            .namespace(NS)
            .backend(backend.clone())
            .ttl(Duration::from_secs(60))
            .grace(grace)
            .jitter(0.0)
            .no_l1()
            .build()
            .unwrap()
    }

    /// TTL 0 and over MAX_TTL: clamped (answered, the lease free);
    /// a TTL under the grace and the largest TTL with the largest grace: stored.
    #[tokio::test(start_paused = true)]
    async fn chosen_ttl_edges() {
        let backend = MemoryBackend::new();
        let c = fresh_cache(&backend, Duration::from_secs(10));
        for ttl in [Duration::ZERO, onefill::MAX_TTL + ms(1), Duration::MAX] {
            let f = c
                .fetch("k", move |_| async move {
                    Ok::<_, io::Error>(Loaded::new("x".to_owned()).ttl(ttl))
                })
                .await
                .unwrap();
            assert_eq!(f.value, "x", "{ttl:?}");
            assert!(!lease_held(&backend).await);
            c.invalidate("k").await.unwrap();
        }
        let f = c
            .fetch("k", |_| async {
                Ok::<_, io::Error>(
                    Loaded::new("max".to_owned())
                        .ttl(onefill::MAX_TTL)
                        .grace(onefill::MAX_TTL),
                )
            })
            .await
            .unwrap();
        assert_eq!(f.outcome, Outcome::Loaded);
        assert_eq!(c.get("k").await.unwrap().as_deref(), Some("max"));
        c.invalidate("k").await.unwrap();
        // A 1 ms TTL under a 10 s grace: stale almost at once, served in grace.
        c.fetch("k", |_| async {
            Ok::<_, io::Error>(Loaded::new("short".to_owned()).ttl(ms(1)))
        })
        .await
        .unwrap();
        tokio::time::advance(ms(5)).await;
        let loads = Arc::new(AtomicUsize::new(0));
        let f = fetch(&c, &loads, ms(0), Then::Value).await.unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Stale, "short"));
    }

    /// Every byte-3 value, with every kind of grace and delta, read by caches
    /// with early refresh on (grace 0) and off: never a panic, never an error,
    /// the stored value answered.
    #[tokio::test(start_paused = true)]
    async fn garbage_byte_3_never_breaks_a_read() {
        let backend = MemoryBackend::new();
        let early = Cache::<String, String>::builder()
            .namespace(NS)
            .backend(backend.clone())
            .ttl(ms(1000))
            .early_refresh_beta(100.0)
            .no_l1()
            .build()
            .unwrap();
        let graced = fresh_cache(&backend, ms(500));
        let with_l1 = Cache::<String, String>::builder()
            .namespace(NS)
            .backend(backend.clone())
            .ttl(ms(1000))
            .early_refresh_beta(100.0)
            .build()
            .unwrap();
        let key = FillKeys::new(NS, "k");
        for code in 0..=255u8 {
            for (grace, delta) in [
                (0u64, 0u32),
                (0, 1),
                (0, u32::MAX),
                (500, 7),
                (u64::MAX, u32::MAX),
            ] {
                let mut bytes = vec![0xF1, 1, 0, code];
                bytes.extend_from_slice(&grace.to_be_bytes());
                bytes.extend_from_slice(&delta.to_be_bytes());
                bytes.extend_from_slice(b"\"g\"");
                for c in [&early, &graced, &with_l1] {
                    backend.put_raw(key.value(), &bytes, ms(800));
                    let loads = Arc::new(AtomicUsize::new(0));
                    let f = fetch(c, &loads, ms(0), Then::Value).await;
                    assert!(f.is_ok(), "code {code} grace {grace} delta {delta}: {f:?}");
                    tokio::task::yield_now().await;
                }
            }
        }
    }

    // ---------------------------------------------------------------------
    // Borrowed keys
    // ---------------------------------------------------------------------

    // ---------------------------------------------------------------------
    // More: chosen grace vs early refresh, invalidate during a background
    // load, soft timeout on a private Redis
    // ---------------------------------------------------------------------

    /// A cache with a grace window (so early refresh is off for it) whose
    /// loader chooses `grace(0)` for a value: that value has no grace window
    /// on the server, so at expiry every caller waits for a load, unless early
    /// refresh (sized from the value, as decision 0007 puts it: "early refresh
    /// and the grace window answer the same question") refreshes it ahead.
    /// The gate reads the reader's policy's grace, not the value's.
    #[tokio::test(start_paused = true)]
    async fn a_value_chosen_without_grace_is_refreshed_early() {
        let backend = MemoryBackend::new();
        let c = fresh_cache(&backend, Duration::from_secs(10));
        let loads = Arc::new(AtomicUsize::new(0));
        let no_grace = |loads: &Arc<AtomicUsize>| {
            let loads = loads.clone();
            move |_: String| async move {
                let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(ms(100)).await;
                Ok::<_, io::Error>(
                    Loaded::new(format!("v{n}"))
                        .ttl(ms(1000))
                        .grace(Duration::ZERO),
                )
            }
        };
        c.fetch("k", no_grace(&loads)).await.unwrap();
        // 1.2 × 100 ms + 5 ms before expiry: due for early refresh.
        tokio::time::advance(ms(950)).await;
        let f = c.fetch("k", no_grace(&loads)).await.unwrap();
        assert_eq!(f.outcome, Outcome::Hit);
        tokio::time::sleep(ms(150)).await;
        assert_eq!(loads.load(Ordering::SeqCst), 2, "refreshed ahead of expiry");
        let f = c.fetch("k", no_grace(&loads)).await.unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Hit, "v2"));
    }

    /// A loader gives its value a long grace (60 s) on a cache without one.
    /// The value goes stale; its refresh fails; fail-safe re-stores it fresh
    /// for the throttle (1 s) plus the *cache's* grace (0), so the value the
    /// loader promised a minute of grace is gone from the server 1 s later,
    /// and the next caller, with no stale value left, gets the origin's error.
    #[tokio::test(start_paused = true)]
    async fn fail_safe_keeps_the_values_own_grace() {
        let backend = MemoryBackend::new();
        let c = Cache::<String, String>::builder()
            .namespace(NS)
            .backend(backend.clone())
            .ttl(ms(1000))
            .jitter(0.0)
            .early_refresh_beta(0.0)
            .fail_safe_throttle(ms(1000))
            .no_l1()
            .build()
            .unwrap();
        c.fetch("k", |_| async {
            Ok::<_, io::Error>(Loaded::new("v1".to_owned()).grace(Duration::from_secs(60)))
        })
        .await
        .unwrap();
        tokio::time::advance(ms(1500)).await; // stale, in its own grace
        let loads = Arc::new(AtomicUsize::new(0));
        let f = fetch(&c, &loads, ms(10), Then::Fail).await.unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Stale, "v1"));
        tokio::time::sleep(ms(50)).await; // the refresh failed: fail-safe
        tokio::time::advance(ms(2000)).await; // past the throttle, in the grace
        let f = fetch(&c, &loads, ms(10), Then::Fail).await;
        assert!(
            matches!(&f, Ok(f) if f.value == "v1"),
            "within the value's 60 s grace: {f:?}"
        );
    }

    /// The natural adaptive TTL: "until the row's own expiry", computed as
    /// `expires_at.saturating_duration_since(now)`, which is zero for a row
    /// whose expiry just passed. The load succeeded, yet every caller gets
    /// `InvalidInput` and the value is thrown away; in a background refresh
    /// the same rejection is silent (no log, no counter) and the key never
    /// refreshes.
    #[tokio::test(start_paused = true)]
    async fn a_computed_ttl_of_zero_still_answers_the_value() {
        let backend = MemoryBackend::new();
        let c = fresh_cache(&backend, Duration::ZERO);
        let expires_at = tokio::time::Instant::now();
        tokio::time::advance(ms(5)).await;
        let r = c
            .fetch("k", move |_| async move {
                let ttl = expires_at.saturating_duration_since(tokio::time::Instant::now());
                Ok::<_, io::Error>(Loaded::new("row".to_owned()).ttl(ttl))
            })
            .await;
        assert!(
            matches!(&r, Ok(f) if f.value == "row"),
            "the load succeeded: {r:?}"
        );
    }

    /// The other way round: a cache without grace (early
    /// refresh on) whose loader gives a value its own grace window: that value
    /// is not refreshed early (its first stale read refreshes it, at no wait).
    #[tokio::test(start_paused = true)]
    async fn a_value_chosen_with_grace_is_not_refreshed_early() {
        let backend = MemoryBackend::new();
        let c = fresh_cache(&backend, Duration::ZERO);
        let loads = Arc::new(AtomicUsize::new(0));
        let with_grace = |loads: &Arc<AtomicUsize>| {
            let loads = loads.clone();
            move |_: String| async move {
                let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(ms(100)).await;
                Ok::<_, io::Error>(
                    Loaded::new(format!("v{n}"))
                        .ttl(ms(1000))
                        .grace(Duration::from_secs(10)),
                )
            }
        };
        c.fetch("k", with_grace(&loads)).await.unwrap();
        tokio::time::advance(ms(950)).await;
        let f = c.fetch("k", with_grace(&loads)).await.unwrap();
        assert_eq!(f.outcome, Outcome::Hit);
        tokio::time::sleep(ms(150)).await;
        assert_eq!(loads.load(Ordering::SeqCst), 1, "no early refresh");
        let f = c.fetch("k", with_grace(&loads)).await.unwrap();
        assert_eq!((f.outcome, f.value.as_str()), (Outcome::Stale, "v1"));
    }
}
