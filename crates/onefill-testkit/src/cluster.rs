//! A Redis Cluster of private servers.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::resp::{raw_command, Reply};
use crate::server::{RedisServer, COMMAND_TIMEOUT};

/// How long a cluster may take to reach `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(20);

/// A Redis Cluster of private servers (masters only, no replicas).
///
/// Every node is a [`RedisServer`] started with `--cluster-enabled yes`;
/// the slots are spread by `redis-cli --cluster create`. All nodes are
/// killed when the cluster is dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 3, as `redis-cli --cluster create`
    /// requires), joins them and waits until every node reports
    /// `cluster_state:ok`.
    ///
    /// # Panics
    /// If `masters < 3`, or the cluster does not form within 20 s.
    pub fn start(masters: usize) -> RedisCluster {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for node in &nodes {
            cmd.arg(format!("127.0.0.1:{}", node.port()));
        }
        cmd.args(["--cluster-replicas", "0", "--cluster-yes"]);
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
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok();
        cluster
    }

    /// Waits (up to 20 s) until every running node reports
    /// `cluster_state:ok` and knows every node; for instance after a
    /// [`RedisServer::restart`] of one node.
    ///
    /// # Panics
    /// If that does not happen in time.
    pub fn wait_until_ok(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        loop {
            let infos: Vec<String> = self
                .nodes
                .iter()
                .map(
                    |n| match raw_command(n.addr(), &[b"CLUSTER", b"INFO"], COMMAND_TIMEOUT) {
                        Ok(reply) => reply.to_string(),
                        Err(e) => e.to_string(),
                    },
                )
                .collect();
            if infos
                .iter()
                .all(|i| i.contains("cluster_state:ok") && i.contains(&known))
            {
                return;
            }
            if Instant::now() >= deadline {
                panic!("the cluster did not reach cluster_state:ok within {CLUSTER_TIMEOUT:?}:\n{infos:#?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node that owns `key`'s slot (found with `CLUSTER KEYSLOT` and
    /// `CLUSTER SLOTS`), for raw commands on a key.
    ///
    /// # Panics
    /// If no node owns the slot.
    pub fn node_for_key(&self, key: &str) -> &RedisServer {
        let first = self
            .nodes
            .iter()
            .find(|n| n.is_running())
            .expect("no node of the cluster is running");
        let slot = match first.query(&["CLUSTER", "KEYSLOT", key]) {
            Reply::Int(slot) => slot,
            other => panic!("CLUSTER KEYSLOT answered {other:?}"),
        };
        let Reply::Array(Some(ranges)) = first.query(&["CLUSTER", "SLOTS"]) else {
            panic!("CLUSTER SLOTS did not answer an array");
        };
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
                    continue;
                };
                if let Some(node) = self.nodes.iter().find(|n| i64::from(n.port()) == *port) {
                    return node;
                }
            }
        }
        panic!("no node owns slot {slot} of {key:?}");
    }
}
