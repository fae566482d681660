//! Writes that failed while the backend was out of reach, kept and replayed
//! in order once it answers again, so that the fleet converges
//! (decision 0017).
//!
//! A `set` or `invalidate` whose command may not have run (a transport
//! error, an open circuit, a timeout, its caller's future dropped mid-way)
//! still returns its error; the process forgets the key at once, and the
//! write waits here to be replayed **as an invalidation**: a replayed `set`
//! of an old value could overwrite a newer write another process made
//! meanwhile, while deleting sends the fleet back to the source of truth at
//! the cost of one load. And the invalidation deletes only a value written
//! before the write it replays began
//! ([`Backend::invalidate_older_than`](crate::backend::Backend::invalidate_older_than)):
//! a value written since, by anyone, is newer than that write, and a
//! replay after an outage must not wipe out what the fleet wrote
//! meanwhile. The queue keeps the newest write per target (a key
//! now; a tag or the namespace are a variant of [`Write`] and of
//! [`Target`] each), is bounded (its oldest entry goes first, counted and
//! logged in summary), and lives in memory: a process that dies loses it.
//!
//! One task per cache drains it, spawned by the first write queued and
//! ending when the queue is empty or the cache is gone (it holds the cache
//! weakly, and strongly only during a round of replays). It replays front
//! first, writes of distinct keys a few at a time (see [`drain`]), and
//! retries with the jittered backoff every retry uses, through `calls.rs`
//! like every backend call (the cache's backend timeout, its circuit
//! breaker, its counters and spans). A replay the server refuses (a
//! `Command` or `Protocol` error) is dropped, logged and counted, since
//! retrying it would meet the same refusal.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;
use std::time::Duration;

use futures_util::future::join_all;
use parking_lot::Mutex;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{FillKeys, MarkKind};
use crate::backoff::Backoff;
use crate::calls::Calls;
use crate::error::BackendError;
use crate::stats::Recorder;

/// The first pause before a replay after the backend failed.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest pause between two attempts (±25 %): once the backend
/// answers again, the queue starts draining within this (plus whatever is
/// left of an open circuit's `open_for`).
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(1);
/// The most writes replayed together (see [`drain`]).
const MAX_WIDTH: usize = 32;
/// At most one log line about dropped writes per this window (an outage
/// must not become a log storm); the others are summed into it.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// What a queued write touches: the queue keeps the newest write per
/// target.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Target {
    /// One key of the cache (the user's key).
    Key(String),
    /// A mark (its backend key: a tag's, or the namespace's), hard or soft:
    /// a later expiry does not replace a queued invalidation.
    Mark { key: String, hard: bool },
}

/// A write to replay.
#[derive(Debug, Clone)]
pub(crate) enum Write {
    /// Delete a key's value and lease (a failed `invalidate`, or a failed
    /// `set`: its value is not replayed, see the module docs), unless the
    /// value was written after the write `began` (by anyone: it is newer).
    Invalidate {
        key: String,
        keys: FillKeys,
        began: Instant,
    },
    /// Record a mark (a failed `invalidate_tag`, `expire_tag` or `clear`):
    /// as the call would have, with a generation of the replay's time, so
    /// it judges every value written before it (those written during the
    /// outage too: one reload each, never a value left unjudged).
    Mark {
        gen_key: String,
        mark_key: String,
        kind: MarkKind,
        retention: Option<Duration>,
        /// Keys in the marks' slot, for the shard's breaker.
        slot: FillKeys,
    },
}

impl Write {
    /// What it touches.
    pub(crate) fn target(&self) -> Target {
        match self {
            Write::Invalidate { key, .. } => Target::Key(key.clone()),
            Write::Mark { mark_key, kind, .. } => Target::Mark {
                key: mark_key.clone(),
                hard: *kind == MarkKind::Hard,
            },
        }
    }

    /// Whether it is replayed on its own, not together with the writes
    /// around it. Writes of one key each touch distinct keys (the queue
    /// keeps one per key), so no order among them can be observed; a write
    /// of many keys (a tag, the namespace) must stay between those queued
    /// before and after it.
    fn alone(&self) -> bool {
        match self {
            Write::Invalidate { .. } => false,
            Write::Mark { .. } => true,
        }
    }

    /// Its name in logs and spans.
    fn op(&self) -> &'static str {
        match self {
            Write::Invalidate { .. } => "invalidate",
            Write::Mark { .. } => "mark",
        }
    }

    /// Replays it through the host's calls, then has the host forget what
    /// it remembers of what the write touched.
    async fn replay(&self, host: &dyn Host, timeout: Duration) -> Result<(), BackendError> {
        let calls = host.calls();
        match self {
            Write::Invalidate { key, keys, began } => {
                let invalidate = calls.backend.invalidate_older_than(keys, began.elapsed());
                match calls.call(keys, timeout, "invalidate", invalidate).await {
                    // It ran; only its replication is in doubt, and
                    // sending it again would not settle that.
                    Err(e) if !e.is_not_replicated() => return Err(e),
                    Ok(false) => tracing::debug!(
                        key = keys.value(),
                        "a replayed invalidation kept a value written after the write it replays"
                    ),
                    _ => {}
                }
                host.replayed(key, keys);
            }
            Write::Mark {
                gen_key,
                mark_key,
                kind,
                retention,
                slot,
            } => {
                let mark = calls.backend.mark(gen_key, mark_key, *kind, *retention);
                let generation = match calls.call(slot, timeout, "mark", mark).await {
                    Ok(generation) => generation,
                    // It ran, at a generation not known here: the host
                    // reads the generation again before it is used.
                    Err(e) if e.is_not_replicated() => 0,
                    Err(e) => return Err(e),
                };
                host.marked(mark_key, generation);
            }
        }
        Ok(())
    }
}

/// What the replay task needs of its cache (implemented by the cache's
/// shared state, which this layer does not import).
pub(crate) trait Host: Send + Sync + 'static {
    /// The way to the backend.
    fn calls(&self) -> &Calls;
    /// The cache's queue.
    fn replays(&self) -> &Replays;
    /// The replay of a write of `key` landed: what this process remembers
    /// of the key goes (its L1 entry, its outage fallback's value: read
    /// while the delete was pending, it must not outlive it here; its
    /// flights).
    fn replayed(&self, key: &str, keys: &FillKeys);
    /// The replay of a mark landed, at `generation` (0: not known, it ran
    /// without enough replicas confirming it): what this process keeps of
    /// the namespace's values goes.
    fn marked(&self, mark_key: &str, generation: u64);
}

/// One cache's queue of writes to replay.
pub(crate) struct Replays {
    state: Mutex<State>,
    /// Write tickets and queue positions, from one counter (see
    /// [`Replays::landed`]).
    next: AtomicU64,
    capacity: usize,
    /// Each replay's timeout (the cache's backend timeout).
    timeout: Duration,
    recorder: Recorder,
}

#[derive(Default)]
struct State {
    /// The writes in the order they are replayed, by position.
    queue: BTreeMap<u64, Write>,
    /// The position of each target's write.
    positions: HashMap<Target, u64>,
    /// A task drains the queue.
    draining: bool,
    /// Writes dropped (the queue full) since the last log line about it.
    unlogged_drops: u64,
    last_log: Option<Instant>,
}

impl Replays {
    /// A queue of at most `capacity` writes (0: nothing is queued), each
    /// replayed within `timeout`.
    pub(crate) fn new(capacity: usize, timeout: Duration, recorder: Recorder) -> Self {
        Replays {
            state: Mutex::default(),
            next: AtomicU64::new(0),
            capacity,
            timeout,
            recorder,
        }
    }

    /// A ticket for a write that starts now: a write that lands takes the
    /// place of the queued writes of its target queued before its ticket.
    pub(crate) fn ticket(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// How many writes wait to be replayed.
    pub(crate) fn len(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Queues `write` at the back, in the place of any queued write of its
    /// target, and starts the task that drains the queue if none runs
    /// (`host` makes its handle on the cache). Over capacity, the oldest
    /// write is dropped: its values had the longest time to expire anyway.
    pub(crate) fn push(&self, write: Write, host: impl FnOnce() -> Weak<dyn Host>) {
        if self.capacity == 0 {
            return;
        }
        let position = self.ticket();
        let mut state = self.state.lock();
        let before = state.queue.len();
        if let Some(older) = state.positions.insert(write.target(), position) {
            state.queue.remove(&older);
        }
        state.queue.insert(position, write);
        self.recorder.write_queued();
        while state.queue.len() > self.capacity {
            let Some((_, oldest)) = state.queue.pop_first() else {
                break;
            };
            state.positions.remove(&oldest.target());
            self.recorder.write_dropped();
            state.unlogged_drops += 1;
            self.log_drops(&mut state, false);
        }
        self.recorder.writes_pending(before, state.queue.len());
        if state.draining {
            return;
        }
        // Without a runtime (a write dropped after its runtime shut down)
        // nothing can drain the queue now: the next write queued in one
        // starts the task.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            state.draining = true;
            runtime.spawn(drain(host(), self.timeout));
        }
    }

    /// A write of `target` with `ticket` landed: a write of that target
    /// queued before the ticket was drawn is done with (the write that
    /// landed replaced or deleted what it would have deleted).
    pub(crate) fn landed(&self, target: &Target, ticket: u64) {
        let mut state = self.state.lock();
        if state.queue.is_empty() {
            return;
        }
        if let Some(&position) = state.positions.get(target) {
            if position < ticket {
                state.positions.remove(target);
                state.queue.remove(&position);
                self.recorder
                    .writes_pending(state.queue.len() + 1, state.queue.len());
            }
        }
    }

    /// The writes to replay next: up to `width` from the front, as long as
    /// each may go with the others ([`Write::alone`]); none, the task then
    /// ending (under the lock: a write queued after this starts a new one).
    fn next_or_stop(&self, width: usize) -> Vec<(u64, Write)> {
        let mut state = self.state.lock();
        let mut next: Vec<(u64, Write)> = Vec::new();
        for (&position, write) in &state.queue {
            let alone = write.alone() || next.first().is_some_and(|(_, w)| w.alone());
            if next.len() == width || (alone && !next.is_empty()) {
                break;
            }
            next.push((position, write.clone()));
        }
        if next.is_empty() {
            state.draining = false;
            self.log_drops(&mut state, true);
        }
        next
    }

    /// The write at `position` is done with (replayed, or refused): off
    /// the queue, unless a newer write of its target took its place.
    fn remove(&self, position: u64, write: &Write) {
        let mut state = self.state.lock();
        if state.queue.remove(&position).is_some() {
            state.positions.remove(&write.target());
            self.recorder
                .writes_pending(state.queue.len() + 1, state.queue.len());
        }
    }

    /// Logs the writes dropped since the last line, at most once per
    /// [`LOG_EVERY`] unless `now` (the queue drained: the summary).
    fn log_drops(&self, state: &mut State, now: bool) {
        if state.unlogged_drops == 0 {
            return;
        }
        let at = Instant::now();
        if !now && state.last_log.is_some_and(|last| at - last < LOG_EVERY) {
            return;
        }
        tracing::warn!(
            dropped = state.unlogged_drops,
            capacity = self.capacity,
            "failed writes dropped unreplayed, the replay queue being full: other processes \
             may answer the values they replaced until those expire"
        );
        state.unlogged_drops = 0;
        state.last_log = Some(at);
    }
}

impl Drop for Replays {
    fn drop(&mut self) {
        let state = self.state.get_mut();
        if !state.queue.is_empty() {
            tracing::warn!(
                pending = state.queue.len(),
                "cache dropped with failed writes not replayed yet: other processes may answer \
                 the values they replaced until those expire"
            );
            self.recorder.writes_pending(state.queue.len(), 0);
        }
    }
}

/// Drains `host`'s queue in order: after a pause, replays its writes,
/// front first, until one fails for want of the backend, then pauses
/// longer (the backoff), until the queue is empty or the cache is gone.
///
/// Writes of distinct keys are sent together, up to a width that starts at
/// one after every pause (the first replay may be the circuit's half-open
/// probe, which admits one call) and doubles with each round that landed:
/// one at a time, 10,000 writes would take 10,000 round trips.
async fn drain(host: Weak<dyn Host>, timeout: Duration) {
    let mut backoff = Backoff::new(FIRST_RETRY, MAX_RETRY);
    loop {
        tokio::time::sleep(backoff.next_interval()).await;
        let mut width = 1;
        loop {
            // Strong only for one round: the cache's handles all gone, the
            // queue goes with it and the task ends here.
            let Some(host) = host.upgrade() else {
                return;
            };
            let replays = host.replays();
            let round = replays.next_or_stop(width);
            if round.is_empty() {
                return;
            }
            let replayed = join_all(round.iter().map(|(_, write)| {
                let span = tracing::debug_span!("onefill.replay", op = write.op());
                write.replay(&*host, timeout).instrument(span)
            }))
            .await;
            let mut out_of_reach = false;
            for ((position, write), replayed) in round.iter().zip(replayed) {
                match replayed {
                    Ok(()) => {
                        replays.remove(*position, write);
                        replays.recorder.write_replayed();
                    }
                    Err(refused) if !refused.is_transient() => {
                        replays.remove(*position, write);
                        replays.recorder.write_refused();
                        tracing::warn!(
                            op = write.op(),
                            target = ?write.target(),
                            %refused,
                            "a failed write's replay was refused by the backend: dropped"
                        );
                    }
                    // Still out of reach: later, in the same order.
                    Err(_) => out_of_reach = true,
                }
            }
            if out_of_reach {
                break;
            }
            backoff.reset();
            width = (width * 2).min(MAX_WIDTH);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalidate(key: &str) -> Write {
        Write::Invalidate {
            key: key.to_owned(),
            keys: FillKeys::new("t", key),
            began: Instant::now(),
        }
    }

    fn queued(replays: &Replays) -> Vec<Target> {
        let state = replays.state.lock();
        state.queue.values().map(Write::target).collect()
    }

    fn no_host() -> Weak<dyn Host> {
        unreachable!("no runtime in these tests: no task is spawned")
    }

    fn key(k: &str) -> Target {
        Target::Key(k.to_owned())
    }

    #[test]
    fn the_newest_write_of_a_key_takes_its_place_at_the_back() {
        let replays = Replays::new(10, Duration::from_millis(1), Recorder::new("t"));
        for k in ["a", "b", "a", "c"] {
            replays.push(invalidate(k), no_host);
        }
        assert_eq!(queued(&replays), [key("b"), key("a"), key("c")]);
        let stats = replays.recorder.snapshot();
        assert_eq!((stats.writes_queued, stats.writes_dropped), (4, 0));
    }

    #[test]
    fn over_capacity_the_oldest_goes_and_is_counted() {
        let replays = Replays::new(2, Duration::from_millis(1), Recorder::new("t"));
        for k in ["a", "b", "c", "d"] {
            replays.push(invalidate(k), no_host);
        }
        assert_eq!(queued(&replays), [key("c"), key("d")]);
        assert_eq!(replays.recorder.snapshot().writes_dropped, 2);
        // The dropped key's slot is free: queued again, at the back.
        replays.push(invalidate("a"), no_host);
        assert_eq!(queued(&replays), [key("d"), key("a")]);
    }

    #[test]
    fn a_write_that_lands_retires_only_the_writes_queued_before_it_started() {
        let replays = Replays::new(10, Duration::from_millis(1), Recorder::new("t"));
        let early = replays.ticket();
        replays.push(invalidate("a"), no_host);
        replays.push(invalidate("b"), no_host);
        let late = replays.ticket();
        // Started before "a" failed: which of the two ran last is unknown.
        replays.landed(&key("a"), early);
        assert_eq!(queued(&replays), [key("a"), key("b")]);
        replays.landed(&key("a"), late);
        assert_eq!(queued(&replays), [key("b")]);
        assert_eq!(replays.len(), 1);
    }

    #[test]
    fn a_round_takes_the_front_of_the_queue_up_to_its_width() {
        let replays = Replays::new(10, Duration::from_millis(1), Recorder::new("t"));
        for k in ["a", "b", "c"] {
            replays.push(invalidate(k), no_host);
        }
        let round = |width| -> Vec<Target> {
            let next = replays.next_or_stop(width);
            next.iter().map(|(_, w)| w.target()).collect()
        };
        assert_eq!(round(1), [key("a")]);
        assert_eq!(round(2), [key("a"), key("b")]);
        assert_eq!(round(32), [key("a"), key("b"), key("c")]);
    }

    #[test]
    fn a_capacity_of_zero_queues_nothing() {
        let replays = Replays::new(0, Duration::from_millis(1), Recorder::new("t"));
        replays.push(invalidate("a"), no_host);
        assert_eq!(replays.len(), 0);
        assert_eq!(replays.recorder.snapshot().writes_queued, 0);
    }
}
