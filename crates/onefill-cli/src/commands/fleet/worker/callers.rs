//! A worker's callers: a herd released together, or steady load at a rate,
//! each asking the cache of the strategy (or naive cache-aside) for one
//! key, with a loader that sleeps like the origin and stamps its value.
//! A caller is a task ([`async_caller`](super::async_caller)) or, with
//! `--callers-kind blocking|mixed`, an OS thread on the blocking cache
//! ([`blocking_caller`](super::blocking_caller)); both are collected and
//! summed up alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use onefill::Cache;

use super::async_caller::{self, Naive};
use super::blocking_caller::Threads;
use super::caller::Caller;
use super::load_counter::LoadCounter;
use super::load_log::LoadLog;
use super::origin::{unix_ms, Origin};
use super::sampler::Sampler;
use super::summary::summarize;
use crate::commands::fleet::args::{CallersKind, RunArgs, WorkerArgs};
use crate::commands::fleet::connections::Raw;
use crate::commands::fleet::report::WorkerReport;
use crate::shared::args::MAX_CALLER_THREADS;

/// How long the worker waits for one call: a call that never answers is an
/// error, not a worker that never ends. Far beyond any bound of the
/// library's: 2 minutes plus three loads plus the wait deadline.
fn call_patience(run: &RunArgs) -> Duration {
    Duration::from_secs(120)
        + Duration::from_millis(run.load_ms.saturating_mul(3))
        + Duration::from_millis(run.wait_deadline_ms.unwrap_or(10_000))
}

/// Whether caller `i` of a run of `keys` keys is an OS thread. Mixed
/// callers alternate by round over the keys (caller `i` asks for key
/// `i % keys`), so every key with two callers or more has both kinds.
fn on_a_thread(kind: CallersKind, i: usize, keys: usize) -> bool {
    match kind {
        CallersKind::Async => false,
        CallersKind::Blocking => true,
        CallersKind::Mixed => (i / keys.max(1)) % 2 == 1,
    }
}

/// Runs the callers of `run` and reports what they saw.
pub async fn steady_or_herd(
    args: &WorkerArgs,
    run: &RunArgs,
    raw: Arc<Raw>,
    cache: Option<Cache<String, String>>,
) -> anyhow::Result<WorkerReport> {
    // On this worker's multi-thread runtime, which drives the backend
    // while the threads wait.
    let threads = match (run.callers_kind, &cache) {
        (CallersKind::Async, _) => None,
        (_, Some(cache)) => Some(Threads::new(
            cache.blocking().context("the blocking cache")?,
            MAX_CALLER_THREADS,
        )),
        (_, None) => bail!("OS-thread callers need a onefill strategy: the naive one has no cache"),
    };
    let (counts, counting) = LoadCounter::start(raw.clone());
    let epoch = Instant::now();
    let load_log = LoadLog::new(epoch);
    let origin_unix_ms = unix_ms();
    let origin = Origin::new(
        Duration::from_millis(run.load_ms),
        &args.namespace,
        run.keys.len(),
        load_log.clone(),
        counts,
    );
    let sampler = cache.clone().map(|cache| Sampler::start(cache, epoch));
    let naive = Naive {
        raw,
        namespace: args.namespace.clone(),
        ttl_ms: run.ttl_ms,
    };
    let patience = call_patience(run);
    let keys = &run.keys;
    let spawn_call = |i: usize| {
        let key_index = i % keys.len();
        let caller = Caller {
            key_index,
            key: keys[key_index].clone(),
            origin: origin.clone(),
            epoch,
            patience,
        };
        match threads
            .as_ref()
            .filter(|_| on_a_thread(run.callers_kind, i, keys.len()))
        {
            Some(threads) => threads.spawn(caller),
            None => async_caller::spawn(caller, cache.clone(), naive.clone()),
        }
    };
    let mut tasks = Vec::new();
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
            while epoch.elapsed() < duration {
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
    let (local_loads, local_loads_per_key) = (origin.local_loads(), origin.local_loads_per_key());
    // The counter ends once every sender (the origin's clones) is gone.
    drop(origin);
    let not_counted = counting.finish().await;
    if not_counted > 0 {
        eprintln!("worker: {not_counted} loads could not be counted in Redis");
    }
    let samples = match sampler {
        Some(sampler) => sampler.finish().await?,
        None => Vec::new(),
    };
    let mut report = summarize(calls, local_loads, cache.map(|c| c.stats()), samples);
    report.origin_unix_ms = origin_unix_ms;
    report.loads_not_counted_in_redis = not_counted;
    report.local_loads_per_key = local_loads_per_key;
    report.load_spans = load_log.take();
    report.load_log = report.load_spans.iter().map(|&[s, k, _]| [s, k]).collect();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_callers_give_every_key_both_kinds() {
        for keys in [1, 2, 3] {
            for key in 0..keys {
                let kinds: Vec<bool> = (0..4 * keys)
                    .filter(|i| i % keys == key)
                    .map(|i| on_a_thread(CallersKind::Mixed, i, keys))
                    .collect();
                assert_eq!(kinds, [false, true, false, true], "{keys} keys, key {key}");
            }
        }
        assert!(!on_a_thread(CallersKind::Async, 1, 1));
        assert!(on_a_thread(CallersKind::Blocking, 0, 1));
    }
}
