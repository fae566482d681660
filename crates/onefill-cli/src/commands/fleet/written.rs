//! `fleet --expire-at-ms` / `--invalidate-at-ms`: one write of the run's
//! first key in the middle of a steady run, and what it cost, worked out
//! from the workers' call and load logs (on the parent's clock): the loads
//! of the key from the write on, and the calls of the key made while the
//! first of those loads ran (the transition: after `invalidate` they wait
//! for it, after `expire` with a grace window they are answered stale),
//! against the p99 of the run's hits.

use std::collections::BTreeMap;

use serde::Serialize;

use super::fault::records::{CallRecord, LoadRecord};
use super::outcome::OUTCOME_NAMES;

/// Which write the parent makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteKind {
    /// `Cache::expire`: the value made stale in place.
    Expire,
    /// `Cache::invalidate`: the value removed.
    Invalidate,
}

/// The write to make, and when (ms after the parent's "go").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritePlan {
    /// Which write.
    pub kind: WriteKind,
    /// When.
    pub at_ms: u64,
}

/// The write as the parent made it, on its clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// Which write.
    pub kind: WriteKind,
    /// The key written (the run's first).
    pub key: String,
    /// When the call was made, ms after "go".
    pub sent_ms: f64,
    /// When it returned.
    pub done_ms: f64,
}

/// The `write` section of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WriteReport {
    /// Which write.
    pub kind: WriteKind,
    /// The key written.
    pub key: String,
    /// When the call was made, ms after "go".
    pub sent_ms: f64,
    /// When it returned.
    pub done_ms: f64,
    /// Loads of the key that started from the write on (less 5 ms: the
    /// workers' clocks are placed on the parent's to the millisecond), in
    /// any process.
    pub loads_after: u64,
    /// When the first of them ended (its value stored right after), ms
    /// after "go".
    pub refreshed_ms: Option<f64>,
    /// Calls of the key started from the write until `refreshed_ms`.
    pub transition_calls: u64,
    /// Their outcomes, by name.
    pub transition_outcomes: BTreeMap<String, u64>,
    /// Their p99 latency, ms.
    pub transition_p99_ms: f64,
    /// The slowest of them, ms.
    pub transition_max_ms: f64,
    /// The p99 latency of the run's hits (every key) outside the
    /// transition, ms.
    pub hit_p99_ms: f64,
    /// Transition calls slower than `hit_p99_ms`.
    pub transition_slower_than_hit_p99: u64,
}

impl WriteReport {
    /// Works out the section from the run's calls and loads (every key's;
    /// `key` is the written key's index).
    pub fn analyse(
        written: &Written,
        key: usize,
        calls: &[CallRecord],
        loads: &[LoadRecord],
    ) -> Self {
        let from = written.sent_ms - CLOCK_SLACK_MS;
        let mut after: Vec<&LoadRecord> = loads
            .iter()
            .filter(|l| l.key == key && l.started_ms >= from)
            .collect();
        after.sort_by(|a, b| a.started_ms.total_cmp(&b.started_ms));
        let refreshed_ms = after.first().and_then(|l| l.ended_ms);
        let in_transition = |c: &CallRecord| {
            c.key == key
                && c.started_ms >= from
                && refreshed_ms.is_some_and(|end| c.started_ms <= end)
        };
        let mut hits: Vec<f64> = calls
            .iter()
            .filter(|c| c.outcome == HIT && !in_transition(c))
            .map(|c| c.latency_ms)
            .collect();
        hits.sort_by(f64::total_cmp);
        let hit_p99_ms = nearest_rank(&hits, 99.0);
        let transition: Vec<&CallRecord> = calls.iter().filter(|c| in_transition(c)).collect();
        let mut transition_latencies: Vec<f64> = transition.iter().map(|c| c.latency_ms).collect();
        transition_latencies.sort_by(f64::total_cmp);
        let mut transition_outcomes = BTreeMap::new();
        for c in &transition {
            let name = OUTCOME_NAMES
                .get(c.outcome as usize)
                .copied()
                .unwrap_or("other");
            *transition_outcomes.entry(name.to_owned()).or_insert(0) += 1;
        }
        WriteReport {
            kind: written.kind,
            key: written.key.clone(),
            sent_ms: written.sent_ms,
            done_ms: written.done_ms,
            loads_after: after.len() as u64,
            refreshed_ms,
            transition_calls: transition.len() as u64,
            transition_outcomes,
            transition_p99_ms: nearest_rank(&transition_latencies, 99.0),
            transition_max_ms: transition.iter().map(|c| c.latency_ms).fold(0.0, f64::max),
            hit_p99_ms,
            transition_slower_than_hit_p99: transition
                .iter()
                .filter(|c| c.latency_ms > hit_p99_ms)
                .count() as u64,
        }
    }

    /// The section in one line.
    pub fn to_text(&self) -> String {
        let outcomes: Vec<String> = self
            .transition_outcomes
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        let refreshed = self
            .refreshed_ms
            .map_or_else(|| "never".to_owned(), |ms| format!("at {ms:.1} ms"));
        format!(
            "{:?} of {} at {:.1} ms (returned at {:.1} ms): {} loads of it after, the first ended \
             {refreshed}; meanwhile {} calls of it ({}), p99 {:.2} ms, max {:.2} ms, {} slower \
             than the hits' p99 ({:.2} ms)",
            self.kind,
            self.key,
            self.sent_ms,
            self.done_ms,
            self.loads_after,
            self.transition_calls,
            outcomes.join(", "),
            self.transition_p99_ms,
            self.transition_max_ms,
            self.transition_slower_than_hit_p99,
            self.hit_p99_ms,
        )
    }
}

/// How far a worker's times may be from the parent's: each worker logs
/// whole milliseconds from its own "go", placed on the parent's clock by
/// the wall-clock millisecond it went. A load the write caused can look a
/// millisecond or two older than the write.
const CLOCK_SLACK_MS: f64 = 5.0;

/// The call log's code of a hit.
const HIT: u64 = 1;

/// The `p`-th percentile of `sorted` by nearest rank (0 for none).
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(started_ms: f64, key: usize, outcome: u64, latency_ms: f64) -> CallRecord {
        CallRecord {
            started_ms,
            key,
            outcome,
            latency_ms,
            age_ms: 0,
        }
    }

    #[test]
    fn the_transition_runs_from_the_write_to_the_end_of_the_first_load_after_it() {
        let written = Written {
            kind: WriteKind::Invalidate,
            key: "hot".to_owned(),
            sent_ms: 1_000.0,
            done_ms: 1_001.0,
        };
        let loads = [
            LoadRecord {
                started_ms: 0.0,
                key: 0,
                ended_ms: Some(200.0),
            },
            // Caused by the write, but logged a millisecond before it.
            LoadRecord {
                started_ms: 999.0,
                key: 0,
                ended_ms: Some(1_202.0),
            },
            // Another key's: not this write's.
            LoadRecord {
                started_ms: 1_100.0,
                key: 1,
                ended_ms: Some(1_300.0),
            },
        ];
        let mut calls: Vec<CallRecord> = (0..100)
            .map(|i| call(i as f64 * 5.0, 0, HIT, 0.5))
            .collect();
        calls.push(call(500.0, 0, HIT, 2.0));
        calls.push(call(1_001.0, 0, 3, 201.0));
        calls.push(call(1_100.0, 0, 4, 102.0));
        calls.push(call(1_150.0, 1, 3, 150.0));
        calls.push(call(1_300.0, 0, HIT, 0.4));
        let report = WriteReport::analyse(&written, 0, &calls, &loads);
        assert_eq!(report.loads_after, 1);
        assert_eq!(report.refreshed_ms, Some(1_202.0));
        assert_eq!(report.transition_calls, 2);
        assert_eq!(report.transition_max_ms, 201.0);
        assert_eq!(report.transition_p99_ms, 201.0);
        assert_eq!(report.hit_p99_ms, 0.5);
        assert_eq!(report.transition_slower_than_hit_p99, 2);
        assert_eq!(report.transition_outcomes["loaded"], 1);
        assert_eq!(report.transition_outcomes["waited"], 1);
        assert!(
            report.to_text().contains("1 loads of it after"),
            "{}",
            report.to_text()
        );
    }
}
