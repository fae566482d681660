//! The last value this process saw per key, kept for backend outages only.
//!
//! When the backend fails, a flight cannot read the stale value stored
//! there. Rather than sending every flight to the origin for the length of
//! the outage, the cache serves the last value it answered for the key, for
//! up to `ttl + grace` after it was seen. It is not a read cache (healthy
//! reads always go to the backend, so invalidations are never missed); it is
//! bounded by a capacity and recorded once per flight, not per caller.
//!
//! Every entry carries the write epoch of the cache at the moment its value
//! was read or loaded (see `Shared::epoch`). `set` and `invalidate` record
//! (or tombstone) the key with a newer epoch once their write is done, so a
//! flight that started before them can never put back what they replaced.

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
pub(crate) struct Fallback<V> {
    capacity: usize,
    entries: Mutex<HashMap<String, Entry<V>>>,
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
            entries: Mutex::default(),
        }
    }
}

impl<V: Clone> Fallback<V> {
    /// Remembers `value`, read or loaded at `epoch`, until `usable_until`
    /// (counted from when it was read or loaded, never renewed by serving
    /// it). Ignored if a newer write of the key is already recorded.
    pub(crate) fn record(&self, key: &str, value: &Option<V>, usable_until: Instant, epoch: u64) {
        self.put(key, Some(value.clone()), usable_until, epoch);
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
        let mut entries = self.entries.lock();
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
                        entries.remove(&victim);
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

    /// The key's last value, if still usable.
    pub(crate) fn get(&self, key: &str) -> Option<Option<V>> {
        let entries = self.entries.lock();
        entries
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
}
