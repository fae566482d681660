//! Routing on a Redis Cluster: onefill's own slot map and one connection
//! per master, so that a master that fails (refuses connections, or hangs)
//! is left behind as soon as the cluster has promoted its replica.
//!
//! Why not the driver's `ClusterConnection` for commands (decision
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

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::errors::driver_within;
use super::options::{open_client, RedisOptions};
use crate::error::{BackendError, BackendErrorKind};

/// Hash slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// The first interval between topology refreshes while a master is failing.
const FAILING_REFRESH: Duration = Duration::from_millis(100);
/// The longest interval between them (how late a promotion can be seen).
const FAILING_REFRESH_MAX: Duration = Duration::from_millis(200);
/// The fewest time between two refreshes, however many wake-ups.
const REFRESH_GAP: Duration = Duration::from_millis(20);
/// How long one `CLUSTER SLOTS` query may take during a refresh.
const SLOTS_QUERY_TIMEOUT: Duration = Duration::from_millis(500);
/// The first pause before a command answered `TRYAGAIN`/`CLUSTERDOWN` is
/// sent again (doubling, up to [`RETRY_PAUSE_MAX`]).
const RETRY_PAUSE: Duration = Duration::from_millis(5);
const RETRY_PAUSE_MAX: Duration = Duration::from_millis(100);
/// Redirections followed for one command before giving up (a loop of
/// `MOVED` between two nodes that disagree).
const MAX_REDIRECTS: u32 = 8;
/// A command abandoned by its caller after this long without an answer
/// counts as unanswered (the cache's backend timeout usually fires before
/// the driver's). One abandoned sooner says nothing about the node: a
/// healthy Redis answers in well under a millisecond.
const ABANDONED_AFTER: Duration = Duration::from_millis(100);
/// Unanswered commands in a row after which a node's connection is
/// replaced.
const REPLACE_AFTER: u32 = 3;
/// Nodes asked for `CLUSTER SLOTS` at once in a refresh.
const REFRESH_FAN_OUT: usize = 3;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key
/// without one, modulo 16384, as Redis Cluster computes it.
pub(super) fn slot_of(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS as u16
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// One node of the cluster and its connection.
pub(super) struct Node {
    /// `host:port`, as the cluster names it.
    addr: String,
    /// This node's failure domain (unique per node for the router's life).
    shard: u64,
    client: Client,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
    /// The current connection and its generation.
    conn: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// A connection attempt is under way, in a task of its own: a caller
    /// that stops waiting (the cache's timeout) does not abort it, so a
    /// slow handshake still completes for the next caller.
    connecting: AtomicBool,
    /// Woken when a connection attempt ends.
    attempt_ended: Notify,
    /// How the last connection attempt failed.
    connect_error: Mutex<Option<RedisError>>,
    generation: AtomicU64,
    /// The node did not answer its last command (a timeout, a refused or
    /// dropped connection, or a call abandoned after [`ABANDONED_AFTER`]).
    failing: AtomicBool,
    /// Commands in a row that went unanswered; at [`REPLACE_AFTER`] the
    /// connection is replaced (it may be silently dead).
    unanswered: AtomicU32,
}

impl Node {
    /// The shared connection, opened if there is none.
    async fn connection(self: &Arc<Self>) -> Result<(u64, MultiplexedConnection), RedisError> {
        loop {
            let ended = self.attempt_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if let Some(current) = self.conn.lock().clone() {
                return Ok(current);
            }
            if !self.connecting.swap(true, Ordering::AcqRel) {
                *self.connect_error.lock() = None;
                let node = self.clone();
                tokio::spawn(async move {
                    match node.connect().await {
                        Ok(conn) => {
                            let generation = node.generation.fetch_add(1, Ordering::Relaxed) + 1;
                            *node.conn.lock() = Some((generation, conn));
                        }
                        Err(e) => *node.connect_error.lock() = Some(e),
                    }
                    node.connecting.store(false, Ordering::Release);
                    node.attempt_ended.notify_waiters();
                });
            }
            // Bounded: the attempt gives up after the connect timeout.
            ended.await;
            if let Some(current) = self.conn.lock().clone() {
                return Ok(current);
            }
            if let Some(e) = self.connect_error.lock().clone() {
                return Err(e);
            }
            // Another attempt started meanwhile: wait for it.
        }
    }

    /// A new connection (bounded by the connect timeout).
    async fn connect(&self) -> Result<MultiplexedConnection, RedisError> {
        driver_within(
            "connect",
            self.connect_timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&self.config),
        )
        .await
    }

    /// Forgets connection `generation` (it dropped): the next command opens
    /// a new one.
    fn drop_connection(&self, generation: u64) {
        let mut conn = self.conn.lock();
        if conn.as_ref().is_some_and(|(g, _)| *g == generation) {
            *conn = None;
        }
    }

    /// The node answered.
    fn answered(&self) {
        self.failing.store(false, Ordering::Relaxed);
        self.unanswered.store(0, Ordering::Relaxed);
    }

    /// A command on connection `generation` went unanswered; returns
    /// whether the node just started failing. After [`REPLACE_AFTER`] in a
    /// row the connection is replaced: a connection that died silently
    /// (an idle-dropping middlebox, a peer gone without a reset) would
    /// otherwise time out until the kernel gives up on it.
    fn unanswered(&self, generation: Option<u64>) -> bool {
        let in_a_row = self.unanswered.fetch_add(1, Ordering::Relaxed) + 1;
        if in_a_row >= REPLACE_AFTER {
            if let Some(generation) = generation {
                self.drop_connection(generation);
            }
            self.unanswered.store(0, Ordering::Relaxed);
        }
        !self.failing.swap(true, Ordering::Relaxed)
    }
}

/// Which master serves each slot.
struct Topology {
    owners: Vec<Option<Arc<Node>>>,
    /// The distinct nodes of `owners`.
    masters: Vec<Arc<Node>>,
}

impl Topology {
    fn empty() -> Topology {
        Topology {
            owners: vec![None; SLOTS],
            masters: Vec::new(),
        }
    }

    fn set(&mut self, slot: u16, node: &Arc<Node>) {
        self.owners[usize::from(slot)] = Some(node.clone());
        if !self.masters.iter().any(|m| Arc::ptr_eq(m, node)) {
            self.masters.push(node.clone());
        }
    }
}

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
    /// owner (for the subscriber, see `link.rs`).
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

    /// A master that does not serve `slot` and is not failing, as
    /// `(host, port)`: asked about the slot, it answers `MOVED` (see
    /// `link.rs`, which uses this to make the driver refresh its slot map).
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

    /// Runs `op` on a connection to the master of `slot`, following
    /// redirections and retrying transient cluster states (see the module
    /// docs). `op`'s flag says it runs after an `ASK`: each of its commands
    /// must be sent right after an `ASKING`, in one pipeline (the
    /// connection is shared; a pipeline is written in one piece).
    pub(super) async fn run<T, F, Fut>(&self, slot: u16, op: F) -> Result<T, RedisError>
    where
        F: Fn(MultiplexedConnection, bool) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let inner = &self.inner;
        let started = Instant::now();
        let mut redirect: Option<(Arc<Node>, bool)> = None;
        let mut redirects = 0;
        let mut pause = RETRY_PAUSE;
        loop {
            let (node, asking) = match redirect.take() {
                Some(target) => target,
                None => match inner.owner(slot) {
                    Some(node) => (node, false),
                    None => {
                        inner.refresh.notify_one();
                        return Err(unrouted(slot));
                    }
                },
            };
            // Armed until the node answers: a call abandoned without an
            // answer for long enough counts as unanswered.
            let mut attempt = Attempt::start(inner, &node);
            let (result, generation) = match node.connection().await {
                Ok((generation, conn)) => {
                    attempt.generation = Some(generation);
                    (op(conn, asking).await, Some(generation))
                }
                Err(e) => (Err(e), None),
            };
            attempt.disarm();
            let error = match result {
                Ok(value) => {
                    node.answered();
                    return Ok(value);
                }
                Err(error) => error,
            };
            let reaction = Reaction::to(&error);
            if let Reaction::Unreachable { dropped } = reaction {
                if dropped {
                    if let Some(generation) = generation {
                        node.drop_connection(generation);
                    }
                }
                tracing::debug!(node = %node.addr, error = %error, "redis cluster node unreachable");
                inner.unanswered(&node, generation);
                return Err(error);
            }
            // Any other error is an answer: the node is up.
            node.answered();
            match reaction {
                Reaction::Redirect { addr, ask } => {
                    if redirects >= MAX_REDIRECTS {
                        return Err(error);
                    }
                    redirects += 1;
                    let addr = with_host_of(&addr, &node.addr);
                    let target = inner.node(&addr).map_err(|_| error)?;
                    if !ask {
                        inner.learned(slot, &target);
                    }
                    redirect = Some((target, ask));
                }
                Reaction::Retry { refresh } => {
                    // The cluster is busy (or its map is changing).
                    if refresh {
                        inner.refresh.notify_one();
                    }
                    if started.elapsed() + pause > inner.options.response_timeout {
                        return Err(error);
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_PAUSE_MAX);
                }
                Reaction::Unreachable { .. } | Reaction::Fail => return Err(error),
            }
        }
    }
}

/// One attempt of a command on a node, armed until it is answered: dropped
/// unanswered after [`ABANDONED_AFTER`] (the caller gave up waiting), it
/// counts against the node as a timeout would have.
struct Attempt<'a> {
    router: &'a RouterInner,
    node: Option<&'a Arc<Node>>,
    generation: Option<u64>,
    started: Instant,
}

impl<'a> Attempt<'a> {
    fn start(router: &'a RouterInner, node: &'a Arc<Node>) -> Self {
        Attempt {
            router,
            node: Some(node),
            generation: None,
            started: Instant::now(),
        }
    }
    fn disarm(&mut self) {
        self.node = None;
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            if self.started.elapsed() >= ABANDONED_AFTER {
                self.router.unanswered(node, self.generation);
            }
        }
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

    /// A `MOVED` said `target` serves `slot`.
    fn learned(&self, slot: u16, target: &Arc<Node>) {
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

    fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        self.topology.read().owners[usize::from(slot)].clone()
    }

    /// The node at `addr` (`host:port`), created on first use.
    fn node(&self, addr: &str) -> Result<Arc<Node>, BackendError> {
        if let Some(node) = self.nodes.lock().get(addr) {
            return Ok(node.clone());
        }
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .filter(|(host, _)| !host.is_empty() && *host != "?")
            .ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Protocol,
                    format!("the cluster named a node without a usable address: {addr:?}"),
                )
            })?;
        let mut url = self.template.clone();
        let host = unbracketed(host);
        let host_ok = if host.contains(':') {
            url.set_host(Some(&format!("[{host}]")))
        } else {
            url.set_host(Some(host))
        };
        if host_ok.is_err() || url.set_port(Some(port)).is_err() {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("the cluster named a node whose address is not a URL host: {addr:?}"),
            ));
        }
        let client = open_client(url.as_str(), &self.options)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.options.connection_timeout))
            .set_response_timeout(Some(self.options.response_timeout));
        let node = Arc::new(Node {
            addr: addr.to_owned(),
            shard: self.next_shard.fetch_add(1, Ordering::Relaxed),
            client,
            config,
            connect_timeout: self
                .options
                .connection_timeout
                .saturating_add(self.options.response_timeout),
            conn: Mutex::new(None),
            connecting: AtomicBool::new(false),
            attempt_ended: Notify::new(),
            connect_error: Mutex::new(None),
            generation: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            unanswered: AtomicU32::new(0),
        });
        Ok(self
            .nodes
            .lock()
            .entry(addr.to_owned())
            .or_insert(node)
            .clone())
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
    async fn refresh_topology(&self) -> bool {
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

    fn install(&self, ranges: &[(u16, u16, String)]) {
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
async fn refresher(router: Weak<RouterInner>, wake: Arc<Notify>) {
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

/// `host` without the brackets of an IPv6 address in a URL.
fn unbracketed(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `addr` (`host:port`, from a redirection) with the host of `answered_by`
/// if it names none: an empty host, `?`, or a wildcard address means the
/// node that answered (as Redis documents for `CLUSTER SLOTS`).
fn with_host_of(addr: &str, answered_by: &str) -> String {
    match addr.rsplit_once(':') {
        Some((host, port)) if unknown_host(host) => {
            let answering = answered_by.rsplit_once(':').map_or("", |(h, _)| h);
            format!("{answering}:{port}")
        }
        _ => addr.to_owned(),
    }
}

fn unknown_host(host: &str) -> bool {
    matches!(host, "" | "?" | "0.0.0.0" | "::" | "[::]")
}

/// What the router does about an error.
enum Reaction {
    /// `MOVED` (`ask: false`: the slot lives there now) or `ASK` (this
    /// command only) to the node at `addr`.
    Redirect { addr: String, ask: bool },
    /// Send it again after a pause (and refresh the slot map?).
    Retry { refresh: bool },
    /// The node did not answer (`dropped`: its connection is gone).
    Unreachable { dropped: bool },
    /// An answer: the caller's.
    Fail,
}

impl Reaction {
    fn to(error: &RedisError) -> Reaction {
        // A pipeline's server errors come apart from its `detail`.
        let first = error
            .clone()
            .into_server_errors()
            .and_then(|errors| errors.first().map(|(_, e)| RedisError::from(e.clone())));
        let error = first.as_ref().unwrap_or(error);
        match error.kind() {
            ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask)) => error
                .redirect_node()
                .map_or(Reaction::Fail, |(addr, _)| Reaction::Redirect {
                    addr: addr.to_owned(),
                    ask: kind == ServerErrorKind::Ask,
                }),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::BusyLoading) => {
                Reaction::Retry { refresh: false }
            }
            ErrorKind::Server(
                ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly,
            ) => Reaction::Retry { refresh: true },
            _ if error.is_timeout() => Reaction::Unreachable { dropped: false },
            _ if error.is_connection_dropped()
                || error.is_connection_refusal()
                || error.kind() == ErrorKind::Io =>
            {
                Reaction::Unreachable { dropped: true }
            }
            _ => Reaction::Fail,
        }
    }
}

fn unrouted(slot: u16) -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "no master known for the slot",
        format!("slot {slot}"),
    ))
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
    fn slots_are_computed_as_redis_does() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        // An empty tag hashes the whole key.
        assert_eq!(slot_of(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
    }

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

    #[test]
    fn routing_errors_are_told_apart() {
        let server = |reply: &str| match redis::parse_redis_value(reply.as_bytes()) {
            Ok(Value::ServerError(e)) => RedisError::from(e),
            other => panic!("not a server error: {other:?}"),
        };
        assert!(matches!(
            Reaction::to(&server("-MOVED 3999 127.0.0.1:6381\r\n")),
            Reaction::Redirect { addr, ask: false } if addr == "127.0.0.1:6381"
        ));
        assert!(matches!(
            Reaction::to(&server("-ASK 3999 127.0.0.1:6381\r\n")),
            Reaction::Redirect { addr, ask: true } if addr == "127.0.0.1:6381"
        ));
        assert!(matches!(
            Reaction::to(&server("-CLUSTERDOWN The cluster is down\r\n")),
            Reaction::Retry { refresh: true }
        ));
        assert!(matches!(
            Reaction::to(&server("-TRYAGAIN Multiple keys\r\n")),
            Reaction::Retry { refresh: false }
        ));
        assert!(matches!(
            Reaction::to(&server("-WRONGTYPE no\r\n")),
            Reaction::Fail
        ));
        let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
        assert!(matches!(
            Reaction::to(&io(std::io::ErrorKind::TimedOut)),
            Reaction::Unreachable { dropped: false }
        ));
        assert!(matches!(
            Reaction::to(&io(std::io::ErrorKind::ConnectionRefused)),
            Reaction::Unreachable { dropped: true }
        ));
    }
}
