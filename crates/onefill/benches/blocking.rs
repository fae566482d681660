//! What the blocking handle adds to a hit, side by side in one run.
//!
//! ```sh
//! cargo bench -p onefill --bench blocking
//! ```
//!
//! The embedded backend with its default L1, 1,000 warm keys cycled,
//! 150-byte values, `get_or_load` whose loader never runs once the keys
//! are warm:
//!
//! - `blocking/async_in_task`: the async call, from a task of a 2-worker
//!   runtime (as `hit_path` measures it);
//! - `blocking/plain_thread`: `BlockingCache::get_or_load` from a thread
//!   outside any runtime (the handle's own runtime, `build_blocking`);
//! - `blocking/spawn_blocking`: the same call from a `spawn_blocking`
//!   thread of the application's runtime (`Cache::blocking`), which also
//!   pays the check that it is not an async task's.
//!
//! Defaults: 20 samples, 1 s warm-up, 3 s measurement. Under
//! `cargo test --benches` criterion runs each function once.

use std::hint::black_box;
use std::io;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use onefill::{BlockingCache, Cache};

const KEYS: usize = 1_000;
const VALUE_BYTES: usize = 150;

fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("key-{i}")).collect()
}

fn value(key: &str) -> String {
    format!("{key}:{}", "v".repeat(VALUE_BYTES))[..VALUE_BYTES].to_owned()
}

/// A blocking loader that must not run once the keys are warm.
fn load(key: String) -> Result<String, io::Error> {
    Ok(value(&key))
}

fn warm(cache: &BlockingCache<String, String>, keys: &[String]) {
    for key in keys {
        cache.get_or_load(key, load).expect("a warm-up load");
    }
}

fn blocking(c: &mut Criterion) {
    let keys = keys();
    let mut group = c.benchmark_group("blocking");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let cache: Cache<String, String> = runtime
        .block_on(async { Cache::builder().namespace("bench").build() })
        .expect("a cache");
    let shared = {
        let _entered = runtime.enter();
        cache.blocking().expect("a multi-thread runtime")
    };
    warm(&shared, &keys);

    group.bench_function("async_in_task", |b| {
        b.iter_custom(|iters| {
            let (cache, keys) = (cache.clone(), keys.clone());
            runtime
                .block_on(runtime.spawn(async move {
                    let start = Instant::now();
                    for i in 0..iters as usize {
                        let key = &keys[i % KEYS];
                        let hit = cache
                            .get_or_load(key, |k| async move { load(k) })
                            .await
                            .expect("a hit");
                        black_box(hit);
                    }
                    start.elapsed()
                }))
                .expect("the task")
        })
    });

    let own = Cache::<String, String>::builder()
        .namespace("bench")
        .build_blocking()
        .expect("a blocking cache");
    warm(&own, &keys);
    group.bench_function("plain_thread", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for i in 0..iters as usize {
                black_box(own.get_or_load(&keys[i % KEYS], load).expect("a hit"));
            }
            start.elapsed()
        })
    });

    group.bench_function("spawn_blocking", |b| {
        b.iter_custom(|iters| {
            let (cache, keys) = (shared.clone(), keys.clone());
            runtime
                .block_on(runtime.spawn_blocking(move || {
                    let start = Instant::now();
                    for i in 0..iters as usize {
                        black_box(cache.get_or_load(&keys[i % KEYS], load).expect("a hit"));
                    }
                    start.elapsed()
                }))
                .expect("the blocking task")
        })
    });
    group.finish();
    assert_eq!(
        shared.stats().loads_ok + own.stats().loads_ok,
        2 * KEYS as u64,
        "no load once warm"
    );
}

criterion_group!(benches, blocking);
criterion_main!(benches);
