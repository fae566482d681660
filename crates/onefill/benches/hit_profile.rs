//! The concurrent Redis hit of `hit_path`, as a plain program to run under
//! `valgrind --tool=callgrind` (instruction counts repeat on a noisy
//! machine; wall time does not).
//!
//! ```sh
//! cargo bench -p onefill --bench hit_profile --no-run
//! B=$(ls -t target/release/deps/hit_profile-* | grep -v '\.d$' | head -1)
//! for n in 20 60; do
//!   valgrind --tool=callgrind --callgrind-out-file=cg.$n $B onefill $n
//! done
//! ```
//!
//! Arguments: the subject (`onefill`: `get_or_load` on a `RedisBackend`
//! cache, default options, no L1; `raw_get`: a `GET` on a redis-rs
//! `ConnectionManager`; `raw_get_pttl`: a pipelined `GET` + `PTTL`), then
//! the hits per task. As `hit/concurrent/*`: a 2-worker runtime, 64 tasks
//! over 1,000 warm keys, 150-byte values. The setup is the same for any
//! count, so the difference of two runs' totals over the difference of
//! their hits is the cost of a hit (client side: `redis-server` is a
//! process of its own, not traced).

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::Cache;
use onefill_testkit::RedisServer;
use redis::aio::ConnectionManager;
use tokio::task::JoinSet;

const KEYS: usize = 1_000;
const VALUE_BYTES: usize = 150;
const TASKS: usize = 64;

fn value_of(key: &str) -> String {
    let mut value = format!("value of {key}:");
    value.extend(std::iter::repeat_n('v', VALUE_BYTES - value.len()));
    value
}

async fn loader(key: String) -> Result<String, io::Error> {
    Ok(value_of(&key))
}

#[derive(Clone)]
enum Subject {
    Onefill(Cache<String, String>),
    Raw(ConnectionManager, bool),
}

impl Subject {
    async fn hit(&mut self, key: &str, value_key: &str) -> usize {
        match self {
            Subject::Onefill(cache) => cache
                .get_or_load(&key.to_owned(), loader)
                .await
                .expect("a hit")
                .len(),
            Subject::Raw(conn, false) => {
                let bytes: Vec<u8> = redis::cmd("GET")
                    .arg(value_key)
                    .query_async(conn)
                    .await
                    .expect("GET");
                bytes.len()
            }
            Subject::Raw(conn, true) => {
                let (bytes, _pttl): (Vec<u8>, i64) = redis::pipe()
                    .cmd("GET")
                    .arg(value_key)
                    .cmd("PTTL")
                    .arg(value_key)
                    .query_async(conn)
                    .await
                    .expect("GET + PTTL");
                bytes.len()
            }
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "onefill".into());
    let per_task: usize = args.next().map_or(100, |n| n.parse().expect("a count"));
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let server_ref = &server;
    rt.block_on(async {
        let keys: Arc<[String]> = (0..KEYS).map(|i| format!("key-{i:04}")).collect();
        let value_keys: Arc<[String]> = keys
            .iter()
            .map(|k| FillKeys::new("hit", k).value().to_owned())
            .collect();
        let backend = RedisBackend::connect(&server.url()).await.expect("connect");
        let cache: Cache<String, String> = Cache::builder()
            .namespace("hit")
            .backend(backend)
            .ttl(Duration::from_secs(3600))
            .build()
            .expect("valid options");
        for _ in 0..2 {
            for key in keys.iter() {
                cache.get_or_load(key, loader).await.expect("a load");
            }
        }
        let conn = ConnectionManager::new(redis::Client::open(server.url()).expect("a URL"))
            .await
            .expect("a ConnectionManager");
        let subject = match which.as_str() {
            "onefill" => Subject::Onefill(cache.clone()),
            "raw_get" => Subject::Raw(conn, false),
            "raw_get_pttl" => Subject::Raw(conn, true),
            other => panic!("unknown subject {other}"),
        };
        // Every layer of the call moves its future at least once: its size
        // is part of a hit's cost (rustc keeps a moved-from local's place
        // in an async fn's state until its scope ends).
        let future = cache.get_or_load(&keys[0], loader);
        eprintln!(
            "a get_or_load future: {} bytes",
            std::mem::size_of_val(&future)
        );
        drop(future);
        server_ref.command(&["CONFIG", "RESETSTAT"]);
        let start = Instant::now();
        let mut tasks = JoinSet::new();
        for t in 0..TASKS {
            let mut subject = subject.clone();
            let (keys, value_keys) = (keys.clone(), value_keys.clone());
            tasks.spawn(async move {
                let mut at = t * KEYS / TASKS;
                for _ in 0..per_task {
                    std::hint::black_box(subject.hit(&keys[at], &value_keys[at]).await);
                    at = (at + 1) % KEYS;
                }
            });
        }
        tasks.join_all().await;
        let hits = TASKS * per_task;
        let took = start.elapsed();
        let stats = cache.stats();
        eprintln!(
            "{which}: {hits} hits in {took:?} ({:.0}/s); cache: {} loads, {} hits",
            hits as f64 / took.as_secs_f64(),
            stats.loads_ok,
            stats.hits
        );
    });
    // What went to the server during the hits (a fresh onefill hit is one
    // `GET`; a `GET` with a `TIME` is the clock sample, once a second).
    let info = server.command(&["INFO", "commandstats"]);
    for line in info.lines().filter(|l| l.starts_with("cmdstat_")) {
        eprintln!("{line}");
    }
}
