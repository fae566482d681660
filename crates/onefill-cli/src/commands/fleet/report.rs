//! What a fleet run reports: each worker's JSON line, and the parent's sum.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::args::{CallersKind, FleetStrategy, RunArgs};
use super::fault::holder_report::HolderFaultReport;
use super::fault::records::{CallRecord, LoadRecord};
use super::fault::report::FaultReport;
use super::written::WriteReport;

/// The measured result of one fleet run.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    /// Strategy of every process.
    pub strategy: FleetStrategy,
    /// Worker processes.
    pub processes: u32,
    /// Callers per process (herd mode).
    pub callers_per_process: u32,
    /// How the callers called: async tasks, OS threads on the blocking
    /// cache, or both.
    pub callers_kind: CallersKind,
    /// Namespace used.
    pub namespace: String,
    /// Loads per key, counted in Redis.
    pub loads_per_key: Vec<(String, i64)>,
    /// All loads, counted in Redis.
    pub loads: i64,
    /// Loads per key, counted by the workers (reliable when a node holding
    /// a Redis counter failed).
    pub local_loads_per_key: Vec<(String, u64)>,
    /// All loads, counted by the workers.
    pub local_loads: u64,
    /// With `--fault`: the fault and what callers saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultReport>,
    /// With `--fault kill-holder` or `stop-holder`: the holder and what the
    /// other processes saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder_fault: Option<HolderFaultReport>,
    /// With `--expire-at-ms` or `--invalidate-at-ms`: the write and what
    /// it cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write: Option<WriteReport>,
    /// Commands the server executed during the run (all nodes), excluding
    /// the parent's own CONFIG/INFO.
    pub redis_commands: u64,
    /// Calls made by all processes.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Calls made by OS threads on the blocking cache.
    pub blocking_calls: u64,
    /// Worst caller latency over all processes, ms.
    pub max_ms: f64,
    /// Highest per-process p99, ms.
    pub p99_ms: f64,
    /// Each process's own report.
    pub workers: Vec<WorkerReport>,
    /// From "go" to the last report, ms.
    pub wall_ms: f64,
    /// Every reported call and load on the parent's clock (for the HTML
    /// report; the JSON has them per worker with `--detail`).
    #[serde(skip)]
    pub records: Records,
}

/// The workers' calls and loads, merged onto the parent's clock (ms after
/// its "go").
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// Every reported call.
    pub calls: Vec<CallRecord>,
    /// Every reported load.
    pub loads: Vec<LoadRecord>,
}

impl Records {
    /// `report`'s logs moved onto the parent's clock: each worker's t = 0
    /// is its own "go", a few ms after the parent's (`started_unix_ms`).
    pub fn of_worker(report: &WorkerReport, started_unix_ms: f64) -> Records {
        let shift = report.origin_unix_ms as f64 - started_unix_ms;
        let calls = report
            .call_log
            .iter()
            .map(|c| CallRecord {
                started_ms: c[0] as f64 + shift,
                key: c[1] as usize,
                outcome: c[2],
                latency_ms: c[3] as f64 / 1000.0,
                age_ms: c[4],
            })
            .collect();
        let loads = report
            .load_spans
            .iter()
            .map(|l| LoadRecord {
                started_ms: l[0] as f64 + shift,
                key: l[1] as usize,
                ended_ms: Some(l[2] as f64 + shift),
            })
            .collect();
        Records { calls, loads }
    }

    /// Adds `other`'s records.
    pub fn extend(&mut self, other: Records) {
        self.calls.extend(other.calls);
        self.loads.extend(other.loads);
    }
}

impl FleetReport {
    /// The one-line text summary of `onefill fleet` (without `--json`).
    pub fn to_text(&self, run: &RunArgs) -> String {
        let shape = match run.rate {
            Some(rate) => format!(
                "{} processes × {rate} req/s for {} ms",
                self.processes, run.duration_ms
            ),
            None => format!(
                "{} processes × {} callers",
                self.processes, self.callers_per_process
            ),
        };
        let kind = match self.callers_kind {
            CallersKind::Async => String::new(),
            CallersKind::Blocking => ", OS-thread callers".to_owned(),
            CallersKind::Mixed => format!(
                ", mixed callers ({} calls by OS threads)",
                self.blocking_calls
            ),
        };
        let summary = format!(
            "{shape} ({:?}{kind}): {} loads (counted in Redis), {} Redis commands, {} calls, \
             {} errors, worst p99 {:.1} ms, max {:.1} ms",
            self.strategy,
            self.loads,
            self.redis_commands,
            self.calls,
            self.errors,
            self.p99_ms,
            self.max_ms
        );
        let mut text = summary;
        if let Some(fault) = &self.fault {
            text = format!("{text}\n{}", fault.to_text());
        }
        if let Some(fault) = &self.holder_fault {
            text = format!("{text}\n{}", fault.to_text());
        }
        if let Some(write) = &self.write {
            text = format!("{text}\n{}", write.to_text());
        }
        text
    }
}

/// What one worker reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    /// The worker's process id.
    pub pid: u32,
    /// Calls made.
    pub calls: u64,
    /// Calls that returned an error.
    pub errors: u64,
    /// Of the calls, those made by OS threads on the blocking cache
    /// (`--callers-kind blocking|mixed`).
    #[serde(default)]
    pub blocking_calls: u64,
    /// The first few error messages.
    pub error_messages: Vec<String>,
    /// Calls by outcome (`hit`, `stale`, `loaded`, `waited`, `degraded`;
    /// `naive_hit`, `naive_load` for the naive strategy).
    pub outcomes: BTreeMap<String, u64>,
    /// Calls whose answer included a load or a wait (loaded, waited,
    /// degraded, naive_load) that started after this process's first answer.
    pub slow_after_first: u64,
    /// Loads this process ran.
    pub local_loads: u64,
    /// Caller latency percentiles, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest caller.
    pub max_ms: f64,
    /// The cache's counters at the end (onefill strategies).
    pub stats: Option<onefill::Stats>,
    /// Samples every 100 ms: `[t_ms, lease_acquired, loads_ok, degraded_loads, stale_served]`.
    pub samples: Vec<[u64; 5]>,
    /// Unix time (ms) of this worker's t = 0, its "go".
    #[serde(default)]
    pub origin_unix_ms: u64,
    /// Loads this process ran that its counter could not count in Redis
    /// (it waits a few seconds at most at the end).
    #[serde(default)]
    pub loads_not_counted_in_redis: u64,
    /// Loads this process ran, per key (in the order of the run's keys).
    #[serde(default)]
    pub local_loads_per_key: Vec<u64>,
    /// Every call (printed with `--detail`), `[started_ms, key_index,
    /// outcome_code, latency_us, age_ms]`, `started_ms` from this worker's
    /// t = 0, `outcome_code` 0 error, 1 hit, 2 stale, 3 loaded, 4 waited,
    /// 5 degraded, 6 naive_hit, 7 naive_load, 8 other; `age_ms` the age of
    /// the answered value (its load's completion time is in the value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub call_log: Vec<[u64; 5]>,
    /// Every load (printed with `--detail`), `[started_ms, key_index]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_log: Vec<[u64; 2]>,
    /// Every load (printed with `--detail`), `[started_ms, key_index,
    /// ended_ms]`: `load_log` with each load's end (or cancellation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_spans: Vec<[u64; 3]>,
}
