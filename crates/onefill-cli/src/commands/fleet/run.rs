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

use super::args::{FleetStrategy, RunArgs};
use super::fault::analysis::{analyse, EARLY_LOADS};
use super::fault::holder::{HolderInjector, HolderKeys, Server};
use super::fault::holder_report::{analyse_holder, SurvivorLogs};
use super::fault::injector::Injector;
use super::fault::kind::{FaultKind, FaultPlan, Injected};
use super::fault::records::RunShape;
use super::fault::report::FaultReport;
use super::fault::sentinel::{SentinelInjector, SentinelTarget};
use super::fault::topology::key_slots;
use super::processes::{
    collect_faulted, collect_report, collect_reports, release, start_workers, Worker,
};
use super::protocol::load_counter_key;
use super::redis_admin::{admin, admin_run, check_reachable, delete_keys, CommandCounts};
use super::report::{FleetReport, Records, WorkerReport};
use super::writer::Writer;
use super::written::{WritePlan, WriteReport};
use crate::shared::progress::Progress;

/// A namespace no earlier run used.
pub fn fresh_namespace() -> String {
    format!("fleet-{}", &onefill::LeaseToken::random().as_str()[..12])
}

/// Runs one fleet and measures it.
pub fn run_fleet(args: &RunArgs, processes: u32, namespace: &str) -> anyhow::Result<FleetReport> {
    run_with(args, processes, namespace, None, None, Progress::new(false))
}

/// Now, as milliseconds since the Unix epoch.
fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Runs one fleet, with a fault injected if `fault` is given: into the
/// cluster (`args` must then be a steady run on a cluster), or into the
/// worker holding a lease (`args` must then be a herd of the onefill
/// strategy on one server or a cluster); and with `write` the parent's one write of
/// the first key.
pub fn run_with(
    args: &RunArgs,
    processes: u32,
    namespace: &str,
    fault: Option<FaultPlan>,
    write: Option<WritePlan>,
    progress: Progress,
) -> anyhow::Result<FleetReport> {
    if let Some(plan) = fault {
        let onefill_herd = args.sentinel.is_empty()
            && args.rate.is_none()
            && args.strategy == FleetStrategy::Onefill;
        if plan.kind.is_holder() && !onefill_herd {
            bail!(
                "a holder fault needs a herd (no --rate) of the onefill strategy on one server \
                 or a cluster (no --sentinel)"
            );
        }
        let steady_and_replicated =
            (args.cluster || !args.sentinel.is_empty()) && args.rate.is_some();
        if !plan.kind.is_holder() && !steady_and_replicated {
            bail!(
                "a fault of a master needs a steady run (--rate) on a cluster (--cluster) or \
                 through Sentinels (--sentinel)"
            );
        }
    }
    let through_sentinels = !args.sentinel.is_empty();
    let sentinel_fault = fault.filter(|p| !p.kind.is_holder() && through_sentinels);
    let cluster_fault = fault.filter(|p| !p.kind.is_holder() && !through_sentinels);
    let holder_fault = fault.filter(|p| p.kind.is_holder());
    check_reachable(&admin_run(args)?)?;
    let mut workers = start_workers(args, processes, namespace)?;
    // The slot of each key's value key, for the victim's choice.
    let slots = match cluster_fault {
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
    let commands_before = CommandCounts::read(&admin_run(args)?)?;
    let started = Instant::now();
    let started_unix_ms = unix_ms();
    // From here on a hung victim is resumed whatever happens: the
    // injectors' guards drop on every path out of this function.
    let injector = cluster_fault.map(|plan| {
        Injector::start(
            plan,
            args.redis.clone(),
            slots,
            started,
            args.duration_ms,
            progress,
        )
    });
    let sentinel_injector = sentinel_fault.map(|plan| {
        SentinelInjector::start(
            plan,
            SentinelTarget {
                sentinels: args.sentinel.clone(),
                name: args.master_name.clone().unwrap_or_default(),
                value_keys: args
                    .keys
                    .iter()
                    .map(|k| FillKeys::new(namespace, k).value().to_owned())
                    .collect(),
                // Longer than an early refresh starts before expiry.
                margin_ms: (EARLY_LOADS * args.load_ms as f64) as u64,
            },
            started,
            args.duration_ms,
            progress,
        )
    });
    let holder_injector = match holder_fault {
        Some(plan) => Some(HolderInjector::start(
            plan,
            if args.cluster {
                Server::Cluster(args.redis.clone())
            } else {
                Server::Single(args.redis.first().context("no Redis URL")?.clone())
            },
            holder_keys(args, namespace),
            workers.iter().map(Worker::pid).collect(),
            started,
            progress,
        )),
        None => None,
    };
    let writer = write.map(|plan| Writer::start(plan, args, namespace, started));
    release(&mut workers)?;
    let (reports, holder) = match holder_injector {
        None => (collect_reports(&mut workers)?, None),
        Some(injector) => {
            let (injected, guard) = injector.finish();
            let injected = injected.context("faulting the lease holder")?;
            // The others first: a stopped holder answers nothing until it
            // is resumed, and is resumed once they have all answered.
            let mut reports: Vec<WorkerReport> = Vec::new();
            for w in workers.iter_mut().filter(|w| w.pid() != injected.pid) {
                reports.push(collect_report(w)?);
            }
            let resumed_at_ms = (injected.kind == FaultKind::StopHolder)
                .then(|| started.elapsed().as_secs_f64() * 1000.0);
            drop(guard);
            let holder: Option<WorkerReport> =
                match workers.iter_mut().find(|w| w.pid() == injected.pid) {
                    Some(w) => collect_faulted(w)?,
                    None => None,
                };
            (reports, Some((injected, holder, resumed_at_ms)))
        }
    };
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut records = Records::default();
    for r in &reports {
        records.extend(Records::of_worker(r, started_unix_ms));
    }
    let finished = match (injector, sentinel_injector) {
        (Some(injector), _) => Some(injector.finish()),
        (None, Some(injector)) => Some(injector.finish()),
        (None, None) => None,
    };
    let fault_report = match finished {
        Some((injected, guard)) => {
            // Resume a hung victim before asking the nodes anything.
            drop(guard);
            let injected = injected.context("injecting the fault")?;
            Some(fault_section(args, &injected, &records))
        }
        None => None,
    };
    // The primary now (a failover may have changed it).
    let admin_args = admin_run(args)?;
    let args = &admin_args;
    let write_report = match writer {
        Some(writer) => {
            let written = writer.finish()?;
            Some(WriteReport::analyse(
                &written,
                0,
                &records.calls,
                &records.loads,
            ))
        }
        None => None,
    };
    let holder_report = holder.map(|(injected, holder, resumed_at_ms)| {
        let holder_calls = holder.map(|h| Records::of_worker(&h, started_unix_ms).calls);
        let survivors = SurvivorLogs {
            processes: reports.len() as u32,
            callers_per_process: args.callers,
            calls: &records.calls,
            loads: &records.loads,
            wait_timeouts: reports
                .iter()
                .filter_map(|r| r.stats.as_ref())
                .map(|s| s.wait_timeouts)
                .sum(),
        };
        analyse_holder(
            &injected,
            &args.keys,
            &survivors,
            holder_calls.as_deref(),
            resumed_at_ms,
        )
    });
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
        callers_kind: args.callers_kind,
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
        holder_fault: holder_report,
        write: write_report,
        redis_commands,
        calls: reports.iter().map(|r| r.calls).sum(),
        errors: reports.iter().map(|r| r.errors).sum(),
        blocking_calls: reports.iter().map(|r| r.blocking_calls).sum(),
        max_ms: reports.iter().map(|r| r.max_ms).fold(0.0, f64::max),
        p99_ms: reports.iter().map(|r| r.p99_ms).fold(0.0, f64::max),
        workers: reports,
        wall_ms,
        records,
    })
}

/// Where the holder of each of the run's keys is found: its lease key and
/// the `loads:pid` key the workers write.
fn holder_keys(args: &RunArgs, namespace: &str) -> Vec<HolderKeys> {
    args.keys
        .iter()
        .map(|k| HolderKeys {
            lock: FillKeys::new(namespace, k).lock().to_owned(),
            pid: format!("{}:pid", load_counter_key(namespace, k)),
        })
        .collect()
}

/// The `fault` section: the workers' logs (on the parent's clock)
/// [`analyse`]d.
fn fault_section(args: &RunArgs, injected: &Injected, records: &Records) -> FaultReport {
    let shape = RunShape {
        keys: args.keys.len(),
        duration_ms: args.duration_ms,
        ttl_ms: args.ttl_ms,
        grace_ms: args.grace_ms,
        load_ms: args.load_ms,
    };
    analyse(injected, &args.keys, shape, &records.calls, &records.loads)
}
