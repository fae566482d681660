//! Invariants 2, 4, 5 and 7: bounded callers, final writes, a breaker
//! never stuck, no answer older than its value's life.

use std::collections::HashMap;
use std::time::Duration;

use super::{CallInfo, Checker};
use onefill::Outcome;

use crate::events::{origin_of, Answer, CallKind, Change, LoadEnd, Origin};
use crate::scenario::TICK;

impl Checker<'_> {
    pub(super) fn check_bounds(&mut self) {
        let calls: Vec<_> = self.calls.iter().map(|(id, c)| (*id, c.clone())).collect();
        for (id, c) in calls {
            if c.dropped || self.is_dead(c.inst) {
                continue;
            }
            let bound = match c.kind {
                CallKind::Fetch => self.s.fetch_bound() + self.slow_answers_during(&c),
                _ => self.s.backend_timeout + TICK,
            };
            match &c.end {
                None => self.fail(format!(
                    "call {id} ({:?} of k{} in instance {}, started at {:?}) never answered",
                    c.kind, c.key, c.inst, c.start_t
                )),
                Some((_, t, answer, _, _)) if *t - c.start_t > bound => self.fail(format!(
                    "call {id} ({:?} of k{} in instance {}, started at {:?}) answered after {:?}, over its bound {bound:?}: {answer:?}",
                    c.kind, c.key, c.inst, c.start_t, *t - c.start_t
                )),
                Some(_) => {}
            }
        }
    }

    /// How long the calls of `c`'s process on its key that answered took,
    /// while `c` waited: its flight's budget is charged only the calls that
    /// fail (a slow backend that answers is waited on as the protocol needs).
    fn slow_answers_during(&self, c: &CallInfo) -> Duration {
        let end = c.end.as_ref().map(|e| e.1);
        self.slow_answers
            .iter()
            .filter(|&&(i, k, t, _)| {
                i == c.inst && k == c.key && t > c.start_t && end.is_none_or(|end| t <= end)
            })
            .map(|&(_, _, t, took)| took.min(t - c.start_t))
            .sum()
    }

    pub(super) fn check_writes(&mut self) {
        // Read your writes, per process.
        let calls: Vec<_> = self.calls.values().cloned().collect();
        for x in calls.iter().filter(|x| {
            matches!(
                x.kind,
                CallKind::Set | CallKind::Invalidate | CallKind::Expire
            )
        }) {
            let Some((x_end, x_end_t, Answer::Done, _, _)) = &x.end else {
                continue;
            };
            let executed = match x.kind {
                CallKind::Set => x.set_id.and_then(|id| self.set_exec.get(&id).copied()),
                CallKind::Expire => self
                    .expire_execs
                    .iter()
                    .filter(|(i, k, seq)| {
                        *i == x.inst && *k == x.key && *seq > x.start && seq < x_end
                    })
                    .map(|(_, _, seq)| *seq)
                    .min(),
                _ => self
                    .invalidate_execs
                    .iter()
                    .filter(|(i, k, seq)| {
                        *i == x.inst && *k == x.key && *seq > x.start && seq < x_end
                    })
                    .map(|(_, _, seq)| *seq)
                    .min(),
            };
            let Some(executed) = executed else {
                self.fail(format!(
                    "{:?} of k{} in instance {} returned Ok at {x_end_t:?} but never ran on the store",
                    x.kind, x.key, x.inst
                ));
                continue;
            };
            // In the writer's cache every answer; in another cache of its
            // process the L1's (its flights and outage fallback are its own,
            // as another process's are; its L1 hears of the write before the
            // write returns).
            for c in calls.iter().filter(|c| {
                (c.inst == x.inst || (self.s.same_process(c.inst, x.inst) && c.l1))
                    && c.key == x.key
                    && c.start > *x_end
                    && matches!(c.kind, CallKind::Fetch | CallKind::Get)
            }) {
                let Some((_, t, answer, _, _)) = &c.end else {
                    continue;
                };
                let text = match answer {
                    Answer::Fetched { value, .. } => Some(value.as_str()),
                    Answer::Got(value) => value.as_deref(),
                    Answer::Failed(message) => Some(message.as_str()),
                    Answer::Done => None,
                };
                let Some(origin) = text.and_then(origin_of) else {
                    continue;
                };
                let older = self.origin_seq(origin).is_none_or(|o| o < executed);
                if older && self.expired_and_kept(executed, origin, answer, *t) {
                    continue;
                }
                if older {
                    self.fail(format!(
                        "stale read after a write: {:?} of k{} in instance {} returned at {x_end_t:?}; a later call (instance {}, started {:?}{}) answered at {t:?} with {answer:?}, which predates it",
                        x.kind, x.key, x.inst, c.inst, c.start_t, if c.l1 { ", from the L1" } else { "" }
                    ));
                }
            }
        }
        // No fill of a load older than a write lands after it. (The version
        // an `expire` kept may be re-stored after it, fail-safe, by a
        // flight that read it stale after the expire and whose load failed:
        // its lease was won after the expire, or the entry would not land.)
        for key in 0..=self.s.keys {
            for (landed, origin) in self.landed[key].clone() {
                let Some(born) = self.origin_seq(origin) else {
                    continue;
                };
                if let Some(&(w, wt, _)) = self.writes[key].iter().find(|(w, _, _)| {
                    born < *w
                        && *w < landed
                        && self
                            .expire_kept
                            .get(w)
                            .is_none_or(|kept| *kept != Some(origin))
                }) {
                    let landed_t = self.recs[landed].t;
                    self.fail(format!(
                        "a fill from before a write landed after it: {origin:?} of k{key} landed at {landed_t:?}, after the set/invalidate at {wt:?} (seq {w})"
                    ));
                }
            }
        }
    }

    /// Whether an answer of `origin` at `t`, older than the `expire` that
    /// ran at seq `executed`, is one that expire allows: the version it
    /// kept on the store (stale), answered stale (`get` answers stale
    /// values too) within its grace window, or answered at all once a
    /// fail-safe re-store of it landed after the expire (its load failed:
    /// the stale value is served and re-stored for the throttle period) or
    /// another client's `PEXPIRE` gave it a longer life again.
    /// A fresh answer of it otherwise is a stale read after the write.
    fn expired_and_kept(
        &self,
        executed: usize,
        origin: Origin,
        answer: &Answer,
        t: Duration,
    ) -> bool {
        if self.expire_kept.get(&executed) != Some(&Some(origin)) {
            return false;
        }
        let expired_at = self.recs[executed].t;
        // Fresh again since: re-stored fail-safe, or another client's
        // `PEXPIRE` (which onefill cannot know of) lengthened it.
        let restored = self
            .landed
            .iter()
            .flatten()
            .any(|&(seq, o)| o == origin && seq > executed && self.recs[seq].t <= t)
            || self.values.iter().flatten().any(|v| {
                v.by.is_none()
                    && v.change == Change::Ttl
                    && matches!(v.held, Some((Some(o), _)) if o == origin)
                    && expired_at <= v.t
                    && v.t <= t
            });
        let stale = matches!(
            answer,
            Answer::Got(Some(_))
                | Answer::Fetched {
                    outcome: Outcome::Stale,
                    ..
                }
        );
        restored || (stale && t <= expired_at + self.s.grace + self.s.backend_timeout + TICK)
    }

    pub(super) fn check_breaker(&mut self) {
        let window = self.s.breaker_window();
        for inst in 0..self.s.instances {
            if self.is_dead(inst) {
                continue;
            }
            let mut samples: Vec<(usize, Duration, u64)> = Vec::new();
            for c in self.calls.values().filter(|c| c.inst == inst) {
                samples.push((c.start, c.start_t, c.rejected_start));
                if let Some((seq, t, _, rejected, _)) = &c.end {
                    samples.push((*seq, *t, *rejected));
                }
            }
            samples.sort();
            for pair in samples.windows(2) {
                let ((_, ta, na), (_, tb, nb)) = (pair[0], pair[1]);
                if nb <= na {
                    continue;
                }
                let excused = self.faults[inst]
                    .iter()
                    .any(|&f| f <= tb && f + window >= ta);
                if !excused {
                    self.fail(format!(
                        "breaker stuck: instance {inst} rejected {} call(s) between {ta:?} and {tb:?}, with no fault in the {window:?} before",
                        nb - na
                    ));
                }
            }
        }
        // The probes are the calls on the extra key.
        let stuck: Vec<String> = self
            .calls
            .values()
            .filter(|c| c.key == self.s.keys)
            .filter_map(|c| match &c.end {
                Some((_, _, Answer::Got(_), _, true)) => None,
                other => Some(format!(
                    "breaker: the probe of instance {} in the healthy tail did not reach the backend and close the circuit: {other:?}",
                    c.inst
                )),
            })
            .collect();
        for what in stuck {
            self.fail(what);
        }
    }
}

impl Checker<'_> {
    /// No answer is older than its value's life on the store: a value
    /// written at `t` (its last fill, fail-safe entry or `set` that landed)
    /// lives at most `ttl + grace` (jitter only shortens) there, or
    /// `throttle + grace` for a fail-safe entry; a value never
    /// stored (a degraded load's, or one whose fill failed), from its
    /// load's end. No call, whatever its outcome, may answer it after that
    /// (the outage fallback must not outlive the store), give or take one
    /// backend timeout: the fallback counts a value's life from the
    /// flight's answer, which may follow the fill (or the load) by a fill
    /// that timed out. A fail-safe answer at the end of a failed load may
    /// be up to the max load time older (read before the load).
    pub(super) fn check_ages(&mut self) {
        let life = self.s.value_life() + self.s.backend_timeout + TICK;
        let mut born: HashMap<Origin, Duration> = HashMap::new();
        for l in &self.loads {
            if let Some((_, t, LoadEnd::Value)) = l.end {
                born.insert(Origin::Load(l.id), t);
            }
        }
        for key in 0..=self.s.keys {
            for &(seq, origin) in &self.landed[key] {
                let t = self.recs[seq].t;
                let b = born.entry(origin).or_insert(t);
                *b = (*b).max(t);
            }
            for &(_, t, origin) in &self.writes[key] {
                if let Some(origin) = origin {
                    let b = born.entry(origin).or_insert(t);
                    *b = (*b).max(t);
                }
            }
            // The foreign writer's versions are born at its raw `SET`; a
            // raw `PEXPIRE` may keep a version longer than any write of the
            // fleet would: its life then counts back from its expiry.
            for v in &self.values[key] {
                let Some((Some(origin), expires)) = v.held else {
                    continue;
                };
                let from = if v.by.is_none() && v.change == Change::Write {
                    v.t
                } else {
                    expires.saturating_sub(self.s.value_life())
                };
                let b = born.entry(origin).or_insert(from);
                *b = (*b).max(from);
            }
        }
        let calls: Vec<_> = self.calls.iter().map(|(id, c)| (*id, c.clone())).collect();
        for (id, c) in calls {
            let Some((_, t, answer, _, _)) = &c.end else {
                continue;
            };
            let value = match answer {
                Answer::Fetched { value, .. } => value.as_str(),
                Answer::Got(Some(value)) => value.as_str(),
                _ => continue,
            };
            let Some(origin) = origin_of(value) else {
                continue;
            };
            let Some(&b) = born.get(&origin) else {
                continue;
            };
            // Fail-safe: a load that failed serves the stale value its
            // flight read before it, up to the max load time later.
            let fail_safe = matches!(
                answer,
                Answer::Fetched {
                    outcome: Outcome::Stale,
                    ..
                }
            ) && self.loads.iter().any(|l| {
                l.inst == c.inst
                    && l.key == c.key
                    && matches!(l.end, Some((_, end, LoadEnd::Error | LoadEnd::Gone)) if end == *t)
            });
            let life = if fail_safe {
                life + self.s.max_load_time
            } else {
                life
            };
            if *t > b + life {
                self.fail(format!(
                    "answer older than its value's life: call {id} ({:?} of k{} in instance {}) answered at {t:?} with {answer:?}, written (or loaded) last at {b:?}, which lives at most {life:?}",
                    c.kind, c.key, c.inst
                ));
            }
        }
    }
}
