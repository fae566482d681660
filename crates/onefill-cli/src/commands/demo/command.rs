//! Running `onefill demo`: in this process on the embedded backend, or
//! handed to [`on_redis`] with `--redis URL`.

use std::time::Duration;

use anyhow::Context;

use super::args::DemoArgs;
use super::herd::{self, HerdConfig, Strategy};
use super::lesson;
use super::on_redis;
use super::report::{DemoReport, StrategyReport};
use crate::shared::output::{print, print_line};
use crate::shared::progress::Progress;

/// Runs the demo and prints its report on stdout.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if let Some(url) = &args.redis {
        return on_redis::run(args, url);
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

    progress.say("running the unsafe-release lesson (lease TTL 100 ms, about 0.2 s)…");
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
        print_line(&report.to_json().context("encoding the JSON report")?)?;
    } else {
        print(&report.to_text())?;
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
