//! The README's least-privilege ACL line (`mod acl;`), as the tests that
//! run as that user apply it: read from the README itself, so the line
//! users copy is the line the tests prove, and a command the tests find
//! missing is missing from the README too.
#![allow(dead_code)]

use onefill_testkit::{RedisCluster, RedisServer};

const README: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"));

/// The README's example namespaces, as its line grants them.
const KEYS: &str = "~users:* ~orders:*";
const CHANNELS: &str = "&users:* &orders:*";

/// What the user is for.
#[derive(Debug, Clone, Copy)]
pub struct Deployment {
    /// Caches with an L1 (`CLIENT TRACKING`); without, every cache is
    /// built with `no_l1()`.
    pub l1: bool,
    /// A Redis Cluster.
    pub cluster: bool,
}

/// The README's `ACL SETUSER` line, word for word, with what
/// `deployment` adds or may drop.
pub fn readme(deployment: Deployment) -> String {
    let mut line = README
        .lines()
        .find(|l| l.starts_with("ACL SETUSER app "))
        .expect("the README's ACL line")
        .to_owned();
    if !deployment.l1 {
        let l1 = addition("- caches that are all built with `no_l1()` may drop `");
        line = line.replace(&format!(" {l1}"), "");
    }
    if deployment.cluster {
        line.push(' ');
        line.push_str(addition("- a cluster adds `"));
    }
    line
}

/// [`readme`], its example namespaces replaced by `namespace` (a glob:
/// the tests' namespaces are made unique per run).
pub fn line(namespace: &str, deployment: Deployment) -> String {
    let line = readme(deployment);
    assert!(
        line.contains(KEYS) && line.contains(CHANNELS),
        "the README's ACL line grants {KEYS} and {CHANNELS}: {line}"
    );
    line.replace(KEYS, &format!("~{namespace}:*"))
        .replace(CHANNELS, &format!("&{namespace}:*"))
}

/// The commands of the README's list item starting with `item`, up to the
/// closing backtick.
fn addition(item: &str) -> &'static str {
    let rest = README
        .lines()
        .find_map(|l| l.strip_prefix(item))
        .unwrap_or_else(|| panic!("the README's {item:?}"));
    rest.split('`').next().unwrap_or_default()
}

/// The URL of the README's user on `server`, for `namespace`.
pub fn url(server: &RedisServer, namespace: &str, l1: bool) -> String {
    server.acl_user(&line(namespace, Deployment { l1, cluster: false }))
}

/// The URL of the README's user on `node`, a node of a cluster (one that
/// joins it later needs the user too: each node keeps its own ACL).
pub fn node_url(node: &RedisServer, namespace: &str, l1: bool) -> String {
    node.acl_user(&line(namespace, Deployment { l1, cluster: true }))
}

/// The URLs of the README's user on every node of `cluster`.
pub fn urls(cluster: &RedisCluster, namespace: &str, l1: bool) -> Vec<String> {
    cluster.acl_user(&line(namespace, Deployment { l1, cluster: true }))
}
