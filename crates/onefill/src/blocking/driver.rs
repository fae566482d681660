//! Runs a cache call to completion for a synchronous caller, on a
//! multi-thread runtime whose workers keep driving the backend's I/O, the
//! timers and the detached flights while the caller's thread waits.
//!
//! The calling thread polls the call itself, in that runtime's context,
//! and sleeps between polls (parked, woken by the call's waker): an answer
//! ready at the first poll (an L1 hit) costs no more than the async call.
//! It does not use `Handle::block_on`, which panics on any thread inside
//! a runtime, nor `block_in_place`, which needs a free thread of the
//! runtime's blocking pool to take over the worker (and, when synchronous
//! callers have filled that pool, leaves nobody to run the runtime).
//!
//! A thread polling an async task (or a runtime's main future) is refused
//! with [`Error::BlockingInAsync`]: waiting there would stall the tasks of
//! its worker, and on a runtime of one thread every one of them.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

use crate::error::{ConfigError, Error};

/// The runtime a blocking handle's calls run on: given (a handle on the
/// application's runtime) or its own.
#[derive(Clone)]
pub(crate) struct Driver {
    handle: Handle,
    /// Kept alive by every clone of the blocking handle, when it owns it.
    _owned: Option<Arc<Owned>>,
}

impl Driver {
    /// Calls driven by the runtime `handle` belongs to.
    ///
    /// # Errors
    ///
    /// A current-thread runtime: its I/O and timers only progress while
    /// its own thread polls them, which a thread blocked in a call does not
    /// know; a multi-thread runtime's workers drive them whatever the
    /// callers do.
    pub(crate) fn on(handle: Handle) -> Result<Driver, ConfigError> {
        multi_thread(&handle)?;
        Ok(Driver {
            handle,
            _owned: None,
        })
    }

    /// Calls driven by `runtime`, which the driver keeps until its last
    /// clone goes.
    ///
    /// # Errors
    ///
    /// As [`Driver::on`].
    pub(crate) fn owning(runtime: Runtime) -> Result<Driver, ConfigError> {
        if let Err(refused) = multi_thread(runtime.handle()) {
            // Not a plain drop, which would wait for its tasks (and panic
            // in an async context).
            runtime.shutdown_background();
            return Err(refused);
        }
        Ok(Driver {
            handle: runtime.handle().clone(),
            _owned: Some(Arc::new(Owned(Some(runtime)))),
        })
    }

    /// A runtime of the handle's own: two workers for the backend's I/O
    /// and the detached flights (blocking loaders run on a pool of their
    /// own, not on them).
    pub(crate) fn owned() -> Result<Driver, ConfigError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("onefill-blocking")
            .enable_all()
            .build()
            .map_err(|e| ConfigError::Option {
                option: "blocking",
                reason: format!("cannot start the blocking handle's runtime: {e}"),
            })?;
        Driver::owning(runtime)
    }

    /// The runtime the calls run on.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Runs `call` to completion on this thread, as the module explains.
    ///
    /// # Errors
    ///
    /// [`Error::BlockingInAsync`] from a thread polling an async task.
    pub(crate) fn run<F: Future>(&self, call: F) -> Result<F::Output, Error> {
        // Outside any runtime's context (a plain thread) there is no task
        // to stall, and nothing to probe.
        if Handle::try_current().is_ok() && polling_a_task() {
            return Err(Error::BlockingInAsync);
        }
        let mut call = pin!(call);
        let _entered = self.handle.enter();
        WAKER.with(|waker| {
            let mut cx = Context::from_waker(waker);
            loop {
                if let Poll::Ready(answer) = call.as_mut().poll(&mut cx) {
                    return Ok(answer);
                }
                // A wake-up between the poll and here is kept by the
                // thread's token, so this returns at once; a spurious one
                // costs one more poll.
                std::thread::park();
            }
        })
    }
}

thread_local! {
    /// This thread's waker for the calls it waits on: made once, so a call
    /// costs no allocation for it.
    static WAKER: Waker = Waker::from(Arc::new(Unpark(std::thread::current())));
}

/// Wakes a thread waiting in [`Driver::run`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Refuses a current-thread runtime: its I/O and timers only progress while
/// its own thread polls them, which a thread blocked in a call does not
/// know; a multi-thread runtime's workers drive them whatever the callers
/// do.
fn multi_thread(handle: &Handle) -> Result<(), ConfigError> {
    if handle.runtime_flavor() == RuntimeFlavor::MultiThread {
        return Ok(());
    }
    Err(ConfigError::Option {
        option: "blocking",
        reason: "a blocking handle needs a multi-thread runtime (a current-thread \
                 runtime's I/O stops while its thread waits): use \
                 `CacheBuilder::build_blocking`, which brings its own"
            .to_owned(),
    })
}

/// Whether this thread is polling a runtime's task (or `block_on` future),
/// where waiting would stall the runtime.
///
/// tokio answers this only by panicking (`Handle::block_on`,
/// `block_in_place`); its cooperative budget answers it without: a task is
/// polled with a finite budget, a blocking-pool thread and a thread outside
/// any runtime with none. Spending the budget shows which (a finite one
/// runs out, 128 units today); the first unit's guard then puts the whole
/// budget back, so the task's own scheduling is untouched. A task wrapped
/// in `tokio::task::unconstrained` has no budget either: taken for a
/// blocking thread, it waits, stalling its worker for the call.
fn polling_a_task() -> bool {
    /// Twice the budget tokio gives a poll today. It bounds the probe,
    /// which spends all of it on a blocking thread (about a microsecond):
    /// a budget ever larger would be taken for a blocking thread's, and
    /// the unit tests below would fail.
    const PROBE: usize = 256;
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(first) = tokio::task::coop::poll_proceed(&mut cx) else {
        return true;
    };
    let mut exhausted = false;
    for _ in 1..PROBE {
        match tokio::task::coop::poll_proceed(&mut cx) {
            // Its restore disarmed: only the first guard's counts.
            Poll::Ready(unit) => unit.made_progress(),
            Poll::Pending => {
                exhausted = true;
                break;
            }
        }
    }
    drop(first);
    exhausted
}

/// The handle's own runtime, shut down without waiting when the last clone
/// of the handle goes: dropping a runtime blocks until its tasks stop,
/// which panics inside another runtime's task.
struct Owned(Option<Runtime>);

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_thread_is_not_polling_a_task() {
        assert!(!polling_a_task());
    }

    #[test]
    fn a_current_thread_runtimes_task_is_and_its_blocking_pool_is_not() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (in_main, in_task, in_pool) = runtime.block_on(async {
            let in_main = polling_a_task();
            let in_task = tokio::spawn(async { polling_a_task() }).await.unwrap();
            let in_pool = tokio::task::spawn_blocking(polling_a_task).await.unwrap();
            (in_main, in_task, in_pool)
        });
        assert!(in_main, "the main future is polled as a task");
        assert!(in_task);
        assert!(!in_pool, "a spawn_blocking thread may wait");
    }

    #[test]
    fn the_probe_leaves_the_tasks_budget_whole() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            assert!(polling_a_task());
            // Spent, the budget would make the next probe find none left
            // at once, and a busy task yield at every await.
            assert!(tokio::task::coop::has_budget_remaining());
            assert!(polling_a_task());
        });
    }
}
