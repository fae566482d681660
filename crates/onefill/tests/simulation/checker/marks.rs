//! Invariants 10 and 11: marks are final; no value is born judged (no
//! reload loop).

use std::time::Duration;

use onefill::Outcome;

use super::{CallInfo, Checker, MarkRec};
use crate::events::{origin_of, Answer, CallKind, LoadEnd, Origin};
use crate::scenario::{MARKS_RECHECKED, PUSH_DELAY_MAX, TICK};

/// Whose view of a mark is bound from the call that made it: the seq that
/// call returned `Ok` at, and its instance.
#[derive(Debug, Clone, Copy)]
struct Returned {
    inst: usize,
    end: usize,
    end_t: Duration,
}

impl Checker<'_> {
    /// The marks run on the store, each with the call that made it and
    /// returned `Ok` (`None`: a replay, or a call that failed or was
    /// dropped after its command ran).
    fn marks_and_callers(&mut self) -> Vec<(MarkRec, Option<Returned>)> {
        let mut out: Vec<(MarkRec, Option<Returned>)> =
            self.marks.iter().map(|m| (*m, None)).collect();
        let calls: Vec<CallInfo> = self.calls.values().cloned().collect();
        for x in &calls {
            let CallKind::Mark(op) = x.kind else {
                continue;
            };
            let Some((end, end_t, Answer::Done, _, _)) = &x.end else {
                continue;
            };
            // Its own command ran in the call; a replay of the same mark
            // may run then too (both are on the store before it returns).
            let ran: Vec<usize> = (0..out.len())
                .filter(|&i| {
                    let m = &out[i].0;
                    m.inst == x.inst && m.op == op && x.start < m.seq && m.seq < *end
                })
                .collect();
            if ran.is_empty() {
                self.fail(format!(
                    "{op:?} in instance {} returned Ok at {end_t:?} but never ran on the store",
                    x.inst
                ));
            }
            for i in ran {
                out[i].1 = Some(Returned {
                    inst: x.inst,
                    end: *end,
                    end_t: *end_t,
                });
            }
        }
        out
    }

    /// Whether call `c` started once its process must know mark `m`: in
    /// the process whose call made it, once that call returned `Ok` (its
    /// own marks are applied before it returns, and its process's other
    /// caches hear of them before it returns too); elsewhere, with an L1,
    /// once the change report may have come (a push, or the sync bound if
    /// the tracking connection was lost), and without one, once the marks
    /// read before it were judged by for two recheck periods.
    ///
    /// Unless the process could not read the marks (`unread`: one of its
    /// reads of them failed while the call ran) and had read none since
    /// the mark: the last marks it knows then judge (decision 0018, on the
    /// assumption that nobody can mark while the marks' master is down,
    /// which a fault of one process's connection does not honour).
    fn must_know(
        &self,
        m: &MarkRec,
        by: Option<Returned>,
        inst: usize,
        seq: usize,
        t: Duration,
        unread: Option<Duration>,
    ) -> bool {
        if let Some(by) = by.filter(|by| self.s.same_process(by.inst, inst)) {
            return seq > by.end;
        }
        // Without an L1, a read of the marks that found the generation at
        // or past the mark's: the process dropped every mark and copy it
        // held from before (`Marks::on_moved`, `Marks::marked`).
        let learned = !self.s.l1
            && self.marks_learned[inst]
                .iter()
                .any(|&(at, g)| at < t && g >= m.generation);
        if learned {
            return true;
        }
        let unread =
            unread.is_some_and(|end| self.marks_unread[inst].iter().any(|&f| t <= f && f <= end));
        !unread && t > self.mark_bound(m, inst)
    }

    /// When another process stops judging by what it held before mark `m`
    /// ran, at the latest: with an L1, once the report came (or its sync
    /// bound passed, the tracking connection lost); without one, two
    /// recheck periods after (the marks read before are trusted that long),
    /// pushed on by each read of the marks that failed meanwhile (which
    /// keeps what it held judging for one more period: `marks/mod.rs`).
    fn mark_bound(&self, m: &MarkRec, inst: usize) -> Duration {
        if self.s.l1 {
            return m.t + self.s.sync_bound + PUSH_DELAY_MAX + TICK;
        }
        let mut bound = m.t + MARKS_RECHECKED;
        for &f in &self.marks_unread[inst] {
            if f > m.t && f <= bound {
                bound = bound.max(f + MARKS_RECHECKED / 2);
            }
        }
        bound + TICK
    }

    /// Whether `m` judges `origin`: a load's value if the load began
    /// before the mark ran (it may have read what the mark is about) and
    /// carries its tag; another version (a `set`'s, the foreign writer's)
    /// if it records an older generation and carries the tag. A version
    /// never stored and not a load's is unknown here: not judged.
    fn judges(&self, m: &MarkRec, origin: Origin) -> bool {
        if let Origin::Load(id) = origin {
            if let Some(&i) = self.load_index.get(&id) {
                let l = &self.loads[i];
                // A load that failed has no tags: only a `clear` judges its
                // failure.
                let tags = match l.end {
                    Some((_, _, LoadEnd::Value)) => l.tags,
                    _ => 0,
                };
                return l.start < m.seq && m.op.covers(tags);
            }
        }
        self.stamps
            .get(&origin)
            .is_some_and(|&(as_of, tags, _)| as_of < m.generation && m.op.covers(tags))
    }

    /// Invariant 10: once a process must know a mark (see [`must_know`](Self::must_know)),
    /// no call of it answers a version the mark judges: after a hard mark
    /// none at all, after a soft one (`expire_tag`) only stale (a `get`
    /// answers stale values too; the grace counts from each read, a
    /// documented limit, and invariant 7 bounds the value's life).
    pub(super) fn check_marks(&mut self) {
        let marks = self.marks_and_callers();
        self.tally.marks = marks.len() as u64;
        let calls: Vec<(usize, CallInfo)> = self
            .calls
            .iter()
            .filter(|(_, c)| matches!(c.kind, CallKind::Fetch | CallKind::Get))
            .filter(|(_, c)| !self.is_dead(c.inst))
            .map(|(id, c)| (*id, c.clone()))
            .collect();
        for (m, by) in &marks {
            for (id, c) in &calls {
                let Some((_, t, answer, _, _)) = &c.end else {
                    continue;
                };
                if !self.must_know(m, *by, c.inst, c.start, c.start_t, Some(*t)) {
                    continue;
                }
                let text = match answer {
                    Answer::Fetched { value, .. } => Some(value.as_str()),
                    Answer::Got(value) => value.as_deref(),
                    Answer::Failed(message) => Some(message.as_str()),
                    Answer::Done => None,
                };
                let Some(origin) = text.and_then(origin_of) else {
                    continue;
                };
                if !self.judges(m, origin) {
                    continue;
                }
                let stale = matches!(
                    answer,
                    Answer::Got(Some(_))
                        | Answer::Fetched {
                            outcome: Outcome::Stale,
                            ..
                        }
                );
                if m.op.hard || !stale {
                    let by = match by {
                        Some(by) => format!(", whose call returned at seq {}", by.end),
                        None => String::new(),
                    };
                    self.fail(format!(
                        "a marked value answered: {:?} by instance {} ran at {:?} (generation {}{by}); call {id} ({:?} of k{} in instance {}, started {:?}{}) answered at {t:?} with {answer:?}, which it judges",
                        m.op, m.inst, m.t, m.generation, c.kind, c.key, c.inst, c.start_t,
                        if c.l1 { ", from the L1" } else { "" }
                    ));
                }
            }
        }
    }

    /// Invariant 11: a value a process stores once it must know a mark
    /// (its load, or its `set`, began then) records a generation at least
    /// the mark's, or it would be judged by the mark wherever it is read,
    /// and loaded again and again. Unless the process's read of the
    /// generation failed meanwhile: it then records the last one known,
    /// which costs one reload (documented).
    pub(super) fn check_reloads(&mut self) {
        let marks = self.marks_and_callers();
        // (origin, instance, seq and time its load or `set` began).
        let mut born: Vec<(Origin, usize, usize, Duration)> = self
            .loads
            .iter()
            .map(|l| (Origin::Load(l.id), l.inst, l.start, l.start_t))
            .collect();
        born.extend(self.calls.values().filter_map(|c| {
            let id = c.set_id?;
            (c.kind == CallKind::Set).then_some((Origin::Set(id), c.inst, c.start, c.start_t))
        }));
        for (origin, inst, seq, t) in born {
            let Some(&(as_of, tags, sent)) = self.stamps.get(&origin) else {
                continue;
            };
            for (m, by) in &marks {
                // A load records the generation when its flight starts it,
                // which may be in the instant before its loader is first
                // polled (the log's start): a mark that returns in that
                // instant may come between, and the load then errs on the
                // old side (one reload, not a loop).
                let same_instant = by.is_some_and(|by| by.end_t == t);
                if as_of >= m.generation
                    || !m.op.covers(tags)
                    || !self.must_know(m, *by, inst, seq, t, None)
                    || same_instant
                {
                    continue;
                }
                let own = by.is_some_and(|by| by.inst == inst);
                // (Up to when its bytes were sent: a write reads the
                // generation within its own time.)
                let unread = self.marks_unread[inst]
                    .iter()
                    .any(|&f| m.t <= f && f <= sent);
                let learned = !self.s.l1
                    && self.marks_learned[inst]
                        .iter()
                        .any(|&(at, g)| at < t && g >= m.generation);
                if own || learned || !unread {
                    self.fail(format!(
                        "a value born judged: {origin:?} of instance {inst}, begun at {t:?}, records generation {as_of}, older than {:?} by instance {} at {:?} (generation {}), which its process must know by then",
                        m.op, m.inst, m.t, m.generation
                    ));
                }
            }
        }
    }
}
