//! The parent's side of the worker processes: starting `--processes`
//! copies of this binary as `onefill worker`, the start handshake (each
//! says "ready", all get "go" together), and reading each one's report,
//! one JSON line. A plain fleet and a chaos run start their workers here.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{bail, Context};
use serde::de::DeserializeOwned;

use super::args::{RunArgs, WorkerArgs};
use super::protocol::{GO, NOT_READY, READY};

/// A started worker process and its pipes.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // A worker that outlives its report is killed, never orphaned.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `processes` workers of `args` and waits until each is ready
/// (connected); one that cannot start fails the fleet with its reason.
pub fn start_workers(
    args: &RunArgs,
    processes: u32,
    namespace: &str,
) -> anyhow::Result<Vec<Worker>> {
    let exe = std::env::current_exe().context("locating the onefill binary")?;
    let run_json = args.to_json().context("encoding the run for the workers")?;
    let mut workers = Vec::new();
    for _ in 0..processes {
        workers.push(spawn(&exe, &run_json, namespace)?);
    }
    for w in &mut workers {
        let mut line = String::new();
        w.stdout.read_line(&mut line)?;
        let line = line.trim();
        if line == READY {
            continue;
        }
        // One line for the fleet (the other workers are killed on drop),
        // whatever number of them failed the same way.
        match line.strip_prefix(NOT_READY) {
            Some(reason) => bail!("a worker could not start: {}", reason.trim()),
            None => {
                let status = w.child.wait()?;
                bail!("a worker exited before it was ready ({status})")
            }
        }
    }
    Ok(workers)
}

/// Starts every worker's run together.
pub fn release(workers: &mut [Worker]) -> anyhow::Result<()> {
    for w in workers {
        writeln!(w.stdin, "{GO}")?;
        w.stdin.flush()?;
    }
    Ok(())
}

/// Reads each worker's report (one JSON line) and waits for it to exit.
pub fn collect_reports<T: DeserializeOwned>(workers: &mut [Worker]) -> anyhow::Result<Vec<T>> {
    workers.iter_mut().map(collect_report).collect()
}

/// Reads one worker's report (one JSON line) and waits for it to exit.
pub fn collect_report<T: DeserializeOwned>(w: &mut Worker) -> anyhow::Result<T> {
    match collect_faulted(w)? {
        Some(report) => Ok(report),
        None => bail!("a worker exited without a report"),
    }
}

/// Reads the report of a worker that may have been killed: `None` if its
/// output ended without one and it did not exit by itself (a signal).
pub fn collect_faulted<T: DeserializeOwned>(w: &mut Worker) -> anyhow::Result<Option<T>> {
    let mut line = String::new();
    w.stdout.read_line(&mut line)?;
    if line.trim().is_empty() {
        let status = w.child.wait()?;
        if status.code().is_some() {
            bail!("a worker exited with {status} without a report");
        }
        return Ok(None);
    }
    let report: T = serde_json::from_str(line.trim()).with_context(|| {
        let shown: String = line.trim().chars().take(200).collect();
        format!("a worker's report was not JSON: {shown:?}")
    })?;
    let status = w.child.wait()?;
    if !status.success() {
        bail!("a worker exited with {status}");
    }
    Ok(Some(report))
}

/// Starts one worker, with the run as one JSON value.
fn spawn(exe: &std::path::Path, run_json: &str, namespace: &str) -> anyhow::Result<Worker> {
    let mut cmd = Command::new(exe);
    cmd.args(WorkerArgs::command_line(run_json, namespace));
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting a worker process")?;
    let stdin = child.stdin.take().context("worker stdin")?;
    let stdout = BufReader::new(child.stdout.take().context("worker stdout")?);
    Ok(Worker {
        child,
        stdin,
        stdout,
    })
}
