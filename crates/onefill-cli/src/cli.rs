//! The command line: the subcommands. Each subcommand's own flags live with
//! it (`commands::*::args`), the limits and parsers several of them share in
//! `shared::args`; this file is the top of the tree and nothing imports it
//! but `main`.

use clap::{Parser, Subcommand};

use crate::commands::demo::args::DemoArgs;
use crate::commands::fleet::args::{FleetArgs, WorkerArgs};

/// Single-flight cache fills across a fleet: demos and tools for onefill.
#[derive(Debug, Parser)]
#[command(name = "onefill", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands. Add new ones here (e.g. `Bench(BenchArgs)`), give them a
/// folder under `commands/`, and dispatch them in `main`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Release a herd of concurrent callers on one cold key and compare naive
    /// cache-aside, in-process coalescing only, and onefill (coalescing plus
    /// the distributed lease); then show why a lease must be released by
    /// token, never by a bare DEL.
    ///
    /// Runs in this process on the embedded MemoryBackend with a simulated
    /// origin that sleeps --load-ms per load. The results table (or JSON with
    /// --json) goes to stdout; progress goes to stderr.
    Demo(DemoArgs),
    /// Run a fleet of worker processes against Redis (standalone or
    /// cluster) and report loads (counted in Redis), the Redis commands the
    /// run cost (from INFO commandstats), outcomes and latency.
    ///
    /// Two modes: a herd (every process releases --callers callers together
    /// on cold keys) or, with --rate, steady load for --duration-ms. The
    /// callers are async tasks, or with --callers-kind blocking OS threads
    /// calling the blocking cache (`BlockingCache`), or with mixed both.
    ///
    /// What it writes to the server: under the run's namespace
    /// (`fleet-<random>`, or --namespace), the cached values (`<ns>:{<key>}`,
    /// with --ttl-ms plus --grace-ms; `…:naive` for the naive strategy, with
    /// --ttl-ms), the leases (with their lease TTL) and fill notifications
    /// (pub/sub, nothing stored), and a load counter per key (`…:loads` and
    /// `…:loads:pid`, 6-hour TTL), which it deletes after reading it unless
    /// --keep-counters. Nothing it writes is left without a TTL (a --chaos
    /// run deletes its values at the end, since it PERSISTs some). It reads
    /// INFO commandstats before and after the run and reports the
    /// difference: it never resets the statistics (on a server shared with
    /// other clients, their commands during the run are counted too). With
    /// --fault it also changes the cluster (see --fault).
    ///
    /// --chaos checks that no answer outlives the server's copy: every
    /// worker reads random keys (16 by default) at --rate (500/s) through a
    /// cache with an L1 while this process, another client, changes them
    /// --chaos-ops times a second (writes, DEL, PEXPIRE, PERSIST, unreadable
    /// SET), recording each change with the server's TIME; with --cluster a
    /// slot migrates at 30 % of the run and a master fails over at 60 %.
    /// Every answer is then checked against the keys' history: one whose
    /// version had certainly left the server more than the L1's sync bound
    /// (250 ms, plus --clock-skew-ms) before its call started is a
    /// violation, and the command exits non-zero.
    Fleet(FleetArgs),
    /// One process of a fleet (started by `fleet` and `demo --redis`).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// The fleet starts its workers as this binary with the command line of
    /// `WorkerArgs::command_line`: it must reach the hidden subcommand.
    #[test]
    fn the_fleet_s_worker_command_line_is_a_worker() {
        let Command::Fleet(fleet) =
            Cli::try_parse_from(["onefill", "fleet", "--redis", "redis://x"])
                .expect("parses")
                .command
        else {
            panic!("not a fleet")
        };
        let json = fleet.run.to_json().expect("encodes");
        let argv = WorkerArgs::command_line(&json, "ns");
        let cli =
            Cli::try_parse_from(std::iter::once("onefill").chain(argv.iter().map(String::as_str)))
                .expect("the worker's command line parses");
        let Command::Worker(worker) = cli.command else {
            panic!("not a worker")
        };
        assert_eq!(worker.run(), &fleet.run);
        assert_eq!(worker.namespace, "ns");
        assert!(worker.sync);
    }
}
