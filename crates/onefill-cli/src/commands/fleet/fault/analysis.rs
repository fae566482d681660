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
use super::report::{
    AbnormalKinds, AnswerFigures, FaultReport, HealthyFigures, LostWrites, VictimFigures,
};
use crate::commands::fleet::outcome::{DEGRADED, ERROR, STALE};
use crate::shared::percentile::percentile;

/// The victim's outage window ends this long after the promotion: the
/// recovery a caller may see.
pub const RECOVERY_MS: f64 = 1_500.0;
/// The width of one bucket of the abnormal-call timelines, ms.
pub const TIMELINE_MS: f64 = 500.0;
/// A load that ended this long before the fault had its fill acknowledged
/// by the old primary: a fill on a healthy primary takes a millisecond or
/// two; 20 leaves room for a busy machine.
pub const FILL_MARGIN_MS: f64 = 20.0;
/// An early refresh starts within about `1.2 × β × load` of expiry (β = 1
/// by default, the load time as measured): 10 load times early is out of
/// its reach, so a reload that early is not a refresh.
pub const EARLY_LOADS: f64 = 10.0;
/// The library's default TTL jitter: a TTL written is up to 10 % shorter
/// than `--ttl-ms` (the fleet does not change it).
pub const TTL_JITTER: f64 = 0.1;

/// The acknowledged writes a promotion lost, as the victim's loads show
/// them (see [`LostWrites`]); the value check comes from the injector.
pub fn lost_writes(
    injected: &Injected,
    shape: RunShape,
    victim_key: &dyn Fn(usize) -> bool,
    loads: &[LoadRecord],
) -> LostWrites {
    let reload_window_ms =
        (1.0 - TTL_JITTER) * shape.ttl_ms as f64 - EARLY_LOADS * shape.load_ms as f64;
    let mut lost = LostWrites {
        reload_window_ms: reload_window_ms.max(0.0),
        values: injected.values.clone(),
        ..LostWrites::default()
    };
    let Some(promoted) = injected.promoted_at_ms else {
        return lost;
    };
    let fault = injected.fault_at_ms;
    let keys = loads.iter().map(|l| l.key).max().map_or(0, |k| k + 1);
    for key in (0..keys).filter(|&k| victim_key(k)) {
        let of_key = || loads.iter().filter(move |l| l.key == key);
        // Two holders: a load after the promotion while one that started
        // before the fault (its lease granted by the healthy old primary)
        // still ran.
        for later in of_key().filter(|l| l.started_ms >= promoted) {
            lost.two_holders += of_key()
                .filter(|l| l.started_ms < fault)
                .filter(|l| l.ended_ms.is_some_and(|end| end > later.started_ms))
                .count() as u64;
        }
        // A premature reload: the key's first load after the promotion,
        // although the value its last load before the fault stored should
        // still have lived.
        let stored = of_key()
            .filter_map(|l| l.ended_ms)
            .filter(|&end| end <= fault - FILL_MARGIN_MS)
            .fold(None, |last: Option<f64>, end| {
                Some(last.map_or(end, |l| l.max(end)))
            });
        let first_after = of_key()
            .map(|l| l.started_ms)
            .filter(|&start| start >= promoted)
            .fold(None, |first: Option<f64>, s| {
                Some(first.map_or(s, |f| f.min(s)))
            });
        if let (Some(end), Some(start)) = (stored, first_after) {
            if start < end + reload_window_ms {
                lost.premature_reloads += 1;
                lost.premature_keys.push(key);
            }
        }
    }
    lost
}

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
    let settled = injected.promoted_at_ms.map(|p| {
        calls
            .iter()
            .filter(|c| victim_key(c.key) && c.started_ms + c.latency_ms >= p && abnormal(c))
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
    let lost = lost_writes(injected, shape, &victim_key, loads);
    let victim_loads: Vec<&LoadRecord> = loads.iter().filter(|l| victim_key(l.key)).collect();
    let inside = victim_loads
        .iter()
        .filter(|l| (from..=until).contains(&l.started_ms))
        .count() as u64;
    let outside: Vec<&LoadRecord> = victim_loads
        .iter()
        .copied()
        .filter(|l| !(from..=until).contains(&l.started_ms))
        .collect();
    let extra = outside
        .iter()
        .filter(|l| {
            outside.iter().any(|p| {
                p.key == l.key
                    && (p.started_ms, p.ended_ms) < (l.started_ms, l.ended_ms)
                    && p.ended_ms
                        .is_some_and(|end| end > l.started_ms - lost.reload_window_ms)
            })
        })
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
            settled_after_promotion_ms: settled,
            abnormal_after_promotion: after,
            loads: victim_loads.len() as u64,
            loads_outside_outage: victim_loads.len() as u64 - inside,
            ideal_loads_outside_outage: shape
                .ideal_loads(victim_count, (duration - (until - from)).max(0.0)),
            loads_inside_outage: inside,
            extra_loads_outside_outage: extra,
        },
        lost_writes: lost,
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
            values: None,
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
        assert_eq!(r.victim.settled_after_promotion_ms, Some(0.0));
    }

    #[test]
    fn a_call_running_across_the_promotion_counts_until_it_ends() {
        let mut calls = quiet_calls();
        // Waited on the replaced server from before the fault until 9.5 s.
        calls.push(call(4_000.0, 2, DEGRADED, 5_500.0, 0));
        // Ended before the promotion: not counted.
        calls.push(call(5_000.0, 3, DEGRADED, 1_000.0, 0));
        let r = analyse(&injected(Some(7_000.0)), &names(), shape(), &calls, &[]);
        assert_eq!(r.victim.recovered_after_promotion_ms, Some(0.0));
        assert_eq!(r.victim.settled_after_promotion_ms, Some(2_500.0));
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
        // The error that started before the promotion ran until 8 000.
        assert_eq!(r.victim.settled_after_promotion_ms, Some(1_100.0));
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
        // Every key loads every 1 050 ms from t = 0, for 50 ms.
        for k in 0..4 {
            for i in 0..10 {
                loads.push(LoadRecord {
                    started_ms: i as f64 * 1_050.0,
                    key: k,
                    ended_ms: Some(i as f64 * 1_050.0 + 50.0),
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
        assert_eq!(r.victim.extra_loads_outside_outage, 0, "one per ttl + load");
        // A second process loading each key 100 ms after the first: every
        // second load is extra.
        let mut twice = loads.clone();
        twice.extend(loads.iter().map(|l| LoadRecord {
            started_ms: l.started_ms + 100.0,
            ..*l
        }));
        let r2 = analyse(
            &injected(Some(7_000.0)),
            &names(),
            shape(),
            &quiet_calls(),
            &twice,
        );
        assert_eq!(r2.victim.loads_outside_outage, 24);
        assert_eq!(r2.victim.extra_loads_outside_outage, 12);
        let text = r.to_text();
        assert!(text.contains("fault Kill of 127.0.0.1:7000"), "{text}");
        assert!(
            text.contains("recovered 0 ms after the promotion"),
            "{text}"
        );
    }

    fn load(started_ms: f64, key: usize, ended_ms: f64) -> LoadRecord {
        LoadRecord {
            started_ms,
            key,
            ended_ms: Some(ended_ms),
        }
    }

    /// Fault at 5 s, promotion at 7 s; ttl 1 s, load 50 ms: a reload within
    /// 400 ms of a fill (0.9 × ttl − 10 × load) is premature.
    #[test]
    fn lost_writes_are_premature_reloads_and_overlapping_holders() {
        let loads = [
            // Key 2: filled at 4 900, gone at the promotion: reloaded at
            // 7 100, 2 200 ms later (a TTL of 1 s would be over by then:
            // not premature).
            load(4_850.0, 2, 4_900.0),
            load(7_100.0, 2, 7_150.0),
            // Key 3: a long load from 4 000 to 7 300, and another at 7 200:
            // two holders. Its fill (after the fault) is not checked.
            load(4_000.0, 3, 7_300.0),
            load(7_200.0, 3, 7_250.0),
        ];
        let lost = lost_writes(&injected(Some(7_000.0)), shape(), &|k| k >= 2, &loads);
        assert_eq!(lost.two_holders, 1);
        assert_eq!(lost.premature_reloads, 0);
        assert!((lost.reload_window_ms - 400.0).abs() < 1e-9);

        let long = RunShape {
            ttl_ms: 5_000,
            ..shape()
        };
        let lost = lost_writes(&injected(Some(7_000.0)), long, &|k| k >= 2, &loads);
        // Key 2's value (stored at 4 900, ttl 5 s, up to 10 % shorter)
        // should have lived to 9 400 at least; reloaded at 7 100 < 4 900 +
        // 4 000.
        assert_eq!(
            (lost.premature_reloads, lost.premature_keys.clone()),
            (1, vec![2])
        );
        // A fill ending 20 ms or less before the fault is not counted: it
        // may not have been acknowledged.
        let late = [load(4_950.0, 2, 4_990.0), load(7_100.0, 2, 7_150.0)];
        let lost = lost_writes(&injected(Some(7_000.0)), long, &|k| k >= 2, &late);
        assert_eq!(lost.premature_reloads, 0);
        // Healthy keys (0 and 1) are not the victim's: not counted.
        let healthy = [load(4_850.0, 0, 4_900.0), load(7_100.0, 0, 7_150.0)];
        let lost = lost_writes(&injected(Some(7_000.0)), long, &|k| k >= 2, &healthy);
        assert_eq!(lost.premature_reloads, 0);
        // Without a promotion nothing is lost to one.
        let lost = lost_writes(&injected(None), long, &|k| k >= 2, &loads);
        assert_eq!((lost.two_holders, lost.premature_reloads), (0, 0));
    }
}
