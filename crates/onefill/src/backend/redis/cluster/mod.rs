//! Routing on a Redis Cluster: onefill's own slot map and one connection
//! per master, so that a master that fails (refuses connections, or hangs)
//! is left behind as soon as the cluster has promoted its replica.
//!
//! Why not the driver's `ClusterConnection` for commands (see
//! `docs/decisions/0006-cluster-routing.md`): it retries a command that timed
//! out on the same node without refreshing its slot map, so a hung master
//! (which never answers `MOVED`) is never left; and its slot refresh holds
//! every request while it asks the nodes one at a time, a hung one
//! included, which stalls the healthy shards too.
//!
//! Here:
//! - each slot maps to the master serving it, each master has its own
//!   multiplexed connection (opened on first use in a task of its own, so
//!   a caller that gives up does not abort a slow handshake; replaced after
//!   it drops, or after [`REPLACE_AFTER`] unanswered commands in a row, as
//!   it may have died silently), and each master is a
//!   [`shard`](ClusterRouter::shard_of) of its own, so the cache above
//!   keeps one circuit breaker per master;
//! - `MOVED` updates the slot at once and is followed; `ASK` is followed
//!   on the target's shared connection with `ASKING` and the command in one
//!   pipeline (`ASKING` applies to the next command of a connection only,
//!   and a pipeline is written in one piece); `TRYAGAIN`, `CLUSTERDOWN`,
//!   `MASTERDOWN`, `LOADING` and `READONLY` are retried with a short
//!   backoff for up to the response timeout (the cache's backend timeout
//!   cuts it shorter): routing never reaches the caller;
//! - a timeout, a connection failure, or a call its caller gave up on
//!   after [`ABANDONED_AFTER`] without an answer marks the master *failing*
//!   and wakes the refresher; while any master serving slots is failing,
//!   the refresher asks [`REFRESH_FAN_OUT`] nodes (healthy ones first) for
//!   `CLUSTER SLOTS` at once, the first answer winning, every
//!   [`FAILING_REFRESH`] (backing off to [`FAILING_REFRESH_MAX`]), so a
//!   promotion is seen within that interval whether the old master refuses
//!   connections or hangs. An answer is not installed over a slot a
//!   `MOVED` taught since the refresh began. A command that timed out is
//!   not retried: it may have run;
//! - endpoints the cluster leaves unnamed (NULL, empty, `?`, a wildcard
//!   address) are the node that answered, as Redis documents.
//!
//! Known limits: the first answer wins (no agreement between nodes; a
//! lagging node's view is corrected by the next `MOVED`); replicas are not
//! read from; during a slot migration the scripts, whose lease and channel
//! keys do not exist yet, meet `TRYAGAIN` until the slot has moved (reads
//! follow `ASK`).
//!
//! The router's parts: the hash slot of a key (`slot.rs`), a node and its
//! connection (`node.rs`), the slot map and its refresh (`topology.rs`),
//! running a command on the master of its slot (`route.rs`), and what an
//! error means for routing: a redirection, a retry, a node that did not
//! answer (`reaction.rs`). This file holds the router and its lifecycle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use redis::Client;
use tokio::sync::{watch, Notify};

use super::options::{open_client, RedisOptions};
use crate::error::{BackendError, BackendErrorKind};

mod node;
mod reaction;
mod route;
mod slot;
mod topology;

use node::{unbracketed, Node};
pub(super) use reaction::is_try_again;
pub(super) use slot::{slot_of, tag_in};
use topology::{refresher, Topology};

/// Routes commands to the masters of a Redis Cluster; see the module docs.
#[derive(Clone)]
pub(super) struct ClusterRouter {
    inner: Arc<RouterInner>,
}

/// A [`ClusterRouter`] that does not keep it alive.
pub(super) struct WeakRouter(Weak<RouterInner>);

impl WeakRouter {
    pub(super) fn upgrade(&self) -> Option<ClusterRouter> {
        self.0.upgrade().map(|inner| ClusterRouter { inner })
    }
}

struct RouterInner {
    /// The first seed URL: scheme, credentials and query for every node.
    template: url::Url,
    /// The seeds' `host:port`, asked when no master answers.
    seeds: Vec<String>,
    options: RedisOptions,
    topology: RwLock<Topology>,
    /// Every node seen, by address (a node that leaves the topology keeps
    /// its entry: its shard number stays the same if it comes back).
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    next_shard: AtomicU64,
    /// Wakes the refresher.
    refresh: Arc<Notify>,
    /// Bumped by every slot learned from a `MOVED`: a refresh that started
    /// before one does not install its (older) answer.
    moved: AtomicU64,
    /// Bumped at every change of the slot map, with a slot that changed
    /// owner (for the subscriber, see `subscriber/link.rs`).
    changes: watch::Sender<(u64, u16)>,
}

impl ClusterRouter {
    /// Connects to the cluster through `urls` (any of its nodes): reads the
    /// slot map from the first that answers, and starts the refresher.
    pub(super) async fn connect(
        urls: &[&str],
        options: RedisOptions,
    ) -> Result<ClusterRouter, BackendError> {
        let Some(first) = urls.first() else {
            return Err(BackendError::new(
                BackendErrorKind::Command,
                "connect: no cluster node URL given",
            ));
        };
        // Every URL is checked as the driver would (what is wrong with it,
        // TLS support, the database), without quoting it.
        for url in urls {
            open_client(url, &options)?;
        }
        let template = url::Url::parse(first).map_err(|e| {
            BackendError::with_source(
                BackendErrorKind::Command,
                format!("invalid Redis URL: {e}"),
                e,
            )
        })?;
        let mut seeds = Vec::new();
        for url in urls {
            let parsed = url::Url::parse(url).map_err(|e| {
                BackendError::with_source(
                    BackendErrorKind::Command,
                    format!("invalid Redis URL: {e}"),
                    e,
                )
            })?;
            // `[::1]` in a URL is `::1` in the cluster's answers.
            let host = unbracketed(parsed.host_str().unwrap_or("127.0.0.1"));
            seeds.push(format!("{host}:{}", parsed.port().unwrap_or(6379)));
        }
        let inner = Arc::new(RouterInner {
            template,
            seeds,
            options,
            topology: RwLock::new(Topology::empty()),
            nodes: Mutex::new(HashMap::new()),
            next_shard: AtomicU64::new(1),
            refresh: Arc::new(Notify::new()),
            moved: AtomicU64::new(0),
            changes: watch::channel((0, 0)).0,
        });
        // Fail early on a URL the driver refuses (credentials, TLS).
        for seed in inner.seeds.clone() {
            inner.node(&seed)?;
        }
        if !inner.refresh_topology().await {
            return Err(BackendError::new(
                BackendErrorKind::Connection,
                "connect: no cluster node answered CLUSTER SLOTS",
            ));
        }
        tokio::spawn(refresher(Arc::downgrade(&inner), inner.refresh.clone()));
        Ok(ClusterRouter { inner })
    }

    pub(super) fn downgrade(&self) -> WeakRouter {
        WeakRouter(Arc::downgrade(&self.inner))
    }

    /// The masters of the slot map now: their address and a client for
    /// them (for the L1's tracking connections).
    pub(super) fn masters(&self) -> Vec<(String, Client)> {
        self.inner
            .topology
            .read()
            .masters
            .iter()
            .map(|node| (node.addr.clone(), node.client.clone()))
            .collect()
    }

    /// Each master of the slot map now, as its failure domain (see
    /// [`shard_of`](Self::shard_of)) and the first slot it serves: one
    /// scan of the map, for the holders' presence channels (a channel in
    /// that slot lives on that master, and fails over with it).
    pub(super) fn first_slots(&self) -> Vec<(u64, u16)> {
        let topology = self.inner.topology.read();
        let mut first: Vec<(u64, u16)> = Vec::new();
        for (slot, owner) in topology.owners.iter().enumerate() {
            let Some(node) = owner else { continue };
            if first.iter().all(|&(shard, _)| shard != node.shard) {
                // Slots are fewer than 2^16 (`SLOTS`).
                first.push((node.shard, slot as u16));
            }
        }
        first
    }

    /// Changes of the slot map: a counter, and one slot whose owner changed.
    pub(super) fn changes(&self) -> watch::Receiver<(u64, u16)> {
        self.inner.changes.subscribe()
    }

    /// The failure domain of `slot`: its master's, or 0 while no master is
    /// known for it.
    pub(super) fn shard_of(&self, slot: u16) -> u64 {
        self.inner.topology.read().owners[usize::from(slot)]
            .as_ref()
            .map_or(0, |node| node.shard)
    }

    /// Whether the master known as `shard` owns a slot in the slot map now
    /// (a scan of the map: for health reports, not for calls).
    pub(super) fn serves_keys(&self, shard: u64) -> bool {
        self.inner
            .topology
            .read()
            .owners
            .iter()
            .flatten()
            .any(|node| node.shard == shard)
    }

    /// A master that does not serve `slot` and is not failing, as
    /// `(host, port)`: asked about the slot, it answers `MOVED` (the
    /// subscriber's cluster link uses this to make the driver refresh its
    /// slot map).
    pub(super) fn another_master(&self, slot: u16) -> Option<(String, u16)> {
        let topology = self.inner.topology.read();
        let owner = topology.owners[usize::from(slot)].as_ref();
        topology
            .masters
            .iter()
            .filter(|m| owner.is_none_or(|o| !Arc::ptr_eq(o, m)))
            .find(|m| !m.failing.load(Ordering::Relaxed))
            .and_then(|m| {
                let (host, port) = m.addr.rsplit_once(':')?;
                Some((host.to_owned(), port.parse().ok()?))
            })
    }
}

impl RouterInner {
    /// `node` did not answer: count it, and if it just started failing,
    /// refresh the slot map now (and keep refreshing while it fails) in
    /// case its slots moved.
    fn unanswered(&self, node: &Node, generation: Option<u64>) {
        if node.unanswered(generation) {
            self.refresh.notify_one();
        }
    }

    fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        self.topology.read().owners[usize::from(slot)].clone()
    }
}
