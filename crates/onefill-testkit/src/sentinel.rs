//! A primary, its replicas and the Redis Sentinels watching them, all
//! private servers.

use std::time::{Duration, Instant};

use crate::resp::{raw_command, Reply};
use crate::server::RedisServer;

/// The name the Sentinels know the primary by.
const MASTER_NAME: &str = "onefill-primary";

/// How long the Sentinels wait for a primary that does not answer before
/// they call it down (`down-after-milliseconds`). Redis's default is 30 s;
/// 2 s makes a killed or hung primary be replaced within a few seconds, so
/// a test of a failure takes seconds, not a minute. Not less: with 1 s, on
/// a loaded 2-core machine, about one failover in four was followed by a
/// second one, a Sentinel calling the freshly promoted primary down a
/// second after it learnt of it (its first replies late), and the test
/// measured two failovers where it caused one.
const DOWN_AFTER_MS: u64 = 2_000;

/// `failover-timeout`: how long a failover may take before the Sentinels
/// give it up (and, twice that, how soon they retry the same primary).
/// Redis's default is 3 minutes; a failover of servers on loopback takes
/// a few seconds, and a test that needs a second attempt should not wait
/// minutes for it.
const FAILOVER_TIMEOUT_MS: u64 = 5_000;

/// How long the whole set-up may take to be ready: every Sentinel knowing
/// the primary, both replicas and the other Sentinels (they find each
/// other through hello messages every 2 s), every replication link up.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one question waits for one server (a paused primary must not
/// stall the kit).
const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// A primary with 2 replicas, watched by 3 Redis Sentinels (quorum 2).
///
/// The data nodes are [`RedisServer`]s, the replicas started with
/// `--replicaof 127.0.0.1 <primary port>`; each Sentinel is
/// `redis-server <conf> --sentinel` with its configuration file in its
/// private directory:
///
/// ```text
/// sentinel resolve-hostnames no
/// sentinel monitor onefill-primary 127.0.0.1 <port> 2
/// sentinel down-after-milliseconds onefill-primary 2000
/// sentinel failover-timeout onefill-primary 5000
/// sentinel parallel-syncs onefill-primary 1
/// ```
///
/// `down-after-milliseconds` is 2 s (Redis's default is 30 s) so a failed
/// primary is replaced within seconds (1 s made a second, spurious
/// failover of the new primary likely on a loaded machine); `failover-timeout` is 5 s (default
/// 3 minutes), so a failover that stalls is retried within seconds. Every
/// process is on a free port of 127.0.0.1 and is killed when this is
/// dropped.
///
/// ```no_run
/// use std::time::Duration;
/// use onefill_testkit::RedisSentinel;
///
/// let set = RedisSentinel::start();
/// let old = set.primary().port();
/// set.failover(); // SENTINEL FAILOVER
/// let (new, took) = set.wait_for_new_primary(old, Duration::from_secs(30));
/// assert_ne!(new, old);
/// # let _ = took;
/// ```
///
/// This is test support: a set-up that does not come up panics with the
/// servers' logs.
#[derive(Debug)]
pub struct RedisSentinel {
    nodes: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinel {
    /// Starts the primary, its 2 replicas and 3 Sentinels, and waits
    /// (up to 30 s) until every replication link is up and every Sentinel
    /// knows the primary, both replicas and the 2 other Sentinels.
    ///
    /// # Panics
    /// If a server does not start, or the set-up is not ready in time.
    pub fn start() -> RedisSentinel {
        let primary = RedisServer::start();
        let port = primary.port().to_string();
        let mut nodes = vec![primary];
        for _ in 0..2 {
            nodes.push(RedisServer::start_with(&[
                "--replicaof",
                "127.0.0.1",
                &port,
            ]));
        }
        let conf = format!(
            "sentinel resolve-hostnames no\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n"
        );
        let sentinels = (0..3).map(|_| RedisServer::start_sentinel(&conf)).collect();
        let set = RedisSentinel { nodes, sentinels };
        set.wait_until_ready();
        set
    }

    /// Waits (up to 30 s) until every running replica's link to the
    /// primary is up and every running Sentinel names the same running
    /// primary and knows the other running data nodes as its replicas and
    /// the other running Sentinels; for instance after a failover, or a
    /// [`RedisServer::restart`] of a node.
    ///
    /// # Panics
    /// If that does not happen in time, with the logs.
    pub fn wait_until_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let problems = self.readiness_problems();
            if problems.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "the Sentinel set-up was not ready within {READY_TIMEOUT:?}:\n{problems:#?}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn readiness_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let running_nodes = self.nodes.iter().filter(|n| n.is_running()).count();
        let running_sentinels = self.sentinels.iter().filter(|s| s.is_running()).count();
        let mut named = Vec::new();
        for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
            let fields = match ask(sentinel, &["SENTINEL", "MASTER", MASTER_NAME]) {
                Ok(Reply::Array(Some(fields))) => fields,
                other => {
                    problems.push(format!("sentinel {}: {other:?}", sentinel.port()));
                    continue;
                }
            };
            let field = |name: &str| {
                fields
                    .chunks(2)
                    .find(|kv| kv[0].as_bytes() == Some(name.as_bytes()))
                    .and_then(|kv| kv.get(1))
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            };
            let (flags, replicas, others) = (
                field("flags"),
                field("num-slaves"),
                field("num-other-sentinels"),
            );
            let want_replicas = (running_nodes.saturating_sub(1)).to_string();
            let want_others = (running_sentinels - 1).to_string();
            if flags != "master" || replicas != want_replicas || others != want_others {
                problems.push(format!(
                    "sentinel {}: flags {flags}, {replicas} replicas (want {want_replicas}), \
                     {others} other sentinels (want {want_others})",
                    sentinel.port()
                ));
            }
            named.push(field("port"));
        }
        named.dedup();
        if named.len() > 1 {
            problems.push(format!("the sentinels name different primaries: {named:?}"));
        }
        let primary = named.first().and_then(|p| p.parse::<u16>().ok());
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            if Some(node.port()) == primary {
                if !is_master(node) {
                    problems.push(format!("primary {}: not ROLE master", node.port()));
                }
                continue;
            }
            let info = ask(node, &["INFO", "replication"]).map(|r| r.to_string());
            let wanted = primary.map(|p| format!("master_port:{p}\r\n"));
            let up = info.as_ref().is_ok_and(|i| {
                i.contains("master_link_status:up")
                    && wanted.as_ref().is_some_and(|w| i.contains(w.as_str()))
            });
            if !up {
                problems.push(format!("replica {}: {info:?}", node.port()));
            }
        }
        problems
    }

    /// `redis://127.0.0.1:<port>` of every Sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| s.url()).collect()
    }

    /// The name the Sentinels know the primary by (for
    /// `SENTINEL get-master-addr-by-name`).
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// The data nodes: the first started as the primary, the others as its
    /// replicas (roles change with failovers: see [`primary`](Self::primary)).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The Sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The node with this port, if it is one of ours.
    pub fn node_with_port(&self, port: u16) -> Option<&RedisServer> {
        self.nodes.iter().find(|n| n.port() == port)
    }

    /// The port of the primary as most of the Sentinels that answer name it
    /// (`SENTINEL get-master-addr-by-name`), if any answers.
    pub fn primary_port(&self) -> Option<u16> {
        let named: Vec<u16> = self
            .sentinels
            .iter()
            .filter(|s| s.is_running())
            .filter_map(named_port)
            .collect();
        let mut best: Option<(u16, usize)> = None;
        for &port in &named {
            let votes = named.iter().filter(|p| **p == port).count();
            if best.is_none_or(|(_, v)| votes > v) {
                best = Some((port, votes));
            }
        }
        best.map(|(p, _)| p)
    }

    /// The node the Sentinels currently name as the primary.
    ///
    /// # Panics
    /// If no Sentinel answers, or they name a node that is not ours.
    pub fn primary(&self) -> &RedisServer {
        let port = self
            .primary_port()
            .unwrap_or_else(|| panic!("no Sentinel names a primary\n{}", self.logs()));
        self.node_with_port(port)
            .unwrap_or_else(|| panic!("the Sentinels name port {port}, not one of ours"))
    }

    /// The data nodes other than the [`primary`](Self::primary) (a killed
    /// one included).
    pub fn replicas(&self) -> Vec<&RedisServer> {
        let primary = self.primary().port();
        self.nodes.iter().filter(|n| n.port() != primary).collect()
    }

    /// Asks a Sentinel for a failover (`SENTINEL FAILOVER`): it promotes a
    /// replica without waiting for the others' agreement, and the old
    /// primary becomes a replica of the new one. Use
    /// [`wait_for_new_primary`](Self::wait_for_new_primary) to see it done.
    ///
    /// # Panics
    /// If no Sentinel answers `OK`.
    pub fn failover(&self) {
        let mut answers = Vec::new();
        for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
            match ask(sentinel, &["SENTINEL", "FAILOVER", MASTER_NAME]) {
                Ok(Reply::Status(ok)) if ok == "OK" => return,
                other => answers.push(format!("{}: {other:?}", sentinel.port())),
            }
        }
        panic!(
            "no Sentinel started a failover: {answers:?}\n{}",
            self.logs()
        );
    }

    /// Kills the primary (SIGKILL): the Sentinels see it down after 2 s
    /// and promote a replica.
    pub fn kill_primary(&self) {
        self.primary().kill();
    }

    /// Freezes the primary (SIGSTOP), a host that hangs with its
    /// connections open; returns it, to [`RedisServer::resume`] later.
    pub fn pause_primary(&self) -> &RedisServer {
        let primary = self.primary();
        primary.pause();
        primary
    }

    /// Resumes every paused data node (SIGCONT; a running one ignores it).
    pub fn resume(&self) {
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            node.resume();
        }
    }

    /// Polls the Sentinels (every 10 ms, up to `timeout`) until a majority
    /// of all of them name a primary other than `old_port` and that node
    /// answers `ROLE` with `master`; returns its port and how long it took
    /// from the call.
    ///
    /// # Panics
    /// If that does not happen in time, with the logs.
    pub fn wait_for_new_primary(&self, old_port: u16, timeout: Duration) -> (u16, Duration) {
        let started = Instant::now();
        let majority = self.sentinels.len() / 2 + 1;
        loop {
            let named: Vec<u16> = self
                .sentinels
                .iter()
                .filter(|s| s.is_running())
                .filter_map(named_port)
                .filter(|p| *p != old_port)
                .collect();
            for &port in &named {
                if named.iter().filter(|p| **p == port).count() >= majority
                    && self.node_with_port(port).is_some_and(is_master)
                {
                    return (port, started.elapsed());
                }
            }
            if started.elapsed() >= timeout {
                panic!(
                    "no new primary (other than port {old_port}) within {timeout:?}; named: \
                     {named:?}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every server's log, for a failure's message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for (what, server) in self
            .nodes
            .iter()
            .map(|n| ("node", n))
            .chain(self.sentinels.iter().map(|s| ("sentinel", s)))
        {
            let log = server.log();
            // The tail: the start-up banner says nothing useful.
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            out.push_str(&format!("--- {what} {} ---\n", server.port()));
            for line in tail.iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// One question to one server, with a short timeout.
fn ask(server: &RedisServer, args: &[&str]) -> std::io::Result<Reply> {
    let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    raw_command(server.addr(), &bytes, ASK_TIMEOUT)
}

/// The primary's port as `sentinel` names it.
fn named_port(sentinel: &RedisServer) -> Option<u16> {
    match ask(
        sentinel,
        &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
    ) {
        Ok(Reply::Array(Some(addr))) => addr.get(1)?.as_int()?.try_into().ok(),
        _ => None,
    }
}

/// Whether `node` answers `ROLE` with `master`.
fn is_master(node: &RedisServer) -> bool {
    node.is_running()
        && matches!(
            ask(node, &["ROLE"]),
            Ok(Reply::Array(Some(role))) if role.first().and_then(Reply::as_bytes) == Some(b"master")
        )
}
