//! The simulated origin (the "database"): slow, and counting its loads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An origin whose every load sleeps `delay` and is counted.
#[derive(Debug)]
pub struct Origin {
    delay: Duration,
    loads: AtomicU64,
}

impl Origin {
    /// A fresh origin (no loads yet), shared by all callers of one strategy.
    pub fn new(delay: Duration) -> Arc<Self> {
        Arc::new(Origin {
            delay,
            loads: AtomicU64::new(0),
        })
    }

    /// Loads `key`: counts the call, then takes `delay`.
    pub async fn load(&self, key: &str) -> String {
        let n = self.loads.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(self.delay).await;
        format!("value of {key} (origin load #{n})")
    }

    /// How many loads were started so far.
    pub fn loads(&self) -> u64 {
        self.loads.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn counts_every_load_and_takes_its_time() {
        let origin = Origin::new(Duration::from_millis(200));
        let start = tokio::time::Instant::now();
        let (a, b) = tokio::join!(origin.load("k"), origin.load("k"));
        assert_ne!(a, b);
        assert_eq!(origin.loads(), 2);
        assert_eq!(start.elapsed(), Duration::from_millis(200));
    }
}
