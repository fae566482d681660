//! The codec wrappers, `Encrypted` and `Compressed`: round trips alone and
//! composed, through caches on one memory backend (paused time); what the
//! store holds (headers, key ids, sizes), read and rewritten with
//! `MemoryBackend::{get_raw, put_raw}`; and what a value that does not
//! decode costs: a miss, counted in `decode_errors`, one load fleet-wide.
//!
//! Longer than most files on purpose: the two wrappers compose, and their
//! failures cost the same, so they are read best side by side.

use std::time::Duration;

use onefill::backend::FillKeys;
use onefill::testing::{herd, CacheUnderTest, Origin};
use onefill::{
    Cache, CallOptions, Codec, Compressed, Encrypted, JsonCodec, KeyRing, KeyRingError,
    MemoryBackend, KEY_LEN,
};
use onefill_testkit::time_limit;
use proptest::prelude::*;

/// Each test takes milliseconds; past this it hangs.
const LIMIT: Duration = Duration::from_secs(60);

const KEY_1: [u8; KEY_LEN] = [0x11; KEY_LEN];
const KEY_2: [u8; KEY_LEN] = [0x22; KEY_LEN];
/// What an encrypted value adds: version, key id, nonce, tag.
const ENCRYPTED_OVERHEAD: usize = 1 + 4 + 24 + 16;
/// The envelope's header and the marks block of an untagged value
/// (version 3, as the memory backend stores it).
const ENVELOPE_HEADER: usize = 16 + 9;

fn ring_1() -> KeyRing {
    KeyRing::new(1, &KEY_1)
}

fn ring_1_2() -> KeyRing {
    KeyRing::new(1, &KEY_1).with_key(2, &KEY_2).expect("a ring")
}

fn ring_2() -> KeyRing {
    KeyRing::new(2, &KEY_2)
}

/// A cache named `ns` on `store` with `codec`, without an L1 (so every read
/// decodes what the store holds).
fn cache<C: Codec<String>>(store: &MemoryBackend, ns: &str, codec: C) -> Cache<String, String> {
    Cache::builder()
        .namespace(ns)
        .backend(store.clone())
        .no_l1()
        .ttl(Duration::from_secs(60))
        .codec(codec)
        .build()
        .expect("valid options")
}

/// What `cache` stores under `key`: the envelope's payload (the codec's
/// bytes), and the whole stored value.
fn stored(store: &MemoryBackend, ns: &str, key: &str) -> (Vec<u8>, Vec<u8>) {
    let (bytes, _) = store
        .get_raw(FillKeys::new(ns, key).value())
        .expect("a stored value");
    assert_eq!(&bytes[..2], &[0xF1, 3], "an envelope of version 3");
    (bytes[ENVELOPE_HEADER..].to_vec(), bytes)
}

/// The key id in the header of an encrypted payload.
fn key_id(payload: &[u8]) -> u32 {
    assert_eq!(payload[0], 1, "encrypted format version 1");
    u32::from_be_bytes(payload[1..5].try_into().expect("4 bytes"))
}

fn decode_errors(caches: &[Cache<String, String>]) -> u64 {
    caches.iter().map(|c| c.stats().decode_errors).sum()
}

/// JSON of repetitive records, about `bytes` long: compresses well.
fn records(bytes: usize) -> String {
    let mut out = String::new();
    let mut i = 0;
    while out.len() < bytes {
        out.push_str(&format!(
            r#"{{"id":{i},"name":"user {i}","plan":"standard","active":true}},"#
        ));
        i += 1;
    }
    out
}

/// Loads `key` through `cache` with a loader that must not run.
async fn hit(cache: &Cache<String, String>, key: &str) -> String {
    cache
        .get_or_load(&key.to_string(), |k| async move {
            Err::<String, _>(std::io::Error::other(format!("{k} was loaded, not read")))
        })
        .await
        .expect("a hit")
}

#[tokio::test(start_paused = true)]
async fn encrypted_values_round_trip_and_the_store_holds_no_plaintext() {
    let _limit = time_limit(LIMIT);
    let store = MemoryBackend::new();
    let c = cache(&store, "enc", Encrypted::new(JsonCodec, ring_1()));
    let secret = "the secret value".to_string();
    c.set(&"k".to_string(), secret.clone()).await.expect("set");
    let (payload, whole) = stored(&store, "enc", "k");
    let json = serde_json::to_vec(&secret).unwrap();
    assert_eq!(payload.len(), json.len() + ENCRYPTED_OVERHEAD);
    assert!(
        !whole.windows(6).any(|w| w == b"secret"),
        "plaintext in the store"
    );
    assert_eq!(key_id(&payload), 1);
    assert_eq!(hit(&c, "k").await, secret);
    // Another process with the same ring reads it too.
    let other = cache(&store, "enc", Encrypted::new(JsonCodec, ring_1()));
    assert_eq!(hit(&other, "k").await, secret);
    assert_eq!(decode_errors(&[c, other]), 0);
}

#[test]
fn encrypting_twice_gives_different_bytes() {
    let codec = Encrypted::new(JsonCodec, ring_1());
    let a = Codec::<u32>::encode(&codec, "ns:{k}", &7).unwrap();
    let b = Codec::<u32>::encode(&codec, "ns:{k}", &7).unwrap();
    assert_ne!(a, b, "a fresh nonce per write");
    assert_ne!(a[5..29], b[5..29]);
}

#[tokio::test(start_paused = true)]
async fn compressed_and_composed_values_round_trip() {
    let _limit = time_limit(LIMIT);
    let store = MemoryBackend::new();
    let small = "small".to_string();
    let large = records(16 * 1024);
    let compressed = cache(&store, "cmp", Compressed::new(JsonCodec));
    let both = cache(
        &store,
        "both",
        Encrypted::new(Compressed::new(JsonCodec), ring_1()),
    );
    for c in [&compressed, &both] {
        for (key, value) in [("small", &small), ("large", &large)] {
            c.set(&key.to_string(), value.clone()).await.expect("set");
            assert_eq!(&hit(c, key).await, value);
        }
    }
    let json_len = serde_json::to_vec(&large).unwrap().len();
    let (cmp, _) = stored(&store, "cmp", "large");
    let (enc, _) = stored(&store, "both", "large");
    assert!(cmp.len() * 4 < json_len, "{} of {json_len}", cmp.len());
    // Compressed, then encrypted: the ciphertext is as short.
    assert_eq!(enc.len(), cmp.len() + ENCRYPTED_OVERHEAD);
    assert_eq!(decode_errors(&[compressed, both]), 0);
}

#[test]
fn every_flipped_bit_of_an_encrypted_value_makes_it_unreadable() {
    for codec in [
        Box::new(Encrypted::new(JsonCodec, ring_1_2())) as Box<dyn Codec<String>>,
        Box::new(Encrypted::new(
            Compressed::new(JsonCodec).threshold(0),
            ring_1_2(),
        )),
    ] {
        let bytes = codec.encode("ns:{k}", &records(600)).unwrap();
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut changed = bytes.clone();
                changed[at] ^= 1 << bit;
                assert!(
                    codec.decode("ns:{k}", &changed).is_err(),
                    "byte {at} bit {bit} changed and it still decodes"
                );
            }
        }
        for len in 0..bytes.len() {
            assert!(
                codec.decode("ns:{k}", &bytes[..len]).is_err(),
                "{len} bytes"
            );
        }
        assert!(codec.decode("ns:{k}", &bytes).is_ok());
    }
}

/// The header's key id is authenticated: even under two ids of the same
/// key, a value whose id was changed does not decrypt.
#[test]
fn the_key_id_and_the_version_are_associated_data() {
    let ring = KeyRing::new(1, &KEY_1)
        .with_key(3, &KEY_1)
        .and_then(|r| r.with_writer(1))
        .unwrap();
    let codec = Encrypted::new(JsonCodec, ring);
    let mut bytes = Codec::<u32>::encode(&codec, "ns:{k}", &7).unwrap();
    assert_eq!(key_id(&bytes), 1);
    bytes[4] = 3;
    assert!(Codec::<u32>::decode(&codec, "ns:{k}", &bytes).is_err());
}

/// A value changed in the store (one byte) is a miss for every process:
/// one load fleet-wide, counted, and the value is written anew.
#[tokio::test(start_paused = true)]
async fn a_tampered_value_costs_one_load_fleet_wide() {
    let _limit = time_limit(LIMIT);
    let store = MemoryBackend::new();
    let pods: Vec<_> = (0..4)
        .map(|_| cache(&store, "tamper", Encrypted::new(JsonCodec, ring_1())))
        .map(|pod| CacheUnderTest::new(pod, false))
        .collect();
    pods[0].set("k", "original".into()).await.expect("set");
    let (payload, mut whole) = stored(&store, "tamper", "k");
    // A byte of the ciphertext, past the header and nonce.
    whole[ENVELOPE_HEADER + 29 + 3] ^= 0x01;
    let keys = FillKeys::new("tamper", "k");
    store.put_raw(keys.value(), &whole, Duration::from_secs(60));
    let origin = Origin::default();
    let results = herd(
        &pods,
        40,
        "k",
        &origin,
        Duration::from_millis(200),
        CallOptions::new(),
    )
    .await;
    for r in &results {
        assert_eq!(r.as_ref().expect("an answer").value, "k-v1");
    }
    assert_eq!(origin.count(), 1, "one load fleet-wide");
    assert!(
        decode_errors(
            &pods
                .iter()
                .map(|p| p.as_async().clone())
                .collect::<Vec<_>>()
        ) >= 1,
        "the unreadable value was not counted"
    );
    let (rewritten, _) = stored(&store, "tamper", "k");
    assert_ne!(rewritten, payload);
    assert_eq!(hit(pods[3].as_async(), "k").await, "k-v1");
}

/// Bytes copied to another key (of the same cache, or of another
/// namespace) do not decrypt there: the key's name is associated data.
#[tokio::test(start_paused = true)]
async fn a_value_copied_under_another_key_does_not_decrypt() {
    let _limit = time_limit(LIMIT);
    let store = MemoryBackend::new();
    let a = cache(&store, "a", Encrypted::new(JsonCodec, ring_1()));
    let b = cache(&store, "b", Encrypted::new(JsonCodec, ring_1()));
    a.set(&"alice".to_string(), "alice's".into())
        .await
        .expect("set");
    let (_, whole) = stored(&store, "a", "alice");
    for (ns, key) in [("a", "mallory"), ("b", "alice")] {
        store.put_raw(
            FillKeys::new(ns, key).value(),
            &whole,
            Duration::from_secs(60),
        );
    }
    assert_eq!(a.get(&"mallory".to_string()).await.expect("get"), None);
    assert_eq!(b.get(&"alice".to_string()).await.expect("get"), None);
    assert_eq!(decode_errors(&[a.clone(), b.clone()]), 2);
    // Where it was written it still reads.
    assert_eq!(hit(&a, "alice").await, "alice's");
}

/// Rotation: a reader of keys 1 and 2 reads what key 1 wrote; key 2 writes
/// once it is the highest id (unless key 1 is named the writer); a process
/// that holds only key 1 reads key 2's values as misses.
#[tokio::test(start_paused = true)]
async fn rotation_reads_old_keys_and_writes_with_the_new_one() {
    let _limit = time_limit(LIMIT);
    let store = MemoryBackend::new();
    let old = cache(&store, "rot", Encrypted::new(JsonCodec, ring_1()));
    old.set(&"before".to_string(), "by key 1".into())
        .await
        .expect("set");
    assert_eq!(key_id(&stored(&store, "rot", "before").0), 1);

    // Step 1: key 2 is known, key 1 still writes.
    let staged = cache(
        &store,
        "rot",
        Encrypted::new(
            JsonCodec,
            ring_1_2().with_writer(1).expect("key 1 is in the ring"),
        ),
    );
    staged
        .set(&"staged".to_string(), "still key 1".into())
        .await
        .expect("set");
    assert_eq!(key_id(&stored(&store, "rot", "staged").0), 1);
    assert_eq!(hit(&old, "staged").await, "still key 1");

    // Step 2: key 2 writes; key 1's values still read.
    let new = cache(&store, "rot", Encrypted::new(JsonCodec, ring_1_2()));
    assert_eq!(hit(&new, "before").await, "by key 1");
    new.set(&"after".to_string(), "by key 2".into())
        .await
        .expect("set");
    assert_eq!(key_id(&stored(&store, "rot", "after").0), 2);
    assert_eq!(hit(&new, "after").await, "by key 2");
    assert_eq!(hit(&staged, "after").await, "by key 2");
    assert_eq!(decode_errors(&[old.clone(), staged, new]), 0);

    // A process still on key 1 alone cannot read it: a miss, counted.
    assert_eq!(old.get(&"after".to_string()).await.expect("get"), None);
    assert_eq!(old.stats().decode_errors, 1);
}

/// Key 1 rotated out: its values are unreadable everywhere, and a herd of
/// callers over four processes costs one load, whose value key 2 writes.
#[tokio::test(start_paused = true)]
async fn an_unknown_key_id_costs_one_load_fleet_wide() {
    let _limit = time_limit(LIMIT);
    let store = MemoryBackend::new();
    let retired = cache(&store, "gone", Encrypted::new(JsonCodec, ring_1()));
    retired
        .set(&"k".to_string(), "by key 1".into())
        .await
        .expect("set");
    let pods: Vec<_> = (0..4)
        .map(|_| cache(&store, "gone", Encrypted::new(JsonCodec, ring_2())))
        .map(|pod| CacheUnderTest::new(pod, false))
        .collect();
    let origin = Origin::default();
    let results = herd(
        &pods,
        200,
        "k",
        &origin,
        Duration::from_millis(200),
        CallOptions::new(),
    )
    .await;
    for r in &results {
        assert_eq!(r.as_ref().expect("an answer").value, "k-v1");
    }
    assert_eq!(origin.count(), 1, "one load fleet-wide");
    // Every process read the value before the load ended (its first read,
    // and perhaps its lease request's answer): each counted it.
    for pod in &pods {
        assert!(pod.stats().decode_errors >= 1, "{:?}", pod.stats());
    }
    assert_eq!(key_id(&stored(&store, "gone", "k").0), 2);
    assert_eq!(hit(pods[0].as_async(), "k").await, "k-v1");
}

#[test]
fn key_rings_from_bytes_and_lists_reject_bad_input_with_typed_errors() {
    assert_eq!(
        KeyRing::from_slice(3, &[0; 31]).unwrap_err(),
        KeyRingError::KeyLength { id: 3, len: 31 }
    );
    assert_eq!(
        ring_1().with_key(1, &KEY_2).unwrap_err(),
        KeyRingError::DuplicateId(1)
    );
    assert_eq!(
        ring_1().with_key(2, &[0; 33]).unwrap_err(),
        KeyRingError::KeyLength { id: 2, len: 33 }
    );
    assert_eq!(
        ring_1().with_writer(9).unwrap_err(),
        KeyRingError::UnknownWriter(9)
    );

    let k1 = base64(&KEY_1);
    let k2 = base64(&KEY_2);
    let ring = KeyRing::parse(&format!("1:{k1},2:{k2}\n")).expect("a ring");
    assert_eq!(
        (ring.ids().collect::<Vec<_>>(), ring.writer_id()),
        (vec![1, 2], 2)
    );
    let ring = KeyRing::parse(&format!(" 2:{k2}\n*1:{k1} ")).expect("a ring");
    assert_eq!(
        (ring.ids().collect::<Vec<_>>(), ring.writer_id()),
        (vec![1, 2], 1)
    );

    let entry = |entry, reason| KeyRingError::Entry { entry, reason };
    for (list, error) in [
        (String::new(), KeyRingError::Empty),
        (" ,\n".to_string(), KeyRingError::Empty),
        (format!("1:{k1},{k2}"), entry(2, "not `id:base64`")),
        (
            format!("x:{k1}"),
            entry(1, "the id is not a number from 0 to 4294967295"),
        ),
        (
            format!("-1:{k1}"),
            entry(1, "the id is not a number from 0 to 4294967295"),
        ),
        (
            format!("4294967296:{k1}"),
            entry(1, "the id is not a number from 0 to 4294967295"),
        ),
        (
            "1:not base64!".to_string(),
            entry(1, "the key is not valid base64"),
        ),
        (
            "1:%%%%".to_string(),
            entry(1, "the key is not valid base64"),
        ),
        (
            format!("*1:{k1},*2:{k2}"),
            entry(2, "a second entry is marked `*` (the writer)"),
        ),
        (format!("1:{k1},1:{k2}"), KeyRingError::DuplicateId(1)),
        (
            format!("1:{}", base64(&[0; 16])),
            KeyRingError::KeyLength { id: 1, len: 16 },
        ),
    ] {
        assert_eq!(KeyRing::parse(&list).unwrap_err(), error, "{list:?}");
    }
}

#[test]
fn key_rings_from_the_environment() {
    let var = "ONEFILL_TEST_CODECS_KEYS";
    assert_eq!(
        KeyRing::from_env(var).unwrap_err(),
        KeyRingError::Env {
            var: var.into(),
            reason: "is not set"
        }
    );
    // The only test of this binary that touches the environment, and with
    // a variable of its own.
    std::env::set_var(var, format!("7:{}", base64(&KEY_1)));
    let ring = KeyRing::from_env(var).expect("a ring");
    std::env::set_var(var, "7:AAAA");
    let short = KeyRing::from_env(var).unwrap_err();
    std::env::remove_var(var);
    assert_eq!(
        (ring.ids().collect::<Vec<_>>(), ring.writer_id()),
        (vec![7], 7)
    );
    assert_eq!(short, KeyRingError::KeyLength { id: 7, len: 3 });
    assert_eq!(short.to_string(), "key 7 is 3 bytes; a key is 32 bytes");
    // The ring reads what a ring of the same key writes.
    let bytes =
        Codec::<u8>::encode(&Encrypted::new(JsonCodec, KeyRing::new(7, &KEY_1)), "k", &5).unwrap();
    assert_eq!(
        Codec::<u8>::decode(&Encrypted::new(JsonCodec, ring), "k", &bytes).unwrap(),
        5
    );
}

#[test]
fn debug_and_errors_never_show_key_material() {
    let key = [0xAB; KEY_LEN];
    let codec = Encrypted::new(
        JsonCodec,
        KeyRing::new(5, &key).with_key(6, &KEY_2).unwrap(),
    );
    let shown = format!("{codec:?} {:#?}", codec.key_ring());
    assert_eq!(
        format!("{:?}", codec.key_ring()),
        "KeyRing { ids: [5, 6], writer: 6 }"
    );
    for needle in ["171", "ab", "AB", "34", "22", &base64(&key)[..8]] {
        assert!(!shown.contains(needle), "{needle:?} in {shown}");
    }
    // An error about a bad list names the entry, not its text.
    let list = format!("5:{}!", base64(&key));
    let error = KeyRing::parse(&list).unwrap_err().to_string();
    assert!(!error.contains(&base64(&key)[..8]), "{error}");
}

/// Regression: a value that decrypted but did not decode (read as another
/// type) gave an error quoting the plaintext (serde_json's `invalid type:
/// string "…"`), which every unreadable value writes to the logs. The
/// inner error stays reachable as the source.
#[test]
fn a_value_that_decrypts_but_does_not_decode_is_not_quoted_in_the_error() {
    let secret = "4111-1111-1111-1111".to_string();
    let plain = Encrypted::new(JsonCodec, ring_1());
    let both = Encrypted::new(Compressed::new(JsonCodec).threshold(0), ring_1());
    let plain_bytes = Codec::<String>::encode(&plain, "ns:{k}", &secret).unwrap();
    let both_bytes = Codec::<String>::encode(&both, "ns:{k}", &secret).unwrap();
    for error in [
        Codec::<u64>::decode(&plain, "ns:{k}", &plain_bytes).unwrap_err(),
        Codec::<u64>::check_round_trip(&plain, "ns:{k}", &plain_bytes).unwrap_err(),
        Codec::<u64>::decode(&both, "ns:{k}", &both_bytes).unwrap_err(),
        Codec::<u64>::check_round_trip(&both, "ns:{k}", &both_bytes).unwrap_err(),
    ] {
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains("4111"), "plaintext in {shown}");
        let source = std::error::Error::source(error.get_ref()).expect("a source");
        assert!(
            source.to_string().contains("4111"),
            "the inner error is the source: {source}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn small_values_are_stored_as_they_are_and_large_ones_compressed() {
    let _limit = time_limit(LIMIT);
    let store = MemoryBackend::new();
    let c = cache(&store, "thr", Compressed::new(JsonCodec));
    let small = "x".repeat(900);
    let large = records(4 * 1024);
    // Large but incompressible: lz4 would not make it smaller.
    let noise = noise(2000);
    for (key, value) in [("small", &small), ("large", &large), ("noise", &noise)] {
        c.set(&key.to_string(), value.clone()).await.expect("set");
        assert_eq!(&hit(&c, key).await, value);
    }
    let json = |v: &String| serde_json::to_vec(v).unwrap();
    let (small_stored, _) = stored(&store, "thr", "small");
    assert_eq!(small_stored[0], 0, "stored as it is");
    assert_eq!(small_stored[1..], json(&small)[..]);
    let (large_stored, _) = stored(&store, "thr", "large");
    assert_eq!(large_stored[0], 1, "compressed");
    assert!(large_stored.len() * 4 < json(&large).len());
    let (noise_stored, _) = stored(&store, "thr", "noise");
    assert_eq!(
        (noise_stored[0], noise_stored.len()),
        (0, 1 + json(&noise).len())
    );

    // The threshold is the codec's to choose.
    let all = Compressed::new(JsonCodec).threshold(0);
    assert_eq!(Codec::<String>::encode(&all, "k", &small).unwrap()[0], 1);
}

/// A stored value that claims to decompress to 4 GiB, or that does not
/// decompress to what it claims, is a miss (counted), never an allocation
/// of its claim, nor a panic.
#[tokio::test(start_paused = true)]
async fn a_decompression_bomb_is_an_unreadable_value() {
    let _limit = time_limit(LIMIT);
    let codec = Compressed::new(JsonCodec).max_decompressed_bytes(1 << 20);
    let value = records(8 * 1024);
    let good = Codec::<String>::encode(&codec, "k", &value).unwrap();
    assert_eq!(good[0], 1);
    let claim = |len: u32| {
        let mut bytes = good.clone();
        bytes[1..5].copy_from_slice(&len.to_le_bytes());
        bytes
    };
    let real = u32::from_le_bytes(good[1..5].try_into().unwrap());
    let bombs = [
        claim(u32::MAX),
        claim((1 << 20) + 1),
        claim(real - 1),
        claim(real + 1),
        vec![1, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF],
        vec![1, 0, 1],
        vec![2, b'"', b'"'],
        Vec::new(),
    ];
    for bomb in &bombs {
        assert!(
            Codec::<String>::decode(&codec, "k", bomb).is_err(),
            "{bomb:?}"
        );
    }
    // A real value over the reader's bound is refused too.
    let larger = Compressed::new(JsonCodec);
    let big = Codec::<String>::encode(&larger, "k", &records(2 << 20)).unwrap();
    assert!(big.len() < 1 << 20 && big[0] == 1, "{} bytes", big.len());
    assert!(Codec::<String>::decode(&larger, "k", &big).is_ok());
    let err = Codec::<String>::decode(&codec, "k", &big).unwrap_err();
    assert!(err.to_string().contains("over the limit"), "{err}");
    // Over the bound, a value is refused when written.
    let huge = records(2 << 20);
    let err = Codec::<String>::encode(&codec, "k", &huge).unwrap_err();
    assert!(err.to_string().contains("max_decompressed_bytes"), "{err}");

    // Through a cache: a miss, counted, and one load.
    let store = MemoryBackend::new();
    let c = cache(&store, "bomb", codec);
    c.set(&"k".to_string(), value).await.expect("set");
    let (_, whole) = stored(&store, "bomb", "k");
    let mut bomb = whole[..ENVELOPE_HEADER].to_vec();
    bomb.extend_from_slice(&claim(u32::MAX));
    store.put_raw(
        FillKeys::new("bomb", "k").value(),
        &bomb,
        Duration::from_secs(60),
    );
    let origin = Origin::default();
    let results = herd(
        &[CacheUnderTest::new(c.clone(), false)],
        10,
        "k",
        &origin,
        Duration::from_millis(100),
        CallOptions::new(),
    )
    .await;
    assert!(results
        .iter()
        .all(|r| r.as_ref().expect("an answer").value == "k-v1"));
    assert_eq!((origin.count(), c.stats().decode_errors), (1, 1));
}

proptest! {
    /// Whatever the store holds, decoding returns (an error, mostly); it
    /// never panics.
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256), tag in 0u8..3) {
        let mut bytes = bytes;
        if let Some(first) = bytes.first_mut() {
            *first = tag;
        }
        let _ = Codec::<String>::decode(&Compressed::new(JsonCodec), "k", &bytes);
        let _ = Codec::<String>::decode(&Encrypted::new(JsonCodec, ring_1()), "k", &bytes);
        let both = Encrypted::new(Compressed::new(JsonCodec), ring_1());
        let _ = Codec::<String>::decode(&both, "k", &bytes);
        // Past the header's checks: version 1, a key the ring holds.
        let mut sealed = vec![1, 0, 0, 0, 1];
        sealed.extend_from_slice(&bytes);
        prop_assert!(Codec::<String>::decode(&both, "k", &sealed).is_err());
    }
}

type Stack = Box<dyn Codec<Vec<String>>>;

/// Every stack of the wrappers over both serde codecs, the orders that make
/// no sense included (`Compressed<Encrypted<_>>`, a wrapper twice).
fn every_stack() -> Vec<(&'static str, Stack)> {
    use onefill::PostcardCodec;
    vec![
        ("C<J>", Box::new(Compressed::new(JsonCodec).threshold(0))),
        (
            "C<P>",
            Box::new(Compressed::new(PostcardCodec).threshold(0)),
        ),
        ("E<P>", Box::new(Encrypted::new(PostcardCodec, ring_1()))),
        (
            "E<C<P>>",
            Box::new(Encrypted::new(
                Compressed::new(PostcardCodec).threshold(0),
                ring_1(),
            )),
        ),
        (
            "C<E<J>>",
            Box::new(Compressed::new(Encrypted::new(JsonCodec, ring_1())).threshold(0)),
        ),
        (
            "C<C<P>>",
            Box::new(Compressed::new(Compressed::new(PostcardCodec).threshold(0)).threshold(0)),
        ),
        (
            "E<E<J>>",
            Box::new(Encrypted::new(
                Encrypted::new(JsonCodec, ring_1()),
                ring_2(),
            )),
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Every stack reads back what it wrote, and decodes its own bytes
    /// changed in one byte, cut short, or replaced by junk without a panic.
    #[test]
    fn every_stack_round_trips_and_survives_changed_bytes(
        value in proptest::collection::vec(".{0,40}", 0..60),
        junk in proptest::collection::vec(any::<u8>(), 0..200),
        at in any::<usize>(),
        flip in 1u8..,
    ) {
        for (name, codec) in every_stack() {
            let bytes = codec.encode("ns:{k}", &value).unwrap();
            prop_assert_eq!(&codec.decode("ns:{k}", &bytes).unwrap(), &value, "{}", name);
            prop_assert!(codec.check_round_trip("ns:{k}", &bytes).is_ok(), "{}", name);
            let mut changed = bytes.clone();
            changed[at % bytes.len()] ^= flip;
            let _ = codec.decode("ns:{k}", &changed);
            // Every header cut short, and one cut anywhere.
            for cut in (0..bytes.len().min(48)).chain([at % bytes.len()]) {
                let _ = codec.decode("ns:{k}", &bytes[..cut]);
            }
            let _ = codec.decode("ns:{k}", &junk);
        }
    }
}

/// `len` printable characters without repeats for lz4 to find (SplitMix64).
fn noise(len: usize) -> String {
    let mut state = 0x5EED_u64;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            char::from(b'0' + ((z ^ (z >> 31)) % 64) as u8)
        })
        .collect()
}

fn base64(bytes: &[u8]) -> String {
    // The standard alphabet with padding, written out so the test does not
    // depend on the library's own decoder to make its input.
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
