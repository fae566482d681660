//! `onefill demo`: the herd under three strategies, then the lesson.

use std::time::Duration;

use anyhow::Context;

use crate::cli::{DemoArgs, FleetStrategy, RunArgs};
use crate::fleet;
use crate::herd::{self, HerdConfig, Strategy};
use crate::lesson;
use crate::progress::Progress;
use crate::report::{DemoReport, StrategyReport};

/// Runs the demo and prints its report on stdout.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if let Some(url) = &args.redis {
        return run_on_redis(args, url);
    }
    let progress = Progress::new(!args.quiet);
    let config = HerdConfig {
        callers: args.callers as usize,
        instances: args.instances as usize,
        load: Duration::from_millis(args.load_ms),
        key: args.key.clone(),
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let strategies = runtime.block_on(herds(&config, progress))?;
    drop(runtime);

    progress.say("running the unsafe-release lesson (lease TTL 100 ms, tokio's paused clock)…");
    let lesson = lesson::run()?;

    let report = DemoReport {
        callers: config.callers,
        instances: config.instances,
        load_ms: args.load_ms,
        key: config.key.clone(),
        backend: "memory",
        strategies,
        unsafe_release: lesson,
    };
    if args.json {
        println!("{}", report.to_json().context("encoding the JSON report")?);
    } else {
        print!("{}", report.to_text());
    }
    progress.say(summary(&report));
    Ok(())
}

/// Runs every strategy in turn, each on a fresh store and origin.
async fn herds(config: &HerdConfig, progress: Progress) -> anyhow::Result<Vec<StrategyReport>> {
    let total = Strategy::ALL.len();
    let mut reports = Vec::with_capacity(total);
    for (i, strategy) in Strategy::ALL.into_iter().enumerate() {
        progress.say(format!(
            "running strategy {}/{total}: {} ({} callers, {} instances, load {} ms)…",
            i + 1,
            strategy.title(),
            config.callers,
            config.instances,
            config.load.as_millis()
        ));
        let outcome = herd::run(strategy, config)
            .await
            .with_context(|| format!("strategy {}", strategy.title()))?;
        let report = StrategyReport::new(&outcome, config);
        progress.say(format!(
            "  done in {:.0} ms: {} origin loads, {} errors",
            report.wall_ms, report.loads, report.errors
        ));
        reports.push(report);
    }
    Ok(reports)
}

fn summary(report: &DemoReport) -> String {
    let loads = |name: &str| {
        report
            .strategies
            .iter()
            .find(|s| s.name == name)
            .map_or_else(|| "?".to_owned(), |s| s.loads.to_string())
    };
    let lesson = &report.unsafe_release;
    format!(
        "summary: {} callers on {} instances cost {} origin loads naive, {} with in-process \
         coalescing only, {} with onefill; releasing a lease with a bare DEL let a third loader \
         in ({} loads), the token-checked release did not ({} loads).",
        report.callers,
        report.instances,
        loads("naive"),
        loads("coalescing_only"),
        loads("onefill"),
        lesson.bare_del.loads,
        lesson.token_release.loads
    )
}

/// `demo --redis URL`: the same herd with real worker processes on a real
/// server, measured from Redis itself (loads by `INCR`, commands by
/// `INFO commandstats`).
fn run_on_redis(args: &DemoArgs, url: &str) -> anyhow::Result<()> {
    let progress = Progress::new(!args.quiet);
    let per_process = args.callers.div_ceil(args.instances);
    let mut reports = Vec::new();
    let strategies = [
        FleetStrategy::Naive,
        FleetStrategy::CoalescingOnly,
        FleetStrategy::Onefill,
    ];
    for (i, strategy) in strategies.into_iter().enumerate() {
        progress.say(format!(
            "running strategy {}/3 on {url}: {strategy:?} ({} processes × {per_process} callers, load {} ms)…",
            i + 1,
            args.instances,
            args.load_ms
        ));
        let run = RunArgs {
            redis: vec![url.to_owned()],
            cluster: false,
            strategy,
            keys: vec![args.key.clone()],
            callers: per_process,
            load_ms: args.load_ms,
            rate: None,
            duration_ms: 1,
            ttl_ms: 600_000,
            grace_ms: 0,
            backend_timeout_ms: 1_000,
            lease_ttl_ms: None,
            wait_deadline_ms: Some(args.load_ms * 3 + 5_000),
        };
        let report = fleet::run(&run, args.instances, &fleet::fresh_namespace())
            .with_context(|| format!("strategy {strategy:?}"))?;
        progress.say(format!(
            "  done in {:.0} ms: {} loads, {} Redis commands, {} errors",
            report.wall_ms, report.loads, report.redis_commands, report.errors
        ));
        reports.push(report);
    }
    if args.json {
        let json = serde_json::json!({
            "callers": per_process * args.instances,
            "instances": args.instances,
            "load_ms": args.load_ms,
            "key": args.key,
            "backend": "redis",
            "strategies": reports.iter().map(|r| serde_json::json!({
                "name": r.strategy,
                "loads": r.loads,
                "redis_commands": r.redis_commands,
                "p99_ms": r.p99_ms,
                "max_ms": r.max_ms,
                "errors": r.errors,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        println!(
            "Thundering herd on Redis {url}: {} worker processes × {per_process} callers, one cold key {:?}, origin load {} ms\n",
            args.instances, args.key, args.load_ms
        );
        println!(
            "{:<18} {:>6} {:>15} {:>9} {:>9} {:>7}",
            "strategy", "loads", "Redis commands", "p99 ms", "max ms", "errors"
        );
        for r in &reports {
            println!(
                "{:<18} {:>6} {:>15} {:>9.1} {:>9.1} {:>7}",
                format!("{:?}", r.strategy),
                r.loads,
                r.redis_commands,
                r.p99_ms,
                r.max_ms,
                r.errors
            );
        }
    }
    Ok(())
}
