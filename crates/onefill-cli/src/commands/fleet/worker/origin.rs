//! The simulated origin behind every caller's loader, async or blocking:
//! one load is counted (in this process, and in Redis off the loader's
//! path), logged, takes `--load-ms`, and stamps its value with its load
//! time. The two kinds of loader differ only in how they wait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc::UnboundedSender;

use super::load_counter::Count;
use super::load_log::{LoadLog, LoadSpan};
use crate::commands::fleet::protocol::load_counter_key;

/// The origin of one worker, shared by its loaders.
#[derive(Clone)]
pub struct Origin {
    load: Duration,
    namespace: String,
    local_loads: Arc<AtomicU64>,
    /// Loads per key, in the order of the run's keys.
    loads_per_key: Arc<Vec<AtomicU64>>,
    log: LoadLog,
    counts: UnboundedSender<Count>,
}

/// One load under way: logged until it drops (finished or cancelled).
struct Load {
    n: u64,
    _span: LoadSpan,
}

impl Origin {
    /// An origin whose loads take `load`, for a run of `keys` keys.
    pub fn new(
        load: Duration,
        namespace: &str,
        keys: usize,
        log: LoadLog,
        counts: UnboundedSender<Count>,
    ) -> Origin {
        Origin {
            load,
            namespace: namespace.to_owned(),
            local_loads: Arc::new(AtomicU64::new(0)),
            loads_per_key: Arc::new((0..keys).map(|_| AtomicU64::new(0)).collect()),
            log,
            counts,
        }
    }

    /// Loads `key` (the run's key `key_index`) for an async caller.
    pub async fn load(&self, key_index: usize, key: &str) -> Result<String, std::io::Error> {
        let load = self.start(key_index, key);
        tokio::time::sleep(self.load).await;
        Ok(load.value(key))
    }

    /// Loads `key` for a blocking caller: the same load, its thread asleep.
    pub fn load_blocking(&self, key_index: usize, key: &str) -> Result<String, std::io::Error> {
        let load = self.start(key_index, key);
        std::thread::sleep(self.load);
        Ok(load.value(key))
    }

    fn start(&self, key_index: usize, key: &str) -> Load {
        let n = self.local_loads.fetch_add(1, Ordering::SeqCst) + 1;
        // This process's first load of the key also gives the key's
        // counter its TTL.
        let first = self
            .loads_per_key
            .get(key_index)
            .is_none_or(|count| count.fetch_add(1, Ordering::SeqCst) == 0);
        // Logged from here to the value (or to a cancelled load's drop),
        // for the parent's report.
        let span = self.log.start(key_index);
        // Counted in Redis off the loader's path: the simulated origin
        // takes `load`, whatever state Redis is in. A send, not a wait:
        // the blocking loader counts exactly as the async one.
        let _ = self.counts.send(Count {
            counter: load_counter_key(&self.namespace, key),
            n,
            first,
        });
        Load { n, _span: span }
    }

    /// Loads this process ran.
    pub fn local_loads(&self) -> u64 {
        self.local_loads.load(Ordering::SeqCst)
    }

    /// Loads this process ran, per key.
    pub fn local_loads_per_key(&self) -> Vec<u64> {
        self.loads_per_key
            .iter()
            .map(|n| n.load(Ordering::SeqCst))
            .collect()
    }
}

impl Load {
    /// The load's value; its log span ends as it is made.
    fn value(self, key: &str) -> String {
        loaded_value(key, self.n)
    }
}

/// Now, as milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The value a load produces: the key, the process, the load's number in
/// it and the load's completion time (Unix ms) after an `@`.
fn loaded_value(key: &str, n: u64) -> String {
    format!("{key}-{}-v{n}@{}", std::process::id(), unix_ms())
}

/// How old a value of [`loaded_value`] is at `now` (Unix ms): 0 if it
/// carries no load time.
pub fn age_ms(value: &str, now: u64) -> u64 {
    value
        .rsplit_once('@')
        .and_then(|(_, t)| t.parse::<u64>().ok())
        .map_or(0, |t| now.saturating_sub(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loaded_value_carries_its_load_time() {
        let before = unix_ms();
        let value = loaded_value("key-3", 7);
        assert!(value.starts_with(&format!("key-3-{}-v7@", std::process::id())));
        let age = age_ms(&value, before + 5_000);
        assert!((4_000..=5_000).contains(&age), "{value}: {age}");
        assert_eq!(age_ms(&value, 0), 0, "a clock gone back is age 0");
        assert_eq!(age_ms("no-time", before), 0);
        assert_eq!(age_ms("x@not-a-number", before), 0);
        assert_eq!(age_ms("a@b@1000", 1_500), 500, "the last @ counts");
    }

    #[test]
    fn both_kinds_of_load_count_and_log_alike() {
        let (counts, mut counted) = tokio::sync::mpsc::unbounded_channel();
        let log = LoadLog::new(std::time::Instant::now());
        let origin = Origin::new(Duration::from_millis(1), "ns", 2, log.clone(), counts);
        let value = origin.load_blocking(1, "b").expect("loads");
        assert!(value.starts_with(&format!("b-{}-v1@", std::process::id())));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let value = runtime.block_on(origin.load(1, "b")).expect("loads");
        assert!(value.starts_with(&format!("b-{}-v2@", std::process::id())));
        assert_eq!(origin.local_loads(), 2);
        assert_eq!(origin.local_loads_per_key(), [0, 2]);
        let first = counted.try_recv().expect("counted");
        let second = counted.try_recv().expect("counted");
        assert_eq!((first.n, first.first), (1, true));
        assert_eq!((second.n, second.first), (2, false));
        assert_eq!(first.counter, load_counter_key("ns", "b"));
        assert_eq!(log.take().len(), 2, "both logged");
    }
}
