//! The data of the HTML report's charts, worked out from the merged calls
//! and loads by pure functions: the time axis and its buckets, answers per
//! bucket by outcome, p50 and p99 latency per bucket, and loads per key
//! over time.
//!
//! A call is placed at its answer time (start + latency), the moment its
//! caller was answered: a herd's calls all start at once, and what differs
//! is when each is answered.

use std::time::Duration;

use crate::commands::fleet::fault::records::{CallRecord, LoadRecord};
use crate::commands::fleet::outcome::OUTCOME_NAMES;
use crate::shared::percentile::percentile;

/// About this many buckets span the axis.
const TARGET_BUCKETS: f64 = 100.0;
/// The most keys drawn one by one in the loads chart; more are summed.
pub const MAX_KEY_LINES: usize = 8;

/// The time axis of every chart: from "go" to a little past the last
/// thing that happened, cut in buckets of a round width.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Axis {
    /// The end of the axis, ms after "go".
    pub end_ms: f64,
    /// The width of one bucket, ms.
    pub bucket_ms: f64,
}

impl Axis {
    /// The axis that shows every answer, every load and `window`.
    pub fn of(calls: &[CallRecord], loads: &[LoadRecord], window: Option<[f64; 2]>) -> Axis {
        let last = calls
            .iter()
            .map(answer_ms)
            .chain(loads.iter().map(|l| l.ended_ms.unwrap_or(l.started_ms)))
            .chain(window.map(|w| w[1]))
            .fold(1.0, f64::max);
        let end_ms = last * 1.02;
        Axis {
            end_ms,
            bucket_ms: round_width(end_ms / TARGET_BUCKETS),
        }
    }

    /// How many buckets cover the axis.
    pub fn buckets(&self) -> usize {
        (self.end_ms / self.bucket_ms).ceil().max(1.0) as usize
    }

    /// The bucket of `t_ms` (clamped onto the axis).
    fn bucket(&self, t_ms: f64) -> usize {
        ((t_ms.max(0.0) / self.bucket_ms) as usize).min(self.buckets() - 1)
    }
}

/// The smallest 1, 2 or 5 × 10ⁿ ms at least `ms` (at least 1 ms).
pub fn round_width(ms: f64) -> f64 {
    let mut width = 1.0;
    loop {
        for step in [1.0, 2.0, 5.0] {
            if width * step >= ms {
                return width * step;
            }
        }
        width *= 10.0;
    }
}

/// When a call was answered, ms after "go".
pub fn answer_ms(c: &CallRecord) -> f64 {
    c.started_ms + c.latency_ms
}

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its legend.
    pub name: String,
    /// Its points, in time order.
    pub points: Vec<(f64, f64)>,
}

/// Counts per bucket as a staircase: each bucket flat over its width.
fn steps(axis: &Axis, counts: &[u64]) -> Vec<(f64, f64)> {
    counts
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| {
            let from = i as f64 * axis.bucket_ms;
            [(from, n as f64), (from + axis.bucket_ms, n as f64)]
        })
        .collect()
}

/// Answers per bucket, one series per outcome that occurred (in the order
/// of the outcome codes).
pub fn answers_by_outcome(calls: &[CallRecord], axis: &Axis) -> Vec<Series> {
    let mut counts = vec![vec![0u64; axis.buckets()]; OUTCOME_NAMES.len()];
    for c in calls {
        let outcome = (c.outcome as usize).min(OUTCOME_NAMES.len() - 1);
        counts[outcome][axis.bucket(answer_ms(c))] += 1;
    }
    counts
        .iter()
        .enumerate()
        .filter(|(_, per_bucket)| per_bucket.iter().any(|&n| n > 0))
        .map(|(outcome, per_bucket)| Series {
            name: OUTCOME_NAMES[outcome].to_owned(),
            points: steps(axis, per_bucket),
        })
        .collect()
}

/// The p50 and p99 latency (ms) of the calls answered in each bucket, at
/// the bucket's middle; buckets without answers have no point.
pub fn latency_percentiles(calls: &[CallRecord], axis: &Axis) -> [Series; 2] {
    let mut per_bucket: Vec<Vec<Duration>> = vec![Vec::new(); axis.buckets()];
    for c in calls {
        per_bucket[axis.bucket(answer_ms(c))]
            .push(Duration::from_secs_f64(c.latency_ms.max(0.0) / 1000.0));
    }
    let mut p50 = Vec::new();
    let mut p99 = Vec::new();
    for (i, latencies) in per_bucket.iter_mut().enumerate() {
        latencies.sort_unstable();
        let middle = (i as f64 + 0.5) * axis.bucket_ms;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        if let (Some(a), Some(b)) = (percentile(latencies, 50.0), percentile(latencies, 99.0)) {
            p50.push((middle, ms(a)));
            p99.push((middle, ms(b)));
        }
    }
    [
        Series {
            name: "p50".to_owned(),
            points: p50,
        },
        Series {
            name: "p99".to_owned(),
            points: p99,
        },
    ]
}

/// Loads started so far, per key, as a staircase from 0 to the end of the
/// axis: the [`MAX_KEY_LINES`] keys with the most loads one by one, and
/// with more keys than that a line of all of them.
pub fn loads_per_key(loads: &[LoadRecord], key_names: &[String], axis: &Axis) -> Vec<Series> {
    let mut starts: Vec<Vec<f64>> = vec![Vec::new(); key_names.len()];
    for l in loads {
        if let Some(s) = starts.get_mut(l.key) {
            s.push(l.started_ms);
        }
    }
    let cumulative = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        let mut points = vec![(0.0, 0.0)];
        for (n, t) in times.iter().enumerate() {
            points.push((*t, n as f64));
            points.push((*t, (n + 1) as f64));
        }
        points.push((axis.end_ms, times.len() as f64));
        points
    };
    let mut order: Vec<usize> = (0..key_names.len())
        .filter(|&k| !starts[k].is_empty())
        .collect();
    order.sort_by_key(|&k| std::cmp::Reverse(starts[k].len()));
    let mut series: Vec<Series> = order
        .iter()
        .take(MAX_KEY_LINES)
        .map(|&k| Series {
            name: key_names[k].clone(),
            points: cumulative(starts[k].clone()),
        })
        .collect();
    if order.len() > MAX_KEY_LINES {
        series.push(Series {
            name: format!("all {} keys", key_names.len()),
            points: cumulative(starts.concat()),
        });
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(started_ms: f64, outcome: u64, latency_ms: f64) -> CallRecord {
        CallRecord {
            started_ms,
            key: 0,
            outcome,
            latency_ms,
            age_ms: 0,
        }
    }

    fn load(key: usize, started_ms: f64) -> LoadRecord {
        LoadRecord {
            started_ms,
            key,
            ended_ms: Some(started_ms + 100.0),
        }
    }

    #[test]
    fn bucket_widths_are_round() {
        assert_eq!(round_width(0.2), 1.0);
        assert_eq!(round_width(1.5), 2.0);
        assert_eq!(round_width(30.0), 50.0);
        assert_eq!(round_width(50.0), 50.0);
        assert_eq!(round_width(51.0), 100.0);
    }

    #[test]
    fn the_axis_reaches_past_the_last_answer_load_and_window() {
        let calls = [call(0.0, 1, 1_000.0)];
        let axis = Axis::of(&calls, &[], None);
        assert!((axis.end_ms - 1_020.0).abs() < 1e-9);
        assert_eq!(axis.bucket_ms, 20.0);
        assert_eq!(axis.buckets(), 51);
        let axis = Axis::of(&calls, &[load(0, 4_000.0)], None);
        assert!((axis.end_ms - 4_100.0 * 1.02).abs() < 1e-9);
        let axis = Axis::of(&calls, &[], Some([500.0, 9_000.0]));
        assert!((axis.end_ms - 9_180.0).abs() < 1e-9);
        assert_eq!(
            Axis::of(&[], &[], None).buckets(),
            2,
            "1.02 ms in 1 ms buckets"
        );
    }

    #[test]
    fn answers_are_counted_by_outcome_where_they_were_answered() {
        let calls = [
            call(0.0, 3, 200.0),
            call(0.0, 4, 201.0),
            call(0.0, 4, 210.0),
            call(900.0, 1, 1.0),
        ];
        let axis = Axis {
            end_ms: 1_000.0,
            bucket_ms: 100.0,
        };
        let series = answers_by_outcome(&calls, &axis);
        let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["hit", "loaded", "waited"]);
        let waited = &series[2].points;
        assert_eq!(waited.len(), 20, "two points per bucket");
        assert_eq!(waited[4], (200.0, 2.0));
        assert_eq!(waited[5], (300.0, 2.0));
        assert_eq!(waited[0], (0.0, 0.0));
        assert_eq!(series[0].points[18], (900.0, 1.0));
        let total: f64 = series
            .iter()
            .flat_map(|s| s.points.iter().step_by(2))
            .map(|p| p.1)
            .sum();
        assert_eq!(total, 4.0, "every call once");
    }

    #[test]
    fn latency_percentiles_per_bucket_skip_empty_buckets() {
        let mut calls: Vec<CallRecord> = (1..=100).map(|i| call(0.0, 1, i as f64)).collect();
        calls.push(call(500.0, 3, 10.0));
        let axis = Axis {
            end_ms: 1_000.0,
            bucket_ms: 200.0,
        };
        let [p50, p99] = latency_percentiles(&calls, &axis);
        assert_eq!(p50.points, [(100.0, 50.0), (500.0, 10.0)]);
        assert_eq!(p99.points, [(100.0, 99.0), (500.0, 10.0)]);
    }

    #[test]
    fn loads_per_key_climb_at_each_start_and_many_keys_are_summed() {
        let names: Vec<String> = (0..10).map(|i| format!("key-{i}")).collect();
        let axis = Axis {
            end_ms: 5_000.0,
            bucket_ms: 50.0,
        };
        let series = loads_per_key(&[load(2, 3_000.0), load(2, 10.0)], &names, &axis);
        assert_eq!(series.len(), 1, "keys without loads are not drawn");
        assert_eq!(series[0].name, "key-2");
        assert_eq!(
            series[0].points,
            [
                (0.0, 0.0),
                (10.0, 0.0),
                (10.0, 1.0),
                (3_000.0, 1.0),
                (3_000.0, 2.0),
                (5_000.0, 2.0)
            ]
        );
        let many: Vec<LoadRecord> = (0..10).map(|k| load(k, k as f64)).collect();
        let series = loads_per_key(&many, &names, &axis);
        assert_eq!(series.len(), MAX_KEY_LINES + 1);
        let all = series.last().expect("the sum");
        assert_eq!(all.name, "all 10 keys");
        assert_eq!(all.points.last(), Some(&(5_000.0, 10.0)));
    }
}
