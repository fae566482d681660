//! What callers saw when one master of the cluster failed, worked out from
//! the workers' call and load logs by a pure function ([`analyse`]), apart
//! from any I/O.
//!
//! Calls are split in two classes: keys on healthy masters (which should
//! not notice anything) and the victim's keys (which should be back to
//! normal soon after a replica is promoted). A call is **abnormal** if it
//! failed, answered stale or degraded, answered a value older than the age
//! limit (`ttl + grace + 250 ms`: a value's TTL starts when it is stored,
//! which may be up to the backend timeout, 250 ms by default, after the
//! load that stamped it ends), or took longer than the slow limit
//! (`max(100 ms, 2 × load, p99 of the healthy keys' calls)`: normal
//! service is what the healthy keys get on the same machine in the same
//! run).

use std::time::Duration;

use super::kind::Injected;
use super::records::{CallRecord, LoadRecord, RunShape};
use super::report::{AbnormalKinds, AnswerFigures, FaultReport, HealthyFigures, VictimFigures};
use crate::commands::fleet::outcome::{DEGRADED, ERROR, STALE};
use crate::shared::percentile::percentile;

/// The victim's outage window ends this long after the promotion: the
/// recovery a caller may see.
pub const RECOVERY_MS: f64 = 1_500.0;
/// The width of one bucket of the abnormal-call timelines, ms.
pub const TIMELINE_MS: f64 = 500.0;

/// Works the `fault` section out of the injector's observation and the
/// merged call and load logs (on the parent's clock). `key_names` are the
/// run's keys.
pub fn analyse(
    injected: &Injected,
    key_names: &[String],
    shape: RunShape,
    calls: &[CallRecord],
    loads: &[LoadRecord],
) -> FaultReport {
    let mut is_victim = vec![false; shape.keys.max(key_names.len())];
    for &k in &injected.victim_keys {
        if let Some(v) = is_victim.get_mut(k) {
            *v = true;
        }
    }
    let victim_key = |k: usize| is_victim.get(k).copied().unwrap_or(false);
    let victim_count = is_victim.iter().filter(|v| **v).count();
    let healthy_count = is_victim.len() - victim_count;
    let age_limit = shape.age_limit_ms();
    let healthy_p99 = {
        let mut latencies: Vec<Duration> = calls
            .iter()
            .filter(|c| !victim_key(c.key))
            .map(|c| Duration::from_secs_f64(c.latency_ms.max(0.0) / 1000.0))
            .collect();
        latencies.sort_unstable();
        percentile(&latencies, 99.0).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    let slow_limit = shape.slow_limit_ms().max(healthy_p99);
    let abnormal = |c: &CallRecord| {
        c.outcome == ERROR
            || c.outcome == STALE
            || c.outcome == DEGRADED
            || c.age_ms > age_limit
            || c.latency_ms > slow_limit
    };
    let buckets = (shape.duration_ms as f64 / TIMELINE_MS).ceil() as usize + 1;
    let figures = |keys: usize, of_class: &dyn Fn(&CallRecord) -> bool| {
        let mut a = AnswerFigures {
            keys,
            abnormal_timeline: vec![0; buckets],
            ..Default::default()
        };
        let mut latencies = Vec::new();
        for c in calls.iter().filter(|c| of_class(c)) {
            a.calls += 1;
            a.errors += u64::from(c.outcome == ERROR);
            a.stale += u64::from(c.outcome == STALE);
            a.degraded += u64::from(c.outcome == DEGRADED);
            a.over_age_limit += u64::from(c.age_ms > age_limit);
            a.slow += u64::from(c.latency_ms > slow_limit);
            a.max_age_ms = a.max_age_ms.max(c.age_ms);
            if abnormal(c) {
                a.abnormal += 1;
                let bucket = (c.started_ms.max(0.0) / TIMELINE_MS) as usize;
                if bucket < buckets {
                    a.abnormal_timeline[bucket] += 1;
                }
                let end = c.started_ms + c.latency_ms;
                a.first_abnormal_ms = Some(
                    a.first_abnormal_ms
                        .map_or(c.started_ms, |f| f.min(c.started_ms)),
                );
                a.last_abnormal_end_ms = Some(a.last_abnormal_end_ms.map_or(end, |l| l.max(end)));
            }
            latencies.push(Duration::from_secs_f64(c.latency_ms.max(0.0) / 1000.0));
        }
        latencies.sort_unstable();
        let ms = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        a.p99_ms = ms(percentile(&latencies, 99.0));
        a.max_ms = ms(latencies.last().copied());
        a
    };
    let duration = shape.duration_ms as f64;
    let from = injected.fault_at_ms;
    let until = injected
        .promoted_at_ms
        .map_or(duration, |p| p + RECOVERY_MS)
        .min(duration)
        .max(from);
    let recovered = injected.promoted_at_ms.map(|p| {
        calls
            .iter()
            .filter(|c| victim_key(c.key) && c.started_ms >= p && abnormal(c))
            .map(|c| c.started_ms + c.latency_ms - p)
            .fold(0.0, f64::max)
    });
    let mut after = AbnormalKinds::default();
    if let Some(p) = injected.promoted_at_ms {
        for c in calls
            .iter()
            .filter(|c| victim_key(c.key) && c.started_ms >= p && abnormal(c))
        {
            after.calls += 1;
            after.errors += u64::from(c.outcome == ERROR);
            after.stale += u64::from(c.outcome == STALE);
            after.degraded += u64::from(c.outcome == DEGRADED);
            after.over_age_limit += u64::from(c.age_ms > age_limit);
            after.slow += u64::from(c.latency_ms > slow_limit);
        }
    }
    let victim_loads: Vec<&LoadRecord> = loads.iter().filter(|l| victim_key(l.key)).collect();
    let inside = victim_loads
        .iter()
        .filter(|l| (from..=until).contains(&l.started_ms))
        .count() as u64;
    FaultReport {
        kind: injected.kind,
        victim_address: injected.victim.clone(),
        victim_pid: injected.victim_pid,
        victim_keys: injected
            .victim_keys
            .iter()
            .filter_map(|&k| key_names.get(k).cloned())
            .collect(),
        promoted_to: injected.promoted_to.clone(),
        fault_at_ms: injected.fault_at_ms,
        promoted_at_ms: injected.promoted_at_ms,
        age_limit_ms: age_limit,
        slow_limit_ms: slow_limit,
        outage_window_ms: [from, until],
        healthy: HealthyFigures {
            answers: figures(healthy_count, &|c| !victim_key(c.key)),
            loads: loads.iter().filter(|l| !victim_key(l.key)).count() as u64,
            ideal_loads: shape.ideal_loads(healthy_count, duration),
        },
        victim: VictimFigures {
            answers: figures(victim_count, &|c| victim_key(c.key)),
            recovered_after_promotion_ms: recovered,
            abnormal_after_promotion: after,
            loads: victim_loads.len() as u64,
            loads_outside_outage: victim_loads.len() as u64 - inside,
            ideal_loads_outside_outage: shape
                .ideal_loads(victim_count, (duration - (until - from)).max(0.0)),
            loads_inside_outage: inside,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::fleet::fault::kind::FaultKind;

    const HIT: u64 = 1;
    const LOADED: u64 = 3;

    fn shape() -> RunShape {
        RunShape {
            keys: 4,
            duration_ms: 10_000,
            ttl_ms: 1_000,
            grace_ms: 0,
            load_ms: 50,
        }
    }

    /// Keys 0 and 1 on healthy masters, 2 and 3 on the victim; fault at
    /// 5 s, promotion at 7 s.
    fn injected(promoted_at_ms: Option<f64>) -> Injected {
        Injected {
            kind: FaultKind::Kill,
            victim: "127.0.0.1:7000".to_owned(),
            victim_pid: Some(42),
            victim_keys: vec![2, 3],
            fault_at_ms: 5_000.0,
            promoted_at_ms,
            promoted_to: promoted_at_ms.map(|_| "127.0.0.1:7003".to_owned()),
        }
    }

    fn names() -> Vec<String> {
        (0..4).map(|i| format!("key-{i}")).collect()
    }

    fn call(started_ms: f64, key: usize, outcome: u64, latency_ms: f64, age_ms: u64) -> CallRecord {
        CallRecord {
            started_ms,
            key,
            outcome,
            latency_ms,
            age_ms,
        }
    }

    /// One hit per key every 100 ms, 1 ms each, 500 ms old.
    fn quiet_calls() -> Vec<CallRecord> {
        (0..100)
            .flat_map(|i| (0..4).map(move |k| call(i as f64 * 100.0, k, HIT, 1.0, 500)))
            .collect()
    }

    #[test]
    fn a_quiet_run_is_all_normal() {
        let r = analyse(
            &injected(Some(7_000.0)),
            &names(),
            shape(),
            &quiet_calls(),
            &[],
        );
        assert_eq!(r.victim_keys, ["key-2", "key-3"]);
        assert_eq!(r.age_limit_ms, 1_250);
        assert_eq!(r.slow_limit_ms, 100.0);
        assert_eq!(r.outage_window_ms, [5_000.0, 8_500.0]);
        for a in [&r.healthy.answers, &r.victim.answers] {
            assert_eq!(a.keys, 2);
            assert_eq!(a.calls, 200);
            assert_eq!(a.abnormal, 0);
            assert_eq!(a.max_age_ms, 500);
            assert_eq!(a.first_abnormal_ms, None);
            assert!((a.p99_ms - 1.0).abs() < 1e-9);
        }
        assert_eq!(r.victim.recovered_after_promotion_ms, Some(0.0));
        // 2 keys × 10 s / 1.05 s.
        assert!((r.healthy.ideal_loads - 19.047).abs() < 0.01);
        // 2 keys × (10 − 3.5) s / 1.05 s.
        assert!((r.victim.ideal_loads_outside_outage - 12.38).abs() < 0.01);
    }

    #[test]
    fn each_kind_of_abnormal_answer_is_counted_in_its_class() {
        let mut calls = quiet_calls();
        calls.push(call(5_100.0, 0, STALE, 1.0, 900));
        calls.push(call(5_200.0, 1, DEGRADED, 60.0, 0));
        calls.push(call(5_300.0, 0, HIT, 1.0, 1_251));
        calls.push(call(5_400.0, 1, HIT, 100.5, 10));
        calls.push(call(5_500.0, 2, ERROR, 250.0, 0));
        let r = analyse(&injected(Some(7_000.0)), &names(), shape(), &calls, &[]);
        let h = &r.healthy.answers;
        assert_eq!((h.calls, h.errors, h.stale, h.degraded), (204, 0, 1, 1));
        assert_eq!((h.over_age_limit, h.slow, h.abnormal), (1, 1, 4));
        assert_eq!(h.max_age_ms, 1_251);
        assert_eq!(h.first_abnormal_ms, Some(5_100.0));
        assert_eq!(h.abnormal_timeline.len(), 21);
        assert_eq!(h.abnormal_timeline[10], 4, "5 000 to 5 500 ms");
        assert_eq!(h.abnormal_timeline.iter().sum::<u64>(), 4);
        assert_eq!(h.last_abnormal_end_ms, Some(5_500.5));
        assert!((h.max_ms - 100.5).abs() < 1e-9);
        let v = &r.victim.answers;
        assert_eq!((v.calls, v.errors, v.abnormal), (201, 1, 1));
        assert_eq!(
            r.victim.recovered_after_promotion_ms,
            Some(0.0),
            "an error before the promotion is not a slow recovery"
        );
    }

    #[test]
    fn recovery_is_the_end_of_the_last_abnormal_victim_call_after_the_promotion() {
        let mut calls = quiet_calls();
        calls.push(call(6_000.0, 2, ERROR, 2_000.0, 0)); // started before: ignored
        calls.push(call(7_100.0, 3, DEGRADED, 60.0, 0));
        calls.push(call(7_800.0, 2, LOADED, 300.0, 0)); // slow: ends at 8 100
        calls.push(call(7_900.0, 0, STALE, 1.0, 0)); // a healthy key: ignored
        let r = analyse(&injected(Some(7_000.0)), &names(), shape(), &calls, &[]);
        assert_eq!(r.victim.recovered_after_promotion_ms, Some(1_100.0));
        let after = &r.victim.abnormal_after_promotion;
        assert_eq!((after.calls, after.degraded, after.slow), (2, 1, 1));
        assert_eq!((after.errors, after.stale, after.over_age_limit), (0, 0, 0));
        assert_eq!(r.victim.answers.last_abnormal_end_ms, Some(8_100.0));
        assert_eq!(r.victim.answers.first_abnormal_ms, Some(6_000.0));
    }

    #[test]
    fn without_a_promotion_the_outage_lasts_to_the_end() {
        let loads = [
            LoadRecord {
                started_ms: 0.0,
                key: 2,
                ended_ms: None,
            },
            LoadRecord {
                started_ms: 4_999.0,
                key: 3,
                ended_ms: None,
            },
            LoadRecord {
                started_ms: 5_000.0,
                key: 2,
                ended_ms: None,
            },
            LoadRecord {
                started_ms: 9_999.0,
                key: 3,
                ended_ms: None,
            },
        ];
        let r = analyse(&injected(None), &names(), shape(), &quiet_calls(), &loads);
        assert_eq!(r.victim.recovered_after_promotion_ms, None);
        assert_eq!(r.outage_window_ms, [5_000.0, 10_000.0]);
        assert_eq!(r.victim.loads, 4);
        assert_eq!(r.victim.loads_outside_outage, 2);
        assert_eq!(r.victim.loads_inside_outage, 2);
        assert!((r.victim.ideal_loads_outside_outage - 2.0 * 5_000.0 / 1_050.0).abs() < 1e-9);
        assert_eq!(r.healthy.loads, 0);
    }

    #[test]
    fn loads_are_split_by_class_and_window() {
        let mut loads = Vec::new();
        // Every key loads every 1 050 ms from t = 0.
        for k in 0..4 {
            for i in 0..10 {
                loads.push(LoadRecord {
                    started_ms: i as f64 * 1_050.0,
                    key: k,
                    ended_ms: None,
                });
            }
        }
        let r = analyse(
            &injected(Some(7_000.0)),
            &names(),
            shape(),
            &quiet_calls(),
            &loads,
        );
        assert_eq!(r.healthy.loads, 20);
        assert_eq!(r.victim.loads, 20);
        // 5 250, 6 300, 7 350 and 8 400 lie in [5 000, 8 500]: 4 per key.
        assert_eq!(r.victim.loads_inside_outage, 8);
        assert_eq!(r.victim.loads_outside_outage, 12);
        let text = r.to_text();
        assert!(text.contains("fault Kill of 127.0.0.1:7000"), "{text}");
        assert!(
            text.contains("recovered 0 ms after the promotion"),
            "{text}"
        );
    }
}
