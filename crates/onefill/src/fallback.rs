//! The last value this process saw per key, kept for backend outages only.
//!
//! When the backend fails, a flight cannot read the stale value stored
//! there. Rather than sending every flight to the origin for the length of
//! the outage, the cache serves the last value it answered for the key, for
//! up to `ttl + grace` after it was seen. It is not a read cache (healthy
//! reads always go to the backend, so invalidations are never missed); it is
//! bounded by a capacity and recorded once per flight, not per caller.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
pub(crate) struct Fallback<V> {
    capacity: usize,
    entries: Mutex<HashMap<String, Entry<V>>>,
}

#[derive(Debug)]
struct Entry<V> {
    value: Option<V>,
    usable_until: Instant,
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
    pub(crate) fn record(&self, key: &str, value: &Option<V>, usable_for: Duration) {
        if self.capacity == 0 {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock();
        if entries.len() >= self.capacity && !entries.contains_key(key) {
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
        entries.insert(
            key.to_owned(),
            Entry {
                value: value.clone(),
                usable_until: now + usable_for,
            },
        );
    }

    pub(crate) fn get(&self, key: &str) -> Option<Option<V>> {
        let entries = self.entries.lock();
        entries
            .get(key)
            .filter(|e| e.usable_until > Instant::now())
            .map(|e| e.value.clone())
    }

    pub(crate) fn forget(&self, key: &str) {
        self.entries.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bounded_and_time_limited() {
        let fb = Fallback::new(2);
        fb.record("a", &Some(1), Duration::from_secs(10));
        fb.record("b", &Some(2), Duration::from_secs(5));
        fb.record("c", &Some(3), Duration::from_secs(10));
        assert_eq!(fb.get("b"), None, "the entry closest to expiry was evicted");
        assert_eq!(fb.get("a"), Some(Some(1)));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(fb.get("a"), None, "too old to serve");
        let off = Fallback::new(0);
        off.record("a", &Some(1), Duration::from_secs(10));
        assert_eq!(off.get("a"), None);
    }
}
