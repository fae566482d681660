//! End-to-end tests of the `onefill` binary.

use std::process::{Command, Output};
use std::time::Duration;

use onefill_testkit::{output_within, time_limit};
use serde_json::Value;

/// A run of the binary here takes well under a second (the demo: a few).
const PATIENCE: Duration = Duration::from_secs(60);
/// A test runs the binary a few times; past this it hangs.
const LIMIT: Duration = Duration::from_secs(120);

fn onefill(args: &[&str]) -> Output {
    output_within(
        Command::new(env!("CARGO_BIN_EXE_onefill")).args(args),
        PATIENCE,
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn demo_json(args: &[&str]) -> Value {
    let mut argv = vec!["demo", "--json"];
    argv.extend_from_slice(args);
    let out = onefill(&argv);
    assert!(
        out.status.success(),
        "demo failed: {}\n{}",
        out.status,
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("stdout is not JSON ({e}):\n{}", text(&out.stdout));
    })
}

fn strategy<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["strategies"]
        .as_array()
        .expect("strategies is an array")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no strategy {name} in {report}"))
}

fn loads(report: &Value, name: &str) -> u64 {
    strategy(report, name)["loads"]
        .as_u64()
        .expect("loads is a number")
}

#[test]
fn demo_json_shows_one_load_for_onefill() {
    let _limit = time_limit(LIMIT);
    let report = demo_json(&["--callers", "40", "--instances", "4", "--load-ms", "50"]);
    assert_eq!(report["callers"], 40);
    assert_eq!(report["instances"], 4);
    assert_eq!(report["load_ms"], 50);

    let names: Vec<&str> = report["strategies"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["naive", "coalescing_only", "onefill"]);

    assert_eq!(loads(&report, "onefill"), 1);
    let coalescing = loads(&report, "coalescing_only");
    assert!(
        (1..=4).contains(&coalescing),
        "coalescing only: {coalescing} loads"
    );
    let naive = loads(&report, "naive");
    assert!(
        naive >= 10,
        "naive: {naive} loads (more than the 4 instances)"
    );
    assert!(naive <= 40, "naive: {naive} loads for 40 callers");

    for name in ["naive", "coalescing_only", "onefill"] {
        let s = strategy(&report, name);
        assert_eq!(s["errors"], 0, "{name}: {s}");
        let p50 = s["p50_ms"].as_f64().expect("p50");
        let p99 = s["p99_ms"].as_f64().expect("p99");
        let max = s["max_ms"].as_f64().expect("max");
        assert!(p50 <= p99 && p99 <= max, "{name}: {s}");
        // At least the callers of the first load waited for its 50 ms.
        assert!(max >= 45.0, "{name}: {s}");
    }
}

#[test]
fn demo_json_shows_the_unsafe_release_lesson() {
    let _limit = time_limit(LIMIT);
    let report = demo_json(&[
        "--callers",
        "4",
        "--instances",
        "2",
        "--load-ms",
        "5",
        "--quiet",
    ]);
    let lesson = &report["unsafe_release"];
    assert_eq!(lesson["lease_ttl_ms"], 100);

    let bare = &lesson["bare_del"];
    assert_eq!(bare["third_loader_got_in"], true, "{bare}");
    assert_eq!(bare["b_lease_intact"], false, "{bare}");
    assert_eq!(bare["loads"], 3, "{bare}");
    assert_eq!(bare["lock_holder"], "C", "{bare}");

    let token = &lesson["token_release"];
    assert_eq!(token["release_returned"], false, "{token}");
    assert_eq!(token["third_loader_got_in"], false, "{token}");
    assert_eq!(token["b_lease_intact"], true, "{token}");
    assert_eq!(token["loads"], 2, "{token}");
    assert_eq!(token["lock_holder"], "B", "{token}");
}

#[test]
fn demo_prints_tables_on_stdout_and_progress_on_stderr() {
    let _limit = time_limit(LIMIT);
    let out = onefill(&[
        "demo",
        "--callers",
        "8",
        "--instances",
        "2",
        "--load-ms",
        "20",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in [
        "naive cache-aside",
        "in-process coalescing only",
        "onefill (coalescing + lease)",
        "p99 ms",
        "bare DEL",
        "Backend::release",
    ] {
        assert!(
            stdout.contains(needle),
            "{needle:?} missing from:\n{stdout}"
        );
    }
    let stderr = text(&out.stderr);
    assert!(stderr.contains("running strategy 2/3"), "{stderr}");
    assert!(stderr.contains("summary:"), "{stderr}");

    let quiet = onefill(&[
        "demo",
        "--callers",
        "2",
        "--instances",
        "1",
        "--load-ms",
        "1",
        "-q",
    ]);
    assert!(quiet.status.success());
    assert!(quiet.stderr.is_empty(), "{}", text(&quiet.stderr));
}

#[test]
fn bad_flags_fail_with_a_message() {
    let _limit = time_limit(LIMIT);
    for args in [
        &["demo", "--callers", "0"][..],
        &["demo", "--instances", "0"],
        &["demo", "--callers", "3", "--instances", "4"],
        &["demo", "--load-ms", "0"],
        &["demo", "--load-ms", "600000"],
        &["demo", "--callers", "many"],
        &["demo", "--key", ""],
        &["demo", "--no-such-flag"],
        &["no-such-command"],
    ] {
        let out = onefill(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let stderr = text(&out.stderr);
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    }
    let out = onefill(&["demo", "--callers", "3", "--instances", "4"]);
    assert!(text(&out.stderr).contains("--instances (4) must not exceed --callers (3)"));
}

#[test]
fn help_documents_every_flag() {
    let _limit = time_limit(LIMIT);
    let top = onefill(&["--help"]);
    assert!(top.status.success());
    assert!(text(&top.stdout).contains("demo"));

    let demo = onefill(&["demo", "--help"]);
    assert!(demo.status.success());
    let help = text(&demo.stdout);
    for flag in [
        "--callers",
        "--instances",
        "--load-ms",
        "--key",
        "--json",
        "--quiet",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    assert!(help.contains("[default: 200]"), "{help}");
}

/// `onefill demo --json | head -1`: a reader that goes away before the
/// report is written ends the command quietly (no panic, success).
#[test]
fn a_closed_stdout_ends_the_demo_quietly() {
    let _limit = time_limit(LIMIT);
    for args in [&["demo", "--json"][..], &["demo"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_onefill"))
            .args(args)
            .args(["--callers", "8", "--instances", "2", "--load-ms", "20"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the onefill binary runs");
        // Close the read end before anything is written.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("waits");
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{args:?}: {}\n{stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!stderr.contains("error:"), "{args:?}: {stderr}");
    }
}

/// `cargo install onefill-cli` gives the `onefill` command, and both crates
/// carry what a registry shows (readme, keywords, categories) and no
/// made-up repository.
#[test]
fn the_crates_are_ready_to_publish_and_install() {
    let _limit = time_limit(LIMIT);
    let cli = include_str!("../Cargo.toml");
    let lib = include_str!("../../onefill/Cargo.toml");
    let workspace = include_str!("../../../Cargo.toml");
    for manifest in [cli, lib] {
        for field in [
            "readme = ",
            "keywords = ",
            "categories = ",
            "description = ",
        ] {
            assert!(manifest.contains(field), "{field} missing:\n{manifest}");
        }
    }
    assert!(cli.contains("[[bin]]\nname = \"onefill\""), "{cli}");
    // A published crate's path dependency needs a version.
    assert!(
        cli.contains(r#"onefill = { path = "../onefill", version = "#),
        "{cli}"
    );
    assert!(!workspace.contains("example.invalid"), "{workspace}");
    // The package users install is `onefill-cli`, and the command it
    // installs names itself and the release it comes from.
    assert!(cli.contains("name = \"onefill-cli\""), "{cli}");
    let version = workspace
        .lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim_matches('"'))
        .expect("the workspace's version");
    let out = onefill(&["--version"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), format!("onefill {version}"));
}
