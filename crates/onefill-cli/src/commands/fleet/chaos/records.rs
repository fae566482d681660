//! What a chaos run records, in the units the checker compares: every time
//! is Unix microseconds. A worker's times come from its own clock
//! (`SystemTime`), the foreign client's observations from the server's
//! `TIME`; on one machine they are the same clock, and `--clock-skew-ms`
//! covers the difference between machines.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use super::version::Held;

/// Now on this machine's clock, Unix microseconds (0 before 1970).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One call of a worker and its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// Index of the key in the run's keys.
    pub key: u32,
    /// When the call started and when it answered (worker clock).
    pub start: u64,
    pub end: u64,
    /// The outcome's name (`hit`, `loaded`, …; `error`).
    pub outcome: String,
    /// Whether the L1 answered (the cache's `l1_hits` grew during the
    /// call; a worker makes one call at a time).
    pub l1: bool,
    /// The answered value's version (`None`: an error, or a value that
    /// names none).
    pub version: Option<String>,
}

/// One load a worker ran (the loader's own start and end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Load {
    pub key: u32,
    pub version: String,
    pub start: u64,
    pub end: u64,
}

/// What one chaos worker reports (one JSON line).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChaosWorkerReport {
    pub pid: u32,
    pub answers: Vec<Answer>,
    pub loads: Vec<Load>,
    /// Calls that failed, and the first few messages.
    pub errors: u64,
    pub error_messages: Vec<String>,
    /// The cache's counters at the end.
    pub stats: Option<onefill::Stats>,
}

/// What the key held at the server's `TIME` `t`, with its `PTTL` (ms;
/// -1 no expiry, -2 no key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub t: u64,
    pub held: Held,
    pub pttl_ms: i64,
}

/// What the foreign client did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// A new version written through a cache of the parent's own (no L1).
    Set,
    /// `DEL`.
    Del,
    /// `PEXPIRE` to a short TTL.
    Pexpire,
    /// `PERSIST`.
    Persist,
    /// `SET` of bytes no cache can read, with a short TTL.
    Unreadable,
}

/// One foreign operation on one key. A raw one is a script that reads the
/// key, acts, reads it again and returns the server's `TIME`: `before`
/// and `after` are the same instant on either side of the act. A `Set`
/// goes through onefill between two such reads (`before` and `after` are
/// then two instants), and its `version` is the one it wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForeignOp {
    pub key: u32,
    pub kind: OpKind,
    /// When the client sent the operation and when it had the answer
    /// (parent clock).
    pub sent: u64,
    pub returned: u64,
    pub before: Option<Observation>,
    pub after: Option<Observation>,
    /// Whether the act changed the key (the command's own reply: `DEL`,
    /// `PEXPIRE`, `PERSIST` of a key that was there; a `Set` that
    /// succeeded; an unreadable `SET`, always).
    pub changed: bool,
    /// `PEXPIRE`'s TTL, `Unreadable`'s TTL (ms).
    pub ttl_ms: Option<u64>,
    /// `Set`: the version written.
    pub version: Option<String>,
    /// Why the act failed (it may still have happened).
    pub error: Option<String>,
}

/// Something the parent did to a cluster during the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterEvent {
    /// Milliseconds after the start.
    pub at_ms: f64,
    pub what: String,
}
