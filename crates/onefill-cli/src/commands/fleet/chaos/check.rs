//! The chaos run's verdict: each key's history rebuilt from what the run
//! recorded, and every answer held against it. A pure function. (A little
//! over 600 lines with its unit tests, which build histories by hand: the
//! rules and the cases that pin them are read together.)
//!
//! # The history of a version
//!
//! A version is written once (a worker's fill, or the foreign client's
//! write) and, once the server stops holding it, never comes back. For
//! each version the check works out when it was **certainly written** by
//! (`written_by`: the earliest of the foreign write's framing read after
//! it, any observation of it, and the end of any call that answered it,
//! since a fill lands before its call answers and a read answers what was
//! stored), and from that when it had **certainly left** the server by
//! (`gone_by`), the earliest of:
//!
//! - any observation, after `written_by`, of the key holding something
//!   else (or nothing): the version was replaced, deleted or expired;
//! - an observation of the key holding it with a `PTTL` of `p` ms at `t`:
//!   `t + p`, unless a foreign `PEXPIRE` or `PERSIST` may have changed the
//!   TTL after `t` and before then;
//! - its write plus the longest TTL a write gets (`ttl + grace`), under
//!   the same condition.
//!
//! Only the foreign client changes a value's TTL without replacing it; a
//! TTL change whose reply was lost counts as possibly made anywhere
//! between its sending and a second after its failed answer.
//!
//! # A violation
//!
//! An answer whose call started more than the bound after its version was
//! certainly gone (`start − gone_by > bound + skew`), or an answer of a
//! version nobody wrote. Everything uncertain counts in the answer's
//! favour, so every violation reported is a real one. The lag of an
//! answer is `start − gone_by` (it can be negative: the version was still
//! held); the worst one is reported as measured.

use std::collections::{BTreeMap, HashMap};

use super::records::{Answer, ChaosWorkerReport, ForeignOp, Held, Observation, OpKind};
use super::report::{AnswerCounts, OpCounts, Violation};

/// What a TTL read from the server or a write is allowed on top: `PTTL`
/// rounds down to the millisecond, and `MIGRATE` re-creates a key with the
/// TTL it had when it was dumped (a transfer later).
const EXPIRY_SLACK_US: u64 = 5_000;

/// How long after its failed answer a lost TTL change may still have been
/// made.
const LOST_REPLY_US: u64 = 1_000_000;

/// An answer within this long after a foreign change of its key counts as
/// "soon after a change".
const SOON_US: u64 = 1_000_000;

/// The most violations reported in detail.
const SHOWN: usize = 10;

/// The check's settings.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long after its version left the server an answer may still
    /// start (µs).
    pub bound_us: u64,
    /// How far the workers' clocks may be from the server's (µs).
    pub skew_us: u64,
    /// The longest TTL a write gives a value (`ttl + grace`, ms).
    pub max_ttl_ms: u64,
}

/// What the check found.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub answers: AnswerCounts,
    pub ops: BTreeMap<String, OpCounts>,
    pub violations: u64,
    pub violations_by_outcome: BTreeMap<String, u64>,
    pub shown: Vec<Violation>,
    /// The worst `start − gone_by` over the answers of a version known to
    /// be gone (ms), and whether the L1 answered it.
    pub worst_lag_ms: Option<f64>,
    pub worst_lag_from_l1: bool,
    /// Answers that started after their version was gone, within the
    /// bound.
    pub late_answers: u64,
    pub loads: u64,
}

/// One version's history.
#[derive(Debug, Clone)]
struct Version {
    key: u32,
    /// Not written before this.
    written_after: u64,
    /// Certainly written by this (if it was written at all).
    written_by: Option<u64>,
}

/// One observation of a key, and whether its `PTTL` is the key's TTL from
/// then on (not for the read before an act: the act may change it).
struct Seen<'a> {
    obs: &'a Observation,
    op: usize,
    ttl_holds: bool,
}

/// A span in which a foreign TTL change was (or may have been) made.
struct TtlChange {
    from: u64,
    to: u64,
    op: usize,
}

/// Checks every answer of `workers` against the history that `ops` and
/// the workers' loads and answers make.
pub fn check(
    keys: usize,
    ops: &[ForeignOp],
    workers: &[ChaosWorkerReport],
    limits: Limits,
) -> Verdict {
    let skew = limits.skew_us;
    let mut verdict = Verdict::default();
    let mut versions: HashMap<&str, Version> = HashMap::new();
    let mut seen: Vec<Vec<Seen>> = (0..keys).map(|_| Vec::new()).collect();
    let mut ttl_changes: Vec<Vec<TtlChange>> = (0..keys).map(|_| Vec::new()).collect();
    // When each key was last changed by the foreign client, in order.
    let mut changes: Vec<Vec<u64>> = (0..keys).map(|_| Vec::new()).collect();

    for w in workers {
        for load in &w.loads {
            verdict.loads += 1;
            versions.insert(
                &load.version,
                Version {
                    key: load.key,
                    written_after: load.end.saturating_sub(skew),
                    written_by: None,
                },
            );
        }
    }
    for (i, op) in ops.iter().enumerate() {
        let k = op.key as usize;
        if k >= keys {
            continue;
        }
        let counts = verdict
            .ops
            .entry(kind_name(op.kind).to_owned())
            .or_default();
        counts.sent += 1;
        if op.error.is_some() {
            counts.failed += 1;
        } else if op.changed {
            counts.changed += 1;
        }
        match op.kind {
            OpKind::Set => {
                if let Some(v) = &op.version {
                    let written_by = match (&op.error, &op.after) {
                        (None, Some(after)) => Some(after.t),
                        (None, None) => Some(op.returned + skew),
                        (Some(_), _) => None,
                    };
                    versions.insert(
                        v,
                        Version {
                            key: op.key,
                            written_after: op
                                .before
                                .as_ref()
                                .map_or(op.sent.saturating_sub(skew), |b| b.t),
                            written_by,
                        },
                    );
                }
                for obs in op.before.iter().chain(op.after.iter()) {
                    seen[k].push(Seen {
                        obs,
                        op: i,
                        ttl_holds: true,
                    });
                }
                if op.error.is_none() {
                    if let Some(after) = &op.after {
                        changes[k].push(after.t);
                    }
                }
            }
            kind => {
                if let Some(before) = &op.before {
                    seen[k].push(Seen {
                        obs: before,
                        op: i,
                        ttl_holds: false,
                    });
                }
                if let Some(after) = &op.after {
                    seen[k].push(Seen {
                        obs: after,
                        op: i,
                        ttl_holds: true,
                    });
                    if op.changed && kind != OpKind::Persist {
                        changes[k].push(after.t);
                    }
                }
                if matches!(kind, OpKind::Pexpire | OpKind::Persist) {
                    match (&op.error, &op.after) {
                        (None, Some(after)) if op.changed => ttl_changes[k].push(TtlChange {
                            from: after.t,
                            to: after.t,
                            op: i,
                        }),
                        (None, _) => {}
                        (Some(_), _) => ttl_changes[k].push(TtlChange {
                            from: op.sent.saturating_sub(skew),
                            to: op.returned + skew + LOST_REPLY_US,
                            op: i,
                        }),
                    }
                }
            }
        }
    }
    for list in &mut changes {
        list.sort_unstable();
    }

    // Certainly written by: any observation of it, any answer of it (a
    // degraded load is never stored, so its answer says nothing).
    for list in &seen {
        for s in list {
            if let Held::Version(v) = &s.obs.held {
                if let Some(version) = versions.get_mut(v.as_str()) {
                    version.written_by =
                        Some(version.written_by.map_or(s.obs.t, |w| w.min(s.obs.t)));
                }
            }
        }
    }
    for w in workers {
        for a in &w.answers {
            if a.outcome == "degraded" || a.outcome == "error" {
                continue;
            }
            if let Some(version) = a.version.as_deref().and_then(|v| versions.get_mut(v)) {
                let by = a.end + skew;
                version.written_by = Some(version.written_by.map_or(by, |w| w.min(by)));
            }
        }
    }

    // Certainly gone by.
    let gone_by: HashMap<&str, u64> = versions
        .iter()
        .filter_map(|(id, v)| gone_by(id, v, &seen, &ttl_changes, limits).map(|g| (*id, g)))
        .collect();

    for w in workers {
        for a in &w.answers {
            count(&mut verdict.answers, a);
            if a.outcome == "error" {
                continue;
            }
            let key = a.key as usize;
            if changes.get(key).is_some_and(|c| soon_after(c, a.start)) {
                verdict.answers.soon_after_change += 1;
                if a.l1 {
                    verdict.answers.l1_soon_after_change += 1;
                }
            }
            let Some(id) = a.version.as_deref() else {
                violate(
                    &mut verdict,
                    a,
                    w.pid,
                    None,
                    "the answer carries no version".to_owned(),
                );
                continue;
            };
            let Some(version) = versions.get(id) else {
                violate(
                    &mut verdict,
                    a,
                    w.pid,
                    None,
                    format!("version {id} was never written"),
                );
                continue;
            };
            if version.key != a.key {
                violate(
                    &mut verdict,
                    a,
                    w.pid,
                    None,
                    format!("version {id} belongs to another key"),
                );
                continue;
            }
            let Some(&gone) = gone_by.get(id) else {
                continue;
            };
            verdict.answers.bounded += 1;
            if a.l1 {
                verdict.answers.l1_bounded += 1;
            }
            let lag_ms = (a.start as f64 - gone as f64) / 1000.0;
            if verdict.worst_lag_ms.is_none_or(|worst| lag_ms > worst) {
                verdict.worst_lag_ms = Some(lag_ms);
                verdict.worst_lag_from_l1 = a.l1;
            }
            if a.start > gone {
                if a.start - gone > limits.bound_us + skew {
                    violate(
                        &mut verdict,
                        a,
                        w.pid,
                        Some(lag_ms),
                        format!("version {id} had left the server {lag_ms:.1} ms before the call"),
                    );
                } else {
                    verdict.late_answers += 1;
                }
            }
        }
    }
    verdict
}

/// When version `id` had certainly left the server, if it certainly did.
fn gone_by(
    id: &str,
    v: &Version,
    seen: &[Vec<Seen>],
    ttl_changes: &[Vec<TtlChange>],
    limits: Limits,
) -> Option<u64> {
    let k = v.key as usize;
    let (seen, changes) = (seen.get(k)?, ttl_changes.get(k)?);
    // No TTL change (other than `own`'s) in (from, to].
    let ttl_kept = |from: u64, to: u64, own: Option<usize>| {
        !changes
            .iter()
            .any(|c| Some(c.op) != own && c.from <= to && c.to > from)
    };
    let mut gone: Option<u64> = None;
    let mut earlier = |t: u64| gone = Some(gone.map_or(t, |g| g.min(t)));
    for s in seen {
        let is_it = matches!(&s.obs.held, Held::Version(x) if x == id);
        if !is_it {
            if v.written_by.is_some_and(|w| s.obs.t > w) {
                earlier(s.obs.t);
            }
        } else if s.ttl_holds && s.obs.pttl_ms >= 0 {
            let end = s.obs.t + s.obs.pttl_ms as u64 * 1000 + EXPIRY_SLACK_US;
            if ttl_kept(s.obs.t, end, Some(s.op)) {
                earlier(end);
            }
        }
    }
    if let Some(w) = v.written_by {
        let end = w + limits.max_ttl_ms * 1000 + EXPIRY_SLACK_US;
        if ttl_kept(v.written_after, end, None) {
            earlier(end);
        }
    }
    gone
}

/// Whether a foreign change of the key (`changes`, sorted) came within
/// [`SOON_US`] before `start`.
fn soon_after(changes: &[u64], start: u64) -> bool {
    let i = changes.partition_point(|&t| t < start);
    i > 0 && start - changes[i - 1] <= SOON_US
}

fn count(counts: &mut AnswerCounts, a: &Answer) {
    counts.total += 1;
    *counts.by_outcome.entry(a.outcome.clone()).or_default() += 1;
    if a.l1 {
        counts.from_l1 += 1;
    }
}

fn violate(verdict: &mut Verdict, a: &Answer, pid: u32, lag_ms: Option<f64>, why: String) {
    verdict.violations += 1;
    *verdict
        .violations_by_outcome
        .entry(a.outcome.clone())
        .or_default() += 1;
    if verdict.shown.len() < SHOWN {
        verdict.shown.push(Violation {
            pid,
            key: a.key,
            version: a.version.clone(),
            outcome: a.outcome.clone(),
            from_l1: a.l1,
            start_us: a.start,
            end_us: a.end,
            lag_ms,
            at_ms: 0.0,
            why,
        });
    }
}

/// The report's name of an operation.
pub fn kind_name(kind: OpKind) -> &'static str {
    match kind {
        OpKind::Set => "set",
        OpKind::Del => "del",
        OpKind::Pexpire => "pexpire",
        OpKind::Persist => "persist",
        OpKind::Unreadable => "unreadable_set",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::fleet::chaos::records::Load;

    const MS: u64 = 1_000;
    const LIMITS: Limits = Limits {
        bound_us: 250 * MS,
        skew_us: 0,
        max_ttl_ms: 60_000,
    };

    fn version(id: &str) -> Held {
        Held::Version(id.to_owned())
    }

    fn obs(t_ms: u64, held: Held, pttl_ms: i64) -> Observation {
        Observation {
            t: t_ms * MS,
            held,
            pttl_ms,
        }
    }

    /// A raw act at `t_ms`: the key held `before`, then `after`.
    fn act(kind: OpKind, t_ms: u64, before: (Held, i64), after: (Held, i64)) -> ForeignOp {
        ForeignOp {
            key: 0,
            kind,
            sent: t_ms * MS - 100,
            returned: t_ms * MS + 100,
            before: Some(obs(t_ms, before.0, before.1)),
            after: Some(obs(t_ms, after.0, after.1)),
            changed: true,
            ttl_ms: None,
            version: None,
            error: None,
        }
    }

    fn answer(start_ms: u64, id: &str, outcome: &str, l1: bool) -> Answer {
        Answer {
            key: 0,
            start: start_ms * MS,
            end: start_ms * MS + 200,
            outcome: outcome.to_owned(),
            l1,
            version: Some(id.to_owned()),
        }
    }

    /// One worker that loaded `w1.1` at 100 ms and answered `answers`.
    fn worker(answers: Vec<Answer>) -> ChaosWorkerReport {
        ChaosWorkerReport {
            pid: 1,
            answers,
            loads: vec![Load {
                key: 0,
                version: "w1.1".to_owned(),
                start: 95 * MS,
                end: 100 * MS,
            }],
            ..Default::default()
        }
    }

    fn run(ops: &[ForeignOp], answers: Vec<Answer>) -> Verdict {
        check(1, ops, &[worker(answers)], LIMITS)
    }

    #[test]
    fn an_answer_after_a_delete_is_late_within_the_bound_and_a_violation_beyond() {
        let del = act(
            OpKind::Del,
            1_000,
            (version("w1.1"), 50_000),
            (Held::Absent, -2),
        );
        let v = run(
            std::slice::from_ref(&del),
            vec![
                answer(101, "w1.1", "loaded", false),
                answer(500, "w1.1", "hit", true),
                answer(1_100, "w1.1", "hit", true),
                answer(1_300, "w1.1", "hit", true),
            ],
        );
        assert_eq!(v.violations, 1, "{:?}", v.shown);
        assert_eq!(v.late_answers, 1);
        assert_eq!(v.shown[0].start_us, 1_300 * MS);
        assert!(v.shown[0].from_l1);
        assert_eq!(v.worst_lag_ms, Some(300.0));
        assert_eq!(v.answers.soon_after_change, 2);
        assert_eq!(v.answers.l1_bounded, 3);
    }

    #[test]
    fn a_delete_before_the_version_was_certainly_written_proves_nothing() {
        // The load ended at 100 ms, its first answer at 400 ms: a DEL at
        // 300 ms may have come before the fill.
        let del = act(OpKind::Del, 300, (Held::Absent, -2), (Held::Absent, -2));
        let v = run(
            &[del],
            vec![
                answer(399, "w1.1", "loaded", false),
                answer(5_000, "w1.1", "hit", true),
            ],
        );
        assert_eq!(v.violations, 0);
        // Only the written TTL (60 s) ends it.
        assert_eq!(v.worst_lag_ms, Some(5_000.0 - 60_399.2 - 5.0));
    }

    #[test]
    fn a_shortened_ttl_ends_the_version_unless_it_may_have_changed_again() {
        let pexpire = act(
            OpKind::Pexpire,
            1_000,
            (version("w1.1"), 50_000),
            (version("w1.1"), 100),
        );
        let late = vec![
            answer(200, "w1.1", "loaded", false),
            answer(1_400, "w1.1", "hit", true),
        ];
        let v = run(std::slice::from_ref(&pexpire), late.clone());
        assert_eq!(v.violations, 1, "expired at 1,100 ms (+ slack)");
        // A PERSIST whose answer was lost, at about 1,050 ms: the key may
        // have been kept.
        let mut lost = act(
            OpKind::Persist,
            1_050,
            (Held::Absent, -2),
            (Held::Absent, -2),
        );
        lost.before = None;
        lost.after = None;
        lost.error = Some("timeout".to_owned());
        let v = run(&[pexpire.clone(), lost], late.clone());
        assert_eq!(v.violations, 0);
        // One that answered, and persisted it: no end known.
        let persist = act(
            OpKind::Persist,
            1_050,
            (version("w1.1"), 50),
            (version("w1.1"), -1),
        );
        let v = run(&[pexpire, persist], late);
        assert_eq!(v.violations, 0);
        assert_eq!(v.worst_lag_ms, None);
    }

    #[test]
    fn the_written_ttl_ends_a_version_nobody_changed() {
        let limits = Limits {
            max_ttl_ms: 1_000,
            ..LIMITS
        };
        let answers = vec![
            answer(100, "w1.1", "loaded", false),
            answer(1_200, "w1.1", "hit", true),
            answer(1_500, "w1.1", "hit", true),
        ];
        let v = check(1, &[], &[worker(answers)], limits);
        assert_eq!(v.violations, 1, "{:?}", v.shown);
        assert_eq!(v.late_answers, 1);
    }

    #[test]
    fn a_version_nobody_wrote_is_a_violation_and_a_degraded_load_is_not() {
        let v = run(
            &[],
            vec![
                answer(100, "w9.9", "hit", true),
                answer(100, "w1.1", "degraded", false),
            ],
        );
        assert_eq!(v.violations, 1);
        assert!(v.shown[0].why.contains("never written"), "{:?}", v.shown);
    }

    #[test]
    fn a_foreign_write_replaces_the_version_from_its_framing_read() {
        let set = ForeignOp {
            key: 0,
            kind: OpKind::Set,
            sent: 999 * MS,
            returned: 1_003 * MS,
            before: Some(obs(1_000, version("w1.1"), 50_000)),
            after: Some(obs(1_002, version("f1"), 60_000)),
            changed: true,
            ttl_ms: None,
            version: Some("f1".to_owned()),
            error: None,
        };
        let v = run(
            &[set],
            vec![
                answer(101, "w1.1", "loaded", false),
                answer(1_100, "f1", "hit", true),
                answer(1_400, "w1.1", "hit", true),
            ],
        );
        assert_eq!(v.violations, 1, "{:?}", v.shown);
        assert_eq!(v.shown[0].version.as_deref(), Some("w1.1"));
        assert_eq!(v.ops["set"].changed, 1);
    }
}
