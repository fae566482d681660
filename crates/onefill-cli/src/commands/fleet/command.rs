//! `onefill fleet`: its flags made into a run, the run, and its report
//! printed (text or JSON), with progress on stderr.

use std::time::Instant;

use anyhow::{bail, Context};
use clap::ValueEnum;

use super::args::{FleetArgs, FleetStrategy, RunArgs};
use super::chaos::drive::{bound, run_chaos, ChaosPlan};
use super::fault::kind::{FaultKind, FaultPlan};
use super::html::html_report;
use super::run::{fresh_namespace, run_with};
use super::written::{WriteKind, WritePlan};
use crate::shared::output::print_line;
use crate::shared::progress::Progress;

/// Runs `onefill fleet` and prints its report.
pub fn run_command(args: &FleetArgs) -> anyhow::Result<()> {
    let progress = Progress::new(!args.quiet);
    let namespace = args.namespace.clone().unwrap_or_else(fresh_namespace);
    let run_args = resolve(args)?;
    if run_args.chaos {
        return chaos(args, &run_args, &namespace, progress);
    }
    let fault = args.fault.map(|kind| FaultPlan {
        kind,
        at_ms: args.fault_at_ms,
    });
    progress.say(format!(
        "starting {} worker processes ({:?}, {:?} callers, namespace {namespace})…",
        args.processes, run_args.strategy, run_args.callers_kind
    ));
    if let Some(plan) = fault {
        progress.say(if plan.kind.is_holder() {
            format!(
                "fault {:?} of a lease holder at {} ms",
                plan.kind, plan.at_ms
            )
        } else if !run_args.sentinel.is_empty() {
            format!(
                "fault {:?} of the primary the Sentinels name at {} ms",
                plan.kind, plan.at_ms
            )
        } else {
            format!(
                "fault {:?} of the master owning the most of the {} keys at {} ms",
                plan.kind,
                run_args.keys.len(),
                plan.at_ms
            )
        });
    }
    let write = write_plan(args);
    if let Some(plan) = write {
        progress.say(format!(
            "{:?} of {} at {} ms",
            plan.kind, run_args.keys[0], plan.at_ms
        ));
    }
    let ticker = run_args
        .rate
        .map(|_| Ticker::start(progress, run_args.duration_ms));
    let report = run_with(
        &run_args,
        args.processes,
        &namespace,
        fault,
        write,
        progress,
    );
    drop(ticker);
    let mut report = report?;
    if let Some(path) = &args.report {
        let page = html_report(&report, &run_args)?;
        std::fs::write(path, page)
            .with_context(|| format!("writing the report to {}", path.display()))?;
        progress.say(format!("report written to {}", path.display()));
    }
    if !args.run.detail {
        // The sums, not the logs.
        for w in &mut report.workers {
            w.call_log = Vec::new();
            w.load_log = Vec::new();
            w.load_spans = Vec::new();
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

/// Runs `onefill fleet --chaos` and prints its report; fails if any
/// answer was too old.
fn chaos(
    args: &FleetArgs,
    run: &RunArgs,
    namespace: &str,
    progress: Progress,
) -> anyhow::Result<()> {
    progress.say(format!(
        "chaos: {} worker processes reading {} keys (namespace {namespace}) with an L1 for {} ms, \
         {} foreign operations/s{}; bound {} ms",
        args.processes,
        run.keys.len(),
        run.duration_ms,
        args.chaos_ops,
        if run.cluster {
            ", a slot migration at 30 % and a failover at 60 %"
        } else {
            ""
        },
        bound().as_millis()
    ));
    let plan = ChaosPlan {
        ops_per_sec: args.chaos_ops,
        clock_skew: std::time::Duration::from_millis(args.clock_skew_ms),
    };
    let report = run_chaos(run, args.processes, namespace, plan, progress)?;
    if args.json {
        print_line(&serde_json::to_string_pretty(&report)?)?;
    } else {
        print_line(&report.to_text())?;
    }
    if report.violations > 0 {
        bail!(
            "{} answers were older than the bound ({} ms)",
            report.violations,
            bound().as_millis()
        );
    }
    Ok(())
}

/// The run the workers get: `--key-count` made into a key list (16 keys
/// by default with `--chaos`); and the checks clap cannot make (which
/// run each kind of fault needs).
fn resolve(args: &FleetArgs) -> anyhow::Result<RunArgs> {
    let mut run = args.run.clone();
    let default_keys = run.keys == ["hot"];
    let key_count = match args.key_count {
        None if run.chaos && default_keys => Some(CHAOS_KEYS),
        n => n,
    };
    if let Some(n) = key_count {
        run.keys = (0..n).map(|i| format!("key-{i}")).collect();
    }
    run.check_callers_kind().map_err(anyhow::Error::msg)?;
    if run.chaos && !run.sentinel.is_empty() {
        bail!("--chaos runs on one server or a cluster, not through Sentinels");
    }
    match args.fault {
        Some(kind) if kind.is_holder() => {
            if !run.sentinel.is_empty() || run.rate.is_some() {
                bail!(
                    "--fault {} needs a herd (no --rate) on one server or a cluster (no --sentinel)",
                    fault_name(kind)
                );
            }
            if run.strategy != FleetStrategy::Onefill {
                bail!(
                    "--fault {} needs --strategy onefill: only it takes leases",
                    fault_name(kind)
                );
            }
        }
        Some(kind) => {
            if !((run.cluster || !run.sentinel.is_empty()) && run.rate.is_some()) {
                bail!(
                    "--fault {} needs a steady run (--rate) on a cluster (--cluster) or through \
                     Sentinels (--sentinel)",
                    fault_name(kind)
                );
            }
            if args.fault_at_ms >= run.duration_ms {
                bail!(
                    "--fault-at-ms ({}) must be less than --duration-ms ({})",
                    args.fault_at_ms,
                    run.duration_ms
                );
            }
        }
        None => {}
    }
    if let Some(plan) = write_plan(args) {
        if run.rate.is_none() || plan.at_ms >= run.duration_ms {
            bail!(
                "--expire-at-ms and --invalidate-at-ms need a steady run (--rate) whose                  --duration-ms ({}) is past them",
                run.duration_ms
            );
        }
        if run.strategy == FleetStrategy::Naive {
            bail!("--expire-at-ms and --invalidate-at-ms need a onefill strategy");
        }
    }
    Ok(run)
}

/// The write `--expire-at-ms` or `--invalidate-at-ms` asks for.
fn write_plan(args: &FleetArgs) -> Option<WritePlan> {
    match (args.expire_at_ms, args.invalidate_at_ms) {
        (Some(at_ms), _) => Some(WritePlan {
            kind: WriteKind::Expire,
            at_ms,
        }),
        (None, Some(at_ms)) => Some(WritePlan {
            kind: WriteKind::Invalidate,
            at_ms,
        }),
        (None, None) => None,
    }
}

/// A fault's name on the command line.
fn fault_name(kind: FaultKind) -> String {
    kind.to_possible_value()
        .map_or_else(|| format!("{kind:?}"), |v| v.get_name().to_owned())
}

/// The key space of `--chaos` unless `--keys` or `--key-count` says
/// otherwise: small, so every key is read, changed and read again often.
const CHAOS_KEYS: u32 = 16;

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
    use crate::commands::fleet::args::CallersKind;
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
        assert!(!run.detail, "the workers send their logs anyway");
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
        assert!(
            resolved(&["--rate", "10", "--fault", "kill"]).is_err(),
            "no cluster"
        );
        assert!(
            resolved(&["--cluster", "--fault", "kill"]).is_err(),
            "no rate"
        );
    }

    #[test]
    fn a_fault_of_the_primary_through_sentinels_needs_a_steady_run() {
        let sentinel = |extra: &[&str]| {
            let argv: Vec<&str> = ["--sentinel", "redis://s:26379", "--master-name", "m"]
                .into_iter()
                .chain(extra.iter().copied())
                .collect();
            parse_flags::<FleetArgs>(&argv)
                .map_err(anyhow::Error::from)
                .and_then(|a| resolve(&a))
        };
        for kind in ["failover", "kill", "hang"] {
            assert!(
                sentinel(&["--rate", "10", "--fault", kind]).is_ok(),
                "{kind}"
            );
            assert!(
                sentinel(&["--fault", kind]).is_err(),
                "{kind} without --rate"
            );
        }
        assert!(sentinel(&["--fault", "kill-holder"]).is_err());
        assert!(sentinel(&["--chaos"]).is_err());
    }

    #[test]
    fn a_holder_fault_needs_a_onefill_herd_on_one_server_or_a_cluster() {
        assert!(resolved(&["--fault", "kill-holder", "--fault-at-ms", "500"]).is_ok());
        assert!(resolved(&["--fault", "kill-holder", "--cluster"]).is_ok());
        // A herd has no duration to fault before the end of.
        assert!(resolved(&["--fault", "stop-holder", "--duration-ms", "100"]).is_ok());
        for bad in [
            &["--fault", "kill-holder", "--rate", "10"][..],
            &["--fault", "stop-holder", "--strategy", "naive"],
            &["--fault", "stop-holder", "--strategy", "coalescing-only"],
        ] {
            let e = resolved(bad).expect_err("refused");
            assert!(e.to_string().contains("holder"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn thread_callers_need_a_cache_and_a_herd_of_threads_a_process_can_start() {
        for kind in ["blocking", "mixed"] {
            assert!(resolved(&["--callers-kind", kind, "--callers", "4096"]).is_ok());
            assert!(resolved(&["--callers-kind", kind, "--rate", "10"]).is_ok());
            let e = resolved(&["--callers-kind", kind, "--callers", "4097"]).expect_err(kind);
            assert!(e.to_string().contains("OS threads"), "{e}");
            let e = resolved(&["--callers-kind", kind, "--strategy", "naive"]).expect_err(kind);
            assert!(e.to_string().contains("naive"), "{e}");
            assert!(resolved(&["--callers-kind", kind, "--chaos"]).is_err());
        }
        let run = resolved(&["--callers", "100000", "--strategy", "naive"]).expect("resolves");
        assert_eq!(run.callers_kind, CallersKind::Async, "the default");
    }

    #[test]
    fn a_write_needs_a_steady_run_of_a_onefill_strategy_past_it() {
        assert!(resolved(&["--rate", "10", "--expire-at-ms", "5000"]).is_ok());
        assert!(resolved(&["--rate", "10", "--invalidate-at-ms", "9999"]).is_ok());
        for bad in [
            &["--expire-at-ms", "100"][..],
            &["--rate", "10", "--expire-at-ms", "10000"],
            &[
                "--rate",
                "10",
                "--invalidate-at-ms",
                "100",
                "--strategy",
                "naive",
            ],
        ] {
            assert!(resolved(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn chaos_reads_sixteen_keys_unless_told() {
        assert_eq!(resolved(&["--chaos"]).expect("resolves").keys.len(), 16);
        assert_eq!(
            resolved(&["--chaos", "--key-count", "3"])
                .expect("resolves")
                .keys
                .len(),
            3
        );
        assert_eq!(
            resolved(&["--chaos", "--keys", "a,b"])
                .expect("resolves")
                .keys,
            ["a", "b"]
        );
        assert_eq!(resolved(&[]).expect("resolves").keys, ["hot"]);
    }
}
