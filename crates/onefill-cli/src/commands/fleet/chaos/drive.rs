//! Running `fleet --chaos`: the workers started (each reads through an
//! L1), the foreign client connected, all released together (and, on a
//! cluster, the resharding thread), the records gathered and checked, and
//! the run's values deleted (a `PERSIST` may have left one without a TTL).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use onefill::backend::FillKeys;

use super::check::{check, Limits};
use super::foreign::Foreign;
use super::records::{now_us, ChaosWorkerReport};
use super::report::ChaosReport;
use super::reshard::Reshard;
use crate::commands::fleet::args::{FleetStrategy, RunArgs};
use crate::commands::fleet::fault::topology::key_slots;
use crate::commands::fleet::processes::{collect_reports, release, start_workers};
use crate::commands::fleet::redis_admin::{check_reachable, delete_keys};
use crate::shared::progress::Progress;

/// How a chaos run acts and judges.
#[derive(Debug, Clone, Copy)]
pub struct ChaosPlan {
    /// Foreign operations per second.
    pub ops_per_sec: u32,
    /// How far the workers' clocks may be from the server's.
    pub clock_skew: Duration,
}

/// The bound every answer is held to: the sync bound of the L1 the workers
/// build (`L1::new`'s default). While Redis is reachable a change reaches
/// the L1 within a round trip; the sync bound is what the L1 promises in
/// every case.
pub fn bound() -> Duration {
    onefill::L1::new(1).sync_bound
}

/// Runs the chaos check and reports it.
pub fn run_chaos(
    args: &RunArgs,
    processes: u32,
    namespace: &str,
    plan: ChaosPlan,
    progress: Progress,
) -> anyhow::Result<ChaosReport> {
    if !args.chaos {
        bail!("not a chaos run");
    }
    if args.strategy == FleetStrategy::Naive {
        bail!("--chaos checks onefill's caches: the naive strategy has none");
    }
    check_reachable(args)?;
    let value_keys: Vec<String> = args
        .keys
        .iter()
        .map(|k| FillKeys::new(namespace, k).value().to_owned())
        .collect();
    let slots = if args.cluster {
        key_slots(&args.redis, &value_keys)?
    } else {
        Vec::new()
    };
    let mut workers = start_workers(args, processes, namespace)?;
    let foreign = Foreign::connect(args, namespace, plan.ops_per_sec)?;
    let started = Instant::now();
    let started_us = now_us();
    release(&mut workers)?;
    foreign.start(started);
    let reshard = args.cluster.then(|| {
        Reshard::start(
            args.redis.clone(),
            slots,
            started,
            Duration::from_millis(args.duration_ms),
            progress,
        )
    });
    let reports: anyhow::Result<Vec<ChaosWorkerReport>> = collect_reports(&mut workers);
    let ops = foreign.finish().context("the foreign client");
    let events = reshard
        .map(Reshard::finish)
        .transpose()
        .context("resharding");
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    // Whatever happened, nothing of the run is left without a TTL.
    let cleaned = delete_keys(args, &value_keys);
    let (reports, ops, events) = (reports?, ops?, events?.unwrap_or_default());
    cleaned.context("deleting the run's values")?;
    progress.say(format!(
        "checking {} answers against {} foreign operations…",
        reports.iter().map(|r| r.answers.len()).sum::<usize>(),
        ops.len()
    ));
    let limits = Limits {
        bound_us: bound().as_micros() as u64,
        skew_us: plan.clock_skew.as_micros() as u64,
        max_ttl_ms: args.ttl_ms + args.grace_ms,
    };
    let mut verdict = check(args.keys.len(), &ops, &reports, limits);
    for v in &mut verdict.shown {
        v.at_ms = (v.start_us as f64 - started_us as f64) / 1000.0;
    }
    let stat = |f: fn(&onefill::Stats) -> u64| -> u64 {
        reports.iter().filter_map(|r| r.stats.as_ref()).map(f).sum()
    };
    Ok(ChaosReport {
        cluster: args.cluster,
        processes,
        keys: args.keys.len(),
        namespace: namespace.to_owned(),
        duration_ms: args.duration_ms,
        bound_ms: bound().as_secs_f64() * 1000.0,
        clock_skew_ms: plan.clock_skew.as_secs_f64() * 1000.0,
        answers: verdict.answers,
        violations: verdict.violations,
        violations_by_outcome: verdict.violations_by_outcome,
        first_violations: verdict.shown,
        worst_lag_ms: verdict.worst_lag_ms,
        worst_lag_from_l1: verdict.worst_lag_from_l1,
        late_answers: verdict.late_answers,
        loads: verdict.loads,
        foreign_ops: verdict.ops,
        cluster_events: events,
        l1_hits: stat(|s| s.l1_hits),
        l1_invalidations: stat(|s| s.l1_invalidations),
        l1_resets: stat(|s| s.l1_resets),
        error_messages: reports
            .iter()
            .flat_map(|r| r.error_messages.iter().cloned())
            .take(5)
            .collect(),
        wall_ms,
    })
}
