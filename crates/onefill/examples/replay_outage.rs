//! A measurement, not a walkthrough (decision 0017): how long after Redis
//! comes back from an outage does any process still answer a value that
//! was invalidated during it?
//!
//! `--processes` caches, each on a `RedisBackend` of its own (connections
//! of their own: processes, as far as Redis can tell), serve `--keys` keys
//! at `--rate` calls per second each, with default options. 2 s in, the
//! server is paused (SIGSTOP). 1 s into the pause the origin's rows all
//! change and process 0 invalidates every key: the calls fail (timeouts,
//! then the open circuit, whose calls are never sent). After `--pause-ms`
//! the server resumes (SIGCONT). The run reports, from the moment it
//! resumed: when process 0's replay queue was empty, and the last answer
//! (of a call started after the resume) of a value older than its key's
//! invalidation, in any process. `--no-replay` turns the queue off
//! (`replay_queue_capacity(0)`): the old values then live for their TTL.
//!
//! ```text
//! redis-server --port 7811 --save '' --appendonly no --daemonize yes
//! pid=$(redis-cli -p 7811 info server | grep process_id | cut -d: -f2 | tr -d '\r')
//! cargo run --release -p onefill --features redis --example replay_outage -- \
//!     --redis redis://127.0.0.1:7811 --pid $pid
//! redis-cli -p 7811 shutdown nosave
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onefill::redis::RedisBackend;
use onefill::Cache;

struct Args {
    redis: String,
    pid: u32,
    processes: usize,
    keys: usize,
    rate: u64,
    pause: Duration,
    observe: Duration,
    replay: bool,
}

fn args() -> Args {
    let mut a = Args {
        redis: String::new(),
        pid: 0,
        processes: 4,
        keys: 100,
        rate: 500,
        pause: Duration::from_millis(3_000),
        observe: Duration::from_secs(10),
        replay: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--redis" => a.redis = value(),
            "--pid" => a.pid = value().parse().expect("--pid: a number"),
            "--processes" => a.processes = value().parse().expect("--processes: a number"),
            "--keys" => a.keys = value().parse().expect("--keys: a number"),
            "--rate" => a.rate = value().parse().expect("--rate: a number"),
            "--pause-ms" => {
                a.pause = Duration::from_millis(value().parse().expect("--pause-ms: a number"))
            }
            "--observe-ms" => {
                a.observe = Duration::from_millis(value().parse().expect("--observe-ms: a number"))
            }
            "--no-replay" => a.replay = false,
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(
        !a.redis.is_empty() && a.pid > 0,
        "--redis URL and --pid PID are needed"
    );
    a
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success(), "kill {sig} {pid}");
}

/// What the callers saw after the resume.
#[derive(Default)]
struct Seen {
    calls: u64,
    errors: u64,
    /// Answers of a value older than its key's invalidation, by calls
    /// started after the resume.
    stale: u64,
    /// The latest such answer (when its call started), after the resume.
    last_stale: Option<Duration>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args();
    let ns = format!("replay-outage-{}", std::process::id());
    let mut caches = Vec::new();
    for _ in 0..a.processes {
        let backend = RedisBackend::connect(&a.redis).await?;
        let mut builder = Cache::<String, String>::builder()
            .namespace(ns.as_str())
            .backend(backend);
        if !a.replay {
            builder = builder.replay_queue_capacity(0);
        }
        caches.push(builder.build()?);
    }
    // The origin: each key's row version; a load answers "<version>".
    let rows: Arc<Vec<AtomicU64>> = Arc::new((0..a.keys).map(|_| AtomicU64::new(1)).collect());
    // The version below which a key's values were invalidated, and when.
    let invalidated: Arc<Vec<AtomicU64>> =
        Arc::new((0..a.keys).map(|_| AtomicU64::new(0)).collect());
    let keys: Arc<Vec<String>> = Arc::new((0..a.keys).map(|k| format!("k{k}")).collect());
    let started = Instant::now();
    let resumed: Arc<Mutex<Option<Instant>>> = Arc::default();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let end = 2_000 + a.pause.as_millis() as u64 + a.observe.as_millis() as u64;
    let end = started + Duration::from_millis(end);

    let mut callers = Vec::new();
    for cache in &caches {
        let (cache, rows, invalidated, keys) = (
            cache.clone(),
            rows.clone(),
            invalidated.clone(),
            keys.clone(),
        );
        let (resumed, seen) = (resumed.clone(), seen.clone());
        let period = Duration::from_secs_f64(1.0 / a.rate as f64);
        callers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            let mut n = 0usize;
            while Instant::now() < end {
                tick.tick().await;
                let k = n % keys.len();
                n += 1;
                let (cache, rows, invalidated, keys) = (
                    cache.clone(),
                    rows.clone(),
                    invalidated.clone(),
                    keys.clone(),
                );
                let (resumed, seen) = (resumed.clone(), seen.clone());
                tokio::spawn(async move {
                    let call_started = Instant::now();
                    let below = invalidated[k].load(Ordering::SeqCst);
                    let rows = rows.clone();
                    let answer = cache
                        .get_or_load(&keys[k], move |_| async move {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            Ok::<_, std::io::Error>(rows[k].load(Ordering::SeqCst).to_string())
                        })
                        .await;
                    let Some(resumed) = *resumed.lock().unwrap() else {
                        return;
                    };
                    if call_started < resumed {
                        return;
                    }
                    let mut seen = seen.lock().unwrap();
                    seen.calls += 1;
                    match answer {
                        Ok(v) if v.parse::<u64>().unwrap_or(0) < below => {
                            seen.stale += 1;
                            let at = call_started - resumed;
                            seen.last_stale = Some(seen.last_stale.map_or(at, |l| l.max(at)));
                        }
                        Ok(_) => {}
                        Err(_) => seen.errors += 1,
                    }
                });
            }
        }));
    }

    tokio::time::sleep_until((started + Duration::from_secs(2)).into()).await;
    signal(a.pid, "-STOP");
    println!("paused Redis at {:?}", started.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writer = &caches[0];
    let mut failed = 0;
    let writing = Instant::now();
    for (k, key) in keys.iter().enumerate() {
        let new = rows[k].fetch_add(1, Ordering::SeqCst) + 1;
        invalidated[k].store(new, Ordering::SeqCst);
        if writer.invalidate(key).await.is_err() {
            failed += 1;
        }
    }
    println!(
        "{failed} of {} invalidations failed (in {:?}); {} queued",
        a.keys,
        writing.elapsed(),
        writer.pending_writes()
    );
    tokio::time::sleep_until((started + Duration::from_secs(2) + a.pause).into()).await;
    signal(a.pid, "-CONT");
    let back = Instant::now();
    *resumed.lock().unwrap() = Some(back);
    println!("resumed Redis at {:?}", started.elapsed());
    let mut drained = None;
    while drained.is_none() && back.elapsed() < a.observe * 4 {
        if writer.pending_writes() == 0 {
            drained = Some(back.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for c in callers {
        c.await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = seen.lock().unwrap();
    let stats = writer.stats();
    println!(
        "replay {}: queue empty {:?} after the resume ({} queued, {} replayed, {} dropped, {} \
         refused); calls started after the resume: {}, errors {}, answers of an invalidated \
         value {}, the last one {:?} after the resume (observed for {:?})",
        if a.replay { "on" } else { "off" },
        drained,
        stats.writes_queued,
        stats.writes_replayed,
        stats.writes_dropped,
        stats.writes_refused,
        seen.calls,
        seen.errors,
        seen.stale,
        seen.last_stale,
        a.observe,
    );
    Ok(())
}
