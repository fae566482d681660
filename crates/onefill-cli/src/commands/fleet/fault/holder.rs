//! The injector thread of `fleet --fault kill-holder|stop-holder`: at
//! `--fault-at-ms` after the parent's "go" it finds the worker process that
//! holds the lease of one of the run's keys and sends it SIGKILL or
//! SIGSTOP. What it did is a [`HolderInjected`].
//!
//! The holder is the process named by the key's `loads:pid` key (each
//! worker writes its pid there when it starts a load), while the key's
//! lease key exists; it must be one of the fleet's own workers, so a stale
//! or foreign pid is never signalled.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use super::kind::{FaultKind, FaultPlan};
use super::signals::{signal, ResumeGuard, Stopped};
use super::topology::{connect, NODE_TIMEOUT};
use crate::shared::progress::Progress;

/// How often the holder is looked for.
const POLL: Duration = Duration::from_millis(20);
/// How long after `--fault-at-ms` the holder is looked for: a herd takes
/// its leases at once, so a run without one by then holds none.
const SEARCH: Duration = Duration::from_secs(2);

/// Where one key's holder is found in Redis.
#[derive(Debug, Clone)]
pub struct HolderKeys {
    /// The key's lease key: it exists while the lease is held.
    pub lock: String,
    /// The key's `loads:pid` key: the pid of the last process that started
    /// a load of it.
    pub pid: String,
}

/// What the holder injector did.
#[derive(Debug, Clone, PartialEq)]
pub struct HolderInjected {
    /// The fault.
    pub kind: FaultKind,
    /// Index (into the run's keys) of the key whose holder was faulted.
    pub key: usize,
    /// The holder's process id.
    pub pid: u32,
    /// When the signal was sent, ms after "go".
    pub fault_at_ms: f64,
}

/// The running holder injector: [`HolderInjector::finish`] returns what
/// it did as soon as it did it; drop the guard to resume a stopped holder.
pub struct HolderInjector {
    thread: JoinHandle<anyhow::Result<HolderInjected>>,
    guard: ResumeGuard,
}

impl HolderInjector {
    /// Starts the injector. `server` is where the keys are; `keys` where
    /// each of the run's keys' holder is found (in the order of the run's
    /// keys); `workers` the pids of the fleet's workers; `started` the "go".
    pub fn start(
        plan: FaultPlan,
        server: Server,
        keys: Vec<HolderKeys>,
        workers: Vec<u32>,
        started: Instant,
        progress: Progress,
    ) -> HolderInjector {
        let stopped = Arc::new(Mutex::new(Stopped::default()));
        let guard = ResumeGuard::new(stopped.clone(), progress);
        let thread = std::thread::spawn(move || {
            inject(plan, &server, &keys, &workers, started, &stopped, progress)
        });
        HolderInjector { thread, guard }
    }

    /// Waits for the injection (it returns soon after `--fault-at-ms`).
    /// A stopped holder is not resumed before the guard drops.
    pub fn finish(self) -> (anyhow::Result<HolderInjected>, ResumeGuard) {
        let result = self
            .thread
            .join()
            .unwrap_or_else(|_| Err(anyhow!("the holder injector panicked")));
        (result, self.guard)
    }
}

/// Where the holder is looked for.
#[derive(Debug, Clone)]
pub enum Server {
    /// One server's URL.
    Single(String),
    /// Some nodes of a cluster.
    Cluster(Vec<String>),
}

impl Server {
    fn connect(&self) -> anyhow::Result<Box<dyn redis::ConnectionLike>> {
        Ok(match self {
            Server::Single(url) => Box::new(connect(url)?),
            Server::Cluster(urls) => Box::new(
                redis::cluster::ClusterClientBuilder::new(urls.clone())
                    .connection_timeout(NODE_TIMEOUT)
                    .response_timeout(NODE_TIMEOUT)
                    .build()?
                    .get_connection()?,
            ),
        })
    }
}

fn inject(
    plan: FaultPlan,
    server: &Server,
    keys: &[HolderKeys],
    workers: &[u32],
    started: Instant,
    stopped: &Mutex<Stopped>,
    progress: Progress,
) -> anyhow::Result<HolderInjected> {
    let at = started + Duration::from_millis(plan.at_ms);
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
    let mut con = server
        .connect()
        .context("connecting to the server to find the lease holder")?;
    let give_up = Instant::now() + SEARCH;
    let (key, pid) = loop {
        if let Some(found) = find_holder(&mut *con, keys, workers)? {
            break found;
        }
        if Instant::now() >= give_up {
            bail!(
                "no worker held a lease between {} and {} ms after the start (the loads \
                 were over, or not started)",
                plan.at_ms,
                plan.at_ms + SEARCH.as_millis() as u64
            );
        }
        std::thread::sleep(POLL);
    };
    let sig = plan.kind.signal().context("a holder fault is a signal")?;
    let fault_at_ms;
    {
        let mut stopped = stopped.lock().unwrap_or_else(|p| p.into_inner());
        if stopped.closed {
            bail!("the run ended before the fault");
        }
        fault_at_ms = started.elapsed().as_secs_f64() * 1000.0;
        signal(pid, sig)?;
        if plan.kind == FaultKind::StopHolder {
            stopped.pid = Some(pid);
        }
    }
    progress.say(format!(
        "fault at {fault_at_ms:.0} ms: {} of the lease holder of key {key} (worker pid {pid}){}",
        if plan.kind == FaultKind::StopHolder {
            "SIGSTOP"
        } else {
            "SIGKILL"
        },
        if plan.kind == FaultKind::StopHolder {
            "; SIGCONT once the others have answered"
        } else {
            ""
        }
    ));
    Ok(HolderInjected {
        kind: plan.kind,
        key,
        pid,
        fault_at_ms,
    })
}

/// The first key whose lease is held, and its holder: `None` if no lease
/// is held (or its holder has not written its pid yet).
fn find_holder(
    con: &mut dyn redis::ConnectionLike,
    keys: &[HolderKeys],
    workers: &[u32],
) -> anyhow::Result<Option<(usize, u32)>> {
    for (i, k) in keys.iter().enumerate() {
        // Two commands, not a pipeline: on a cluster the two keys may
        // live on two masters.
        let held: bool = redis::cmd("EXISTS")
            .arg(&k.lock)
            .query(con)
            .with_context(|| format!("reading {}", k.lock))?;
        let pid: Option<String> = redis::cmd("GET")
            .arg(&k.pid)
            .query(con)
            .with_context(|| format!("reading {}", k.pid))?;
        let Some(pid) = pid.filter(|_| held) else {
            continue;
        };
        let pid: u32 = pid
            .trim()
            .parse()
            .with_context(|| format!("{} is not a pid: {pid:?}", k.pid))?;
        if !workers.contains(&pid) {
            bail!(
                "{} names pid {pid}, not one of this fleet's workers {workers:?}",
                k.pid
            );
        }
        return Ok(Some((i, pid)));
    }
    Ok(None)
}
