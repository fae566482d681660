//! The L1 on real Redis (standalone and a 3-master cluster): two backends
//! with connections of their own stand for two processes. Each process's
//! L1 must drop a key when it changes in Redis, whoever changed it (a
//! `set` by the other process, a plain `SET`/`DEL`/`PEXPIRE` from another
//! client), and must not serve what it missed while its tracking
//! connection was down, nor after a failover moved the key's shard to a
//! master it does not track. The outage fallback of a namespace with an L1
//! keeps no copy the server no longer holds either: not past the TTL the
//! server reported, not after a write by any cache of the process, not
//! after a change the process heard of.
//!
//! Every backend here connects as the README's least-privilege ACL user.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::{Cache, Outcome, L1};
use onefill_testkit::{time_limit, RedisCluster, RedisServer};

mod acl;

/// Cluster tests take seconds each (a 3-master cluster forms in a few); past this they hang.
const LIMIT: Duration = Duration::from_secs(120);

/// The README's least-privilege user, with the L1's addition, on
/// `server`: every backend of these tests connects as it (the raw clients
/// that change keys behind the caches' backs keep the default user).
fn as_user(server: &RedisServer) -> String {
    acl::url(server, "l1-*", true)
}

/// [`as_user`] on every node of `cluster`.
fn as_users(cluster: &RedisCluster) -> Vec<String> {
    acl::urls(cluster, "l1-*", true)
}

fn unique_ns(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "l1-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn cache(ns: &str, backend: RedisBackend) -> Cache<String, String> {
    Cache::builder()
        .namespace(ns)
        .backend(backend)
        .l1(L1::new(1_000))
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// One call; the loader answers `loaded-<n>` and counts.
async fn fetch(
    cache: &Cache<String, String>,
    key: &str,
    loads: &Arc<AtomicUsize>,
) -> (String, Outcome) {
    let loads = loads.clone();
    let f = cache
        .fetch(&key.to_owned(), move |_| async move {
            let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, std::io::Error>(format!("loaded-{n}"))
        })
        .await
        .unwrap();
    (f.value, f.outcome)
}

/// Calls until the L1 answers (its tracking connection confirmed), at most
/// 5 s.
async fn until_l1_serves(
    cache: &Cache<String, String>,
    key: &str,
    loads: &Arc<AtomicUsize>,
) -> String {
    for _ in 0..500 {
        let before = cache.stats().l1_hits;
        let (value, _) = fetch(cache, key, loads).await;
        if cache.stats().l1_hits > before {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the L1 never served {key}");
}

/// Calls until the answer is not `old`, at most 2 s; returns how long.
async fn until_changed(
    cache: &Cache<String, String>,
    key: &str,
    old: &str,
    loads: &Arc<AtomicUsize>,
) -> Duration {
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if fetch(cache, key, loads).await.0 != old {
            return start.elapsed();
        }
        tokio::task::yield_now().await;
    }
    panic!("{key} still served as {old:?} 2 s after it changed");
}

/// Writes by the other process and by plain clients, on `raw` (the node
/// that holds the key).
async fn coherence<'s>(
    a: Cache<String, String>,
    b: Cache<String, String>,
    ns: &str,
    raw: impl Fn(&str) -> &'s RedisServer,
) {
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "user:1";
    let value_key = FillKeys::new(ns, key).value().to_owned();

    fetch(&a, key, &loads).await;
    let v1 = until_l1_serves(&b, key, &loads).await;
    assert_eq!(v1, "loaded-1");

    // A `set` by the other process.
    a.set(&key.to_owned(), "from-a".into()).await.unwrap();
    until_changed(&b, key, &v1, &loads).await;
    assert_eq!(fetch(&b, key, &loads).await.0, "from-a");

    // A plain `DEL` from another client: B loads again.
    until_l1_serves(&b, key, &loads).await;
    raw(&value_key).command(&["DEL", &value_key]);
    until_changed(&b, key, "from-a", &loads).await;
    let reloaded = fetch(&b, key, &loads).await.0;
    assert!(reloaded.starts_with("loaded-"), "{reloaded}");

    // A plain `SET` of bytes that are not onefill's: dropped, then
    // unreadable, so loaded again.
    until_l1_serves(&b, key, &loads).await;
    raw(&value_key).command(&["SET", &value_key, "written by someone else"]);
    until_changed(&b, key, &reloaded, &loads).await;

    // A plain `PEXPIRE`: the key expires early; B loads again.
    let current = until_l1_serves(&b, key, &loads).await;
    raw(&value_key).command(&["PEXPIRE", &value_key, "1"]);
    until_changed(&b, key, &current, &loads).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_every_write_reaches_the_other_l1() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("standalone");
    let a = cache(&ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    let b = cache(&ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    coherence(a, b, &ns, |_| &server).await;
}

/// A cache built with no word about the L1.
fn default_cache(ns: &str, backend: RedisBackend) -> Cache<String, String> {
    Cache::builder()
        .namespace(ns)
        .backend(backend)
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A cache on Redis has an L1 unless told otherwise, and it is the L1 of
/// the tests above: every write, by the other process or a plain client,
/// reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_the_default_l1_is_on_and_every_write_reaches_it() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("default");
    let a = default_cache(&ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    let b = default_cache(&ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    coherence(a.clone(), b.clone(), &ns, |_| &server).await;
    // One tracking connection per backend (each opened by a task of its
    // own, so counted once both L1s have served).
    let loads = Arc::new(AtomicUsize::new(0));
    until_l1_serves(&a, "other", &loads).await;
    until_l1_serves(&b, "other", &loads).await;
    assert_eq!(tracking_clients(&server), 2);
}

/// `.no_l1()`: no tracking connection, and every call reads Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_no_l1_reads_redis_every_time() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("no-l1");
    let cache: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(RedisBackend::connect(&as_user(&server)).await.unwrap())
        .no_l1()
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    fetch(&cache, "k", &loads).await;
    for _ in 0..20 {
        assert_eq!(fetch(&cache, "k", &loads).await.1, Outcome::Hit);
    }
    let stats = cache.stats();
    assert_eq!(
        (stats.hits, stats.l1_hits, loads.load(Ordering::SeqCst)),
        (20, 0, 1)
    );
    assert_eq!(tracking_clients(&server), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_every_write_reaches_the_other_l1() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let urls = as_users(&cluster);
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let ns = unique_ns("cluster");
    let a = cache(&ns, RedisBackend::connect_cluster(&urls).await.unwrap());
    let b = cache(&ns, RedisBackend::connect_cluster(&urls).await.unwrap());
    coherence(a, b, &ns, |key| cluster.node_for_key(key)).await;
    // Keys on every master.
    let loads = Arc::new(AtomicUsize::new(0));
    let a2 = cache(&ns, RedisBackend::connect_cluster(&urls).await.unwrap());
    for i in 0..20 {
        let key = format!("spread:{i}");
        fetch(&a2, &key, &loads).await;
    }
    let b2 = cache(&ns, RedisBackend::connect_cluster(&urls).await.unwrap());
    for i in 0..20 {
        let key = format!("spread:{i}");
        let old = until_l1_serves(&b2, &key, &loads).await;
        a2.set(&key, format!("new:{i}")).await.unwrap();
        until_changed(&b2, &key, &old, &loads).await;
    }
}

/// The id of the server's one tracking connection.
fn tracking_connection(server: &RedisServer) -> String {
    let tracking: Vec<String> = server
        .command(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| {
            line.split(' ').any(|f| {
                f.strip_prefix("flags=")
                    .is_some_and(|flags| flags.contains('t'))
            })
        })
        .filter_map(|line| {
            line.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(tracking.len(), 1, "one tracking connection: {tracking:?}");
    tracking.into_iter().next().unwrap()
}

/// Kills the server's tracking connection and deletes `value_key` in one
/// server round, so the deletion's invalidation is lost for sure.
async fn lose_tracking_and_delete(server: &RedisServer, value_key: &str) {
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::pipe()
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(tracking_connection(server))
        .ignore()
        .cmd("DEL")
        .arg(value_key)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// The tracking connection is killed and the key deleted in the same
/// server round (so its invalidation is lost for sure): the L1 stops
/// serving at once (or within the sync bound), and once tracking is back
/// it was emptied, so the old value is never served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_tracking_connection_empties_the_l1_before_it_serves_again() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("lost");
    let b = cache(&ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k";
    let value_key = FillKeys::new(&ns, key).value().to_owned();
    fetch(&b, key, &loads).await;
    let old = until_l1_serves(&b, key, &loads).await;
    let resets = b.stats().l1_resets;

    lose_tracking_and_delete(&server, &value_key).await;
    // Past the sync bound (250 ms), whatever happened to the connection,
    // the old value is not served.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..20 {
        assert_ne!(fetch(&b, key, &loads).await.0, old);
    }
    // Tracking comes back, after emptying the L1; the L1 serves again.
    let new = until_l1_serves(&b, key, &loads).await;
    assert_ne!(new, old);
    assert!(
        b.stats().l1_resets > resets,
        "the L1 was emptied on reconnect"
    );
}

/// The key deleted while the tracking connection was lost (its
/// invalidation never sent), then, tracking back, the server hangs before
/// the key is read again: the outage fallback must not answer the deleted
/// value. The L1 was emptied on reconnect, but the fallback kept what it
/// had read before the loss, and answered it as `Stale` for the TTL read
/// with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_missed_while_tracking_was_lost_never_comes_back_from_the_fallback() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("lost-fallback");
    let b = cache(&ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k";
    let value_key = FillKeys::new(&ns, key).value().to_owned();
    fetch(&b, key, &loads).await;
    let old = until_l1_serves(&b, key, &loads).await;
    let resets = b.stats().l1_resets;

    lose_tracking_and_delete(&server, &value_key).await;
    let lost = std::time::Instant::now();
    while b.stats().l1_resets == resets {
        assert!(lost.elapsed() < Duration::from_secs(10), "tracking is back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    server.pause();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = fetch(&b, key, &loads).await;
    server.resume();
    assert_ne!(during.0, old, "{during:?}: the value deleted meanwhile");
}

/// A hung server: the L1 stops serving within the sync bound (calls go to
/// the backend's outage handling), and serves again once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_stops_the_l1_within_the_bound() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("hung");
    let b = cache(&ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    let loads = Arc::new(AtomicUsize::new(0));
    fetch(&b, "k", &loads).await;
    until_l1_serves(&b, "k", &loads).await;
    // The push of the load's own fill, late on a busy machine, drops the
    // L1 entry and the fallback's copy; the read that follows keeps both
    // again.
    tokio::time::sleep(Duration::from_millis(50)).await;
    until_l1_serves(&b, "k", &loads).await;
    server.pause();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = b.stats().l1_hits;
    let (_, outcome) = fetch(&b, "k", &loads).await;
    assert_eq!(b.stats().l1_hits, before, "not an L1 hit");
    assert_eq!(outcome, Outcome::Stale, "the outage fallback answers");
    server.resume();
    until_l1_serves(&b, "k", &loads).await;
}

/// `expire` by one process: the other's L1 drops the entry when the push
/// comes (until then it may answer the value fresh, as for any write),
/// and its next call answers the value stale at once while it refreshes
/// it, once; the writer's own L1 drops it before `expire` returns, so its
/// very next call is answered stale.
async fn an_expire_reaches_every_l1(ns: &str, a: RedisBackend, b: RedisBackend) {
    let grace = |backend| {
        Cache::<String, String>::builder()
            .namespace(ns)
            .backend(backend)
            .l1(L1::new(1_000))
            .ttl(Duration::from_secs(60))
            .grace(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (a, b) = (grace(a), grace(b));
    let loads = Arc::new(AtomicUsize::new(0));

    // The other process.
    fetch(&a, "other", &loads).await;
    let v1 = until_l1_serves(&b, "other", &loads).await;
    a.expire(&"other".to_owned()).await.unwrap();
    let start = std::time::Instant::now();
    let first = loop {
        let answer = fetch(&b, "other", &loads).await;
        if answer.1 != Outcome::Hit {
            break answer;
        }
        assert!(start.elapsed() < Duration::from_secs(2), "the L1 kept it");
        tokio::task::yield_now().await;
    };
    assert_eq!(first, (v1, Outcome::Stale));
    let refreshed = until_changed(&b, "other", "loaded-1", &loads).await;
    assert!(refreshed < Duration::from_secs(2));
    assert_eq!(loads.load(Ordering::SeqCst), 2, "one refresh");

    // The writer's own L1.
    fetch(&a, "own", &loads).await;
    let v3 = until_l1_serves(&a, "own", &loads).await;
    a.expire(&"own".to_owned()).await.unwrap();
    assert_eq!(fetch(&a, "own", &loads).await, (v3, Outcome::Stale));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_an_expire_reaches_every_l1() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("expire");
    let a = RedisBackend::connect(&as_user(&server)).await.unwrap();
    let b = RedisBackend::connect(&as_user(&server)).await.unwrap();
    an_expire_reaches_every_l1(&ns, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_an_expire_reaches_every_l1() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let urls = as_users(&cluster);
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let ns = unique_ns("expire-cluster");
    let a = RedisBackend::connect_cluster(&urls).await.unwrap();
    let b = RedisBackend::connect_cluster(&urls).await.unwrap();
    an_expire_reaches_every_l1(&ns, a, b).await;
}

/// Two caches of one namespace in one process, both with an L1: after
/// `a.invalidate(k)`, `a.set(k)` or `a.expire(k)` returned, `b` answers the new value, never
/// the old one from its L1, whether the caches share a backend or each has
/// its own (`two_backends`). Each used to answer the old value until the
/// tracking push arrived: on one backend 5 times in 50 until the backend
/// told its own L1s of its writes, on two backends 23–37 times in 200 until
/// the writes of any backend reached every L1 of the process.
async fn another_cache_of_the_same_process_reads_its_writes(two_backends: bool) {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("sameproc");
    let backend = RedisBackend::connect(&as_user(&server)).await.unwrap();
    let other = if two_backends {
        RedisBackend::connect(&as_user(&server)).await.unwrap()
    } else {
        backend.clone()
    };
    let a = cache(&ns, backend);
    let b = cache(&ns, other);
    let loads = Arc::new(AtomicUsize::new(0));
    for i in 0..75 {
        let key = format!("k{i}");
        fetch(&a, &key, &loads).await;
        let old = until_l1_serves(&b, &key, &loads).await;
        match i % 3 {
            0 => a.invalidate(&key).await.unwrap(),
            1 => a.set(&key, format!("set-{i}")).await.unwrap(),
            // Without grace: removed, as by `invalidate`.
            _ => a.expire(&key).await.unwrap(),
        }
        assert_ne!(fetch(&b, &key, &loads).await.0, old, "round {i}");
    }
}

/// The clients of `node` with tracking on (`CLIENT LIST`'s `t` flag).
fn tracking_clients(node: &RedisServer) -> usize {
    node.command(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix("flags="))
                .is_some_and(|flags| flags.contains('t'))
        })
        .count()
}

/// Three caches with an L1 on each of two backends (two processes), built
/// one after the other (the later ones while the first's tracking runs):
/// one tracking connection per backend and server, and each L1 hears of
/// every change of its own namespace from the other process.
async fn caches_of_a_backend_share_its_tracking(
    connect: impl Fn() -> futures_util::future::BoxFuture<'static, RedisBackend>,
    masters: Vec<&RedisServer>,
) {
    let shared = connect().await;
    let other = connect().await;
    let loads = Arc::new(AtomicUsize::new(0));
    let mut caches = Vec::new();
    for name in ["first", "second", "third"] {
        let ns = unique_ns(name);
        let mine = cache(&ns, shared.clone());
        fetch(&mine, "k", &loads).await;
        until_l1_serves(&mine, "k", &loads).await;
        caches.push((cache(&ns, other.clone()), mine));
    }
    for master in &masters {
        // Six caches with an L1, on two backends: one connection each.
        assert_eq!(tracking_clients(master), 2, "tracking connections");
    }
    for (theirs, mine) in &caches {
        let old = until_l1_serves(mine, "k", &loads).await;
        theirs
            .set(&"k".to_owned(), "set elsewhere".into())
            .await
            .unwrap();
        until_changed(mine, "k", &old, &loads).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_caches_of_a_backend_share_one_tracking_connection() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = as_user(&server);
    let connect = move || -> futures_util::future::BoxFuture<'static, RedisBackend> {
        let url = url.clone();
        Box::pin(async move { RedisBackend::connect(&url).await.unwrap() })
    };
    caches_of_a_backend_share_its_tracking(connect, vec![&server]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_caches_of_a_backend_share_one_tracking_connection_per_master() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let urls = as_users(&cluster);
    let connect = move || -> futures_util::future::BoxFuture<'static, RedisBackend> {
        let urls = urls.clone();
        Box::pin(async move {
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            RedisBackend::connect_cluster(&urls).await.unwrap()
        })
    };
    caches_of_a_backend_share_its_tracking(connect, cluster.nodes().iter().collect()).await;
}

/// A namespace's cache dropped and built again on a backend whose
/// tracking connection still serves another cache: the connection
/// already tracks the prefix (Redis refuses it twice, as overlapping
/// itself), so it is not sent again; the connection stays up and the
/// other cache's L1 is not reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_built_again_keeps_the_shared_tracking_connection() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&as_user(&server)).await.unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    let stays = cache(&unique_ns("stays"), backend.clone());
    fetch(&stays, "k", &loads).await;
    until_l1_serves(&stays, "k", &loads).await;
    let again = unique_ns("again");
    let first = cache(&again, backend.clone());
    fetch(&first, "k", &loads).await;
    until_l1_serves(&first, "k", &loads).await;
    let id = tracking_connection(&server);
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = cache(&again, backend.clone());
    until_l1_serves(&second, "k", &loads).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        tracking_connection(&server),
        id,
        "the tracking connection was made again"
    );
    let before = stays.stats().l1_hits;
    fetch(&stays, "k", &loads).await;
    assert_eq!(
        stays.stats().l1_hits,
        before + 1,
        "the other cache's L1 was reset"
    );
}

/// The tracking connection's handshake answered with an error (its
/// user's password changed as it reconnects) is a failure to connect, not
/// the server refusing tracking: once the user can log in again, the L1
/// is tracked again (not switched to onefill's announcements for good,
/// which this user may not even subscribe to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_reply_to_the_handshake_is_not_a_refusal_of_tracking() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = as_user(&server);
    let ns = unique_ns("handshake");
    let c = cache(&ns, RedisBackend::connect(&url).await.unwrap());
    let loads = Arc::new(AtomicUsize::new(0));
    fetch(&c, "k", &loads).await;
    until_l1_serves(&c, "k", &loads).await;
    let user = url
        .strip_prefix("redis://")
        .and_then(|rest| rest.split(':').next())
        .expect("a user in the URL");
    server.command(&["ACL", "SETUSER", user, "resetpass", ">another"]);
    server.command(&["CLIENT", "KILL", "ID", &tracking_connection(&server)]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    as_user(&server);
    until_l1_serves(&c, "k", &loads).await;
    // A tracking connection again, not a pattern subscriber.
    tracking_connection(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cache_on_the_same_backend_reads_its_writes() {
    another_cache_of_the_same_process_reads_its_writes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cache_on_another_backend_of_the_process_reads_its_writes() {
    another_cache_of_the_same_process_reads_its_writes(true).await;
}

/// A server where a key with a TTL goes only when it is touched (no active
/// expiry), as with a key among many others with a TTL: nothing pushes its
/// expiry to the L1.
fn server_without_active_expiry() -> RedisServer {
    let server = RedisServer::start_with(&["--enable-debug-command", "local"]);
    server.command(&["DEBUG", "SET-ACTIVE-EXPIRE", "0"]);
    server
}

/// A value written with a TTL of 60 s, whose TTL another client then cuts
/// to 300 ms (`PEXPIRE`): the push drops the L1 entry, and the next read
/// must keep the value no longer than the server will (300 ms), not the
/// 60 s written in it. Returns the cache, the server, the key's loads, and
/// when the server's copy expires.
async fn a_value_whose_ttl_another_client_shortened(
    ns: &str,
) -> (
    Cache<String, String>,
    RedisServer,
    Arc<AtomicUsize>,
    std::time::Instant,
) {
    let server = server_without_active_expiry();
    let c = cache(ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k";
    let value_key = FillKeys::new(ns, key).value().to_owned();
    fetch(&c, key, &loads).await;
    until_l1_serves(&c, key, &loads).await;
    let invalidations = c.stats().l1_invalidations;
    server.command(&["PEXPIRE", &value_key, "300"]);
    let expires = std::time::Instant::now() + Duration::from_millis(300);
    while c.stats().l1_invalidations == invalidations {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Read again (from Redis: the L1 dropped it), and kept.
    assert_eq!(
        fetch(&c, key, &loads).await,
        ("loaded-1".into(), Outcome::Hit)
    );
    (c, server, loads, expires)
}

/// Once the server's copy has expired, the L1 no longer answers it: it
/// used to keep the re-read value for the 60 s written in it, and every
/// call answered the expired value as a `Hit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_l1_entry_never_outlives_a_ttl_another_client_shortened() {
    let _limit = time_limit(LIMIT);
    let ns = unique_ns("pexpire");
    let (c, _server, loads, expires) = a_value_whose_ttl_another_client_shortened(&ns).await;
    tokio::time::sleep_until(expires.into()).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        fetch(&c, "k", &loads).await,
        ("loaded-2".into(), Outcome::Loaded),
        "the value expired on the server is not served"
    );
}

/// The same value, then the server hangs past the shortened TTL: the
/// outage fallback does not serve the value the server no longer holds
/// (it used to, as `Stale`, with the TTL written in it); the call loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outage_fallback_never_outlives_a_ttl_another_client_shortened() {
    let _limit = time_limit(LIMIT);
    let ns = unique_ns("pexpire-outage");
    let (c, server, loads, expires) = a_value_whose_ttl_another_client_shortened(&ns).await;
    server.pause();
    tokio::time::sleep_until(expires.into()).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let answer = fetch(&c, "k", &loads).await;
    server.resume();
    assert_eq!(
        answer,
        ("loaded-2".into(), Outcome::Degraded),
        "the expired value is not served from the outage fallback"
    );
}

/// A master joins the cluster and a key's slot migrates to it. Mid-way,
/// process A reads the key through `ASK` from the new master (which A does
/// not track: `ASK` does not change A's slot map); then the migration ends
/// and another process deletes the key there. A must load it again: A
/// used to keep the value read through `ASK` in its L1, and no push from
/// the new master ever reached it, so it answered the deleted value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_read_through_ask_from_an_untracked_master_is_not_kept() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let urls = as_users(&cluster);
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let ns = unique_ns("ask");
    let a = cache(&ns, RedisBackend::connect_cluster(&urls).await.unwrap());
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "moving";
    let value_key = FillKeys::new(&ns, key).value().to_owned();
    fetch(&a, key, &loads).await;
    until_l1_serves(&a, key, &loads).await;

    // A fourth master joins, with no slot yet.
    let joining = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "5000",
    ]);
    acl::node_url(&joining, "l1-*", true);
    let source = cluster.node_for_key(&value_key);
    joining.command(&["CLUSTER", "MEET", "127.0.0.1", &source.port().to_string()]);
    let joined = || {
        cluster.nodes().iter().all(|node| {
            node.command(&["CLUSTER", "NODES"])
                .contains(&format!(":{}@", joining.port()))
        }) && joining
            .command(&["CLUSTER", "INFO"])
            .contains("cluster_state:ok")
    };
    for _ in 0..500 {
        if joined() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(joined(), "the fourth master joined");

    // The key's slot migrates to it; mid-way, A reads the key through ASK.
    let slot = cluster.slot_of(&value_key);
    cluster.begin_migration(slot, source, &joining);
    let invalidations = a.stats().l1_invalidations;
    cluster.migrate_keys(source, &joining, &[&value_key]);
    // The source's push for the key it gave away reaches A first.
    while a.stats().l1_invalidations == invalidations {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (read, _) = fetch(&a, key, &loads).await;
    assert_eq!(read, "loaded-1", "read through ASK");

    // The migration ends; another process deletes the key on the new
    // master (a raw client: a write through onefill in this test's process
    // would reach A's L1 directly).
    cluster.end_migration(slot, &joining, &[&joining]);
    joining.command(&["DEL", &value_key]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        fetch(&a, key, &loads).await,
        ("loaded-2".into(), Outcome::Loaded),
        "A loads the deleted key, not its copy of the value read through ASK"
    );
}

/// Two caches of one namespace in one process (on two backends), B with a
/// smaller L1: B reads a key, A `set`s one key and `invalidate`s another,
/// then the server hangs. B's outage fallback must not answer what A's
/// writes replaced. It did, as `Stale`, for the TTL read with the values
/// (60 s), every time, while only a cache's own writes reached its
/// fallback (A's reached B's L1 alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_caches_write_reaches_the_outage_fallback_too() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("sameproc-fallback");
    let a = cache(&ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    let b = Cache::builder()
        .namespace(&ns)
        .backend(RedisBackend::connect(&as_user(&server)).await.unwrap())
        .l1(L1::new(10))
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    // Each key loaded, then read back: the read is what the fallback keeps
    // (the load's own fill is reported as a change, so its flight keeps
    // nothing, as the L1 does not).
    let mut before = Vec::new();
    for key in ["set", "invalidated"] {
        fetch(&b, key, &loads).await;
        let (value, outcome) = fetch(&b, key, &loads).await;
        assert_eq!(outcome, Outcome::Hit, "{key}");
        before.push(value);
    }
    let [set_before, invalidated_before] = <[String; 2]>::try_from(before).unwrap();
    a.set(&"set".to_owned(), "from-a".into()).await.unwrap();
    a.invalidate(&"invalidated".to_owned()).await.unwrap();
    server.pause();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after_set = fetch(&b, "set", &loads).await;
    let after_invalidate = fetch(&b, "invalidated", &loads).await;
    server.resume();
    assert_ne!(
        after_set.0, set_before,
        "{after_set:?}: the value A's set replaced"
    );
    assert_ne!(
        after_invalidate.0, invalidated_before,
        "{after_invalidate:?}: the value A invalidated"
    );
}

/// Two caches of one namespace in one process: B's flight for a key is
/// loading when A `set`s the key. A call on B made after the `set` returned
/// must answer A's value, not join B's flight from before the write. It
/// joined, and answered B's load (whose fill the `set` fenced out, so the
/// server never held it), every time, while a cache detached only its own
/// flights on its own writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_after_another_caches_write_never_joins_a_flight_from_before_it() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("sameproc-flight");
    let a = cache(&ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    let b = Arc::new(cache(
        &ns,
        RedisBackend::connect(&as_user(&server)).await.unwrap(),
    ));
    let key = "k".to_owned();
    // The load is under way until A's write is done.
    let (written_tx, written_rx) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let loading = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            b.fetch(&key, move |_| async move {
                let _ = started_tx.send(());
                let _ = written_rx.await;
                Ok::<_, std::io::Error>("loaded before the write".to_owned())
            })
            .await
            .unwrap()
        })
    };
    // B's flight holds the lease (its load started) before A writes.
    started_rx.await.expect("B's load started");
    a.set(&key, "from-a".into()).await.unwrap();
    let after = b.fetch(&key, |_| async {
        Ok::<_, std::io::Error>("loaded after the write".to_owned())
    });
    let after = tokio::time::timeout(Duration::from_millis(500), after).await;
    let _ = written_tx.send(());
    let _ = loading.await;
    let after = after
        .expect("the call made after A's write joined B's flight from before it (still loading)")
        .unwrap();
    assert_eq!(after.value, "from-a", "{after:?}");
}

/// Another client deletes a key; the push reaches the L1 (which drops it);
/// then the server hangs. The outage fallback must not answer the value
/// the process heard was deleted. It did, as `Stale`, for the TTL read with
/// it (60 s), every time, while pushes reached the L1 only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outage_fallback_never_answers_a_value_whose_deletion_was_pushed() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("pushed-fallback");
    let c = cache(&ns, RedisBackend::connect(&as_user(&server)).await.unwrap());
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k";
    let value_key = FillKeys::new(&ns, key).value().to_owned();
    fetch(&c, key, &loads).await;
    let old = until_l1_serves(&c, key, &loads).await;
    let invalidations = c.stats().l1_invalidations;
    server.command(&["DEL", &value_key]);
    while c.stats().l1_invalidations == invalidations {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.pause();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = fetch(&c, key, &loads).await;
    server.resume();
    assert_ne!(
        answer.0, old,
        "{answer:?}: the value deleted before the outage"
    );
}

/// A manual failover (`CLUSTER FAILOVER` on the replica), after which the
/// old master, a replica now, cannot replicate from the new one (its link
/// cut, its `PSYNC` refused), while it still answers this process. Another
/// client deletes the key on the new master. The L1 must stop answering
/// the deleted value within the sync bound. While the old master's `PING`s
/// confirmed the L1 (L1 hits send nothing, so no `MOVED` taught the router
/// the new master), it answered the deleted value for the whole 3 s
/// watched, and with replication intact for milliseconds after the `DEL`,
/// until the old master had replicated it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_stops_the_l1_until_the_new_master_is_tracked() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start_with_replicas(3, 1);
    let urls = as_users(&cluster);
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let ns = unique_ns("failover");
    let a = cache(&ns, RedisBackend::connect_cluster(&urls).await.unwrap());
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k";
    let value_key = FillKeys::new(&ns, key).value().to_owned();
    fetch(&a, key, &loads).await;
    let old = until_l1_serves(&a, key, &loads).await;

    let master = cluster.node_for_key(&value_key);
    let replica = cluster.replicas_of(master)[0];
    let replicated = || {
        replica
            .command(&["INFO", "replication"])
            .contains("master_link_status:up")
    };
    for _ in 0..500 {
        if replicated() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    replica.command(&["CLUSTER", "FAILOVER"]);
    let switched = || {
        replica.command(&["ROLE"]).starts_with("master")
            && master
                .command(&["INFO", "replication"])
                .contains("master_link_status:up")
    };
    for _ in 0..1_000 {
        if switched() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(switched(), "the replica took over");
    // The old master can no longer replicate from the new one.
    replica.command(&["ACL", "SETUSER", "default", "-psync", "-sync"]);
    replica.command(&["CLIENT", "KILL", "TYPE", "replica"]);
    replica.command(&["DEL", &value_key]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answer = fetch(&a, key, &loads).await;
    assert_ne!(
        answer.0, old,
        "{answer:?}: the value deleted on the new master"
    );
}
