//! Runs a cache call to completion for a synchronous caller, on a
//! multi-thread runtime that keeps driving the backend's I/O, timers and
//! detached flights while the caller's thread waits.
//!
//! Where the caller's thread stands decides how it may wait:
//!
//! - a thread outside any runtime (`std::thread`, a blocking-pool thread
//!   of `spawn_blocking`): it polls the call itself (`Handle::block_on`);
//! - an async task, or the main future, of a multi-thread runtime: the
//!   same, inside `block_in_place`, which first hands the worker's other
//!   tasks to another thread, so no worker is blocked;
//! - an async task of a current-thread runtime: there is no other thread
//!   to hand its tasks to, and blocking would stall them all (and, were the
//!   cache's own I/O on that runtime, forever), so the call is refused with
//!   [`Error::BlockingInAsync`].

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

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
    /// [`Error::BlockingInAsync`] from an async task of a current-thread
    /// runtime.
    pub(crate) fn run<F: Future>(&self, call: F) -> Result<F::Output, Error> {
        let wait = match Handle::try_current() {
            Err(_) => Wait::Here,
            // On a worker: its tasks move to another thread first. On a
            // blocking-pool thread, or in the runtime's main future: runs
            // the closure as is.
            Ok(here) if here.runtime_flavor() == RuntimeFlavor::MultiThread => Wait::InPlace,
            Ok(_) if polling_a_task() => return Err(Error::BlockingInAsync),
            // A blocking-pool thread of a current-thread runtime
            // (`spawn_blocking`, actix-web's `web::block`): not entered in
            // any runtime, free to wait while that runtime's thread goes on.
            Ok(_) => Wait::Here,
        };
        let mut call = pin!(call);
        if let Some(answer) = self.at_once(call.as_mut()) {
            return Ok(answer);
        }
        Ok(match wait {
            Wait::Here => self.handle.block_on(call),
            Wait::InPlace => tokio::task::block_in_place(|| self.handle.block_on(call)),
        })
    }

    /// The call's answer if it is ready at its first poll (an L1 hit, a
    /// hit on the embedded backend): polled in the runtime's context, it
    /// needs neither the runtime entered for blocking nor a parked thread,
    /// which cost more than the hit itself. A call that is not ready is
    /// polled again, with a real waker, by the wait.
    fn at_once<F: Future>(&self, call: Pin<&mut F>) -> Option<F::Output> {
        let _entered = self.handle.enter();
        match call.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => None,
        }
    }
}

/// How the calling thread waits for a call that is not ready at once.
enum Wait {
    /// On this thread, which no runtime uses.
    Here,
    /// On this thread, its runtime's other tasks handed elsewhere first.
    InPlace,
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
/// budget back, so the task's own scheduling is untouched.
fn polling_a_task() -> bool {
    /// Far above any budget tokio gives a poll; an unlimited budget is
    /// never exhausted, and this bounds the probe.
    const PROBE: usize = 4096;
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
