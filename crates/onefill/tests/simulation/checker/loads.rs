//! Invariants 1 and 3: one loader at a time, every duplicate explained;
//! leases end with their loads.

use std::time::Duration;

use onefill::OnWaitTimeout;

use super::{Checker, LeaseEnd, LoadInfo};
use crate::events::CallKind;
use crate::scenario::TICK;

impl Checker<'_> {
    pub(super) fn check_loads(&mut self) {
        self.tally.loads = self.loads.len() as u64;
        let loads = self.loads.clone();
        for l2 in &loads {
            if let Some(token) = &l2.leased {
                let lease = &self.leases[token];
                if lease.fresh_before {
                    self.fail(format!(
                        "duplicate load: load L{} of k{} in instance {} at {:?} runs under a lease won while the value was fresh beyond the refresh window {:?}",
                        l2.id, l2.key, l2.inst, l2.start_t, lease.window
                    ));
                }
            } else {
                self.tally.degraded_loads += 1;
                self.justify_degraded(l2);
            }
            for l1 in loads.iter().filter(|l1| l1.key == l2.key) {
                if !self.load_running_at(l1, l2.start, l2.start_t) {
                    continue;
                }
                self.explain_overlap(l1, l2);
            }
        }
    }

    /// Two loads of a key at once, in the fleet or in one process, are
    /// explained alike: the first one's lease expired or was revoked before
    /// the second started, or one of them is degraded. In one process a
    /// flight that just won a lease runs a load of its own (a load under
    /// way may predate the write that revoked that load's lease), but a
    /// degraded load shares the one under way: it runs its own only if that
    /// one left the coalescer first, detached by a write of the process or
    /// displaced by a newer leased load.
    fn explain_overlap(&mut self, l1: &LoadInfo, l2: &LoadInfo) {
        let what = format!(
            "load L{} of k{} (instance {}, {:?}) started while L{} (instance {}, {:?}) ran",
            l2.id, l2.key, l2.inst, l2.start_t, l1.id, l1.inst, l1.start_t
        );
        if l1.inst == l2.inst {
            if l2.leased.is_none() && !self.left_coalescer(l1, l2) {
                self.fail(format!(
                    "two loads at once in one process: {what}, a degraded load that could have shared it"
                ));
                return;
            }
            self.tally.overlaps_in_process += 1;
        }
        let (Some(t1), Some(t2)) = (&l1.leased, &l2.leased) else {
            self.tally.overlaps_degraded += 1;
            return;
        };
        // The second one's `Won` came late (a reply's latency): its lease
        // had already expired or been revoked when its load started.
        match self.leases[t2].end {
            Some((at, LeaseEnd::Expired)) if at <= l2.start_t => {
                self.tally.overlaps_expiry += 1;
                self.counted_lost(l2.inst, t2);
                return;
            }
            Some((at, LeaseEnd::Revoked)) if at <= l2.start_t => {
                self.tally.overlaps_revoked += 1;
                self.counted_lost(l2.inst, t2);
                return;
            }
            _ => {}
        }
        match self.leases[t1].end {
            Some((at, LeaseEnd::Expired)) if at <= l2.start_t => self.tally.overlaps_expiry += 1,
            Some((at, LeaseEnd::Revoked)) if at <= l2.start_t => self.tally.overlaps_revoked += 1,
            end => {
                let scope = if l1.inst == l2.inst {
                    "two loads at once in one process"
                } else {
                    "unexplained duplicate load"
                };
                self.fail(format!(
                    "{scope}: {what}, and the first one's lease ended by {end:?}"
                ));
                return;
            }
        }
        self.counted_lost(l1.inst, t1);
    }

    /// Whether `l1` left its process's coalescer before `l2` started:
    /// detached by a `set` or `invalidate` of the process, or displaced by
    /// a leased load started since. A load joins the coalescer at the
    /// instant its loader is first polled, but possibly just before a write
    /// that returned in that same instant: compare times, not log order.
    fn left_coalescer(&self, l1: &LoadInfo, l2: &LoadInfo) -> bool {
        let detached = self.calls.values().any(|c| {
            c.inst == l1.inst
                && c.key == l1.key
                && matches!(c.kind, CallKind::Set | CallKind::Invalidate)
                && c.start < l2.start
                && c.end.as_ref().is_none_or(|e| e.1 >= l1.start_t)
        });
        let displaced = self.loads.iter().any(|l3| {
            l3.inst == l1.inst
                && l3.key == l1.key
                && l3.leased.is_some()
                && l1.start < l3.start
                && l3.start < l2.start
        });
        detached || displaced
    }

    /// A duplicate load explained by a lost lease is counted (`lease_lost`)
    /// by its holder once the holder is told the lease is not its own any
    /// more (a fill, an extension or a release answering so): the stats
    /// identity checks that count; this tallies how many duplicates it
    /// covers (the holder may also die, or never get an answer).
    fn counted_lost(&mut self, holder: usize, token: &str) {
        if !self.is_dead(holder) && self.leases[token].told_lost {
            self.tally.overlaps_counted += 1;
        }
    }

    /// A load without a lease must follow a fault seen by its process, or
    /// a wait that reached its deadline.
    fn justify_degraded(&mut self, l: &LoadInfo) {
        if self.s.no_lease {
            // Without waiting, a held lease is reason enough.
            return;
        }
        let window = self.s.degrade_window();
        let fault = self.faults[l.inst]
            .iter()
            .any(|&f| f <= l.start_t && f + window >= l.start_t);
        let deadline = self.s.wait.deadline;
        let loads_at_deadline = matches!(
            self.s.wait.on_timeout,
            OnWaitTimeout::StaleOrLoad | OnWaitTimeout::Load
        );
        let waited = loads_at_deadline
            && self.held_replies.iter().any(|&(i, k, t)| {
                i == l.inst
                    && k == l.key
                    && t + deadline <= l.start_t + TICK
                    && t + deadline + self.s.backend_timeout + TICK >= l.start_t
            });
        if !fault && !waited {
            self.fail(format!(
                "unexplained degraded load: L{} of k{} in instance {} at {:?} ran without a lease, with no fault and no wait deadline before it",
                l.id, l.key, l.inst, l.start_t
            ));
        }
    }

    pub(super) fn check_leases(&mut self) {
        // Extended only while a load of its key runs in its holder.
        for (seq, t, token) in self.extends.clone() {
            let lease = &self.leases[&token];
            let running = self.loads.iter().any(|l| {
                l.inst == lease.inst
                    && l.key == lease.key
                    && l.start < seq
                    && l.end.is_none_or(|(_, end_t, _)| end_t >= t)
            });
            if !running {
                self.fail(format!(
                    "lease of k{} (instance {}, won at {:?}) extended at {t:?} with no load running",
                    lease.key, lease.inst, lease.won_t
                ));
            }
        }
        // A lease won by a command whose reply was lost is released, and
        // so is one whose fill or release failed (it may have landed, or
        // not run at all).
        for (seq, inst, t, token) in self.lost_replies.clone() {
            let lease = &self.leases[&token];
            if lease.delivered.is_some() || self.is_dead(inst) {
                continue;
            }
            self.tally.lost_acquires += 1;
            if !self.released_after(seq, inst, t, &token) {
                self.fail(format!(
                    "lease of k{} won at {t:?} by instance {inst} whose reply was lost was not released",
                    lease.key
                ));
            }
        }
        for (seq, inst, t, token) in self.failed_ends.clone() {
            if self.is_dead(inst) {
                continue;
            }
            self.tally.failed_ends += 1;
            if !self.released_after(seq, inst, t, &token) {
                self.fail(format!(
                    "lease of k{} (instance {inst}) whose fill or release failed at {t:?} was not released",
                    self.leases[&token].key
                ));
            }
        }
    }

    /// Whether `inst` sent a release of `token` after log entry `seq`
    /// (at `t`), within one backend timeout.
    fn released_after(&self, seq: usize, inst: usize, t: Duration, token: &str) -> bool {
        self.release_entries.iter().any(|(rs, i, rt, tk)| {
            *rs > seq && *i == inst && tk == token && *rt <= t + self.s.backend_timeout + TICK
        })
    }
}
