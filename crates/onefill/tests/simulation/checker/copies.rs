//! Invariant 8: no copy outlives the server's (decision 0014). A process
//! keeps two kinds of copies of a value, the L1 entry and the outage
//! fallback's; an answer from either must be of a version the server still
//! holds, give or take how late the server's change report may come (a
//! push while the tracking connection is up, the L1's sync bound when it
//! is not), or, for the fallback, the version's expiry as the server had
//! it when the instance last read or wrote it, and never after a change of
//! the key the instance heard of (its tracking up). An answer read from the
//! backend is of a version the server held while the call ran.

use std::time::Duration;

use super::{Checker, ReadRec};
use crate::events::{origin_of, Answer, Change, Origin};
use crate::scenario::{PUSH_DELAY_MAX, TICK};

/// One version's life on the store: from its write (or a TTL change) to
/// its overwrite, deletion, next TTL change or expiry.
#[derive(Debug, Clone, Copy)]
struct Life {
    origin: Origin,
    from: Duration,
    to: Duration,
    /// Ended by a change of the key (reported to every tracking instance),
    /// not by its expiry (never reported).
    changed: bool,
}

impl Checker<'_> {
    /// Per key, every version's lives, from the store's states in order.
    fn lives(&self) -> Vec<Vec<Life>> {
        self.values
            .iter()
            .map(|states| {
                let mut lives = Vec::new();
                let mut open: Option<Life> = None;
                for state in states {
                    if let Some(mut life) = open.take() {
                        life.changed = state.t < life.to;
                        life.to = life.to.min(state.t);
                        lives.push(life);
                    }
                    if let Some((Some(origin), expires)) = state.held {
                        open = Some(Life {
                            origin,
                            from: state.t,
                            to: expires,
                            changed: false,
                        });
                    }
                }
                lives.extend(open);
                lives
            })
            .collect()
    }

    /// Whether `inst` may have missed a change report between `gone` and
    /// `t`: its tracking connection was lost meanwhile (or just before, with
    /// the report on its way), or it died (its connection fell silent).
    fn tracking_unsure(&self, inst: usize, gone: Duration, t: Duration) -> bool {
        let died = self.death.is_some_and(|(i, _, at)| i == inst && at <= t);
        died || self.tracking_lost[inst]
            .iter()
            .any(|&(from, back)| from <= t && back.is_none_or(|back| back + PUSH_DELAY_MAX >= gone))
    }

    /// The furthest expiry of `origin` (of `key`) as the server had it when
    /// `inst` read or wrote it before `t`: how long its outage fallback may
    /// keep it. A backend object that tracks the fleet's keys reads the
    /// server's TTL; one that does not (no L1) may read the TTL written in
    /// the value (the one-`GET` hit), a documented limit.
    fn kept_until(&self, inst: usize, key: usize, origin: Origin, t: Duration) -> Option<Duration> {
        let tracked = self.s.l1;
        let reads = self
            .reads
            .iter()
            .filter(|r: &&ReadRec| r.inst == inst && r.key == key && r.origin == origin && r.t <= t)
            .map(|r| if tracked { r.expires } else { r.reported });
        let writes = self.values[key].iter().filter_map(|v| match v.held {
            Some((Some(o), expires))
                if o == origin && v.change == Change::Write && v.by == Some(inst) && v.t <= t =>
            {
                Some(expires)
            }
            _ => None,
        });
        reads.chain(writes).max()
    }

    pub(super) fn check_copies(&mut self) {
        let lives = self.lives();
        let push_bound = PUSH_DELAY_MAX + TICK;
        let sync_bound = self.s.sync_bound + TICK;
        let round_trip = self.s.backend_timeout + TICK;
        let calls: Vec<_> = self.calls.iter().map(|(id, c)| (*id, c.clone())).collect();
        for (id, c) in calls {
            let Some((_, t, answer, _, _)) = &c.end else {
                continue;
            };
            let t = *t;
            let (value, coalesced) = match answer {
                Answer::Fetched {
                    value, coalesced, ..
                } => (value.as_str(), *coalesced),
                Answer::Got(Some(value)) => (value.as_str(), false),
                _ => continue,
            };
            let Some(origin) = origin_of(value) else {
                continue;
            };
            let of: Vec<Life> = lives[c.key]
                .iter()
                .filter(|l| l.origin == origin && l.from <= t)
                .copied()
                .collect();
            let call = format!(
                "call {id} ({:?} of k{} in instance {}, started {:?}) answered {origin:?} at {t:?}",
                c.kind, c.key, c.inst, c.start_t
            );
            if c.l1 {
                self.tally.l1_answers += 1;
                let Some(gone) = of.iter().map(|l| l.to).max() else {
                    self.fail(format!(
                        "an L1 copy of a value the store never held: {call} from the L1"
                    ));
                    continue;
                };
                let unsure = self.tracking_unsure(c.inst, gone, t);
                let bound = if unsure { sync_bound } else { push_bound };
                if t > gone + bound {
                    let why = if unsure {
                        "the sync bound (tracking was lost)"
                    } else {
                        "a change report's delay"
                    };
                    self.fail(format!(
                        "an L1 copy outlived the server's: {call} from the L1; the server dropped it at {gone:?}, more than {why} {bound:?} before"
                    ));
                }
                continue;
            }
            if of.is_empty() {
                // Never stored (a degraded load's): invariant 7's business.
                continue;
            }
            // Read while the call ran (a coalesced call shares a flight's
            // read from before it).
            let since = if coalesced { Duration::ZERO } else { c.start_t };
            if of.iter().any(|l| l.to >= since) {
                continue;
            }
            // Not on the store while the call ran: the outage fallback's
            // copy, which lives by the expiry the server reported, and, in
            // an instance with an L1, gives way to a change the instance
            // heard of before the call (its tracking up from the change to
            // the call's start, the report's delay past).
            self.tally.copies += 1;
            let last = of.iter().max_by_key(|l| l.to).copied();
            if let Some(last) = last.filter(|l| self.s.l1 && l.changed && !coalesced) {
                let heard = last.to + push_bound;
                if heard < c.start_t && !self.tracking_unsure(c.inst, last.to, c.start_t) {
                    self.fail(format!(
                        "a fallback copy of a version whose change the instance had heard of: {call}; the key changed at {:?}, reported by {heard:?}",
                        last.to
                    ));
                    continue;
                }
            }
            let kept = self.kept_until(c.inst, c.key, origin, t);
            if kept.is_none_or(|kept| t > kept + round_trip) {
                let gone = of.iter().map(|l| l.to).max().unwrap_or_default();
                self.fail(format!(
                    "a fallback copy outlived the server's: {call}, not on the store since {gone:?}; the furthest expiry the server had for it when this instance read or wrote it: {kept:?} (+ one round trip {round_trip:?})"
                ));
            }
        }
    }
}
