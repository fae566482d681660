//! A plain URL whose server changes behind it, as a managed service's
//! primary endpoint does at a failover: the replica is promoted, the old
//! primary becomes its replica, new connections reach the promoted one and
//! those made before stay with the old one (as a DNS name moved to another
//! address leaves them), where every write meets `READONLY`. The backend
//! takes `READONLY` for "no longer the primary" and moves every connection
//! to the server the URL leads to now.
//!
//! Each test starts its own primary and replica and a proxy in front of
//! them (`onefill_testkit::Endpoint`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onefill::backend::{Backend, FillKeys, LeaseRequest};
use onefill::redis::{Durability, RedisBackend, RedisOptions};
use onefill::{Cache, LeaseToken, Outcome};
use onefill_testkit::{time_limit, Endpoint, RedisServer};

mod acl;

const LIMIT: Duration = Duration::from_secs(60);

fn unique_ns(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "endpoint-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A primary, a replica of it (linked), and the endpoint leading to the
/// primary.
fn primary_replica_endpoint() -> (RedisServer, RedisServer, Endpoint) {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let endpoint = Endpoint::start(primary.port());
    (primary, replica, endpoint)
}

/// The managed service's failover: `replica` promoted, the endpoint
/// moved to it, `primary` made its replica (its connections stay open).
fn fail_over(primary: &RedisServer, replica: &RedisServer, endpoint: &Endpoint) {
    assert_eq!(replica.command(&["REPLICAOF", "NO", "ONE"]), "OK");
    endpoint.point_to(replica.port());
    let port = replica.port().to_string();
    assert_eq!(primary.command(&["REPLICAOF", "127.0.0.1", &port]), "OK");
}

async fn cache(ns: &str, endpoint: &Endpoint) -> Cache<String, String> {
    cache_at(ns, &endpoint.url()).await
}

async fn cache_at(ns: &str, url: &str) -> Cache<String, String> {
    let backend = RedisBackend::connect(url)
        .await
        .expect("connects through the endpoint");
    Cache::builder()
        .namespace(ns)
        .backend(backend)
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_endpoint_moves_writes_notifications_and_the_l1_follow_it() {
    let _limit = time_limit(LIMIT);
    let (primary, replica, endpoint) = primary_replica_endpoint();
    let ns = unique_ns("moves");
    let (a, b) = (cache(&ns, &endpoint).await, cache(&ns, &endpoint).await);
    let key = "k".to_owned();
    a.set(&key, "v1".into()).await.unwrap();
    // In b's L1, tracked on the old primary.
    assert_eq!(b.get(&key).await.unwrap().as_deref(), Some("v1"));

    fail_over(&primary, &replica, &endpoint);

    // The first write may meet `READONLY` (the connection is still on the
    // old primary); then the backend has moved, and writes land on the
    // promoted server.
    let started = Instant::now();
    let mut refused = 0;
    loop {
        match a.set(&key, "v2".into()).await {
            Ok(()) => break,
            Err(e) => {
                refused += 1;
                assert!(
                    refused <= 1 && started.elapsed() < Duration::from_secs(2),
                    "writes still refused after the endpoint moved: {e}"
                );
                tokio::time::sleep(Duration::from_millis(60)).await;
            }
        }
    }
    let keys = FillKeys::new(&ns, &key);
    assert!(replica.command(&["GET", keys.value()]).contains("v2"));

    // b never wrote: its first write meets `READONLY` at most once too, and
    // its L1 hears of a's writes through its tracking, which moved with it.
    let mut refused = 0;
    while let Err(e) = b.set(&"other".to_owned(), "x".into()).await {
        refused += 1;
        assert!(refused <= 1, "b's writes still refused: {e}");
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    a.set(&key, "v3".into()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let seen = b.get(&key).await.unwrap();
        if seen.as_deref() == Some("v3") {
            break;
        }
        assert!(Instant::now() < deadline, "b's L1 still answers {seen:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A load under way when the endpoint moves: its lease reached the
/// promoted server, its fill goes to the old one and is refused. The other
/// process's waiter is answered soon after the load ends, not at the
/// lease's expiry or its wait deadline (10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_when_the_endpoint_moves_stalls_no_key() {
    let _limit = time_limit(LIMIT);
    let (primary, replica, endpoint) = primary_replica_endpoint();
    let ns = unique_ns("lease");
    let (a, b) = (cache(&ns, &endpoint).await, cache(&ns, &endpoint).await);
    let loads = Arc::new(AtomicUsize::new(0));
    let loader = |loads: Arc<AtomicUsize>, ms: u64| {
        move |k: String| async move {
            loads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, std::io::Error>(format!("{k} loaded"))
        }
    };
    let started = Instant::now();
    let holder = {
        let (a, loads) = (a.clone(), loads.clone());
        tokio::spawn(async move { a.fetch(&"k".to_owned(), loader(loads, 600)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waiter = {
        let (b, loads) = (b.clone(), loads.clone());
        tokio::spawn(async move {
            let answer = b.fetch(&"k".to_owned(), loader(loads, 50)).await;
            (answer, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    fail_over(&primary, &replica, &endpoint);

    let held = holder.await.unwrap().expect("the holder answers its load");
    assert_eq!(held.outcome, Outcome::Loaded);
    let (answer, answered_at) = waiter.await.unwrap();
    let fetched = answer.expect("the waiter is answered");
    let (value, outcome) = (fetched.value, fetched.outcome);
    eprintln!("the waiter: {outcome:?} at {answered_at:?}");
    assert_eq!(value, "k loaded");
    assert!(
        answered_at < Duration::from_secs(2),
        "the waiter was answered {answered_at:?} after the start ({outcome:?}): the lease \
         the failover kept held its key"
    );
    assert!(loads.load(Ordering::SeqCst) <= 2);
}

/// As the README's least-privilege user, which has no `ROLE`: the
/// `READONLY` is taken at its word, and writes follow the endpoint too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_role_in_the_acl_writes_follow_the_endpoint_too() {
    let _limit = time_limit(LIMIT);
    let (primary, replica, endpoint) = primary_replica_endpoint();
    let ns = unique_ns("acl");
    let line = acl::line(
        &ns,
        acl::Deployment {
            l1: true,
            cluster: false,
        },
    );
    assert!(!line.contains("+role"), "{line}");
    // ACL users are not replicated: each server has its own.
    let url = primary.acl_user(&line);
    replica.acl_user(&line);
    let url = url.replace(
        &format!(":{}", primary.port()),
        &format!(":{}", endpoint.port()),
    );
    let a = cache_at(&ns, &url).await;
    let key = "k".to_owned();
    a.set(&key, "v1".into()).await.unwrap();
    fail_over(&primary, &replica, &endpoint);
    let mut refused = 0;
    while let Err(e) = a.set(&key, "v2".into()).await {
        refused += 1;
        assert!(
            refused <= 1,
            "writes still refused after the endpoint moved: {e}"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let keys = FillKeys::new(&ns, &key);
    assert!(replica.command(&["GET", keys.value()]).contains("v2"));
}

/// A workload of batch calls only (`fetch_many`): after the endpoint moves,
/// a miss's `acquire_many` meets `READONLY` as a reply inside the
/// pipeline; the key is sent again on its own, which moves the backend,
/// and misses are stored on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_misses_alone_move_the_backend() {
    let _limit = time_limit(LIMIT);
    let (primary, replica, endpoint) = primary_replica_endpoint();
    let ns = unique_ns("batch");
    let backend = RedisBackend::connect(&endpoint.url()).await.unwrap();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(backend.clone())
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    let loader = |loads: Arc<AtomicUsize>| {
        move |keys: Vec<String>| {
            let loads = loads.clone();
            async move {
                loads.fetch_add(keys.len(), Ordering::SeqCst);
                Ok::<_, std::io::Error>(
                    keys.into_iter()
                        .map(|k| {
                            let v = format!("{k} loaded");
                            (k, v)
                        })
                        .collect::<Vec<_>>(),
                )
            }
        }
    };
    let before = vec!["before".to_owned()];
    let answers = cache
        .fetch_many(&before, loader(loads.clone()))
        .await
        .unwrap();
    assert!(answers["before"].is_ok());
    let keys = FillKeys::new(&ns, "before");
    assert!(primary
        .command(&["GET", keys.value()])
        .contains("before loaded"));

    fail_over(&primary, &replica, &endpoint);

    let started = Instant::now();
    let mut stored = 0;
    let mut errors = 0;
    for i in 0..30 {
        let key = format!("after-{i}");
        let answers = cache
            .fetch_many(std::slice::from_ref(&key), loader(loads.clone()))
            .await
            .unwrap();
        if answers[&key].is_err() {
            errors += 1;
        }
        let keys = FillKeys::new(&ns, &key);
        if replica.command(&["GET", keys.value()]).contains("loaded") {
            stored += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The backend's own batch acquire, a few seconds after the failover.
    let keys = FillKeys::new(&ns, "direct");
    let request = LeaseRequest::new(keys, LeaseToken::random(), Duration::ZERO);
    let direct = backend
        .acquire_many(&[request], Duration::from_secs(5))
        .await;
    eprintln!(
        "after {:?}: {stored} of 30 misses stored on the new primary, {errors} errors, \
         {} loads; a direct acquire_many answers {:?}",
        started.elapsed(),
        loads.load(Ordering::SeqCst),
        direct[0].as_ref().map(|_| "ok")
    );
    assert!(
        stored > 0 && direct[0].is_ok(),
        "the backend never moved: batch misses are never stored after the endpoint moved \
         (acquire_many: {:?})",
        direct[0].as_ref().err()
    );
}

/// The command connection and the connection of the writes that wait can
/// lead to different servers: here the command connection was closed by
/// the old primary after the failover and reconnected through the URL to
/// the new one, while the durable connection stays on the old one. The
/// durable writes meet `READONLY`; the follower asks `ROLE` on every
/// connection, and moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_connection_left_on_the_old_primary_is_followed() {
    let _limit = time_limit(LIMIT);
    let (primary, replica, endpoint) = primary_replica_endpoint();
    let ns = unique_ns("durable");
    let options = RedisOptions::new().durability(Durability::Replicas {
        count: 1,
        timeout: Duration::from_millis(50),
    });
    let backend = RedisBackend::connect_with(&endpoint.url(), options)
        .await
        .unwrap();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(backend)
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let key = "k".to_owned();
    cache.set(&key, "v1".into()).await.unwrap();
    let _ = cache.get(&"other".to_owned()).await;

    fail_over(&primary, &replica, &endpoint);

    // The old primary closes every connection but the durable one (the
    // one whose last command was WAIT).
    let list = primary.command(&["CLIENT", "LIST"]);
    eprintln!("{list}");
    let mut kept = 0;
    for line in list.lines() {
        let field = |name: &str| {
            line.split(' ')
                .find_map(|f| f.strip_prefix(&format!("{name}=")))
                .unwrap_or("")
                .to_owned()
        };
        let (id, cmd, flags) = (field("id"), field("cmd"), field("flags"));
        if cmd == "wait" {
            kept += 1;
            continue;
        }
        if cmd == "client|list" || flags.contains('M') || flags.contains('S') {
            continue;
        }
        primary.command(&["CLIENT", "KILL", "ID", &id]);
    }
    assert_eq!(kept, 1, "one durable connection");
    // Reads reconnect the command connection, through the URL: to the new
    // primary.
    for _ in 0..5 {
        let _ = cache.get(&"other".to_owned()).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    eprintln!(
        "new primary's clients:\n{}",
        replica.command(&["CLIENT", "LIST"])
    );
    let started = Instant::now();
    let mut last = None;
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    while started.elapsed() < Duration::from_secs(8) {
        match cache.set(&key, "v2".into()).await {
            Ok(()) => {
                last = None;
                break;
            }
            Err(e) => {
                *seen.entry(e.to_string()).or_default() += 1;
                last = Some(e.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("errors met: {seen:#?}");
    eprintln!(
        "old primary's clients now:\n{}",
        primary.command(&["CLIENT", "LIST"])
    );
    assert!(
        last.is_none(),
        "durable writes still refused {:?} after the failover: {last:?}",
        started.elapsed()
    );
}
