//! A Redis Cluster failover is invisible to the callers of keys
//! on healthy masters, and the victim's keys are back to normal soon after
//! its replica is promoted.
//!
//! Each test starts its own private cluster of 3 masters + 3 replicas
//! (`cluster-node-timeout 1000`, `cluster-require-full-coverage no`) and
//! runs the real `onefill fleet` binary on it: 4 processes × 200 calls/s
//! over 50 keys for 10 s, ttl 1 s, loader 50 ms, grace 0, every other
//! option at its default. At t = 5 s the fleet faults the master owning
//! the most of the 50 keys (the victim) — a graceful `CLUSTER FAILOVER`, a
//! SIGKILL, or a SIGSTOP (a hung host, resumed only at the end of the run)
//! — and reports, from every call the workers made, what the callers saw.
//!
//! What they prove, for each fault:
//! - no caller got an error;
//! - callers of keys on healthy masters saw nothing: no stale, no degraded
//!   answer, none older than `ttl + grace + 250 ms` (a value's TTL starts
//!   at its fill, up to the 250 ms backend timeout after its load);
//! - a replica was promoted, and the victim's keys answered normally again
//!   (no error, stale, degraded, too old or slow answer) within 1.5 s of
//!   the promotion;
//! - no extra loads: healthy keys loaded about once per `ttl + load`, and
//!   so did the victim's keys outside the outage window
//!   `[fault, promotion + 1.5 s]`.

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use onefill::backend::FillKeys;
use onefill_testkit::{output_within, time_limit, RedisCluster};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_onefill");

/// The recovery allowed after the promotion, ms.
const RECOVERY_MS: f64 = 1_500.0;

/// A 10 s run takes about 11 s; one that has not ended after this is hung
/// (and fails the test rather than hanging it).
const FLEET_PATIENCE: Duration = Duration::from_secs(180);
/// A scenario: a 3 + 3 cluster forming (seconds), then the fleet.
const LIMIT: Duration = Duration::from_secs(240);

/// Runs the failover scenario with `--fault fault` on a fresh 3 + 3 cluster
/// and checks the report.
/// One scenario at a time: each keeps both cores of a CI machine busy
/// (6 servers, 4 workers at 200 calls/s), and run together they would
/// measure the machine, not the failover.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs the scenario with `fault`; `strict` runs the fleet in strict mode
/// (backend failures reach callers as errors), where the victim's callers
/// may get errors while it is down (a real failure), but nobody gets one
/// for routing (`MOVED`, `CLUSTERDOWN`) or on a healthy master.
fn failover_scenario(fault: &str, strict: bool) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded from here: the wait for the scenarios before it is not its own.
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start_with_replicas(3, 1);
    let mut cmd = Command::new(BIN);
    cmd.args(["fleet", "--json", "--cluster"]);
    for url in cluster.urls() {
        cmd.args(["--redis", &url]);
    }
    cmd.args([
        "--processes",
        "4",
        "--rate",
        "200",
        "--duration-ms",
        "10000",
        "--key-count",
        "50",
        "--ttl-ms",
        "1000",
        "--load-ms",
        "50",
        "--fault",
        fault,
    ]);
    if strict {
        cmd.arg("--strict");
    }
    let out = output_within(&mut cmd, FLEET_PATIENCE);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "fleet failed: {stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("fleet JSON");
    let f = &report["fault"];
    eprintln!(
        "--fault {fault}: {}",
        serde_json::to_string_pretty(f).unwrap()
    );
    let healthy = &f["healthy"];
    let victim = &f["victim"];
    let n = |v: &Value, field: &str| -> u64 {
        v[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field} in {v}"))
    };
    let x = |v: &Value, field: &str| -> f64 {
        v[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{field} in {v}"))
    };

    // The run was the scenario above, and the victim was a real master
    // with keys on it.
    assert!(n(&report, "calls") >= 4 * 1_500, "{}", report["calls"]);
    assert_eq!(f["kind"], fault);
    let victim_keys = f["victim_keys"].as_array().expect("victim_keys");
    assert!(!victim_keys.is_empty() && victim_keys.len() < 50, "{f}");
    assert_eq!(n(victim, "keys"), victim_keys.len() as u64);
    assert_eq!(n(healthy, "keys") + n(victim, "keys"), 50);
    assert_eq!(n(f, "age_limit_ms"), 1_000 + 250);

    // Every check below is made and the failed ones reported together, so
    // one run says all that is wrong.
    let mut failed: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failed.push(what);
        }
    };

    // Nobody got an error (in strict mode, only the callers of a master
    // that was down may).
    let outage_errors_allowed = strict && fault != "failover";
    let classes: &[(&str, &Value)] = if outage_errors_allowed {
        &[("healthy", healthy)]
    } else {
        &[("all", &report), ("healthy", healthy), ("victim", victim)]
    };
    for &(class, v) in classes {
        let errors = n(v, "errors");
        check(
            errors == 0,
            format!("{errors} caller errors ({class} keys)"),
        );
    }

    // Callers of healthy masters saw nothing.
    let stale = n(healthy, "stale");
    check(
        stale == 0,
        format!("{stale} stale answers for healthy keys"),
    );
    let degraded = n(healthy, "degraded");
    check(
        degraded == 0,
        format!("{degraded} degraded answers for healthy keys"),
    );
    let old = n(healthy, "over_age_limit");
    check(
        old == 0,
        format!("{old} answers for healthy keys older than ttl + grace + 250 ms"),
    );

    // A replica was promoted (and the cluster agrees with the report), and
    // the victim's keys were back to normal soon after.
    match (f["promoted_at_ms"].as_f64(), f["promoted_to"].as_str()) {
        (Some(promoted_at), Some(new_master)) => {
            let victim_port: u16 = f["victim_address"]
                .as_str()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .expect("victim_address");
            assert_ne!(
                victim_port.to_string(),
                new_master.rsplit(':').next().unwrap_or("")
            );
            let victim_node = cluster.node_with_port(victim_port).expect("a node of ours");
            let namespace = report["namespace"].as_str().expect("namespace");
            let key = victim_keys[0].as_str().expect("a key name");
            // Asked of the other nodes: a resumed victim may not know yet.
            let slot = cluster.slot_of(FillKeys::new(namespace, key).value());
            let owner = cluster
                .master_of_slot(slot, Some(victim_node))
                .expect("an owner");
            assert_eq!(format!("127.0.0.1:{}", owner.port()), new_master);
            let recovered = x(victim, "recovered_after_promotion_ms");
            check(
                recovered <= RECOVERY_MS,
                format!(
                    "the victim's keys recovered {recovered:.0} ms after the promotion at \
                     {promoted_at:.0} ms (at most {RECOVERY_MS} ms)"
                ),
            );
        }
        _ => check(false, "no replica was promoted within the run".to_owned()),
    }

    // No extra loads. The ideal is continuous: keys × time / (ttl + load).
    // A key that loads at t = 0 and then every `ttl + load` loads
    // floor(time / (ttl + load)) + 1 times, up to one more than its share
    // of the ideal: so one load per key is allowed on top, as rounding.
    let (loads, ideal) = (n(healthy, "loads"), x(healthy, "ideal_loads"));
    let keys = n(healthy, "keys") as f64;
    check(
        loads as f64 <= 1.05 * ideal + keys,
        format!("healthy keys loaded {loads} times; ideal {ideal:.1} (× 1.05 + {keys} rounding)"),
    );
    let (loads, ideal) = (
        n(victim, "loads_outside_outage"),
        x(victim, "ideal_loads_outside_outage"),
    );
    let keys = n(victim, "keys") as f64;
    check(
        loads as f64 <= 1.05 * ideal + keys,
        format!(
            "the victim's keys loaded {loads} times outside the outage window; ideal \
             {ideal:.1} (× 1.05 + {keys} rounding)"
        ),
    );
    assert!(
        failed.is_empty(),
        "--fault {fault}:\n- {}\n{f}",
        failed.join("\n- ")
    );
}

/// A graceful `CLUSTER FAILOVER` sent to the victim's replica.
#[test]
fn a_graceful_failover_is_invisible() {
    failover_scenario("failover", false);
}

/// The same in strict mode: no `MOVED` or `CLUSTERDOWN` reaches a caller.
#[test]
fn a_graceful_failover_is_invisible_even_in_strict_mode() {
    failover_scenario("failover", true);
}

/// SIGKILL of the victim: the replica is promoted after the node timeout
/// and the failure detection.
#[test]
fn a_killed_master_is_replaced_without_errors() {
    failover_scenario("kill", false);
}

/// The same in strict mode: the dead master's callers get errors until its
/// replica is promoted, the healthy masters' callers none.
#[test]
fn in_strict_mode_a_killed_master_fails_only_its_own_callers() {
    failover_scenario("kill", true);
}

/// SIGSTOP of the victim (a hung host, connections open): the same, while
/// every connection to it hangs instead of being refused.
#[test]
fn a_hung_master_is_replaced_without_errors() {
    failover_scenario("hang", false);
}

/// The fleet's `--fault` refuses what it cannot do: no cluster, a fault
/// after the end.
#[test]
fn fault_flags_are_checked() {
    let _limit = time_limit(LIMIT);
    let bad = |extra: &[&str]| {
        let out = output_within(
            Command::new(BIN)
                .args(["fleet", "--quiet", "--redis", "redis://127.0.0.1:1"])
                .args(extra),
            FLEET_PATIENCE,
        );
        assert!(!out.status.success(), "{extra:?} accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    bad(&["--rate", "10", "--fault", "kill"]);
    let late = bad(&[
        "--cluster",
        "--rate",
        "10",
        "--duration-ms",
        "1000",
        "--fault",
        "kill",
    ]);
    assert!(late.contains("--fault-at-ms"), "{late}");
}
