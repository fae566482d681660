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

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
pub(crate) struct Fallback<V> {
    capacity: usize,
    state: Mutex<State<V>>,
}

#[derive(Debug)]
struct State<V> {
    entries: HashMap<String, Entry<V>>,
    /// The newest epoch of a tombstone evicted while still needed: values
    /// read or loaded before it are not recorded, since the key they belong
    /// to may be the one it guarded.
    floor: u64,
}

impl<V> Default for State<V> {
    fn default() -> Self {
        State {
            entries: HashMap::new(),
            floor: 0,
        }
    }
}

#[derive(Debug)]
struct Entry<V> {
    /// `None`: a tombstone left by `invalidate` (never served).
    value: Option<Option<V>>,
    usable_until: Instant,
    epoch: u64,
}

impl<V> Fallback<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Fallback {
            capacity,
            state: Mutex::default(),
        }
    }

    /// Forgets the key's value as of `epoch` (after an `invalidate`), and
    /// keeps a tombstone until `until` so older flights cannot record it.
    pub(crate) fn forget(&self, key: &str, until: Instant, epoch: u64) {
        self.put(key, None, until, epoch);
    }

    fn put(&self, key: &str, value: Option<Option<V>>, usable_until: Instant, epoch: u64) {
        if self.capacity == 0 {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock();
        if value.is_some() && epoch < state.floor {
            return;
        }
        let State { entries, floor } = &mut *state;
        match entries.get(key) {
            Some(newer) if newer.epoch > epoch => return,
            Some(_) => {}
            None if entries.len() >= self.capacity => {
                entries.retain(|_, e| e.usable_until > now);
                if entries.len() >= self.capacity {
                    // Evict the entry closest to the end of its usefulness.
                    if let Some(victim) = entries
                        .iter()
                        .min_by_key(|(_, e)| e.usable_until)
                        .map(|(k, _)| k.clone())
                    {
                        if let Some(evicted) = entries.remove(&victim) {
                            if evicted.value.is_none() {
                                *floor = (*floor).max(evicted.epoch);
                            }
                        }
                    }
                }
            }
            None => {}
        }
        entries.insert(
            key.to_owned(),
            Entry {
                value,
                usable_until,
                epoch,
            },
        );
    }
}

impl<V: Clone> Fallback<V> {
    /// Remembers `value`, read or loaded at `epoch`, until `usable_until`
    /// (counted from when it was read or loaded, never renewed by serving
    /// it). Ignored if a newer write of the key is already recorded.
    pub(crate) fn record(&self, key: &str, value: &Option<V>, usable_until: Instant, epoch: u64) {
        self.put(key, Some(value.clone()), usable_until, epoch);
    }

    /// The key's last value, if still usable.
    pub(crate) fn get(&self, key: &str) -> Option<Option<V>> {
        let state = self.state.lock();
        state
            .entries
            .get(key)
            .filter(|e| e.usable_until > Instant::now())
            .and_then(|e| e.value.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn in_secs(n: u64) -> Instant {
        Instant::now() + Duration::from_secs(n)
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_and_time_limited() {
        let fb = Fallback::new(2);
        fb.record("a", &Some(1), in_secs(10), 0);
        fb.record("b", &Some(2), in_secs(5), 0);
        fb.record("c", &Some(3), in_secs(10), 0);
        assert_eq!(fb.get("b"), None, "the entry closest to expiry was evicted");
        assert_eq!(fb.get("a"), Some(Some(1)));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(fb.get("a"), None, "too old to serve");
        let off = Fallback::new(0);
        off.record("a", &Some(1), in_secs(10), 0);
        assert_eq!(off.get("a"), None);
    }

    /// Regression (issue 8, fault 8): a flight that started before an
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

    /// Regression (review of issue 8): a tombstone evicted by the capacity
    /// let the older flight it guarded against record its value.
    #[tokio::test(start_paused = true)]
    async fn an_evicted_tombstone_still_keeps_older_values_out() {
        let fb = Fallback::new(2);
        fb.forget("k", in_secs(1), 5);
        fb.record("a", &Some(1), in_secs(10), 6);
        fb.record("b", &Some(2), in_secs(10), 7);
        fb.record("k", &Some(0), in_secs(10), 4);
        assert_eq!(fb.get("k"), None, "a value from before the invalidate");
        fb.record("k", &Some(9), in_secs(10), 8);
        assert_eq!(fb.get("k"), Some(Some(9)));
    }
}
