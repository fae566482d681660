//! Hostile review of issue 10 (loader errors, borrowed keys, loader-chosen
//! freshness, soft timeout, round-trip check). Each test states the
//! behaviour a user relies on; the findings the review made are fixed, and
//! their reproductions are the regression tests here (a "finding N" in a
//! test's docs). Paused time on the embedded backend; a few on a private
//! Redis.

use std::error::Error as _;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::{Backend, FillKeys};
use onefill::{Cache, CallOptions, Error, Fetched, LeaseTtl, Loaded, MemoryBackend, Outcome};

const NS: &str = "review";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[derive(Debug, thiserror::Error)]
#[error("no row {0}")]
struct NoRow(u32);

fn errors_cache() -> Cache<u32, String> {
    Cache::builder()
        .namespace(NS)
        .backend(MemoryBackend::new())
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------
// Loader errors
// ---------------------------------------------------------------------

/// The most common `anyhow` loader: `?` (or `bail!`) on a typed error, no
/// `.context(..)`. The README and `Error::loader_error` promise the typed
/// error back "also from inside an `anyhow::Error`".
#[tokio::test(start_paused = true)]
async fn anyhow_without_context_comes_back_typed() {
    let c = errors_cache();
    let err = c
        .get_or_load(&1, |k| async move {
            let row: Result<String, NoRow> = Err(NoRow(k));
            let row = row?; // into anyhow::Error, no context
            anyhow::Ok(row)
        })
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "loader failed: no row 1");
    assert_eq!(err.loader_error::<NoRow>().map(|e| e.0), Some(1));
}

/// A caller that hands `onefill::Error` up a generic error path (`?` into
/// `anyhow`, a `Box<dyn Error>`, a web framework) walks `source()` to find
/// the cause; the loader's own error must be in that chain, not only its
/// Display.
#[tokio::test(start_paused = true)]
async fn the_loaders_error_is_in_the_source_chain() {
    let c = errors_cache();
    let err = c
        .get_or_load(&2, |_| async {
            Err::<String, _>(io::Error::other("db down"))
        })
        .await
        .unwrap_err();
    let mut next = err.source();
    let mut found = false;
    while let Some(e) = next {
        found |= e.is::<io::Error>();
        next = e.source();
    }
    assert!(found, "no io::Error in the chain of {err:?}");
    // The same through anyhow, as a handler would see it.
    let any = anyhow::Error::from(err);
    assert!(any.chain().any(|e| e.is::<io::Error>()));
}

/// A loader that uses another cache (a layered lookup) returns
/// `onefill::Error`; the outer caller's `loader_error` should find the
/// inner loader's error.
#[tokio::test(start_paused = true)]
async fn nested_caches_keep_the_inner_error_type() {
    let inner = errors_cache();
    let outer: Cache<u32, String> = Cache::builder()
        .namespace("outer")
        .backend(MemoryBackend::new())
        .build()
        .unwrap();
    let err = outer
        .get_or_load(&3, move |k| async move {
            inner
                .get_or_load(&k, |k| async move { Err::<String, _>(NoRow(k)) })
                .await
        })
        .await
        .unwrap_err();
    assert_eq!(err.loader_error::<NoRow>().map(|e| e.0), Some(3));
}

/// Nested `anyhow` contexts and a coalesced caller: found (works).
#[tokio::test(start_paused = true)]
async fn nested_anyhow_contexts_through_coalesced_callers() {
    use anyhow::Context as _;
    let c = errors_cache();
    let loads = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (c, loads) = (c.clone(), loads.clone());
        tasks.push(tokio::spawn(async move {
            c.get_or_load(&4, move |k| async move {
                loads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(ms(10)).await;
                Err::<String, _>(NoRow(k))
                    .context("inner")
                    .context("middle")
                    .context("outer")
            })
            .await
            .unwrap_err()
        }));
    }
    for t in tasks {
        let err = t.await.unwrap();
        assert_eq!(err.loader_error::<NoRow>().map(|e| e.0), Some(4));
        assert_eq!(err.to_string(), "loader failed: outer");
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
}

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

#[derive(Clone, Copy)]
enum Then {
    Value,
    Fail,
    Panic,
}

/// A loader counting into `loads`, sleeping `took`, then `then`.
fn load(
    loads: &Arc<AtomicUsize>,
    took: Duration,
    then: Then,
) -> impl FnOnce(
    String,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<String>> + Send>>
       + Send
       + 'static {
    let loads = loads.clone();
    move |_| {
        Box::pin(async move {
            let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(took).await;
            match then {
                Then::Value => Ok(format!("v{n}")),
                Then::Fail => Err(io::Error::other(format!("load {n} failed"))),
                Then::Panic => panic!("load {n} panicked"),
            }
        })
    }
}

async fn fetch(
    c: &Cache<String, String>,
    loads: &Arc<AtomicUsize>,
    took: Duration,
    then: Then,
) -> Result<Fetched<String>, Error> {
    c.fetch("k", &CallOptions::new(), load(loads, took, then))
        .await
}

async fn stored(backend: &MemoryBackend) -> Option<Vec<u8>> {
    backend
        .get(&FillKeys::new(NS, "k"))
        .await
        .unwrap()
        .map(|s| s.bytes)
}

fn payload(bytes: &[u8]) -> String {
    serde_json::from_slice(&bytes[16..]).unwrap_or_else(|_| format!("{:?}", &bytes[..3]))
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
    assert_eq!(payload(&stored(&backend).await.unwrap()), "v2");
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
            .fetch("k", &options, move |k| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, io::Error>(k)
            })
            .await
            .unwrap_err();
        assert!(err.is_invalid_input(), "{err:?}");
        assert!(err.to_string().contains("soft_timeout"), "{err}");
    }
    assert_eq!(loads.load(Ordering::SeqCst), 0, "refused before loading");
    assert!(stored(&backend).await.is_none(), "nothing stored");
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
    assert_eq!(payload(&stored(&backend).await.unwrap()), "v2");
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
        .fetch("k", &opts, load(&loads, ms(50), Then::Value))
        .await
        .unwrap();
    assert_eq!((f.outcome, f.value.as_str()), (Outcome::Loaded, "v2"));
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
            .fetch_loaded("k", &CallOptions::new(), move |_| async move {
                Ok::<_, io::Error>(Loaded::new("x".to_owned()).ttl(ttl))
            })
            .await
            .unwrap();
        assert_eq!(f.value, "x", "{ttl:?}");
        assert!(!lease_held(&backend).await);
        c.invalidate("k").await.unwrap();
    }
    let f = c
        .fetch_loaded("k", &CallOptions::new(), |_| async {
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
    c.fetch_loaded("k", &CallOptions::new(), |_| async {
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
// Round trip, size limit, codecs
// ---------------------------------------------------------------------

/// A value whose envelope is exactly `max_value_bytes` is stored and read
/// back; one byte more is `ValueTooLarge`, nothing stored.
#[tokio::test(start_paused = true)]
async fn values_at_the_size_limit() {
    let backend = MemoryBackend::new();
    let c = Cache::<String, String>::builder()
        .namespace(NS)
        .backend(backend.clone())
        .max_value_bytes(100)
        .no_l1()
        .build()
        .unwrap();
    // 16-byte header + JSON string with quotes: 82 chars fill 100 bytes.
    let exact = "x".repeat(82);
    c.set("k", exact.clone()).await.unwrap();
    assert_eq!(stored(&backend).await.unwrap().len(), 100);
    assert_eq!(c.get("k").await.unwrap(), Some(exact));
    let over = "x".repeat(83);
    let err = c.set("k2", over.clone()).await.unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    let err = c
        .get_or_load("k3", move |_| async move { Ok::<_, io::Error>(over) })
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
}

/// A custom codec whose `decode` panics: `set` and a fill get
/// `Error::Encode` (round trip), nothing stored, no lease left.
#[tokio::test(start_paused = true)]
async fn a_codec_whose_decode_panics() {
    struct Panics;
    impl onefill::Codec<String> for Panics {
        fn encode(&self, v: &String) -> Result<Vec<u8>, onefill::CodecError> {
            Ok(v.as_bytes().to_vec())
        }
        fn decode(&self, _: &[u8]) -> Result<String, onefill::CodecError> {
            panic!("decode bug")
        }
    }
    let backend = MemoryBackend::new();
    let c = Cache::<String, String>::builder()
        .namespace(NS)
        .backend(backend.clone())
        .codec(Panics)
        .build()
        .unwrap();
    let err = c.set("k", "a".to_owned()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Encode { source, .. } if source.is_round_trip()),
        "{err:?}"
    );
    let err = c
        .get_or_load("k", |_| async { Ok::<_, io::Error>("a".to_owned()) })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Encode { source, .. } if source.is_round_trip()),
        "{err:?}"
    );
    assert!(stored(&backend).await.is_none());
    assert!(!lease_held(&backend).await);
}

/// A custom codec whose `encode` panics (a buggy `Serialize` impl, say):
/// the fill and `set` fail with `Error::Encode`, as for a decode that
/// panics, instead of abandoning the flight (`FlightAbandoned`) and
/// unwinding through `set`'s caller. Regression test of the review.
#[tokio::test(start_paused = true)]
async fn a_codec_whose_encode_panics() {
    struct Panics;
    impl onefill::Codec<String> for Panics {
        fn encode(&self, _: &String) -> Result<Vec<u8>, onefill::CodecError> {
            panic!("encode bug")
        }
        fn decode(&self, b: &[u8]) -> Result<String, onefill::CodecError> {
            Ok(String::from_utf8_lossy(b).into_owned())
        }
    }
    let backend = MemoryBackend::new();
    let c = Cache::<String, String>::builder()
        .namespace(NS)
        .backend(backend.clone())
        .codec(Panics)
        .build()
        .unwrap();
    let err = c
        .get_or_load("k", |_| async { Ok::<_, io::Error>("a".to_owned()) })
        .await
        .unwrap_err();
    // Was `FlightAbandoned` (the flight's task unwound); now the encode
    // error of a decode that panics, with the lease released in line.
    assert!(
        matches!(&err, Error::Encode { key, .. } if key == "k"),
        "{err:?}"
    );
    let err = c.set("k", "a".to_owned()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Encode { key, .. } if key == "k"),
        "{err:?}"
    );
    assert!(stored(&backend).await.is_none());
    assert!(!lease_held(&backend).await, "the lease is released");
    // Not stuck: the next call runs its loader again.
    let loads = Arc::new(AtomicUsize::new(0));
    let _ = fetch(&c, &loads, ms(0), Then::Value).await;
    assert_eq!(loads.load(Ordering::SeqCst), 1);
}

/// Postcard: a struct with `skip_serializing_if` encodes but does not
/// decode (postcard is not self-describing): refused at write time.
#[cfg(feature = "postcard")]
#[tokio::test(start_paused = true)]
async fn postcard_skip_serializing_if_is_refused() {
    #[derive(Clone, serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Row {
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        id: u32,
    }
    let backend = MemoryBackend::new();
    let c = Cache::<String, Row>::builder()
        .namespace(NS)
        .backend(backend.clone())
        .codec(onefill::PostcardCodec)
        .build()
        .unwrap();
    let err = c
        .get_or_load("k", |_| async {
            Ok::<_, io::Error>(Row { note: None, id: 7 })
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Encode { source, .. } if source.is_round_trip()),
        "{err:?}"
    );
    let ok = Row {
        note: Some("n".into()),
        id: 7,
    };
    let v = c
        .get_or_load("k2", move |_| async move { Ok::<_, io::Error>(ok) })
        .await
        .unwrap();
    assert_eq!(v.id, 7);
    // serde_json::Value: postcard cannot decode `deserialize_any`.
    let c = Cache::<String, serde_json::Value>::builder()
        .namespace(NS)
        .backend(backend.clone())
        .codec(onefill::PostcardCodec)
        .build()
        .unwrap();
    let err = c
        .get_or_load("k3", |_| async {
            Ok::<_, io::Error>(serde_json::json!({"a": 1}))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Encode { source, .. } if source.is_round_trip()),
        "{err:?}"
    );
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
    c.fetch_loaded("k", &CallOptions::new(), no_grace(&loads))
        .await
        .unwrap();
    // 1.2 × 100 ms + 5 ms before expiry: due for early refresh.
    tokio::time::advance(ms(950)).await;
    let f = c
        .fetch_loaded("k", &CallOptions::new(), no_grace(&loads))
        .await
        .unwrap();
    assert_eq!(f.outcome, Outcome::Hit);
    tokio::time::sleep(ms(150)).await;
    assert_eq!(loads.load(Ordering::SeqCst), 2, "refreshed ahead of expiry");
    let f = c
        .fetch_loaded("k", &CallOptions::new(), no_grace(&loads))
        .await
        .unwrap();
    assert_eq!((f.outcome, f.value.as_str()), (Outcome::Hit, "v2"));
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
    assert!(stored(&backend).await.is_none(), "fenced out");
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
    let _limit = onefill_testkit::time_limit(Duration::from_secs(60));
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
    c.fetch_loaded("k", &CallOptions::new(), |_| async {
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
        .fetch_loaded("k", &CallOptions::new(), move |_| async move {
            let ttl = expires_at.saturating_duration_since(tokio::time::Instant::now());
            Ok::<_, io::Error>(Loaded::new("row".to_owned()).ttl(ttl))
        })
        .await;
    assert!(
        matches!(&r, Ok(f) if f.value == "row"),
        "the load succeeded: {r:?}"
    );
}

/// The workaround (and the shape of a fix) for finding 1: anyhow's
/// relocating conversion makes the box downcastable to the original type.
#[tokio::test(start_paused = true)]
async fn anyhow_relocated_into_a_box_comes_back_typed() {
    let c = errors_cache();
    let err = c
        .get_or_load(&5, |k| async move {
            let row: anyhow::Result<String> = Err(NoRow(k).into());
            row.map_err(|e| e.reallocate_into_boxed_dyn_error_without_backtrace())
        })
        .await
        .unwrap_err();
    assert_eq!(err.loader_error::<NoRow>().map(|e| e.0), Some(5));
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
    let _limit = onefill_testkit::time_limit(Duration::from_secs(60));
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

/// Finding 3's fix, each failure rule: a load failing before the soft
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

/// Finding 10's fix with a failing load: the stale value expired during
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

/// Finding 6's fix, the other way round: a cache without grace (early
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
    c.fetch_loaded("k", &CallOptions::new(), with_grace(&loads))
        .await
        .unwrap();
    tokio::time::advance(ms(950)).await;
    let f = c
        .fetch_loaded("k", &CallOptions::new(), with_grace(&loads))
        .await
        .unwrap();
    assert_eq!(f.outcome, Outcome::Hit);
    tokio::time::sleep(ms(150)).await;
    assert_eq!(loads.load(Ordering::SeqCst), 1, "no early refresh");
    let f = c
        .fetch_loaded("k", &CallOptions::new(), with_grace(&loads))
        .await
        .unwrap();
    assert_eq!((f.outcome, f.value.as_str()), (Outcome::Stale, "v1"));
}
