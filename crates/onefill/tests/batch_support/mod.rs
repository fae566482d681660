//! What the batch tests share (`mod batch_support;`): a backend that counts
//! its calls ([`Counting`]), and a batch loader that counts its calls and
//! the keys it loaded.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::Backend;
use onefill::testing::{FaultyBackend, Op};
use onefill::{Cache, CacheBuilder};
use parking_lot::Mutex;

/// Delegates to its store and counts every call, by kind: the library's
/// fault-injecting wrapper with no fault set (each call is one request and
/// its answer: one round trip, a pipeline for the batch methods).
pub type Counting<B> = FaultyBackend<B>;

/// `inner`, its calls counted; a cache on it is built as on `inner` itself,
/// but for the default L1 over Redis: the wrapper does not ask for one
/// (`Backend::default_l1`), so every call is counted.
pub fn count_calls<B: Backend>(inner: B) -> Counting<B> {
    FaultyBackend::new(inner).in_process_as_inner()
}

/// A cache of namespace `ns` on `backend`, its other options set by `f`.
pub fn cache_in(
    ns: &str,
    backend: impl Backend,
    f: impl FnOnce(CacheBuilder<String, String>) -> CacheBuilder<String, String>,
) -> Cache<String, String> {
    f(Cache::builder().namespace(ns).backend(backend))
        .build()
        .unwrap()
}

/// The counts the batch tests read.
pub trait Counts {
    /// Calls of `op` (a method's name) so far.
    fn of(&self, op: &str) -> usize;
    /// Every call so far, but the watchdog's `extend`, the waiters'
    /// `subscribe` (a subscription is a message on the subscriber
    /// connection, no request of the call's own) and the reads of the
    /// namespace's marks (one when a process first reads or loads, and one
    /// after each mark: not the batch's doing; counted with `of`).
    fn round_trips(&self) -> usize;
    /// Starts counting again from zero.
    fn reset(&self);
}

impl<B: Backend + ?Sized> Counts for Counting<B> {
    fn of(&self, op: &str) -> usize {
        let op = match op {
            "get" => Op::Get,
            "get_many" => Op::GetMany,
            "acquire" => Op::Acquire,
            "acquire_many" => Op::AcquireMany,
            "fill" => Op::Fill,
            "release" => Op::Release,
            "extend" => Op::Extend,
            "set" => Op::Set,
            "invalidate" => Op::Invalidate,
            "subscribe" => Op::Subscribe,
            "mark" => Op::Mark,
            "read_marks" => Op::ReadMarks,
            other => panic!("no backend method {other}"),
        };
        self.faults().calls(op)
    }
    fn round_trips(&self) -> usize {
        Op::ALL
            .iter()
            .filter(|op| !matches!(op, Op::Extend | Op::Subscribe | Op::ReadMarks))
            .map(|&op| self.faults().calls(op))
            .sum()
    }
    fn reset(&self) {
        self.faults().reset_calls();
    }
}

/// What a test's batch loader returns.
pub type Loading = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Vec<(String, String)>, std::io::Error>> + Send>,
>;

/// A batch loader's record: its calls and every key it loaded.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub calls: Arc<AtomicUsize>,
    pub loaded: Arc<Mutex<Vec<String>>>,
}

impl Origin {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    /// How many times each key was loaded.
    pub fn loads_per_key(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for k in self.loaded.lock().iter() {
            *counts.entry(k.clone()).or_default() += 1;
        }
        counts
    }
    /// A loader answering `v<key>` for every key but those in `absent`,
    /// after `delay`.
    pub fn loader(
        &self,
        delay: Duration,
        absent: &'static [&'static str],
    ) -> impl Fn(Vec<String>) -> Loading + Send + Sync + 'static {
        let origin = self.clone();
        move |keys: Vec<String>| {
            let origin = origin.clone();
            Box::pin(async move {
                origin.calls.fetch_add(1, Ordering::SeqCst);
                origin.loaded.lock().extend(keys.iter().cloned());
                tokio::time::sleep(delay).await;
                Ok(keys
                    .into_iter()
                    .filter(|k| !absent.contains(&k.as_str()))
                    .map(|k| {
                        let v = format!("v{k}");
                        (k, v)
                    })
                    .collect())
            })
        }
    }
}
