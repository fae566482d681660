//! The last value this process saw per key, kept for backend outages only.
//!
//! When the backend fails, a flight cannot read the stale value stored
//! there. Rather than sending every flight to the origin for the length of
//! the outage, the cache serves the last value it answered for the key, no
//! longer than the server would have kept it (the remaining TTL it reported
//! when the value was read, or the TTL it was written with; never renewed
//! by serving it from here). It is not a read cache (healthy
//! reads always go to the backend, so invalidations are never missed); it is
//! bounded by a capacity and recorded once per flight, not per caller.
//!
//! Every entry carries the write epoch of the cache at the moment its value
//! was read or loaded (see `Shared::epoch`). `set` and `invalidate` record
//! (or tombstone) the key with a newer epoch however their write ends, so a
//! flight that started before them can never put back what they replaced.
//!
//! With an L1, the backend's change reports reach the fallback too (see
//! `coherence.rs`): a key another writer changed gives up its value, a
//! flight that read before a reported change does not record, and a reset
//! (changes went unreported for a while) forgets everything. So what the
//! fallback answers in an outage was, as far as this process heard, still
//! the server's when the outage began.
//!
//! `record` runs once per flight answer, hits included, so it sits on the
//! hit path: the entries live in a `quick_cache` (sharded locks, O(1)
//! CLOCK-Pro eviction, no global mutex). A record takes one shard's lock
//! once for a key already kept (the epoch check and the replacement happen
//! under it), twice for a new key (`entry` leaves a placeholder, then the
//! value is inserted), and clones the value once, into an `Arc` (the map's
//! own clones of an entry are that `Arc`'s). Eviction is the cache's:
//! keys recorded again (the ones being used) stay, others go first; entries
//! past their usefulness are not swept, they are evicted like the others.
//! A tombstone evicted while still needed raises a floor epoch (the
//! `Lifecycle::on_evict` hook, under the evicting shard's lock) below which
//! no value is recorded; the floor is read again under the key's shard lock
//! before a value goes in, so an eviction racing a record is seen by it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quick_cache::sync::{Cache, EntryAction, EntryResult};
use quick_cache::{DefaultHashBuilder, Lifecycle, UnitWeighter};
use tokio::time::Instant;

type Entries<V> = Cache<String, Arc<Entry<V>>, UnitWeighter, DefaultHashBuilder, RaiseFloor>;

#[derive(Debug)]
pub(crate) struct Fallback<V> {
    /// `None` when the capacity is 0 (turned off).
    entries: Option<Entries<V>>,
    /// The newest epoch of a tombstone evicted while still needed: values
    /// read or loaded before it are not recorded, since the key they belong
    /// to may be the one it guarded. Only grows.
    floor: Arc<AtomicU64>,
}

/// An entry [`Fallback::record`] kept, to be taken back by identity.
pub(crate) struct Kept<V>(Arc<Entry<V>>);

#[derive(Debug)]
struct Entry<V> {
    /// `None`: a tombstone left by `invalidate` (never served).
    value: Option<Option<V>>,
    usable_until: Instant,
    epoch: u64,
}

impl<V> Entry<V> {
    /// A value (not a tombstone) read or loaded before the floor.
    fn below(&self, floor: &AtomicU64) -> bool {
        self.value.is_some() && self.epoch < floor.load(Ordering::Acquire)
    }
}

/// The eviction hook: an evicted tombstone still in force raises the floor.
#[derive(Debug, Clone)]
struct RaiseFloor(Arc<AtomicU64>);

impl<V> Lifecycle<String, Arc<Entry<V>>> for RaiseFloor {
    type RequestState = ();

    fn begin_request(&self) -> Self::RequestState {}

    fn on_evict(&self, _: &mut Self::RequestState, _: String, evicted: Arc<Entry<V>>) {
        if evicted.value.is_none() && evicted.usable_until > Instant::now() {
            self.0.fetch_max(evicted.epoch, Ordering::AcqRel);
        }
    }
}

impl<V> Fallback<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        let floor = Arc::new(AtomicU64::new(0));
        let entries = (capacity > 0).then(|| {
            Cache::with(
                capacity,
                capacity as u64,
                UnitWeighter,
                DefaultHashBuilder::default(),
                RaiseFloor(floor.clone()),
            )
        });
        Fallback { entries, floor }
    }

    /// Forgets the key's value as of `epoch` (after an `invalidate`), and
    /// keeps a tombstone until `until` so older flights cannot record it.
    pub(crate) fn forget(&self, key: &str, until: Instant, epoch: u64) {
        if let Some(entries) = &self.entries {
            let _ = self.put(entries, key, None, until, epoch);
        }
    }

    /// Another writer changed the key (the backend reported it): a value
    /// kept for it goes (a tombstone of this process's `invalidate` stays).
    /// Nothing takes its place: a flight that read before the report and
    /// records after it is refused by the L1's ticket instead (see
    /// `coherence.rs`), so the write epoch, and with it a hit's check for
    /// a value already kept, is left alone.
    pub(crate) fn forget_kept(&self, key: &str) {
        if let Some(entries) = &self.entries {
            entries.remove_if(key, |entry| entry.value.is_some());
        }
    }

    /// Takes back what [`record`](Self::record) kept, if it is still
    /// there (not what a later record replaced it with).
    pub(crate) fn take_back(&self, key: &str, kept: Kept<V>) {
        if let Some(entries) = &self.entries {
            entries.remove_if(key, |entry| Arc::ptr_eq(entry, &kept.0));
        }
    }

    /// Forgets everything, and refuses what flights that started before
    /// `epoch` would record: the backend lost track of changes for a while.
    pub(crate) fn forget_all_before(&self, epoch: u64) {
        self.floor.fetch_max(epoch, Ordering::AcqRel);
        if let Some(entries) = &self.entries {
            entries.clear();
        }
    }

    fn put(
        &self,
        entries: &Entries<V>,
        key: &str,
        value: Option<Option<V>>,
        usable_until: Instant,
        epoch: u64,
    ) -> Option<Kept<V>> {
        let mut new = Some(Arc::new(Entry {
            value,
            usable_until,
            epoch,
        }));
        // Under the key's shard lock: keep a newer write, else replace (the
        // old entry is dropped after the lock is released).
        let mut inserted = None;
        let kept = entries.entry(key, None, |_, old| {
            let entry = new.as_ref().expect("the callback runs at most once");
            if old.epoch > entry.epoch || entry.below(&self.floor) {
                return EntryAction::Retain(None);
            }
            EntryAction::Retain(new.take().map(|entry| {
                inserted = Some(Kept(entry.clone()));
                std::mem::replace(old, entry)
            }))
        });
        match kept {
            EntryResult::Retained(replaced) => drop(replaced),
            // The key had no entry: the shard holds a placeholder for it
            // until the guard inserts or is dropped (a `put` of the same key
            // meanwhile waits for it, then compares epochs as above). Its
            // tombstone, if it had one, was evicted before the placeholder
            // was placed, under the same lock: the floor it raised is seen.
            EntryResult::Vacant(slot) => {
                if let Some(entry) = new.take().filter(|new| !new.below(&self.floor)) {
                    inserted = Some(Kept(entry.clone()));
                    let _ = slot.insert(entry);
                }
            }
            // Removals, replacement guards and timeouts are never asked for.
            EntryResult::Removed(..) | EntryResult::Replaced(..) | EntryResult::Timeout => {}
        }
        inserted
    }
}

/// Two reads of one stored value see its expiry this close (the server's
/// TTL is in whole milliseconds).
const SAME_EXPIRY: std::time::Duration = std::time::Duration::from_millis(2);

impl<V: Clone> Fallback<V> {
    /// Remembers `value`, read or loaded at `epoch`, until `usable_until`
    /// (counted from when it was read or loaded, never renewed by serving
    /// it). Ignored if a newer write of the key is already recorded.
    /// What it kept, if it kept anything (see [`take_back`](Self::take_back)).
    pub(crate) fn record(
        &self,
        key: &str,
        value: &Option<V>,
        usable_until: Instant,
        epoch: u64,
    ) -> Option<Kept<V>> {
        let entries = self.entries.as_ref()?;
        // The floor only grows: a value below it now is below it for good
        // (checked again under the lock), and is not even cloned.
        if epoch < self.floor.load(Ordering::Acquire) {
            return None;
        }
        // Another hit on the value already kept (same write epoch, the same
        // expiry on the server within a rounding): nothing to copy. Every
        // hit passes here; a value changed elsewhere has the expiry of its
        // own write, so it is recorded.
        if let Some(old) = entries.peek(key) {
            let same_expiry = if old.usable_until > usable_until {
                old.usable_until - usable_until
            } else {
                usable_until - old.usable_until
            } < SAME_EXPIRY;
            if old.epoch == epoch && old.value.is_some() && same_expiry {
                return None;
            }
        }
        self.put(entries, key, Some(value.clone()), usable_until, epoch)
    }

    /// The key's last value, if still usable.
    pub(crate) fn get(&self, key: &str) -> Option<Option<V>> {
        let entry = self.entries.as_ref()?.get(key)?;
        if entry.usable_until <= Instant::now() {
            return None;
        }
        entry.value.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn in_secs(n: u64) -> Instant {
        Instant::now() + Duration::from_secs(n)
    }

    /// Whether the key has an entry (a value or a tombstone, usable or not).
    fn holds(fb: &Fallback<i32>, key: &str) -> bool {
        fb.entries.as_ref().unwrap().peek(key).is_some()
    }

    /// Records (twice each, so they count as used) other keys until `key`
    /// is evicted: which entry goes first is the cache's policy.
    fn evict(fb: &Fallback<i32>, key: &str, epoch: u64) {
        for i in 0..1000 {
            let other = format!("other-{i}");
            fb.record(&other, &Some(-1), in_secs(10), epoch);
            // Another expiry: a new read of a new value (the same one again
            // would be skipped, and not count as used).
            fb.record(&other, &Some(-1), in_secs(11), epoch);
            if !holds(fb, key) {
                return;
            }
        }
        panic!("{key} was never evicted");
    }

    /// A hit on the value already kept copies nothing; a value with
    /// another expiry (a new write) replaces it.
    #[tokio::test(start_paused = true)]
    async fn the_same_value_is_recorded_once() {
        let fb = Fallback::new(10);
        let until = in_secs(10);
        fb.record("k", &Some(1), until, 0);
        fb.record("k", &Some(2), until + Duration::from_millis(1), 0);
        assert_eq!(fb.get("k"), Some(Some(1)), "the same stored value: skipped");
        fb.record("k", &Some(3), in_secs(20), 0);
        assert_eq!(fb.get("k"), Some(Some(3)), "a new write: recorded");
        fb.record("k", &Some(4), in_secs(20), 1);
        assert_eq!(fb.get("k"), Some(Some(4)), "a newer epoch: recorded");
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_and_time_limited() {
        let fb = Fallback::new(2);
        fb.record("a", &Some(1), in_secs(10), 0);
        fb.record("b", &Some(2), in_secs(5), 0);
        fb.record("c", &Some(3), in_secs(10), 0);
        let kept = ["a", "b", "c"].iter().filter(|k| holds(&fb, k)).count();
        assert_eq!(kept, 2, "one entry was evicted to stay within the capacity");
        assert_eq!(fb.get("c"), Some(Some(3)), "a new record is always kept");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(fb.get("c"), None, "too old to serve");
        let off = Fallback::new(0);
        off.record("a", &Some(1), in_secs(10), 0);
        assert_eq!(off.get("a"), None);
    }

    /// Bounded with several shards too: never more entries than the
    /// capacity rounded up to a whole number per shard.
    #[tokio::test(start_paused = true)]
    async fn bounded_under_many_keys() {
        let capacity = 1000;
        let fb = Fallback::new(capacity);
        for i in 0..20_000 {
            fb.record(&i.to_string(), &Some(i), in_secs(10), 0);
        }
        let entries = fb.entries.as_ref().unwrap();
        let shards = entries.num_shards();
        assert!(shards > 1, "{shards} shard(s)");
        assert!(
            entries.len() < capacity + shards,
            "{} entries for a capacity of {capacity} over {shards} shards",
            entries.len()
        );
        assert_eq!(fb.get("19999"), Some(Some(19999)));
    }

    /// Regression: a flight that started before an
    /// `invalidate` recorded its value after it.
    #[tokio::test(start_paused = true)]
    async fn an_older_flight_cannot_undo_a_newer_write() {
        let fb = Fallback::new(10);
        fb.forget("k", in_secs(60), 2);
        fb.record("k", &Some(1), in_secs(10), 1);
        assert_eq!(fb.get("k"), None, "the invalidated value stays out");
        fb.record("k", &Some(3), in_secs(10), 3);
        assert_eq!(fb.get("k"), Some(Some(3)), "newer reads are recorded");
    }

    /// Regression: a tombstone evicted by the capacity
    /// let the older flight it guarded against record its value.
    #[tokio::test(start_paused = true)]
    async fn an_evicted_tombstone_still_keeps_older_values_out() {
        let fb = Fallback::new(2);
        fb.forget("k", in_secs(1), 5);
        evict(&fb, "k", 6);
        assert_eq!(fb.floor.load(Ordering::Relaxed), 5);
        fb.record("k", &Some(0), in_secs(10), 4);
        assert_eq!(fb.get("k"), None, "a value from before the invalidate");
        fb.record("k", &Some(9), in_secs(10), 8);
        assert_eq!(fb.get("k"), Some(Some(9)));
    }

    /// A tombstone past its `until` (every flight that could undo it is
    /// over) guards nothing: evicting it does not raise the floor.
    #[tokio::test(start_paused = true)]
    async fn an_expired_tombstone_leaves_the_floor_alone() {
        let fb = Fallback::new(2);
        fb.forget("k", in_secs(1), 5);
        tokio::time::advance(Duration::from_secs(2)).await;
        evict(&fb, "k", 6);
        assert_eq!(fb.floor.load(Ordering::Relaxed), 0);
        fb.record("j", &Some(4), in_secs(10), 4);
        assert_eq!(fb.get("j"), Some(Some(4)));
    }

    /// The tombstone rule under real concurrency: threads keep recording an
    /// older value of `k` while others churn the capacity (evicting the
    /// tombstone, raising the floor) around an `invalidate`: once `forget`
    /// has returned, the older value is never served again.
    #[test]
    fn the_tombstone_rule_holds_across_threads() {
        let fb = Fallback::new(4);
        let until = Instant::now() + Duration::from_secs(3600);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        fb.record("k", &Some(1), until, 9);
                    }
                });
            }
            for t in 0..2 {
                let fb = &fb;
                s.spawn(move || {
                    for i in 0..20_000 {
                        fb.record(&format!("{t}-{}", i % 8), &Some(2), until, 11);
                    }
                });
            }
            s.spawn(|| {
                std::thread::yield_now();
                fb.forget("k", until, 10);
                for _ in 0..20_000 {
                    assert_eq!(fb.get("k"), None, "an older value came back");
                }
            });
        });
        assert_eq!(fb.get("k"), None, "an older value came back");
    }
}
