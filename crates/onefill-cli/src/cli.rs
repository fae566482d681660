//! The command line: subcommands and their flags (clap derive).

use clap::{Args, Parser, Subcommand};

/// Largest `--callers`: every caller is a tokio task, and the naive strategy
/// runs one origin load per caller.
pub const MAX_CALLERS: u32 = 100_000;
/// Largest `--instances` (cache instances, i.e. simulated processes).
pub const MAX_INSTANCES: u32 = 1_024;
/// Largest `--load-ms`: one minute.
pub const MAX_LOAD_MS: u64 = 60_000;
/// Longest `--key`, in bytes (the library's default key limit).
pub const MAX_KEY_BYTES: usize = 1_024;

/// Single-flight cache fills across a fleet: demos and tools for onefill.
#[derive(Debug, Parser)]
#[command(name = "onefill", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands. Add new ones here (e.g. `Bench(BenchArgs)`) and dispatch
/// them in `main`.
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
    /// on cold keys) or, with --rate, steady load for --duration-ms.
    Fleet(FleetArgs),
    /// One process of a fleet (started by `fleet` and `demo --redis`).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

/// Which way the fleet's callers get the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FleetStrategy {
    /// GET; on a miss, load and SET (no coalescing at all).
    Naive,
    /// onefill without the lease: one load per process.
    CoalescingOnly,
    /// onefill: in-process coalescing plus the Redis lease.
    Onefill,
}

/// The flags shared by `fleet` and each `worker`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Redis URL (repeat for the nodes of a cluster, with --cluster).
    #[arg(long = "redis", value_name = "URL", required = true)]
    pub redis: Vec<String>,
    /// The URLs are nodes of a Redis Cluster.
    #[arg(long)]
    pub cluster: bool,
    /// Strategy of every process.
    #[arg(long, value_enum, default_value_t = FleetStrategy::Onefill)]
    pub strategy: FleetStrategy,
    /// Keys asked for (comma-separated); callers are spread over them.
    #[arg(long, value_delimiter = ',', default_value = "hot", value_parser = parse_key)]
    pub keys: Vec<String>,
    /// Callers per process in herd mode.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=MAX_CALLERS as i64))]
    pub callers: u32,
    /// How long one origin load takes, in milliseconds.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=MAX_LOAD_MS))]
    pub load_ms: u64,
    /// Steady mode: requests per second per process (instead of a herd).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub rate: Option<u32>,
    /// Steady mode: how long each process sends requests, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub duration_ms: u64,
    /// Value TTL in milliseconds.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub ttl_ms: u64,
    /// Grace (serve-stale window) in milliseconds.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    pub grace_ms: u64,
    /// Bound on every backend call, in milliseconds.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub backend_timeout_ms: u64,
    /// A fixed lease TTL in milliseconds (default: adaptive).
    #[arg(long, value_parser = clap::value_parser!(u64).range(30..=3_600_000))]
    pub lease_ttl_ms: Option<u64>,
    /// The waiters' deadline in milliseconds (default 10 s).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub wait_deadline_ms: Option<u64>,
}

/// Flags of `onefill fleet`.
#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// What every worker runs.
    #[command(flatten)]
    pub run: RunArgs,
    /// Worker processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub processes: u32,
    /// Namespace of the run's keys (default: a fresh random one).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress messages on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Flags of `onefill worker`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// What to run.
    #[command(flatten)]
    pub run: RunArgs,
    /// Namespace of the run's keys.
    #[arg(long)]
    pub namespace: String,
    /// Print "ready", then wait for a line on stdin before starting.
    #[arg(long)]
    pub sync: bool,
}

/// Flags of `onefill demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Concurrent callers, all released together on the same cold key.
    #[arg(long, default_value_t = 200, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=MAX_CALLERS as i64))]
    pub callers: u32,

    /// Cache instances sharing one backend, each standing for one process;
    /// callers are spread over them round-robin. At most --callers.
    #[arg(long, default_value_t = 4, value_name = "M",
          value_parser = clap::value_parser!(u32).range(1..=MAX_INSTANCES as i64))]
    pub instances: u32,

    /// How long one load of the simulated origin takes, in milliseconds.
    #[arg(long, default_value_t = 200, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=MAX_LOAD_MS))]
    pub load_ms: u64,

    /// The cache key the herd asks for (cold at the start of every strategy).
    #[arg(long, default_value = "user:42", value_name = "KEY", value_parser = parse_key)]
    pub key: String,

    /// Print the results as JSON on stdout instead of tables.
    #[arg(long)]
    pub json: bool,

    /// No progress messages on stderr (errors are still reported).
    #[arg(long, short)]
    pub quiet: bool,

    /// Run the herd against this Redis instead of the embedded backend, with
    /// --instances real worker processes (each --callers / --instances
    /// callers), and report the Redis commands each strategy cost.
    #[arg(long, value_name = "URL")]
    pub redis: Option<String>,
}

impl DemoArgs {
    /// Checks the constraints between flags that clap cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if self.instances > self.callers {
            return Err(format!(
                "--instances ({}) must not exceed --callers ({}): every instance needs at least one caller",
                self.instances, self.callers
            ));
        }
        Ok(())
    }
}

fn parse_key(key: &str) -> Result<String, String> {
    if key.is_empty() {
        return Err("the key must not be empty".to_owned());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "the key is {} bytes long; at most {MAX_KEY_BYTES} bytes are allowed",
            key.len()
        ));
    }
    Ok(key.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn instances_may_not_exceed_callers() {
        let cli = Cli::try_parse_from(["onefill", "demo", "--callers", "3", "--instances", "4"])
            .expect("parses");
        let Command::Demo(args) = cli.command else {
            panic!("demo")
        };
        assert!(args.validate().is_err());
        let cli = Cli::try_parse_from(["onefill", "demo"]).expect("parses");
        let Command::Demo(args) = cli.command else {
            panic!("demo")
        };
        assert_eq!((args.callers, args.instances, args.load_ms), (200, 4, 200));
        assert!(args.validate().is_ok());
    }

    #[test]
    fn out_of_range_flags_are_rejected() {
        for bad in [
            &["--callers", "0"][..],
            &["--instances", "0"],
            &["--load-ms", "0"],
            &["--load-ms", "60001"],
            &["--key", ""],
            &["--callers", "-5"],
        ] {
            let argv = ["onefill", "demo"].iter().chain(bad.iter());
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?} accepted");
        }
    }
}
