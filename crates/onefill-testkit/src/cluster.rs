//! A Redis Cluster of private servers, with or without replicas.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::resp::{raw_command, Reply};
use crate::server::{RedisServer, COMMAND_TIMEOUT};

/// How long a cluster may take to reach `cluster_state:ok` on every node
/// (and, with replicas, every replication link up).
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a topology question waits for one node before asking the next
/// (a paused node must not stall the kit for [`COMMAND_TIMEOUT`]).
const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// A Redis Cluster of private servers.
///
/// Every node is a [`RedisServer`] started with `--cluster-enabled yes`;
/// the slots are spread (and replicas assigned) by `redis-cli --cluster
/// create`. All nodes are killed when the cluster is dropped.
///
/// Without replicas ([`start`](Self::start)) nodes use
/// `--cluster-node-timeout 5000`. With replicas
/// ([`start_with_replicas`](Self::start_with_replicas)) they use
/// `--cluster-node-timeout 1000`, so a failed master is replaced within a
/// few seconds, and `--cluster-require-full-coverage no`: with Redis's
/// default (`yes`) the **whole** cluster answers `CLUSTERDOWN` while one
/// master is failed and not yet replaced, so no client could keep the
/// healthy masters' keys serving.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    replicas_per_master: usize,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 3, as `redis-cli --cluster create`
    /// requires), joins them and waits until every node reports
    /// `cluster_state:ok`. The same as `start_with_replicas(masters, 0)`.
    ///
    /// # Panics
    /// If `masters < 3`, or the cluster does not form within 30 s.
    pub fn start(masters: usize) -> RedisCluster {
        Self::start_with_replicas(masters, 0)
    }

    /// Starts `masters × (1 + replicas_per_master)` nodes, joins them with
    /// `redis-cli --cluster create --cluster-replicas N` and waits until
    /// every node reports `cluster_state:ok` and every replica reports its
    /// replication link up (`master_link_status:up`), so a failover test
    /// never starts before replication is established.
    ///
    /// [`nodes`](Self::nodes) are in creation order: `redis-cli` makes the
    /// first `masters` nodes the masters, but use
    /// [`node_for_key`](Self::node_for_key) and
    /// [`replicas_of`](Self::replicas_of) rather than relying on it.
    ///
    /// # Panics
    /// If `masters < 3`, or the cluster does not form within 30 s.
    pub fn start_with_replicas(masters: usize, replicas_per_master: usize) -> RedisCluster {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let replicated = replicas_per_master > 0;
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            if replicated { "1000" } else { "5000" },
        ];
        if replicated {
            args.extend(["--cluster-require-full-coverage", "no"]);
        }
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas_per_master))
            .map(|_| RedisServer::start_with(&args))
            .collect();
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for node in &nodes {
            cmd.arg(format!("127.0.0.1:{}", node.port()));
        }
        cmd.arg("--cluster-replicas")
            .arg(replicas_per_master.to_string())
            .arg("--cluster-yes");
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli (is it on PATH?): {e}"));
        if !out.status.success() {
            panic!(
                "redis-cli --cluster create failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let cluster = RedisCluster {
            nodes,
            replicas_per_master,
        };
        cluster.wait_until_ok();
        cluster
    }

    /// Waits (up to 30 s) until every running node reports
    /// `cluster_state:ok` and knows every node, and every running replica
    /// reports `master_link_status:up`; for instance after a
    /// [`RedisServer::restart`] of one node. A cluster started with
    /// replicas must also have at least `masters × replicas_per_master`
    /// running replicas (so the wait does not end before `redis-cli` has
    /// made them replicas).
    ///
    /// # Panics
    /// If that does not happen in time.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        let masters = self.nodes.len() / (1 + self.replicas_per_master);
        let wanted_replicas = masters * self.replicas_per_master;
        loop {
            let mut problems = Vec::new();
            let mut replicas_up = 0;
            for node in self.nodes.iter().filter(|n| n.is_running()) {
                let info = ask_one(node, &["CLUSTER", "INFO"]);
                if !(info.contains("cluster_state:ok") && info.contains(&known)) {
                    problems.push(format!("{}: {info}", node.port()));
                    continue;
                }
                let replication = ask_one(node, &["INFO", "replication"]);
                if replication.contains("role:slave") {
                    if replication.contains("master_link_status:up") {
                        replicas_up += 1;
                    } else {
                        problems.push(format!("{}: {replication}", node.port()));
                    }
                }
            }
            if replicas_up < wanted_replicas {
                problems.push(format!(
                    "{replicas_up} replicas up of {wanted_replicas} expected"
                ));
            }
            if problems.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                panic!("the cluster was not ok within {CLUSTER_TIMEOUT:?}:\n{problems:#?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis://127.0.0.1:<port>` of every node (masters and replicas).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// [`RedisServer::acl_user`] on every node: the user's URL of every
    /// node (the ACL is each node's own, as on a real cluster).
    pub fn acl_user(&self, line: &str) -> Vec<String> {
        self.nodes.iter().map(|n| n.acl_user(line)).collect()
    }

    /// The nodes (masters and replicas).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node with this port, if it is one of ours.
    pub fn node_with_port(&self, port: u16) -> Option<&RedisServer> {
        self.nodes.iter().find(|n| n.port() == port)
    }

    /// `key`'s hash slot (`CLUSTER KEYSLOT` on a node that answers).
    ///
    /// # Panics
    /// If no node answers.
    pub fn slot_of(&self, key: &str) -> u16 {
        match self.ask(&["CLUSTER", "KEYSLOT", key], None) {
            Reply::Int(slot) => u16::try_from(slot).expect("a slot fits in u16"),
            other => panic!("CLUSTER KEYSLOT answered {other:?}"),
        }
    }

    /// The master serving `slot`, as the first node that answers `CLUSTER
    /// SLOTS` sees it (nodes other than `avoid`, if given), or `None` if
    /// that node knows no owner or the owner is not one of ours.
    ///
    /// # Panics
    /// If no node answers.
    pub fn master_of_slot(&self, slot: u16, avoid: Option<&RedisServer>) -> Option<&RedisServer> {
        let Reply::Array(Some(ranges)) = self.ask(&["CLUSTER", "SLOTS"], avoid) else {
            panic!("CLUSTER SLOTS did not answer an array");
        };
        let slot = i64::from(slot);
        for range in ranges {
            let Reply::Array(Some(fields)) = range else {
                continue;
            };
            let (Some(Reply::Int(start)), Some(Reply::Int(end)), Some(Reply::Array(Some(master)))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                continue;
            };
            if (*start..=*end).contains(&slot) {
                let Some(Reply::Int(port)) = master.get(1) else {
                    return None;
                };
                return u16::try_from(*port)
                    .ok()
                    .and_then(|p| self.node_with_port(p));
            }
        }
        None
    }

    /// The master node that owns `key`'s slot (found with `CLUSTER KEYSLOT`
    /// and `CLUSTER SLOTS`), for raw commands on a key.
    ///
    /// # Panics
    /// If no node answers or no node owns the slot.
    pub fn node_for_key(&self, key: &str) -> &RedisServer {
        let slot = self.slot_of(key);
        self.master_of_slot(slot, None)
            .unwrap_or_else(|| panic!("no node owns slot {slot} of {key:?}"))
    }

    /// The replicas of `master`, as `CLUSTER NODES` on a node that answers
    /// (other than `master` itself) lists them; failed ones included.
    ///
    /// # Panics
    /// If no node answers.
    pub fn replicas_of(&self, master: &RedisServer) -> Vec<&RedisServer> {
        let nodes = self.ask(&["CLUSTER", "NODES"], Some(master)).to_string();
        let lines: Vec<Vec<&str>> = nodes
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let address = format!("127.0.0.1:{}@", master.port());
        let Some(id) = lines
            .iter()
            .find(|f| f.get(1).is_some_and(|a| a.starts_with(&address)))
            .and_then(|f| f.first())
        else {
            return Vec::new();
        };
        lines
            .iter()
            .filter(|f| f.get(3) == Some(id))
            .filter_map(|f| {
                let port = f.get(1)?.split('@').next()?.rsplit(':').next()?;
                self.node_with_port(port.parse().ok()?)
            })
            .collect()
    }

    /// Polls (every 20 ms, up to `timeout`) the nodes other than `from`
    /// until `slot` is served by a node other than `from`, e.g. until a
    /// replica is promoted after `from` failed; returns the new master, or
    /// `None` if the slot did not move in time.
    pub fn wait_until_slot_moves(
        &self,
        slot: u16,
        from: &RedisServer,
        timeout: Duration,
    ) -> Option<&RedisServer> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(owner) = self.master_of_slot(slot, Some(from)) {
                if owner.port() != from.port() {
                    return Some(owner);
                }
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts migrating `slot` from `source` to `target`, as
    /// `redis-cli --cluster reshard` does: `IMPORTING` on the target, then
    /// `MIGRATING` on the source. From then on the source answers `ASK` for
    /// the keys of the slot it does not have.
    pub fn begin_migration(&self, slot: u16, source: &RedisServer, target: &RedisServer) {
        let slot = slot.to_string();
        let (source_id, target_id) = (source.cluster_id(), target.cluster_id());
        target.command(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id]);
        source.command(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id]);
    }

    /// Moves `keys` (of a migrating slot) from `source` to `target`
    /// (`MIGRATE … KEYS`).
    ///
    /// # Panics
    /// If `MIGRATE` does not answer `OK`.
    pub fn migrate_keys(&self, source: &RedisServer, target: &RedisServer, keys: &[&str]) {
        let port = target.port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend_from_slice(keys);
        let moved = source.command(&args);
        assert!(moved.contains("OK"), "MIGRATE: {moved}");
    }

    /// Ends a migration: every node of the cluster, and `joined` (nodes
    /// that joined it since it started), says `slot` is `target`'s.
    pub fn end_migration(&self, slot: u16, target: &RedisServer, joined: &[&RedisServer]) {
        let (slot, target_id) = (slot.to_string(), target.cluster_id());
        for node in self.nodes.iter().chain(joined.iter().copied()) {
            node.command(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
        }
    }

    /// Asks the running nodes (other than `avoid`) in turn, each with a
    /// short timeout, and returns the first reply.
    ///
    /// # Panics
    /// If none answers.
    fn ask(&self, args: &[&str], avoid: Option<&RedisServer>) -> Reply {
        let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let mut errors = Vec::new();
        for node in self
            .nodes
            .iter()
            .filter(|n| n.is_running() && avoid.is_none_or(|a| a.port() != n.port()))
        {
            match raw_command(node.addr(), &bytes, ASK_TIMEOUT) {
                Ok(reply) => return reply,
                Err(e) => errors.push(format!("{}: {e}", node.port())),
            }
        }
        panic!("no node of the cluster answered {args:?}: {errors:?}");
    }
}

/// One node's reply as text, or the error's text.
fn ask_one(node: &RedisServer, args: &[&str]) -> String {
    let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    match raw_command(node.addr(), &bytes, COMMAND_TIMEOUT) {
        Ok(reply) => reply.to_string(),
        Err(e) => e.to_string(),
    }
}
