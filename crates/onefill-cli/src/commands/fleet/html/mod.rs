//! `fleet --report FILE`: the run as one self-contained HTML page (inline
//! style and SVG, nothing fetched when it is opened): a summary table and
//! three charts over the run's time, with the fault window shaded:
//! answers by outcome, p50/p99 latency, and loads per key.
//!
//! [`series`] works the charts' data out of the merged records; [`charts`]
//! draws each with plotters; this file lays out the page.

mod charts;
mod series;

use super::args::{CallersKind, RunArgs};
use super::report::FleetReport;
use charts::{draw, Chart};
use series::{answers_by_outcome, latency_percentiles, loads_per_key, Axis};

/// The page of `report`, a run of `run`.
pub fn html_report(report: &FleetReport, run: &RunArgs) -> anyhow::Result<String> {
    let records = &report.records;
    let window = fault_window(report);
    let axis = Axis::of(&records.calls, &records.loads, window);
    let answers = answers_by_outcome(&records.calls, &axis);
    let latency = latency_percentiles(&records.calls, &axis);
    let loads = loads_per_key(&records.loads, &run.keys, &axis);
    let bucket = format!("{} ms", axis.bucket_ms);
    let answers_y = format!("answers per {bucket}");
    let charts = [
        Chart {
            id: "answers-over-time",
            title: "Answers over time, by outcome",
            y_label: &answers_y,
            series: &answers,
            records: records.calls.len(),
            axis,
            fault_window: window,
            dots: false,
        },
        Chart {
            id: "latency-over-time",
            title: "Latency of the answers, p50 and p99",
            y_label: "ms",
            series: &latency,
            records: records.calls.len(),
            axis,
            fault_window: window,
            dots: true,
        },
        Chart {
            id: "loads-over-time",
            title: "Loads started per key (cumulative)",
            y_label: "loads",
            series: &loads,
            records: records.loads.len(),
            axis,
            fault_window: window,
            dots: false,
        },
    ];
    let mut figures = String::new();
    for chart in &charts {
        figures.push_str("<figure>\n");
        figures.push_str(&draw(chart)?);
        figures.push_str(&format!(
            "<figcaption>{}</figcaption>\n</figure>\n",
            escape(&caption(chart.id, report, &bucket))
        ));
    }
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>onefill fleet: {title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>onefill fleet</h1>\n<p>{title}</p>\n{table}\n{figures}</body>\n</html>\n",
        title = escape(&shape(report, run)),
        table = summary_table(report, run),
    ))
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222;max-width:1140px}\
table{border-collapse:collapse;margin-bottom:24px}\
th,td{border:1px solid #ccc;padding:4px 10px;text-align:left}\
th{background:#f4f4f4;font-weight:600}\
figure{margin:0 0 24px 0}figcaption{color:#555;font-size:90%}";

/// The fault window, if the run had a fault: the cluster fault's outage
/// window, or a holder fault's.
fn fault_window(report: &FleetReport) -> Option<[f64; 2]> {
    match (&report.fault, &report.holder_fault) {
        (Some(f), _) => Some(f.outage_window_ms),
        (None, Some(h)) => Some(h.window_ms()),
        (None, None) => None,
    }
}

/// What the run was, in one line.
fn shape(report: &FleetReport, run: &RunArgs) -> String {
    let mode = match run.rate {
        Some(rate) => format!("{rate} req/s per process for {} ms", run.duration_ms),
        None => format!(
            "{} callers per process (a herd)",
            report.callers_per_process
        ),
    };
    format!(
        "{} processes, {mode}, {} key{}, {} ms loads, strategy {:?}",
        report.processes,
        run.keys.len(),
        if run.keys.len() == 1 { "" } else { "s" },
        run.load_ms,
        report.strategy
    )
}

/// The caption under a chart.
fn caption(id: &str, report: &FleetReport, bucket: &str) -> String {
    let shaded = if fault_window(report).is_some() {
        " The shaded band is the fault window."
    } else {
        ""
    };
    match id {
        "answers-over-time" => format!(
            "Calls counted where they were answered (start + latency), per {bucket}.{shaded}"
        ),
        "latency-over-time" => format!(
            "p50 and p99 of the calls answered in each {bucket} (buckets without answers \
             are skipped).{shaded}"
        ),
        _ => {
            let recorded = report.records.loads.len() as i64;
            let lost = if report.loads > recorded {
                format!(
                    " Redis counted {} loads, the workers' records show {recorded}: a killed \
                     process's loads are not in its records.",
                    report.loads
                )
            } else {
                String::new()
            };
            format!("Each step is a load's start.{lost}{shaded}")
        }
    }
}

/// How the callers called, for the summary table.
fn callers_kind(report: &FleetReport) -> String {
    match report.callers_kind {
        CallersKind::Async => "async tasks".to_owned(),
        CallersKind::Blocking => "OS threads (BlockingCache)".to_owned(),
        CallersKind::Mixed => format!(
            "mixed: async tasks and OS threads ({} calls by threads)",
            report.blocking_calls
        ),
    }
}

/// The summary table.
fn summary_table(report: &FleetReport, run: &RunArgs) -> String {
    let mut rows: Vec<(String, String)> = vec![
        ("strategy".into(), format!("{:?}", report.strategy)),
        ("callers".into(), callers_kind(report)),
        ("processes".into(), report.processes.to_string()),
        (
            "mode".into(),
            match run.rate {
                Some(rate) => format!("steady, {rate} req/s per process, {} ms", run.duration_ms),
                None => format!("herd, {} callers per process", report.callers_per_process),
            },
        ),
        ("keys".into(), run.keys.len().to_string()),
        ("load time".into(), format!("{} ms", run.load_ms)),
        ("loads (counted in Redis)".into(), report.loads.to_string()),
        (
            "loads (counted by the workers)".into(),
            report.local_loads.to_string(),
        ),
        ("calls".into(), report.calls.to_string()),
        ("errors".into(), report.errors.to_string()),
        (
            "worst p99 latency".into(),
            format!("{:.1} ms", report.p99_ms),
        ),
        ("max latency".into(), format!("{:.1} ms", report.max_ms)),
        ("Redis commands".into(), report.redis_commands.to_string()),
        ("wall time".into(), format!("{:.0} ms", report.wall_ms)),
    ];
    if let Some(f) = &report.fault {
        rows.push((
            "fault".into(),
            format!("{:?} of {}", f.kind, f.victim_address),
        ));
        rows.push(("fault at".into(), format!("{:.0} ms", f.fault_at_ms)));
        rows.push((
            "promoted at".into(),
            f.promoted_at_ms
                .map_or("not within the run".into(), |t| format!("{t:.0} ms")),
        ));
        rows.push((
            "fault window".into(),
            format!(
                "{:.0} to {:.0} ms",
                f.outage_window_ms[0], f.outage_window_ms[1]
            ),
        ));
        rows.push((
            "victim's keys: abnormal calls".into(),
            format!(
                "{} of {}",
                f.victim.answers.abnormal, f.victim.answers.calls
            ),
        ));
        rows.push((
            "healthy keys: abnormal calls".into(),
            format!(
                "{} of {}",
                f.healthy.answers.abnormal, f.healthy.answers.calls
            ),
        ));
    }
    if let Some(h) = &report.holder_fault {
        let s = &h.survivors;
        rows.push((
            "fault".into(),
            format!(
                "{:?} of pid {}, the lease holder of {}",
                h.kind, h.holder_pid, h.key
            ),
        ));
        rows.push(("fault at".into(), format!("{:.0} ms", h.fault_at_ms)));
        if let Some(t) = h.resumed_at_ms {
            rows.push(("holder resumed at".into(), format!("{t:.0} ms")));
        }
        rows.push((
            "survivors answered by (max / p99)".into(),
            format!("{:.0} / {:.0} ms", s.max_answer_ms, s.p99_answer_ms),
        ));
        rows.push((
            "takeover load started at".into(),
            s.takeover_load_started_ms
                .map_or("never".into(), |t| format!("{t:.0} ms")),
        ));
        rows.push((
            "every survivor answered".into(),
            format!(
                "{} ({} of {} callers, {} errors, {} wait timeouts)",
                if s.all_answered { "yes" } else { "no" },
                s.calls - s.errors,
                s.callers,
                s.errors,
                s.wait_timeouts
            ),
        ));
        rows.push((
            "the holder".into(),
            if h.holder.reported {
                format!(
                    "{} calls, {} errors, last answered at {} (not in the figures above)",
                    h.holder.calls,
                    h.holder.errors,
                    h.holder
                        .max_answer_ms
                        .map_or("never".into(), |t| format!("{t:.0} ms"))
                )
            } else {
                "killed: no report".into()
            },
        ));
    }
    // Two pairs a row: the table stays short above the charts.
    let body: String = rows
        .chunks(2)
        .map(|pairs| {
            let cells: String = pairs
                .iter()
                .map(|(k, v)| format!("<th>{}</th><td>{}</td>", escape(k), escape(v)))
                .collect();
            format!("<tr>{cells}</tr>\n")
        })
        .collect();
    format!("<table id=\"summary\">\n{body}</table>")
}

/// `text` safe inside HTML text and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::fleet::args::FleetStrategy;
    use crate::commands::fleet::fault::records::{CallRecord, LoadRecord};
    use crate::commands::fleet::report::Records;

    fn run() -> RunArgs {
        RunArgs {
            redis: vec!["redis://x".to_owned()],
            cluster: false,
            sentinel: Vec::new(),
            master_name: None,
            strategy: FleetStrategy::Onefill,
            keys: vec!["<hot>".to_owned()],
            callers: 2,
            callers_kind: CallersKind::Async,
            load_ms: 200,
            rate: None,
            duration_ms: 10_000,
            ttl_ms: 60_000,
            grace_ms: 0,
            backend_timeout_ms: None,
            lease_ttl_ms: None,
            wait_deadline_ms: None,
            detail: false,
            strict: false,
            durability_replicas: 0,
            durability_timeout_ms: 50,
            keep_counters: false,
            no_l1: false,
            chaos: false,
        }
    }

    fn report() -> FleetReport {
        let call = |outcome, latency_ms| CallRecord {
            started_ms: 1.0,
            key: 0,
            outcome,
            latency_ms,
            age_ms: 0,
        };
        FleetReport {
            strategy: FleetStrategy::Onefill,
            processes: 1,
            callers_per_process: 2,
            callers_kind: CallersKind::Async,
            namespace: "ns".to_owned(),
            loads_per_key: vec![("<hot>".to_owned(), 1)],
            loads: 1,
            local_loads_per_key: vec![("<hot>".to_owned(), 1)],
            local_loads: 1,
            fault: None,
            holder_fault: None,
            write: None,
            redis_commands: 10,
            calls: 2,
            errors: 0,
            blocking_calls: 0,
            max_ms: 201.0,
            p99_ms: 201.0,
            workers: Vec::new(),
            wall_ms: 210.0,
            records: Records {
                calls: vec![call(3, 200.0), call(4, 201.0)],
                loads: vec![LoadRecord {
                    started_ms: 1.0,
                    key: 0,
                    ended_ms: Some(201.0),
                }],
            },
        }
    }

    #[test]
    fn the_page_is_self_contained_with_three_charts_and_the_table() {
        let page = html_report(&report(), &run()).expect("renders");
        assert!(page.starts_with("<!DOCTYPE html>"));
        for id in ["answers-over-time", "latency-over-time", "loads-over-time"] {
            assert!(
                page.contains(&format!("<svg id=\"{id}\" class=\"chart\"")),
                "{id}"
            );
        }
        assert!(page.contains("data-points=\"2\""), "two calls");
        assert!(page.contains("data-points=\"1\""), "one load");
        assert!(page.contains("<table id=\"summary\">"));
        assert!(page.contains("&lt;hot&gt;"), "keys are escaped");
        assert!(!page.contains("<hot>"));
        assert!(
            !page.contains("src=") && !page.contains("href="),
            "nothing fetched"
        );
        assert!(!page.contains("fault window"), "no fault, no shade");
    }
}
