//! Writes that fail in an outage, on a real Redis (decision 0017): two
//! backends with connections of their own stand for two processes. The
//! server is killed and restarted with its data (an append-only file), so
//! an `invalidate` sent while it was down is lost: only the replay can
//! reach the other process. (A server paused with SIGSTOP would not show
//! it: the command waits in the socket and runs when the server resumes.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::{Cache, L1};
use onefill_testkit::{time_limit, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);

fn unique_ns(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "replay-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn process(ns: &str, server: &RedisServer) -> Cache<String, String> {
    Cache::builder()
        .namespace(ns)
        .backend(RedisBackend::connect(&server.url()).await.unwrap())
        .l1(L1::new(1_000))
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Process A invalidates a key while Redis is down: the command fails
/// (nothing sent), A's error says so, and Redis comes back with the old
/// value. Process B, whose L1 keeps the key coherent, answers the old
/// value until A's replay deletes it, then misses. Without the replay it
/// answered the old value for its whole TTL (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidate_lost_in_an_outage_reaches_the_other_process_once_redis_is_back() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let ns = unique_ns("lost");
    let (a, b) = (process(&ns, &server).await, process(&ns, &server).await);
    let key = "k".to_owned();
    a.set(&key, "old".into()).await.unwrap();
    assert_eq!(b.get(&key).await.unwrap().as_deref(), Some("old"));

    server.kill();
    let failed = a.invalidate(&key).await.unwrap_err();
    assert!(failed.is_backend(), "{failed}");
    assert_eq!(a.pending_writes(), 1);
    server.restart();
    let back = Instant::now();
    let value_key = FillKeys::new(&ns, "k").value().to_owned();
    assert_ne!(
        server.command(&["EXISTS", &value_key]),
        "0",
        "the old value came back with the server"
    );

    let mut old_seen_after_restart = 0;
    let converged = loop {
        assert!(
            back.elapsed() < Duration::from_secs(20),
            "B still answers the old value 20 s after Redis came back ({:?})",
            a.stats()
        );
        match b.get(&key).await {
            Ok(Some(old)) if old == "old" => old_seen_after_restart += 1,
            Ok(None) => break back.elapsed(),
            Ok(Some(other)) => panic!("B answered {other:?}"),
            Err(_) => {} // B's reconnecting
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(a.pending_writes(), 0);
    assert_eq!(a.stats().writes_replayed, 1);
    println!(
        "B stopped answering the old value {converged:?} after Redis came back \
         (answered it {old_seen_after_restart} times before)"
    );
}

/// A process reaching Redis through `proxy`.
async fn behind(proxy: &onefill_testkit::Endpoint, ns: &str) -> Cache<String, String> {
    Cache::builder()
        .namespace(ns)
        .backend(RedisBackend::connect(&proxy.url()).await.unwrap())
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// The path through `proxy` down: its connections closed, and nothing
/// listening where it points now.
fn cut(proxy: &onefill_testkit::Endpoint) {
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    proxy.point_to(nowhere);
    proxy.close_connections();
}

/// Waits (at most 20 s) until `cache` has replayed every queued write.
async fn replayed(cache: &Cache<String, String>) {
    let began = Instant::now();
    while cache.pending_writes() > 0 {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the replay never ran ({:?})",
            cache.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Process A reaches Redis through a proxy; B directly. A's path goes down
/// (the proxy points at nothing): A's `set` fails and is queued to be
/// replayed as an invalidation. B then writes a newer value, and A's path
/// comes back: A's replay keeps B's value, written after A's write began
/// (the server's stamp of the write says so), where it used to delete it.
/// A value from before A's write is still deleted (the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_write_keeps_a_value_written_after_it() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let proxy = onefill_testkit::Endpoint::start(server.port());
    let ns = unique_ns("newer");
    let a = behind(&proxy, &ns).await;
    let b = process(&ns, &server).await;
    let key = "k".to_owned();
    a.set(&key, "old".into()).await.unwrap();

    cut(&proxy);
    let failed = a.set(&key, "lost".into()).await.unwrap_err();
    assert!(failed.is_backend(), "{failed}");
    assert_eq!(a.pending_writes(), 1);

    // B writes after A's write began, while A cannot replay.
    b.set(&key, "newer".into()).await.unwrap();
    assert_eq!(a.stats().writes_replayed, 0);

    proxy.point_to(server.port());
    replayed(&a).await;
    assert_eq!(a.stats().writes_replayed, 1);
    assert_eq!(
        b.get(&key).await.unwrap().as_deref(),
        Some("newer"),
        "the replay deleted a value written after the write it replays"
    );
    assert_eq!(a.get(&key).await.unwrap().as_deref(), Some("newer"));
}

/// Process B's load reads the source ("old") and takes its time; the
/// source changes and process A's `invalidate` of the key fails (its path
/// to Redis down), so B's lease is not deleted and B's fill lands after A's
/// write began. The fill's value is as old as its load, not as its write:
/// A's replay deletes it, and a fresh read misses (it once kept it, the
/// value written after A's write began, and the fleet read "old" for a TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_deletes_a_fill_whose_load_began_before_the_write() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let proxy = onefill_testkit::Endpoint::start(server.port());
    let ns = unique_ns("stale-fill");
    let a = behind(&proxy, &ns).await;
    let b = process(&ns, &server).await;
    let key = "k".to_owned();
    let (b2, k2) = (b.clone(), key.clone());
    let load = tokio::spawn(async move {
        b2.get_or_load(&k2, |_| async {
            // Read the source now ("old"), answer later.
            tokio::time::sleep(Duration::from_millis(400)).await;
            Ok::<_, std::io::Error>("old".to_owned())
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The source changes; A's invalidate cannot reach Redis.
    cut(&proxy);
    assert!(a.invalidate(&key).await.is_err());
    assert_eq!(a.pending_writes(), 1);
    assert_eq!(load.await.unwrap().unwrap(), "old");

    proxy.point_to(server.port());
    replayed(&a).await;
    let fresh = process(&ns, &server).await;
    assert_eq!(
        fresh.get(&key).await.unwrap(),
        None,
        "the replay kept a fill whose load read the source before the write"
    );
}
