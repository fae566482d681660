//! `onefill demo --redis URL`: the herd as real worker processes of a fleet.

use anyhow::Context;

use super::args::DemoArgs;
use crate::commands::fleet::args::{CallersKind, FleetStrategy, RunArgs};
use crate::commands::fleet::run::{fresh_namespace, run_fleet};
use crate::shared::output::{print, print_line};
use crate::shared::progress::Progress;
use crate::shared::urls::redact;

/// `demo --redis URL`: the same herd with real worker processes on a real
/// server, measured from Redis itself (loads by a set of load ids, commands by
/// `INFO commandstats`).
pub fn run(args: &DemoArgs, url: &str) -> anyhow::Result<()> {
    let progress = Progress::new(!args.quiet);
    let shown = redact(url);
    let per_process = args.callers.div_ceil(args.instances);
    let mut reports = Vec::new();
    let strategies = [
        FleetStrategy::Naive,
        FleetStrategy::CoalescingOnly,
        FleetStrategy::Onefill,
    ];
    for (i, strategy) in strategies.into_iter().enumerate() {
        progress.say(format!(
            "running strategy {}/3 on {shown}: {strategy:?} ({} processes × {per_process} callers, load {} ms)…",
            i + 1,
            args.instances,
            args.load_ms
        ));
        let run = RunArgs {
            redis: vec![url.to_owned()],
            cluster: false,
            sentinel: Vec::new(),
            master_name: None,
            strategy,
            keys: vec![args.key.clone()],
            callers: per_process,
            callers_kind: CallersKind::Async,
            load_ms: args.load_ms,
            rate: None,
            duration_ms: 1,
            ttl_ms: 600_000,
            grace_ms: 0,
            backend_timeout_ms: None,
            lease_ttl_ms: None,
            wait_deadline_ms: Some(args.load_ms * 3 + 5_000),
            detail: false,
            strict: false,
            durability_replicas: 0,
            durability_timeout_ms: 50,
            keep_counters: false,
            no_l1: false,
            chaos: false,
        };
        let report = run_fleet(&run, args.instances, &fresh_namespace())
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
        print_line(&serde_json::to_string_pretty(&json)?)?;
    } else {
        let mut text = format!(
            "Thundering herd on Redis {shown}: {} worker processes × {per_process} callers, one cold key {:?}, origin load {} ms\n\n",
            args.instances, args.key, args.load_ms
        );
        text += &format!(
            "{:<18} {:>6} {:>15} {:>9} {:>9} {:>7}\n",
            "strategy", "loads", "Redis commands", "p99 ms", "max ms", "errors"
        );
        for r in &reports {
            text += &format!(
                "{:<18} {:>6} {:>15} {:>9.1} {:>9.1} {:>7}\n",
                format!("{:?}", r.strategy),
                r.loads,
                r.redis_commands,
                r.p99_ms,
                r.max_ms,
                r.errors
            );
        }
        print(&text)?;
    }
    Ok(())
}
