//! `onefill fleet --callers-kind blocking|mixed`: callers that are OS
//! threads calling `BlockingCache` (with a plain-closure loader), alone or
//! beside async tasks on the same key, in real worker processes against a
//! private Redis, with every library option at its default. Loads are
//! counted in Redis (the fleet's load-id sets), so a load one process ran
//! behind another's back shows.

use std::process::Command;
use std::time::Duration;

use onefill_testkit::{output_within, time_limit, RedisServer};
use serde_json::Value;

mod support;

use support::{fleet, n, workers, BIN, PATIENCE};

/// Past this a test hangs.
const LIMIT: Duration = Duration::from_secs(120);

/// Every worker's callers all answered by the load, a wait for it or a
/// hit, `threads` of them by OS threads.
fn every_caller_answered(r: &Value, callers: u64, threads: u64) {
    assert_eq!(workers(r).len(), 4, "{r}");
    for w in workers(r) {
        let outcome = |name: &str| w["outcomes"][name].as_u64().unwrap_or(0);
        let answered = outcome("loaded") + outcome("waited") + outcome("hit");
        assert_eq!(answered, callers, "{w}");
        assert_eq!(n(w, "blocking_calls"), threads, "{w}");
    }
}

/// 4 processes × 64 callers of `kind` on a cold key, a 300 ms load: one
/// load across the fleet, every caller answered without an error,
/// `threads` of each process's callers OS threads.
fn cold_herd_loads_once(kind: &str, threads: u64) -> Value {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let r = fleet(
        &[server.url()],
        &[
            "--processes",
            "4",
            "--callers",
            "64",
            "--load-ms",
            "300",
            "--callers-kind",
            kind,
        ],
    );
    assert_eq!(r["callers_kind"], kind, "{r}");
    assert_eq!(n(&r, "loads"), 1, "{r}");
    assert_eq!(n(&r, "calls"), 256, "{r}");
    assert_eq!(n(&r, "blocking_calls"), 4 * threads, "{r}");
    assert_eq!(n(&r, "errors"), 0, "{r}");
    every_caller_answered(&r, 64, threads);
    r
}

#[test]
fn four_processes_of_64_blocking_callers_load_a_cold_key_once() {
    let r = cold_herd_loads_once("blocking", 64);
    assert_eq!(n(&r, "local_loads"), 1, "{r}");
}

/// Each process with 32 async tasks and 32 OS threads on one key: the two
/// kinds share the one load.
#[test]
fn a_mixed_fleet_of_tasks_and_threads_loads_a_cold_key_once() {
    let _ = cold_herd_loads_once("mixed", 32);
}

/// Steady load from OS threads (4 processes × 100 req/s for 1.5 s, a
/// 200 ms load, the value's TTL far beyond the run): one load, then hits.
#[test]
fn blocking_callers_under_steady_load_load_once() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let r = fleet(
        &[server.url()],
        &[
            "--processes",
            "4",
            "--rate",
            "100",
            "--duration-ms",
            "1500",
            "--load-ms",
            "200",
            "--callers-kind",
            "blocking",
        ],
    );
    assert_eq!(n(&r, "loads"), 1, "{r}");
    assert_eq!(n(&r, "errors"), 0, "{r}");
    let calls = n(&r, "calls");
    assert!(calls >= 4 * 100, "about 150 calls per process: {r}");
    assert_eq!(n(&r, "blocking_calls"), calls, "{r}");
}

/// A flag the workers could not honour is refused before any starts.
#[test]
fn blocking_callers_of_the_naive_strategy_are_refused_up_front() {
    let _limit = time_limit(LIMIT);
    let mut cmd = Command::new(BIN);
    cmd.args([
        "fleet",
        "--quiet",
        "--redis",
        "redis://127.0.0.1:1",
        "--strategy",
        "naive",
        "--callers-kind",
        "blocking",
    ]);
    let out = output_within(&mut cmd, PATIENCE);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("naive"), "{stderr}");
}
