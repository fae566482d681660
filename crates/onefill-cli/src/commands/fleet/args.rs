//! Flags of `onefill fleet` and of its hidden `onefill worker` processes.

use clap::Args;

use crate::cli::{parse_key, MAX_CALLERS, MAX_LOAD_MS};

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
