//! `fleet --cluster --fault`: injecting one fault into a Redis Cluster in
//! the middle of a steady run, and watching for the victim's replacement.
//!
//! The parent computes the slot of every key's value key before the run
//! ([`key_slots`]); at `--fault-at-ms` after its "go" the [`Injector`]
//! thread picks the victim (the master owning the most of the run's keys),
//! injects the fault, then polls `CLUSTER SLOTS` of a healthy master every
//! 20 ms until the victim's slots are served by another node (the
//! promotion), or the run ends. What it saw is an [`Injected`]; what callers
//! saw is worked out from the workers' logs by
//! [`fault_report`](super::fault_report).
//!
//! A hung node (`hang`) is resumed (SIGCONT) by a guard's `Drop`, so an
//! error or a panic in the parent still resumes it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};

use crate::shared::progress::Progress;

/// How long one question to one node may take.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);
/// How often the promotion is polled.
const POLL: Duration = Duration::from_millis(20);

/// What `--fault` does to the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// `CLUSTER FAILOVER` sent to a replica of the victim: the replica
    /// becomes the master and the victim its replica (and they stay so
    /// after the run).
    Failover,
    /// SIGKILL of the victim's redis-server process (which must run on this
    /// machine, on a loopback address): the node stays dead after the run.
    Kill,
    /// SIGSTOP of the victim's process (same machine), a host that hangs
    /// with its connections open; SIGCONT when the run ends (always, even
    /// if the fleet fails), after which it rejoins as a replica.
    Hang,
}

impl FaultKind {
    fn signal(self) -> Option<&'static str> {
        match self {
            FaultKind::Failover => None,
            FaultKind::Kill => Some("-KILL"),
            FaultKind::Hang => Some("-STOP"),
        }
    }
}

/// When and what to inject.
#[derive(Debug, Clone, Copy)]
pub struct FaultPlan {
    /// The fault.
    pub kind: FaultKind,
    /// Milliseconds after the parent's "go".
    pub at_ms: u64,
}

/// What the injector did and saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Injected {
    /// The fault.
    pub kind: FaultKind,
    /// `ip:port` of the victim master.
    pub victim: String,
    /// The victim's process id (kill and hang).
    pub victim_pid: Option<u32>,
    /// Indices (into the run's keys) of the keys the victim served.
    pub victim_keys: Vec<usize>,
    /// When the fault was injected, ms after "go".
    pub fault_at_ms: f64,
    /// When a healthy master first saw every victim slot served by another
    /// node, ms after "go"; `None` if not within the run.
    pub promoted_at_ms: Option<f64>,
    /// `ip:port` of the node serving the victim's slots then.
    pub promoted_to: Option<String>,
}

/// One range of `CLUSTER SLOTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    /// First slot.
    pub start: u16,
    /// Last slot (inclusive).
    pub end: u16,
    /// `ip:port` of the master.
    pub master: String,
    /// `ip:port` of its replicas.
    pub replicas: Vec<String>,
}

/// The owner of `slot` in `ranges`.
fn owner(ranges: &[SlotRange], slot: u16) -> Option<&SlotRange> {
    ranges.iter().find(|r| (r.start..=r.end).contains(&slot))
}

/// The master that owns the most of `slots` (ties: the lowest address),
/// and how many it owns.
pub fn busiest_master(ranges: &[SlotRange], slots: &[u16]) -> Option<(String, usize)> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for slot in slots {
        if let Some(r) = owner(ranges, *slot) {
            *counts.entry(r.master.as_str()).or_default() += 1;
        }
    }
    let mut best: Option<(&str, usize)> = None;
    for (master, n) in counts {
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((master, n));
        }
    }
    best.map(|(m, n)| (m.to_owned(), n))
}

/// The node serving every one of `victim_ranges` in `now`, if it is not
/// the victim any more (the first such range's new master).
pub fn replacement(now: &[SlotRange], victim_ranges: &[SlotRange], victim: &str) -> Option<String> {
    let mut first = None;
    for range in victim_ranges {
        for slot in [range.start, range.end] {
            let owner = owner(now, slot)?;
            if owner.master == victim {
                return None;
            }
            first.get_or_insert_with(|| owner.master.clone());
        }
    }
    first
}

/// `url` with its host and port replaced by `addr` (`ip:port`): the
/// scheme, credentials and database of the user's URL reach every node.
pub fn node_url(url: &str, addr: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let userinfo = authority.rfind('@').map_or("", |i| &authority[..=i]);
    let addr = match addr.rsplit_once(':') {
        Some((ip, port)) if ip.contains(':') && !ip.starts_with('[') => format!("[{ip}]:{port}"),
        _ => addr.to_owned(),
    };
    format!("{scheme}://{userinfo}{addr}{path}")
}

/// A synchronous connection with short timeouts.
fn connect(url: &str) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let con = client.get_connection_with_timeout(NODE_TIMEOUT)?;
    con.set_read_timeout(Some(NODE_TIMEOUT))?;
    con.set_write_timeout(Some(NODE_TIMEOUT))?;
    Ok(con)
}

/// Runs `cmd` on the first of `urls` that answers.
fn first_answer<T: redis::FromRedisValue>(urls: &[String], cmd: &redis::Cmd) -> anyhow::Result<T> {
    let mut errors = Vec::new();
    for url in urls {
        match connect(url).and_then(|mut con| cmd.query::<T>(&mut con)) {
            Ok(v) => return Ok(v),
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    bail!("no node answered: {}", errors.join("; "))
}

/// The slot of each of `value_keys` (`CLUSTER KEYSLOT` on a node that
/// answers).
pub fn key_slots(urls: &[String], value_keys: &[String]) -> anyhow::Result<Vec<u16>> {
    let mut slots = Vec::with_capacity(value_keys.len());
    for key in value_keys {
        let slot: i64 = first_answer(urls, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .context("CLUSTER KEYSLOT")?;
        slots.push(u16::try_from(slot).context("a slot out of range")?);
    }
    Ok(slots)
}

/// `CLUSTER SLOTS` parsed; `host` stands in for an empty node address.
pub fn parse_slots(reply: &redis::Value, host: &str) -> Vec<SlotRange> {
    use redis::Value;
    fn text(v: &Value) -> Option<String> {
        match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        }
    }
    let node = |v: &Value| -> Option<String> {
        let Value::Array(fields) = v else { return None };
        let ip = text(fields.first()?)?;
        let Value::Int(port) = fields.get(1)? else {
            return None;
        };
        let ip = if ip.is_empty() { host.to_owned() } else { ip };
        Some(format!("{ip}:{port}"))
    };
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Value::Int(start), Value::Int(end)) = (fields.first()?, fields.get(1)?) else {
                return None;
            };
            Some(SlotRange {
                start: u16::try_from(*start).ok()?,
                end: u16::try_from(*end).ok()?,
                master: node(fields.get(2)?)?,
                replicas: fields.iter().skip(3).filter_map(node).collect(),
            })
        })
        .collect()
}

/// `CLUSTER SLOTS` of the node at `url`.
fn slots_of(con: &mut redis::Connection, url: &str) -> redis::RedisResult<Vec<SlotRange>> {
    let reply: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(con)?;
    Ok(parse_slots(&reply, &host_of(url)))
}

/// The host of a URL (for an empty address in `CLUSTER SLOTS`).
fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or("");
    let hostport = authority.rsplit('@').next().unwrap_or("");
    match hostport.rsplit_once(':') {
        Some((host, _)) => host.trim_matches(['[', ']']).to_owned(),
        None => hostport.to_owned(),
    }
}

/// The state a hung victim's resumption shares between the injector and
/// the parent's guard.
#[derive(Debug, Default)]
struct Stopped {
    /// The run is over (or failed): inject nothing more.
    closed: bool,
    /// The pid this run SIGSTOPped and has not resumed yet.
    pid: Option<u32>,
}

/// Resumes (SIGCONT) a node the injector stopped, when dropped; and stops
/// the injector from injecting anything after that.
pub struct ResumeGuard {
    stopped: Arc<Mutex<Stopped>>,
    progress: Progress,
}

impl ResumeGuard {
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
fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
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

/// The running injector: join it after the run; drop its guard to resume
/// a hung victim.
pub struct Injector {
    thread: JoinHandle<anyhow::Result<Injected>>,
    /// Resumes the victim when dropped (hang).
    pub guard: ResumeGuard,
}

impl Injector {
    /// Starts the injector thread. `started` is the parent's "go";
    /// `urls` the user's node URLs; `slots` the slot of each key's value
    /// key (in the order of the run's keys).
    pub fn start(
        plan: FaultPlan,
        urls: Vec<String>,
        slots: Vec<u16>,
        started: Instant,
        duration_ms: u64,
        progress: Progress,
    ) -> Injector {
        let stopped = Arc::new(Mutex::new(Stopped::default()));
        let guard = ResumeGuard {
            stopped: stopped.clone(),
            progress,
        };
        let shared = Shared {
            plan,
            urls,
            slots,
            started,
            end: started + Duration::from_millis(duration_ms),
            stopped,
            progress,
        };
        let thread = std::thread::spawn(move || shared.inject());
        Injector { thread, guard }
    }

    /// Waits for the injector (it returns by the end of the run) and
    /// returns what it saw. The victim is not resumed before `guard` drops.
    pub fn finish(self) -> (anyhow::Result<Injected>, ResumeGuard) {
        let result = self
            .thread
            .join()
            .unwrap_or_else(|_| Err(anyhow!("the fault injector panicked")));
        (result, self.guard)
    }
}

struct Shared {
    plan: FaultPlan,
    urls: Vec<String>,
    slots: Vec<u16>,
    started: Instant,
    end: Instant,
    stopped: Arc<Mutex<Stopped>>,
    progress: Progress,
}

impl Shared {
    fn ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    fn is_closed(&self) -> bool {
        self.stopped.lock().map(|s| s.closed).unwrap_or(true)
    }

    /// Sleeps until `until`, or the run is closed (then false).
    fn sleep_until(&self, until: Instant) -> bool {
        loop {
            if self.is_closed() {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            std::thread::sleep((until - now).min(POLL));
        }
    }

    fn inject(self) -> anyhow::Result<Injected> {
        let at = self.started + Duration::from_millis(self.plan.at_ms);
        if !self.sleep_until(at) {
            bail!("the run ended before the fault");
        }
        let ranges: Vec<SlotRange> = {
            let mut found = None;
            for url in &self.urls {
                if let Ok(r) = connect(url).and_then(|mut c| slots_of(&mut c, url)) {
                    found = Some(r);
                    break;
                }
            }
            found.context("no node answered CLUSTER SLOTS at fault time")?
        };
        let (victim, _) =
            busiest_master(&ranges, &self.slots).context("no master owns any of the keys")?;
        let victim_ranges: Vec<SlotRange> = ranges
            .iter()
            .filter(|r| r.master == victim)
            .cloned()
            .collect();
        let victim_keys: Vec<usize> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| owner(&victim_ranges, **s).is_some())
            .map(|(i, _)| i)
            .collect();
        let template = self.urls.first().context("no URL")?.clone();
        let victim_url = node_url(&template, &victim);
        let mut victim_pid = None;
        let fault_at_ms;
        match self.plan.kind {
            FaultKind::Failover => {
                let replica = victim_ranges
                    .iter()
                    .flat_map(|r| r.replicas.iter())
                    .next()
                    .with_context(|| format!("the victim {victim} has no replica to fail over to"))?
                    .clone();
                let mut con = connect(&node_url(&template, &replica))
                    .with_context(|| format!("connecting to the replica {replica}"))?;
                fault_at_ms = self.ms();
                let _: () = redis::cmd("CLUSTER")
                    .arg("FAILOVER")
                    .query(&mut con)
                    .with_context(|| format!("CLUSTER FAILOVER on {replica}"))?;
                self.progress.say(format!(
                    "fault at {fault_at_ms:.0} ms: CLUSTER FAILOVER sent to {replica}, a replica of \
                     {victim} ({} of {} keys)",
                    victim_keys.len(),
                    self.slots.len()
                ));
            }
            kind => {
                let pid = local_pid(&victim, &victim_url)?;
                victim_pid = Some(pid);
                let sig = kind.signal().unwrap_or("-KILL");
                {
                    let mut stopped = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
                    if stopped.closed {
                        bail!("the run ended before the fault");
                    }
                    fault_at_ms = self.ms();
                    signal(pid, sig)?;
                    if kind == FaultKind::Hang {
                        stopped.pid = Some(pid);
                    }
                }
                self.progress.say(format!(
                    "fault at {fault_at_ms:.0} ms: {} of {victim} (pid {pid}, {} of {} keys){}",
                    if kind == FaultKind::Hang {
                        "SIGSTOP"
                    } else {
                        "SIGKILL"
                    },
                    victim_keys.len(),
                    self.slots.len(),
                    if kind == FaultKind::Hang {
                        "; SIGCONT at the end of the run"
                    } else {
                        ""
                    }
                ));
            }
        }
        let (promoted_at_ms, promoted_to) = self.watch(&template, &ranges, &victim_ranges, &victim);
        match (&promoted_at_ms, &promoted_to) {
            (Some(t), Some(to)) => self.progress.say(format!(
                "fault: the victim's slots are served by {to} at {t:.0} ms ({:.0} ms after the fault)",
                t - fault_at_ms
            )),
            _ => self
                .progress
                .say("fault: the victim's slots were not served by another node within the run"),
        }
        Ok(Injected {
            kind: self.plan.kind,
            victim,
            victim_pid,
            victim_keys,
            fault_at_ms,
            promoted_at_ms,
            promoted_to,
        })
    }

    /// Polls `CLUSTER SLOTS` of a healthy master until the victim's slots
    /// are served by another node, or the run ends.
    fn watch(
        &self,
        template: &str,
        ranges: &[SlotRange],
        victim_ranges: &[SlotRange],
        victim: &str,
    ) -> (Option<f64>, Option<String>) {
        let mut healthy: Vec<String> = ranges
            .iter()
            .map(|r| r.master.clone())
            .filter(|m| m != victim)
            .collect();
        healthy.sort();
        healthy.dedup();
        let healthy: Vec<String> = healthy.iter().map(|m| node_url(template, m)).collect();
        let mut con: Option<(usize, redis::Connection)> = None;
        let mut next = 0;
        loop {
            if Instant::now() >= self.end || self.is_closed() {
                return (None, None);
            }
            if con.is_none() && !healthy.is_empty() {
                let i = next % healthy.len();
                next += 1;
                con = connect(&healthy[i]).ok().map(|c| (i, c));
            }
            if let Some((i, c)) = con.as_mut() {
                match slots_of(c, &healthy[*i]) {
                    Ok(now) => {
                        if let Some(to) = replacement(&now, victim_ranges, victim) {
                            return (Some(self.ms()), Some(to));
                        }
                    }
                    Err(_) => con = None,
                }
            }
            std::thread::sleep(POLL);
        }
    }
}

/// The process id of the node at `addr`, which must run on this machine:
/// its address is a loopback one, its `INFO server` names a
/// `process_id`, and (where `/proc` exists) that process is a Redis server.
fn local_pid(addr: &str, url: &str) -> anyhow::Result<u32> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u16, end: u16, master: &str, replicas: &[&str]) -> SlotRange {
        SlotRange {
            start,
            end,
            master: master.to_owned(),
            replicas: replicas.iter().map(|r| r.to_string()).collect(),
        }
    }

    #[test]
    fn the_victim_owns_the_most_keys() {
        let ranges = [
            range(0, 5460, "a:1", &["d:4"]),
            range(5461, 10922, "b:2", &["e:5"]),
            range(10923, 16383, "c:3", &["f:6"]),
        ];
        assert_eq!(
            busiest_master(&ranges, &[1, 6000, 7000, 12000]),
            Some(("b:2".to_owned(), 2))
        );
        assert_eq!(
            busiest_master(&ranges, &[1, 12000]),
            Some(("a:1".to_owned(), 1)),
            "ties: the lowest address"
        );
        assert_eq!(busiest_master(&ranges, &[]), None);
    }

    #[test]
    fn the_replacement_is_seen_once_every_victim_range_moved() {
        let before = [
            range(0, 99, "a:1", &["d:4"]),
            range(100, 199, "b:2", &[]),
            range(200, 299, "a:1", &["d:4"]),
        ];
        let victim: Vec<SlotRange> = vec![before[0].clone(), before[2].clone()];
        assert_eq!(replacement(&before, &victim, "a:1"), None);
        let half = [
            range(0, 99, "d:4", &[]),
            range(100, 199, "b:2", &[]),
            range(200, 299, "a:1", &[]),
        ];
        assert_eq!(replacement(&half, &victim, "a:1"), None);
        let after = [
            range(0, 99, "d:4", &[]),
            range(100, 199, "b:2", &[]),
            range(200, 299, "d:4", &[]),
        ];
        assert_eq!(replacement(&after, &victim, "a:1"), Some("d:4".to_owned()));
        assert_eq!(
            replacement(&[], &victim, "a:1"),
            None,
            "no owner is no replacement"
        );
    }

    #[test]
    fn node_urls_keep_scheme_credentials_and_database() {
        assert_eq!(
            node_url("redis://127.0.0.1:7000", "127.0.0.1:7003"),
            "redis://127.0.0.1:7003"
        );
        assert_eq!(
            node_url("rediss://user:pw@host:7000/2", "10.0.0.5:7004"),
            "rediss://user:pw@10.0.0.5:7004/2"
        );
        assert_eq!(
            node_url("redis://[::1]:7000", "::1:7001"),
            "redis://[::1]:7001"
        );
        assert_eq!(host_of("redis://user:pw@[::1]:7000/0"), "::1");
        assert_eq!(host_of("redis://h:1"), "h");
    }

    #[test]
    fn cluster_slots_are_parsed() {
        use redis::Value;
        let node = |ip: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(ip.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("", 7001)]),
            Value::Int(3),
        ]);
        assert_eq!(
            parse_slots(&reply, "h"),
            vec![
                range(0, 5460, "127.0.0.1:7000", &["127.0.0.1:7003"]),
                range(5461, 16383, "h:7001", &[]),
            ]
        );
        assert!(parse_slots(&Value::Nil, "h").is_empty());
    }
}
