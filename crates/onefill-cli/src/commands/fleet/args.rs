//! Flags of `onefill fleet` and of its hidden `onefill worker` processes.
//!
//! The parent hands each worker its [`RunArgs`] as one JSON document
//! (`worker --run-json`), so a flag added to `RunArgs` reaches the workers
//! without anyone rebuilding a command line; by hand (and in tests) a worker
//! takes the same flags as `fleet`.
//!
//! Longer than most files: every flag carries its help text, and the tests
//! of their parsing and of the worker's round trip sit beside them.

use std::fmt::Display;
use std::ops::RangeInclusive;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::fault::kind::FaultKind;
use crate::shared::args::{parse_key, MAX_CALLERS, MAX_CALLER_THREADS, MAX_LOAD_MS};

// The bounds of the numeric run flags, enforced by clap on the command line
// and by `RunArgs::check` on `--run-json`. (clap bounds `u32` flags with
// `i64` ranges and `u64` flags with `u64` ranges.)
const CALLERS: RangeInclusive<i64> = 1..=MAX_CALLERS as i64;
const LOAD_MS: RangeInclusive<u64> = 1..=MAX_LOAD_MS;
const RATE: RangeInclusive<i64> = 1..=100_000;
const DURATION_MS: RangeInclusive<u64> = 1..=3_600_000;
const TTL_MS: RangeInclusive<u64> = 1..=86_400_000;
const GRACE_MS: RangeInclusive<u64> = 0..=86_400_000;
const BACKEND_TIMEOUT_MS: RangeInclusive<u64> = 1..=60_000;
const LEASE_TTL_MS: RangeInclusive<u64> = 30..=3_600_000;
const WAIT_DEADLINE_MS: RangeInclusive<u64> = 1..=3_600_000;
const KEY_COUNT: RangeInclusive<i64> = 1..=100_000;

/// Which way the fleet's callers get the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FleetStrategy {
    /// GET; on a miss, load and SET (no coalescing at all).
    Naive,
    /// onefill without the lease: one load per process.
    CoalescingOnly,
    /// onefill: in-process coalescing plus the Redis lease.
    Onefill,
}

/// How the fleet's callers call the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallersKind {
    /// Each caller a tokio task calling the async `Cache`.
    #[default]
    Async,
    /// Each caller an OS thread calling `BlockingCache`, its loader a
    /// plain closure.
    Blocking,
    /// Half of each key's callers tasks, half OS threads, on the same keys.
    Mixed,
}

/// The flags shared by `fleet` and each `worker`.
#[derive(Debug, Clone, PartialEq, Eq, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// Redis URL (repeat for the nodes of a cluster, with --cluster).
    #[arg(
        long = "redis",
        value_name = "URL",
        required_unless_present = "sentinel"
    )]
    #[serde(default)]
    pub redis: Vec<String>,
    /// The URLs are nodes of a Redis Cluster.
    #[arg(long, conflicts_with = "sentinel")]
    pub cluster: bool,
    /// Redis Sentinel URL (repeat for each Sentinel), instead of --redis:
    /// the run uses the primary the Sentinels name for --master-name, and
    /// follows their failovers. The data nodes are reached as
    /// `redis://ip:port` at the address the Sentinels give.
    #[arg(
        long = "sentinel",
        value_name = "URL",
        requires = "master_name",
        conflicts_with = "redis"
    )]
    #[serde(default)]
    pub sentinel: Vec<String>,
    /// With --sentinel: the name the Sentinels know the primary by.
    // (`requires` alone is waived when --redis, which excludes --sentinel,
    // is given.)
    #[arg(
        long,
        value_name = "NAME",
        requires = "sentinel",
        conflicts_with = "redis"
    )]
    #[serde(default)]
    pub master_name: Option<String>,
    /// Strategy of every process.
    #[arg(long, value_enum, default_value_t = FleetStrategy::Onefill)]
    pub strategy: FleetStrategy,
    /// Keys asked for (comma-separated); callers are spread over them.
    #[arg(long, value_delimiter = ',', default_value = "hot", value_parser = parse_key)]
    pub keys: Vec<String>,
    /// Callers per process in herd mode.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(CALLERS))]
    pub callers: u32,
    /// How the callers call: `async`, tokio tasks on the async cache;
    /// `blocking`, OS threads on `BlockingCache` (from `Cache::blocking`
    /// on the worker's runtime) with a plain-closure loader that sleeps
    /// like the origin; `mixed`, half of each key's callers each. Not with
    /// the naive strategy or --chaos; a herd of OS threads is at most 4096
    /// callers per process (in steady mode, at most 4096 calls of a
    /// process wait at once: any more fail).
    #[arg(long, value_enum, default_value_t = CallersKind::Async, conflicts_with = "chaos")]
    #[serde(default)]
    pub callers_kind: CallersKind,
    /// How long one origin load takes, in milliseconds.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(LOAD_MS))]
    pub load_ms: u64,
    /// Steady mode: requests per second per process (instead of a herd).
    #[arg(long, value_parser = clap::value_parser!(u32).range(RATE))]
    pub rate: Option<u32>,
    /// Steady mode: how long each process sends requests, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(DURATION_MS))]
    pub duration_ms: u64,
    /// Value TTL in milliseconds.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(TTL_MS))]
    pub ttl_ms: u64,
    /// Grace (serve-stale window) in milliseconds.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(GRACE_MS))]
    pub grace_ms: u64,
    /// Bound on the backend calls of one flight, in milliseconds (default:
    /// the library's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(BACKEND_TIMEOUT_MS))]
    pub backend_timeout_ms: Option<u64>,
    /// A fixed lease TTL in milliseconds (default: adaptive).
    #[arg(long, value_parser = clap::value_parser!(u64).range(LEASE_TTL_MS))]
    pub lease_ttl_ms: Option<u64>,
    /// The waiters' deadline in milliseconds (default 10 s).
    #[arg(long, value_parser = clap::value_parser!(u64).range(WAIT_DEADLINE_MS))]
    pub wait_deadline_ms: Option<u64>,
    /// Print every call (`[started_ms, key_index, outcome_code, latency_us,
    /// age_ms]`) and every load (`[started_ms, key_index]`, and with its
    /// end in `load_spans`) in the workers' reports (`call_log`,
    /// `load_log`). The workers always send them to the parent (for
    /// --fault and --report); without --detail it prints only their sums.
    #[arg(long)]
    #[serde(default)]
    pub detail: bool,
    /// Strict mode (`CacheBuilder::strict`): backend failures reach the
    /// callers as errors instead of stale or degraded answers.
    #[arg(long)]
    #[serde(default)]
    pub strict: bool,
    /// Writes wait for this many replicas before they return
    /// (`RedisOptions::durability`, `Durability::Replicas`); 0, the
    /// default, waits for none.
    #[arg(long, default_value_t = 0)]
    #[serde(default)]
    pub durability_replicas: u32,
    /// How long a write waits for its replicas, with --durability-replicas.
    #[arg(long, default_value_t = 50)]
    #[serde(default = "default_durability_timeout_ms")]
    pub durability_timeout_ms: u64,
    /// Leave the run's load counters (`<namespace>:{<key>}:loads` and
    /// `…:loads:pid`) in Redis after the run instead of deleting them
    /// (they expire after 6 hours either way).
    #[arg(long)]
    #[serde(default)]
    pub keep_counters: bool,
    /// No L1 in the workers' caches (`CacheBuilder::no_l1`): every call
    /// reads Redis, as before the L1 was on by default. Not with --chaos,
    /// whose workers read through an L1.
    #[arg(long, conflicts_with = "chaos")]
    #[serde(default)]
    pub no_l1: bool,
    /// Chaos check: every process reads random keys through a cache with
    /// an L1 while the parent changes them behind the fleet's back, and
    /// every answer is checked against the server's history (see
    /// `fleet --help`).
    #[arg(long)]
    #[serde(default)]
    pub chaos: bool,
}

impl RunArgs {
    /// The run as the one JSON value a worker takes (`--run-json`).
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }

    /// Reads `--run-json`: the JSON of [`RunArgs::to_json`], held to the
    /// same bounds as the flags.
    pub fn from_json(json: &str) -> Result<RunArgs, String> {
        let run: RunArgs =
            serde_json::from_str(json).map_err(|e| format!("not the JSON of a run: {e}"))?;
        run.check()?;
        Ok(run)
    }

    /// The bounds clap enforces on the flags, for a run that did not come
    /// through them.
    fn check(&self) -> Result<(), String> {
        match (self.redis.is_empty(), self.sentinel.is_empty()) {
            (true, true) => return Err("at least one Redis URL is needed".to_owned()),
            (false, false) => return Err("Redis URLs and Sentinel URLs both given".to_owned()),
            (true, false) if self.master_name.is_none() => {
                return Err("Sentinel URLs need a master name".to_owned())
            }
            (true, false) if self.cluster => {
                return Err("a Sentinel set-up is not a cluster".to_owned())
            }
            _ => {}
        }
        if self.keys.is_empty() {
            return Err("at least one key is needed".to_owned());
        }
        for key in &self.keys {
            parse_key(key)?;
        }
        within("callers", i64::from(self.callers), CALLERS)?;
        self.check_callers_kind()?;
        within("load_ms", self.load_ms, LOAD_MS)?;
        if let Some(rate) = self.rate {
            within("rate", i64::from(rate), RATE)?;
        }
        within("duration_ms", self.duration_ms, DURATION_MS)?;
        within("ttl_ms", self.ttl_ms, TTL_MS)?;
        within("grace_ms", self.grace_ms, GRACE_MS)?;
        if let Some(ms) = self.backend_timeout_ms {
            within("backend_timeout_ms", ms, BACKEND_TIMEOUT_MS)?;
        }
        if let Some(ms) = self.lease_ttl_ms {
            within("lease_ttl_ms", ms, LEASE_TTL_MS)?;
        }
        if let Some(ms) = self.wait_deadline_ms {
            within("wait_deadline_ms", ms, WAIT_DEADLINE_MS)?;
        }
        Ok(())
    }

    /// What OS-thread callers need: a cache to call (not the naive
    /// strategy) and a herd of threads a process can start. (--chaos, whose
    /// readers are tasks, refuses the flag on the command line.)
    pub fn check_callers_kind(&self) -> Result<(), String> {
        if self.callers_kind == CallersKind::Async {
            return Ok(());
        }
        if self.strategy == FleetStrategy::Naive {
            return Err("--callers-kind blocking|mixed needs a onefill strategy: \
                        the naive one has no cache to call"
                .to_owned());
        }
        if self.rate.is_none() && self.callers > MAX_CALLER_THREADS {
            return Err(format!(
                "--callers-kind blocking|mixed runs callers on OS threads: at most \
                 {MAX_CALLER_THREADS} callers per process in a herd, not {}",
                self.callers
            ));
        }
        Ok(())
    }
}

fn within<T: PartialOrd + Display>(
    field: &str,
    value: T,
    range: RangeInclusive<T>,
) -> Result<(), String> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{field} is {value}, not in {}..={}",
            range.start(),
            range.end()
        ))
    }
}

/// Flags of `onefill fleet`.
#[derive(Debug, Clone, Args)]
pub struct FleetArgs {
    /// What every worker runs.
    #[command(flatten)]
    pub run: RunArgs,
    /// Use N keys, `key-0` … `key-{N-1}`, instead of --keys.
    #[arg(long, value_name = "N", conflicts_with = "keys",
          value_parser = clap::value_parser!(u32).range(KEY_COUNT))]
    pub key_count: Option<u32>,
    /// Inject a fault at --fault-at-ms and report what callers saw. This
    /// changes the cluster or kills a worker: see --help.
    ///
    /// Steady mode on a cluster (`failover`, `kill`, `hang`): fault the
    /// master that owns the most of the run's keys (the victim; the
    /// `fault` section). `failover` sends CLUSTER FAILOVER to a replica of
    /// the victim: the two swap roles, and stay swapped. `kill` sends
    /// SIGKILL to the victim's redis-server, which must run on this
    /// machine (a loopback address): the node stays dead. `hang` sends it
    /// SIGSTOP (same machine) and SIGCONT when the run ends, whatever
    /// happens; it then rejoins as a replica. The parent then polls CLUSTER
    /// SLOTS of a healthy master every 20 ms until the victim's slots are
    /// served by another node (the promotion). An answer older than ttl +
    /// grace + 250 ms counts as too old, a call slower than max(100 ms,
    /// 2 × load, the healthy keys' p99) as slow; the victim's recovery is
    /// the end of its last abnormal call after the promotion.
    ///
    /// Steady mode through Sentinels (the same three): fault the primary
    /// the Sentinels name. `failover` sends SENTINEL FAILOVER to a
    /// Sentinel; `kill` and `hang` as above. The promotion is when a
    /// majority of the Sentinels name another primary and it answers ROLE
    /// as a master (polled every 20 ms). Every key is the victim's; the
    /// section also counts the writes the promotion lost (`lost_writes`:
    /// see the operating guide).
    ///
    /// Herd mode on one server or a cluster (`kill-holder`, `stop-holder`, the onefill
    /// strategy): fault the worker process that holds the lease of the
    /// first of the run's keys whose lease is held (the process named by
    /// its `loads:pid` key; the `holder_fault` section). `kill-holder`
    /// sends it SIGKILL; `stop-holder` SIGSTOP, and SIGCONT once every
    /// other process has answered (whatever happens); its late answers are
    /// reported apart. The report gives when the other processes' callers
    /// were answered (max and p99, from the start) and whether every one
    /// was answered without an error or a wait timeout.
    #[arg(long, value_enum, conflicts_with = "chaos")]
    pub fault: Option<FaultKind>,
    /// When the fault is injected, in milliseconds after the start (less
    /// than --duration-ms in steady mode).
    #[arg(long, default_value_t = 5_000, requires = "fault")]
    pub fault_at_ms: u64,
    /// With --chaos: the foreign client's operations per second (a write,
    /// `DEL`, `PEXPIRE`, `PERSIST` or unreadable `SET` of a random key).
    #[arg(long, default_value_t = 50, requires = "chaos",
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub chaos_ops: u32,
    /// With --chaos: how far the workers' clocks may be from the server's,
    /// in milliseconds, added to the bound (0 when they run on the
    /// server's machine; for a remote server, synchronize the clocks and
    /// give their worst offset).
    #[arg(long, default_value_t = 0, requires = "chaos",
          value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub clock_skew_ms: u64,
    /// Steady mode: the parent calls `Cache::expire` of the run's first key
    /// once, this many milliseconds after the start, and the report gets a
    /// `write` section: the loads of the key from then on, and the calls of
    /// it made until the first of those loads ended, against the p99 of
    /// the run's hits. With a grace window (--grace-ms) they are answered
    /// stale while one refresh runs; without, it is an `invalidate`.
    #[arg(long, value_name = "MS", conflicts_with_all = ["invalidate_at_ms", "fault", "chaos"])]
    pub expire_at_ms: Option<u64>,
    /// Steady mode: as --expire-at-ms, with `Cache::invalidate` (the value
    /// removed: the calls until the reload wait for it).
    #[arg(long, value_name = "MS", conflicts_with_all = ["fault", "chaos"])]
    pub invalidate_at_ms: Option<u64>,
    /// Worker processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub processes: u32,
    /// Namespace of the run's keys (default: a fresh random one).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Also write the run as one self-contained HTML page (charts of the
    /// answers, latencies and loads over time, the fault window shaded,
    /// and the summary table).
    #[arg(long, value_name = "FILE", conflicts_with = "chaos")]
    pub report: Option<std::path::PathBuf>,
    /// No progress messages on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Flags of `onefill worker`: what to run, either as the run flags or as
/// one `--run-json` value (how `fleet` starts its workers).
#[derive(Debug, Clone, Args)]
#[command(mut_arg("redis", |redis| redis.required(false).required_unless_present_any(["run_json", "sentinel"])))]
pub struct WorkerArgs {
    /// What to run, given as flags.
    #[command(flatten)]
    flags: RunArgs,
    /// What to run, as one JSON value (instead of the run flags).
    #[arg(long, value_name = "JSON", value_parser = RunArgs::from_json, conflicts_with = "RunArgs")]
    run_json: Option<RunArgs>,
    /// Namespace of the run's keys.
    #[arg(long)]
    pub namespace: String,
    /// Print "ready", then wait for a line on stdin before starting.
    #[arg(long)]
    pub sync: bool,
}

impl WorkerArgs {
    /// The worker's start command after the program name: `worker`, then
    /// its flags, with `run` as one JSON value.
    pub fn command_line(run_json: &str, namespace: &str) -> [String; 6] {
        [
            "worker".to_owned(),
            "--sync".to_owned(),
            "--namespace".to_owned(),
            namespace.to_owned(),
            "--run-json".to_owned(),
            run_json.to_owned(),
        ]
    }

    /// What to run, however it was given.
    pub fn run(&self) -> &RunArgs {
        self.run_json.as_ref().unwrap_or(&self.flags)
    }
}

/// The default of --durability-timeout-ms, for workers given arguments
/// without it.
fn default_durability_timeout_ms() -> u64 {
    50
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::args::parse_flags;

    fn worker(argv: &[&str]) -> Result<WorkerArgs, clap::Error> {
        parse_flags(argv)
    }

    /// Every field away from its default. A struct literal, so a new field
    /// does not compile until it is set here too.
    fn every_field_set() -> RunArgs {
        RunArgs {
            redis: vec!["redis://a:7000".to_owned(), "redis://b:7001".to_owned()],
            cluster: true,
            // Not with the URLs of a cluster: see the Sentinel test below.
            sentinel: vec![],
            master_name: None,
            strategy: FleetStrategy::CoalescingOnly,
            keys: vec!["k1".to_owned(), "user:42".to_owned()],
            callers: 7,
            callers_kind: CallersKind::Mixed,
            load_ms: 123,
            rate: Some(250),
            duration_ms: 4_321,
            ttl_ms: 9_876,
            grace_ms: 555,
            backend_timeout_ms: Some(333),
            lease_ttl_ms: Some(1_234),
            wait_deadline_ms: Some(2_468),
            detail: true,
            strict: true,
            durability_replicas: 0,
            durability_timeout_ms: 50,
            keep_counters: true,
            no_l1: false,
            chaos: true,
        }
    }

    fn fleet(argv: &[&str]) -> Result<FleetArgs, clap::Error> {
        let argv: Vec<&str> = ["--redis", "redis://x"]
            .into_iter()
            .chain(argv.iter().copied())
            .collect();
        parse_flags(&argv)
    }

    #[test]
    fn fault_flags_parse_every_kind() {
        let ok = fleet(&["--cluster", "--rate", "10", "--fault", "hang"]).expect("parses");
        assert_eq!(ok.fault, Some(FaultKind::Hang));
        assert_eq!(ok.fault_at_ms, 5_000);
        let at = fleet(&[
            "--cluster",
            "--rate",
            "10",
            "--fault",
            "kill",
            "--fault-at-ms",
            "100",
        ])
        .expect("parses");
        assert_eq!((at.fault, at.fault_at_ms), (Some(FaultKind::Kill), 100));
        for (name, kind) in [
            ("kill-holder", FaultKind::KillHolder),
            ("stop-holder", FaultKind::StopHolder),
        ] {
            let holder = fleet(&["--fault", name, "--fault-at-ms", "500"]).expect("parses");
            assert_eq!(holder.fault, Some(kind));
            assert!(kind.is_holder());
        }
        assert!(fleet(&["--cluster", "--rate", "10", "--fault", "nap"]).is_err());
        assert!(
            fleet(&["--fault-at-ms", "100"]).is_err(),
            "--fault-at-ms without --fault"
        );
        assert!(fleet(&["--chaos", "--fault", "kill-holder"]).is_err());
        assert_eq!(fleet(&[]).expect("parses").fault, None);
    }

    #[test]
    fn a_write_is_one_kind_at_one_time_without_a_fault_or_chaos() {
        let e = fleet(&["--rate", "10", "--expire-at-ms", "500"]).expect("parses");
        assert_eq!((e.expire_at_ms, e.invalidate_at_ms), (Some(500), None));
        let i = fleet(&["--rate", "10", "--invalidate-at-ms", "700"]).expect("parses");
        assert_eq!((i.expire_at_ms, i.invalidate_at_ms), (None, Some(700)));
        for bad in [
            &["--expire-at-ms", "5", "--invalidate-at-ms", "5"][..],
            &["--expire-at-ms", "5", "--chaos"],
            &["--invalidate-at-ms", "5", "--fault", "kill-holder"],
        ] {
            assert!(fleet(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn report_takes_a_file_and_not_chaos() {
        let r = fleet(&["--report", "run.html"]).expect("parses");
        assert_eq!(r.report.as_deref(), Some(std::path::Path::new("run.html")));
        assert!(fleet(&["--chaos", "--report", "run.html"]).is_err());
    }

    #[test]
    fn key_count_replaces_the_key_list() {
        assert_eq!(
            fleet(&["--key-count", "50"]).expect("parses").key_count,
            Some(50)
        );
        assert!(fleet(&["--key-count", "5", "--keys", "a,b"]).is_err());
        assert!(fleet(&["--key-count", "0"]).is_err());
    }

    #[test]
    fn run_args_reach_the_worker_exactly_as_json() {
        let run = every_field_set();
        let json = run.to_json().expect("encodes");
        let argv = WorkerArgs::command_line(&json, "ns");
        let (subcommand, flags) = argv.split_first().expect("not empty");
        assert_eq!(subcommand, "worker");
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let args = worker(&flags).expect("the worker's command line parses");
        assert_eq!(args.run(), &run);
        assert_eq!(args.namespace, "ns");
        assert!(args.sync);
    }

    #[test]
    fn a_sentinel_run_reaches_the_worker_and_excludes_redis_urls() {
        let run = RunArgs {
            redis: vec![],
            cluster: false,
            sentinel: vec!["redis://s1:26379".to_owned(), "redis://s2:26379".to_owned()],
            master_name: Some("primary".to_owned()),
            ..every_field_set()
        };
        let json = run.to_json().expect("encodes");
        let argv = WorkerArgs::command_line(&json, "ns");
        let flags: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
        assert_eq!(worker(&flags).expect("parses").run(), &run);
        for (what, bad) in [
            (
                "no master name",
                RunArgs {
                    master_name: None,
                    ..run.clone()
                },
            ),
            (
                "a cluster",
                RunArgs {
                    cluster: true,
                    ..run.clone()
                },
            ),
            (
                "Redis URLs too",
                RunArgs {
                    redis: vec!["redis://x".to_owned()],
                    ..run.clone()
                },
            ),
        ] {
            assert!(
                RunArgs::from_json(&bad.to_json().expect("encodes")).is_err(),
                "{what}"
            );
        }
        let flags = parse_flags::<FleetArgs>(&[
            "--sentinel",
            "redis://s1",
            "--sentinel",
            "redis://s2",
            "--master-name",
            "m",
        ])
        .expect("parses");
        assert_eq!(flags.run.sentinel.len(), 2);
        assert_eq!(flags.run.master_name.as_deref(), Some("m"));
        assert!(flags.run.redis.is_empty());
        for bad in [
            &["--sentinel", "redis://s1"][..],
            &["--master-name", "m", "--redis", "redis://x"],
            &[
                "--sentinel",
                "redis://s1",
                "--master-name",
                "m",
                "--redis",
                "redis://x",
            ],
            &[
                "--sentinel",
                "redis://s1",
                "--master-name",
                "m",
                "--cluster",
            ],
            &[],
        ] {
            assert!(parse_flags::<FleetArgs>(bad).is_err(), "{bad:?}");
        }
        let w = worker(&[
            "--namespace",
            "ns",
            "--sentinel",
            "redis://s",
            "--master-name",
            "m",
        ])
        .expect("a worker takes Sentinel URLs instead of --redis");
        assert_eq!(w.run().sentinel, ["redis://s"]);
    }

    #[test]
    fn a_worker_still_takes_the_run_flags() {
        let args = worker(&[
            "--namespace",
            "ns",
            "--redis",
            "redis://x",
            "--callers",
            "20",
            "--lease-ttl-ms",
            "1000",
        ])
        .expect("parses");
        assert_eq!(args.run().redis, ["redis://x"]);
        assert_eq!(args.run().callers, 20);
        assert_eq!(args.run().lease_ttl_ms, Some(1_000));
        assert_eq!(args.run().keys, ["hot"]);
    }

    #[test]
    fn a_worker_needs_its_run_once() {
        let json = every_field_set().to_json().expect("encodes");
        assert!(worker(&["--namespace", "ns"]).is_err(), "no run at all");
        assert!(
            worker(&["--namespace", "ns", "--run-json", &json, "--callers", "3"]).is_err(),
            "a run both as JSON and as flags"
        );
    }

    #[test]
    fn run_json_is_held_to_the_bounds_of_the_flags() {
        let good = every_field_set();
        for (what, bad) in [
            (
                "no URL",
                RunArgs {
                    redis: vec![],
                    ..good.clone()
                },
            ),
            (
                "no key",
                RunArgs {
                    keys: vec![],
                    ..good.clone()
                },
            ),
            (
                "empty key",
                RunArgs {
                    keys: vec![String::new()],
                    ..good.clone()
                },
            ),
            (
                "0 callers",
                RunArgs {
                    callers: 0,
                    ..good.clone()
                },
            ),
            (
                "long load",
                RunArgs {
                    load_ms: MAX_LOAD_MS + 1,
                    ..good.clone()
                },
            ),
            (
                "0 rate",
                RunArgs {
                    rate: Some(0),
                    ..good.clone()
                },
            ),
            (
                "short lease",
                RunArgs {
                    lease_ttl_ms: Some(29),
                    ..good.clone()
                },
            ),
            (
                "thread callers of the naive strategy",
                RunArgs {
                    strategy: FleetStrategy::Naive,
                    ..good.clone()
                },
            ),
            (
                "a herd of too many threads",
                RunArgs {
                    rate: None,
                    callers: MAX_CALLER_THREADS + 1,
                    ..good.clone()
                },
            ),
            (
                "0 deadline",
                RunArgs {
                    wait_deadline_ms: Some(0),
                    ..good.clone()
                },
            ),
        ] {
            let json = bad.to_json().expect("encodes");
            assert!(RunArgs::from_json(&json).is_err(), "{what} accepted");
        }
        assert!(RunArgs::from_json("{}").is_err());
        assert!(RunArgs::from_json("not json").is_err());
        let mut extra: serde_json::Value =
            serde_json::from_str(&good.to_json().expect("encodes")).expect("JSON");
        extra["no_such_field"] = 1.into();
        assert!(
            RunArgs::from_json(&extra.to_string()).is_err(),
            "unknown field accepted"
        );
    }
}
