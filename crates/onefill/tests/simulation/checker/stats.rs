//! Invariant 6: the stats add up.

use onefill::LeaseToken;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use onefill::backend::Gone;
use onefill::{Outcome, Stats};

use super::{Checker, Invariant, Violation};
use crate::events::{Answer, BOp, CallKind, Ev, LoadEnd, Reply};

impl Checker<'_> {
    pub(super) fn check_stats(&mut self, stats: &[Option<Stats>]) {
        for (inst, st) in stats.iter().enumerate() {
            if self.is_dead(inst) {
                continue;
            }
            let Some(st) = st else { continue };
            self.tally.rejected += st.circuit_rejected;
            let loads: Vec<_> = self.loads.iter().filter(|l| l.inst == inst).collect();
            let ok = loads
                .iter()
                .filter(|l| matches!(l.end, Some((_, _, LoadEnd::Value))))
                .count() as u64;
            let failed = loads.len() as u64 - ok;
            let unleased = loads.iter().filter(|l| l.leased.is_none()).count() as u64;
            let mut won = 0;
            let mut extended = 0;
            let lost = self
                .leases
                .values()
                .filter(|l| l.inst == inst && l.told_lost)
                .count() as u64;
            let mut errors = 0;
            let mut abandoned = 0;
            // Reads of the marks that failed: the cache judges by the
            // marks it knows, or fails the call they were read for (one
            // error), or reads them in the background (none counted).
            let mut marks_errors = 0;
            // `Won` answers the cache may not have been handed: the reads
            // of the marks that judge them (made before the answer is
            // handed on) failed, and with them the call, perhaps.
            let mut pending_won: HashMap<Option<tokio::task::Id>, &str> = HashMap::new();
            let mut unsure_tokens: HashSet<&str> = HashSet::new();
            // Errors the cache may never count: a read's error while the
            // read of the marks beside it (joined with it) still runs, if
            // that one is dropped (the call with it, by its caller or the
            // flight's budget: a call dropped is not counted).
            let mut err_unsure = 0;
            let mut pending_err: HashMap<Option<tokio::task::Id>, bool> = HashMap::new();
            for rec in self.recs {
                match &rec.ev {
                    Ev::Delivered {
                        inst: i,
                        op: BOp::ReadMarks,
                        reply: Reply::Err,
                        task,
                        ..
                    } if *i == inst => {
                        marks_errors += 1;
                        unsure_tokens.extend(pending_won.remove(task));
                    }
                    Ev::Delivered {
                        inst: i,
                        op: BOp::ReadMarks,
                        ..
                    } if *i == inst => {}
                    Ev::Abandoned {
                        inst: i,
                        op: BOp::ReadMarks,
                        task,
                        ..
                    } if *i == inst => {
                        abandoned += 1;
                        unsure_tokens.extend(pending_won.remove(task));
                        err_unsure += u64::from(pending_err.remove(task).is_some());
                    }
                    Ev::Delivered {
                        inst: i,
                        op,
                        token,
                        reply,
                        task,
                        ..
                    } if *i == inst => {
                        pending_won.remove(task);
                        pending_err.remove(task);
                        if *reply == Reply::Err {
                            pending_err.insert(*task, true);
                        }
                        match (op, reply) {
                            (BOp::Acquire | BOp::TakeOver, Reply::Won) => {
                                won += 1;
                                if let Some(token) = token {
                                    pending_won.insert(*task, token.as_str());
                                }
                            }
                            (BOp::Extend, Reply::True) => extended += 1,
                            // A release in the background (see `told_lost`)
                            // is not a counted call: its error is not counted.
                            (BOp::Release, Reply::Err)
                                if token.as_ref().and_then(|tk| self.leases.get(tk)?.delivered)
                                    != Some(*task) => {}
                            (_, Reply::Err) => errors += 1,
                            _ => {}
                        }
                    }
                    Ev::Abandoned { inst: i, task, .. } if *i == inst => {
                        abandoned += 1;
                        pending_won.remove(task);
                        pending_err.remove(task);
                    }
                    _ => {}
                }
            }
            // Or judged by marks it knew too little of, with the read of
            // them beside the acquire failed already: no read more, the
            // call fails and the lease goes back in the background before
            // its flight used it.
            unsure_tokens.extend(self.given_back(inst));
            let won_unsure = unsure_tokens.len() as u64;
            let (mut coalesced, mut unknown, mut hits, mut stale, mut degraded) = (0, 0, 0, 0, 0);
            for c in self
                .calls
                .values()
                .filter(|c| c.inst == inst && c.kind == CallKind::Fetch)
            {
                match &c.end {
                    Some((
                        _,
                        _,
                        Answer::Fetched {
                            outcome,
                            coalesced: joined,
                            ..
                        },
                        _,
                        _,
                    )) => {
                        if *joined {
                            coalesced += 1;
                            continue;
                        }
                        match outcome {
                            Outcome::Hit => hits += 1,
                            Outcome::Stale => stale += 1,
                            Outcome::Degraded => degraded += 1,
                            _ => {}
                        }
                    }
                    _ => unknown += 1,
                }
            }
            let (dead, frozen, takeovers, takeovers_unsure, takeovers_maybe) =
                self.liveness_counts(inst);
            let mut expect = |what: &str, holds: bool, detail: String| {
                if !holds {
                    self.violations.push(Violation {
                        invariant: Invariant::Stats,
                        what: format!("stats of instance {inst}: {what}: {detail}"),
                    });
                }
            };
            let exact = [
                ("loads_ok", st.loads_ok, ok, "loads that returned a value"),
                ("loads_error", st.loads_error, failed, "loads that failed"),
                (
                    "lease_extended",
                    st.lease_extended,
                    extended,
                    "extensions delivered",
                ),
                (
                    "lease_lost",
                    st.lease_lost,
                    lost,
                    "leases answered not ours",
                ),
            ];
            let exact = exact.into_iter().chain([
                ("holders_dead", st.holders_dead, dead, "holders judged dead"),
                (
                    "holders_frozen",
                    st.holders_frozen,
                    frozen,
                    "holders judged frozen",
                ),
            ]);
            for (what, counted, seen, of) in exact {
                expect(what, counted == seen, format!("{counted} != {seen} {of}"));
            }
            expect(
                "lease_takeovers",
                st.lease_takeovers <= takeovers + takeovers_maybe
                    && st.lease_takeovers + takeovers_unsure >= takeovers,
                format!(
                    "{} outside [{takeovers} leases won by a take-over or after the holder's lease ran out unannounced - {takeovers_unsure} judged by marks that could not be read, + {takeovers_maybe} handed on after it ran out]",
                    st.lease_takeovers
                ),
            );
            expect(
                "lease_acquired",
                st.lease_acquired <= won && st.lease_acquired + won_unsure >= won,
                format!(
                    "{} outside [{won} Won answers delivered - {won_unsure} judged by marks that could not be read, {won}]",
                    st.lease_acquired
                ),
            );
            expect(
                "degraded_loads",
                st.degraded_loads >= unleased.max(degraded),
                format!(
                    "{} < {unleased} loads without a lease or {degraded} Degraded answers",
                    st.degraded_loads
                ),
            );
            expect(
                "coalesced",
                st.coalesced >= coalesced && st.coalesced <= coalesced + unknown,
                format!(
                    "{} outside [{coalesced}, {}]",
                    st.coalesced,
                    coalesced + unknown
                ),
            );
            expect(
                "hits",
                st.hits <= hits + unknown,
                format!("{} > {hits} Hit flights (+{unknown} unknown)", st.hits),
            );
            let refreshes = st.background_refreshes + st.early_refreshes;
            expect(
                "stale_served",
                st.stale_served >= stale && st.stale_served <= stale + unknown + refreshes,
                format!(
                    "{} outside [{stale}, {stale} + {unknown} unknown + {refreshes} refreshes]",
                    st.stale_served
                ),
            );
            expect(
                "backend_errors",
                st.backend_errors + err_unsure >= errors
                    && st.backend_errors <= errors + abandoned + marks_errors,
                format!(
                    "{} outside [{errors} delivered - {err_unsure} joined with a read of the marks dropped, + {abandoned} abandoned + {marks_errors} reads of the marks]",
                    st.backend_errors
                ),
            );
            expect(
                "waits",
                st.waits >= st.wait_timeouts,
                format!("{} waits < {} timeouts", st.waits, st.wait_timeouts),
            );
        }
    }
    /// The leases of instance `inst` won (`Won` delivered) and released in
    /// the background before their flight filled, extended or released
    /// them: perhaps never handed on (the call failed after all).
    fn given_back(&self, inst: usize) -> Vec<&str> {
        let mut used: HashSet<&str> = HashSet::new();
        let mut given_back = Vec::new();
        for rec in self.recs {
            let Ev::Delivered {
                inst: i,
                op,
                token: Some(token),
                task,
                ..
            } = &rec.ev
            else {
                continue;
            };
            let Some(lease) = self.leases.get(token).filter(|_| *i == inst) else {
                continue;
            };
            let own = lease.delivered.is_some_and(|d| d == *task);
            match op {
                BOp::Fill | BOp::Extend => {
                    used.insert(token);
                }
                BOp::Release if own => {
                    used.insert(token);
                }
                BOp::Release if lease.delivered.is_some() && !used.contains(token.as_str()) => {
                    given_back.push(token.as_str());
                }
                _ => {}
            }
        }
        given_back
    }

    /// Instance `inst`'s holders judged dead and frozen (a `watch_holder`
    /// that answered so, a watch that said so), and its takeovers: the
    /// leases a flight won by a take-over, or by an acquire made once the
    /// holder's lease had run out (as the flight's last `Held` said) with
    /// no notification since (a notified flight reads the key first: a
    /// `get` in its task).
    ///
    /// Also how many of those takeovers the cache may not count: the reads
    /// of the marks that judge the acquire's answer failed (the call fails,
    /// the lease goes back).
    /// And how many more it may count: won before the holder's lease ran
    /// out, but handed on after.
    fn liveness_counts(&self, inst: usize) -> (u64, u64, u64, u64, u64) {
        let taken_from_frozen = |holder: &str| {
            LeaseToken::from_stored(holder.as_bytes()).is_some_and(|t| t.is_taken_from_frozen())
        };
        let (mut dead, mut frozen, mut takeovers, mut unsure, mut maybe) = (0, 0, 0, 0, 0);
        let given_back: HashSet<&str> = self.given_back(inst).into_iter().collect();
        let mut pending: HashMap<Option<tokio::task::Id>, bool> = HashMap::new();
        let mut judged = |gone: &Gone| match gone {
            Gone::Dead => dead += 1,
            _ => frozen += 1,
        };
        // Per flight (its task): when the holder's lease runs out, and
        // whether a notification came since.
        let mut waits: HashMap<Option<tokio::task::Id>, (Duration, bool)> = HashMap::new();
        // A `Held` reaches the cache once the marks judged what it found
        // (the reads of them after it, in its task): the flight counts the
        // holder's lease from then. Kept with when it was delivered.
        let mut held_last: HashMap<Option<tokio::task::Id>, (Duration, Duration)> = HashMap::new();
        for (seq, rec) in self.recs.iter().enumerate() {
            // A read of the marks in a task ended: a `Held` just before it
            // reached the cache now, if the read was made for it (sent when
            // the `Held` came; a read sent later is the flight's next call's,
            // the read beside its next acquire, say). An abandoned read's
            // start is not logged: counted as the `Held`'s.
            let marks_read = match &rec.ev {
                Ev::Delivered {
                    inst: i,
                    op: BOp::ReadMarks,
                    task,
                    took,
                    ..
                } if *i == inst => Some((task, rec.t.saturating_sub(*took))),
                Ev::Abandoned {
                    inst: i,
                    op: BOp::ReadMarks,
                    task,
                    ..
                } if *i == inst => Some((task, Duration::ZERO)),
                _ => None,
            };
            if let Some((task, sent)) = marks_read {
                if let (Some((ttl, at)), Some(wait)) = (held_last.get(task), waits.get_mut(task)) {
                    if sent <= *at {
                        wait.0 = rec.t + *ttl;
                    }
                }
            }
            if let Ev::Delivered {
                inst: i, op, task, ..
            } = &rec.ev
            {
                if *i == inst && *op != BOp::ReadMarks {
                    held_last.remove(task);
                }
            }
            match &rec.ev {
                Ev::Delivered {
                    inst: i,
                    op,
                    reply,
                    token,
                    task,
                    ..
                } if *i == inst => match (op, reply) {
                    (BOp::ReadMarks, Reply::Err) => {
                        unsure += u64::from(pending.remove(task).is_some());
                    }
                    (BOp::ReadMarks, _) => {}
                    (BOp::Acquire | BOp::TakeOver, Reply::Held(ttl)) => {
                        waits.insert(*task, (rec.t + *ttl, false));
                        held_last.insert(*task, (*ttl, rec.t));
                    }
                    (BOp::Get, _) => {
                        if let Some(wait) = waits.get_mut(task) {
                            wait.1 = true;
                        }
                    }
                    (BOp::Acquire | BOp::TakeOver, Reply::Won) => {
                        // The cache decides when the answer reaches it,
                        // once the marks judged it: by then the holder's
                        // lease may have run out.
                        let reached = self.judged_by(seq, *task);
                        let wait = waits.remove(task);
                        let ran_out = wait.is_some_and(|(at, told)| !told && rec.t >= at);
                        let ran_out_late = wait.is_some_and(|(at, told)| !told && reached >= at);
                        maybe += u64::from(*op != BOp::TakeOver && ran_out_late && !ran_out);
                        let took = *op == BOp::TakeOver || ran_out;
                        takeovers += u64::from(took);
                        if took && token.as_deref().is_some_and(|t| given_back.contains(t)) {
                            unsure += 1;
                        } else if took {
                            pending.insert(*task, true);
                        }
                    }
                    (BOp::Watch, Reply::Judged(gone)) => judged(gone),
                    _ => {
                        pending.remove(task);
                    }
                },
                Ev::Abandoned {
                    inst: i,
                    op: BOp::ReadMarks,
                    task,
                    ..
                } if *i == inst => {
                    unsure += u64::from(pending.remove(task).is_some());
                }
                // The cache ignores (and does not count) a frozen verdict on
                // a holder that took its lease over from a frozen one.
                Ev::Verdict {
                    inst: i,
                    gone: Some(Gone::Frozen),
                    holder,
                    ..
                } if *i == inst && taken_from_frozen(holder) => {}
                Ev::Verdict {
                    inst: i,
                    gone: Some(gone),
                    ..
                } if *i == inst => judged(gone),
                _ => {}
            }
        }
        (dead, frozen, takeovers, unsure, maybe)
    }

    /// When the answer delivered at log entry `seq` in `task` reached the
    /// cache: after the reads of the marks that follow it in that task.
    fn judged_by(&self, seq: usize, task: Option<tokio::task::Id>) -> Duration {
        let mut reached = self.recs[seq].t;
        for rec in &self.recs[seq + 1..] {
            match &rec.ev {
                Ev::Delivered { op, task: t, .. } | Ev::Abandoned { op, task: t, .. }
                    if *t == task =>
                {
                    if *op != BOp::ReadMarks {
                        break;
                    }
                    reached = rec.t;
                }
                _ => {}
            }
        }
        reached
    }
}
