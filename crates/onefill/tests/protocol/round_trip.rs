//! Values that don't round-trip are an error, not a silent reload loop:
//! a value whose encoding does not decode back (`f64::NAN` in
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
            .fetch("k", move |_| async move {
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

/// Regression: a value over the size limit was decoded (the round
/// trip check) before it was refused by size: a full decode of a value
/// that cannot be stored. Now refused first, without a decode.
#[tokio::test(start_paused = true)]
async fn a_value_over_the_size_limit_is_not_decoded() {
    struct Counting(Arc<AtomicUsize>);
    impl onefill::Codec<String> for Counting {
        fn encode(&self, _key: &str, v: &String) -> Result<Vec<u8>, onefill::CodecError> {
            Ok(v.as_bytes().to_vec())
        }
        fn decode(&self, _key: &str, b: &[u8]) -> Result<String, onefill::CodecError> {
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
    // 16-byte header, 9-byte marks block (no tags) + 75 bytes: exactly the
    // limit, checked and stored.
    c.set("k", "x".repeat(75)).await.unwrap();
    assert_eq!(decodes.load(Ordering::SeqCst), 1, "the round trip");
    let err = c.set("k", "x".repeat(76)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput(onefill::InputError::ValueTooLarge { len: 101, max: 100 })
        ),
        "{err:?}"
    );
    let err = c
        .get_or_load("k2", |_| async { Ok::<_, std::io::Error>("y".repeat(76)) })
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert_eq!(decodes.load(Ordering::SeqCst), 1, "no decode of either");
}

/// Values at the size limit, and codecs that panic or cannot round-trip.
mod limits_and_codecs {
    use crate::support::loaders::{fetch_then as fetch, ms, stored_bytes, Then};

    use std::io;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use onefill::backend::FillKeys;
    use onefill::{Cache, Error, MemoryBackend};

    const NS: &str = "codecs";

    async fn lease_held(backend: &MemoryBackend) -> bool {
        onefill::testing::lease_held(backend, &FillKeys::new(NS, "k")).await
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
        // 16-byte header, 9-byte marks block + JSON string with quotes: 73
        // chars fill 100 bytes.
        let exact = "x".repeat(73);
        c.set("k", exact.clone()).await.unwrap();
        assert_eq!(stored_bytes(&backend, NS).await.unwrap().len(), 100);
        assert_eq!(c.get("k").await.unwrap(), Some(exact));
        let over = "x".repeat(74);
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
            fn encode(&self, _key: &str, v: &String) -> Result<Vec<u8>, onefill::CodecError> {
                Ok(v.as_bytes().to_vec())
            }
            fn decode(&self, _key: &str, _: &[u8]) -> Result<String, onefill::CodecError> {
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
        assert!(stored_bytes(&backend, NS).await.is_none());
        assert!(!lease_held(&backend).await);
    }

    /// A custom codec whose `encode` panics (a buggy `Serialize` impl, say):
    /// the fill and `set` fail with `Error::Encode`, as for a decode that
    /// panics, instead of abandoning the flight (`FlightAbandoned`) and
    /// unwinding through `set`'s caller. A regression test.
    #[tokio::test(start_paused = true)]
    async fn a_codec_whose_encode_panics() {
        struct Panics;
        impl onefill::Codec<String> for Panics {
            fn encode(&self, _key: &str, _: &String) -> Result<Vec<u8>, onefill::CodecError> {
                panic!("encode bug")
            }
            fn decode(&self, _key: &str, b: &[u8]) -> Result<String, onefill::CodecError> {
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
        assert!(stored_bytes(&backend, NS).await.is_none());
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
}
