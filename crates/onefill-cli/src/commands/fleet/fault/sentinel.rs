//! The injector thread of `fleet --sentinel --fault`: at `--fault-at-ms`
//! after the parent's "go" it asks the Sentinels for the primary (the
//! victim), reads the remaining TTL of every value of the run on it,
//! injects the fault (`SENTINEL FAILOVER`, SIGKILL or SIGSTOP of the
//! primary), then polls every Sentinel every 20 ms until a majority of
//! them name another primary and that node answers `ROLE` as a master
//! (the promotion), or the run ends. Right after the promotion it looks
//! for the old primary's values on the new one ([`check_values`]). What
//! it saw is an [`Injected`].

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use super::kind::{FaultKind, FaultPlan, Injected, ValueCheck};
use super::signals::{local_pid, signal, ResumeGuard, Stopped};
use super::topology::connect;
use crate::shared::progress::Progress;

/// How often the Sentinels are polled.
const POLL: Duration = Duration::from_millis(20);

/// How much longer than the old value had left a value on the new
/// primary may have, and still be that value: the two reads are a few
/// milliseconds apart, measured on the parent's clock.
const TTL_TOLERANCE_MS: i64 = 100;

/// `redis://ip:port` of an `ip:port` the Sentinels name.
pub fn node_url(addr: &str) -> String {
    match addr.rsplit_once(':') {
        Some((ip, port)) if ip.contains(':') => format!("redis://[{ip}]:{port}"),
        _ => format!("redis://{addr}"),
    }
}

/// `ip:port` of the primary the Sentinel at `url` names for `name`
/// (`None` if it knows no such primary).
pub fn named_by(con: &mut redis::Connection, name: &str) -> redis::RedisResult<Option<String>> {
    let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(name)
        .query(con)?;
    Ok(addr.map(|(ip, port)| format!("{ip}:{port}")))
}

/// `ip:port` of the primary the first Sentinel that answers names.
pub fn primary_named(sentinels: &[String], name: &str) -> anyhow::Result<String> {
    let mut errors = Vec::new();
    for url in sentinels {
        match connect(url).and_then(|mut c| named_by(&mut c, name)) {
            Ok(Some(addr)) => return Ok(addr),
            Ok(None) => errors.push(format!("{url}: no primary named {name}")),
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    bail!(
        "no Sentinel named the primary {name}: {}",
        errors.join("; ")
    )
}

/// Whether the node at `addr` answers `ROLE` as a master.
fn is_master(addr: &str) -> bool {
    let role = connect(&node_url(addr))
        .and_then(|mut c| redis::cmd("ROLE").query::<Vec<redis::Value>>(&mut c));
    matches!(
        role.as_deref(),
        Ok([redis::Value::BulkString(r), ..]) if r == b"master"
    )
}

/// The remaining TTL (`PTTL`, ms; negative: no such key) of each of
/// `keys` on the node at `addr`, and when it was read (ms after "go").
fn ttls(addr: &str, keys: &[String], ms: impl Fn() -> f64) -> anyhow::Result<(Vec<i64>, f64)> {
    let mut con = connect(&node_url(addr)).with_context(|| format!("connecting to {addr}"))?;
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("PTTL").arg(key);
    }
    let at = ms();
    let ttls: Vec<i64> = pipe
        .query(&mut con)
        .with_context(|| format!("PTTL on {addr}"))?;
    Ok((ttls, at))
}

/// The old primary's values (`old`, their remaining TTLs read at
/// `old_at_ms`) looked for among the new primary's (`new`, read at
/// `new_at_ms`): a value that should still have had at least `margin_ms`
/// left at the second read is checked, and has vanished if the new primary
/// does not have it, or has a younger value in its place (a remaining TTL
/// longer than the old value's by more than the reads' tolerance).
pub fn check_values(
    old: &[i64],
    old_at_ms: f64,
    new: &[i64],
    new_at_ms: f64,
    margin_ms: u64,
) -> ValueCheck {
    let elapsed = (new_at_ms - old_at_ms).max(0.0).round() as i64;
    let mut check = ValueCheck {
        margin_ms,
        ..ValueCheck::default()
    };
    for (key, (&then, &now)) in old.iter().zip(new).enumerate() {
        let expected = then - elapsed;
        if then <= 0 || expected < margin_ms as i64 {
            continue;
        }
        check.checked += 1;
        if now < 0 || now > expected + TTL_TOLERANCE_MS {
            check.vanished += 1;
            check.vanished_keys.push(key);
        }
    }
    check
}

/// The writes an old primary took since `base` (its remaining TTLs read
/// at `base_at_ms`) as `now` (read at `now_at_ms`) shows them: a key it has
/// a value of now that it had none of then, or one with more time left
/// than the old value could have had (beyond the reads' tolerance).
pub fn written_since(base: &[i64], base_at_ms: f64, now: &[i64], now_at_ms: f64) -> Vec<usize> {
    let elapsed = (now_at_ms - base_at_ms).max(0.0).round() as i64;
    base.iter()
        .zip(now)
        .enumerate()
        .filter(|(_, (&then, &now))| {
            now > 0 && (then <= 0 || now > then - elapsed + TTL_TOLERANCE_MS)
        })
        .map(|(key, _)| key)
        .collect()
}

/// Whether the node at `addr` answers `ROLE` as a replica.
fn is_replica(addr: &str) -> bool {
    let role = connect(&node_url(addr))
        .and_then(|mut c| redis::cmd("ROLE").query::<Vec<redis::Value>>(&mut c));
    matches!(
        role.as_deref(),
        Ok([redis::Value::BulkString(r), ..]) if r == b"slave"
    )
}

/// Where the injector finds the primary and the run's values.
pub struct SentinelTarget {
    /// The Sentinels' URLs.
    pub sentinels: Vec<String>,
    /// The primary's name.
    pub name: String,
    /// The value key of each of the run's keys.
    pub value_keys: Vec<String>,
    /// How long a value must have left at the check to be checked: longer
    /// than any early refresh starts before expiry.
    pub margin_ms: u64,
}

/// The running injector: join it after the run; drop its guard to resume
/// a hung primary.
pub struct SentinelInjector {
    thread: JoinHandle<anyhow::Result<Injected>>,
    /// Resumes the old primary when dropped (hang).
    pub guard: ResumeGuard,
}

impl SentinelInjector {
    /// Starts the injector thread; `started` is the parent's "go".
    pub fn start(
        plan: FaultPlan,
        target: SentinelTarget,
        started: Instant,
        duration_ms: u64,
        progress: Progress,
    ) -> SentinelInjector {
        let stopped = Arc::new(Mutex::new(Stopped::default()));
        let guard = ResumeGuard::new(stopped.clone(), progress);
        let shared = Shared {
            plan,
            target,
            started,
            end: started + Duration::from_millis(duration_ms),
            stopped,
            progress,
        };
        let thread = std::thread::spawn(move || shared.inject());
        SentinelInjector { thread, guard }
    }

    /// Waits for the injector (it returns by the end of the run) and
    /// returns what it saw. The old primary is not resumed before `guard`
    /// drops.
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
    target: SentinelTarget,
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

    fn inject(self) -> anyhow::Result<Injected> {
        let at = self.started + Duration::from_millis(self.plan.at_ms);
        while Instant::now() < at {
            if self.is_closed() {
                bail!("the run ended before the fault");
            }
            std::thread::sleep((at - Instant::now()).min(POLL));
        }
        let SentinelTarget {
            sentinels, name, ..
        } = &self.target;
        let victim = primary_named(sentinels, name).context("at fault time")?;
        let victim_url = node_url(&victim);
        let keys = &self.target.value_keys;
        let mut before =
            ttls(&victim, keys, || self.ms()).context("the values before the fault")?;
        let mut victim_pid = None;
        let fault_at_ms;
        match self.plan.kind {
            FaultKind::Failover => {
                let mut errors = Vec::new();
                let mut sent = None;
                for url in sentinels {
                    let at = self.ms();
                    let answer = connect(url).and_then(|mut c| {
                        redis::cmd("SENTINEL")
                            .arg("FAILOVER")
                            .arg(name)
                            .query::<()>(&mut c)
                    });
                    match answer {
                        Ok(()) => {
                            sent = Some((url, at));
                            break;
                        }
                        Err(e) => errors.push(format!("{url}: {e}")),
                    }
                }
                let (url, at) =
                    sent.with_context(|| format!("SENTINEL FAILOVER: {}", errors.join("; ")))?;
                fault_at_ms = at;
                self.progress.say(format!(
                    "fault at {fault_at_ms:.0} ms: SENTINEL FAILOVER {name} sent to {url} \
                     (the primary: {victim})"
                ));
            }
            FaultKind::KillHolder | FaultKind::StopHolder => {
                bail!("a lease holder is faulted by the holder injector, not a primary's")
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
                    "fault at {fault_at_ms:.0} ms: {} of the primary {victim} (pid {pid}){}",
                    if kind == FaultKind::Hang {
                        "SIGSTOP"
                    } else {
                        "SIGKILL"
                    },
                    if kind == FaultKind::Hang {
                        "; SIGCONT at the end of the run"
                    } else {
                        ""
                    }
                ));
            }
        }
        let promoted = self.watch(&victim);
        let mut values = match &promoted {
            Some((_, to)) => {
                // After a failover the old primary still answers, and may
                // have taken fills after the fault: its latest values are
                // the ones to look for.
                if self.plan.kind == FaultKind::Failover {
                    if let Ok(later) = ttls(&victim, keys, || self.ms()) {
                        before = later;
                    }
                }
                match ttls(to, keys, || self.ms()) {
                    Ok((after, after_at)) => Some(check_values(
                        &before.0,
                        before.1,
                        &after,
                        after_at,
                        self.target.margin_ms,
                    )),
                    Err(e) => {
                        self.progress
                            .say(format!("fault: the new primary's values not read: {e:#}"));
                        None
                    }
                }
            }
            None => None,
        };
        if let (Some(check), FaultKind::Failover) = (values.as_mut(), self.plan.kind) {
            self.watch_old_primary(&victim, before, check);
        }
        match &promoted {
            Some((t, to)) => self.progress.say(format!(
                "fault: the Sentinels name {to} at {t:.0} ms ({:.0} ms after the fault)",
                t - fault_at_ms
            )),
            None => self
                .progress
                .say("fault: the Sentinels named no new primary within the run"),
        }
        Ok(Injected {
            kind: self.plan.kind,
            victim,
            victim_pid,
            victim_keys: (0..keys.len()).collect(),
            fault_at_ms,
            promoted_at_ms: promoted.as_ref().map(|(t, _)| *t),
            promoted_to: promoted.map(|(_, to)| to),
            values,
        })
    }

    /// After a failover, polls the old primary every 100 ms, until the
    /// end of the run or until it answers as a replica, for the writes it
    /// takes after the promotion (`base`: its values then).
    fn watch_old_primary(&self, victim: &str, base: (Vec<i64>, f64), check: &mut ValueCheck) {
        let keys = &self.target.value_keys;
        let (mut base, mut base_at) = base;
        let mut written = std::collections::BTreeSet::new();
        while Instant::now() < self.end && !self.is_closed() {
            std::thread::sleep(Duration::from_millis(100));
            if is_replica(victim) {
                check.old_primary_demoted_at_ms = Some(self.ms());
                break;
            }
            let Ok((now, now_at)) = ttls(victim, keys, || self.ms()) else {
                continue;
            };
            for key in written_since(&base, base_at, &now, now_at) {
                check.old_primary_writes += 1;
                written.insert(key);
            }
            (base, base_at) = (now, now_at);
        }
        check.old_primary_written_keys = written.into_iter().collect();
    }

    /// Polls every Sentinel until a majority of them name a primary other
    /// than `victim` that answers as a master; when, and which.
    fn watch(&self, victim: &str) -> Option<(f64, String)> {
        let sentinels = &self.target.sentinels;
        let majority = sentinels.len() / 2 + 1;
        let mut cons: Vec<Option<redis::Connection>> = sentinels.iter().map(|_| None).collect();
        loop {
            if Instant::now() >= self.end || self.is_closed() {
                return None;
            }
            let mut named: Vec<String> = Vec::new();
            for (url, con) in sentinels.iter().zip(cons.iter_mut()) {
                if con.is_none() {
                    *con = connect(url).ok();
                }
                if let Some(c) = con.as_mut() {
                    match named_by(c, &self.target.name) {
                        Ok(Some(addr)) => named.push(addr),
                        Ok(None) => {}
                        Err(_) => *con = None,
                    }
                }
            }
            let at = self.ms();
            for addr in named.iter().filter(|a| a.as_str() != victim) {
                if named.iter().filter(|a| *a == addr).count() >= majority && is_master(addr) {
                    return Some((at, addr.clone()));
                }
            }
            std::thread::sleep(POLL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_vanished_if_missing_or_younger_on_the_new_primary() {
        // Read 100 ms apart; a margin of 500 ms.
        let old = [3_000, 3_000, 3_000, 550, -2, 3_000];
        let new = [2_900, -2, 3_990, -2, 4_000, 2_990];
        let check = check_values(&old, 1_000.0, &new, 1_100.0, 500);
        // Key 3 had 450 ms left: a refresh may have replaced it; key 4
        // was not on the old primary.
        assert_eq!(check.checked, 4);
        assert_eq!(check.vanished, 2);
        assert_eq!(check.vanished_keys, [1, 2]);
        assert_eq!(check.margin_ms, 500);
        // The tolerance: 100 ms more than expected is still the value.
        let check = check_values(&[3_000], 0.0, &[3_000], 0.0, 500);
        assert_eq!((check.checked, check.vanished), (1, 0));
        let check = check_values(&[3_000], 0.0, &[3_101], 0.0, 500);
        assert_eq!((check.checked, check.vanished), (1, 1));
    }

    #[test]
    fn writes_since_a_read_are_new_or_younger_values() {
        // Read 100 ms apart.
        let base = [3_000, -2, 3_000, 3_000, 500];
        let now = [2_900, 4_000, 3_950, -2, 450];
        assert_eq!(written_since(&base, 0.0, &now, 100.0), [1, 2]);
        assert!(written_since(&base, 0.0, &base, 0.0).is_empty());
    }

    #[test]
    fn node_urls_of_named_addresses() {
        assert_eq!(node_url("127.0.0.1:6380"), "redis://127.0.0.1:6380");
        assert_eq!(node_url("::1:6380"), "redis://[::1]:6380");
    }
}
