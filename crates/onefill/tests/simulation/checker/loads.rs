//! Invariants 1 and 3: one loader at a time, every duplicate explained;
//! leases end with their loads.

use std::time::Duration;

use onefill::OnWaitTimeout;

use onefill::backend::Gone;

use super::{Checker, LeaseEnd, LoadInfo};
use crate::events::CallKind;
use crate::scenario::{PUSH_DELAY_MAX, TICK};

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
    /// explained alike: the first one's lease expired, was revoked or was
    /// taken over before the second started, or one of them is degraded. In one process a
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
        // had already expired, been revoked or been taken over when its
        // load started.
        if let Some(tally) = self.lease_lost_by(t2, l2.start_t) {
            *tally += 1;
            self.counted_lost(l2.inst, t2);
            return;
        }
        match self.lease_lost_by(t1, l2.start_t) {
            Some(tally) => *tally += 1,
            None => {
                let end = self.leases[t1].end;
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

    /// If the lease of `token` was lost by `at` (expired, revoked by a
    /// write, or taken over from its holder judged gone), the tally of
    /// overlaps that explains.
    fn lease_lost_by(&mut self, token: &str, at: Duration) -> Option<&mut u64> {
        match self.leases[token].end {
            Some((end, how)) if end <= at => match how {
                LeaseEnd::Expired => Some(&mut self.tally.overlaps_expiry),
                LeaseEnd::Revoked => Some(&mut self.tally.overlaps_revoked),
                LeaseEnd::TakenOver => Some(&mut self.tally.overlaps_taken_over),
                LeaseEnd::Own | LeaseEnd::Foreign => None,
            },
            _ => None,
        }
    }

    /// A take-over follows a verdict: the holder whose token it names was
    /// judged gone before it ran, by a watch (or a `watch_holder` answer)
    /// in the taker's instance. The store's watches judge a holder dead
    /// only once its instance died (checked too: a wrong one would be the
    /// model's); a holder judged frozen is alive, a wrong verdict whose
    /// cost (a second load, a fenced fill) invariants 1, 4 and 6 bound.
    pub(super) fn check_takeovers(&mut self) {
        for (seq, _, t, holder, gone) in self.verdicts.clone() {
            let Some(lease) = self.leases.get(&holder) else {
                self.fail(format!(
                    "checker: a holder judged {gone:?} at {t:?} by a token that never held a lease"
                ));
                continue;
            };
            if gone == Gone::Dead && !self.dead_before(lease.inst, seq) {
                self.fail(format!(
                    "checker: instance {} judged dead at {t:?} while alive",
                    lease.inst
                ));
            }
        }
        for (seq, inst, key, t, gone, replaced) in self.takeovers.clone() {
            let judged = self
                .verdicts
                .iter()
                .any(|(at, by, _, holder, _)| *at < seq && *by == inst && *holder == gone);
            if !judged {
                self.fail(format!(
                    "take-over without a verdict: instance {inst} took over k{key}'s lease at {t:?} from {gone}, which no watch of its own had judged gone"
                ));
            }
            if replaced {
                self.tally.takeovers += 1;
                let holder = self.leases[&gone].inst;
                self.tally.takeovers_of_live += u64::from(!self.dead_before(holder, seq));
            }
        }
    }

    /// Whether `l1` left its process's coalescer before `l2` started:
    /// detached by a `set`, `invalidate` or `expire` of the process or a
    /// mark (the process's, reported to it, or found by its read of the
    /// marks), or displaced by
    /// a leased load started since. A load joins the coalescer at the
    /// instant its loader is first polled, but possibly just before a write
    /// that returned in that same instant: compare times, not log order.
    fn left_coalescer(&self, l1: &LoadInfo, l2: &LoadInfo) -> bool {
        let detached = self.calls.values().any(|c| {
            c.inst == l1.inst
                && c.key == l1.key
                && matches!(
                    c.kind,
                    CallKind::Set | CallKind::Invalidate | CallKind::Expire
                )
                && c.start < l2.start
                && c.end.as_ref().is_none_or(|e| e.1 >= l1.start_t)
        });
        // A mark detaches every load of its process (its own mark, however
        // it ended; another's once reported, with an L1): any key's.
        let marked = self.calls.values().any(|c| {
            c.inst == l1.inst
                && matches!(c.kind, CallKind::Mark(_))
                && c.start < l2.start
                && c.end.as_ref().is_none_or(|e| e.1 >= l1.start_t)
        }) || self.marks.iter().any(|m| {
            // Heard of by the process: its own (a replay's, once its reply
            // came, which may be late), or reported (with an L1).
            let heard_by = if self.s.same_process(m.inst, l1.inst) {
                self.s.backend_timeout * 2
            } else if self.s.l1 {
                PUSH_DELAY_MAX
            } else {
                return false;
            };
            m.t <= l2.start_t && m.t + heard_by >= l1.start_t
        }) || self.tracking_lost[l1.inst].iter().any(|&(_, back)| {
            // A tracking connection back: the reset detaches them too (a
            // mark may have gone unreported).
            back.is_some_and(|back| l1.start_t <= back && back <= l2.start_t)
        }) || {
            // A read of the marks that found another process had marked
            // (the generation moved): without an L1, any; with one, while
            // its tracking connection was lost, and until the sync bound
            // after it came back (the backend did not vouch for the
            // reports then, so the mark may have gone unreported).
            let untracked = |at: Duration| {
                !self.s.l1
                    || self.tracking_lost[l1.inst].iter().any(|&(lost, back)| {
                        lost <= at && back.is_none_or(|back| at <= back + self.s.sync_bound)
                    })
            };
            let mut before = 0;
            self.marks_learned[l1.inst].iter().any(|&(at, g)| {
                let moved = g > before;
                before = before.max(g);
                moved && l1.start_t <= at && at <= l2.start_t && untracked(at)
            })
        };
        let displaced = self.loads.iter().any(|l3| {
            l3.inst == l1.inst
                && l3.key == l1.key
                && l3.leased.is_some()
                && l1.start < l3.start
                && l3.start < l2.start
        });
        detached || marked || displaced
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
