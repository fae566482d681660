//! Writes confirmed by replicas (`RedisOptions::durability`, decision
//! 0020), on a real primary and replica: a durable write is on the replica
//! when it returns; with the replica frozen it reports the shortfall
//! within about its `WAIT` timeout, a fill's value is answered all the
//! same, and nothing is replayed or counted against the breaker; without
//! the option no `WAIT` is sent and the commands are the same.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use onefill::backend::FillKeys;
use onefill::redis::{Durability, RedisBackend, RedisOptions};
use onefill::{BackendErrorKind, Cache, CircuitState, Error};
use onefill_testkit::{time_limit, RedisCluster, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);
/// The `WAIT` timeout of these tests: well under the cache's backend
/// timeout (250 ms).
const WAIT_TIMEOUT: Duration = Duration::from_millis(60);

fn unique_ns(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "durable-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn durable() -> RedisOptions {
    RedisOptions::new().durability(Durability::Replicas {
        count: 1,
        timeout: WAIT_TIMEOUT,
    })
}

/// A primary (without its periodic pings to replicas, which would move
/// its replication offset during a test; ticking every 10 ms, so that a
/// `WAIT` ends soon after its timeout rather than up to 100 ms later) and
/// a replica of it, linked.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start_with(&["--repl-ping-replica-period", "3600", "--hz", "100"]);
    let replica = RedisServer::start_replica_of(&primary);
    settle(&primary, Instant::now() + Duration::from_secs(20));
    (primary, replica)
}

/// Waits until the replica confirms a write at once: just after its first
/// sync it may take longer than a test's `WAIT` timeout.
fn settle(primary: &RedisServer, deadline: Instant) {
    let client = redis::Client::open(primary.url()).unwrap();
    let mut conn = client.get_connection().unwrap();
    loop {
        let (_, confirmed): ((), i64) = redis::pipe()
            .cmd("SET")
            .arg("settle")
            .arg("1")
            .cmd("WAIT")
            .arg(1)
            .arg(20)
            .query(&mut conn)
            .unwrap();
        if confirmed == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "the replica does not confirm");
    }
}

async fn cache(ns: &str, server: &RedisServer, options: RedisOptions) -> Cache<String, String> {
    let backend = RedisBackend::connect_with(&server.url(), options)
        .await
        .unwrap();
    // No L1: the commands counted are the calls' own, not its tracking
    // connection's confirmations.
    Cache::builder()
        .namespace(ns)
        .backend(backend)
        .no_l1()
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// `INFO commandstats` as command → calls.
fn command_calls(server: &RedisServer) -> BTreeMap<String, u64> {
    server
        .command(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// The primary's replication offset, and the offset its replica last
/// confirmed (`INFO replication`, one reply).
fn offsets(primary: &RedisServer) -> (u64, u64) {
    let info = primary.command(&["INFO", "replication"]);
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split(',')
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    let master = info
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("master_repl_offset");
    let confirmed = info
        .lines()
        .find(|l| l.starts_with("slave0:"))
        .and_then(|l| field(l, "offset="))
        .expect("a replica's offset");
    (master, confirmed)
}

/// Runs `write`, then checks that the replica confirmed more than the
/// primary had replicated before it (a replica confirms by itself only once
/// a second; a `WAIT` asks at once), and holds (or no longer holds) `key`.
async fn on_replica<F: std::future::Future<Output = ()>>(
    primary: &RedisServer,
    replica: &RedisServer,
    key: &str,
    present: bool,
    write: F,
) {
    let (before, _) = offsets(primary);
    write.await;
    let (_, confirmed) = offsets(primary);
    assert!(
        confirmed > before,
        "the replica confirmed offset {confirmed}, the primary was at {before} before the write"
    );
    assert_eq!(
        replica.command(&["EXISTS", key]),
        if present { "1" } else { "0" }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_writes_are_on_the_replica_when_they_return() {
    let _limit = time_limit(LIMIT);
    let (primary, replica) = primary_and_replica();
    let ns = unique_ns("on-replica");
    let cache = cache(&ns, &primary, durable()).await;
    let value_key = |k: &str| FillKeys::new(&ns, k).value().to_owned();
    let waits_before = command_calls(&primary).get("wait").copied().unwrap_or(0);

    let a = value_key("a");
    let set = async { cache.set("a", "1".into()).await.unwrap() };
    on_replica(&primary, &replica, &a, true, set).await;

    let fill = async {
        let load = |_| async { Ok::<_, std::io::Error>("2".to_owned()) };
        assert_eq!(cache.get_or_load("b", load).await.unwrap(), "2");
    };
    on_replica(&primary, &replica, &value_key("b"), true, fill).await;

    let invalidate = async { cache.invalidate("a").await.unwrap() };
    on_replica(&primary, &replica, &a, false, invalidate).await;

    let tag_mark = format!("{ns}:{{#}}:tag:t");
    let mark = async { cache.invalidate_tag("t").await.unwrap() };
    on_replica(&primary, &replica, &tag_mark, true, mark).await;

    // One WAIT per write of a value or a mark; none for the lease.
    let waits = command_calls(&primary).get("wait").copied().unwrap_or(0);
    assert_eq!(waits - waits_before, 4);
    let stats = cache.stats();
    assert_eq!(stats.writes_unreplicated, 0, "{stats:?}");
    assert_eq!(stats.backend_errors, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_makes_durable_writes_report_their_shortfall() {
    let _limit = time_limit(LIMIT);
    let (primary, replica) = primary_and_replica();
    let ns = unique_ns("frozen");
    let cache = cache(&ns, &primary, durable()).await;
    // Connected (scripts loaded) before the replica stops.
    cache.set("warm", "0".into()).await.unwrap();
    replica.pause();

    let began = Instant::now();
    let err = cache.set("a", "1".into()).await.unwrap_err();
    let took = began.elapsed();
    let Error::Backend(backend) = &err else {
        panic!("{err}")
    };
    assert_eq!(backend.kind(), BackendErrorKind::NotReplicated, "{err}");
    assert!(backend.is_not_replicated() && !backend.is_transient());
    // It waited for the replica, and no longer than its timeout (and
    // well within the cache's backend timeout, 250 ms).
    assert!(took >= WAIT_TIMEOUT, "answered after {took:?}");
    assert!(took < Duration::from_millis(250), "answered after {took:?}");
    // It ran on the primary.
    let value_key = FillKeys::new(&ns, "a").value().to_owned();
    assert_eq!(primary.command(&["EXISTS", &value_key]), "1");

    // The primary is short of replicas: for the next second its writes are
    // not held behind a `WAIT` each (they would queue on their connection,
    // each waiting out its timeout), and report so.
    let err = cache.invalidate("a").await.unwrap_err();
    assert!(
        matches!(&err, Error::Backend(e) if e.is_not_replicated()),
        "{err}"
    );
    assert!(err.to_string().contains("not waited for"), "{err}");
    assert_eq!(primary.command(&["EXISTS", &value_key]), "0");
    let err = cache.expire("warm").await.unwrap_err();
    assert!(
        matches!(&err, Error::Backend(e) if e.is_not_replicated()),
        "{err}"
    );
    let err = cache.invalidate_tag("t").await.unwrap_err();
    assert!(
        matches!(&err, Error::Backend(e) if e.is_not_replicated()),
        "{err}"
    );

    // A fill's value is answered; the shortfall is counted, not an error.
    let loaded = cache
        .get_or_load("b", |_| async { Ok::<_, std::io::Error>("2".to_owned()) })
        .await
        .unwrap();
    assert_eq!(loaded, "2");
    let b_key = FillKeys::new(&ns, "b").value().to_owned();
    assert_eq!(primary.command(&["EXISTS", &b_key]), "1");
    // And read back as stored (a hit, no second load).
    let hit = cache
        .get_or_load("b", |_| async {
            Ok::<_, std::io::Error>("again".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(hit, "2");

    let stats = cache.stats();
    assert_eq!(stats.writes_unreplicated, 5, "{stats:?}");
    assert_eq!(stats.backend_errors, 0, "{stats:?}");
    assert_eq!(stats.loads_ok, 1, "{stats:?}");
    // Not an outage: nothing queued for replay, the breaker closed.
    assert_eq!(cache.pending_writes(), 0);
    assert_eq!(cache.circuit_state(), CircuitState::Closed);
    assert_eq!(stats.writes_queued, 0, "{stats:?}");

    // Once the replica answers again, writes are confirmed again: a write
    // a second after the shortfall sends a `WAIT` of its own in the
    // background, which finds the replica back.
    replica.resume();
    let resumed = Instant::now();
    let mut unconfirmed = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match cache.set("c", "3".into()).await {
            Ok(()) => break,
            Err(Error::Backend(e)) if e.is_not_replicated() => unconfirmed += 1,
            Err(e) => panic!("{e}"),
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(5),
            "writes still unconfirmed {:?} after the replica's return",
            resumed.elapsed()
        );
    }
    assert_eq!(cache.stats().writes_unreplicated, 5 + unconfirmed);
}

/// The same calls on two primaries, each with a replica, with and without
/// the option: without it no `WAIT` is sent, and apart from the `WAIT`s
/// both primaries ran the same commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_no_wait_is_sent_and_the_commands_are_the_same() {
    let _limit = time_limit(LIMIT);
    let mut seen = Vec::new();
    for options in [RedisOptions::new(), durable()] {
        let (primary, _replica) = primary_and_replica();
        let ns = unique_ns("same");
        let before = command_calls(&primary);
        let cache = cache(&ns, &primary, options).await;
        cache.set("a", "1".into()).await.unwrap();
        let load = |_| async { Ok::<_, std::io::Error>("2".to_owned()) };
        cache.get_or_load("b", load).await.unwrap();
        cache.get_or_load("b", load).await.unwrap();
        cache.expire("b").await.unwrap();
        cache.invalidate("a").await.unwrap();
        cache.invalidate_tag("t").await.unwrap();
        cache.clear().await.unwrap();
        let mut calls = command_calls(&primary);
        for (name, n) in &mut calls {
            *n -= before.get(name).copied().unwrap_or(0);
        }
        calls.retain(|_, n| *n > 0);
        // The replica's own traffic, and what this test asks.
        for own in ["replconf", "psync", "sync", "info", "ping", "exists"] {
            calls.remove(own);
        }
        seen.push(calls);
    }
    let (mut plain, mut durable) = (seen.remove(0), seen.remove(0));
    assert_eq!(plain.remove("wait"), None, "{plain:?}");
    // set, fill, expire, invalidate, two marks.
    assert_eq!(durable.remove("wait"), Some(6), "{durable:?}");
    assert_eq!(plain, durable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_waits_for_its_replica() {
    let _limit = time_limit(Duration::from_secs(90));
    let cluster = RedisCluster::start_with_replicas(3, 1);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedisBackend::connect_cluster_with(&urls, durable())
        .await
        .unwrap();
    let ns = unique_ns("cluster");
    // No L1: its confirmations on a cluster are `WAIT 0 0`s, which the
    // count of `WAIT`s below would take for the writes'.
    let cache: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(backend)
        .no_l1()
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let value_key = FillKeys::new(&ns, "a").value().to_owned();
    let master = cluster.node_for_key(&value_key);
    let replicas = cluster.replicas_of(master);
    let [replica] = replicas.as_slice() else {
        panic!("one replica expected, found {}", replicas.len())
    };
    let waits = || command_calls(master).get("wait").copied().unwrap_or(0);
    // A `WAIT` ends soon after its timeout (see `primary_and_replica`).
    assert_eq!(master.command(&["CONFIG", "SET", "hz", "100"]), "OK");

    // The node's first script call meets NOSCRIPT and is sent again.
    cache.set("a", "0".into()).await.unwrap();
    let before = waits();
    cache.set("a", "1".into()).await.unwrap();
    assert_eq!(waits() - before, 1);
    // Keys are read on a cluster replica only after READONLY; a scan is
    // not redirected.
    let scanned = replica.command(&["SCAN", "0", "MATCH", &value_key, "COUNT", "1000"]);
    assert!(scanned.contains(&value_key), "{scanned}");
    let loaded = cache
        .get_or_load("a2", |_| async { Ok::<_, std::io::Error>("2".to_owned()) })
        .await
        .unwrap();
    assert_eq!(loaded, "2");

    replica.pause();
    let began = Instant::now();
    let err = cache.set("a", "2".into()).await.unwrap_err();
    let took = began.elapsed();
    replica.resume();
    assert!(
        matches!(&err, Error::Backend(e) if e.is_not_replicated()),
        "{err}"
    );
    assert!(took >= WAIT_TIMEOUT, "answered after {took:?}");
    assert!(took < Duration::from_millis(250), "answered after {took:?}");
    assert_eq!(cache.stats().writes_unreplicated, 1);
    assert_eq!(cache.pending_writes(), 0);
}

/// A write that waits for a frozen replica holds back no read: the server
/// answers nothing sent behind a `WAIT` on its connection until the `WAIT`
/// ends, so the writes that wait have a connection of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_not_held_back_by_a_write_that_waits() {
    let _limit = time_limit(LIMIT);
    let (primary, replica) = primary_and_replica();
    let ns = unique_ns("held");
    // A long `WAIT`, so that a read held behind it could not pass for a
    // slow one.
    let wait = Duration::from_millis(400);
    let options = RedisOptions::new().durability(Durability::Replicas {
        count: 1,
        timeout: wait,
    });
    let backend = RedisBackend::connect_with(&primary.url(), options)
        .await
        .unwrap();
    // No L1: the read must reach the server, where the write waits.
    let cache: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(backend)
        .no_l1()
        .backend_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    cache.set("warm", "0".into()).await.unwrap();
    replica.pause();

    let writing = {
        let cache = cache.clone();
        tokio::spawn(async move {
            let began = Instant::now();
            let written = cache.set("a", "1".into()).await;
            (written, began.elapsed())
        })
    };
    // The write is on the server, waiting for the replica.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let began = Instant::now();
    let read = cache.get("warm").await.unwrap();
    let read_took = began.elapsed();
    let (written, write_took) = writing.await.unwrap();
    replica.resume();
    assert_eq!(read.as_deref(), Some("0"));
    assert!(
        matches!(&written, Err(Error::Backend(e)) if e.is_not_replicated()),
        "{written:?}"
    );
    assert!(write_took >= wait, "the write took {write_took:?}");
    assert!(
        read_took < wait / 2,
        "the read took {read_took:?}: held behind the write's WAIT ({write_took:?})"
    );
}

/// A cache built (`CacheBuilder::build`, a sync fn) outside a Tokio
/// runtime on a backend whose primary is short of replicas builds, and the
/// shortfall still ends once the replica is back (the build's check of the
/// durability options must not start a probe it cannot send).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_outside_the_runtime_while_short_of_replicas_keeps_the_shortfall_ending() {
    let _limit = time_limit(LIMIT);
    let (primary, replica) = primary_and_replica();
    let backend = RedisBackend::connect_with(&primary.url(), durable())
        .await
        .unwrap();
    let ns = unique_ns("build");
    let build = |backend: RedisBackend, ns: String| {
        std::thread::spawn(move || {
            Cache::<String, String>::builder()
                .namespace(&ns)
                .backend(backend)
                .no_l1()
                .build()
                .map(|_| ())
        })
        .join()
    };
    // Settled: a write confirmed.
    let cache: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(backend.clone())
        .no_l1()
        .build()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cache.set(&"k".to_owned(), "v".into()).await.is_err() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Control: a build on a plain thread works while not short.
    assert!(matches!(build(backend.clone(), ns.clone()), Ok(Ok(()))));

    replica.pause();
    let short = cache.set(&"k".to_owned(), "v2".into()).await;
    eprintln!("with the replica frozen: {short:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let built = build(backend.clone(), ns.clone());
    eprintln!(
        "a build on a plain thread while short: panicked = {}",
        built.is_err()
    );
    replica.resume();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < Duration::from_secs(5) {
        match cache.set(&"k".to_owned(), "v3".into()).await {
            Ok(()) => {
                last = None;
                break;
            }
            Err(e) => last = Some(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("5 s after the replica is back, the last write: {last:?}");
    assert!(
        built.is_ok(),
        "build() panicked outside the runtime while short"
    );
    assert!(
        last.is_none(),
        "the replica is back but writes are still reported: {last:?}"
    );
}
