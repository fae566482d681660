//! The `holder_fault` section of a fleet report: what the callers of the
//! other processes saw when the lease holder was killed or stopped, worked
//! out from their call and load logs by a pure function
//! ([`analyse_holder`]), and its few lines of text.
//!
//! The measure of a takeover is when the survivors were answered, from
//! "go": a dead holder's load is lost, and a survivor's callers are answered
//! once some survivor has taken the lease over and loaded again.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::holder::HolderInjected;
use super::kind::FaultKind;
use super::records::{CallRecord, LoadRecord};
use crate::commands::fleet::outcome::ERROR;
use crate::shared::percentile::percentile;

/// What the surviving processes' callers saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SurvivorFigures {
    /// Surviving processes.
    pub processes: u32,
    /// Their callers (processes × callers per process).
    pub callers: u64,
    /// Calls they reported.
    pub calls: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Waits that gave up at the waiters' deadline (the caches' counter).
    pub wait_timeouts: u64,
    /// Every surviving caller answered, without an error or a wait
    /// timeout.
    pub all_answered: bool,
    /// When the last caller was answered, ms after "go".
    pub max_answer_ms: f64,
    /// 99th percentile of the answer times, ms after "go".
    pub p99_answer_ms: f64,
    /// When the first load of the faulted key after the fault started (the
    /// takeover), ms after "go"; `None` if none did.
    pub takeover_load_started_ms: Option<f64>,
    /// Loads the survivors ran.
    pub loads: u64,
}

/// What became of the faulted holder.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HolderFigures {
    /// It sent its report (a stopped holder, once resumed).
    pub reported: bool,
    /// Its calls (reported ones only).
    pub calls: u64,
    /// Its calls that failed.
    pub errors: u64,
    /// When its last caller was answered, ms after "go": after the resume,
    /// so apart from the survivors'.
    pub max_answer_ms: Option<f64>,
}

/// The `holder_fault` section of a fleet report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HolderFaultReport {
    /// The fault.
    pub kind: FaultKind,
    /// The key whose lease holder was faulted.
    pub key: String,
    /// The holder's process id.
    pub holder_pid: u32,
    /// When the signal was sent, ms after "go".
    pub fault_at_ms: f64,
    /// When a stopped holder was resumed (SIGCONT), ms after "go".
    pub resumed_at_ms: Option<f64>,
    /// The other processes.
    pub survivors: SurvivorFigures,
    /// The faulted holder.
    pub holder: HolderFigures,
}

impl HolderFaultReport {
    /// The window the fault was felt in, ms after "go": from the signal to
    /// the resume of a stopped holder, or to the survivors' last answer.
    pub fn window_ms(&self) -> [f64; 2] {
        let end = self
            .resumed_at_ms
            .unwrap_or(self.survivors.max_answer_ms)
            .max(self.fault_at_ms);
        [self.fault_at_ms, end]
    }

    /// A few lines for the text report.
    pub fn to_text(&self) -> String {
        let s = &self.survivors;
        let mut lines = vec![
            format!(
                "fault {:?} of pid {} (the lease holder of {}) at {:.0} ms{}",
                self.kind,
                self.holder_pid,
                self.key,
                self.fault_at_ms,
                self.resumed_at_ms
                    .map_or(String::new(), |t| format!(", resumed at {t:.0} ms"))
            ),
            format!(
                "  survivors: {} processes, {} of {} callers answered, {} errors, {} wait \
                 timeouts: {}; answered by {:.0} ms (p99 {:.0} ms) after the start; takeover \
                 load at {}",
                s.processes,
                s.calls - s.errors,
                s.callers,
                s.errors,
                s.wait_timeouts,
                if s.all_answered {
                    "all answered"
                } else {
                    "NOT all answered"
                },
                s.max_answer_ms,
                s.p99_answer_ms,
                s.takeover_load_started_ms
                    .map_or("never".to_owned(), |t| format!("{t:.0} ms"))
            ),
        ];
        let h = &self.holder;
        lines.push(if h.reported {
            format!(
                "  the holder (apart): {} calls, {} errors, last answered at {}",
                h.calls,
                h.errors,
                h.max_answer_ms
                    .map_or("never".to_owned(), |t| format!("{t:.0} ms"))
            )
        } else {
            "  the holder did not report (killed)".to_owned()
        });
        lines.join("\n")
    }
}

/// What the surviving processes sent, on the parent's clock.
pub struct SurvivorLogs<'a> {
    /// Surviving processes.
    pub processes: u32,
    /// Callers per process.
    pub callers_per_process: u32,
    /// Their calls.
    pub calls: &'a [CallRecord],
    /// Their loads.
    pub loads: &'a [LoadRecord],
    /// Their caches' wait timeouts, summed.
    pub wait_timeouts: u64,
}

/// Works the `holder_fault` section out of what the injector did, the
/// survivors' logs and (if it reported) the holder's calls.
pub fn analyse_holder(
    injected: &HolderInjected,
    key_names: &[String],
    survivors: &SurvivorLogs<'_>,
    holder_calls: Option<&[CallRecord]>,
    resumed_at_ms: Option<f64>,
) -> HolderFaultReport {
    let mut answers: Vec<Duration> = survivors
        .calls
        .iter()
        .map(|c| Duration::from_secs_f64((c.started_ms + c.latency_ms).max(0.0) / 1000.0))
        .collect();
    answers.sort_unstable();
    let ms = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    let errors = survivors
        .calls
        .iter()
        .filter(|c| c.outcome == ERROR)
        .count() as u64;
    let callers = u64::from(survivors.processes) * u64::from(survivors.callers_per_process);
    let calls = survivors.calls.len() as u64;
    let takeover = survivors
        .loads
        .iter()
        .filter(|l| l.key == injected.key && l.started_ms >= injected.fault_at_ms)
        .map(|l| l.started_ms)
        .fold(None, |first: Option<f64>, t| {
            Some(first.map_or(t, |f| f.min(t)))
        });
    let holder = match holder_calls {
        Some(calls) => HolderFigures {
            reported: true,
            calls: calls.len() as u64,
            errors: calls.iter().filter(|c| c.outcome == ERROR).count() as u64,
            max_answer_ms: calls
                .iter()
                .map(|c| c.started_ms + c.latency_ms)
                .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t)))),
        },
        None => HolderFigures::default(),
    };
    HolderFaultReport {
        kind: injected.kind,
        key: key_names.get(injected.key).cloned().unwrap_or_default(),
        holder_pid: injected.pid,
        fault_at_ms: injected.fault_at_ms,
        resumed_at_ms,
        survivors: SurvivorFigures {
            processes: survivors.processes,
            callers,
            calls,
            errors,
            wait_timeouts: survivors.wait_timeouts,
            all_answered: calls == callers && errors == 0 && survivors.wait_timeouts == 0,
            max_answer_ms: ms(answers.last().copied()),
            p99_answer_ms: ms(percentile(&answers, 99.0)),
            takeover_load_started_ms: takeover,
            loads: survivors.loads.len() as u64,
        },
        holder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAITED: u64 = 4;
    const LOADED: u64 = 3;

    fn call(started_ms: f64, outcome: u64, latency_ms: f64) -> CallRecord {
        CallRecord {
            started_ms,
            key: 0,
            outcome,
            latency_ms,
            age_ms: 0,
        }
    }

    fn injected() -> HolderInjected {
        HolderInjected {
            kind: FaultKind::KillHolder,
            key: 0,
            pid: 42,
            fault_at_ms: 500.0,
        }
    }

    /// 3 survivors × 10 callers, answered at 5 000 + i ms.
    fn answered() -> Vec<CallRecord> {
        (0..30)
            .map(|i| {
                call(
                    1.0,
                    if i < 10 { LOADED } else { WAITED },
                    4_999.0 + i as f64,
                )
            })
            .collect()
    }

    fn logs<'a>(
        calls: &'a [CallRecord],
        loads: &'a [LoadRecord],
        timeouts: u64,
    ) -> SurvivorLogs<'a> {
        SurvivorLogs {
            processes: 3,
            callers_per_process: 10,
            calls,
            loads,
            wait_timeouts: timeouts,
        }
    }

    #[test]
    fn answer_times_count_from_go_and_the_takeover_is_the_first_load_after_the_fault() {
        let calls = answered();
        let loads = [
            LoadRecord {
                started_ms: 3_000.0,
                key: 0,
                ended_ms: Some(5_000.0),
            },
            LoadRecord {
                started_ms: 2_000.0,
                key: 1,
                ended_ms: Some(2_100.0),
            },
        ];
        let names = vec!["hot".to_owned(), "other".to_owned()];
        let r = analyse_holder(&injected(), &names, &logs(&calls, &loads, 0), None, None);
        assert_eq!(r.key, "hot");
        let s = &r.survivors;
        assert_eq!((s.callers, s.calls, s.errors), (30, 30, 0));
        assert!(s.all_answered);
        assert!((s.max_answer_ms - 5_029.0).abs() < 1e-6, "{s:?}");
        assert!((s.p99_answer_ms - 5_029.0).abs() < 1e-6, "{s:?}");
        assert_eq!(s.takeover_load_started_ms, Some(3_000.0));
        assert_eq!(s.loads, 2);
        assert!(!r.holder.reported);
        assert_eq!(r.window_ms(), [500.0, 5_029.0]);
        assert!(r.to_text().contains("all answered"), "{}", r.to_text());
    }

    #[test]
    fn an_error_a_wait_timeout_or_a_missing_call_is_not_all_answered() {
        let mut calls = answered();
        let r = analyse_holder(&injected(), &[], &logs(&calls, &[], 1), None, None);
        assert!(!r.survivors.all_answered, "a wait timeout");
        calls[3].outcome = ERROR;
        let r = analyse_holder(&injected(), &[], &logs(&calls, &[], 0), None, None);
        assert_eq!(r.survivors.errors, 1);
        assert!(!r.survivors.all_answered, "an error");
        let r = analyse_holder(&injected(), &[], &logs(&calls[5..], &[], 0), None, None);
        assert!(!r.survivors.all_answered, "callers without an answer");
        assert!(r.to_text().contains("NOT all answered"));
    }

    #[test]
    fn a_stopped_holder_s_late_answers_are_apart() {
        let calls = answered();
        let late = [call(1.0, LOADED, 9_000.0), call(1.0, ERROR, 8_000.0)];
        let mut stopped = injected();
        stopped.kind = FaultKind::StopHolder;
        let r = analyse_holder(
            &stopped,
            &[],
            &logs(&calls, &[], 0),
            Some(&late),
            Some(7_000.0),
        );
        assert!((r.survivors.max_answer_ms - 5_029.0).abs() < 1e-6);
        assert!(
            r.survivors.all_answered,
            "the holder's error is not a survivor's"
        );
        assert_eq!(r.holder.calls, 2);
        assert_eq!(r.holder.errors, 1);
        assert_eq!(r.holder.max_answer_ms, Some(9_001.0));
        assert_eq!(r.window_ms(), [500.0, 7_000.0]);
    }
}
