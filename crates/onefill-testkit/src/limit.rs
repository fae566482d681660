//! A time limit for a test that starts processes, so a hang fails the run
//! within the limit and names the test, instead of stalling it until CI's
//! own limit kills everything without saying where.
//!
//! Why a watchdog thread that ends the test binary, and not a timeout
//! around the test's future: a hang is often a thread blocked in
//! synchronous code (a lock held twice, a child process waited for, a
//! socket read), and nothing can interrupt a blocked thread. A
//! `tokio::time::timeout` never fires while the runtime's only thread is
//! stuck that way, and libtest has no per-test timeout (nextest's
//! `slow-timeout` would do, but the project's test command is plain
//! `cargo test`). So when the limit passes, the watchdog reports the test
//! on stderr, kills the `redis-server` processes the kit started (they
//! would otherwise outlive the binary), and exits with libtest's failure
//! status.

use std::collections::BTreeSet;
use std::io::Write;
use std::panic::Location;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Mutex;
use std::time::Duration;

/// The processes started by the kit and not yet reaped.
static CHILDREN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

pub(crate) fn track(pid: u32) {
    children().insert(pid);
}

pub(crate) fn untrack(pid: u32) {
    children().remove(&pid);
}

fn children() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    CHILDREN.lock().unwrap_or_else(|p| p.into_inner())
}

/// The guard returned by [`time_limit`]: the limit holds until it is
/// dropped (at the end of the test, or while a failing test unwinds).
#[derive(Debug)]
#[must_use = "the limit ends when the guard is dropped; bind it: `let _limit = time_limit(..);`"]
pub struct TimeLimit {
    _disarm: Sender<()>,
}

/// Bounds the calling test: if the returned guard still lives after
/// `limit`, the test binary prints which test overran (its name, where the
/// limit was set, the limit), kills every `redis-server` this kit started
/// and still runs, and exits with status 101, as a failed test run does.
///
/// Every test that starts a server or a process takes one, first thing:
///
/// ```no_run
/// use std::time::Duration;
/// use onefill_testkit::{time_limit, RedisServer};
///
/// let _limit = time_limit(Duration::from_secs(60));
/// let server = RedisServer::start();
/// # drop(server);
/// ```
///
/// Choose a limit several times what the test takes on a loaded machine:
/// it exists to turn a hang into a quick, named failure, not to measure
/// speed. The other tests of the same binary end with it; a hang is a
/// failure of the run either way.
#[track_caller]
pub fn time_limit(limit: Duration) -> TimeLimit {
    let test = std::thread::current()
        .name()
        .unwrap_or("<unnamed thread>")
        .to_string();
    let at = Location::caller();
    let (disarm, disarmed) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name(format!("time limit of {test}"))
        .spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = disarmed.recv_timeout(limit) {
                expire(&test, &at.to_string(), limit);
            }
        })
        .expect("cannot start a time limit's watchdog thread");
    TimeLimit { _disarm: disarm }
}

fn expire(test: &str, at: &str, limit: Duration) -> ! {
    let pids: Vec<u32> = children().iter().copied().collect();
    for &pid in &pids {
        // SAFETY: `kill` has no memory-safety preconditions. The pids are
        // children the kit has not reaped (it untracks a child before
        // reaping it), so none can have been reused by another process.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
    // Straight to the file descriptor: libtest captures `eprintln!` of test
    // threads (and of threads they spawn), and the capture dies with the
    // process.
    let message = format!(
        "\n\nerror: test `{test}` is still running after its time limit of {limit:?} \
         (set at {at}): it hangs, or is far slower than it should be.\n\
         Ending this test binary; {} redis-server process(es) started by the test kit killed.\n\n",
        pids.len()
    );
    let _ = std::io::stderr().write_all(message.as_bytes());
    std::process::exit(101);
}
