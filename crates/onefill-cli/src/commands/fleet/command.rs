//! `onefill fleet`: its flags made into a run, the run, and its report
//! printed (text or JSON), with progress on stderr.

use std::time::Instant;

use anyhow::bail;

use super::args::{FleetArgs, RunArgs};
use super::fault::kind::FaultPlan;
use super::run::{fresh_namespace, run_with};
use crate::shared::output::print_line;
use crate::shared::progress::Progress;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::args::parse_flags;

    fn resolved(argv: &[&str]) -> anyhow::Result<RunArgs> {
        let argv: Vec<&str> = ["--redis", "redis://x"]
            .into_iter()
            .chain(argv.iter().copied())
            .collect();
        resolve(&parse_flags(&argv)?)
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
