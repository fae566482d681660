//! A node of the cluster: its shared connection (opened in a task of its
//! own, replaced after it drops or goes unanswered too often), whether it
//! is failing, and how the nodes the cluster names become clients.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError};
use tokio::sync::Notify;

use super::super::errors::driver_within;
use super::super::options::open_client;
use super::RouterInner;
use crate::error::{BackendError, BackendErrorKind};

/// Unanswered commands in a row after which a node's connection is
/// replaced.
pub(super) const REPLACE_AFTER: u32 = 3;

/// One node of the cluster and its connection.
pub(super) struct Node {
    /// `host:port`, as the cluster names it.
    pub(super) addr: String,
    /// This node's failure domain (unique per node for the router's life).
    pub(super) shard: u64,
    pub(super) client: Client,
    config: AsyncConnectionConfig,
    pub(super) connect_timeout: Duration,
    /// The current connection and its generation.
    pub(super) conn: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// A connection attempt is under way, in a task of its own: a caller
    /// that stops waiting (the cache's timeout) does not abort it, so a
    /// slow handshake still completes for the next caller.
    connecting: AtomicBool,
    /// Woken when a connection attempt ends.
    attempt_ended: Notify,
    /// How the last connection attempt failed.
    connect_error: Mutex<Option<RedisError>>,
    pub(super) generation: AtomicU64,
    /// The node did not answer its last command (a timeout, a refused or
    /// dropped connection, or a call abandoned after [`ABANDONED_AFTER`]).
    pub(super) failing: AtomicBool,
    /// Commands in a row that went unanswered; at [`REPLACE_AFTER`] the
    /// connection is replaced (it may be silently dead).
    pub(super) unanswered: AtomicU32,
}

impl Node {
    /// The shared connection, opened if there is none.
    pub(super) async fn connection(
        self: &Arc<Self>,
    ) -> Result<(u64, MultiplexedConnection), RedisError> {
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
    pub(super) async fn connect(&self) -> Result<MultiplexedConnection, RedisError> {
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
    pub(super) fn drop_connection(&self, generation: u64) {
        let mut conn = self.conn.lock();
        if conn.as_ref().is_some_and(|(g, _)| *g == generation) {
            *conn = None;
        }
    }

    /// The node answered.
    pub(super) fn answered(&self) {
        self.failing.store(false, Ordering::Relaxed);
        self.unanswered.store(0, Ordering::Relaxed);
    }

    /// A command on connection `generation` went unanswered; returns
    /// whether the node just started failing. After [`REPLACE_AFTER`] in a
    /// row the connection is replaced: a connection that died silently
    /// (an idle-dropping middlebox, a peer gone without a reset) would
    /// otherwise time out until the kernel gives up on it.
    pub(super) fn unanswered(&self, generation: Option<u64>) -> bool {
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

impl RouterInner {
    /// The node at `addr` (`host:port`), created on first use.
    pub(super) fn node(&self, addr: &str) -> Result<Arc<Node>, BackendError> {
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
}

/// `host` without the brackets of an IPv6 address in a URL.
pub(super) fn unbracketed(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `addr` (`host:port`, from a redirection) with the host of `answered_by`
/// if it names none: an empty host, `?`, or a wildcard address means the
/// node that answered (as Redis documents for `CLUSTER SLOTS`).
pub(super) fn with_host_of(addr: &str, answered_by: &str) -> String {
    match addr.rsplit_once(':') {
        Some((host, port)) if unknown_host(host) => {
            let answering = answered_by.rsplit_once(':').map_or("", |(h, _)| h);
            format!("{answering}:{port}")
        }
        _ => addr.to_owned(),
    }
}

pub(super) fn unknown_host(host: &str) -> bool {
    matches!(host, "" | "?" | "0.0.0.0" | "::" | "[::]")
}
