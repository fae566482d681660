//! A caller as an OS thread (`std::thread`, not a task) on
//! `BlockingCache`, its loader a plain closure, which the library runs on
//! its loader threads. The worker collects the thread's answer as it
//! collects a task's, through a task that waits for it at most the
//! caller's patience: a thread that never answers is an error, never a
//! worker that never ends.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use onefill::BlockingCache;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::caller::{Answer, Caller};
use super::summary::Call;
use crate::commands::fleet::outcome::outcome_name;

/// Starts callers as OS threads on one blocking handle, a bounded number
/// at once.
#[derive(Clone)]
pub struct Threads {
    cache: BlockingCache<String, String>,
    busy: Arc<AtomicU32>,
    limit: u32,
}

/// One of the busy threads, counted until it drops.
struct Busy(Arc<AtomicU32>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Threads {
    /// At most `limit` callers' threads at once (the fleet's is
    /// `MAX_CALLER_THREADS`).
    pub fn new(cache: BlockingCache<String, String>, limit: u32) -> Threads {
        Threads {
            cache,
            busy: Arc::new(AtomicU32::new(0)),
            limit,
        }
    }

    /// Starts `caller` on a thread of its own; the task answers its call.
    /// A call that finds every thread busy, or no thread to be had, fails
    /// at once.
    pub fn spawn(&self, caller: Caller) -> JoinHandle<Call> {
        let started = caller.epoch.elapsed();
        let spawned = Instant::now();
        let (key_index, patience) = (caller.key_index, caller.patience);
        let (answered, answer) = oneshot::channel();
        let refused = self.start(caller, answered).err();
        tokio::spawn(async move {
            let failed =
                |why: String| Call::new(started, key_index, spawned.elapsed(), Err(why), true);
            if let Some(why) = refused {
                return failed(why);
            }
            match tokio::time::timeout(patience, answer).await {
                Ok(Ok(call)) => call,
                Ok(Err(_)) => failed("the caller's thread ended without an answer".to_owned()),
                Err(_) => failed(format!("no answer within {patience:?}")),
            }
        })
    }

    /// Starts the thread of `caller`, which sends its call to `answered`.
    fn start(&self, caller: Caller, answered: oneshot::Sender<Call>) -> Result<(), String> {
        let before = self.busy.fetch_add(1, Ordering::SeqCst);
        // Counted back when it drops: here if no thread starts, or at the
        // thread's end.
        let busy = Busy(self.busy.clone());
        if before >= self.limit {
            return Err(format!("{} caller threads busy: none started", self.limit));
        }
        let cache = self.cache.clone();
        std::thread::Builder::new()
            .name("onefill-caller".to_owned())
            .spawn(move || {
                let started = caller.epoch.elapsed();
                let t0 = Instant::now();
                let answer = call(&cache, &caller);
                // Free before it answers: a caller started after this
                // answer finds the thread's place free.
                drop(busy);
                let _ = answered.send(Call::new(
                    started,
                    caller.key_index,
                    t0.elapsed(),
                    answer,
                    true,
                ));
            })
            .map(drop)
            .map_err(|e| format!("no caller thread: {e}"))
    }
}

/// The blocking call: the same origin load as an async caller's, made by a
/// plain closure.
fn call(cache: &BlockingCache<String, String>, caller: &Caller) -> Answer {
    let loader = {
        let origin = caller.origin.clone();
        let key_index = caller.key_index;
        move |key: String| origin.load_blocking(key_index, &key)
    };
    cache
        .fetch(caller.key.as_str(), loader)
        .map(|f| (outcome_name(f.outcome), f.value))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::commands::fleet::worker::load_log::LoadLog;
    use crate::commands::fleet::worker::origin::Origin;

    #[test]
    fn a_caller_past_the_limit_fails_at_once_and_a_freed_thread_serves_the_next() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let cache = onefill::Cache::<String, String>::builder()
                .build()
                .expect("a cache");
            let threads = Threads::new(cache.blocking().expect("blocking"), 1);
            let (counts, _counted) = tokio::sync::mpsc::unbounded_channel();
            let epoch = Instant::now();
            let origin = Origin::new(
                Duration::from_millis(200),
                "ns",
                2,
                LoadLog::new(epoch),
                counts,
            );
            let caller = |key_index: usize| Caller {
                key_index,
                key: format!("k{key_index}"),
                origin: origin.clone(),
                epoch,
                patience: Duration::from_secs(30),
            };
            let first = threads.spawn(caller(0));
            let refused = threads.spawn(caller(1)).await.expect("answered");
            let why = refused.outcome.expect_err("refused");
            assert!(why.contains("1 caller threads busy"), "{why}");
            assert!(refused.on_thread);
            let first = first.await.expect("answered");
            assert_eq!(first.outcome, Ok("loaded"));
            assert!(first.on_thread);
            let next = threads.spawn(caller(1)).await.expect("answered");
            assert_eq!(
                next.outcome,
                Ok("loaded"),
                "the first thread's place is free"
            );
            assert_eq!(origin.local_loads(), 2);
        });
    }
}
