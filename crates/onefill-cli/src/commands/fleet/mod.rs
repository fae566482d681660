//! `onefill fleet`: real worker processes against a real Redis.
//!
//! The parent checks that Redis answers, starts `--processes` copies of
//! this binary as `onefill worker`, waits until each has connected
//! ("ready"), reads the servers' command statistics, releases the workers
//! together ("go"), and then reads back from Redis itself how many loads
//! ran (the workers' load-id sets, deleted afterwards unless
//! `--keep-counters`) and how many commands the run cost (the difference in
//! `INFO commandstats`; the statistics are never reset).
//!
//! The hidden `onefill worker` subcommand is one such process ([`worker`]).
//!
//! With `--cluster --fault`, a thread of the parent faults one master in the
//! middle of a steady run ([`fault`]) and the report gets a `fault` section
//! worked out from the workers' call logs ([`fault_report`]).

mod args;
mod fault;
mod fault_report;
mod redis_admin;
mod report;
pub mod worker;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use onefill::backend::FillKeys;

pub use self::args::{FleetArgs, FleetStrategy, RunArgs, WorkerArgs};
use self::fault::{FaultPlan, Injected, Injector};
use self::fault_report::{analyse, CallRecord, LoadRecord, RunShape};
use self::redis_admin::{admin, check_reachable, delete_counters, CommandCounts};
pub use self::report::FleetReport;
use self::report::WorkerReport;
use self::worker::load_counter_key;
use crate::shared::output::print_line;
use crate::shared::progress::Progress;

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // A worker that outlives its report is killed, never orphaned.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `onefill fleet` and prints its report.
pub fn run_command(args: &FleetArgs) -> anyhow::Result<()> {
    let progress = Progress::new(!args.quiet);
    let namespace = args.namespace.clone().unwrap_or_else(fresh_namespace);
    let run_args = resolve(args)?;
    let fault = args.fault.map(|kind| FaultPlan {
        kind,
        at_ms: args.fault_at_ms,
    });
    progress.say(format!(
        "starting {} worker processes ({:?}, namespace {namespace})…",
        args.processes, run_args.strategy
    ));
    if let Some(plan) = fault {
        progress.say(format!(
            "fault {:?} of the master owning the most of the {} keys at {} ms",
            plan.kind,
            run_args.keys.len(),
            plan.at_ms
        ));
    }
    let ticker = run_args
        .rate
        .map(|_| Ticker::start(progress, run_args.duration_ms));
    let report = run_with(&run_args, args.processes, &namespace, fault, progress);
    drop(ticker);
    let mut report = report?;
    if !args.run.detail {
        // --fault alone keeps its summary, not the logs.
        for w in &mut report.workers {
            w.call_log = Vec::new();
            w.load_log = Vec::new();
        }
    }
    if args.json {
        print_line(&serde_json::to_string_pretty(&report)?)?;
    } else {
        print_line(&report.to_text(&args.run))?;
    }
    progress.say(format!("fleet done in {:.0} ms", report.wall_ms));
    Ok(())
}

/// The run the workers get: `--key-count` made into a key list, `--detail`
/// on with `--fault`; and the checks clap cannot make.
fn resolve(args: &FleetArgs) -> anyhow::Result<RunArgs> {
    let mut run = args.run.clone();
    if let Some(n) = args.key_count {
        run.keys = (0..n).map(|i| format!("key-{i}")).collect();
    }
    if args.fault.is_some() {
        if args.fault_at_ms >= run.duration_ms {
            bail!(
                "--fault-at-ms ({}) must be less than --duration-ms ({})",
                args.fault_at_ms,
                run.duration_ms
            );
        }
        run.detail = true;
    }
    Ok(run)
}

/// Prints the elapsed time of a steady run every 2 s until dropped.
struct Ticker {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    fn start(progress: Progress, duration_ms: u64) -> Ticker {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut next = 2;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(100));
                if started.elapsed().as_secs() >= next {
                    progress.say(format!(
                        "  {next} s of {:.1} s…",
                        duration_ms as f64 / 1000.0
                    ));
                    next += 2;
                }
            }
        });
        Ticker {
            done,
            thread: Some(thread),
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A namespace no earlier run used.
pub fn fresh_namespace() -> String {
    format!("fleet-{}", &onefill::LeaseToken::random().as_str()[..12])
}

/// Runs one fleet and measures it.
pub fn run(args: &RunArgs, processes: u32, namespace: &str) -> anyhow::Result<FleetReport> {
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
    let exe = std::env::current_exe().context("locating the onefill binary")?;
    let run_json = args.to_json().context("encoding the run for the workers")?;
    let mut workers = Vec::new();
    for _ in 0..processes {
        workers.push(spawn(&exe, &run_json, namespace)?);
    }
    for w in &mut workers {
        let mut line = String::new();
        w.stdout.read_line(&mut line)?;
        let line = line.trim();
        if line == "ready" {
            continue;
        }
        // One line for the fleet (the other workers are killed on drop),
        // whatever number of them failed the same way.
        match line.strip_prefix(worker::NOT_READY) {
            Some(reason) => bail!("a worker could not start: {}", reason.trim()),
            None => {
                let status = w.child.wait()?;
                bail!("a worker exited before it was ready ({status})")
            }
        }
    }
    // The slot of each key's value key, for the victim's choice.
    let slots = match fault {
        Some(_) => {
            let value_keys: Vec<String> = args
                .keys
                .iter()
                .map(|k| FillKeys::new(namespace, k).value().to_owned())
                .collect();
            fault::key_slots(&args.redis, &value_keys)?
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
    for w in &mut workers {
        writeln!(w.stdin, "go")?;
        w.stdin.flush()?;
    }
    let mut reports = Vec::new();
    for w in &mut workers {
        let mut line = String::new();
        w.stdout.read_line(&mut line)?;
        let report: WorkerReport = serde_json::from_str(line.trim())
            .with_context(|| format!("a worker's report was not JSON: {:?}", line.trim()))?;
        reports.push(report);
        let status = w.child.wait()?;
        if !status.success() {
            bail!("a worker exited with {status}");
        }
    }
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
        delete_counters(args, &counters)?;
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
) -> fault_report::FaultReport {
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

/// Starts one worker, with the run as one JSON value.
fn spawn(exe: &std::path::Path, run_json: &str, namespace: &str) -> anyhow::Result<Worker> {
    let mut cmd = Command::new(exe);
    cmd.args(WorkerArgs::command_line(run_json, namespace));
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting a worker process")?;
    let stdin = child.stdin.take().context("worker stdin")?;
    let stdout = BufReader::new(child.stdout.take().context("worker stdout")?);
    Ok(Worker {
        child,
        stdin,
        stdout,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn resolved(argv: &[&str]) -> anyhow::Result<RunArgs> {
        let argv = ["onefill", "fleet", "--redis", "redis://x"]
            .iter()
            .chain(argv);
        match Cli::try_parse_from(argv)?.command {
            Command::Fleet(args) => resolve(&args),
            other => panic!("not a fleet: {other:?}"),
        }
    }

    #[test]
    fn key_count_and_fault_are_resolved_before_the_workers() {
        let run = resolved(&["--key-count", "3"]).expect("resolves");
        assert_eq!(run.keys, ["key-0", "key-1", "key-2"]);
        assert!(!run.detail);
        let run = resolved(&["--cluster", "--rate", "5", "--fault", "failover"]).expect("resolves");
        assert_eq!(run.keys, ["hot"]);
        assert!(run.detail, "a fault needs the call logs");
        let late = [
            "--cluster",
            "--rate",
            "5",
            "--fault",
            "kill",
            "--duration-ms",
            "5000",
        ];
        assert!(
            resolved(&late).is_err(),
            "the fault must come before the end"
        );
    }
}
