//! The demo's report: the JSON document and the text tables.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::herd::{HerdConfig, HerdOutcome};
use super::lesson::{Branch, Lesson, Release, Step};
use crate::shared::percentile::percentile;

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Everything `onefill demo` found; serialized as-is for `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// Concurrent callers.
    pub callers: usize,
    /// Cache instances.
    pub instances: usize,
    /// One origin load, in ms.
    pub load_ms: u64,
    /// The key asked for.
    pub key: String,
    /// Where values and leases lived.
    pub backend: &'static str,
    /// One entry per strategy, in the order run.
    pub strategies: Vec<StrategyReport>,
    /// The unsafe-release lesson.
    pub unsafe_release: Lesson,
}

/// One strategy's results.
#[derive(Debug, Clone, Serialize)]
pub struct StrategyReport {
    /// Machine-readable name: `naive`, `coalescing_only`, `onefill`.
    pub name: &'static str,
    /// Human-readable name.
    pub title: &'static str,
    /// Origin loads.
    pub loads: u64,
    /// The loads this strategy should make, in words.
    pub expected_loads: String,
    /// Median caller latency in ms (null if no caller succeeded).
    pub p50_ms: Option<f64>,
    /// 99th-percentile caller latency in ms.
    pub p99_ms: Option<f64>,
    /// Slowest caller in ms.
    pub max_ms: Option<f64>,
    /// Callers that got an error.
    pub errors: u64,
    /// The first error, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// From the release of the herd to the last answer, in ms.
    pub wall_ms: f64,
}

impl StrategyReport {
    /// Summarizes one herd.
    pub fn new(outcome: &HerdOutcome, config: &HerdConfig) -> Self {
        let mut sorted = outcome.latencies.clone();
        sorted.sort_unstable();
        StrategyReport {
            name: outcome.strategy.name(),
            title: outcome.strategy.title(),
            loads: outcome.loads,
            expected_loads: outcome.strategy.expected_loads(config),
            p50_ms: percentile(&sorted, 50.0).map(ms),
            p99_ms: percentile(&sorted, 99.0).map(ms),
            max_ms: percentile(&sorted, 100.0).map(ms),
            errors: outcome.errors,
            first_error: outcome.first_error.clone(),
            wall_ms: ms(outcome.wall),
        }
    }
}

impl DemoReport {
    /// The report as pretty JSON.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string_pretty(self)
    }

    /// The report as text: the strategies table, then the lesson.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Thundering herd: {} callers on {} cache instances, one cold key {:?}, origin load {} ms ({} backend)\n",
            self.callers, self.instances, self.key, self.load_ms, self.backend
        );
        out.push_str(&strategies_table(&self.strategies));
        out.push('\n');
        out.push_str(&lesson_text(&self.unsafe_release));
        out
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

fn strategies_table(rows: &[StrategyReport]) -> String {
    let header = [
        "strategy", "loads", "expected", "p50 ms", "p99 ms", "max ms", "errors",
    ];
    let body: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.title.to_owned(),
                r.loads.to_string(),
                r.expected_loads.clone(),
                cell(r.p50_ms),
                cell(r.p99_ms),
                cell(r.max_ms),
                r.errors.to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &body {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            let pad = " ".repeat(w - c.chars().count());
            // Text columns left-aligned, numbers right-aligned.
            let _ = if i == 0 || i == 2 {
                write!(s, "{c}{pad}  ")
            } else {
                write!(s, "{pad}{c}  ")
            };
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(&header.map(str::to_owned));
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&line(&rule));
    for row in &body {
        out.push_str(&line(row));
    }
    for r in rows.iter().filter(|r| r.first_error.is_some()) {
        let _ = writeln!(
            out,
            "  {}: first error: {}",
            r.title,
            r.first_error.as_deref().unwrap_or_default()
        );
    }
    out
}

fn step_line(out: &mut String, step: &Step) {
    let _ = writeln!(
        out,
        "  t={:>3} ms  {}  {}  [loads: {}]",
        step.t_ms, step.actor, step.event, step.loads
    );
}

fn branch_text(out: &mut String, label: &str, branch: &Branch) {
    let _ = writeln!(out, "  {label}");
    for step in &branch.steps {
        step_line(out, step);
    }
}

fn verdict(branch: &Branch) -> String {
    let c = if branch.third_loader_got_in {
        "C got in"
    } else {
        "C kept out"
    };
    let how = match (branch.release, branch.release_returned) {
        (Release::BareDel, _) => "bare DEL".to_owned(),
        (Release::TokenChecked, Some(r)) => format!("token-checked release (returned {r})"),
        (Release::TokenChecked, None) => "token-checked release".to_owned(),
    };
    format!("{how}: {} loads, {c}", branch.loads)
}

fn lesson_text(lesson: &Lesson) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Unsafe release: lease TTL {} ms, loader A runs {} ms without a watchdog \
         (Backend trait on a MemoryBackend, tokio clock)",
        lesson.lease_ttl_ms, lesson.a_load_ms
    );
    for step in &lesson.shared_steps {
        step_line(&mut out, step);
    }
    let _ = writeln!(
        out,
        "  then A's load gives up at t={} ms and A lets go of the lock, and loader C arrives:",
        lesson.a_load_ms
    );
    branch_text(
        &mut out,
        "a) bare DEL of the lock (unsafe):",
        &lesson.bare_del,
    );
    branch_text(
        &mut out,
        "b) compare-and-delete, Backend::release with A's token (onefill):",
        &lesson.token_release,
    );
    let _ = writeln!(
        out,
        "  => {}; {}.",
        verdict(&lesson.bare_del),
        verdict(&lesson.token_release)
    );
    out
}
