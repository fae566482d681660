//! How long another process's L1 keeps serving a value after a write
//! (target: p99 ≤ 5 ms on loopback).
//!
//! ```sh
//! cargo bench -p onefill --bench invalidation     # 2,000 samples of each variant
//! ```
//!
//! Two caches with `.l1(L1::new(10_000))`, each on its own
//! `RedisBackend::connect` (its own connections, as two processes have), on
//! a private `redis-server` (a free port, never the machine's 6379), on a
//! 2-worker multi-threaded runtime, driven from a spawned task. Each sample:
//!
//! 1. B's L1 holds the key's current value: B's `get_or_load` returns it,
//!    and a second call is an L1 hit (`stats().l1_hits` grows);
//! 2. the write, then B calls `get_or_load` in a loop (yielding between
//!    calls) until its L1 no longer serves the old value:
//!    - `set`: A's `Cache::set` of the next value; until B returns the new
//!      value (its last call is a Redis hit). Timed from the start of A's
//!      `set` and from its return;
//!    - `raw DEL`: a `DEL` of the value key by a plain redis-rs connection
//!      (not onefill); until B's loader runs (its L1 no longer serves, and
//!      Redis has nothing). Timed from the start of the `DEL` and from its
//!      return, to the loader's start.
//!
//! Prints p50/p90/p99/max of each and the number of old values B was served
//! after the write had returned. `cargo test --benches` runs 20 samples of
//! each; `ONEFILL_INVALIDATION_SAMPLES=N` sets the count. Without
//! `redis-server` on the `PATH` it prints a note and exits 0.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::{Cache, L1};
use onefill_testkit::RedisServer;

type StrCache = Cache<String, String>;

const NAMESPACE: &str = "inv";
const VALUE_BYTES: usize = 150;
/// Samples under `cargo bench`, and otherwise (`cargo test --benches`).
const BENCH_SAMPLES: usize = 2_000;
const TEST_SAMPLES: usize = 20;
/// Untimed rounds first (script loading, first connections).
const WARM_ROUNDS: usize = 20;
/// A sample that takes longer than this is a failure, not a figure.
const GIVE_UP: Duration = Duration::from_secs(5);

/// A 150-byte value tagged `tag`.
fn value(tag: &str) -> String {
    let mut value = format!("{tag}:");
    value.extend(std::iter::repeat_n('v', VALUE_BYTES - value.len()));
    value
}

/// B's loader in the `set` variant: never runs (A stored every value).
async fn never(key: String) -> Result<String, io::Error> {
    panic!("B loaded {key}: the value A set was not in Redis");
}

/// B's loads in the `raw DEL` variant, and when the last one started.
static LOADS: AtomicU64 = AtomicU64::new(0);
static LOADED_AT: Mutex<Option<Instant>> = Mutex::new(None);

async fn counting(_key: String) -> Result<String, io::Error> {
    *LOADED_AT.lock().unwrap() = Some(Instant::now());
    let n = LOADS.fetch_add(1, Ordering::SeqCst);
    Ok(value(&format!("loaded-{n}")))
}

/// Makes sure B's L1 holds `key`'s current value (`expected`, if given):
/// B returns it twice, the second time from its L1. (Right after a write,
/// B may still serve the previous value for a moment: it waits that out.)
async fn warm_b<F, Fut>(b: &StrCache, key: &String, expected: Option<&str>, loader: F) -> String
where
    F: Fn(String) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = Result<String, io::Error>> + Send + 'static,
{
    let start = Instant::now();
    loop {
        let value = b.get_or_load(key, loader).await.expect("B's call");
        let l1_hits = b.stats().l1_hits;
        let again = b.get_or_load(key, loader).await.expect("B's call");
        let current = expected.is_none_or(|expected| value == expected);
        if current && again == value && b.stats().l1_hits > l1_hits {
            return value;
        }
        assert!(
            start.elapsed() < GIVE_UP,
            "B's L1 never served {key}'s current value: {:?}",
            b.stats()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One variant's samples.
#[derive(Default)]
struct Samples {
    /// From the start of the write.
    from_start: Vec<Duration>,
    /// From the write's return.
    from_return: Vec<Duration>,
    /// Old values B was served after the write had returned.
    stale_after_return: u64,
}

impl Samples {
    fn push(&mut self, started: Instant, returned: Instant, ended: Instant) {
        self.from_start.push(ended - started);
        self.from_return
            .push(ended.saturating_duration_since(returned));
    }

    fn report(&mut self, name: &str) {
        for (from, times) in [
            ("the write's start", &mut self.from_start),
            ("the write's return", &mut self.from_return),
        ] {
            times.sort();
            let at = |q: usize| times[(times.len() * q / 100).min(times.len() - 1)];
            println!(
                "invalidation/{name}, from {from}: p50 {:?}  p90 {:?}  p99 {:?}  max {:?}  ({} samples)",
                at(50),
                at(90),
                at(99),
                times[times.len() - 1],
                times.len(),
            );
        }
        println!(
            "invalidation/{name}: {} old values served after the write had returned",
            self.stale_after_return
        );
    }
}

/// The `set` variant: A sets the next value, B polls until it gets it.
/// The first [`WARM_ROUNDS`] are not kept.
async fn set_variant(a: &StrCache, b: &StrCache, rounds: usize) -> Samples {
    let mut samples = Samples::default();
    let key = "k-set".to_owned();
    let mut current = value("v0");
    a.set(&key, current.clone()).await.expect("A's set");
    for i in 1..=WARM_ROUNDS + rounds {
        if i == WARM_ROUNDS + 1 {
            samples = Samples::default();
        }
        warm_b(b, &key, Some(&current), never).await;
        let next = value(&format!("v{i}"));
        let started = Instant::now();
        a.set(&key, next.clone()).await.expect("A's set");
        let returned = Instant::now();
        loop {
            let got = b.get_or_load(&key, never).await.expect("B's call");
            if got == next {
                break;
            }
            assert_eq!(got, current, "B returned neither value");
            samples.stale_after_return += 1;
            assert!(
                started.elapsed() < GIVE_UP,
                "B served the old value for 5 s"
            );
            tokio::task::yield_now().await;
        }
        samples.push(started, returned, Instant::now());
        current = next;
    }
    samples
}

/// The `raw DEL` variant: another client deletes the value key, B polls
/// until its loader runs. The first [`WARM_ROUNDS`] are not kept.
async fn del_variant(
    b: &StrCache,
    raw: &mut redis::aio::MultiplexedConnection,
    rounds: usize,
) -> Samples {
    let mut samples = Samples::default();
    let key = "k-del".to_owned();
    let value_key = FillKeys::new(NAMESPACE, &key).value().to_owned();
    for i in 0..WARM_ROUNDS + rounds {
        if i == WARM_ROUNDS {
            samples = Samples::default();
        }
        let held = warm_b(b, &key, None, counting).await;
        let loads = LOADS.load(Ordering::SeqCst);
        let started = Instant::now();
        let deleted: u64 = redis::cmd("DEL")
            .arg(&value_key)
            .query_async(raw)
            .await
            .expect("DEL");
        let returned = Instant::now();
        assert_eq!(deleted, 1, "the value key was not there");
        loop {
            let got = b.get_or_load(&key, counting).await.expect("B's call");
            if LOADS.load(Ordering::SeqCst) > loads {
                break;
            }
            assert_eq!(got, held, "B returned another value without loading");
            samples.stale_after_return += 1;
            assert!(
                started.elapsed() < GIVE_UP,
                "B served the old value for 5 s"
            );
            tokio::task::yield_now().await;
        }
        let loaded_at = LOADED_AT.lock().unwrap().expect("the loader ran");
        samples.push(started, returned, loaded_at);
    }
    samples
}

fn redis_available() -> bool {
    std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

fn main() {
    if !redis_available() {
        eprintln!("redis-server is not on the PATH: skipping the invalidation benchmark");
        return;
    }
    let samples = match std::env::var("ONEFILL_INVALIDATION_SAMPLES") {
        Ok(n) => n.parse().expect("ONEFILL_INVALIDATION_SAMPLES: a number"),
        // `cargo bench` passes `--bench`; `cargo test --benches` does not.
        Err(_) if std::env::args().any(|arg| arg == "--bench") => BENCH_SAMPLES,
        Err(_) => TEST_SAMPLES,
    };
    let server = RedisServer::start();
    let url = server.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let run = rt.spawn(async move {
        // Two processes' worth of connections.
        let cache = |backend| -> StrCache {
            Cache::builder()
                .namespace(NAMESPACE)
                .backend(backend)
                .ttl(Duration::from_secs(3600))
                .l1(L1::new(10_000))
                .build()
                .expect("a cache with an L1 on Redis")
        };
        let a = cache(RedisBackend::connect(&url).await.expect("backend A"));
        let b = cache(RedisBackend::connect(&url).await.expect("backend B"));
        let mut raw = redis::Client::open(url.as_str())
            .expect("a redis URL")
            .get_multiplexed_async_connection()
            .await
            .expect("a raw connection");

        let set = set_variant(&a, &b, samples).await;
        let del = del_variant(&b, &mut raw, samples).await;
        (set, del, b.stats())
    });
    let (mut set, mut del, b_stats) = rt.block_on(run).expect("the benchmark task");
    set.report("set");
    del.report("raw DEL (until B's loader starts)");
    println!(
        "B: {} L1 hits, {} L1 invalidations, {} L1 resets, {} loads",
        b_stats.l1_hits, b_stats.l1_invalidations, b_stats.l1_resets, b_stats.loads_ok
    );
    drop(rt);
    drop(server);
}
