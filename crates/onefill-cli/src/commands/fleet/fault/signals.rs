//! The faults made with a signal (`kill`, `hang`) to a node on this
//! machine, and the guard that resumes a hung node whatever happens to the
//! parent: an error or a panic still drops it.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};

use super::topology::connect;
use crate::shared::progress::Progress;

/// The state a hung victim's resumption shares between the injector and
/// the parent's guard.
#[derive(Debug, Default)]
pub struct Stopped {
    /// The run is over (or failed): inject nothing more.
    pub closed: bool,
    /// The pid this run SIGSTOPped and has not resumed yet.
    pub pid: Option<u32>,
}

/// Resumes (SIGCONT) a node the injector stopped, when dropped; and stops
/// the injector from injecting anything after that.
pub struct ResumeGuard {
    stopped: Arc<Mutex<Stopped>>,
    progress: Progress,
}

impl ResumeGuard {
    /// A guard over `stopped`, saying what it resumed on `progress`.
    pub fn new(stopped: Arc<Mutex<Stopped>>, progress: Progress) -> ResumeGuard {
        ResumeGuard { stopped, progress }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stopped> {
        self.stopped.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for ResumeGuard {
    fn drop(&mut self) {
        let mut stopped = self.lock();
        stopped.closed = true;
        if let Some(pid) = stopped.pid.take() {
            match signal(pid, "-CONT") {
                Ok(()) => self
                    .progress
                    .say(format!("fault: resumed the victim (SIGCONT to pid {pid})")),
                Err(e) => eprintln!("fault: could not resume pid {pid} (send it SIGCONT): {e:#}"),
            }
        }
    }
}

/// Sends `signal` (`-KILL`, `-STOP`, `-CONT`) to `pid` with kill(1).
pub fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill {signal} {pid} exited with {status}");
    }
    Ok(())
}

/// The process id of the node at `addr`, which must run on this machine:
/// its address is a loopback one, its `INFO server` names a
/// `process_id`, and (where `/proc` exists) that process is a Redis server.
pub fn local_pid(addr: &str, url: &str) -> anyhow::Result<u32> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let loopback = host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        bail!(
            "the victim {addr} is not on a loopback address: kill and hang need it on this machine"
        );
    }
    let mut con = connect(url).with_context(|| format!("connecting to the victim {addr}"))?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut con)
        .with_context(|| format!("INFO server on {addr}"))?;
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse::<u32>().ok())
        .with_context(|| format!("no process_id in INFO server of {addr}"))?;
    let proc_dir = std::path::Path::new("/proc");
    if proc_dir.is_dir() {
        let comm = std::fs::read_to_string(proc_dir.join(pid.to_string()).join("comm"))
            .with_context(|| format!("no process {pid} on this machine (the victim {addr})"))?;
        if !comm.trim().starts_with("redis") {
            bail!("process {pid} is {:?}, not a Redis server", comm.trim());
        }
    }
    Ok(pid)
}
