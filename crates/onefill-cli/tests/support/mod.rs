//! What the fleet tests share: the `onefill` binary, and a `fleet --json`
//! run read back as JSON.

// Each test binary that includes this uses only some of it.
#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;

use onefill_testkit::output_within;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_onefill");

/// The longest fleet of these tests runs 10 s (a 6 s load: less), plus
/// start-up.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn fleet(urls: &[String], extra: &[&str]) -> Value {
    let mut cmd = Command::new(BIN);
    cmd.args(["fleet", "--json", "--quiet"]);
    for u in urls {
        cmd.args(["--redis", u]);
    }
    let out = output_within(cmd.args(extra), PATIENCE);
    assert!(
        out.status.success(),
        "fleet failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).expect("fleet JSON")
}

pub fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {v}"))
}

pub fn workers(v: &Value) -> &Vec<Value> {
    v["workers"].as_array().expect("workers")
}

pub fn outcome(w: &Value, name: &str) -> u64 {
    w["outcomes"][name].as_u64().unwrap_or(0)
}
