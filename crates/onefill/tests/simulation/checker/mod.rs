//! The checker: replays the log into a model of each key's lease, then
//! checks the invariants (see the crate docs).

mod calls;
mod converged;
mod copies;
mod loads;
mod marks;
mod replay;
mod stats;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use onefill::backend::Gone;

use crate::events::{Answer, CallKind, Change, LoadEnd, MarkOp, Origin, Rec, World};
use crate::scenario::Scenario;

/// The invariants, numbered as in the crate docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Invariant {
    /// 1: one loader at a time, every duplicate explained and counted.
    OneLoader,
    /// 2: every caller answered within its bound.
    BoundedCallers,
    /// 3: leases end with their loads.
    LeasesEnd,
    /// 4: writes are final.
    WritesFinal,
    /// 5: the breaker is never stuck.
    Breaker,
    /// 6: the stats add up.
    Stats,
    /// 7: no answer outlives its value.
    ValueLife,
    /// 8: no copy (an L1 entry, the outage fallback's) outlives the server's.
    Copies,
    /// 9: writes that failed in an outage are replayed once it ends.
    Replayed,
    /// 10: marks are final.
    MarksFinal,
    /// 11: no reload loop: a value stored once its process must know a
    /// mark is not judged by it.
    NoReloadLoop,
}

/// A broken invariant, and what broke it.
#[derive(Debug, Clone)]
pub(crate) struct Violation {
    pub(crate) invariant: Invariant,
    pub(crate) what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{:?}] {}", self.invariant, self.what)
    }
}

/// How overlapping loads were explained, summed over seeds.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    seeds: u64,
    pub(crate) loads: u64,
    pub(crate) overlaps_expiry: u64,
    pub(crate) overlaps_revoked: u64,
    /// Overlaps explained by a takeover of the first load's lease (or of
    /// the second's, before its load started).
    pub(crate) overlaps_taken_over: u64,
    pub(crate) overlaps_degraded: u64,
    /// Of the overlaps above, those within one process.
    pub(crate) overlaps_in_process: u64,
    /// Overlaps explained by a lost lease that its holder counted.
    pub(crate) overlaps_counted: u64,
    pub(crate) degraded_loads: u64,
    pub(crate) faults: u64,
    pub(crate) deaths: u64,
    /// Leases won by a command whose reply was lost.
    pub(crate) lost_acquires: u64,
    /// Fills and releases by a lease's flight that failed or timed out.
    pub(crate) failed_ends: u64,
    /// Calls the breakers rejected.
    pub(crate) rejected: u64,
    /// Answers from an L1 (invariant 8 checks each).
    pub(crate) l1_answers: u64,
    /// Answers of a version the store no longer held during the call:
    /// copies, bounded by invariant 8.
    pub(crate) copies: u64,
    /// The foreign writer's ops that changed a key.
    pub(crate) foreign_changes: u64,
    pub(crate) tracking_losses: u64,
    /// Take-overs that replaced a gone holder's lease.
    pub(crate) takeovers: u64,
    /// Of those, the leases of live holders (judged wrongly).
    pub(crate) takeovers_of_live: u64,
    /// Watches that lost their signal.
    pub(crate) signals_lost: u64,
    /// Writes that failed for want of the store, checked by invariant 9.
    pub(crate) failed_writes: u64,
    /// Writes replayed (the instances' `writes_replayed`).
    pub(crate) replayed_writes: u64,
    /// Marks run on the store (`invalidate_tag`, `expire_tag`, `clear`).
    pub(crate) marks: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, o: &Tally) {
        self.seeds += o.seeds;
        self.loads += o.loads;
        self.overlaps_expiry += o.overlaps_expiry;
        self.overlaps_revoked += o.overlaps_revoked;
        self.overlaps_taken_over += o.overlaps_taken_over;
        self.overlaps_degraded += o.overlaps_degraded;
        self.overlaps_in_process += o.overlaps_in_process;
        self.overlaps_counted += o.overlaps_counted;
        self.degraded_loads += o.degraded_loads;
        self.faults += o.faults;
        self.deaths += o.deaths;
        self.lost_acquires += o.lost_acquires;
        self.failed_ends += o.failed_ends;
        self.rejected += o.rejected;
        self.l1_answers += o.l1_answers;
        self.copies += o.copies;
        self.foreign_changes += o.foreign_changes;
        self.tracking_losses += o.tracking_losses;
        self.takeovers += o.takeovers;
        self.takeovers_of_live += o.takeovers_of_live;
        self.signals_lost += o.signals_lost;
        self.failed_writes += o.failed_writes;
        self.replayed_writes += o.replayed_writes;
        self.marks += o.marks;
    }
}

#[derive(Debug, Clone)]
struct CallInfo {
    inst: usize,
    key: usize,
    kind: CallKind,
    set_id: Option<u64>,
    start: usize,
    start_t: Duration,
    rejected_start: u64,
    end: Option<(usize, Duration, Answer, u64, bool)>,
    dropped: bool,
    /// Answered from the L1.
    l1: bool,
}

/// A value key's state after a change on the store (see `Ev::Value`).
#[derive(Debug, Clone)]
struct ValueRec {
    t: Duration,
    held: Option<(Option<Origin>, Duration)>,
    change: Change,
    by: Option<usize>,
}

/// A read of a version by an instance (see `Ev::Read`).
#[derive(Debug, Clone)]
struct ReadRec {
    inst: usize,
    key: usize,
    t: Duration,
    origin: Origin,
    expires: Duration,
    reported: Duration,
}

#[derive(Debug, Clone)]
struct LoadInfo {
    id: u64,
    inst: usize,
    key: usize,
    start: usize,
    start_t: Duration,
    end: Option<(usize, Duration, LoadEnd)>,
    leased: Option<String>,
    /// The tags its value carries.
    tags: u8,
}

/// A mark that ran on the store (see `Ev::Marked`).
#[derive(Debug, Clone, Copy)]
struct MarkRec {
    seq: usize,
    t: Duration,
    inst: usize,
    op: MarkOp,
    generation: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseEnd {
    /// Filled or released by its holder.
    Own,
    Expired,
    /// Deleted by a `set` or `invalidate`.
    Revoked,
    /// Deleted by a take-over from a holder judged gone.
    TakenOver,
    /// Deleted by another token's release or fill.
    Foreign,
}

#[derive(Debug, Clone)]
struct LeaseInfo {
    inst: usize,
    key: usize,
    won_t: Duration,
    window: Duration,
    fresh_before: bool,
    /// `Won` reached the cache, in this task (the holder's flight).
    delivered: Option<Option<tokio::task::Id>>,
    /// Its holder was told it lost it: a fill or an extension answered
    /// "not yours", or a release by its flight did. A release answered so
    /// in a task of its own is a background release (after a lost acquire
    /// reply, a fill or release that failed or was never sent, or a dropped
    /// lease): the library ignores its answer, and it may well follow a
    /// fill that landed.
    told_lost: bool,
    used: bool,
    end: Option<(Duration, LeaseEnd)>,
}

struct Checker<'a> {
    s: &'a Scenario,
    recs: &'a [Rec],
    violations: Vec<Violation>,
    /// The invariant being checked, which a violation is filed under.
    checking: Invariant,
    tally: Tally,
    calls: BTreeMap<usize, CallInfo>,
    loads: Vec<LoadInfo>,
    load_index: HashMap<u64, usize>,
    leases: HashMap<String, LeaseInfo>,
    death: Option<(usize, usize, Duration)>,
    healthy: Option<Duration>,
    /// When every live instance's queue of failed writes was found empty.
    drained: Option<Duration>,
    /// The seq where the final reads begin.
    final_reads: Option<usize>,
    /// Per key: (seq, time, origin) of every set/invalidate/expire run on
    /// the store.
    writes: Vec<Vec<(usize, Duration, Option<Origin>)>>,
    /// Per key: (seq, origin) of every fill or entry that landed.
    landed: Vec<Vec<(usize, Origin)>>,
    set_exec: HashMap<u64, usize>,
    invalidate_execs: Vec<(usize, usize, usize)>,
    /// (instance, key, seq) of every `expire` run on the store.
    expire_execs: Vec<(usize, usize, usize)>,
    /// Per `expire` run on the store (its seq): the version it left on the
    /// store, stale (see `Exec::Expire`).
    expire_kept: HashMap<usize, Option<Origin>>,
    faults: Vec<Vec<Duration>>,
    held_replies: Vec<(usize, usize, Duration)>,
    /// (instance, key, time, how long it took) of every call that answered
    /// late, but within its timeout.
    slow_answers: Vec<(usize, usize, Duration, Duration)>,
    /// (instance, key, time, task, token) of every `Won` delivered.
    won_delivered: Vec<(usize, usize, Duration, Option<tokio::task::Id>, String)>,
    extends: Vec<(usize, Duration, String)>,
    /// (seq, instance, time, token) of every `Won` on the store.
    lost_replies: Vec<(usize, usize, Duration, String)>,
    /// (seq, instance, time, token) of every fill or release by a lease's
    /// flight that failed or timed out: unknown whether it landed.
    failed_ends: Vec<(usize, usize, Duration, String)>,
    /// (seq, instance, time, token) of every release sent.
    release_entries: Vec<(usize, usize, Duration, String)>,
    /// Per key: its states on the store, in order.
    values: Vec<Vec<ValueRec>>,
    reads: Vec<ReadRec>,
    /// Seq of each foreign version's raw `SET`.
    foreign_exec: HashMap<u64, usize>,
    /// Per instance: its tracking connection's losses (from, back).
    tracking_lost: Vec<Vec<(Duration, Option<Duration>)>>,
    /// (seq, instance, time, holder's token, verdict) of every holder
    /// judged gone, by a watch or a `watch_holder` answer, in the instance
    /// that watched.
    verdicts: Vec<(usize, usize, Duration, String, Gone)>,
    /// (seq, instance, key, time, gone token, whether it held the lease)
    /// of every take-over run on the store.
    takeovers: Vec<(usize, usize, usize, Duration, String, bool)>,
    /// Every mark run on the store, in order.
    marks: Vec<MarkRec>,
    /// The generation and tags each version records (see `Ev::Stamp`), and
    /// when they were first sent to the store.
    stamps: HashMap<Origin, (u64, u8, Duration)>,
    /// Per instance: when its reads of the marks failed or were dropped.
    marks_unread: Vec<Vec<Duration>>,
    /// Per instance: when its reads of the marks answered, and the
    /// generation each read.
    marks_learned: Vec<Vec<(Duration, u64)>>,
}

impl<'a> Checker<'a> {
    fn new(s: &'a Scenario, recs: &'a [Rec]) -> Self {
        Checker {
            s,
            recs,
            violations: Vec::new(),
            checking: Invariant::OneLoader,
            tally: Tally {
                seeds: 1,
                ..Tally::default()
            },
            calls: BTreeMap::new(),
            loads: Vec::new(),
            load_index: HashMap::new(),
            leases: HashMap::new(),
            death: None,
            healthy: None,
            drained: None,
            final_reads: None,
            writes: vec![Vec::new(); s.keys + 1],
            landed: vec![Vec::new(); s.keys + 1],
            set_exec: HashMap::new(),
            invalidate_execs: Vec::new(),
            expire_execs: Vec::new(),
            expire_kept: HashMap::new(),
            faults: vec![Vec::new(); s.instances],
            held_replies: Vec::new(),
            slow_answers: Vec::new(),
            won_delivered: Vec::new(),
            extends: Vec::new(),
            lost_replies: Vec::new(),
            failed_ends: Vec::new(),
            release_entries: Vec::new(),
            values: vec![Vec::new(); s.keys + 1],
            reads: Vec::new(),
            foreign_exec: HashMap::new(),
            tracking_lost: vec![Vec::new(); s.instances],
            verdicts: Vec::new(),
            takeovers: Vec::new(),
            marks: Vec::new(),
            stamps: HashMap::new(),
            marks_unread: vec![Vec::new(); s.instances],
            marks_learned: vec![Vec::new(); s.instances],
        }
    }

    fn fail(&mut self, what: String) {
        self.violations.push(Violation {
            invariant: self.checking,
            what,
        });
    }

    fn dead_before(&self, inst: usize, seq: usize) -> bool {
        self.death.is_some_and(|(i, at, _)| i == inst && at < seq)
    }

    fn is_dead(&self, inst: usize) -> bool {
        self.death.is_some_and(|(i, _, _)| i == inst)
    }

    fn origin_seq(&self, origin: Origin) -> Option<usize> {
        match origin {
            Origin::Load(id) => self.load_index.get(&id).map(|&i| self.loads[i].start),
            Origin::Set(id) => self.set_exec.get(&id).copied(),
            Origin::Foreign(id) => self.foreign_exec.get(&id).copied(),
        }
    }

    /// When a load stopped running: its end, its process's death, or its
    /// max load time (the library has aborted it by then, even if the drop
    /// is processed a moment later).
    fn load_running_at(&self, l: &LoadInfo, seq: usize, t: Duration) -> bool {
        l.start < seq
            && l.end.is_none_or(|(end, _, _)| end > seq)
            && !self.dead_before(l.inst, seq)
            && t < l.start_t + self.s.max_load_time
    }
}

/// Replays a run's log and checks every invariant: the violations, and how
/// the run's overlapping loads were explained.
pub(crate) fn check(s: &Scenario, world: &World) -> (Vec<Violation>, Tally) {
    let recs = world.log.lock().unwrap().clone();
    let stats = world.final_stats.lock().unwrap().clone();
    let mut c = Checker::new(s, &recs);
    c.replay();
    c.tally.deaths = u64::from(c.death.is_some());
    c.checking = Invariant::OneLoader;
    c.check_loads();
    c.check_takeovers();
    c.checking = Invariant::BoundedCallers;
    c.check_bounds();
    c.checking = Invariant::LeasesEnd;
    c.check_leases();
    c.checking = Invariant::WritesFinal;
    c.check_writes();
    c.checking = Invariant::ValueLife;
    c.check_ages();
    c.checking = Invariant::Copies;
    c.check_copies();
    c.checking = Invariant::Breaker;
    c.check_breaker();
    c.checking = Invariant::Stats;
    c.check_stats(&stats);
    c.checking = Invariant::Replayed;
    c.check_converged(&stats);
    c.checking = Invariant::MarksFinal;
    c.check_marks();
    c.checking = Invariant::NoReloadLoop;
    c.check_reloads();
    c.tally.replayed_writes = stats.iter().flatten().map(|s| s.writes_replayed).sum();
    (c.violations, c.tally)
}
