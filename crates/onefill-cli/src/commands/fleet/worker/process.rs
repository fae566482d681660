//! The life of one worker process: connect, say it is ready, wait for the
//! parent's go, run the callers, and print the report as one JSON line
//! (or, failing to start, one line saying why).

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

use onefill::L1;

use super::callers::steady_or_herd;
use crate::commands::fleet::args::WorkerArgs;
use crate::commands::fleet::chaos::reader::read_at_random;
use crate::commands::fleet::connections::{cache, L1Choice, Raw};
use crate::commands::fleet::protocol::{NOT_READY, READY};
use crate::commands::fleet::report::WorkerReport;
use crate::shared::output::{describe, is_broken_pipe, print_line};

/// Runs the worker; the summary goes to stdout as one JSON line.
pub fn main(args: &WorkerArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Startup(reason)) if args.sync => {
            // The parent reads this line in place of "ready".
            let _ = print_line(&format!("{NOT_READY} {}", describe(&reason)));
            ExitCode::FAILURE
        }
        Err(Failure::Startup(error) | Failure::Run(error)) => {
            if !is_broken_pipe(&error) {
                let _ = writeln!(std::io::stderr(), "error: {}", describe(&error));
            }
            ExitCode::FAILURE
        }
    }
}

/// How a worker failed: before it was ready (its connections), or after.
enum Failure {
    Startup(anyhow::Error),
    Run(anyhow::Error),
}

fn run(args: &WorkerArgs) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")
        .map_err(Failure::Startup)?;
    let report = runtime.block_on(work(args))?;
    print_line(&report)
        .context("printing the report")
        .map_err(Failure::Run)
}

/// Runs the worker and returns its report as one JSON line.
async fn work(args: &WorkerArgs) -> Result<String, Failure> {
    let run = args.run();
    let raw = Arc::new(Raw::connect(run).await.map_err(Failure::Startup)?);
    // A chaos worker reads through an L1 with the default sync bound: the
    // bound its answers are held to.
    // Otherwise the library's default, unless --no-l1.
    let l1 = if run.chaos {
        L1Choice::On(L1::new(CHAOS_L1_ENTRIES))
    } else if run.no_l1 {
        L1Choice::Off
    } else {
        L1Choice::Default
    };
    let cache = cache(run, &args.namespace, l1)
        .await
        .map_err(Failure::Startup)?;
    if args.sync {
        print_line(READY)
            .context("telling the parent this worker is ready")
            .map_err(Failure::Startup)?;
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .context("waiting for the parent's go")
            .map_err(Failure::Startup)?;
    }
    let report = match cache {
        Some(cache) if run.chaos => serde_json::to_string(&read_at_random(run, cache).await),
        cache => {
            let report: WorkerReport = steady_or_herd(args, run, raw, cache)
                .await
                .map_err(Failure::Run)?;
            serde_json::to_string(&report)
        }
    };
    report.context("encoding the report").map_err(Failure::Run)
}

/// Entries of a chaos worker's L1: more than any chaos key space needs.
const CHAOS_L1_ENTRIES: usize = 10_000;
