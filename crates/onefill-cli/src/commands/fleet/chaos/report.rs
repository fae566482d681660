//! What `fleet --chaos` reports: the answers checked, the foreign
//! operations, the violations (the first few in detail), the worst lag
//! measured, and on a cluster what was done to it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::records::ClusterEvent;

/// The answers, counted.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AnswerCounts {
    /// Every call the workers made.
    pub total: u64,
    /// By outcome (`hit`, `loaded`, `waited`, `stale`, `degraded`, `error`).
    pub by_outcome: BTreeMap<String, u64>,
    /// Answered by the L1.
    pub from_l1: u64,
    /// Answers of a version the check knows had left the server (and so
    /// could have been violations).
    pub bounded: u64,
    /// The same, answered by the L1.
    pub l1_bounded: u64,
    /// Answers whose call started within a second after a foreign change
    /// of their key.
    pub soon_after_change: u64,
    /// The same, answered by the L1.
    pub l1_soon_after_change: u64,
}

/// The foreign operations of one kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OpCounts {
    pub sent: u64,
    /// Those that changed the key (a `DEL` of a key that was there, …).
    pub changed: u64,
    /// Those whose reply was an error or never came (they may have
    /// happened).
    pub failed: u64,
}

/// One answer the check found too old (or never written).
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub pid: u32,
    pub key: u32,
    pub version: Option<String>,
    pub outcome: String,
    pub from_l1: bool,
    /// The call, Unix µs (the worker's clock).
    pub start_us: u64,
    pub end_us: u64,
    /// How long before the call its version had certainly left the server.
    pub lag_ms: Option<f64>,
    /// When the call started, ms after the run's start (the parent's
    /// clock), to compare with the cluster events.
    pub at_ms: f64,
    pub why: String,
}

/// The report of `onefill fleet --chaos`.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    pub cluster: bool,
    pub processes: u32,
    pub keys: usize,
    pub namespace: String,
    pub duration_ms: u64,
    /// The bound an answer is held to: the L1's sync bound (ms).
    pub bound_ms: f64,
    /// The clock skew allowed between the workers and the server (ms).
    pub clock_skew_ms: f64,
    pub answers: AnswerCounts,
    /// Answers whose version had left the server more than the bound
    /// before their call started, or that nobody wrote.
    pub violations: u64,
    /// The same, by the answer's outcome: `stale` is the outage fallback's
    /// (or a grace window's) answer, `hit` from the L1 or the server.
    pub violations_by_outcome: BTreeMap<String, u64>,
    /// The first few, in detail.
    pub first_violations: Vec<Violation>,
    /// The worst delay measured between a version certainly leaving the
    /// server and a call that started later still answering it (ms;
    /// negative: every answer's version was still held when its call
    /// started); `None` if no answered version is known to have left.
    pub worst_lag_ms: Option<f64>,
    /// Whether the L1 gave that answer.
    pub worst_lag_from_l1: bool,
    /// Answers that started after their version had left, within the
    /// bound.
    pub late_answers: u64,
    /// Loads the workers ran.
    pub loads: u64,
    /// The foreign client's operations, by kind.
    pub foreign_ops: BTreeMap<String, OpCounts>,
    /// What was done to the cluster (`--cluster`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cluster_events: Vec<ClusterEvent>,
    /// The workers' L1 counters, summed: hits, invalidations, resets.
    pub l1_hits: u64,
    pub l1_invalidations: u64,
    pub l1_resets: u64,
    /// The first few errors the workers saw.
    pub error_messages: Vec<String>,
    /// From the start to the last report, ms.
    pub wall_ms: f64,
}

impl ChaosReport {
    /// The text summary (without `--json`).
    pub fn to_text(&self) -> String {
        let a = &self.answers;
        let ops: Vec<String> = self
            .foreign_ops
            .iter()
            .map(|(kind, c)| {
                let failed = if c.failed > 0 {
                    format!(", {} failed", c.failed)
                } else {
                    String::new()
                };
                format!("{kind} {} ({} changed{failed})", c.sent, c.changed)
            })
            .collect();
        let outcomes: Vec<String> = a
            .by_outcome
            .iter()
            .map(|(o, n)| format!("{o} {n}"))
            .collect();
        let lag = match self.worst_lag_ms {
            Some(lag) => format!(
                "{lag:.1} ms{}",
                if self.worst_lag_from_l1 {
                    " (from the L1)"
                } else {
                    ""
                }
            ),
            None => "none measured".to_owned(),
        };
        let mut text = format!(
            "chaos on {} ({} processes, {} keys, {} ms): {} answers checked ({}; {} from the L1), \
             {} of a version known to have left ({} from the L1), {} within 1 s of a foreign change \
             ({} from the L1)\n\
             foreign: {}\n\
             loads: {}; L1: {} hits, {} invalidations, {} resets\n\
             worst lag: {lag}; late answers within the bound: {}\n\
             violations (older than {:.0} ms + {:.0} ms skew): {}",
            if self.cluster { "a cluster" } else { "a server" },
            self.processes,
            self.keys,
            self.duration_ms,
            a.total,
            outcomes.join(", "),
            a.from_l1,
            a.bounded,
            a.l1_bounded,
            a.soon_after_change,
            a.l1_soon_after_change,
            ops.join(", "),
            self.loads,
            self.l1_hits,
            self.l1_invalidations,
            self.l1_resets,
            self.late_answers,
            self.bound_ms,
            self.clock_skew_ms,
            self.violations,
        );
        for v in &self.first_violations {
            text.push_str(&format!(
                "\n  at {:.0} ms, key {} pid {} {} {}{}: {}",
                v.at_ms,
                v.key,
                v.pid,
                v.version.as_deref().unwrap_or("-"),
                v.outcome,
                if v.from_l1 { " (L1)" } else { "" },
                v.why
            ));
        }
        for e in &self.cluster_events {
            text.push_str(&format!("\ncluster at {:.0} ms: {}", e.at_ms, e.what));
        }
        text
    }
}
