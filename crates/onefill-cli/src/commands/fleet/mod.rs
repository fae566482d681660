//! `onefill fleet`: real worker processes against a real Redis.
//!
//! The parent starts `--processes` copies of this binary as `onefill worker`,
//! waits until each has connected ("ready"), resets the server's command
//! statistics, releases them together ("go"), and then reads back from Redis
//! itself how many loads ran (the workers' load-id sets) and how many
//! commands the run cost (`INFO commandstats`).
//!
//! The hidden `onefill worker` subcommand is one such process ([`worker`]).

mod args;
mod redis_admin;
mod report;
pub mod worker;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};

pub use self::args::{FleetArgs, FleetStrategy, RunArgs, WorkerArgs};
use self::redis_admin::{admin, command_count};
pub use self::report::FleetReport;
use self::report::WorkerReport;
use self::worker::load_counter_key;
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
    progress.say(format!(
        "starting {} worker processes ({:?}, namespace {namespace})…",
        args.processes, args.run.strategy
    ));
    let ticker = args
        .run
        .rate
        .map(|_| Ticker::start(progress, args.run.duration_ms));
    let report = run(&args.run, args.processes, &namespace);
    drop(ticker);
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.to_text(&args.run));
    }
    progress.say(format!("fleet done in {:.0} ms", report.wall_ms));
    Ok(())
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
    let exe = std::env::current_exe().context("locating the onefill binary")?;
    let run_json = args.to_json().context("encoding the run for the workers")?;
    let mut workers = Vec::new();
    for _ in 0..processes {
        workers.push(spawn(&exe, &run_json, namespace)?);
    }
    for w in &mut workers {
        let mut line = String::new();
        w.stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("a worker did not start: {:?}", line.trim());
        }
    }
    admin(args, &["CONFIG", "RESETSTAT"])?;
    let started = Instant::now();
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
    let redis_commands = command_count(args)?;
    let mut loads_per_key = Vec::new();
    for key in &args.keys {
        let n = admin(args, &["SCARD", &load_counter_key(namespace, key)])?
            .trim()
            .parse::<i64>()
            .unwrap_or(0);
        loads_per_key.push((key.clone(), n));
    }
    Ok(FleetReport {
        strategy: args.strategy,
        processes,
        callers_per_process: args.callers,
        namespace: namespace.to_owned(),
        loads: loads_per_key.iter().map(|(_, n)| n).sum(),
        loads_per_key,
        redis_commands,
        calls: reports.iter().map(|r| r.calls).sum(),
        errors: reports.iter().map(|r| r.errors).sum(),
        max_ms: reports.iter().map(|r| r.max_ms).fold(0.0, f64::max),
        p99_ms: reports.iter().map(|r| r.p99_ms).fold(0.0, f64::max),
        workers: reports,
        wall_ms,
    })
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
