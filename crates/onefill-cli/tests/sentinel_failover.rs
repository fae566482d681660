//! Through Redis Sentinels, a failover of the primary costs the callers
//! no error, and every key answers normally again soon after the
//! Sentinels name the new primary.
//!
//! Each test starts its own private set-up (a primary, 2 replicas, 3
//! Sentinels with `down-after-milliseconds 2000`: see
//! `onefill_testkit::RedisSentinel`) and runs the real `onefill fleet`
//! binary through the Sentinels: 4 processes × 200 calls/s over 50 keys
//! for 12 s, loader 50 ms, grace 0, every other option at its default.
//! At t = 6.5 s (ttl 6 s; for a failover 3.5 s, ttl 3 s, in 10 s: see
//! below) the fleet faults the primary — `SENTINEL
//! FAILOVER`, a SIGKILL, or a SIGSTOP (a hung host, resumed only at the
//! end of the run) — and reports, from every call the workers made, what
//! the callers saw. That is the quiet moment: no lease is held at the
//! fault. The in-flight scenarios ([`Moment::InFlight`]: TTL 1 s, the
//! fault at 5 s of 10) have leases taken, held and filled as the primary
//! goes, and every key must answer normally within
//! [`IN_FLIGHT_SETTLED_MS`] of the promotion, counting the calls that were
//! running at it.
//!
//! The TTL is longer than the outage (about 1 s for a failover, 3 s for a
//! kill, 4 s for a hang) so that the values filled before the fault still
//! live at the promotion, and the report's lost writes (values the old
//! primary acknowledged that the new one lacks) have something to measure:
//! with a 6 s TTL (up to 10 % shorter, the library's jitter) each key loads
//! at about 0 and between 5.45 and 6.4 s (the first loads take up to a few
//! hundred milliseconds longer, as the workers start), so a fault at 6.5 s
//! finds every key's second value, which lives past 11 s. A failover is checked with a 3 s TTL and a fault at 3.5 s, so the
//! keys refresh again at about 6.1 and 9.15 s, after the promotion, while
//! the old primary still answers as a master.
//!
//! What they prove, for each fault:
//! - no caller got an error;
//! - the Sentinels named a new primary (a majority of them, and it
//!   answers as a master), and every key answered normally again (no
//!   error, stale, degraded, too old or slow answer) within 500 ms of that;
//! - after a failover, the old primary (which answers as a master for
//!   seconds after the Sentinels name the new one) took no write after
//!   the promotion: the fleet had moved to the new primary;
//! - no extra loads: outside the outage window `[fault, promotion + 1.5
//!   s]` the keys loaded within 10 % of once per `ttl + load` (plus one
//!   per key and stretch of time, as rounding), and at most 10 % of those
//!   loads started before the value of the key's previous load could have
//!   expired.
//!
//! The lost writes are printed, not bounded: they measure Redis's
//! asynchronous replication as much as the client.

use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use onefill_testkit::{output_within, time_limit, RedisSentinel};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_onefill");

/// The recovery allowed after the Sentinels name the new primary, ms.
const RECOVERY_MS: f64 = 500.0;
/// The loads allowed outside the outage window, as a multiple of the ideal.
const LOADS_OVER_IDEAL: f64 = 1.10;

/// A 12 s run takes about 13 s; one that has not ended after this is hung
/// (and fails the test rather than hanging it).
const FLEET_PATIENCE: Duration = Duration::from_secs(120);
/// A scenario: the set-up forming (seconds), then the fleet.
const LIMIT: Duration = Duration::from_secs(180);

/// One scenario at a time: each keeps both cores of a CI machine busy (6
/// servers, 4 workers at 200 calls/s), and run together they would
/// measure the machine, not the failover.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// When the fault comes.
#[derive(Clone, Copy, PartialEq)]
enum Moment {
    /// While no lease is held (every key's value lives past the fault):
    /// the lost writes are measured.
    Quiet,
    /// With loads under way: the TTL is 1 s, so about 50 keys × 200 calls
    /// a second find a key to load every 20 ms, and leases are taken, held
    /// and filled at the moment of the fault. Every key must be answered
    /// normally within [`IN_FLIGHT_SETTLED_MS`] of the promotion, counting
    /// the calls that were running at it.
    InFlight,
    /// As `InFlight`, every write waiting for more replicas than the
    /// promoted one has: the first writes of each process on the new
    /// primary each wait out their `WAIT` (plus up to a server tick) one
    /// after another on the connection they share, until the first comes
    /// back short; so the bound is [`SHORT_SETTLED_MS`].
    InFlightShortOfReplicas,
}

/// With leases in flight at the fault: how long after the promotion a
/// call of a victim key may still end abnormally (the end of the last
/// such call, including those that began before the promotion). A lease
/// whose fill the failover lost used to hold its key for the lease's TTL
/// (10 s); what is left is a few round trips after the fleet reaches the
/// new primary, and a debug build's calls on two busy cores.
const IN_FLIGHT_SETTLED_MS: f64 = 300.0;

/// [`IN_FLIGHT_SETTLED_MS`] for a hung primary (SIGSTOP): after seconds
/// of a hung primary every value has expired, so the calls running at
/// the promotion wait for a load on the new one, while every process of
/// the fleet moves at once. Measured 45–187 ms in 10 runs. Waiting on the
/// hung primary (a follower's look at it, a call left to its timeout)
/// used to add up to the connection timeout (1.25 s): 657 and 857 ms in
/// single runs.
const IN_FLIGHT_HANG_SETTLED_MS: f64 = 400.0;

/// [`IN_FLIGHT_SETTLED_MS`] when every write waits for replicas the new
/// primary lacks (see [`Moment::InFlightShortOfReplicas`]).
const SHORT_SETTLED_MS: f64 = 800.0;

/// Runs the scenario with `--fault fault` through a fresh set-up and
/// checks the report.
fn failover_scenario(fault: &str, ttl_ms: u64, fault_at_ms: u64, duration_ms: u64) {
    failover_scenario_with(fault, Moment::Quiet, ttl_ms, fault_at_ms, duration_ms, &[]);
}

/// [`failover_scenario`] at a moment with loads under way (see
/// [`Moment::InFlight`]): TTL 1 s, the fault at 5 s of 10.
fn in_flight_scenario(fault: &str) {
    failover_scenario_with(fault, Moment::InFlight, 1_000, 5_000, 10_000, &[]);
}

/// [`failover_scenario`], at `moment`, the fleet given `extra` arguments
/// too.
fn failover_scenario_with(
    fault: &str,
    moment: Moment,
    ttl_ms: u64,
    fault_at_ms: u64,
    duration_ms: u64,
    extra: &[&str],
) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Bounded from here: the wait for the scenarios before it is not its own.
    let _limit = time_limit(LIMIT);
    let set = RedisSentinel::start();
    let old_primary = set.primary().port();
    let mut cmd = Command::new(BIN);
    cmd.args(["fleet", "--json", "--master-name", set.master_name()]);
    for url in set.sentinel_urls() {
        cmd.args(["--sentinel", &url]);
    }
    cmd.args([
        "--processes",
        "4",
        "--rate",
        "200",
        "--duration-ms",
        &duration_ms.to_string(),
        "--key-count",
        "50",
        "--ttl-ms",
        &ttl_ms.to_string(),
        "--load-ms",
        "50",
        "--fault",
        fault,
        "--fault-at-ms",
        &fault_at_ms.to_string(),
    ]);
    cmd.args(extra);
    let out = output_within(&mut cmd, FLEET_PATIENCE);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "fleet failed: {stderr}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        set.logs()
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("fleet JSON");
    let f = &report["fault"];
    eprintln!("--fault {fault}: {f}");
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

    // The run was the scenario above, and the victim the primary, serving
    // every key.
    assert!(n(&report, "calls") >= 4 * 1_300, "{}", report["calls"]);
    assert_eq!(f["kind"], fault);
    assert_eq!(
        f["victim_address"],
        format!("127.0.0.1:{old_primary}"),
        "{f}"
    );
    assert_eq!(n(victim, "keys"), 50);
    assert_eq!(n(f, "age_limit_ms"), ttl_ms + 250);

    // Every check below is made and the failed ones reported together, so
    // one run says all that is wrong.
    let mut failed: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failed.push(what);
        }
    };

    for (class, v) in [("all", &report), ("victim", victim)] {
        let errors = n(v, "errors");
        check(
            errors == 0,
            format!("{errors} caller errors ({class} keys)"),
        );
    }

    // A new primary was named (and the set-up agrees with the report),
    // and every key was back to normal soon after.
    match (f["promoted_at_ms"].as_f64(), f["promoted_to"].as_str()) {
        (Some(promoted_at), Some(new_primary)) => {
            let port: u16 = new_primary
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .expect("promoted_to");
            assert_ne!(port, old_primary);
            assert!(
                set.node_with_port(port).is_some(),
                "{new_primary} is not ours"
            );
            // The Sentinels may have moved on since (a second failover, if
            // a starved machine kept the new primary from answering them
            // for a second): said, not failed, as the callers' figures
            // above and below are what the test is about.
            let now = set.primary_port();
            if now != Some(port) {
                eprintln!(
                    "--fault {fault}: the Sentinels named {new_primary} at the promotion and \
                     port {now:?} after the run\n{}",
                    set.logs()
                );
            }
            let bound = match moment {
                Moment::Quiet => None,
                Moment::InFlight if fault == "hang" => Some(IN_FLIGHT_HANG_SETTLED_MS),
                Moment::InFlight => Some(IN_FLIGHT_SETTLED_MS),
                Moment::InFlightShortOfReplicas => Some(SHORT_SETTLED_MS),
            };
            let recovered = x(victim, "recovered_after_promotion_ms");
            check(
                recovered <= RECOVERY_MS.max(bound.unwrap_or(0.0)),
                format!(
                    "the keys recovered {recovered:.0} ms after the promotion at \
                     {promoted_at:.0} ms (at most {RECOVERY_MS} ms, or the moment's bound)"
                ),
            );
            let settled = x(victim, "settled_after_promotion_ms");
            eprintln!("--fault {fault}: settled {settled:.0} ms after the promotion");
            if let Some(bound) = bound {
                check(
                    settled <= bound,
                    format!(
                        "a call of a victim key ended abnormally {settled:.0} ms after the \
                         promotion at {promoted_at:.0} ms (at most {bound} ms, counting the \
                         calls running at it)"
                    ),
                );
            }
        }
        _ => check(false, "no new primary was named within the run".to_owned()),
    }

    // No extra loads outside the outage. The ideal is continuous: keys ×
    // time / (ttl + load). A key that loads at the start of a stretch of
    // time and then every `ttl + load` loads up to one more than its share
    // of the stretch; outside the outage window are two stretches (before
    // the fault, after the window), so two loads per key are allowed on
    // top, as rounding. (With a TTL of seconds in a 10 s run the rounding
    // is most of the allowance: every key loads at about the same times. A
    // lease that does not hold across processes loads up to 4 times as
    // often, and fails this by far.)
    let (loads, ideal) = (
        n(victim, "loads_outside_outage"),
        x(victim, "ideal_loads_outside_outage"),
    );
    let rounding = 2.0 * n(victim, "keys") as f64;
    check(
        loads as f64 <= LOADS_OVER_IDEAL * ideal + rounding,
        format!(
            "the keys loaded {loads} times outside the outage window; ideal {ideal:.1} \
             (× {LOADS_OVER_IDEAL} + {rounding} rounding)"
        ),
    );

    // And, key by key, within 10 % of one load per expiry: a load that
    // starts before the value of the key's previous load could have
    // expired (its TTL less the jitter and any early refresh) is extra.
    let extra = n(victim, "extra_loads_outside_outage");
    check(
        extra as f64 <= (LOADS_OVER_IDEAL - 1.0) * loads as f64,
        format!(
            "{extra} of the {loads} loads outside the outage window came before the key's \
             value could have expired"
        ),
    );

    // The lost writes were measured (the values filled before the fault
    // still lived at the promotion: see the module's comment).
    let lost = &f["lost_writes"];
    eprintln!("--fault {fault}: lost writes {lost}");
    let checked = lost["values"]["checked"].as_u64().unwrap_or(0);
    // With 1 s values, those filled before a kill or a hang have expired
    // by the promotion: nothing is left to lose.
    if moment == Moment::Quiet {
        check(
            checked > 0,
            format!("no value was checked for loss: {lost}"),
        );
    }
    // Checked at a quiet moment only: with loads under way a process can
    // still write to the old primary in the moment between the promotion
    // and the news of it reaching the process (the old primary answers as
    // a master until the Sentinels demote it); those writes are among the
    // lost ones, printed above.
    if fault == "failover" && moment == Moment::Quiet {
        let writes = lost["values"]["old_primary_writes"].as_u64().unwrap_or(0);
        check(
            writes == 0,
            format!("{writes} writes went to the old primary after the promotion: {lost}"),
        );
    }
    assert!(
        failed.is_empty(),
        "--fault {fault}:\n- {}\n{f}",
        failed.join("\n- ")
    );
}

/// `SENTINEL FAILOVER`: a replica is promoted, the old primary demoted.
#[test]
fn a_sentinel_failover_is_invisible() {
    failover_scenario("failover", 3_000, 3_500, 10_000);
}

/// SIGKILL of the primary: the Sentinels see it down after 2 s and
/// promote a replica.
#[test]
fn a_killed_primary_is_replaced_without_errors() {
    failover_scenario("kill", 6_000, 6_500, 12_000);
}

/// SIGSTOP of the primary (a hung host, connections open): the same,
/// while every connection to it hangs instead of being refused.
#[test]
fn a_hung_primary_is_replaced_without_errors() {
    failover_scenario("hang", 6_000, 6_500, 12_000);
}

/// `SENTINEL FAILOVER` with loads under way: a lease the old primary
/// granted reaches the new one, and its fill may not; its holder, asked
/// about it, releases it there.
#[test]
fn a_failover_with_leases_in_flight_stalls_no_key() {
    in_flight_scenario("failover");
}

/// SIGKILL of the primary with loads under way.
#[test]
fn a_killed_primary_with_leases_in_flight_stalls_no_key() {
    in_flight_scenario("kill");
}

/// SIGSTOP of the primary with loads under way: the calls waiting on it
/// when it stopped are answered once the fleet reaches the new primary,
/// not at their wait deadline.
#[test]
fn a_hung_primary_with_leases_in_flight_stalls_no_key() {
    in_flight_scenario("hang");
}

/// SIGKILL of the primary with loads under way, every write waiting for 2
/// replicas (`--durability-replicas 2`): the promoted replica has at most
/// one of its own, so every write after the promotion is short of its
/// replicas. The fleet still serves as one cache: fills are stored and
/// answered, and the keys load once per expiry outside the outage (the
/// checks of every scenario), instead of every write waiting out its
/// `WAIT` in turn on one connection.
#[test]
fn a_primary_short_of_replicas_after_a_kill_keeps_the_cache_whole() {
    failover_scenario_with(
        "kill",
        Moment::InFlightShortOfReplicas,
        1_000,
        5_000,
        10_000,
        &[
            "--durability-replicas",
            "2",
            "--durability-timeout-ms",
            "50",
        ],
    );
}

/// `--fault` through Sentinels needs a steady run.
#[test]
fn sentinel_fault_flags_are_checked() {
    let _limit = time_limit(LIMIT);
    let out = output_within(
        Command::new(BIN).args([
            "fleet",
            "--quiet",
            "--sentinel",
            "redis://127.0.0.1:1",
            "--master-name",
            "m",
            "--fault",
            "kill",
        ]),
        FLEET_PATIENCE,
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("steady run"), "{stderr}");
}

/// A measurement, not a check of its own: the kill scenario with every
/// write waiting for a replica (`--durability-replicas 1`), whose lost
/// writes the run prints beside the default's. Run with `-- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn lost_writes_with_durability() {
    failover_scenario_with(
        "kill",
        Moment::Quiet,
        6_000,
        6_500,
        12_000,
        &[
            "--durability-replicas",
            "1",
            "--durability-timeout-ms",
            "50",
        ],
    );
}

/// A measurement, not a check of its own: `SENTINEL FAILOVER` with loads
/// under way and every write waiting for a replica, whose lost writes the
/// run prints beside the default's (`a_failover_with_leases_in_flight_stalls_no_key`).
/// Run with `-- --ignored --nocapture`.
#[test]
#[ignore]
fn lost_writes_in_flight_with_durability() {
    failover_scenario_with(
        "failover",
        // Each write waits for its replica: bounded as a shortfall's.
        Moment::InFlightShortOfReplicas,
        1_000,
        5_000,
        10_000,
        &[
            "--durability-replicas",
            "1",
            "--durability-timeout-ms",
            "50",
        ],
    );
}
