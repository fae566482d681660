//! The injector thread of `fleet --cluster --fault`: at `--fault-at-ms`
//! after the parent's "go" it picks the victim (the master owning the most
//! of the run's keys), injects the fault, then polls `CLUSTER SLOTS` of a
//! healthy master every 20 ms until the victim's slots are served by
//! another node (the promotion), or the run ends. What it saw is an
//! [`Injected`].

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use super::kind::{FaultKind, FaultPlan, Injected};
use super::signals::{local_pid, signal, ResumeGuard, Stopped};
use super::topology::{busiest_master, connect, node_url, owner, replacement, slots_of, SlotRange};
use crate::shared::progress::Progress;

/// How often the promotion is polled.
const POLL: Duration = Duration::from_millis(20);

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
        let guard = ResumeGuard::new(stopped.clone(), progress);
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
            FaultKind::KillHolder | FaultKind::StopHolder => {
                bail!("a lease holder is faulted by the holder injector, not a master's")
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
            values: None,
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
