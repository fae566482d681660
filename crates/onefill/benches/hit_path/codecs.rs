//! `codec/*`: what the codec wrappers cost a hit that decodes.
//!
//! - `codec/redis_hit/{sequential,concurrent}/{codec}/{size}`: Redis hits
//!   with no L1, so the codec decodes on every hit, side by side for
//!   `json` (`JsonCodec`), `encrypted` (`Encrypted<JsonCodec>`),
//!   `compressed` (`Compressed<JsonCodec>`, 1 KiB threshold) and
//!   `encrypted_compressed` (`Encrypted<Compressed<JsonCodec>>`), for a
//!   150-byte `String` (`150B`: under the threshold, stored as it is) and
//!   about 16 KiB of JSON records (`16KiB`: repetitive, so it compresses).
//!   Same runtime, keys and modes as `hit/*`; each cache has a namespace
//!   of its own on the same private server. The bytes each codec stores
//!   (envelope included) are printed once warm.
//! - `codec/{encode,decode}/{codec}/{size}`: the codecs alone, in memory
//!   (no backend), one value at a time.

use std::hint::black_box;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use criterion::Criterion;
use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::{Cache, Codec, Compressed, Encrypted, JsonCodec, KeyRing};
use onefill_testkit::RedisServer;
use redis::aio::ConnectionManager;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{
    bench, concurrent_group, keys, redis_available, runtime, value_of, warm, Mode, Onefill,
    Subject, KEYS, LOADS,
};

/// One record of the 16 KiB value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Record {
    id: u64,
    name: String,
    email: String,
    plan: String,
    active: bool,
}

/// About 16 KiB of JSON.
const RECORDS: usize = 180;

/// `key`'s large value: records that differ in their numbers only, as rows
/// of one table do.
fn records_of(key: &str) -> Vec<Record> {
    (0..RECORDS as u64)
        .map(|id| Record {
            id,
            name: format!("{key} user {id}"),
            email: format!("user{id}@example.com"),
            plan: "standard".to_owned(),
            active: id % 3 != 0,
        })
        .collect()
}

async fn records_loader(key: String) -> Result<Vec<Record>, io::Error> {
    LOADS.fetch_add(1, Ordering::Relaxed);
    Ok(records_of(&key))
}

/// The codecs compared, by name.
#[derive(Clone, Copy)]
enum Which {
    Json,
    Encrypted,
    Compressed,
    EncryptedCompressed,
}

const CODECS: [(Which, &str); 4] = [
    (Which::Json, "json"),
    (Which::Encrypted, "encrypted"),
    (Which::Compressed, "compressed"),
    (Which::EncryptedCompressed, "encrypted_compressed"),
];

fn ring() -> KeyRing {
    KeyRing::new(1, &[7; 32])
}

/// The codec `which` for values `V`.
fn codec<V: Serialize + DeserializeOwned + 'static>(which: Which) -> Box<dyn Codec<V>> {
    match which {
        Which::Json => Box::new(JsonCodec),
        Which::Encrypted => Box::new(Encrypted::new(JsonCodec, ring())),
        Which::Compressed => Box::new(Compressed::new(JsonCodec)),
        Which::EncryptedCompressed => Box::new(Encrypted::new(Compressed::new(JsonCodec), ring())),
    }
}

/// A boxed codec, as the builder takes one.
struct Boxed<V>(Box<dyn Codec<V>>);

impl<V: 'static> Codec<V> for Boxed<V> {
    fn encode(&self, key: &str, value: &V) -> Result<Vec<u8>, onefill::CodecError> {
        self.0.encode(key, value)
    }
    fn decode(&self, key: &str, bytes: &[u8]) -> Result<V, onefill::CodecError> {
        self.0.decode(key, bytes)
    }
    fn check_round_trip(&self, key: &str, bytes: &[u8]) -> Result<(), onefill::CodecError> {
        self.0.check_round_trip(key, bytes)
    }
}

fn redis_cache<V>(backend: &RedisBackend, namespace: &str, which: Which) -> Cache<String, V>
where
    V: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
{
    Cache::builder()
        .namespace(namespace)
        .backend(backend.clone())
        .ttl(Duration::from_secs(3600))
        .codec(Boxed(codec::<V>(which)))
        .build()
        .expect("valid options")
}

#[derive(Clone)]
struct Large {
    cache: Cache<String, Vec<Record>>,
    keys: Arc<[String]>,
}

impl Subject for Large {
    async fn hit(&mut self, at: usize) -> usize {
        let value = self
            .cache
            .get_or_load(&self.keys[at], records_loader)
            .await
            .expect("a hit");
        value.len()
    }
}

/// Loads every key, then checks one pass is all hits.
async fn warm_large(cache: &Cache<String, Vec<Record>>, keys: &[String]) {
    for key in keys {
        cache
            .get_or_load(key, records_loader)
            .await
            .expect("a load");
    }
    let loads = LOADS.load(Ordering::Relaxed);
    for key in keys {
        let value = cache.get_or_load(key, records_loader).await.expect("a hit");
        assert_eq!(value, records_of(key));
    }
    assert_eq!(LOADS.load(Ordering::Relaxed), loads, "a warm pass loaded");
}

/// The length of what the server holds for `key` in `namespace`.
async fn stored_len(conn: &mut ConnectionManager, namespace: &str, key: &str) -> usize {
    redis::cmd("STRLEN")
        .arg(FillKeys::new(namespace, key).value())
        .query_async(conn)
        .await
        .expect("STRLEN")
}

/// Redis hits per codec and size; see the module docs.
pub fn redis_hits(c: &mut Criterion) {
    if !redis_available() {
        return;
    }
    let server = RedisServer::start();
    let rt = runtime();
    let keys = keys();
    let (small, large) = rt.block_on(async {
        let backend = RedisBackend::connect(&server.url())
            .await
            .expect("a RedisBackend");
        let client = redis::Client::open(server.url().as_str()).expect("a redis URL");
        let mut conn = ConnectionManager::new(client)
            .await
            .expect("a ConnectionManager");
        let mut small = Vec::new();
        let mut large = Vec::new();
        for (which, name) in CODECS {
            let ns = format!("codec-{name}-small");
            let cache = redis_cache::<String>(&backend, &ns, which);
            warm(&cache, &keys, false).await;
            let small_len = stored_len(&mut conn, &ns, &keys[0]).await;
            small.push((name, Onefill {
                cache,
                keys: keys.clone(),
            }));
            let ns = format!("codec-{name}-large");
            let cache = redis_cache::<Vec<Record>>(&backend, &ns, which);
            warm_large(&cache, &keys).await;
            let large_len = stored_len(&mut conn, &ns, &keys[0]).await;
            eprintln!(
                "bytes stored (envelope included), {name}: 150B value {small_len}, 16KiB value {large_len}"
            );
            large.push((name, Large {
                cache,
                keys: keys.clone(),
            }));
        }
        let json_len = serde_json::to_vec(&records_of(&keys[0])).expect("JSON").len();
        eprintln!("the 16KiB value is {json_len} bytes of JSON");
        (small, large)
    });
    let loads_when_warm = LOADS.load(Ordering::Relaxed);

    for (mode, mode_name) in [
        (Mode::Sequential, "sequential"),
        (Mode::Concurrent, "concurrent"),
    ] {
        let mut group = c.benchmark_group(format!("codec/redis_hit/{mode_name}"));
        if let Mode::Concurrent = mode {
            concurrent_group(&mut group);
        }
        for (name, subject) in &small {
            bench(&mut group, mode, &format!("{name}/150B"), &rt, subject);
        }
        for (name, subject) in &large {
            bench(&mut group, mode, &format!("{name}/16KiB"), &rt, subject);
        }
        group.finish();
    }
    assert_eq!(
        LOADS.load(Ordering::Relaxed),
        loads_when_warm,
        "a loader ran on a warm key"
    );
    for (name, subject) in &small {
        let stats = subject.cache.stats();
        assert_eq!(
            (stats.loads_ok, stats.decode_errors),
            (KEYS as u64, 0),
            "{name}: {stats:?}"
        );
    }
    drop((small, large));
    drop(rt);
    drop(server);
}

/// Encode and decode alone, per codec and size.
pub fn in_memory(c: &mut Criterion) {
    let key = "codec:{key-0000}";
    let small = value_of("key-0000");
    let large = records_of("key-0000");
    let mut encode = c.benchmark_group("codec/encode");
    for (which, name) in CODECS {
        let small_codec = codec::<String>(which);
        encode.bench_function(format!("{name}/150B"), |b| {
            b.iter(|| small_codec.encode(key, black_box(&small)).expect("encode"));
        });
        let large_codec = codec::<Vec<Record>>(which);
        encode.bench_function(format!("{name}/16KiB"), |b| {
            b.iter(|| large_codec.encode(key, black_box(&large)).expect("encode"));
        });
    }
    encode.finish();
    let mut decode = c.benchmark_group("codec/decode");
    for (which, name) in CODECS {
        let small_codec = codec::<String>(which);
        let bytes = small_codec.encode(key, &small).expect("encode");
        decode.bench_function(format!("{name}/150B"), |b| {
            b.iter(|| small_codec.decode(key, black_box(&bytes)).expect("decode"));
        });
        let large_codec = codec::<Vec<Record>>(which);
        let bytes = large_codec.encode(key, &large).expect("encode");
        eprintln!("{name}: the 16KiB value encodes to {} bytes", bytes.len());
        decode.bench_function(format!("{name}/16KiB"), |b| {
            b.iter(|| large_codec.decode(key, black_box(&bytes)).expect("decode"));
        });
    }
    decode.finish();
}
