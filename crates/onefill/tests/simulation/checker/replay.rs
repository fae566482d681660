//! Replaying the log: the calls, the loads, and each key's lease as the
//! store saw it.

use std::collections::HashMap;
use std::time::Duration;

use super::{CallInfo, Checker, LeaseEnd, LeaseInfo, LoadInfo, MarkRec, ReadRec, ValueRec};
use crate::events::{BOp, Ev, Exec, Origin, Reply};

impl Checker<'_> {
    pub(super) fn replay(&mut self) {
        // Per key: the live lease (token, expiry).
        let mut lock: Vec<Option<(String, Duration)>> = vec![None; self.s.keys + 1];
        // Per task: the token of its last call answered or dropped, other
        // than reads of the marks, if it was an acquire that won.
        let mut last_call: HashMap<tokio::task::Id, &str> = HashMap::new();
        let recs = self.recs;
        for (seq, rec) in recs.iter().enumerate() {
            let t = rec.t;
            match &rec.ev {
                Ev::CallStart {
                    call,
                    inst,
                    key,
                    kind,
                    set_id,
                    rejected,
                } => {
                    self.calls.insert(
                        *call,
                        CallInfo {
                            inst: *inst,
                            key: *key,
                            kind: *kind,
                            set_id: *set_id,
                            start: seq,
                            start_t: t,
                            rejected_start: *rejected,
                            end: None,
                            dropped: false,
                            l1: false,
                        },
                    );
                }
                Ev::CallEnd {
                    call,
                    answer,
                    rejected,
                    closed,
                    l1,
                } => {
                    if let Some(c) = self.calls.get_mut(call) {
                        c.end = Some((seq, t, answer.clone(), *rejected, *closed));
                        c.l1 = *l1;
                    }
                }
                Ev::CallDropped { call } => {
                    if let Some(c) = self.calls.get_mut(call) {
                        c.dropped = true;
                    }
                }
                Ev::LoadStart {
                    load,
                    inst,
                    key,
                    flight,
                    tags,
                } => {
                    // Leased: a `Won` was delivered to the flight that
                    // started the load at this very instant (the flight
                    // starts its loader at once), or was its last call
                    // but for reads of the marks (the cache judges an
                    // acquire's answer and reads the generation its load
                    // records before it hands the lease on: they take
                    // time), and no load started under it yet. The lease
                    // may already be gone (a write elsewhere may run
                    // between the answer and the loader's first poll).
                    let last_call = flight.and_then(|f| last_call.get(&f).copied());
                    let leased = self
                        .won_delivered
                        .iter()
                        .rev()
                        .find(|(i, k, at, task, token)| {
                            *i == *inst
                                && *k == *key
                                && (*at == t || last_call == Some(token.as_str()))
                                // Released already: the call failed after
                                // all (the reads of the marks that judge
                                // its answer timed it out), and the lease
                                // went back in the background.
                                && !self
                                    .release_entries
                                    .iter()
                                    .any(|(_, _, _, released)| released == token)
                                && flight.is_some()
                                && task == flight
                                && !self.leases[token].used
                        })
                        .map(|(_, _, _, _, token)| token.clone());
                    if let Some(token) = &leased {
                        if let Some(lease) = self.leases.get_mut(token) {
                            lease.used = true;
                        }
                    }
                    self.load_index.insert(*load, self.loads.len());
                    self.loads.push(LoadInfo {
                        id: *load,
                        inst: *inst,
                        key: *key,
                        start: seq,
                        start_t: t,
                        end: None,
                        leased,
                        tags: *tags,
                    });
                }
                Ev::LoadEnd { load, end } => {
                    if let Some(&i) = self.load_index.get(load) {
                        self.loads[i].end = Some((seq, t, *end));
                    }
                }
                Ev::Death { inst } => self.death = Some((*inst, seq, t)),
                Ev::Healthy => self.healthy = Some(t),
                Ev::Drained => self.drained = Some(t),
                Ev::FinalReads => self.final_reads = Some(seq),
                Ev::Entry {
                    inst,
                    op: BOp::Release,
                    token: Some(token),
                    ..
                } => self.release_entries.push((seq, *inst, t, token.clone())),
                Ev::Entry { .. } => {}
                Ev::Fault { inst, .. } | Ev::NotifyFault { inst, .. } => {
                    self.faults[*inst].push(t);
                    self.tally.faults += 1;
                }
                Ev::Delivered {
                    inst,
                    op,
                    key,
                    token,
                    reply,
                    took,
                    task,
                } => {
                    match (op, reply) {
                        (BOp::ReadMarks, Reply::Err) => self.marks_unread[*inst].push(t),
                        (BOp::ReadMarks, Reply::Generation(g)) => {
                            self.marks_learned[*inst].push((t, *g));
                        }
                        _ => {}
                    }
                    if let (Some(task), true) = (task, *op != BOp::ReadMarks) {
                        match (op, reply, token) {
                            (BOp::Acquire | BOp::TakeOver, Reply::Won, Some(token)) => {
                                last_call.insert(*task, token.as_str());
                            }
                            _ => {
                                last_call.remove(task);
                            }
                        }
                    }
                    let acquire = matches!(op, BOp::Acquire | BOp::TakeOver);
                    if acquire && matches!(reply, Reply::Held(_)) {
                        self.held_replies.push((*inst, *key, t));
                    }
                    if let (BOp::Watch, Reply::Judged(gone), Some(holder)) = (op, reply, token) {
                        self.verdicts.push((seq, *inst, t, holder.clone(), *gone));
                    }
                    let on_a_flights_path = *op != BOp::Extend;
                    if on_a_flights_path && *reply != Reply::Err && !took.is_zero() {
                        self.slow_answers.push((*inst, *key, t, *took));
                    }
                    let Some((token, lease)) = token
                        .as_ref()
                        .and_then(|tk| Some((tk, self.leases.get_mut(tk)?)))
                    else {
                        continue;
                    };
                    match (op, reply) {
                        (BOp::Acquire | BOp::TakeOver, Reply::Won) => {
                            lease.delivered = Some(*task);
                            self.won_delivered
                                .push((*inst, *key, t, *task, token.clone()));
                        }
                        (BOp::Extend | BOp::Fill, Reply::False) => lease.told_lost = true,
                        (BOp::Release, Reply::False) if lease.delivered == Some(*task) => {
                            lease.told_lost = true;
                        }
                        (BOp::Fill | BOp::Release, Reply::Err)
                            if lease.delivered == Some(*task) =>
                        {
                            self.failed_ends.push((seq, *inst, t, token.clone()));
                        }
                        _ => {}
                    }
                }
                Ev::Abandoned {
                    inst,
                    op: BOp::Fill | BOp::Release,
                    token: Some(token),
                    task,
                    ..
                } if self
                    .leases
                    .get(token)
                    .is_some_and(|l| l.delivered == Some(*task)) =>
                {
                    self.failed_ends.push((seq, *inst, t, token.clone()));
                }
                Ev::Abandoned {
                    inst,
                    op: BOp::ReadMarks,
                    ..
                } => self.marks_unread[*inst].push(t),
                Ev::Abandoned { task, .. } => {
                    if let Some(task) = task {
                        last_call.remove(task);
                    }
                }
                Ev::Value {
                    key,
                    held,
                    change,
                    by,
                } => {
                    self.tally.foreign_changes += u64::from(by.is_none());
                    self.values[*key].push(ValueRec {
                        t,
                        held: *held,
                        change: *change,
                        by: *by,
                    });
                }
                Ev::Read {
                    inst,
                    key,
                    origin,
                    expires,
                    reported,
                } => self.reads.push(ReadRec {
                    inst: *inst,
                    key: *key,
                    t,
                    origin: *origin,
                    expires: *expires,
                    reported: *reported,
                }),
                Ev::Marked {
                    inst,
                    op,
                    generation,
                } => self.marks.push(MarkRec {
                    seq,
                    t,
                    inst: *inst,
                    op: *op,
                    generation: *generation,
                }),
                Ev::MarksRead { .. } => {}
                Ev::Stamp {
                    origin,
                    as_of,
                    tags,
                } => {
                    self.stamps.insert(*origin, (*as_of, *tags, t));
                }
                Ev::Foreign {
                    version: Some(id), ..
                } => {
                    self.foreign_exec.insert(*id, seq);
                }
                Ev::Foreign { .. } => {}
                Ev::TrackingLost { inst, .. } => {
                    self.tally.tracking_losses += 1;
                    self.tracking_lost[*inst].push((t, None));
                }
                Ev::TrackingBack { inst } => {
                    if let Some(last) = self.tracking_lost[*inst].last_mut() {
                        last.1 = Some(t);
                    }
                }
                Ev::Verdict {
                    inst, holder, gone, ..
                } => match gone {
                    Some(gone) => self.verdicts.push((seq, *inst, t, holder.clone(), *gone)),
                    None => self.tally.signals_lost += 1,
                },
                Ev::Exec { inst, key, exec } => {
                    let slot = &mut lock[*key];
                    expire(slot, t, &mut self.leases);
                    self.exec(seq, t, *inst, *key, exec, slot);
                }
            }
        }
    }

    fn exec(
        &mut self,
        seq: usize,
        t: Duration,
        inst: usize,
        key: usize,
        exec: &Exec,
        slot: &mut Option<(String, Duration)>,
    ) {
        let end_current = |slot: &mut Option<(String, Duration)>,
                           leases: &mut HashMap<String, LeaseInfo>,
                           how: LeaseEnd| {
            if let Some((token, _)) = slot.take() {
                if let Some(lease) = leases.get_mut(&token) {
                    lease.end = Some((t, how));
                }
            }
        };
        match exec {
            Exec::Acquire {
                token,
                ttl,
                window,
                fresh_before,
                reply,
            } => {
                let won = (token, *ttl, *window, *fresh_before);
                self.acquired(t, inst, key, won, *reply, slot, false);
            }
            Exec::TakeOver {
                gone,
                replaced,
                token,
                ttl,
                window,
                fresh_before,
                reply,
            } => {
                // The gone holder's lease is deleted if it still holds
                // that token, then the acquire runs.
                let holds = slot.as_ref().is_some_and(|(held, _)| held == gone);
                if holds != *replaced {
                    self.fail(format!(
                        "checker: take-over of k{key} at {t:?}: store replaced {replaced}, model {holds}"
                    ));
                }
                if holds {
                    end_current(slot, &mut self.leases, LeaseEnd::TakenOver);
                }
                self.takeovers
                    .push((seq, inst, key, t, gone.clone(), holds));
                let won = (token, *ttl, *window, *fresh_before);
                self.acquired(t, inst, key, won, *reply, slot, true);
            }
            Exec::Extend { token, ttl, ok } => {
                let holds = slot.as_ref().is_some_and(|(held, _)| held == token);
                if *ok != holds {
                    self.fail(format!(
                        "checker: extend of k{key} at {t:?}: store said {ok}, model {holds}"
                    ));
                }
                if *ok {
                    *slot = Some((token.clone(), t + *ttl));
                    self.extends.push((seq, t, token.clone()));
                }
            }
            Exec::Fill { token, ok, origin } => {
                if *ok {
                    let how = ended_by(slot, token);
                    end_current(slot, &mut self.leases, how);
                    if how == LeaseEnd::Foreign {
                        // The fill's own token never held: record its lease
                        // as ended too, so it is not mistaken for live.
                        if let Some(lease) = self.leases.get_mut(token) {
                            lease.end.get_or_insert((t, LeaseEnd::Own));
                        }
                    }
                    match origin {
                        Some(o) => self.landed[key].push((seq, *o)),
                        None => self.fail(format!("a fill of k{key} at {t:?} without an origin")),
                    }
                }
            }
            Exec::Release { token, ok, entry } => {
                if *ok {
                    let how = ended_by(slot, token);
                    end_current(slot, &mut self.leases, how);
                    if let Some(o) = entry {
                        self.landed[key].push((seq, *o));
                    }
                }
            }
            Exec::Set { origin } => {
                if let Some(Origin::Load(id)) = origin {
                    self.fail(format!(
                        "a load's value written unfenced: L{id} of k{key} stored by a plain SET at {t:?} (a load stores only by a fill under its lease)"
                    ));
                }
                end_current(slot, &mut self.leases, LeaseEnd::Revoked);
                if let Some(Origin::Set(id)) = origin {
                    self.set_exec.entry(*id).or_insert(seq);
                }
                self.writes[key].push((seq, t, *origin));
            }
            Exec::Invalidate => {
                end_current(slot, &mut self.leases, LeaseEnd::Revoked);
                self.invalidate_execs.push((inst, key, seq));
                self.writes[key].push((seq, t, None));
            }
            Exec::Expire { kept } => {
                end_current(slot, &mut self.leases, LeaseEnd::Revoked);
                self.expire_execs.push((inst, key, seq));
                self.expire_kept.insert(seq, *kept);
                self.writes[key].push((seq, t, None));
            }
        }
        // Acquire replies whose answer never reached the cache are checked
        // once the whole log is known (see `check_leases`).
        if let Exec::Acquire {
            token,
            reply: Reply::Won,
            ..
        }
        | Exec::TakeOver {
            token,
            reply: Reply::Won,
            ..
        } = exec
        {
            self.lost_replies.push((seq, inst, t, token.clone()));
        }
    }

    /// An acquire ran (or a take-over, after its deletion of the gone
    /// holder's lease): a lease `won` with (token, TTL, refresh window,
    /// whether the value was fresh before) if the store answered `Won`.
    /// A take-over that won over another token's lease deleted that
    /// lease: only a broken variant does.
    #[allow(clippy::too_many_arguments)]
    fn acquired(
        &mut self,
        t: Duration,
        inst: usize,
        key: usize,
        (token, ttl, window, fresh_before): (&String, Duration, Duration, bool),
        reply: Reply,
        slot: &mut Option<(String, Duration)>,
        taking_over: bool,
    ) {
        match reply {
            Reply::Won => {
                if let Some((held, _)) = slot.take() {
                    if taking_over {
                        if let Some(lease) = self.leases.get_mut(&held) {
                            lease.end = Some((t, LeaseEnd::Foreign));
                        }
                    } else {
                        self.fail(format!(
                            "checker: store granted a lease on k{key} at {t:?} while the model has one"
                        ));
                    }
                }
                *slot = Some((token.clone(), t + ttl));
                self.leases.insert(
                    token.clone(),
                    LeaseInfo {
                        inst,
                        key,
                        won_t: t,
                        window,
                        fresh_before,
                        delivered: None,
                        told_lost: false,
                        used: false,
                        end: None,
                    },
                );
            }
            Reply::Held(_) if slot.is_none() => self.fail(format!(
                "checker: store answered Held on k{key} at {t:?} with no lease in the model"
            )),
            _ => {}
        }
    }
}

/// How a fill or release by `token` that took effect ends the live lease:
/// its own, or another's (only the broken variants do that).
fn ended_by(slot: &Option<(String, Duration)>, token: &str) -> LeaseEnd {
    if slot.as_ref().is_some_and(|(held, _)| held == token) {
        LeaseEnd::Own
    } else {
        LeaseEnd::Foreign
    }
}

/// Ends the lease in `slot` if it expired by `t` (the store drops a lease
/// at its expiry instant).
fn expire(
    slot: &mut Option<(String, Duration)>,
    t: Duration,
    leases: &mut HashMap<String, LeaseInfo>,
) {
    if let Some((token, expires)) = slot {
        if *expires <= t {
            if let Some(lease) = leases.get_mut(token) {
                lease.end = Some((*expires, LeaseEnd::Expired));
            }
            *slot = None;
        }
    }
}
