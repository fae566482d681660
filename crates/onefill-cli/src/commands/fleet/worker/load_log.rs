//! A worker's record of its loads: when each started and ended, for the
//! parent's fault analyses and its HTML report.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The most entries a worker keeps in each of its detail logs (this one,
/// and the summary's call log).
pub const MAX_LOG: usize = 2_000_000;

/// Every load of the worker, `[started_ms, key_index, ended_ms]` from its
/// t = 0; shared by its loaders.
#[derive(Clone)]
pub struct LoadLog {
    origin: Instant,
    spans: Arc<Mutex<Vec<[u64; 3]>>>,
}

impl LoadLog {
    /// An empty log; `origin` is its t = 0.
    pub fn new(origin: Instant) -> LoadLog {
        LoadLog {
            origin,
            spans: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<[u64; 3]>> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs the start of a load of `key_index`; the load ends when the
    /// returned span drops (whether it finished or was cancelled). Past
    /// [`MAX_LOG`] loads, nothing more is logged.
    pub fn start(&self, key_index: usize) -> LoadSpan {
        let now = self.now_ms();
        let mut spans = self.lock();
        let index = (spans.len() < MAX_LOG).then(|| {
            // Ended "now" until it really ends: never an end before the start.
            spans.push([now, key_index as u64, now]);
            spans.len() - 1
        });
        LoadSpan {
            log: self.clone(),
            index,
        }
    }

    /// The spans logged so far.
    pub fn take(&self) -> Vec<[u64; 3]> {
        std::mem::take(&mut *self.lock())
    }
}

/// One load in progress: its end is logged when it drops.
pub struct LoadSpan {
    log: LoadLog,
    index: Option<usize>,
}

impl Drop for LoadSpan {
    fn drop(&mut self) {
        if let Some(i) = self.index {
            let now = self.log.now_ms();
            if let Some(span) = self.log.lock().get_mut(i) {
                span[2] = now;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_ends_when_its_span_drops() {
        let log = LoadLog::new(Instant::now() - std::time::Duration::from_millis(1_000));
        let span = log.start(3);
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(span);
        let spans = log.take();
        assert_eq!(spans.len(), 1);
        let [started, key, ended] = spans[0];
        assert_eq!(key, 3);
        assert!(started >= 1_000, "{spans:?}");
        assert!(ended >= started + 20, "{spans:?}");
        assert!(log.take().is_empty(), "taken");
    }
}
