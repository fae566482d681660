//! One worker's calls summed up into its report: outcomes, errors,
//! latency percentiles and the call log (which the parent prints with
//! `--detail` only, but always reads).

use std::time::Duration;

use super::caller::Answer;
use super::load_log::MAX_LOG;
use super::origin::{age_ms, unix_ms};
use super::sampler::Sample;
use crate::commands::fleet::outcome::{outcome_code, ERROR};
use crate::commands::fleet::report::WorkerReport;
use crate::shared::percentile::percentile;

/// One call as a caller saw it.
pub struct Call {
    pub started: Duration,
    pub key_index: usize,
    pub latency: Duration,
    pub outcome: Result<&'static str, String>,
    /// Age of the answered value (0 for an error or a value without a
    /// load time).
    pub age_ms: u64,
    /// Made by an OS thread on the blocking cache, not by a task.
    pub on_thread: bool,
}

impl Call {
    /// A call started at `started` (from the worker's t = 0) and answered
    /// `answer` after `latency`, by a task or an OS thread.
    pub fn new(
        started: Duration,
        key_index: usize,
        latency: Duration,
        answer: Answer,
        on_thread: bool,
    ) -> Call {
        let age_ms = match &answer {
            Ok((_, value)) => age_ms(value, unix_ms()),
            Err(_) => 0,
        };
        Call {
            started,
            key_index,
            latency,
            outcome: answer.map(|(name, _)| name),
            age_ms,
            on_thread,
        }
    }
}

/// The report of `calls`, without the parts only the callers know.
pub fn summarize(
    calls: Vec<Call>,
    local_loads: u64,
    stats: Option<onefill::Stats>,
    samples: Vec<Sample>,
) -> WorkerReport {
    let mut report = WorkerReport {
        pid: std::process::id(),
        calls: calls.len() as u64,
        local_loads,
        stats,
        samples,
        ..Default::default()
    };
    let first_answer = calls
        .iter()
        .filter(|c| c.outcome.is_ok())
        .map(|c| c.started + c.latency)
        .min();
    let mut latencies: Vec<Duration> = Vec::with_capacity(calls.len());
    for call in &calls {
        latencies.push(call.latency);
        report.blocking_calls += u64::from(call.on_thread);
        if report.call_log.len() < MAX_LOG {
            report.call_log.push([
                call.started.as_millis() as u64,
                call.key_index as u64,
                match &call.outcome {
                    Ok(name) => outcome_code(name),
                    Err(_) => ERROR,
                },
                call.latency.as_micros() as u64,
                call.age_ms,
            ]);
        }
        match &call.outcome {
            Ok(name) => {
                *report.outcomes.entry((*name).to_owned()).or_default() += 1;
                let slow = matches!(*name, "loaded" | "waited" | "degraded" | "naive_load");
                if slow && first_answer.is_some_and(|first| call.started > first) {
                    report.slow_after_first += 1;
                }
            }
            Err(message) => {
                report.errors += 1;
                if report.error_messages.len() < 5 {
                    report.error_messages.push(message.clone());
                }
            }
        }
    }
    latencies.sort_unstable();
    let ms = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    report.p50_ms = ms(percentile(&latencies, 50.0));
    report.p99_ms = ms(percentile(&latencies, 99.0));
    report.max_ms = ms(latencies.last().copied());
    report
}
