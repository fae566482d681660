//! Running one fleet: the parent starts the worker processes, waits until
//! each has connected ("ready"), reads the servers' command statistics,
//! releases the workers together ("go"), and then reads back from Redis
//! itself how many loads ran (the workers' load-id sets, deleted afterwards
//! unless `--keep-counters`) and how many commands the run cost (the
//! difference in `INFO commandstats`; the statistics are never reset).
//!
//! Both `onefill fleet` and `demo --redis` run fleets through here.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use onefill::backend::FillKeys;

use super::args::RunArgs;
use super::fault::analysis::analyse;
use super::fault::injector::Injector;
use super::fault::kind::{FaultPlan, Injected};
use super::fault::records::{CallRecord, LoadRecord, RunShape};
use super::fault::report::FaultReport;
use super::fault::topology::key_slots;
use super::processes::{collect_reports, release, start_workers};
use super::protocol::load_counter_key;
use super::redis_admin::{admin, check_reachable, delete_keys, CommandCounts};
use super::report::{FleetReport, WorkerReport};
use crate::shared::progress::Progress;

/// A namespace no earlier run used.
pub fn fresh_namespace() -> String {
    format!("fleet-{}", &onefill::LeaseToken::random().as_str()[..12])
}

/// Runs one fleet and measures it.
pub fn run_fleet(args: &RunArgs, processes: u32, namespace: &str) -> anyhow::Result<FleetReport> {
    run_with(args, processes, namespace, None, Progress::new(false))
}

/// Now, as milliseconds since the Unix epoch.
fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Runs one fleet, with a fault injected into the cluster if `fault` is
/// given (`args` must then be a steady run on a cluster, with `detail`).
pub fn run_with(
    args: &RunArgs,
    processes: u32,
    namespace: &str,
    fault: Option<FaultPlan>,
    progress: Progress,
) -> anyhow::Result<FleetReport> {
    if fault.is_some() && !(args.cluster && args.rate.is_some() && args.detail) {
        bail!("a fault needs a steady run (--rate) on a cluster (--cluster)");
    }
    check_reachable(args)?;
    let mut workers = start_workers(args, processes, namespace)?;
    // The slot of each key's value key, for the victim's choice.
    let slots = match fault {
        Some(_) => {
            let value_keys: Vec<String> = args
                .keys
                .iter()
                .map(|k| FillKeys::new(namespace, k).value().to_owned())
                .collect();
            key_slots(&args.redis, &value_keys)?
        }
        None => Vec::new(),
    };
    let commands_before = CommandCounts::read(args)?;
    let started = Instant::now();
    let started_unix_ms = unix_ms();
    // From here on a hung victim is resumed whatever happens: the
    // injector's guard drops on every path out of this function.
    let injector = fault.map(|plan| {
        Injector::start(
            plan,
            args.redis.clone(),
            slots,
            started,
            args.duration_ms,
            progress,
        )
    });
    release(&mut workers)?;
    let reports: Vec<WorkerReport> = collect_reports(&mut workers)?;
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    let fault_report = match injector {
        Some(injector) => {
            let (injected, guard) = injector.finish();
            // Resume a hung victim before asking the nodes anything.
            drop(guard);
            let injected = injected.context("injecting the fault")?;
            Some(fault_section(args, &injected, &reports, started_unix_ms))
        }
        None => None,
    };
    let redis_commands = CommandCounts::read(args)?.since(&commands_before);
    let mut loads_per_key = Vec::new();
    let mut counters = Vec::new();
    for key in &args.keys {
        let counter = load_counter_key(namespace, key);
        let n = admin(args, &["SCARD", &counter])?
            .trim()
            .parse::<i64>()
            .unwrap_or(0);
        loads_per_key.push((key.clone(), n));
        counters.push(format!("{counter}:pid"));
        counters.push(counter);
    }
    if !args.keep_counters {
        delete_keys(args, &counters)?;
    }
    Ok(FleetReport {
        strategy: args.strategy,
        processes,
        callers_per_process: args.callers,
        namespace: namespace.to_owned(),
        loads: loads_per_key.iter().map(|(_, n)| n).sum(),
        loads_per_key,
        local_loads: reports.iter().map(|r| r.local_loads).sum(),
        local_loads_per_key: args
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let n = reports
                    .iter()
                    .filter_map(|r| r.local_loads_per_key.get(i))
                    .sum();
                (k.clone(), n)
            })
            .collect(),
        fault: fault_report,
        redis_commands,
        calls: reports.iter().map(|r| r.calls).sum(),
        errors: reports.iter().map(|r| r.errors).sum(),
        max_ms: reports.iter().map(|r| r.max_ms).fold(0.0, f64::max),
        p99_ms: reports.iter().map(|r| r.p99_ms).fold(0.0, f64::max),
        workers: reports,
        wall_ms,
    })
}

/// The `fault` section: the workers' logs moved onto the parent's clock
/// (each worker's t = 0 is its own "go", a few ms after the parent's),
/// then [`analyse`]d.
fn fault_section(
    args: &RunArgs,
    injected: &Injected,
    reports: &[WorkerReport],
    started_unix_ms: f64,
) -> FaultReport {
    let mut calls = Vec::new();
    let mut loads = Vec::new();
    for r in reports {
        let shift = r.origin_unix_ms as f64 - started_unix_ms;
        calls.extend(r.call_log.iter().map(|c| CallRecord {
            started_ms: c[0] as f64 + shift,
            key: c[1] as usize,
            outcome: c[2],
            latency_ms: c[3] as f64 / 1000.0,
            age_ms: c[4],
        }));
        loads.extend(r.load_log.iter().map(|l| LoadRecord {
            started_ms: l[0] as f64 + shift,
            key: l[1] as usize,
        }));
    }
    let shape = RunShape {
        keys: args.keys.len(),
        duration_ms: args.duration_ms,
        ttl_ms: args.ttl_ms,
        grace_ms: args.grace_ms,
        load_ms: args.load_ms,
    };
    analyse(injected, &args.keys, shape, &calls, &loads)
}
