//! What a fill costs: the hit path, the wake-up of a waiter by the fill
//! notification, and coalescing a herd.
//!
//! ```sh
//! cargo bench -p onefill --bench fill              # everything (under a minute once built)
//! cargo bench -p onefill --bench fill -- hit/      # a subset, by criterion filter
//! ```
//!
//! - `hit/memory/*`: `get_or_load` of a warm key on the [`MemoryBackend`],
//!   against a raw [`Backend::get`] of the same key.
//! - `hit/redis/*`: the same on a private `redis-server` (started once for
//!   the run, never the machine's 6379), plus a raw `GET` of the stored
//!   bytes through a multiplexed connection of the `redis` crate. The design
//!   goal: an L2 hit costs about one round trip, like the raw `GET`.
//!   `backend_get_kept` is the read of a namespace an L1 keeps (what an L1
//!   miss sends): `GET` and `PTTL` pipelined, still one round trip.
//! - `notify_gap/redis`: two caches on two connections, a fresh cold key
//!   per iteration; A's loader sleeps 50 ms, B calls once A holds the lease.
//!   Each iteration measures the time from A's `get_or_load` returning to
//!   B's returning: about one round trip when the fill notification wakes B,
//!   a poll interval (20-500 ms) if it does not. A one-line summary (median,
//!   and how B re-checked) goes to stderr.
//! - `herd/memory`: 200 callers over 4 caches on one `MemoryBackend`, a fresh
//!   cold key per iteration and an instant loader: the cost of coalescing
//!   itself (one load per herd, also checked on stderr).
//!
//! Everything runs on a 2-worker multi-threaded tokio runtime, and the timed
//! callers are tasks on it, as a server's request handlers are. (Timing
//! calls made from `block_on` on criterion's own thread would add two
//! cross-thread wake-ups per call: the cache runs each flight in a spawned
//! task.)
//!
//! The Redis benchmarks are skipped (with a note) if `redis-server` is not
//! on the `PATH`. Under `cargo test --benches` criterion runs each benchmark
//! once, in well under a second.

use std::hint::black_box;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode};
use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::{Backend, Cache, MemoryBackend, Outcome, L1};
use onefill_testkit::RedisServer;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How long cache A's loader runs in the notification-gap benchmark.
const SLOW_LOAD: Duration = Duration::from_millis(50);
/// Callers of the herd, spread over this many caches.
const HERD_CALLERS: usize = 200;
const HERD_CACHES: usize = 4;

type StrCache = Cache<String, String>;

/// Times `iters` sequential runs of `$body` in a task spawned on `$rt`,
/// after moving clones of the listed variables into it.
macro_rules! in_task {
    ($rt:expr, $iters:expr, [$($var:ident),*], $body:expr) => {{
        $(
            #[allow(unused_mut)]
            let mut $var = $var.clone();
        )*
        let iters: u64 = $iters;
        let task = $rt.spawn(async move {
            let start = Instant::now();
            for _ in 0..iters {
                black_box($body);
            }
            start.elapsed()
        });
        $rt.block_on(task).expect("the benchmark task")
    }};
}

/// The runtime every benchmark runs on.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A small value (about 100 bytes once stored).
fn value() -> String {
    "x".repeat(64)
}

/// The loader of keys that are already warm (it still answers if not).
async fn warm_loader(_key: String) -> Result<String, io::Error> {
    Ok(value())
}

/// Short runs: 20 samples, 1 s warm-up, 3 s measurement.
fn quick(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
}

/// A fresh key for every call, so every iteration starts cold.
fn fresh_key(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A cache on `backend` holding the warm key `"warm"` for an hour.
fn warm_cache(rt: &Runtime, backend: impl Backend) -> StrCache {
    let cache: StrCache = Cache::builder()
        .namespace("bench")
        .backend(backend)
        .ttl(Duration::from_secs(3600))
        .build()
        .expect("valid options");
    rt.block_on(cache.get_or_load(&"warm".to_owned(), warm_loader))
        .expect("the warm-up load");
    cache
}

fn hit_memory(c: &mut Criterion) {
    let rt = runtime();
    let backend = MemoryBackend::new();
    let cache = warm_cache(&rt, backend.clone());
    let key = "warm".to_owned();
    let keys = FillKeys::new("bench", &key);

    let mut group = c.benchmark_group("hit/memory");
    quick(&mut group);
    bench_hit_pair(&mut group, &rt, &cache, &backend, &key, &keys);
    group.finish();
    assert_still_warm(&cache);
}

/// A warm `get_or_load` next to the backend's own `get` of the same key:
/// the difference is what the cache adds to a hit.
fn bench_hit_pair<B: Backend + Clone>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    cache: &Cache<String, String>,
    backend: &B,
    key: &str,
    keys: &FillKeys,
) {
    let key = key.to_owned();
    group.bench_function("get_or_load", |b| {
        b.iter_custom(|iters| {
            in_task!(rt, iters, [cache, key], {
                cache.get_or_load(&key, warm_loader).await.expect("a hit")
            })
        });
    });
    group.bench_function("backend_get", |b| {
        b.iter_custom(|iters| {
            in_task!(rt, iters, [backend, keys], {
                backend.get(&keys).await.expect("get").expect("warm")
            })
        });
    });
}

fn assert_still_warm(cache: &Cache<String, String>) {
    let stats = cache.stats();
    assert_eq!(
        stats.loads_ok, 1,
        "the warm key was loaded again: {stats:?}"
    );
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

fn on_redis(c: &mut Criterion) {
    if !redis_available() {
        return;
    }
    // One private server for the whole run, killed when dropped.
    let server = RedisServer::start();
    let url = server.url();
    let rt = runtime();
    hit_redis(c, &rt, &url);
    notify_gap(c, &rt, &url);
    drop(rt);
    drop(server);
}

fn hit_redis(c: &mut Criterion, rt: &Runtime, url: &str) {
    let (backend, raw) = rt.block_on(async {
        let backend = RedisBackend::connect(url).await.expect("a RedisBackend");
        let raw = redis::Client::open(url)
            .expect("a redis URL")
            .get_multiplexed_async_connection()
            .await
            .expect("a raw connection");
        (backend, raw)
    });
    let cache = warm_cache(rt, backend.clone());
    let key = "warm".to_owned();
    let keys = FillKeys::new("bench", &key);
    let mut get = redis::cmd("GET");
    get.arg(keys.value());

    // A backend with an L1 on the namespace reads its keys with the
    // pipelined GET + PTTL (so the L1's copy lives by the server's TTL):
    // the cost of an L1 miss, next to the one-GET read of `backend_get`.
    let kept = rt.block_on(async { RedisBackend::connect(url).await.expect("a RedisBackend") });
    let _l1_cache = {
        let _in_runtime = rt.enter();
        Cache::<String, String>::builder()
            .namespace("bench")
            .backend(kept.clone())
            .l1(L1::new(16))
            .build()
            .expect("a cache with an L1")
    };

    let mut group = c.benchmark_group("hit/redis");
    quick(&mut group);
    // backend_get is what the cache's hit path sends: one GET, the server's
    // clock telling that the value is fresh (a GET + PTTL until it does).
    bench_hit_pair(&mut group, rt, &cache, &backend, &key, &keys);
    group.bench_function("backend_get_kept", |b| {
        b.iter_custom(|iters| {
            in_task!(rt, iters, [kept, keys], {
                kept.get(&keys).await.expect("get").expect("warm")
            })
        });
    });
    group.bench_function("raw_get", |b| {
        b.iter_custom(|iters| {
            in_task!(rt, iters, [raw, get], {
                let bytes: Vec<u8> = get.query_async(&mut raw).await.expect("GET");
                assert!(!bytes.is_empty(), "the warm key is gone");
                bytes
            })
        });
    });
    group.finish();
    assert_still_warm(&cache);
}

/// What one iteration of the notification gap saw.
struct Gap {
    /// From A's call returning to B's; zero if B returned first.
    gap: Duration,
    /// How B was answered (`Waited` expected).
    outcome: Outcome,
    /// Whether a fill notification woke B for its last re-check (rather
    /// than a poll tick that fell on the fill: A's 50 ms sleep and B's
    /// second tick, due 45-75 ms into its wait, share this process's 1 ms
    /// timer wheel, so a few percent of the fills coincide).
    notified: bool,
}

/// One iteration: A loads a fresh key for [`SLOW_LOAD`], B asks for it once
/// A's loader runs (A holds the lease).
async fn gap_once(a: &StrCache, b: &StrCache) -> Gap {
    let notified_before = b.stats().wait_notified;
    let key = fresh_key("gap");
    let (leased_tx, leased_rx) = oneshot::channel();
    let a = a.clone();
    let a_key = key.clone();
    let a_task = tokio::spawn(async move {
        a.get_or_load(&a_key, move |_| async move {
            // The loader runs only once A holds the lease.
            let _ = leased_tx.send(());
            tokio::time::sleep(SLOW_LOAD).await;
            Ok::<_, io::Error>(value())
        })
        .await
        .expect("A loads");
        Instant::now()
    });
    leased_rx.await.expect("A's loader started");
    let b_cache = b.clone();
    let b_task = tokio::spawn(async move {
        let fetched = b_cache
            .fetch(&key, warm_loader)
            .await
            .expect("B gets the value");
        (Instant::now(), fetched.outcome)
    });
    let a_done = a_task.await.expect("A's task");
    let (b_done, outcome) = b_task.await.expect("B's task");
    Gap {
        gap: b_done.saturating_duration_since(a_done),
        outcome,
        notified: b.stats().wait_notified > notified_before,
    }
}

fn notify_gap(c: &mut Criterion, rt: &Runtime, url: &str) {
    // Two backends: two processes' worth of connections.
    let (a, b) = rt.block_on(async {
        let cache = |backend| {
            Cache::builder()
                .namespace("gap")
                .backend(backend)
                .build()
                .expect("valid options")
        };
        let a: StrCache = cache(RedisBackend::connect(url).await.expect("backend A"));
        let b: StrCache = cache(RedisBackend::connect(url).await.expect("backend B"));
        // Untimed rounds: script loading and first subscriptions are not
        // what this measures.
        for _ in 0..2 {
            gap_once(&a, &b).await;
        }
        (a, b)
    });
    let gaps: Arc<Mutex<Vec<Gap>>> = Arc::default();

    let mut group = c.benchmark_group("notify_gap");
    // Criterion's warm-up estimates an iteration by its wall time (about
    // SLOW_LOAD here), not by the gap reported, so the targets are wall
    // time: 3 warm-up iterations, then 20 samples of 3 iterations each
    // (flat: linear sampling would need 210 iterations).
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("redis", |bencher| {
        bencher.to_async(rt).iter_custom(|iters| {
            let (a, b) = (a.clone(), b.clone());
            let gaps = gaps.clone();
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let gap = gap_once(&a, &b).await;
                    total += gap.gap;
                    gaps.lock().unwrap().push(gap);
                }
                total
            }
        });
    });
    group.finish();

    let gaps = std::mem::take(&mut *gaps.lock().unwrap());
    let mut times: Vec<Duration> = gaps.iter().map(|g| g.gap).collect();
    times.sort();
    if let (Some(min), Some(max)) = (times.first(), times.last()) {
        let median = times[times.len() / 2];
        let notified = gaps.iter().filter(|g| g.notified).count();
        let not_waited = gaps.iter().filter(|g| g.outcome != Outcome::Waited).count();
        eprintln!(
            "notify_gap/redis: median {median:?} (min {min:?}, max {max:?}) over {} fills; \
             B woken by the notification in {notified}, by a coinciding poll tick in {}; \
             {not_waited} answers other than Waited",
            gaps.len(),
            gaps.len() - notified,
        );
    }
}

fn herd(c: &mut Criterion) {
    let rt = runtime();
    let backend = MemoryBackend::new();
    let caches: Arc<Vec<StrCache>> = Arc::new(
        (0..HERD_CACHES)
            .map(|_| {
                Cache::builder()
                    .namespace("herd")
                    .backend(backend.clone())
                    .build()
                    .expect("valid options")
            })
            .collect(),
    );
    let loads = Arc::new(AtomicU64::new(0));
    let herds = Arc::new(AtomicU64::new(0));

    let mut group = c.benchmark_group("herd");
    quick(&mut group);
    group.bench_function("memory", |b| {
        b.iter_custom(|iters| {
            in_task!(rt, iters, [caches, loads, herds], {
                let key = fresh_key("herd");
                herds.fetch_add(1, Ordering::Relaxed);
                let mut callers = JoinSet::new();
                for i in 0..HERD_CALLERS {
                    let cache = caches[i % HERD_CACHES].clone();
                    let key = key.clone();
                    let loads = loads.clone();
                    callers.spawn(async move {
                        cache
                            .get_or_load(&key, move |_| async move {
                                loads.fetch_add(1, Ordering::Relaxed);
                                Ok::<_, io::Error>(value())
                            })
                            .await
                            .expect("a herd caller")
                    });
                }
                callers.join_all().await
            })
        });
    });
    group.finish();
    let (loads, herds) = (loads.load(Ordering::Relaxed), herds.load(Ordering::Relaxed));
    eprintln!("herd/memory: {loads} loads for {herds} herds of {HERD_CALLERS} callers");
}

criterion_group!(benches, hit_memory, on_redis, herd);
criterion_main!(benches);
