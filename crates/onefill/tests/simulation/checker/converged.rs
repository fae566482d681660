//! Invariant 9: writes that failed in an outage are replayed, and the
//! fleet converges (decision 0017).

use std::time::Duration;

use onefill::Stats;

use super::Checker;
use crate::events::{origin_of, Answer, CallKind};

impl Checker<'_> {
    pub(super) fn check_converged(&mut self, stats: &[Option<Stats>]) {
        let Some(healthy) = self.healthy else {
            return;
        };
        let Some(drained) = self.drained else {
            self.fail(format!(
                "the queues of failed writes never drained ({:?} after the healthy tail began)",
                self.s.drain_patience()
            ));
            return;
        };
        let bound = self.s.drain_bound();
        if drained - healthy > bound {
            self.fail(format!(
                "the queues of failed writes drained {:?} after the healthy tail began, over {bound:?}",
                drained - healthy
            ));
        }
        let Some(final_reads) = self.final_reads else {
            return;
        };
        // Per key: when the latest write of it began that failed for want
        // of the store (an error other than a refusal, or its caller gone
        // mid-call), in an instance that lived, and whose replays the store
        // never refused (a refused replay is dropped, as documented).
        let refused = |inst: usize| {
            stats
                .get(inst)
                .and_then(|s| s.as_ref())
                .is_none_or(|s| s.writes_refused > 0)
        };
        let mut failed: Vec<Option<Duration>> = vec![None; self.s.keys];
        for c in self.calls.values() {
            if !matches!(c.kind, CallKind::Set | CallKind::Invalidate)
                || c.key >= self.s.keys
                || self.is_dead(c.inst)
                || refused(c.inst)
            {
                continue;
            }
            let queued = c.dropped
                || matches!(&c.end, Some((_, _, Answer::Failed(why), _, _))
                    if !why.contains("command rejected") && !why.contains("protocol error"));
            if queued {
                self.tally.failed_writes += 1;
                let latest = &mut failed[c.key];
                *latest = Some(latest.map_or(c.start_t, |t| t.max(c.start_t)));
            }
        }
        // A mark that failed so ran on the store since (replayed, or its
        // command ran after all): invariant 10 then checks every process
        // against it, from its run.
        let unrun: Vec<String> = self
            .calls
            .values()
            .filter(|c| !self.is_dead(c.inst) && !refused(c.inst))
            .filter_map(|c| {
                let CallKind::Mark(op) = c.kind else {
                    return None;
                };
                let queued = c.dropped
                    || matches!(&c.end, Some((_, _, Answer::Failed(why), _, _))
                        if !why.contains("command rejected") && !why.contains("protocol error"));
                let ran = self
                    .marks
                    .iter()
                    .any(|m| m.inst == c.inst && m.op == op && m.seq > c.start);
                (queued && !ran).then(|| {
                    format!(
                        "{op:?} in instance {} failed at {:?} for want of the store and never ran on it once the queues drained",
                        c.inst, c.start_t
                    )
                })
            })
            .collect();
        for what in unrun {
            self.fail(what);
        }
        let reads: Vec<_> = self
            .calls
            .iter()
            .filter(|(_, c)| {
                c.start > final_reads && c.kind == CallKind::Get && c.key < self.s.keys
            })
            .map(|(id, c)| (*id, c.clone()))
            .collect();
        for (id, c) in reads {
            let Some(failed_at) = failed[c.key] else {
                continue;
            };
            let Some((_, _, Answer::Got(Some(value)), _, _)) = &c.end else {
                continue;
            };
            let Some(origin) = origin_of(value) else {
                continue;
            };
            // When the version was first on the store.
            let born = self.values[c.key]
                .iter()
                .find(|v| v.held.is_some_and(|(o, _)| o == Some(origin)))
                .map(|v| v.t);
            if born.is_some_and(|born| born < failed_at) {
                self.fail(format!(
                    "call {id}: instance {} read {value:?} of k{} once the queues drained, \
                     a version stored at {:?}, before a write of the key that failed at \
                     {failed_at:?} and should have been replayed",
                    c.inst,
                    c.key,
                    born.unwrap_or_default()
                ));
            }
        }
    }
}
