//! The hit path against its anchors (moka, a raw `GET`), in one run.
//!
//! ```sh
//! cargo bench -p onefill --bench hit_path                      # everything (about 6 min once built)
//! cargo bench -p onefill --bench hit_path -- hit/sequential/   # a group, by criterion filter
//! ```
//!
//! As a request handler calls a cache: a 2-worker multi-threaded tokio
//! runtime, the calls made from inside spawned tasks (awaiting from
//! `block_on` would add a cross-thread wake-up per call), 1,000 warm keys
//! cycled, 150-byte `String` values, `get_or_load` for onefill (whose loader
//! never runs once the keys are warm: checked after each group).
//!
//! - `hit/sequential/*`: one task calls N times in a row; criterion reports
//!   the time per hit.
//!   - `moka_future_get`: `moka::future::Cache::get`, the L1's anchor;
//!   - `onefill_l1_hit`: the embedded backend with `.l1(L1::new(10_000))`
//!     (target: at most 1.5 × moka's time);
//!   - `onefill_embedded_hit`: the embedded backend as a cache is built by
//!     default, with its L1 (at most 2 × moka's time);
//!   - `redis_raw_get`: a raw `GET` of the stored bytes on a redis-rs
//!     `ConnectionManager`, the Redis hit's anchor;
//!   - `redis_raw_get_pttl`: the same connection, a pipelined `GET` +
//!     `PTTL`: what onefill's Redis hit sends (not an anchor: it tells the
//!     protocol's share of the gap from the cache's);
//!   - `onefill_redis_hit`: a `RedisBackend` on the same private
//!     `redis-server`, no L1 (at most 1.1 × the raw `GET`'s time).
//! - `hit/concurrent/*`: the same six, 64 tasks over the same 1,000 keys
//!   (each starting at its own offset), 100 hits per task per iteration;
//!   criterion reports hits per second (targets: the L1 at least 0.5 ×
//!   moka's, Redis at least 0.8 × the raw `GET`'s).
//! - `l1_store/*`: the L1's store candidates (decision 0008), holding what
//!   the L1 holds (a 150-byte value and its deadlines) for the same keys:
//!   `moka::sync::Cache::get` (std's SipHash, and ahash), and
//!   `quick_cache::sync::Cache::get` (ahash, its default); `single/*` on one
//!   thread, `tasks64/*` as 64 tasks on the runtime (hits per second).
//! - `codec/*`: the codec wrappers (`Encrypted`, `Compressed`, both) against
//!   `JsonCodec` on Redis hits that decode, 150 B and 16 KiB values, and
//!   each codec alone in memory (see `hit_path/codecs.rs`).
//!
//! The Redis functions are skipped (with a note) if `redis-server` is not
//! on the `PATH`; the server is private (a free port, never the machine's
//! 6379). Defaults: 20 samples, 1 s warm-up, 3 s measurement
//! (`--warm-up-time`, `--measurement-time`, `--sample-size` override them).
//! Under `cargo test --benches` criterion runs each function once.

use std::future::Future;
use std::hint::black_box;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode, Throughput,
};
use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::{Backend, Cache, MemoryBackend, L1};
use onefill_testkit::RedisServer;
use redis::aio::ConnectionManager;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

// In a folder of its own so Cargo does not take it for a bench target.
#[path = "hit_path/codecs.rs"]
mod codecs;

/// Warm keys, cycled.
const KEYS: usize = 1_000;
/// The size of every value.
const VALUE_BYTES: usize = 150;
/// The concurrent groups' tasks.
const TASKS: usize = 64;
/// Hits per task per iteration in the concurrent groups.
const HITS_PER_TASK: u64 = 100;
/// The L1's (and the stores') capacity.
const CAPACITY: usize = 10_000;
/// onefill's namespace (the Redis keys are `hit:{key-…}`).
const NAMESPACE: &str = "hit";

type StrCache = Cache<String, String>;

/// Loader calls, for every cache of the run: none once warm.
static LOADS: AtomicU64 = AtomicU64::new(0);

/// The 1,000 keys.
fn keys() -> Arc<[String]> {
    (0..KEYS).map(|i| format!("key-{i:04}")).collect()
}

/// `key`'s value: 150 bytes.
fn value_of(key: &str) -> String {
    let mut value = format!("value of {key}:");
    value.extend(std::iter::repeat_n('v', VALUE_BYTES - value.len()));
    value
}

/// The loader: counts its calls (a plain function, so a call captures
/// nothing and allocates nothing for it).
async fn loader(key: String) -> Result<String, io::Error> {
    LOADS.fetch_add(1, Ordering::Relaxed);
    Ok(value_of(&key))
}

/// The runtime every benchmark runs on.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Something that answers the warm keys.
trait Subject: Clone + Send + Sync + 'static {
    /// The size of the answer for the key at position `at` of [`keys`]
    /// (checked to be a whole value).
    fn hit(&mut self, at: usize) -> impl Future<Output = usize> + Send;
}

#[derive(Clone)]
struct Moka {
    cache: moka::future::Cache<String, String>,
    keys: Arc<[String]>,
}

impl Subject for Moka {
    async fn hit(&mut self, at: usize) -> usize {
        let value = self.cache.get(&self.keys[at]).await.expect("a warm key");
        value.len()
    }
}

#[derive(Clone)]
struct Onefill {
    cache: StrCache,
    keys: Arc<[String]>,
}

impl Subject for Onefill {
    async fn hit(&mut self, at: usize) -> usize {
        let value = self
            .cache
            .get_or_load(&self.keys[at], loader)
            .await
            .expect("a hit");
        value.len()
    }
}

/// A raw `GET` of the value key onefill stored (the envelope's bytes); with
/// `pttl`, a pipelined `GET` + `PTTL`, what onefill's Redis hit sends (to
/// tell the cost of the protocol from the cost of the cache).
#[derive(Clone)]
struct RawGet {
    conn: ConnectionManager,
    /// [`FillKeys::value`] of each key.
    value_keys: Arc<[String]>,
    pttl: bool,
}

impl Subject for RawGet {
    async fn hit(&mut self, at: usize) -> usize {
        let key = &self.value_keys[at];
        let bytes: Vec<u8> = if self.pttl {
            let (bytes, pttl): (Vec<u8>, i64) = redis::pipe()
                .cmd("GET")
                .arg(key)
                .cmd("PTTL")
                .arg(key)
                .query_async(&mut self.conn)
                .await
                .expect("GET + PTTL");
            assert!(pttl > 0, "the warm key has no TTL");
            bytes
        } else {
            redis::cmd("GET")
                .arg(key)
                .query_async(&mut self.conn)
                .await
                .expect("GET")
        };
        assert!(bytes.len() > VALUE_BYTES, "the warm key is gone");
        bytes.len()
    }
}

/// How a group calls its subjects.
#[derive(Clone, Copy)]
enum Mode {
    /// One task, `iters` calls in a row.
    Sequential,
    /// 64 tasks, `iters × 100` calls each.
    Concurrent,
}

/// One task calls `subject` `iters` times over the keys in turn; the time it
/// took, measured inside the task.
fn sequential<S: Subject>(rt: &Runtime, subject: &S, iters: u64) -> Duration {
    let mut subject = subject.clone();
    let task = rt.spawn(async move {
        let mut at = 0;
        let start = Instant::now();
        for _ in 0..iters {
            black_box(subject.hit(at).await);
            at += 1;
            if at == KEYS {
                at = 0;
            }
        }
        start.elapsed()
    });
    rt.block_on(task).expect("the benchmark task")
}

/// 64 tasks call `subject` `iters × 100` times each, over the keys in turn
/// from their own offsets; the time until the last one finished, measured
/// by the task that spawned them.
fn concurrent<S: Subject>(rt: &Runtime, subject: &S, iters: u64) -> Duration {
    let subject = subject.clone();
    let driver = rt.spawn(async move {
        let start = Instant::now();
        let mut tasks = JoinSet::new();
        for t in 0..TASKS {
            let mut subject = subject.clone();
            tasks.spawn(async move {
                let mut at = t * KEYS / TASKS;
                for _ in 0..iters * HITS_PER_TASK {
                    black_box(subject.hit(at).await);
                    at += 1;
                    if at == KEYS {
                        at = 0;
                    }
                }
            });
        }
        tasks.join_all().await;
        start.elapsed()
    });
    rt.block_on(driver).expect("the benchmark task")
}

fn bench<S: Subject>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    mode: Mode,
    name: &str,
    rt: &Runtime,
    subject: &S,
) {
    group.bench_function(name, |b| {
        b.iter_custom(|iters| match mode {
            Mode::Sequential => sequential(rt, subject, iters),
            Mode::Concurrent => concurrent(rt, subject, iters),
        });
    });
}

/// The subjects, warm.
struct Subjects {
    moka: Moka,
    l1: Onefill,
    embedded: Onefill,
    /// `None` without `redis-server`.
    redis: Option<(RawGet, Onefill)>,
    /// Dropped last (kills the server).
    _server: Option<RedisServer>,
}

fn onefill_cache(backend: impl Backend, l1: bool) -> StrCache {
    let builder = Cache::builder()
        .namespace(NAMESPACE)
        .backend(backend)
        .ttl(Duration::from_secs(3600));
    let builder = if l1 {
        builder.l1(L1::new(CAPACITY))
    } else {
        builder
    };
    builder.build().expect("valid options")
}

/// Loads every key into `cache` (1,000 loads), then makes passes over the
/// keys until one is all hits (all L1 hits if it has an L1): no pass loads.
async fn warm(cache: &StrCache, keys: &[String], l1: bool) {
    for key in keys {
        cache.get_or_load(key, loader).await.expect("a load");
    }
    let loads = LOADS.load(Ordering::Relaxed);
    for pass in 1.. {
        let before = cache.stats();
        for key in keys {
            let value = cache.get_or_load(key, loader).await.expect("a hit");
            assert_eq!(value, value_of(key));
        }
        assert_eq!(LOADS.load(Ordering::Relaxed), loads, "pass {pass} loaded");
        let after = cache.stats();
        // The embedded backend has an L1 by default: its hits count in
        // `l1_hits` too.
        let hits = if l1 {
            after.l1_hits - before.l1_hits
        } else {
            (after.hits + after.l1_hits) - (before.hits + before.l1_hits)
        };
        if hits == KEYS as u64 {
            if pass > 1 {
                eprintln!("warm-up: pass {pass} after the loads was the first all hits: {after:?}");
            }
            return;
        }
        assert!(pass < 5, "{pass} passes and still not all hits: {after:?}");
    }
}

fn redis_available() -> bool {
    let found = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        eprintln!("redis-server is not on the PATH: skipping the Redis benchmarks");
    }
    found
}

fn subjects(rt: &Runtime, keys: &Arc<[String]>) -> Subjects {
    let server = redis_available().then(RedisServer::start);
    rt.block_on(async {
        let moka = moka::future::Cache::new(CAPACITY as u64);
        for key in keys.iter() {
            moka.insert(key.clone(), value_of(key)).await;
        }
        let onefill = |cache| Onefill {
            cache,
            keys: keys.clone(),
        };
        let l1 = onefill_cache(MemoryBackend::new(), true);
        warm(&l1, keys, true).await;
        let embedded = onefill_cache(MemoryBackend::new(), false);
        warm(&embedded, keys, false).await;
        let redis = match &server {
            Some(server) => {
                let url = server.url();
                let backend = RedisBackend::connect(&url).await.expect("a RedisBackend");
                // No L1: a Redis cache has one by default, and its hits
                // would never reach Redis.
                let cache = Cache::builder()
                    .namespace(NAMESPACE)
                    .backend(backend)
                    .ttl(Duration::from_secs(3600))
                    .no_l1()
                    .build()
                    .expect("valid options");
                warm(&cache, keys, false).await;
                let client = redis::Client::open(url.as_str()).expect("a redis URL");
                let conn = ConnectionManager::new(client)
                    .await
                    .expect("a ConnectionManager");
                let raw = RawGet {
                    conn,
                    value_keys: keys
                        .iter()
                        .map(|k| FillKeys::new(NAMESPACE, k).value().to_owned())
                        .collect(),
                    pttl: false,
                };
                Some((raw, onefill(cache)))
            }
            None => None,
        };
        Subjects {
            moka: Moka {
                cache: moka,
                keys: keys.clone(),
            },
            l1: onefill(l1),
            embedded: onefill(embedded),
            redis,
            _server: server,
        }
    })
}

impl Subjects {
    fn bench(&self, group: &mut BenchmarkGroup<'_, WallTime>, mode: Mode, rt: &Runtime) {
        bench(group, mode, "moka_future_get", rt, &self.moka);
        bench(group, mode, "onefill_l1_hit", rt, &self.l1);
        bench(group, mode, "onefill_embedded_hit", rt, &self.embedded);
        if let Some((raw_get, redis)) = &self.redis {
            bench(group, mode, "redis_raw_get", rt, raw_get);
            let get_pttl = RawGet {
                pttl: true,
                ..raw_get.clone()
            };
            bench(group, mode, "redis_raw_get_pttl", rt, &get_pttl);
            bench(group, mode, "onefill_redis_hit", rt, redis);
        }
    }

    /// No loader ran since the warm-up, and every onefill call was a hit
    /// (of the L1 for the L1's cache).
    fn check(&self, loads_when_warm: u64) {
        assert_eq!(
            LOADS.load(Ordering::Relaxed),
            loads_when_warm,
            "a loader ran on a warm key"
        );
        let l1 = self.l1.cache.stats();
        assert_eq!(l1.loads_ok, KEYS as u64, "{l1:?}");
        assert!(l1.l1_hits >= KEYS as u64, "{l1:?}");
        for cache in std::iter::once(&self.embedded).chain(self.redis.as_ref().map(|(_, c)| c)) {
            let stats = cache.cache.stats();
            assert_eq!(stats.loads_ok, KEYS as u64, "{stats:?}");
        }
    }
}

fn hit(c: &mut Criterion) {
    let rt = runtime();
    let keys = keys();
    let subjects = subjects(&rt, &keys);
    let loads_when_warm = LOADS.load(Ordering::Relaxed);

    let mut group = c.benchmark_group("hit/sequential");
    subjects.bench(&mut group, Mode::Sequential, &rt);
    group.finish();
    subjects.check(loads_when_warm);

    let mut group = c.benchmark_group("hit/concurrent");
    concurrent_group(&mut group);
    subjects.bench(&mut group, Mode::Concurrent, &rt);
    group.finish();
    subjects.check(loads_when_warm);

    for (name, cache) in [("l1", &subjects.l1), ("embedded", &subjects.embedded)]
        .into_iter()
        .chain(subjects.redis.as_ref().map(|(_, c)| ("redis", c)))
    {
        let stats = cache.cache.stats();
        eprintln!(
            "onefill {name}: {} loads (the warm-up's), {} hits, {} L1 hits",
            stats.loads_ok, stats.hits, stats.l1_hits
        );
    }
    drop(subjects);
    drop(rt);
}

/// Hits per second, each sample the same number of iterations (one
/// iteration of 6,400 Redis hits takes tens of ms: linear sampling would
/// need far more than the measurement time).
fn concurrent_group(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .throughput(Throughput::Elements(TASKS as u64 * HITS_PER_TASK))
        .sampling_mode(SamplingMode::Flat);
}

/// What the L1's store holds per key: a value and its deadlines.
#[derive(Clone)]
struct StoreEntry {
    value: Option<String>,
    fresh_until: tokio::time::Instant,
    refresh_at: tokio::time::Instant,
    expires_at: tokio::time::Instant,
    weight: u32,
}

fn store_entry(key: &str) -> StoreEntry {
    let far = tokio::time::Instant::now() + Duration::from_secs(3600);
    StoreEntry {
        value: Some(value_of(key)),
        fresh_until: far,
        refresh_at: far,
        expires_at: far,
        weight: 1,
    }
}

fn entry_len(entry: Option<StoreEntry>) -> usize {
    let entry = entry.expect("a warm key");
    black_box((
        &entry.fresh_until,
        &entry.refresh_at,
        &entry.expires_at,
        &entry.weight,
    ));
    entry.value.map_or(0, |v| v.len())
}

/// The L1's weigher: one per entry unless bounded by bytes.
#[derive(Clone)]
struct Weigher {
    by_bytes: bool,
}

impl quick_cache::Weighter<String, StoreEntry> for Weigher {
    fn weight(&self, key: &String, entry: &StoreEntry) -> u64 {
        if self.by_bytes {
            u64::from(entry.weight) + key.len() as u64
        } else {
            1
        }
    }
}

type QuickCache = quick_cache::sync::Cache<String, StoreEntry, Weigher>;

#[derive(Clone)]
struct MokaSync<S> {
    cache: moka::sync::Cache<String, StoreEntry, S>,
    keys: Arc<[String]>,
}

impl<S> Subject for MokaSync<S>
where
    S: std::hash::BuildHasher + Clone + Send + Sync + 'static,
{
    async fn hit(&mut self, at: usize) -> usize {
        entry_len(self.cache.get(&self.keys[at]))
    }
}

#[derive(Clone)]
struct Quick {
    cache: Arc<QuickCache>,
    keys: Arc<[String]>,
}

impl Subject for Quick {
    async fn hit(&mut self, at: usize) -> usize {
        entry_len(self.cache.get(&self.keys[at]))
    }
}

/// `iters` gets on this thread, over the keys in turn.
fn single_thread(iters: u64, keys: &[String], mut get: impl FnMut(&String) -> usize) -> Duration {
    let mut at = 0;
    let start = Instant::now();
    for _ in 0..iters {
        black_box(get(&keys[at]));
        at += 1;
        if at == KEYS {
            at = 0;
        }
    }
    start.elapsed()
}

fn l1_store(c: &mut Criterion) {
    let rt = runtime();
    let keys = keys();
    let moka_std = moka::sync::Cache::new(CAPACITY as u64);
    let moka_ahash = moka::sync::Cache::builder()
        .max_capacity(CAPACITY as u64)
        .build_with_hasher(ahash::RandomState::new());
    // As the L1 builds it (`L1::new(10_000)`): 10,000 entries of weight 1.
    let quick: QuickCache =
        QuickCache::with_weighter(CAPACITY, CAPACITY as u64, Weigher { by_bytes: false });
    for key in keys.iter() {
        moka_std.insert(key.clone(), store_entry(key));
        moka_ahash.insert(key.clone(), store_entry(key));
        quick.insert(key.clone(), store_entry(key));
    }
    // Let moka apply its pending writes (it does so on later calls anyway).
    moka_std.run_pending_tasks();
    moka_ahash.run_pending_tasks();
    for key in keys.iter() {
        assert!(moka_std.get(key).is_some() && moka_ahash.get(key).is_some());
        assert!(quick.get(key).is_some());
    }

    let mut group = c.benchmark_group("l1_store/single");
    group.bench_function("moka_sync_get", |b| {
        b.iter_custom(|iters| single_thread(iters, &keys, |k| entry_len(moka_std.get(k))));
    });
    group.bench_function("moka_sync_get_ahash", |b| {
        b.iter_custom(|iters| single_thread(iters, &keys, |k| entry_len(moka_ahash.get(k))));
    });
    group.bench_function("quick_cache_get", |b| {
        b.iter_custom(|iters| single_thread(iters, &keys, |k| entry_len(quick.get(k))));
    });
    group.finish();

    let mut group = c.benchmark_group("l1_store/tasks64");
    concurrent_group(&mut group);
    let mode = Mode::Concurrent;
    let moka_std = MokaSync {
        cache: moka_std,
        keys: keys.clone(),
    };
    bench(&mut group, mode, "moka_sync_get", &rt, &moka_std);
    let moka_ahash = MokaSync {
        cache: moka_ahash,
        keys: keys.clone(),
    };
    bench(&mut group, mode, "moka_sync_get_ahash", &rt, &moka_ahash);
    let quick = Quick {
        cache: Arc::new(quick),
        keys: keys.clone(),
    };
    bench(&mut group, mode, "quick_cache_get", &rt, &quick);
    group.finish();
    // Every get was a hit (`entry_len` checks it): nothing was evicted.
    assert_eq!(moka_std.cache.entry_count(), KEYS as u64);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = hit, l1_store, codecs::redis_hits, codecs::in_memory
}
criterion_main!(benches);
