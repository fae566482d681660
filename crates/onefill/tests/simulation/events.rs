//! The log: what happened on the store, to the calls and to the loads, in
//! one total order; what every instance shares while it is written.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onefill::backend::{FillKeys, Gone};
use onefill::{BackendErrorKind, MemoryBackend, Outcome, Stats};
use tokio::time::Instant;

use crate::liveness::Liveness;
use crate::scenario::{ms, ForeignOp};
use crate::spans::LoadSpans;
use crate::tracking::Tracking;
use crate::variants::Variant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BOp {
    Get,
    Acquire,
    Fill,
    Release,
    Extend,
    Set,
    Invalidate,
    Expire,
    Subscribe,
    /// `watch_holder` (logged with the holder's token).
    Watch,
    /// `take_over`.
    TakeOver,
    /// `mark` (a tag's or the namespace's).
    Mark,
    /// `read_marks`.
    ReadMarks,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    Pass,
    Delay(Duration),
    Hang,
    Fail(BackendErrorKind),
    RunThenFail,
    RunThenHang,
    /// The command runs at once; its answer reaches the cache this long
    /// after (a reply's latency: the store may change meanwhile).
    LateReply(Duration),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotifyFault {
    Drop,
    Delay(Duration),
    Duplicate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    Won,
    /// Another token holds the lease, for this long still (as the holder's
    /// lease TTL the answer reported).
    Held(Duration),
    Fresh,
    True,
    False,
    Done,
    Err,
    /// `watch_holder`: the holder is alive (a watch follows).
    Alive,
    /// `watch_holder`: the holder is gone already.
    Judged(Gone),
    /// `watch_holder`: the lease no longer holds the holder's token.
    Moved,
    /// `watch_holder`: the holder cannot be watched.
    Unsupported,
    /// `read_marks`: the namespace's generation it read.
    Generation(u64),
}

/// Where a value (or a loader failure) comes from: load `n`, set `n`, or
/// the foreign writer's raw `SET` `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Origin {
    Load(u64),
    Set(u64),
    Foreign(u64),
}

/// How a value key changed on the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Written (a fill, an entry, a `set`, a raw `SET`).
    Write,
    /// Deleted (`invalidate`, a raw `DEL`).
    Delete,
    /// Its TTL changed (a raw `PEXPIRE`).
    Ttl,
    /// Its TTL cut to its grace by `expire` (or left, if stale already),
    /// which also writes the key's expiry into the value (as the Redis
    /// script does for a version-2 envelope): a one-`GET` hit reads it.
    Soft,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exec {
    Acquire {
        token: String,
        ttl: Duration,
        window: Duration,
        fresh_before: bool,
        reply: Reply,
    },
    /// An acquire in which a lease still holding `gone` (a holder judged
    /// gone) counts as free: `replaced` if it held it and was deleted.
    TakeOver {
        gone: String,
        replaced: bool,
        token: String,
        ttl: Duration,
        window: Duration,
        fresh_before: bool,
        reply: Reply,
    },
    Extend {
        token: String,
        ttl: Duration,
        ok: bool,
    },
    Fill {
        token: String,
        ok: bool,
        origin: Option<Origin>,
    },
    Release {
        token: String,
        ok: bool,
        entry: Option<Origin>,
    },
    Set {
        origin: Option<Origin>,
    },
    Invalidate,
    /// `expire`: the version the key holds after it (made stale in place,
    /// or stale already), if the fleet can read it; `None` if it was
    /// deleted (no grace, unreadable bytes) or missing.
    Expire {
        kept: Option<Origin>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallKind {
    Fetch,
    Get,
    Set,
    Invalidate,
    Expire,
    /// `invalidate_tag`, `expire_tag` or `clear` (the call's key is
    /// meaningless: a mark concerns the namespace).
    Mark(MarkOp),
}

/// A mark the fleet makes: a hard or soft one on tag `t<n>`, or a hard one
/// on the namespace (`clear`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MarkOp {
    pub(crate) hard: bool,
    /// The tag's number, or `None` for the namespace.
    pub(crate) tag: Option<u8>,
}

impl MarkOp {
    /// Whether this mark concerns a value carrying `tags` (a bit per tag).
    pub(crate) fn covers(self, tags: u8) -> bool {
        self.tag.is_none_or(|t| tags & (1 << t) != 0)
    }
}

/// The key under which the log records the calls of the marks (`read_marks`,
/// `mark`): none of the scenario's keys.
pub(crate) const MARKS_KEY: usize = usize::MAX;

#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Fetched {
        value: String,
        outcome: Outcome,
        coalesced: bool,
    },
    Got(Option<String>),
    Done,
    Failed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadEnd {
    Value,
    Error,
    /// Panicked, or dropped (aborted at the max load time).
    Gone,
}

/// One thing that happened. Some fields are there only for the log that
/// `replay` prints.
#[derive(Debug, Clone)]
#[allow(dead_code)]
pub(crate) enum Ev {
    CallStart {
        call: usize,
        inst: usize,
        key: usize,
        kind: CallKind,
        set_id: Option<u64>,
        rejected: u64,
    },
    CallEnd {
        call: usize,
        answer: Answer,
        rejected: u64,
        closed: bool,
        /// Answered from the L1 (see `run.rs`).
        l1: bool,
    },
    CallDropped {
        call: usize,
    },
    /// A loader started, for the flight running in task `flight`.
    LoadStart {
        load: u64,
        inst: usize,
        key: usize,
        flight: Option<tokio::task::Id>,
        /// The tags its value carries (a bit per tag `t<n>`).
        tags: u8,
    },
    LoadEnd {
        load: u64,
        end: LoadEnd,
    },
    Death {
        inst: usize,
    },
    Healthy,
    /// The queue of failed writes of every live instance is empty, once
    /// the healthy tail began (see `run.rs`).
    Drained,
    /// The final reads begin: every live instance reads every key
    /// (invariant 9).
    FinalReads,
    Entry {
        inst: usize,
        op: BOp,
        key: usize,
        token: Option<String>,
    },
    Fault {
        inst: usize,
        op: BOp,
        fault: Fault,
    },
    NotifyFault {
        inst: usize,
        fault: NotifyFault,
    },
    Exec {
        inst: usize,
        key: usize,
        exec: Exec,
    },
    /// A reply reached the cache, `took` after the call, in `task` (the
    /// tokio task that called).
    Delivered {
        inst: usize,
        op: BOp,
        key: usize,
        token: Option<String>,
        reply: Reply,
        took: Duration,
        task: Option<tokio::task::Id>,
    },
    /// A call timed out (or its caller was dropped) before it answered.
    Abandoned {
        inst: usize,
        op: BOp,
        key: usize,
        token: Option<String>,
        task: Option<tokio::task::Id>,
    },
    /// A value key changed on the store: what it holds now (the version,
    /// `None` for a value the fleet cannot read; and when the server drops
    /// it, since the run began), or nothing. `by`: the instance whose
    /// command changed it (`None`: another client).
    Value {
        key: usize,
        held: Option<(Option<Origin>, Duration)>,
        change: Change,
        by: Option<usize>,
    },
    /// Instance `inst` read a version of a value key: when the server
    /// drops it (`expires`, since the run began), and the expiry the read
    /// reported (`reported`: the TTL written in the value, on a read that
    /// reports that one).
    Read {
        inst: usize,
        key: usize,
        origin: Origin,
        expires: Duration,
        reported: Duration,
    },
    /// The foreign writer acted on a value key (its `Value` follows, if
    /// the key changed).
    Foreign {
        key: usize,
        op: ForeignOp,
        version: Option<u64>,
    },
    /// Instance `inst`'s `mark` ran on the store: `op` at `generation`.
    Marked {
        inst: usize,
        op: MarkOp,
        generation: u64,
    },
    /// Instance `inst`'s `read_marks` ran on the store and read the
    /// namespace's generation `generation`.
    MarksRead {
        inst: usize,
        generation: u64,
    },
    /// The first bytes of a version the fleet can read reached the store
    /// (or were sent to it): the generation it records as its age
    /// (`as_of`) and its tags (a bit per tag `t<n>`).
    Stamp {
        origin: Origin,
        as_of: u64,
        tags: u8,
    },
    /// Instance `inst`'s tracking connection is lost (`noticed`: the
    /// backend says at once that it is out of sync).
    TrackingLost {
        inst: usize,
        noticed: bool,
    },
    /// Instance `inst`'s tracking connection is back (`reset`, then in
    /// sync).
    TrackingBack {
        inst: usize,
    },
    /// A watch of the holder of token `holder` (on `key`), made by
    /// instance `inst`, ended: the holder judged gone (`Some`) or the
    /// signal lost (`None`). A `watch_holder` that answers the holder gone
    /// at once is a `Delivered` reply (`Reply::Judged`).
    Verdict {
        inst: usize,
        key: usize,
        holder: String,
        gone: Option<Gone>,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Rec {
    pub(crate) t: Duration,
    pub(crate) ev: Ev,
}

/// What every instance shares: the log, the id counters, the switches.
pub(crate) struct World {
    pub(crate) t0: Instant,
    pub(crate) log: Mutex<Vec<Rec>>,
    pub(crate) closed: AtomicBool,
    pub(crate) healthy: AtomicBool,
    pub(crate) dead: Vec<AtomicBool>,
    /// Per instance: its next backend call hangs (set by a caller about to
    /// make the breaker's half-open probe; see `run.rs`).
    pub(crate) hang_next: Vec<AtomicBool>,
    /// Per flight (the tokio task of its `acquire`s): whether its last
    /// `acquire` found a fresh value it could not read (another type), the
    /// one reason to ask for the lease regardless of a fresh value again.
    pub(crate) saw_unreadable: Mutex<std::collections::HashMap<tokio::task::Id, bool>>,
    /// Per flight: the value its last `acquire` answered fresh, if it did.
    pub(crate) fresh_answered: Mutex<std::collections::HashMap<tokio::task::Id, Vec<u8>>>,
    pub(crate) next_id: AtomicU64,
    pub(crate) next_call: AtomicUsize,
    pub(crate) variant: Variant,
    /// `FillKeys::value()` of each key (the probe key last).
    pub(crate) key_names: Vec<String>,
    pub(crate) final_stats: Mutex<Vec<Option<Stats>>>,
    pub(crate) load_spans: Arc<LoadSpans>,
    /// The shared store.
    pub(crate) store: MemoryBackend,
    /// Per key: the expiry written in its value (what a one-`GET` hit
    /// reports; a raw `PEXPIRE` leaves it as it was), since `t0`.
    pub(crate) written_expiry: Mutex<Vec<Option<Duration>>>,
    /// Per instance: backend calls entered (an answer given with none is
    /// not the backend's).
    pub(crate) entered: Vec<AtomicU64>,
    /// Per instance: the late reply drawn for the call under way (see
    /// `Injector::call`).
    pub(crate) late_reply: Vec<Mutex<Option<Duration>>>,
    /// Per instance: the store is unreachable (its tracking connection is
    /// lost with the rest: every call fails).
    pub(crate) unreachable: Vec<AtomicBool>,
    /// Per instance: when its latest reply arrives. Replies come in the
    /// order their commands ran (one connection's), so none overtakes a
    /// late one.
    pub(crate) reply_floor: Vec<Mutex<Instant>>,
    /// The change reports: tracking connections and own-process listeners.
    pub(crate) tracking: Tracking,
    /// The run is settling: no calls any more, the tracking connections
    /// stop confirming.
    pub(crate) settling: AtomicBool,
    /// Whether the store watches lease holders, and how it tells.
    pub(crate) liveness: Liveness,
    /// An instance to die this long into the next load it starts (see
    /// `Scenario::dies_in_load`).
    pub(crate) doomed: Mutex<Option<(usize, Duration)>>,
    /// The versions whose `Ev::Stamp` is logged.
    pub(crate) stamped: Mutex<std::collections::HashSet<Origin>>,
}

impl World {
    pub(crate) fn record(&self, ev: Ev) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let t = Instant::now() - self.t0;
        self.log.lock().unwrap().push(Rec { t, ev });
    }
    pub(crate) fn is_dead(&self, inst: usize) -> bool {
        self.dead[inst].load(Ordering::SeqCst)
    }
    /// Instance `inst` dies now.
    pub(crate) fn die(&self, inst: usize) {
        self.dead[inst].store(true, Ordering::SeqCst);
        self.record(Ev::Death { inst });
        self.liveness.died(inst);
    }
    pub(crate) fn key_of(&self, keys: &FillKeys) -> usize {
        self.key_names
            .iter()
            .position(|k| k == keys.value())
            .expect("a key of the scenario")
    }
    pub(crate) fn since_t0(&self) -> Duration {
        Instant::now() - self.t0
    }

    /// Logs the age and tags of the version in envelope `bytes`, the first
    /// time they are seen.
    pub(crate) fn stamp(&self, bytes: &[u8]) {
        let (Some(origin), Some((as_of, tags))) =
            (origin_of_envelope(bytes), marks_of_envelope(bytes))
        else {
            return;
        };
        if self.stamped.lock().unwrap().insert(origin) {
            self.record(Ev::Stamp {
                origin,
                as_of,
                tags,
            });
        }
    }

    /// The value key `key` changed on the store, by `by`'s command (or
    /// another client's): logs what it holds now, keeps the expiry written
    /// in it, and queues the change report on every tracking connection
    /// (the store's own synchronous reports reach no L1 here: see
    /// `tracking.rs`).
    pub(crate) fn value_changed(&self, key: usize, change: Change, by: Option<usize>) {
        let name = &self.key_names[key];
        let now = self.since_t0();
        let raw = self.store.get_raw(name);
        if let Some((bytes, _)) = &raw {
            self.stamp(bytes);
        }
        let held = raw.map(|(bytes, ttl)| (origin_of_envelope(&bytes), now + ttl));
        {
            let mut written = self.written_expiry.lock().unwrap();
            match change {
                Change::Write => written[key] = held.map(|(_, expires)| expires),
                Change::Soft if self.variant == Variant::ExpireUnstamped => {}
                Change::Soft => written[key] = held.map(|(_, expires)| expires),
                Change::Delete => written[key] = None,
                Change::Ttl => {}
            }
        }
        self.record(Ev::Value {
            key,
            held,
            change,
            by,
        });
        self.tracking.report(name);
    }
}

/// Parses the origin out of a value or an error message: the last
/// `/L<n>`, `/S<n>` or `/F<n>` in it.
pub(crate) fn origin_of(text: &str) -> Option<Origin> {
    let bytes = text.as_bytes();
    let mut found = None;
    for i in 0..bytes.len().saturating_sub(2) {
        if bytes[i] != b'/' || !matches!(bytes[i + 1], b'L' | b'S' | b'F') {
            continue;
        }
        let digits: String = text[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if let Ok(n) = digits.parse() {
            found = Some(match bytes[i + 1] {
                b'L' => Origin::Load(n),
                b'S' => Origin::Set(n),
                _ => Origin::Foreign(n),
            });
        }
    }
    found
}

/// The origin of stored envelope bytes (see `envelope.rs`: a 16-byte
/// header, for version 3 the marks block, then the payload).
pub(crate) fn origin_of_envelope(bytes: &[u8]) -> Option<Origin> {
    origin_of(&String::from_utf8_lossy(bytes.get(payload_at(bytes)?..)?))
}

/// Where the payload of envelope bytes (version 1 to 4) starts.
pub(crate) fn payload_at(bytes: &[u8]) -> Option<usize> {
    match bytes.get(1)? {
        1 => Some(16),
        2 => Some(24),
        3 | 4 => {
            let body = if bytes[1] == 3 { 16 } else { 24 };
            let mut at = body + 9;
            for _ in 0..*bytes.get(body + 8)? {
                at += 1 + usize::from(*bytes.get(at)?);
            }
            Some(at)
        }
        _ => None,
    }
}

/// The marks block of envelope bytes (version 3 or 4, see `envelope.rs`):
/// the generation the version records (`as_of`) and its tags, a bit per
/// tag `t<n>` (the scenario's tags). Versions 1 and 2 record none: as of
/// generation 0, untagged.
pub(crate) fn marks_of_envelope(bytes: &[u8]) -> Option<(u64, u8)> {
    let body = match bytes.get(1)? {
        1 | 2 => return Some((0, 0)),
        3 => 16,
        4 => 24,
        _ => return None,
    };
    let as_of = u64::from_be_bytes(bytes.get(body..body + 8)?.try_into().ok()?);
    let mut tags = 0u8;
    let mut at = body + 9;
    for _ in 0..*bytes.get(body + 8)? {
        let len = usize::from(*bytes.get(at)?);
        let tag = bytes.get(at + 1..at + 1 + len)?;
        if let Some(n) = tag
            .strip_prefix(b"t")
            .and_then(|n| std::str::from_utf8(n).ok()?.parse::<u8>().ok())
        {
            tags |= 1 << n;
        }
        at += 1 + len;
    }
    Some((as_of, tags))
}

/// The grace recorded in envelope bytes, if they are an envelope.
pub(crate) fn grace_of(bytes: &[u8]) -> Option<Duration> {
    if bytes.len() < 16 || bytes[0] != 0xF1 || !matches!(bytes[1], 1 | 3) || bytes[2] > 2 {
        return None;
    }
    let mut grace = [0u8; 8];
    grace.copy_from_slice(&bytes[4..12]);
    Some(ms(u64::from_be_bytes(grace)))
}
