//! `--chaos --cluster`: the parent moves the cluster under the fleet. At
//! 30 % of the run the slot of the first key migrates to another master
//! (`CLUSTER SETSLOT … IMPORTING`/`MIGRATING`, the slot left migrating for
//! a while, `MIGRATE` of its keys, then `SETSLOT … NODE` on every master),
//! and at 60 % the master of another key fails over to its replica
//! (`CLUSTER FAILOVER`), as `redis-cli --cluster reshard` and an operator
//! would. What it did goes to the report as [`ClusterEvent`]s.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

use super::records::ClusterEvent;
use crate::commands::fleet::fault::topology::{connect, node_url, owner, slots_of, SlotRange};
use crate::shared::progress::Progress;

/// How long the slot stays migrating, with its keys still on the source
/// (clients get `ASK` for what is not there), and then with its keys moved
/// but the slot not yet handed over.
const MIGRATING_FOR: Duration = Duration::from_millis(800);

/// How long the promotion of the replica may take.
const PROMOTION_PATIENCE: Duration = Duration::from_secs(15);

/// The resharding thread.
pub struct Reshard {
    thread: JoinHandle<anyhow::Result<Vec<ClusterEvent>>>,
}

impl Reshard {
    /// Starts it: `urls` are the user's node URLs, `slots` the slot of
    /// each key's value key, `started` the run's start.
    pub fn start(
        urls: Vec<String>,
        slots: Vec<u16>,
        started: Instant,
        duration: Duration,
        progress: Progress,
    ) -> Reshard {
        let thread = std::thread::spawn(move || {
            let mut plan = Plan {
                urls,
                started,
                events: Vec::new(),
                progress,
            };
            plan.run(&slots, duration)?;
            Ok(plan.events)
        });
        Reshard { thread }
    }

    /// Waits for it and returns what it did.
    pub fn finish(self) -> anyhow::Result<Vec<ClusterEvent>> {
        self.thread
            .join()
            .map_err(|_| anyhow!("the resharding thread panicked"))?
    }
}

struct Plan {
    urls: Vec<String>,
    started: Instant,
    events: Vec<ClusterEvent>,
    progress: Progress,
}

impl Plan {
    fn note(&mut self, what: String) {
        let at_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.progress.say(format!("chaos at {at_ms:.0} ms: {what}"));
        self.events.push(ClusterEvent { at_ms, what });
    }

    fn sleep_until(&self, fraction: f64, duration: Duration) {
        let at = self.started + duration.mul_f64(fraction);
        if let Some(left) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
    }

    fn run(&mut self, slots: &[u16], duration: Duration) -> anyhow::Result<()> {
        let first = *slots.first().context("no key")?;
        self.sleep_until(0.3, duration);
        self.migrate(first)?;
        // Another key's master: the slot of the middle key, unless it is
        // the migrated one.
        let other = slots
            .iter()
            .copied()
            .skip(slots.len() / 2)
            .chain(slots.iter().copied())
            .find(|s| *s != first)
            .unwrap_or(first);
        self.sleep_until(0.6, duration);
        self.fail_over(other)
    }

    fn template(&self) -> anyhow::Result<&str> {
        self.urls.first().map(String::as_str).context("no URL")
    }

    fn ranges(&self) -> anyhow::Result<Vec<SlotRange>> {
        for url in &self.urls {
            if let Ok(r) = connect(url).and_then(|mut c| slots_of(&mut c, url)) {
                return Ok(r);
            }
        }
        bail!("no node answered CLUSTER SLOTS")
    }

    fn node(&self, addr: &str) -> anyhow::Result<redis::Connection> {
        connect(&node_url(self.template()?, addr)).with_context(|| format!("connecting to {addr}"))
    }

    fn node_id(&self, addr: &str) -> anyhow::Result<String> {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.node(addr)?)
            .with_context(|| format!("CLUSTER MYID of {addr}"))
    }

    /// `CLUSTER SETSLOT slot args…` on the node at `addr`.
    fn setslot(&self, addr: &str, slot: u16, args: &[&str]) -> anyhow::Result<()> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot);
        for a in args {
            cmd.arg(*a);
        }
        cmd.query::<()>(&mut self.node(addr)?)
            .with_context(|| format!("CLUSTER SETSLOT {slot} {args:?} on {addr}"))
    }

    /// Moves `slot` to another master.
    fn migrate(&mut self, slot: u16) -> anyhow::Result<()> {
        let ranges = self.ranges()?;
        let source = owner(&ranges, slot)
            .context("no master owns the first key's slot")?
            .master
            .clone();
        let mut masters: Vec<String> = ranges.iter().map(|r| r.master.clone()).collect();
        masters.sort();
        masters.dedup();
        let target = masters
            .iter()
            .find(|m| **m != source)
            .context("the cluster has a single master: nothing to migrate to")?
            .clone();
        let (source_id, target_id) = (self.node_id(&source)?, self.node_id(&target)?);
        self.setslot(&target, slot, &["IMPORTING", &source_id])?;
        self.setslot(&source, slot, &["MIGRATING", &target_id])?;
        self.note(format!(
            "slot {slot} (the first key's) migrating from {source} to {target}"
        ));
        std::thread::sleep(MIGRATING_FOR);
        let moved = self.move_keys(slot, &source, &target)?;
        self.note(format!("{moved} keys of slot {slot} moved (MIGRATE)"));
        std::thread::sleep(MIGRATING_FOR);
        // The target first, then the source, then the others: the order
        // `redis-cli --cluster` uses, so no node sends clients back.
        self.setslot(&target, slot, &["NODE", &target_id])?;
        self.setslot(&source, slot, &["NODE", &target_id])?;
        for m in masters.iter().filter(|m| **m != source && **m != target) {
            self.setslot(m, slot, &["NODE", &target_id])?;
        }
        self.note(format!("slot {slot} handed over to {target}"));
        Ok(())
    }

    /// `MIGRATE`s the keys of `slot` from `source` to `target`, 100 at a
    /// time, with the credentials of the user's URL.
    fn move_keys(&self, slot: u16, source: &str, target: &str) -> anyhow::Result<usize> {
        let mut con = self.node(source)?;
        let (host, port) = target
            .rsplit_once(':')
            .context("a node address without a port")?;
        let url = url::Url::parse(&node_url(self.template()?, target)).context("a node URL")?;
        let mut moved = 0;
        loop {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut con)
                .context("CLUSTER GETKEYSINSLOT")?;
            if keys.is_empty() {
                return Ok(moved);
            }
            let mut cmd = redis::cmd("MIGRATE");
            cmd.arg(host.trim_matches(['[', ']']))
                .arg(port)
                .arg("")
                .arg(0)
                .arg(5_000);
            if let Some(password) = url.password() {
                let user = match url.username() {
                    "" => "default",
                    user => user,
                };
                cmd.arg("AUTH2").arg(user).arg(password);
            }
            cmd.arg("KEYS").arg(&keys);
            let _: redis::Value = cmd.query(&mut con).context("MIGRATE")?;
            moved += keys.len();
        }
    }

    /// Fails the master of `slot` over to its replica and waits until the
    /// replica serves the slot.
    fn fail_over(&mut self, slot: u16) -> anyhow::Result<()> {
        let ranges = self.ranges()?;
        let range = owner(&ranges, slot).context("no master owns the slot")?;
        let victim = range.master.clone();
        let replica = range
            .replicas
            .first()
            .with_context(|| format!("the master {victim} has no replica to fail over to"))?
            .clone();
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut self.node(&replica)?)
            .with_context(|| format!("CLUSTER FAILOVER on {replica}"))?;
        self.note(format!(
            "CLUSTER FAILOVER sent to {replica}, a replica of {victim} (slot {slot})"
        ));
        let deadline = Instant::now() + PROMOTION_PATIENCE;
        while Instant::now() < deadline {
            if let Ok(now) = self.ranges() {
                if owner(&now, slot).is_some_and(|r| r.master == replica) {
                    self.note(format!("{replica} serves slot {slot}"));
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("{replica} was not promoted within {PROMOTION_PATIENCE:?}")
    }
}
