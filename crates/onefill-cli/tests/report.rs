//! `onefill fleet --report FILE`: the HTML page of a run, checked as a
//! person would see it. A short herd and a short run whose lease holder
//! is killed write their pages; headless Chromium opens each (from the
//! file alone, nothing fetched) and the DOM it dumps must show every chart
//! with data (its `data-points` above 0 and lines with points) and the
//! summary table, and the killed holder's page its fault window.
//!
//! Without a `chromium` (or `chromium-browser`) command the test fails
//! under CI (`CI` set: .ci/run installs it) and is skipped elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use onefill_testkit::{output_within, time_limit, RedisServer};

const BIN: &str = env!("CARGO_BIN_EXE_onefill");
const CHARTS: [&str; 3] = ["answers-over-time", "latency-over-time", "loads-over-time"];
/// A run here takes a few seconds; Chromium's dump a few more.
const PATIENCE: Duration = Duration::from_secs(60);
/// Two runs and two dumps; past this the test hangs.
const LIMIT: Duration = Duration::from_secs(180);

/// The browser to check the pages with, if there is one.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs `fleet --report page` with `extra` flags.
fn fleet_report(server: &RedisServer, page: &Path, extra: &[&str]) {
    let out = output_within(
        Command::new(BIN)
            .args(["fleet", "--quiet", "--redis", &server.url(), "--report"])
            .arg(page)
            .args(extra),
        PATIENCE,
    );
    assert!(
        out.status.success(),
        "fleet failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The DOM of `page` once Chromium has loaded it.
fn dom(browser: &Path, page: &Path, profile: &Path) -> String {
    let out = output_within(
        Command::new(browser)
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("--dump-dom")
            .arg(format!("file://{}", page.display())),
        PATIENCE,
    );
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The element `<tag id="id" …>…</tag>` of `dom`.
fn element<'a>(dom: &'a str, tag: &str, id: &str) -> &'a str {
    let open = format!("<{tag} id=\"{id}\"");
    let start = dom
        .find(&open)
        .unwrap_or_else(|| panic!("no {open} in the page"));
    let close = format!("</{tag}>");
    let end = dom[start..]
        .find(&close)
        .unwrap_or_else(|| panic!("{open} is not closed"));
    &dom[start..start + end + close.len()]
}

/// The value of `name="…"` in the opening tag of `element`.
fn attribute<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let open = &element[..element.find('>')?];
    let from = open.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = open[from..].find('"')?;
    Some(&open[from..from + len])
}

/// Asserts that every chart of `dom` has data and returns each chart's
/// element.
fn charts_have_data(dom: &str, what: &str) -> Vec<String> {
    CHARTS
        .iter()
        .map(|id| {
            let svg = element(dom, "svg", id);
            assert_eq!(attribute(svg, "class"), Some("chart"), "{what}: {id}");
            let points: u64 = attribute(svg, "data-points")
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("{what}: {id} has no data-points"));
            assert!(points > 0, "{what}: {id} shows no records");
            let series: u64 = attribute(svg, "data-series")
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            assert!(series > 0, "{what}: {id} draws no line");
            // Each data line is a polyline of width 2 (the axes' are of
            // width 1) with points (one, when a herd's answers all fall in
            // one bucket).
            let lines: Vec<&str> = svg
                .split("<polyline")
                .skip(1)
                .filter(|l| l[..l.find('>').unwrap_or(l.len())].contains("stroke-width=\"2\""))
                .filter_map(|l| {
                    let from = l.find(" points=\"")? + 9;
                    Some(&l[from..from + l[from..].find('"')?])
                })
                .filter(|p| p.split_whitespace().count() >= 1)
                .collect();
            assert!(
                lines.len() as u64 >= series,
                "{what}: {id} has {} lines with points, {series} series",
                lines.len()
            );
            svg.to_owned()
        })
        .collect()
}

#[test]
fn fleet_report_pages_show_every_chart_with_data_in_a_browser() {
    let _limit = time_limit(LIMIT);
    let Some(browser) = chromium() else {
        if std::env::var_os("CI").is_some() {
            panic!(
                "no chromium (or chromium-browser) command: CI must have it (.ci/run installs \
                 it) to check the HTML report"
            );
        }
        eprintln!("skipped: no chromium command to open the HTML report with");
        return;
    };
    let dir = tempfile::tempdir().expect("a directory");
    let server = RedisServer::start();

    let herd = dir.path().join("herd.html");
    fleet_report(
        &server,
        &herd,
        &["--processes", "2", "--callers", "20", "--load-ms", "200"],
    );
    let dom_herd = dom(&browser, &herd, &dir.path().join("profile"));
    let charts = charts_have_data(&dom_herd, "herd");
    assert!(
        charts.iter().all(|svg| !svg.contains("fault window")),
        "no fault, no window"
    );
    let table = element(&dom_herd, "table", "summary");
    assert!(
        table.contains("loads (counted in Redis)</th><td>1</td>"),
        "{table}"
    );
    assert!(table.contains("calls</th><td>40</td>"), "{table}");

    let killed = dir.path().join("kill-holder.html");
    fleet_report(
        &server,
        &killed,
        &[
            "--processes",
            "3",
            "--callers",
            "10",
            "--load-ms",
            "500",
            "--fault",
            "kill-holder",
            "--fault-at-ms",
            "200",
        ],
    );
    let dom_killed = dom(&browser, &killed, &dir.path().join("profile"));
    for svg in charts_have_data(&dom_killed, "kill-holder") {
        assert!(svg.contains("fault window"), "the window in the legend");
        assert!(svg.contains("fill=\"#FFCDCD\""), "the window shaded");
    }
    let table = element(&dom_killed, "table", "summary");
    assert!(table.contains("KillHolder of pid"), "{table}");
    assert!(
        table.contains("every survivor answered</th><td>yes"),
        "{table}"
    );
}
