//! `onefill fleet`: real worker processes against a real Redis.
//!
//! The parent starts `--processes` copies of this binary as `onefill worker`,
//! waits until each has connected ("ready"), resets the server's command
//! statistics, releases them together ("go"), and then reads back from Redis
//! itself how many loads ran (the workers' `INCR` counters) and how many
//! commands the run cost (`INFO commandstats`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;

use crate::cli::{FleetArgs, FleetStrategy, RunArgs};
use crate::progress::Progress;
use crate::worker::{load_counter_key, WorkerReport};

/// The measured result of one fleet run.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    /// Strategy of every process.
    pub strategy: FleetStrategy,
    /// Worker processes.
    pub processes: u32,
    /// Callers per process (herd mode).
    pub callers_per_process: u32,
    /// Namespace used.
    pub namespace: String,
    /// Loads per key, counted in Redis.
    pub loads_per_key: Vec<(String, i64)>,
    /// All loads, counted in Redis.
    pub loads: i64,
    /// Commands the server executed during the run (all nodes), excluding
    /// the parent's own CONFIG/INFO.
    pub redis_commands: u64,
    /// Calls made by all processes.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Worst caller latency over all processes, ms.
    pub max_ms: f64,
    /// Highest per-process p99, ms.
    pub p99_ms: f64,
    /// Each process's own report.
    pub workers: Vec<WorkerReport>,
    /// From "go" to the last report, ms.
    pub wall_ms: f64,
}

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
        let shape = match args.run.rate {
            Some(rate) => format!(
                "{} processes × {rate} req/s for {} ms",
                report.processes, args.run.duration_ms
            ),
            None => format!(
                "{} processes × {} callers",
                report.processes, report.callers_per_process
            ),
        };
        println!(
            "{shape} ({:?}): {} loads (counted in Redis), {} Redis commands, {} calls, \
             {} errors, worst p99 {:.1} ms, max {:.1} ms",
            report.strategy,
            report.loads,
            report.redis_commands,
            report.calls,
            report.errors,
            report.p99_ms,
            report.max_ms
        );
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
    let mut workers = Vec::new();
    for _ in 0..processes {
        workers.push(spawn(&exe, args, namespace)?);
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
        let n = admin(args, &["GET", &load_counter_key(namespace, key)])?
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

fn spawn(exe: &std::path::Path, args: &RunArgs, namespace: &str) -> anyhow::Result<Worker> {
    let mut cmd = Command::new(exe);
    cmd.arg("worker")
        .arg("--sync")
        .arg("--namespace")
        .arg(namespace);
    for url in &args.redis {
        cmd.arg("--redis").arg(url);
    }
    if args.cluster {
        cmd.arg("--cluster");
    }
    let strategy = match args.strategy {
        FleetStrategy::Naive => "naive",
        FleetStrategy::CoalescingOnly => "coalescing-only",
        FleetStrategy::Onefill => "onefill",
    };
    cmd.args(["--strategy", strategy])
        .args(["--keys", &args.keys.join(",")])
        .args(["--callers", &args.callers.to_string()])
        .args(["--load-ms", &args.load_ms.to_string()])
        .args(["--duration-ms", &args.duration_ms.to_string()])
        .args(["--ttl-ms", &args.ttl_ms.to_string()])
        .args(["--grace-ms", &args.grace_ms.to_string()])
        .args(["--backend-timeout-ms", &args.backend_timeout_ms.to_string()]);
    if let Some(rate) = args.rate {
        cmd.args(["--rate", &rate.to_string()]);
    }
    if let Some(ms) = args.lease_ttl_ms {
        cmd.args(["--lease-ttl-ms", &ms.to_string()]);
    }
    if let Some(ms) = args.wait_deadline_ms {
        cmd.args(["--wait-deadline-ms", &ms.to_string()]);
    }
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

/// Runs one command on every node (or the one server) with a short-lived
/// connection and returns the first node's reply as text.
fn admin(args: &RunArgs, cmd: &[&str]) -> anyhow::Result<String> {
    let mut first = None;
    let single_key_command = cmd[0] == "GET";
    for url in &args.redis {
        let client = redis::Client::open(url.as_str())?;
        let mut con = client.get_connection()?;
        let mut c = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            c.arg(*a);
        }
        if single_key_command && args.cluster {
            // Route by asking every node; only the owner answers a value.
            let reply: redis::RedisResult<Option<String>> = c.query(&mut con);
            if let Ok(Some(v)) = reply {
                return Ok(v);
            }
            continue;
        }
        let reply: redis::Value = c.query(&mut con)?;
        if first.is_none() {
            first = Some(match reply {
                redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                redis::Value::VerbatimString { text, .. } => text,
                redis::Value::SimpleString(s) => s,
                redis::Value::Nil => String::new(),
                other => format!("{other:?}"),
            });
        }
        if single_key_command {
            break;
        }
    }
    Ok(first.unwrap_or_default())
}

/// Sum of `calls=` over INFO commandstats of every node, less the parent's
/// own admin commands.
fn command_count(args: &RunArgs) -> anyhow::Result<u64> {
    let mut total = 0;
    for url in &args.redis {
        let client = redis::Client::open(url.as_str())?;
        let mut con = client.get_connection()?;
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut con)?;
        total += parse_commandstats(&info);
    }
    Ok(total)
}

/// `cmdstat_get:calls=12,usec=…` lines → total calls, without the `info`
/// and `config` commands the measurement itself sends.
pub fn parse_commandstats(info: &str) -> u64 {
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter(|line| !line.starts_with("info:") && !line.starts_with("config"))
        .filter_map(|line| {
            let calls = line.split_once(":calls=")?.1;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_are_summed_without_our_own_commands() {
        let info = "# Commandstats\r\ncmdstat_get:calls=12,usec=30,usec_per_call=2.5\r\n\
                    cmdstat_evalsha:calls=3,usec=9\r\ncmdstat_info:calls=2,usec=1\r\n\
                    cmdstat_config|resetstat:calls=1,usec=1\r\n";
        assert_eq!(parse_commandstats(info), 15);
    }
}
