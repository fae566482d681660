//! A measurement, not a walkthrough (decision 0020): what
//! `RedisOptions::durability` costs a write, and what a frozen replica
//! costs the calls that share its connection.
//!
//! Starts a private primary and a replica of it on loopback (the test
//! kit's `redis-server` processes), then, once without the option and once
//! with `Durability::Replicas { count: 1, timeout: --wait-ms }`, on a fresh
//! namespace each:
//!
//! 1. `--writes` `set`s, one at a time: each call's latency;
//! 2. `--writes` fills (`get_or_load` of a new key: a lease request, the
//!    load, which returns at once, and the fill): each call's latency;
//! 3. the primary's commands per write (`INFO commandstats`);
//! 4. with the replica frozen (SIGSTOP): for `--frozen-ms`, one task
//!    `set`s in a loop while another reads a stored key in a loop
//!    (`get`, no L1): the reads' latency and how many of each finished.
//!
//! ```text
//! cargo run --release -p onefill --features redis --example durability_cost -- \
//!     --writes 5000 --wait-ms 50
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onefill::redis::{Durability, RedisBackend, RedisOptions};
use onefill::Cache;
use onefill_testkit::RedisServer;

struct Args {
    writes: usize,
    wait: Duration,
    frozen: Duration,
}

fn args() -> Args {
    let mut a = Args {
        writes: 5_000,
        wait: Duration::from_millis(50),
        frozen: Duration::from_secs(2),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--writes" => a.writes = value().parse().expect("--writes: a number"),
            "--wait-ms" => a.wait = Duration::from_millis(value().parse().expect("a number")),
            "--frozen-ms" => a.frozen = Duration::from_millis(value().parse().expect("a number")),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn calls(server: &RedisServer) -> BTreeMap<String, u64> {
    server
        .command(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Calls per command between two `INFO commandstats`, the replica's and
/// this program's own left out.
fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "replconf" | "psync" | "ping"))
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn report(what: &str, mut lat: Vec<Duration>) {
    lat.sort();
    println!(
        "  {what:<34} n={:<6} p50={:>8.1?} p99={:>8.1?} max={:>8.1?}",
        lat.len(),
        pct(&lat, 0.50),
        pct(&lat, 0.99),
        lat.last().copied().unwrap_or_default()
    );
}

async fn cache(primary: &RedisServer, ns: &str, options: RedisOptions) -> Cache<String, String> {
    let backend = RedisBackend::connect_with(&primary.url(), options)
        .await
        .expect("connect");
    // No L1: the reads measured are the primary's, and the commands per
    // write are the write's alone (no tracking connection's PINGs).
    Cache::builder()
        .namespace(ns)
        .backend(backend)
        .no_l1()
        .ttl(Duration::from_secs(600))
        .build()
        .expect("cache")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let primary = RedisServer::start_with(&["--repl-ping-replica-period", "3600"]);
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    while !replica
        .command(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "primary and replica on loopback; {} writes; WAIT timeout {:?}",
        args.writes, args.wait
    );
    let durable = Durability::Replicas {
        count: 1,
        timeout: args.wait,
    };
    for (name, durability) in [("without", Durability::Primary), ("with", durable)] {
        println!("{name} durability:");
        let c = cache(&primary, name, RedisOptions::new().durability(durability)).await;
        // Connected, scripts loaded, marks read.
        c.set("warm", "w".into()).await.expect("warm");

        let before = calls(&primary);
        let mut lat = Vec::with_capacity(args.writes);
        for i in 0..args.writes {
            let began = Instant::now();
            c.set(&format!("s{i}"), "value".into()).await.expect("set");
            lat.push(began.elapsed());
        }
        report("set", lat);
        let sets = delta(&before, &calls(&primary));

        let before = calls(&primary);
        let mut lat = Vec::with_capacity(args.writes);
        for i in 0..args.writes {
            let began = Instant::now();
            c.get_or_load(&format!("f{i}"), |_| async {
                Ok::<_, std::io::Error>("value".to_owned())
            })
            .await
            .expect("fill");
            lat.push(began.elapsed());
        }
        report("get_or_load (miss, lease, fill)", lat);
        let fills = delta(&before, &calls(&primary));
        let per = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(k, n)| format!("{k}={:.2}", *n as f64 / args.writes as f64))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!("  commands per set:  {}", per(&sets));
        println!("  commands per fill: {}", per(&fills));

        // The replica frozen: a writer and a reader on one backend.
        c.set("hot", "h".into()).await.expect("hot");
        replica.pause();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (c, stop) = (c.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut ok, mut short, mut other) = (0u64, 0u64, 0u64);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    match c.set(&format!("w{i}"), "v".into()).await {
                        Ok(()) => ok += 1,
                        Err(onefill::Error::Backend(e)) if e.is_not_replicated() => short += 1,
                        Err(_) => other += 1,
                    }
                }
                (ok, short, other)
            })
        };
        let reader = {
            let (c, stop) = (c.clone(), stop.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut failed = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    match c.get("hot").await {
                        Ok(_) => lat.push(began.elapsed()),
                        Err(_) => failed += 1,
                    }
                }
                (lat, failed)
            })
        };
        tokio::time::sleep(args.frozen).await;
        stop.store(true, Ordering::Relaxed);
        let (ok, short, other) = writer.await.expect("writer");
        let (lat, failed) = reader.await.expect("reader");
        replica.resume();
        println!(
            "  replica frozen {:?}: sets ok={ok} not-replicated={short} other-errors={other}",
            args.frozen
        );
        report("get while the replica is frozen", lat);
        println!(
            "  gets failed: {failed}; stats: writes_unreplicated={} backend_errors={} writes_queued={}",
            c.stats().writes_unreplicated,
            c.stats().backend_errors,
            c.stats().writes_queued
        );
        // Let the replica catch up before the next round.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
