//! The `fault` section of a fleet report: what the callers of the healthy
//! keys and of the victim's keys saw, and its few lines of text.

use serde::{Deserialize, Serialize};

use super::kind::{FaultKind, ValueCheck};

/// What the callers of one class of keys saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnswerFigures {
    /// Keys in the class.
    pub keys: usize,
    /// Calls on them.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Stale answers.
    pub stale: u64,
    /// Degraded answers (a load without the lease, not stored).
    pub degraded: u64,
    /// Answers older than the age limit.
    pub over_age_limit: u64,
    /// Calls slower than the slow limit.
    pub slow: u64,
    /// Abnormal calls (any of the above).
    pub abnormal: u64,
    /// When the first abnormal call started, ms after "go".
    pub first_abnormal_ms: Option<f64>,
    /// When the last abnormal call ended, ms after "go".
    pub last_abnormal_end_ms: Option<f64>,
    /// Abnormal calls by start time, in buckets of 500 ms from "go".
    pub abnormal_timeline: Vec<u64>,
    /// The oldest answer, ms.
    pub max_age_ms: u64,
    /// 99th percentile of the latency, ms.
    pub p99_ms: f64,
    /// Slowest call, ms.
    pub max_ms: f64,
}

/// Abnormal calls by kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AbnormalKinds {
    /// Abnormal calls.
    pub calls: u64,
    /// Failed.
    pub errors: u64,
    /// Answered stale.
    pub stale: u64,
    /// Answered degraded.
    pub degraded: u64,
    /// Answered a value older than the age limit.
    pub over_age_limit: u64,
    /// Slower than the slow limit.
    pub slow: u64,
}

/// The keys on healthy masters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthyFigures {
    /// What their callers saw.
    #[serde(flatten)]
    pub answers: AnswerFigures,
    /// Their loads (counted by the workers).
    pub loads: u64,
    /// `keys × duration / (ttl + load)`.
    pub ideal_loads: f64,
}

/// The victim's keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VictimFigures {
    /// What their callers saw.
    #[serde(flatten)]
    pub answers: AnswerFigures,
    /// End of the last abnormal call that started after the promotion,
    /// minus the promotion time (0 if there is none; `None` without a
    /// promotion).
    pub recovered_after_promotion_ms: Option<f64>,
    /// As `recovered_after_promotion_ms`, counting also the abnormal
    /// calls that started before the promotion and were still running at
    /// it (a call that waited on a server the failover replaced, from
    /// before the fault until long after the promotion, counts here): from
    /// this long after the promotion, every call of a victim key ended
    /// normally.
    #[serde(default)]
    pub settled_after_promotion_ms: Option<f64>,
    /// The abnormal calls that started after the promotion, by kind (a
    /// call may count under several): what the recovery time is made of.
    pub abnormal_after_promotion: AbnormalKinds,
    /// Their loads (counted by the workers).
    pub loads: u64,
    /// Loads that started outside the outage window.
    pub loads_outside_outage: u64,
    /// `keys × (duration − window) / (ttl + load)`.
    pub ideal_loads_outside_outage: f64,
    /// Of the loads outside the outage window, those that started while
    /// another load of the key outside the window still ran or had ended
    /// less than `lost_writes.reload_window_ms` before (its value should
    /// still have lived): loads beyond one per expiry.
    #[serde(default)]
    pub extra_loads_outside_outage: u64,
    /// Loads that started inside the outage window.
    pub loads_inside_outage: u64,
}

/// Writes the old primary acknowledged that the promotion lost: leases
/// and fills of the victim's keys it granted or stored that the new
/// primary did not have.
///
/// - `two_holders`: pairs of loads of one key that ran at once across the
///   promotion: one started before the fault (under a lease the healthy
///   old primary granted) and still ran when the other started, after the
///   promotion (under a lease the new primary granted: the first was not
///   there).
/// - `premature_reloads`: keys whose first load after the promotion
///   started less than `reload_window_ms` (`0.9 × ttl − 10 × load`: the
///   TTL written, up to 10 % shorter for its jitter, less more than an
///   early refresh takes ahead) after the end
///   of their last load that ended at least 20 ms before the fault: the
///   value that load stored (its fill acknowledged by the healthy old
///   primary) should still have lived, and no early refresh starts that
///   soon, so it was gone from the new primary.
/// - `values` (a Sentinel set-up): the run's values read on the old primary
///   just before the fault (after a failover, again at the promotion: it
///   may have taken fills after the fault) looked for on the new primary
///   right after the promotion; and after a failover, the writes the old
///   primary took after the promotion while it still answered as a master
///   (all lost: it drops them when made a replica); see [`ValueCheck`].
///
/// Not counted: a fill or lease the old primary acknowledged between the
/// fault and the promotion, other than through `values` after a failover
/// (from the logs alone, such a load cannot be told from one whose fill
/// failed). With loads shorter than the outage `two_holders` is 0 by
/// construction; with a TTL shorter than the outage, `premature_reloads`
/// and `values` find nothing to check.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LostWrites {
    /// Loads after the promotion overlapping one that held a lease from
    /// before the fault.
    pub two_holders: u64,
    /// Keys reloaded after the promotion while their value should have
    /// lived.
    pub premature_reloads: u64,
    /// Their indices into the run's keys.
    pub premature_keys: Vec<usize>,
    /// `0.9 × ttl − 10 × load`: a reload this soon after the value's load
    /// is premature, ms.
    pub reload_window_ms: f64,
    /// The values looked for on the new primary (`None`: not checked).
    pub values: Option<ValueCheck>,
}

/// The `fault` section of a fleet report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultReport {
    /// The fault.
    pub kind: FaultKind,
    /// `ip:port` of the victim master.
    pub victim_address: String,
    /// Its process id (kill and hang).
    pub victim_pid: Option<u32>,
    /// The keys it served.
    pub victim_keys: Vec<String>,
    /// `ip:port` of the node serving its slots after the promotion.
    pub promoted_to: Option<String>,
    /// When the fault was injected, ms after "go".
    pub fault_at_ms: f64,
    /// When a healthy master first saw the victim's slots served by another
    /// node, ms after "go" (`None`: not within the run).
    pub promoted_at_ms: Option<f64>,
    /// `ttl + grace + 250 ms`: an older answer is abnormal.
    pub age_limit_ms: u64,
    /// `max(100 ms, 2 × load, the healthy keys' p99)`: a slower call is
    /// abnormal.
    pub slow_limit_ms: f64,
    /// The outage window `[fault_at, promoted_at + 1500 ms]` (to the end of
    /// the run without a promotion), ms after "go".
    pub outage_window_ms: [f64; 2],
    /// The keys on healthy masters.
    pub healthy: HealthyFigures,
    /// The victim's keys.
    pub victim: VictimFigures,
    /// Acknowledged writes the promotion lost.
    #[serde(default)]
    pub lost_writes: LostWrites,
}

impl FaultReport {
    /// A few lines for the text report.
    pub fn to_text(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("never".to_owned(), |v| format!("{v:.0} ms"));
        let class = |name: &str, a: &AnswerFigures| {
            format!(
                "  {name}: {} keys, {} calls, {} errors, {} stale, {} degraded, {} over {} ms old \
                 (oldest {} ms), {} slower than {:.0} ms, p99 {:.1} ms, max {:.1} ms",
                a.keys,
                a.calls,
                a.errors,
                a.stale,
                a.degraded,
                a.over_age_limit,
                self.age_limit_ms,
                a.max_age_ms,
                a.slow,
                self.slow_limit_ms,
                a.p99_ms,
                a.max_ms
            )
        };
        [
            format!(
                "fault {:?} of {} at {:.0} ms; its keys served by {} at {}{}",
                self.kind,
                self.victim_address,
                self.fault_at_ms,
                self.promoted_to.as_deref().unwrap_or("nobody"),
                opt(self.promoted_at_ms),
                self.promoted_at_ms.map_or(String::new(), |p| format!(
                    " (promoted {:.0} ms after the fault)",
                    p - self.fault_at_ms
                ))
            ),
            class("healthy keys", &self.healthy.answers),
            format!(
                "    loads {} (ideal {:.1})",
                self.healthy.loads, self.healthy.ideal_loads
            ),
            class("victim keys", &self.victim.answers),
            format!(
                "    recovered {} after the promotion ({} counting the calls running at it); \
                 loads outside [{:.0}, {:.0}] ms {} (ideal {:.1}, {} before the last value \
                 could expire), inside {}",
                opt(self.victim.recovered_after_promotion_ms),
                opt(self.victim.settled_after_promotion_ms),
                self.outage_window_ms[0],
                self.outage_window_ms[1],
                self.victim.loads_outside_outage,
                self.victim.ideal_loads_outside_outage,
                self.victim.extra_loads_outside_outage,
                self.victim.loads_inside_outage
            ),
            format!(
                "    lost writes: {} two holders, {} premature reloads (within {:.0} ms of a \
                 fill before the fault), {}",
                self.lost_writes.two_holders,
                self.lost_writes.premature_reloads,
                self.lost_writes.reload_window_ms,
                self.lost_writes.values.as_ref().map_or_else(
                    || "values not checked".to_owned(),
                    |v| format!(
                        "{} of {} values vanished (checked with over {} ms to live); {} writes \
                         to the old primary after the promotion (demoted at {})",
                        v.vanished,
                        v.checked,
                        v.margin_ms,
                        v.old_primary_writes,
                        opt(v.old_primary_demoted_at_ms)
                    )
                )
            ),
        ]
        .join("\n")
    }
}
