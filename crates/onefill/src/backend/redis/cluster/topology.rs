//! The slot map: which master serves each slot, learned from `MOVED` and
//! refreshed with `CLUSTER SLOTS` (at once when woken, and continually
//! while a master that serves slots is failing).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::Value;
use tokio::sync::Notify;

use super::super::errors::driver_within;
use super::node::{unbracketed, unknown_host, Node};
use super::slot::SLOTS;
use super::RouterInner;

/// The first interval between topology refreshes while a master is failing.
pub(super) const FAILING_REFRESH: Duration = Duration::from_millis(100);
/// The longest interval between them (how late a promotion can be seen).
pub(super) const FAILING_REFRESH_MAX: Duration = Duration::from_millis(200);
/// The fewest time between two refreshes, however many wake-ups.
const REFRESH_GAP: Duration = Duration::from_millis(20);
/// How long one `CLUSTER SLOTS` query may take during a refresh.
const SLOTS_QUERY_TIMEOUT: Duration = Duration::from_millis(500);
/// Nodes asked for `CLUSTER SLOTS` at once in a refresh.
pub(super) const REFRESH_FAN_OUT: usize = 3;

/// Which master serves each slot.
pub(super) struct Topology {
    pub(super) owners: Vec<Option<Arc<Node>>>,
    /// The distinct nodes of `owners`.
    pub(super) masters: Vec<Arc<Node>>,
}

impl Topology {
    pub(super) fn empty() -> Topology {
        Topology {
            owners: vec![None; SLOTS],
            masters: Vec::new(),
        }
    }

    pub(super) fn set(&mut self, slot: u16, node: &Arc<Node>) {
        self.owners[usize::from(slot)] = Some(node.clone());
        if !self.masters.iter().any(|m| Arc::ptr_eq(m, node)) {
            self.masters.push(node.clone());
        }
    }
}

impl RouterInner {
    /// A `MOVED` said `target` serves `slot`.
    pub(super) fn learned(&self, slot: u16, target: &Arc<Node>) {
        self.moved.fetch_add(1, Ordering::AcqRel);
        let changed = {
            let mut topology = self.topology.write();
            let changed = !topology.owners[usize::from(slot)]
                .as_ref()
                .is_some_and(|o| Arc::ptr_eq(o, target));
            topology.set(slot, target);
            changed
        };
        if changed {
            self.changes.send_modify(|(n, s)| {
                *n += 1;
                *s = slot;
            });
        }
        self.refresh.notify_one();
    }

    /// Whether a master that serves slots is failing.
    fn a_master_is_failing(&self) -> bool {
        self.topology
            .read()
            .masters
            .iter()
            .any(|m| m.failing.load(Ordering::Relaxed))
    }

    /// Asks up to [`REFRESH_FAN_OUT`] nodes for `CLUSTER SLOTS` at once
    /// (masters that answer first, then the seeds, then failing masters)
    /// and installs the first answer, unless a `MOVED` taught a newer slot
    /// meanwhile (then another refresh follows). Returns whether any node
    /// answered.
    pub(super) async fn refresh_topology(&self) -> bool {
        let moved_before = self.moved.load(Ordering::Acquire);
        let mut candidates: Vec<Arc<Node>> = self.topology.read().masters.clone();
        for seed in &self.seeds {
            if let Ok(node) = self.node(seed) {
                if !candidates.iter().any(|c| Arc::ptr_eq(c, &node)) {
                    candidates.push(node);
                }
            }
        }
        // Healthy nodes first; among them, a different few each time.
        candidates.sort_by_key(|n| (n.failing.load(Ordering::Relaxed), rand::random::<u32>()));
        candidates.truncate(REFRESH_FAN_OUT);
        let mut queries = tokio::task::JoinSet::new();
        for node in candidates {
            queries.spawn(async move {
                let timeout = SLOTS_QUERY_TIMEOUT.min(node.connect_timeout);
                let answer = driver_within("CLUSTER SLOTS", timeout, async {
                    let (_, mut conn) = node.connection().await?;
                    redis::cmd("CLUSTER")
                        .arg("SLOTS")
                        .query_async::<Value>(&mut conn)
                        .await
                })
                .await;
                (node, answer)
            });
        }
        while let Some(joined) = queries.join_next().await {
            let Ok((node, answer)) = joined else {
                continue;
            };
            match answer.map(|value| parse_slots(&value, &node.addr)) {
                Ok(Some(ranges)) if !ranges.is_empty() => {
                    node.answered();
                    if self.moved.load(Ordering::Acquire) != moved_before {
                        // Older than what a MOVED taught since: ask again.
                        self.refresh.notify_one();
                    } else {
                        self.install(&ranges);
                    }
                    return true;
                }
                Ok(_) => {
                    node.answered();
                    tracing::debug!(node = %node.addr, "CLUSTER SLOTS answer not understood");
                }
                Err(e) => {
                    tracing::debug!(node = %node.addr, error = %e, "CLUSTER SLOTS failed");
                }
            }
        }
        false
    }

    pub(super) fn install(&self, ranges: &[(u16, u16, String)]) {
        let mut topology = Topology::empty();
        for (start, end, addr) in ranges {
            let Ok(node) = self.node(addr) else {
                continue;
            };
            for slot in *start..=(*end).min(SLOTS as u16 - 1) {
                topology.set(slot, &node);
            }
        }
        let mut current = self.topology.write();
        let changed = current
            .owners
            .iter()
            .zip(&topology.owners)
            .position(|(old, new)| match (old, new) {
                (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
                (None, None) => false,
                _ => true,
            });
        *current = topology;
        drop(current);
        if let Some(slot) = changed {
            tracing::info!("redis cluster topology changed");
            self.changes.send_modify(|(n, s)| {
                *n += 1;
                *s = slot as u16;
            });
        }
    }
}

/// Keeps the slot map current: refreshes when woken (a `MOVED`, a master
/// newly failing, a slot without master) and, while a master that serves
/// slots is failing, every [`FAILING_REFRESH`] to [`FAILING_REFRESH_MAX`].
/// Holds the router only while it refreshes; ends with it.
pub(super) async fn refresher(router: Weak<RouterInner>, wake: Arc<Notify>) {
    let mut interval = FAILING_REFRESH;
    loop {
        let failing = match router.upgrade() {
            Some(inner) => inner.a_master_is_failing(),
            None => return,
        };
        let woken = if failing {
            tokio::time::timeout(interval, wake.notified())
                .await
                .is_ok()
        } else {
            // Checks now and then that the router is still there.
            tokio::time::timeout(Duration::from_secs(1), wake.notified())
                .await
                .is_ok()
        };
        if woken || failing {
            let Some(inner) = router.upgrade() else {
                return;
            };
            inner.refresh_topology().await;
        }
        interval = if woken || !failing {
            FAILING_REFRESH
        } else {
            (interval * 2).min(FAILING_REFRESH_MAX)
        };
        tokio::time::sleep(REFRESH_GAP).await;
    }
}

/// `CLUSTER SLOTS` as `(start, end, "host:port")` of each range's master;
/// an empty host means the node that answered. `None`: not that shape.
fn parse_slots(value: &Value, answered_by: &str) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(ranges) = value else {
        return None;
    };
    let answering_host = answered_by.rsplit_once(':').map_or("", |(h, _)| h);
    let mut out = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return None;
        };
        // A NULL endpoint (`cluster-preferred-endpoint-type
        // unknown-endpoint`) is the node that answered, like an empty one.
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            Some(Value::Nil) => String::new(),
            _ => return None,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return None;
        };
        let host = if unknown_host(&host) {
            answering_host.to_owned()
        } else {
            unbracketed(&host).to_owned()
        };
        let (Ok(start), Ok(end)) = (u16::try_from(*start), u16::try_from(*end)) else {
            return None;
        };
        out.push((start, end, format!("{host}:{port}")));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_slots_answers_are_parsed() {
        let node = |host: &str, port| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let answer = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("", 7001)]),
        ]);
        assert_eq!(
            parse_slots(&answer, "10.0.0.9:7001").unwrap(),
            vec![
                (0, 5460, "10.0.0.1:7000".to_owned()),
                (5461, 16383, "10.0.0.9:7001".to_owned()),
            ]
        );
        assert!(parse_slots(&Value::Int(1), "x:1").is_none());
    }
}
