//! `onefill worker`: one process of a fleet. Started by `onefill fleet`
//! (and `demo --redis`), never by hand: it connects to Redis, optionally
//! waits for a "go" line on stdin so every process starts together, runs its
//! callers, and prints one JSON summary line on stdout.
//!
//! Loads are counted in Redis (a set of load ids next to the value),
//! so the parent can count loads across processes without trusting them.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::{Cache, CallOptions, LeaseTtl, Outcome, WaitPolicy};
use tokio::sync::{mpsc, oneshot};

use super::args::{FleetStrategy, RunArgs, WorkerArgs};
use super::fault_report::{outcome_code, ERROR};
use super::report::WorkerReport;
use crate::shared::output::{describe, is_broken_pipe, print_line};
use crate::shared::percentile::percentile;
use crate::shared::urls::redact;

/// The counter key of `key`'s loads; shares the value's hash tag.
pub fn load_counter_key(namespace: &str, key: &str) -> String {
    format!("{}:loads", FillKeys::new(namespace, key).value())
}

struct Call {
    started: Duration,
    key_index: usize,
    latency: Duration,
    outcome: Result<&'static str, String>,
    /// Age of the answered value (0 for an error or a value without a
    /// load time).
    age_ms: u64,
}

/// How long the worker waits for one call: a call that never answers is an
/// error, not a worker that never ends. Far beyond any bound of the
/// library's: 2 minutes plus three loads plus the wait deadline.
fn call_patience(run: &RunArgs) -> Duration {
    Duration::from_secs(120)
        + Duration::from_millis(run.load_ms.saturating_mul(3))
        + Duration::from_millis(run.wait_deadline_ms.unwrap_or(10_000))
}

/// The most entries a worker keeps in each of its detail logs.
const MAX_LOG: usize = 2_000_000;

/// Now, as milliseconds since the Unix epoch (0 if the clock is before it).
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The value a load produces: the key, the process, the load's number in
/// it and the load's completion time (Unix ms) after an `@`.
fn loaded_value(key: &str, n: u64) -> String {
    format!("{key}-{}-v{n}@{}", std::process::id(), unix_ms())
}

/// How old a value of [`loaded_value`] is at `now` (Unix ms): 0 if it
/// carries no load time.
fn age_ms(value: &str, now: u64) -> u64 {
    value
        .rsplit_once('@')
        .and_then(|(_, t)| t.parse::<u64>().ok())
        .map_or(0, |t| now.saturating_sub(t))
}

/// The first word of the line a worker prints instead of `ready` when it
/// cannot start (with `--sync`): the parent prints the reason once for the
/// whole fleet, instead of every worker printing it on stderr.
pub const NOT_READY: &str = "not-ready:";

/// Runs the worker; the summary goes to stdout as one JSON line.
pub fn main(args: &WorkerArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Startup(reason)) if args.sync => {
            // The parent reads this line in place of "ready".
            let _ = print_line(&format!("{NOT_READY} {}", describe(&reason)));
            ExitCode::FAILURE
        }
        Err(Failure::Startup(error) | Failure::Run(error)) => {
            if !is_broken_pipe(&error) {
                let _ = writeln!(std::io::stderr(), "error: {}", describe(&error));
            }
            ExitCode::FAILURE
        }
    }
}

/// How a worker failed: before it was ready (its connections), or after.
enum Failure {
    Startup(anyhow::Error),
    Run(anyhow::Error),
}

fn run(args: &WorkerArgs) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")
        .map_err(Failure::Startup)?;
    let report = runtime.block_on(work(args))?;
    let report = serde_json::to_string(&report)
        .context("encoding the report")
        .map_err(Failure::Run)?;
    print_line(&report)
        .context("printing the report")
        .map_err(Failure::Run)
}

async fn connect(args: &RunArgs) -> anyhow::Result<RedisBackend> {
    if args.cluster {
        let urls: Vec<&str> = args.redis.iter().map(String::as_str).collect();
        RedisBackend::connect_cluster(&urls).await.with_context(|| {
            let shown: Vec<String> = args.redis.iter().map(|u| redact(u)).collect();
            format!("connecting to the cluster at {}", shown.join(", "))
        })
    } else {
        RedisBackend::connect(&args.redis[0])
            .await
            .with_context(|| format!("connecting to Redis at {}", redact(&args.redis[0])))
    }
}

/// A plain connection for the load counter and the naive strategy.
enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    async fn connect(args: &RunArgs) -> anyhow::Result<Raw> {
        if args.cluster {
            let shown = || {
                let shown: Vec<String> = args.redis.iter().map(|u| redact(u)).collect();
                format!("connecting to the cluster at {}", shown.join(", "))
            };
            let client =
                redis::cluster::ClusterClient::new(args.redis.clone()).with_context(shown)?;
            Ok(Raw::Cluster(
                client.get_async_connection().await.with_context(shown)?,
            ))
        } else {
            let shown = || format!("connecting to Redis at {}", redact(&args.redis[0]));
            let client = redis::Client::open(args.redis[0].as_str()).with_context(shown)?;
            Ok(Raw::Single(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .with_context(shown)?,
            ))
        }
    }
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self {
            Raw::Single(c) => cmd.query_async(&mut c.clone()).await,
            Raw::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }
    /// A pipeline of commands on one key (one slot, on a cluster).
    async fn pipe<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<T> {
        match self {
            Raw::Single(c) => pipe.query_async(&mut c.clone()).await,
            Raw::Cluster(c) => pipe.query_async(&mut c.clone()).await,
        }
    }
}

/// The onefill cache of the strategy (none for the naive one).
async fn cache(run: &RunArgs, namespace: &str) -> anyhow::Result<Option<Cache<String, String>>> {
    Ok(match run.strategy {
        FleetStrategy::Naive => None,
        strategy => {
            let backend = connect(run).await?;
            let load = Duration::from_millis(run.load_ms);
            let mut builder = Cache::<String, String>::builder()
                .namespace(namespace)
                .backend(backend)
                .ttl(Duration::from_millis(run.ttl_ms))
                .grace(Duration::from_millis(run.grace_ms))
                .max_load_time(load * 3 + Duration::from_secs(5));
            if let Some(ms) = run.backend_timeout_ms {
                builder = builder.backend_timeout(Duration::from_millis(ms));
            }
            if let Some(ms) = run.wait_deadline_ms {
                builder = builder.wait(WaitPolicy::default().deadline(Duration::from_millis(ms)));
            }
            if let Some(ms) = run.lease_ttl_ms {
                builder = builder.lease_ttl(LeaseTtl::Fixed(Duration::from_millis(ms)));
            }
            if strategy == FleetStrategy::CoalescingOnly {
                builder = builder.no_lease();
            }
            if run.strict {
                builder = builder.strict(true);
            }
            Some(builder.build()?)
        }
    })
}

async fn work(args: &WorkerArgs) -> Result<WorkerReport, Failure> {
    let run = args.run();
    let raw = Arc::new(Raw::connect(run).await.map_err(Failure::Startup)?);
    let cache = cache(run, &args.namespace)
        .await
        .map_err(Failure::Startup)?;
    if args.sync {
        print_line("ready")
            .context("telling the parent this worker is ready")
            .map_err(Failure::Startup)?;
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .context("waiting for the parent's go")
            .map_err(Failure::Startup)?;
    }
    steady_or_herd(args, run, raw, cache)
        .await
        .map_err(Failure::Run)
}

async fn steady_or_herd(
    args: &WorkerArgs,
    run: &RunArgs,
    raw: Arc<Raw>,
    cache: Option<Cache<String, String>>,
) -> anyhow::Result<WorkerReport> {
    let local_loads = Arc::new(AtomicU64::new(0));
    let loads_per_key: Arc<Vec<AtomicU64>> =
        Arc::new(run.keys.iter().map(|_| AtomicU64::new(0)).collect());
    let load_log: Arc<Mutex<Vec<[u64; 2]>>> = Arc::new(Mutex::new(Vec::new()));
    let detail = run.detail;
    let (counts, counting) = LoadCounter::start(raw.clone());
    let origin = Instant::now();
    let origin_unix_ms = unix_ms();
    let sampler = cache.clone().map(|cache| Sampler::start(cache, origin));
    let mut tasks = Vec::new();
    let keys: Vec<String> = run.keys.clone();
    let spawn_call = |i: usize| {
        let key_index = i % keys.len();
        let key = keys[key_index].clone();
        let cache = cache.clone();
        let raw = raw.clone();
        let local_loads = local_loads.clone();
        let loads_per_key = loads_per_key.clone();
        let load_log = load_log.clone();
        let counts = counts.clone();
        let namespace = args.namespace.clone();
        let load = Duration::from_millis(run.load_ms);
        let ttl_ms = run.ttl_ms;
        let patience = call_patience(run);
        tokio::spawn(async move {
            let started = origin.elapsed();
            let t0 = Instant::now();
            let loader = {
                let local_loads = local_loads.clone();
                let counts = counts.clone();
                let counter = load_counter_key(&namespace, &key);
                move |key: String| async move {
                    let n = local_loads.fetch_add(1, Ordering::SeqCst) + 1;
                    // This process's first load of the key also gives the
                    // key's counter its TTL.
                    let first = loads_per_key
                        .get(key_index)
                        .is_none_or(|count| count.fetch_add(1, Ordering::SeqCst) == 0);
                    if detail {
                        let mut log = load_log.lock().unwrap_or_else(|p| p.into_inner());
                        if log.len() < MAX_LOG {
                            log.push([origin.elapsed().as_millis() as u64, key_index as u64]);
                        }
                    }
                    // Counted in Redis off the loader's path: the simulated
                    // origin takes `load`, whatever state Redis is in.
                    let _ = counts.send(Count { counter, n, first });
                    tokio::time::sleep(load).await;
                    Ok::<_, std::io::Error>(loaded_value(&key, n))
                }
            };
            let answer = tokio::time::timeout(patience, async {
                match cache {
                    Some(cache) => cache
                        .fetch(&key, &CallOptions::new(), loader)
                        .await
                        .map(|f| (outcome_name(f.outcome), f.value))
                        .map_err(|e| e.to_string()),
                    None => naive(&raw, &namespace, &key, ttl_ms, loader).await,
                }
            })
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {patience:?}")));
            let latency = t0.elapsed();
            let age_ms = match &answer {
                Ok((_, value)) => age_ms(value, unix_ms()),
                Err(_) => 0,
            };
            Call {
                started,
                key_index,
                latency,
                outcome: answer.map(|(name, _)| name),
                age_ms,
            }
        })
    };
    match run.rate {
        None => {
            for i in 0..run.callers as usize {
                tasks.push(spawn_call(i));
            }
        }
        Some(rate) => {
            let period = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let duration = Duration::from_millis(run.duration_ms);
            let mut i = 0;
            while origin.elapsed() < duration {
                tick.tick().await;
                tasks.push(spawn_call(i));
                i += 1;
            }
        }
    }
    let mut calls = Vec::with_capacity(tasks.len());
    for t in tasks {
        calls.push(t.await.context("caller task")?);
    }
    drop(counts);
    let not_counted = counting.finish().await;
    if not_counted > 0 {
        eprintln!("worker: {not_counted} loads could not be counted in Redis");
    }
    let samples = match sampler {
        Some(sampler) => sampler.finish().await?,
        None => Vec::new(),
    };
    let mut report = summarize(
        calls,
        local_loads.load(Ordering::SeqCst),
        cache.map(|c| c.stats()),
        samples,
        detail,
    );
    report.origin_unix_ms = origin_unix_ms;
    report.loads_not_counted_in_redis = not_counted;
    report.local_loads_per_key = loads_per_key
        .iter()
        .map(|n| n.load(Ordering::SeqCst))
        .collect();
    report.load_log = std::mem::take(&mut *load_log.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(report)
}

/// Counts loads in Redis (`SADD` of the load's `pid:n` to the key's
/// counter set, and `SET` of the loading pid beside it, for fault tests that
/// kill the holder), each in a task of its own: a load is never slowed by a
/// hung Redis, one hung node does not hold up the counts of the others, and
/// a count that fails (or takes over a second) is retried until Redis
/// answers, so none is lost to a short outage; `SADD` makes a retry whose
/// first try did land (its reply lost) count once. The worker waits for the
/// counts a few seconds at most at the end: what has not landed by then is
/// reported, never waited for (a node hung until the run ends would
/// otherwise hold up the whole fleet).
struct LoadCounter {
    task: tokio::task::JoinHandle<()>,
    /// Counts sent and not (yet) landed.
    pending: Arc<AtomicU64>,
}

/// How long a count is retried before it is given up (and reported).
const COUNT_PATIENCE: Duration = Duration::from_secs(30);
/// How long one attempt at a count may take.
const COUNT_ATTEMPT: Duration = Duration::from_secs(1);
/// How long a load counter (and the loading pid beside it) lives in Redis
/// if the parent does not delete it after the run (it was killed, say):
/// longer than any run (at most an hour), and nothing the fleet writes is
/// left without a TTL.
pub const COUNTER_TTL: Duration = Duration::from_secs(6 * 3_600);

/// One load to count: the counter key, the load's number in this process,
/// and whether it is this process's first load of the key.
struct Count {
    counter: String,
    n: u64,
    first: bool,
}
/// How long the worker waits for its last counts at the end.
const COUNT_FINISH: Duration = Duration::from_secs(5);

impl LoadCounter {
    fn start(raw: Arc<Raw>) -> (mpsc::UnboundedSender<Count>, LoadCounter) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Count>();
        let pending = Arc::new(AtomicU64::new(0));
        let counting = pending.clone();
        let task = tokio::spawn(async move {
            // Dropped (so its counts aborted) if the task is aborted.
            let mut counts = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    next = rx.recv() => match next {
                        Some(count) => {
                            counting.fetch_add(1, Ordering::SeqCst);
                            counts.spawn(Self::count(raw.clone(), count, counting.clone()));
                        }
                        None => break,
                    },
                    Some(_) = counts.join_next(), if !counts.is_empty() => {}
                }
            }
            while counts.join_next().await.is_some() {}
        });
        (tx, LoadCounter { task, pending })
    }

    /// Counts one load.
    async fn count(raw: Arc<Raw>, count: Count, pending: Arc<AtomicU64>) {
        let Count { counter, n, first } = count;
        let given_up = Instant::now() + COUNT_PATIENCE;
        let id = format!("{}:{n}", std::process::id());
        // The set is created by some process's first count, which sends its
        // PEXPIRE in the same write: the counter never lives without a TTL,
        // even if the parent (which deletes it) dies. Later counts keep the
        // TTL (SADD does not clear it) and cost one command.
        let mut sadd = redis::pipe();
        sadd.cmd("SADD").arg(&counter).arg(&id);
        if first {
            sadd.cmd("PEXPIRE")
                .arg(&counter)
                .arg(COUNTER_TTL.as_millis() as u64)
                .ignore();
        }
        loop {
            let attempt = tokio::time::timeout(COUNT_ATTEMPT, raw.pipe::<(i64,)>(&sadd)).await;
            if let Ok(Ok(_)) = attempt {
                pending.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            if Instant::now() > given_up {
                eprintln!("worker: a load could not be counted in Redis");
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pid = redis::cmd("SET")
            .arg(format!("{counter}:pid"))
            .arg(std::process::id())
            .arg("PX")
            .arg(COUNTER_TTL.as_millis() as u64)
            .clone();
        let _ = tokio::time::timeout(COUNT_ATTEMPT, raw.query::<()>(&pid)).await;
    }

    /// Waits (up to 5 s) until every load sent so far is counted (the
    /// senders must be dropped first); returns how many were not.
    async fn finish(mut self) -> u64 {
        if tokio::time::timeout(COUNT_FINISH, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        self.pending.load(Ordering::SeqCst)
    }
}

/// One sample: `[t_ms, lease_acquired, loads_ok, degraded_loads, stale_served]`.
type Sample = [u64; 5];

/// The most samples one worker keeps (almost three hours' worth).
const MAX_SAMPLES: usize = 100_000;

/// Samples a cache's counters every 100 ms into a buffer of its own, which
/// [`Sampler::finish`] hands back.
struct Sampler {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    /// Starts sampling; `origin` is t = 0 of the samples.
    fn start(cache: Cache<String, String>, origin: Instant) -> Sampler {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stopped => return samples,
                    _ = tick.tick() => {}
                }
                if samples.len() < MAX_SAMPLES {
                    let s = cache.stats();
                    samples.push([
                        origin.elapsed().as_millis() as u64,
                        s.lease_acquired,
                        s.loads_ok,
                        s.degraded_loads,
                        s.stale_served,
                    ]);
                }
            }
        });
        Sampler { stop, task }
    }

    /// Stops sampling and returns the samples.
    async fn finish(self) -> anyhow::Result<Vec<Sample>> {
        drop(self.stop);
        self.task.await.context("the sampler task")
    }
}

/// Naive cache-aside over the raw connection: GET, on a miss load and SET.
/// Answers the outcome's name and the value.
async fn naive<F, Fut>(
    raw: &Raw,
    namespace: &str,
    key: &str,
    ttl_ms: u64,
    loader: F,
) -> Result<(&'static str, String), String>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<String, std::io::Error>>,
{
    let value_key = format!("{}:naive", FillKeys::new(namespace, key).value());
    let found: Option<String> = raw
        .query(redis::cmd("GET").arg(&value_key))
        .await
        .map_err(|e| e.to_string())?;
    if let Some(found) = found {
        return Ok(("naive_hit", found));
    }
    let value = loader(key.to_owned()).await.map_err(|e| e.to_string())?;
    raw.query::<()>(
        redis::cmd("SET")
            .arg(&value_key)
            .arg(&value)
            .arg("PX")
            .arg(ttl_ms),
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok(("naive_load", value))
}

fn outcome_name(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Hit => "hit",
        Outcome::Stale => "stale",
        Outcome::Loaded => "loaded",
        Outcome::Waited => "waited",
        Outcome::Degraded => "degraded",
        _ => "other",
    }
}

fn summarize(
    calls: Vec<Call>,
    local_loads: u64,
    stats: Option<onefill::Stats>,
    samples: Vec<Sample>,
    detail: bool,
) -> WorkerReport {
    let mut report = WorkerReport {
        pid: std::process::id(),
        calls: calls.len() as u64,
        local_loads,
        stats,
        samples,
        ..Default::default()
    };
    let first_answer = calls
        .iter()
        .filter(|c| c.outcome.is_ok())
        .map(|c| c.started + c.latency)
        .min();
    let mut latencies: Vec<Duration> = Vec::with_capacity(calls.len());
    for call in &calls {
        latencies.push(call.latency);
        if detail && report.call_log.len() < MAX_LOG {
            report.call_log.push([
                call.started.as_millis() as u64,
                call.key_index as u64,
                match &call.outcome {
                    Ok(name) => outcome_code(name),
                    Err(_) => ERROR,
                },
                call.latency.as_micros() as u64,
                call.age_ms,
            ]);
        }
        match &call.outcome {
            Ok(name) => {
                *report.outcomes.entry((*name).to_owned()).or_default() += 1;
                let slow = matches!(*name, "loaded" | "waited" | "degraded" | "naive_load");
                if slow && first_answer.is_some_and(|first| call.started > first) {
                    report.slow_after_first += 1;
                }
            }
            Err(message) => {
                report.errors += 1;
                if report.error_messages.len() < 5 {
                    report.error_messages.push(message.clone());
                }
            }
        }
    }
    latencies.sort_unstable();
    let ms = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    report.p50_ms = ms(percentile(&latencies, 50.0));
    report.p99_ms = ms(percentile(&latencies, 99.0));
    report.max_ms = ms(latencies.last().copied());
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loaded_value_carries_its_load_time() {
        let before = unix_ms();
        let value = loaded_value("key-3", 7);
        assert!(value.starts_with(&format!("key-3-{}-v7@", std::process::id())));
        let age = age_ms(&value, before + 5_000);
        assert!((4_000..=5_000).contains(&age), "{value}: {age}");
        assert_eq!(age_ms(&value, 0), 0, "a clock gone back is age 0");
        assert_eq!(age_ms("no-time", before), 0);
        assert_eq!(age_ms("x@not-a-number", before), 0);
        assert_eq!(age_ms("a@b@1000", 1_500), 500, "the last @ counts");
    }
}
