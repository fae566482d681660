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
//!   multiplexed connection (opened on first use, replaced after it drops),
//!   and each master is a [`shard`](ClusterRouter::shard_of) of its own, so
//!   the cache above keeps one circuit breaker per master;
//! - `MOVED` updates the slot at once and is followed; `ASK` is followed on
//!   a connection of its own, with `ASKING` before each command (it
//!   applies to the next command of a connection only, which a shared
//!   connection cannot promise); `TRYAGAIN`,
//!   `CLUSTERDOWN`, `MASTERDOWN`, `LOADING` and `READONLY` are retried with
//!   a short backoff for up to the response timeout (the cache's backend
//!   timeout cuts it shorter): routing never reaches the caller;
//! - a timeout or a connection failure marks the master *failing* and
//!   wakes the refresher; while any master serving slots is failing, the
//!   refresher asks every other master for `CLUSTER SLOTS` (concurrently,
//!   the first answer wins) every [`FAILING_REFRESH`] (backing off to
//!   [`FAILING_REFRESH_MAX`]), so a promotion is seen within that interval
//!   whether the old master refuses connections or hangs. A command that
//!   timed out is not retried: it may have run.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::errors::within;
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
    /// One connection attempt at a time.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    /// The last command timed out or could not reach the node.
    failing: AtomicBool,
}

impl Node {
    async fn connection(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        if let Some(current) = self.conn.lock().clone() {
            return Ok(current);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(current) = self.conn.lock().clone() {
            return Ok(current);
        }
        let conn = self.connect().await?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.conn.lock() = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// A connection of its own (for `ASKING`), not shared.
    async fn connect(&self) -> Result<MultiplexedConnection, RedisError> {
        within(
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

struct RouterInner {
    /// The first seed URL: scheme, credentials and query for every node.
    template: url::Url,
    /// The seeds' `host:port`, asked when no master answers.
    seeds: Vec<String>,
    options: RedisOptions,
    topology: RwLock<Topology>,
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    next_shard: AtomicU64,
    /// Wakes the refresher.
    refresh: Notify,
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
            let host = parsed.host_str().unwrap_or("127.0.0.1");
            seeds.push(format!("{host}:{}", parsed.port().unwrap_or(6379)));
        }
        let inner = Arc::new(RouterInner {
            template,
            seeds,
            options,
            topology: RwLock::new(Topology::empty()),
            nodes: Mutex::new(HashMap::new()),
            next_shard: AtomicU64::new(1),
            refresh: Notify::new(),
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
        tokio::spawn(refresher(Arc::downgrade(&inner)));
        Ok(ClusterRouter { inner })
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
    /// docs). `op`'s flag says it runs after an `ASK`, on a connection of
    /// its own: it must send `ASKING` before each of its commands.
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
            // Marks the node failing if this attempt is dropped unanswered:
            // the cache's backend timeout usually fires before the driver's.
            let mut attempt = Attempt::start(inner, &node);
            let (result, generation) = if asking {
                match node.connect().await {
                    Ok(conn) => (op(conn, true).await, None),
                    Err(e) => (Err(e), None),
                }
            } else {
                match node.connection().await {
                    Ok((generation, conn)) => (op(conn, false).await, Some(generation)),
                    Err(e) => (Err(e), None),
                }
            };
            attempt.answered();
            let error = match result {
                Ok(value) => {
                    node.failing.store(false, Ordering::Relaxed);
                    return Ok(value);
                }
                Err(error) => error,
            };
            match Reaction::to(&error) {
                Reaction::Moved(addr) | Reaction::Ask(addr) if redirects >= MAX_REDIRECTS => {
                    let _ = addr;
                    return Err(error);
                }
                Reaction::Moved(addr) => {
                    redirects += 1;
                    let target = inner.node(&addr).map_err(|_| error)?;
                    inner.topology.write().set(slot, &target);
                    inner.refresh.notify_one();
                    redirect = Some((target, false));
                }
                Reaction::Ask(addr) => {
                    redirects += 1;
                    let target = inner.node(&addr).map_err(|_| error)?;
                    redirect = Some((target, true));
                }
                Reaction::Retry { refresh } => {
                    // The node answered: it is up, the cluster is busy.
                    node.failing.store(false, Ordering::Relaxed);
                    if refresh {
                        inner.refresh.notify_one();
                    }
                    if started.elapsed() + pause > inner.options.response_timeout {
                        return Err(error);
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_PAUSE_MAX);
                }
                Reaction::Unreachable { dropped } => {
                    if dropped {
                        if let Some(generation) = generation {
                            node.drop_connection(generation);
                        }
                    }
                    tracing::debug!(node = %node.addr, error = %error, "redis cluster node unreachable");
                    inner.failing(&node);
                    return Err(error);
                }
                Reaction::Fail => return Err(error),
            }
        }
    }
}

/// One attempt of a command on a node, armed until it is answered: dropped
/// unanswered (the caller gave up waiting), it marks the node failing, as a
/// timeout would have.
struct Attempt<'a> {
    router: &'a RouterInner,
    node: Option<&'a Arc<Node>>,
}

impl<'a> Attempt<'a> {
    fn start(router: &'a RouterInner, node: &'a Arc<Node>) -> Self {
        Attempt {
            router,
            node: Some(node),
        }
    }
    fn answered(&mut self) {
        self.node = None;
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            self.router.failing(node);
        }
    }
}

impl RouterInner {
    /// `node` did not answer: mark it failing, and refresh the slot map now
    /// (and keep refreshing while it fails) in case its slots moved.
    fn failing(&self, node: &Node) {
        if !node.failing.swap(true, Ordering::Relaxed) {
            self.refresh.notify_one();
        }
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
        let host = host.trim_start_matches('[').trim_end_matches(']');
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
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            failing: AtomicBool::new(false),
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

    /// Asks the masters that are not failing (then the seeds and the rest)
    /// for `CLUSTER SLOTS`, all at once, and installs the first answer.
    /// Returns whether any node answered.
    async fn refresh_topology(&self) -> bool {
        let mut candidates: Vec<Arc<Node>> = self.topology.read().masters.clone();
        candidates.sort_by_key(|n| n.failing.load(Ordering::Relaxed));
        for seed in &self.seeds {
            if let Ok(node) = self.node(seed) {
                if !candidates.iter().any(|c| Arc::ptr_eq(c, &node)) {
                    candidates.push(node);
                }
            }
        }
        let mut queries = tokio::task::JoinSet::new();
        for node in candidates {
            queries.spawn(async move {
                let timeout = SLOTS_QUERY_TIMEOUT.min(node.connect_timeout);
                let answer = within(timeout, async {
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
                    self.install(&ranges);
                    return true;
                }
                Ok(_) => {
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
            .any(|(old, new)| match (old, new) {
                (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
                (None, None) => false,
                _ => true,
            });
        if changed {
            tracing::info!(
                masters = topology.masters.len(),
                "redis cluster topology changed"
            );
        }
        *current = topology;
        drop(current);
        // Forget nodes that serve nothing any more (their connections go).
        let masters: Vec<String> = self
            .topology
            .read()
            .masters
            .iter()
            .map(|m| m.addr.clone())
            .collect();
        self.nodes
            .lock()
            .retain(|addr, _| masters.contains(addr) || self.seeds.contains(addr));
    }
}

/// Keeps the slot map current: refreshes when woken (a `MOVED`, a master
/// newly failing, a slot without master) and, while a master that serves
/// slots is failing, every [`FAILING_REFRESH`] to [`FAILING_REFRESH_MAX`].
/// Ends with the router.
async fn refresher(router: Weak<RouterInner>) {
    let mut interval = FAILING_REFRESH;
    loop {
        let Some(inner) = router.upgrade() else {
            return;
        };
        let failing = inner.a_master_is_failing();
        let woken = {
            let notified = inner.refresh.notified();
            if failing {
                tokio::time::timeout(interval, notified).await.is_ok()
            } else {
                // Woken only by a router that is still alive: hold it weakly
                // while idle by checking back now and then.
                tokio::time::timeout(Duration::from_secs(5), notified)
                    .await
                    .is_ok()
            }
        };
        if woken || failing {
            inner.refresh_topology().await;
        }
        interval = if woken || !failing {
            FAILING_REFRESH
        } else {
            (interval * 2).min(FAILING_REFRESH_MAX)
        };
        drop(inner);
        tokio::time::sleep(REFRESH_GAP).await;
    }
}

/// What the router does about an error.
enum Reaction {
    Moved(String),
    Ask(String),
    /// Send it again after a pause (and refresh the slot map?).
    Retry {
        refresh: bool,
    },
    /// The node did not answer (`dropped`: its connection is gone).
    Unreachable {
        dropped: bool,
    },
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
            ErrorKind::Server(ServerErrorKind::Moved) => error
                .redirect_node()
                .map_or(Reaction::Fail, |(addr, _)| Reaction::Moved(addr.to_owned())),
            ErrorKind::Server(ServerErrorKind::Ask) => error
                .redirect_node()
                .map_or(Reaction::Fail, |(addr, _)| Reaction::Ask(addr.to_owned())),
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
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return None,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return None;
        };
        let host = if host.is_empty() {
            answering_host.to_owned()
        } else {
            host
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
            Reaction::Moved(addr) if addr == "127.0.0.1:6381"
        ));
        assert!(matches!(
            Reaction::to(&server("-ASK 3999 127.0.0.1:6381\r\n")),
            Reaction::Ask(addr) if addr == "127.0.0.1:6381"
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
