//! Values that don't round-trip are an error, not a silent reload loop
//! (issue 10): a value whose encoding does not decode back (`f64::NAN` in
//! JSON becomes `null`) or does not encode (a map with non-string keys) is
//! refused at fill time and at `set`, with `Error::Encode` naming the key,
//! for every coalesced caller; nothing is stored, the lease is released.

use std::collections::{BTreeMap, HashMap};
use std::error::Error as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::{Backend, FillKeys};
use onefill::{Cache, Error, MemoryBackend, Outcome};

const NS: &str = "round";

fn cache<V>(backend: &MemoryBackend) -> Cache<String, V>
where
    V: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static,
{
    Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Three coalesced callers of a loader whose value is `bad`: one load,
/// each gets `Error::Encode` for the key; nothing stored, the lease free.
async fn refused<V>(bad: V, round_trip: bool)
where
    V: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static,
{
    let backend = MemoryBackend::new();
    let c = cache::<V>(&backend);
    let loads = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let (c, loads, bad) = (c.clone(), loads.clone(), bad.clone());
        tasks.push(tokio::spawn(async move {
            c.get_or_load("k", move |_| async move {
                loads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok::<_, std::io::Error>(bad)
            })
            .await
        }));
    }
    for t in tasks {
        match t.await.unwrap() {
            Err(Error::Encode { key, source }) => {
                assert_eq!(key, "k");
                assert_eq!(source.is_round_trip(), round_trip, "{source}");
                if round_trip {
                    assert!(source.source().is_some(), "the decoder's error");
                }
            }
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("stored a value that does not round-trip"),
        }
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    let keys = FillKeys::new(NS, "k");
    assert!(
        backend.get(&keys).await.unwrap().is_none(),
        "nothing stored"
    );
    assert!(
        !onefill::testing::lease_held(&backend, &keys).await,
        "released"
    );
    // `set` refuses it too.
    let err = c.set("k", bad).await.unwrap_err();
    assert!(
        matches!(&err, Error::Encode { key, .. } if key == "k"),
        "{err:?}"
    );
    assert!(
        backend.get(&keys).await.unwrap().is_none(),
        "nothing stored"
    );
}

/// Regression: NaN was stored as `null`, then every read failed to decode
/// and reloaded.
#[tokio::test(start_paused = true)]
async fn nan_is_refused() {
    refused(f64::NAN, true).await;
    refused(vec![1.0, f64::INFINITY], true).await;
    let mut prices = HashMap::new();
    prices.insert("a".to_owned(), f64::NAN);
    refused(prices, true).await;
}

/// Regression: a map with non-string keys.
#[tokio::test(start_paused = true)]
async fn maps_with_non_string_keys_are_refused() {
    let mut by_pair = BTreeMap::new();
    by_pair.insert((1u8, 2u8), 3u8);
    refused(by_pair, false).await;
}

/// A value that does round-trip is stored and read back once: no reload.
#[tokio::test(start_paused = true)]
async fn values_that_round_trip_are_stored() {
    let backend = MemoryBackend::new();
    let c = cache::<HashMap<u32, f64>>(&backend);
    let loads = Arc::new(AtomicUsize::new(0));
    for expected in [Outcome::Loaded, Outcome::Hit] {
        let loads = loads.clone();
        let f = c
            .fetch("k", &onefill::CallOptions::new(), move |_| async move {
                loads.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(HashMap::from([(7, 1.5)]))
            })
            .await
            .unwrap();
        assert_eq!(f.outcome, expected);
        assert_eq!(f.value[&7], 1.5);
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
}

/// Review of issue 10: a value over the size limit was decoded (the round
/// trip check) before it was refused by size: a full decode of a value
/// that cannot be stored. Now refused first, without a decode.
#[tokio::test(start_paused = true)]
async fn a_value_over_the_size_limit_is_not_decoded() {
    struct Counting(Arc<AtomicUsize>);
    impl onefill::Codec<String> for Counting {
        fn encode(&self, v: &String) -> Result<Vec<u8>, onefill::CodecError> {
            Ok(v.as_bytes().to_vec())
        }
        fn decode(&self, b: &[u8]) -> Result<String, onefill::CodecError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            String::from_utf8(b.to_vec()).map_err(onefill::CodecError::new)
        }
    }
    let decodes = Arc::new(AtomicUsize::new(0));
    let backend = MemoryBackend::new();
    let c: Cache<String, String> = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .codec(Counting(decodes.clone()))
        .max_value_bytes(100)
        .build()
        .unwrap();
    // 16-byte header + 84 bytes: exactly the limit, checked and stored.
    c.set("k", "x".repeat(84)).await.unwrap();
    assert_eq!(decodes.load(Ordering::SeqCst), 1, "the round trip");
    let err = c.set("k", "x".repeat(85)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(onefill::InputError::ValueTooLarge { len: 101, max: 100 })
        ),
        "{err:?}"
    );
    let err = c
        .get_or_load("k2", |_| async { Ok::<_, std::io::Error>("y".repeat(85)) })
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert_eq!(decodes.load(Ordering::SeqCst), 1, "no decode of either");
}
