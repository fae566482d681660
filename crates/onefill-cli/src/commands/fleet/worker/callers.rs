//! A worker's callers: a herd released together, or steady load at a rate,
//! each asking the cache of the strategy (or naive cache-aside) for one
//! key, with a loader that sleeps like the origin and stamps its value.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use onefill::backend::FillKeys;
use onefill::Cache;

use super::load_counter::{Count, LoadCounter};
use super::load_log::LoadLog;
use super::sampler::Sampler;
use super::summary::{summarize, Call};
use crate::commands::fleet::args::{RunArgs, WorkerArgs};
use crate::commands::fleet::connections::Raw;
use crate::commands::fleet::outcome::outcome_name;
use crate::commands::fleet::protocol::load_counter_key;
use crate::commands::fleet::report::WorkerReport;

/// How long the worker waits for one call: a call that never answers is an
/// error, not a worker that never ends. Far beyond any bound of the
/// library's: 2 minutes plus three loads plus the wait deadline.
fn call_patience(run: &RunArgs) -> Duration {
    Duration::from_secs(120)
        + Duration::from_millis(run.load_ms.saturating_mul(3))
        + Duration::from_millis(run.wait_deadline_ms.unwrap_or(10_000))
}

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

/// Runs the callers of `run` and reports what they saw.
pub async fn steady_or_herd(
    args: &WorkerArgs,
    run: &RunArgs,
    raw: Arc<Raw>,
    cache: Option<Cache<String, String>>,
) -> anyhow::Result<WorkerReport> {
    let local_loads = Arc::new(AtomicU64::new(0));
    let loads_per_key: Arc<Vec<AtomicU64>> =
        Arc::new(run.keys.iter().map(|_| AtomicU64::new(0)).collect());
    let (counts, counting) = LoadCounter::start(raw.clone());
    let origin = Instant::now();
    let load_log = LoadLog::new(origin);
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
                    // Logged from here to the value (or to a cancelled
                    // load's drop), for the parent's report.
                    let _span = load_log.start(key_index);
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
                        .fetch(&key, loader)
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
    );
    report.origin_unix_ms = origin_unix_ms;
    report.loads_not_counted_in_redis = not_counted;
    report.local_loads_per_key = loads_per_key
        .iter()
        .map(|n| n.load(Ordering::SeqCst))
        .collect();
    report.load_spans = load_log.take();
    report.load_log = report.load_spans.iter().map(|&[s, k, _]| [s, k]).collect();
    Ok(report)
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
