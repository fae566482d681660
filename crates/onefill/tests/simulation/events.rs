//! The log: what happened on the store, to the calls and to the loads, in
//! one total order; what every instance shares while it is written.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onefill::backend::FillKeys;
use onefill::{BackendErrorKind, Outcome, Stats};
use tokio::time::Instant;

use crate::scenario::ms;
use crate::spans::LoadSpans;
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
    Subscribe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    Pass,
    Delay(Duration),
    Hang,
    Fail(BackendErrorKind),
    RunThenFail,
    RunThenHang,
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
    Held,
    Fresh,
    True,
    False,
    Done,
    Err,
}

/// Where a value (or a loader failure) comes from: load `n` or set `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Origin {
    Load(u64),
    Set(u64),
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallKind {
    Fetch,
    Get,
    Set,
    Invalidate,
}

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
    },
    LoadEnd {
        load: u64,
        end: LoadEnd,
    },
    Death {
        inst: usize,
    },
    Healthy,
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
    pub(crate) next_id: AtomicU64,
    pub(crate) next_call: AtomicUsize,
    pub(crate) variant: Variant,
    /// `FillKeys::value()` of each key (the probe key last).
    pub(crate) key_names: Vec<String>,
    pub(crate) final_stats: Mutex<Vec<Option<Stats>>>,
    pub(crate) load_spans: Arc<LoadSpans>,
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
    pub(crate) fn key_of(&self, keys: &FillKeys) -> usize {
        self.key_names
            .iter()
            .position(|k| k == keys.value())
            .expect("a key of the scenario")
    }
}

/// Parses the origin out of a value or an error message: the last
/// `/L<n>` or `/S<n>` in it.
pub(crate) fn origin_of(text: &str) -> Option<Origin> {
    let bytes = text.as_bytes();
    let mut found = None;
    for i in 0..bytes.len().saturating_sub(2) {
        if bytes[i] != b'/' || !matches!(bytes[i + 1], b'L' | b'S') {
            continue;
        }
        let digits: String = text[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if let Ok(n) = digits.parse() {
            found = Some(if bytes[i + 1] == b'L' {
                Origin::Load(n)
            } else {
                Origin::Set(n)
            });
        }
    }
    found
}

/// The origin of stored envelope bytes (see `envelope.rs`: a 16-byte
/// header, then the payload).
pub(crate) fn origin_of_envelope(bytes: &[u8]) -> Option<Origin> {
    origin_of(&String::from_utf8_lossy(bytes.get(16..)?))
}

/// The grace recorded in envelope bytes, if they are an envelope.
pub(crate) fn grace_of(bytes: &[u8]) -> Option<Duration> {
    if bytes.len() < 16 || bytes[0] != 0xF1 || bytes[1] != 1 || bytes[2] > 2 {
        return None;
    }
    let mut grace = [0u8; 8];
    grace.copy_from_slice(&bytes[4..12]);
    Some(ms(u64::from_be_bytes(grace)))
}
