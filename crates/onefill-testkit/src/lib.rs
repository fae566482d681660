//! Test support for onefill: private `redis-server` processes, clusters
//! and Sentinel set-ups.
//!
//! Modelled on redis-rs's own test harness: every server gets a free port
//! on 127.0.0.1, persistence off (`--save ''`, `--appendonly no`), a private
//! temporary directory holding its log, a readiness loop (`PING` until
//! `+PONG`), and is killed when dropped. Nothing here ever touches a shared
//! Redis.
//!
//! ```no_run
//! use onefill_testkit::RedisServer;
//!
//! let server = RedisServer::start();
//! assert_eq!(server.command(&["SET", "k", "v"]), "OK");
//! assert_eq!(server.command(&["GET", "k"]), "v");
//! server.pause(); // SIGSTOP: the server hangs, connections stay open
//! server.resume(); // SIGCONT
//! server.restart(); // SIGKILL, then a new process on the same port
//! assert_eq!(server.command(&["GET", "k"]), "(nil)"); // no persistence
//! ```
//!
//! This is test support: failures (a server that never comes up, an I/O
//! error talking to it) panic with a message that includes the server log.
//!
//! Every test that starts servers or processes bounds itself with
//! [`time_limit`], so a hang fails fast and names the test; a child process
//! run with [`output_within`] is killed if it does not end in time.

#![warn(missing_docs)]

mod cluster;
mod endpoint;
mod limit;
mod process;
mod resp;
mod sentinel;
mod server;

pub use cluster::RedisCluster;
pub use endpoint::Endpoint;
pub use limit::{time_limit, TimeLimit};
pub use process::output_within;
pub use resp::Reply;
pub use sentinel::RedisSentinel;
pub use server::RedisServer;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::net::TcpStream;

    use super::resp::raw_command;
    use super::*;

    /// Generous for a server or two on a loaded machine (each starts in
    /// milliseconds); a cluster gets more.
    const LIMIT: Duration = Duration::from_secs(60);
    const CLUSTER_LIMIT: Duration = Duration::from_secs(120);

    #[test]
    fn a_server_that_exits_at_start_fails_fast_with_its_log() {
        let _limit = time_limit(LIMIT);
        // A bad directive makes redis-server exit before it answers PING,
        // as a port taken by someone else does. The start runs on its own
        // thread, so a start that hangs fails this test instead of hanging
        // it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let started = std::panic::catch_unwind(|| {
                RedisServer::start_with(&["--no-such-directive", "yes"])
            });
            let _ = tx.send(started.map(|_| ()).map_err(|panic| {
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            }));
        });
        let started = rx
            .recv_timeout(Duration::from_secs(15))
            .expect("a server that exits at start must fail within seconds, not hang");
        let message = started.expect_err("a bad directive must not start a server");
        assert!(
            message.contains("exited with") && message.contains("before answering PING"),
            "{message}"
        );
        // The server's own complaint, from its log, is in the message.
        assert!(message.contains("no-such-directive"), "{message}");
        assert!(message.contains("Bad directive"), "{message}");
    }

    #[test]
    fn ping_set_get_and_restart_on_the_same_port() {
        let _limit = time_limit(LIMIT);
        let server = RedisServer::start();
        assert_eq!(server.command(&["PING"]), "PONG");
        assert_eq!(server.command(&["SET", "k", "v", "PX", "60000"]), "OK");
        assert_eq!(server.command(&["GET", "k"]), "v");
        assert_eq!(server.command(&["GET", "missing"]), "(nil)");
        assert_eq!(server.query(&["INCR", "n"]), Reply::Int(1));
        assert!(server.query(&["PTTL", "k"]).as_int().unwrap() > 59_000);
        assert!(server.command(&["NOSUCHCOMMAND"]).starts_with("-ERR"));
        assert!(server
            .command(&["INFO", "server"])
            .contains("redis_version:"));

        let port = server.port();
        let pid = server.pid().unwrap();
        server.kill();
        assert!(!server.is_running());
        assert!(TcpStream::connect(server.addr()).is_err());
        server.restart();
        assert_eq!(server.port(), port);
        assert_ne!(server.pid().unwrap(), pid);
        assert_eq!(server.command(&["GET", "k"]), "(nil)", "no persistence");
        assert_eq!(server.url(), format!("redis://127.0.0.1:{port}"));
    }

    #[test]
    fn pause_makes_the_server_unresponsive_until_resumed() {
        let _limit = time_limit(LIMIT);
        let server = RedisServer::start();
        server.pause();
        let err = raw_command(server.addr(), &[b"PING"], Duration::from_millis(200));
        assert!(err.is_err(), "a paused server must not answer: {err:?}");
        server.resume();
        assert_eq!(server.command(&["PING"]), "PONG");
    }

    #[test]
    fn extra_arguments_are_passed() {
        let _limit = time_limit(LIMIT);
        let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
        assert!(server.command(&["GET", "k"]).starts_with("-NOAUTH"));
        assert_eq!(server.command(&["AUTH", "s3cret"]), "OK");
        assert!(server.log().contains("Ready to accept connections"));
    }

    #[test]
    fn drop_kills_the_server() {
        let _limit = time_limit(LIMIT);
        let server = RedisServer::start();
        let addr = server.addr();
        drop(server);
        assert!(TcpStream::connect(addr).is_err());
    }

    #[test]
    fn a_three_master_cluster_forms() {
        let _limit = time_limit(CLUSTER_LIMIT);
        let cluster = RedisCluster::start(3);
        assert_eq!(cluster.nodes().len(), 3);
        assert_eq!(cluster.urls().len(), 3);
        for node in cluster.nodes() {
            let info = node.command(&["CLUSTER", "INFO"]);
            assert!(info.contains("cluster_state:ok"), "{info}");
            assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
        }
        let owner = cluster.node_for_key("ns:{k}");
        assert_eq!(owner.command(&["SET", "ns:{k}", "1"]), "OK");
        assert_eq!(owner.command(&["GET", "ns:{k}:lock"]), "(nil)");
        let other = cluster
            .nodes()
            .iter()
            .find(|n| n.port() != owner.port())
            .unwrap();
        assert!(other.command(&["GET", "ns:{k}"]).starts_with("-MOVED"));

        // A node restarted on its port keeps its nodes.conf and rejoins.
        owner.restart();
        cluster.wait_until_ok();
        assert_eq!(owner.command(&["GET", "ns:{k}"]), "(nil)");
    }

    #[test]
    fn a_replicated_cluster_forms_and_a_replica_takes_over() {
        let _limit = time_limit(CLUSTER_LIMIT);
        let cluster = RedisCluster::start_with_replicas(3, 1);
        assert_eq!(cluster.nodes().len(), 6);
        let master = cluster.node_for_key("ns:{k}");
        let replicas = cluster.replicas_of(master);
        assert_eq!(replicas.len(), 1, "one replica per master");
        let replica = replicas[0];
        assert_ne!(replica.port(), master.port());
        let info = replica.command(&["INFO", "replication"]);
        assert!(info.contains("master_link_status:up"), "{info}");
        assert!(
            info.contains(&format!("master_port:{}", master.port())),
            "{info}"
        );
        assert_eq!(
            master.commands(&[&["SET", "ns:{k}", "1"], &["WAIT", "1", "2000"]]),
            ["OK", "1"]
        );

        // A graceful failover: the replica becomes the slot's master.
        let slot = cluster.slot_of("ns:{k}");
        assert_eq!(replica.command(&["CLUSTER", "FAILOVER"]), "OK");
        let new_master = cluster
            .wait_until_slot_moves(slot, master, Duration::from_secs(10))
            .expect("the replica was promoted");
        assert_eq!(new_master.port(), replica.port());
        assert_eq!(cluster.node_for_key("ns:{k}").port(), replica.port());
        assert_eq!(replica.command(&["GET", "ns:{k}"]), "1");
        cluster.wait_until_ok();
        // The old master follows the new one (every node learns it by
        // gossip, within a few node timeouts).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let swapped: Vec<u16> = cluster
                .replicas_of(replica)
                .iter()
                .map(|n| n.port())
                .collect();
            if swapped == [master.port()] {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the old master does not follow: {swapped:?}\n{}",
                cluster.nodes()[0].command(&["CLUSTER", "NODES"])
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A Sentinel set-up forms (3 data nodes, 3 Sentinels knowing them
    /// all), and replicates what the primary is told.
    #[test]
    fn a_sentinel_set_up_forms_and_replicates() {
        let _limit = time_limit(CLUSTER_LIMIT);
        let set = RedisSentinel::start();
        assert_eq!(set.nodes().len(), 3);
        assert_eq!(set.sentinels().len(), 3);
        assert_eq!(set.sentinel_urls().len(), 3);
        let primary = set.primary();
        assert_eq!(
            primary.port(),
            set.nodes()[0].port(),
            "the first node starts as the primary"
        );
        assert_eq!(set.replicas().len(), 2);
        for sentinel in set.sentinels() {
            let addr =
                sentinel.command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", set.master_name()]);
            assert_eq!(addr, format!("127.0.0.1\n{}", primary.port()));
            let replicas = sentinel.query(&["SENTINEL", "REPLICAS", set.master_name()]);
            assert!(
                matches!(&replicas, Reply::Array(Some(r)) if r.len() == 2),
                "{replicas:?}"
            );
        }
        assert_eq!(
            primary.commands(&[&["SET", "k", "v"], &["WAIT", "2", "2000"]]),
            ["OK", "2"]
        );
        for replica in set.replicas() {
            assert_eq!(replica.command(&["GET", "k"]), "v");
            assert!(replica.command(&["SET", "k", "w"]).starts_with("-READONLY"));
        }
    }

    /// `SENTINEL FAILOVER` promotes a replica, which keeps the data; the
    /// old primary follows it; the set-up is ready again afterwards.
    #[test]
    fn a_sentinel_failover_promotes_a_replica() {
        let _limit = time_limit(CLUSTER_LIMIT);
        let set = RedisSentinel::start();
        let old = set.primary();
        assert_eq!(
            old.commands(&[&["SET", "k", "v"], &["WAIT", "2", "2000"]]),
            ["OK", "2"]
        );
        set.failover();
        let (new, took) = set.wait_for_new_primary(old.port(), Duration::from_secs(30));
        assert_ne!(new, old.port());
        assert!(set.replicas().iter().any(|r| r.port() == old.port()));
        assert_eq!(set.primary().port(), new);
        assert_eq!(set.primary().command(&["GET", "k"]), "v");
        eprintln!("SENTINEL FAILOVER: new primary named after {took:?}");
        set.wait_until_ready();
        let info = old.command(&["INFO", "replication"]);
        assert!(info.contains(&format!("master_port:{new}")), "{info}");
    }

    /// A killed primary is replaced once the Sentinels see it down.
    #[test]
    fn a_killed_primary_is_replaced() {
        let _limit = time_limit(CLUSTER_LIMIT);
        let set = RedisSentinel::start();
        let old = set.primary().port();
        set.kill_primary();
        let (new, took) = set.wait_for_new_primary(old, Duration::from_secs(30));
        assert_ne!(new, old);
        assert!(set.node_with_port(new).unwrap().is_running());
        eprintln!("SIGKILL: new primary named after {took:?}");
    }
}
