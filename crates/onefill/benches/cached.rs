//! What `#[onefill::cached]` adds to a hit: the same L1 hit on the
//! embedded backend through a cached function and through the direct call
//! it stands for (`cache.get_or_load` with the key formatted the same way).
//!
//! ```sh
//! cargo bench -p onefill --bench cached --features macros
//! ```
//!
//! - `cached/async/{macro,direct}`: `user(id).await` against
//!   `cache.get_or_load(&format!("{id}"), loader).await`, called one after
//!   another from a task of a 2-worker runtime (as `hit_path.rs` calls);
//! - `cached/sync/{macro,direct}`: a plain function against
//!   `BlockingCache::get_or_load`, called from a plain thread.
//!
//! Each over 1,000 warm `u64` keys in turn, 150-byte `String` values, TTL
//! one hour (no expiry or refresh during a run); the loaders never run once
//! warm (checked). The key is a `String` formatted per call on both sides
//! (through `fmt`, as the macro does: `id.to_string()` has a faster path
//! for integers); the macro's own cost is the rest (its cache slot's atomic
//! load, the loader closure it builds, the answer's conversion). Defaults:
//! 20 samples, 1 s warm-up, 3 s measurement.
//!
//! On two shared cores (`-- --measurement-time 5`, three runs, medians):
//! async 147–164 ns through the macro, 157–163 ns direct; sync 192–237 ns
//! through the macro, 200–226 ns direct: the same within the noise.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use onefill::{BlockingCache, Cache, MemoryBackend};
use tokio::runtime::Runtime;

onefill::default_backend!(MemoryBackend::new());

/// Warm keys, cycled.
const KEYS: u64 = 1_000;
const VALUE_BYTES: usize = 150;

/// Loader runs, on both sides: none once warm.
static LOADS: AtomicU64 = AtomicU64::new(0);

fn value(id: u64) -> String {
    LOADS.fetch_add(1, Ordering::Relaxed);
    format!("{id:0width$}", width = VALUE_BYTES)
}

#[onefill::cached(ttl = "1h")]
async fn user(id: u64) -> anyhow::Result<String> {
    Ok(value(id))
}

#[onefill::cached(ttl = "1h")]
fn user_sync(id: u64) -> anyhow::Result<String> {
    Ok(value(id))
}

static DIRECT: LazyLock<Cache<String, String>> = LazyLock::new(|| {
    Cache::builder()
        .namespace("direct")
        .backend(MemoryBackend::new())
        .ttl(Duration::from_secs(3600))
        .build()
        .expect("the direct cache")
});

static DIRECT_SYNC: LazyLock<BlockingCache<String, String>> = LazyLock::new(|| {
    Cache::builder()
        .namespace("direct-sync")
        .backend(MemoryBackend::new())
        .ttl(Duration::from_secs(3600))
        .build_blocking()
        .expect("the direct blocking cache")
});

async fn direct(id: u64) -> anyhow::Result<String> {
    let key = format!("{id}");
    Ok(DIRECT
        .get_or_load(key.as_str(), move |_| async move { anyhow::Ok(value(id)) })
        .await?)
}

fn direct_sync(id: u64) -> anyhow::Result<String> {
    let key = format!("{id}");
    Ok(DIRECT_SYNC.get_or_load(key.as_str(), move |_| anyhow::Ok(value(id)))?)
}

/// One task calls `hit` `iters` times over the keys in turn; the time it
/// took, measured inside the task.
fn sequential<F, Fut>(rt: &Runtime, hit: F, iters: u64) -> Duration
where
    F: Fn(u64) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<String>> + Send,
{
    let task = rt.spawn(async move {
        let start = Instant::now();
        for i in 0..iters {
            black_box(hit(i % KEYS).await.expect("a hit"));
        }
        start.elapsed()
    });
    rt.block_on(task).expect("the benchmark task")
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the runtime");
    rt.block_on(async {
        for id in 0..KEYS {
            user(id).await.expect("warm");
            direct(id).await.expect("warm");
        }
    });
    for id in 0..KEYS {
        user_sync(id).expect("warm");
        direct_sync(id).expect("warm");
    }
    let warm = LOADS.load(Ordering::Relaxed);
    assert_eq!(warm, 4 * KEYS, "one load per key and side");

    let mut group = c.benchmark_group("cached/async");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("macro", |b| {
        b.iter_custom(|iters| sequential(&rt, user, iters))
    });
    group.bench_function("direct", |b| {
        b.iter_custom(|iters| sequential(&rt, direct, iters))
    });
    group.finish();

    let mut group = c.benchmark_group("cached/sync");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let mut at = 0;
    let mut next = move || {
        at = (at + 1) % KEYS;
        at
    };
    group.bench_function("macro", |b| {
        b.iter(|| black_box(user_sync(next()).expect("a hit")))
    });
    group.bench_function("direct", |b| {
        b.iter(|| black_box(direct_sync(next()).expect("a hit")))
    });
    group.finish();

    assert_eq!(LOADS.load(Ordering::Relaxed), warm, "hits only, once warm");
}

criterion_group!(benches, bench);
criterion_main!(benches);
