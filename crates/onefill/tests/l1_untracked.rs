//! The L1 on Redis servers that refuse `CLIENT TRACKING` (an ACL user
//! without `client|tracking`, a renamed `CLIENT`): by default it goes on
//! with the changes onefill's writes announce (`Untracked::Announced`),
//! and with `Untracked::Refuse` the cache does not build. Two backends
//! with connections of their own stand for two processes.
//!
//! The onefill writes are checked with a `max_age` of a minute, so that
//! only an announcement can explain seeing them; a foreign write with a
//! short one, which only the age cap can explain.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::{Cache, Loaded, Outcome, Untracked, L1};
use onefill_testkit::{output_within, time_limit, RedisCluster, RedisServer};

/// Cluster tests take seconds each (a 3-master cluster forms in a few).
const LIMIT: Duration = Duration::from_secs(120);

/// A `max_age` no test waits for: a change seen came from an announcement.
const LONG: Duration = Duration::from_secs(60);

fn unique_ns(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "l1u-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A user that may do anything but `CLIENT TRACKING`, on `server`; its URL.
fn untracked_user(server: &RedisServer) -> String {
    let reply = server.command(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">secret",
        "~*",
        "&*",
        "+@all",
        "-client|tracking",
    ]);
    assert!(reply.contains("OK"), "ACL SETUSER: {reply}");
    format!("redis://app:secret@127.0.0.1:{}", server.port())
}

fn cache(ns: &str, backend: RedisBackend, max_age: Duration) -> Cache<String, String> {
    Cache::builder()
        .namespace(ns)
        .backend(backend)
        .l1(L1::new(1_000).untracked(Untracked::Announced { max_age }))
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// One call; the loader answers `loaded-<n>` (tagged `tags`) and counts.
async fn fetch_tagged(
    cache: &Cache<String, String>,
    key: &str,
    tags: &[&str],
    loads: &Arc<AtomicUsize>,
) -> (String, Outcome) {
    let loads = loads.clone();
    let tags: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
    let f = cache
        .fetch(&key.to_owned(), move |_| async move {
            let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, std::io::Error>(Loaded::new(format!("loaded-{n}")).tags(tags))
        })
        .await
        .unwrap();
    (f.value, f.outcome)
}

async fn fetch(
    cache: &Cache<String, String>,
    key: &str,
    loads: &Arc<AtomicUsize>,
) -> (String, Outcome) {
    fetch_tagged(cache, key, &[], loads).await
}

/// Calls until the L1 answers (its connection confirmed), at most 5 s.
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
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        if fetch(cache, key, loads).await.0 != old {
            return start.elapsed();
        }
        tokio::task::yield_now().await;
    }
    panic!("{key} still served as {old:?} 2 s after it changed");
}

/// The `CLIENT LIST` lines of `server`'s clients with `field` (`psub=1`).
fn clients_with(server: &RedisServer, field: &str) -> Vec<String> {
    server
        .command(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| line.split(' ').any(|f| f == field))
        .map(str::to_owned)
        .collect()
}

/// No connection tracks keys; `count` are pattern-subscribed.
fn announced_not_tracked(server: &RedisServer, count: usize) {
    let tracking = server
        .command(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| {
            line.split(' ').any(|f| {
                f.strip_prefix("flags=")
                    .is_some_and(|flags| flags.contains('t'))
            })
        })
        .count();
    assert_eq!(tracking, 0, "no tracking connection");
    let subscribed = clients_with(server, "psub=1");
    assert_eq!(
        subscribed.len(),
        count,
        "{subscribed:#?}\n{}",
        server.command(&["CLIENT", "LIST"])
    );
}

/// The environment variable that makes `other_process` act: the URLs
/// (`,`-separated; more than one: a cluster), the namespace, an operation
/// and its key or tag, `|`-separated.
const OTHER: &str = "ONEFILL_L1_UNTRACKED_OTHER";

/// Not a test of its own: another process for the tests of this file,
/// which run this binary again with [`OTHER`] set; it makes one onefill
/// write and exits.
#[test]
#[ignore = "run by the other tests of this file, as another process"]
fn other_process() {
    let Ok(spec) = std::env::var(OTHER) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let [urls, ns, op, arg] = parts[..] else {
        panic!("bad {OTHER}: {spec}");
    };
    let urls: Vec<&str> = urls.split(',').collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backend = if urls.len() > 1 {
            RedisBackend::connect_cluster(&urls).await.unwrap()
        } else {
            RedisBackend::connect(urls[0]).await.unwrap()
        };
        let cache: Cache<String, String> = Cache::builder()
            .namespace(ns)
            .backend(backend)
            .ttl(Duration::from_secs(60))
            .build()
            .unwrap();
        let key = arg.to_owned();
        match op {
            "set" => cache
                .set(&key, format!("set-elsewhere:{key}"))
                .await
                .unwrap(),
            "invalidate" => cache.invalidate(&key).await.unwrap(),
            "expire" => cache.expire(&key).await.unwrap(),
            "invalidate_tag" => cache.invalidate_tag(arg).await.unwrap(),
            "clear" => cache.clear().await.unwrap(),
            other => panic!("unknown operation {other}"),
        }
    });
}

/// `op` on `arg` by another process (see [`other_process`]).
async fn elsewhere(urls: &[String], ns: &str, op: &str, arg: &str) {
    let spec = format!("{}|{ns}|{op}|{arg}", urls.join(","));
    let output = tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "other_process", "--ignored", "--test-threads=1"])
            .env(OTHER, spec);
        output_within(&mut cmd, Duration::from_secs(30))
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the other process failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("1 passed"), "it did not run: {stdout}");
}

/// Every kind of onefill write by another process reaches this one's L1
/// (which cannot track keys), long before its `max_age`.
async fn other_processes_writes_reach_the_l1(urls: &[String], ns: &str, b: &Cache<String, String>) {
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "user:1";
    fetch(b, key, &loads).await;
    let v1 = until_l1_serves(b, key, &loads).await;
    assert_eq!(v1, "loaded-1");

    elsewhere(urls, ns, "set", key).await;
    until_changed(b, key, &v1, &loads).await;
    let set = until_l1_serves(b, key, &loads).await;
    assert_eq!(set, format!("set-elsewhere:{key}"));

    elsewhere(urls, ns, "invalidate", key).await;
    until_changed(b, key, &set, &loads).await;
    let reloaded = until_l1_serves(b, key, &loads).await;

    elsewhere(urls, ns, "expire", key).await;
    until_changed(b, key, &reloaded, &loads).await;
    // (A fill changes a value only where no fresh one is held: every
    // writing script announces, `scripts.rs` checks it.)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_onefill_writes_reach_the_other_l1() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = untracked_user(&server);
    let ns = unique_ns("writes");
    let b = cache(&ns, RedisBackend::connect(&url).await.unwrap(), LONG);
    other_processes_writes_reach_the_l1(&[url], &ns, &b).await;
    announced_not_tracked(&server, 1);
}

/// A server whose `CLIENT` command is renamed away: the driver still
/// connects (it does not need `CLIENT`), and the L1 works on announcements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_with_client_renamed_away() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start_with(&["--rename-command", "CLIENT", ""]);
    let ns = unique_ns("renamed");
    let b = cache(
        &ns,
        RedisBackend::connect(&server.url()).await.unwrap(),
        LONG,
    );
    other_processes_writes_reach_the_l1(&[server.url()], &ns, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_onefill_writes_reach_the_other_l1_on_every_master() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    // ACLs are per node.
    let urls: Vec<String> = cluster.nodes().iter().map(untracked_user).collect();
    let url_refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let ns = unique_ns("cluster");
    let b = cache(
        &ns,
        RedisBackend::connect_cluster(&url_refs).await.unwrap(),
        LONG,
    );
    let loads = Arc::new(AtomicUsize::new(0));
    let mut masters = std::collections::HashSet::new();
    for i in 0..6 {
        let key = format!("spread:{i}");
        masters.insert(
            cluster
                .node_for_key(FillKeys::new(&ns, &key).value())
                .port(),
        );
        fetch(&b, &key, &loads).await;
        let old = until_l1_serves(&b, &key, &loads).await;
        elsewhere(&urls, &ns, "set", &key).await;
        until_changed(&b, &key, &old, &loads).await;
    }
    assert_eq!(masters.len(), 3, "keys on every master");
    other_processes_writes_reach_the_l1(&urls, &ns, &b).await;
    for node in cluster.nodes() {
        // One connection per master.
        announced_not_tracked(node, 1);
    }
}

/// Another client's write is not announced: the entry ends `max_age`
/// after its read, and the write is seen by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_write_is_seen_within_max_age() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = untracked_user(&server);
    let ns = unique_ns("foreign");
    let max_age = Duration::from_millis(300);
    let b = cache(&ns, RedisBackend::connect(&url).await.unwrap(), max_age);
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k";
    let value_key = FillKeys::new(&ns, key).value().to_owned();
    fetch(&b, key, &loads).await;
    let old = until_l1_serves(&b, key, &loads).await;
    server.command(&["DEL", &value_key]);
    let took = until_changed(&b, key, &old, &loads).await;
    assert!(
        took <= max_age + Duration::from_millis(100),
        "a foreign write seen after {took:?}, max_age {max_age:?}"
    );
}

/// The announcement connection is killed and the key deleted in the same
/// server round (the deletion by another client: never announced, and
/// `max_age` is a minute): the L1 stops serving within the sync bound, and
/// is emptied before it serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_announcement_connection_empties_the_l1() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = untracked_user(&server);
    let ns = unique_ns("lost");
    let b = cache(&ns, RedisBackend::connect(&url).await.unwrap(), LONG);
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k";
    let value_key = FillKeys::new(&ns, key).value().to_owned();
    fetch(&b, key, &loads).await;
    let old = until_l1_serves(&b, key, &loads).await;
    let resets = b.stats().l1_resets;

    let subscribed = clients_with(&server, "psub=1");
    assert_eq!(subscribed.len(), 1, "{subscribed:?}");
    let id = subscribed[0]
        .split(' ')
        .find_map(|f| f.strip_prefix("id="))
        .unwrap()
        .to_owned();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::pipe()
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&id)
        .ignore()
        .cmd("DEL")
        .arg(&value_key)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    // Past the sync bound (250 ms), the old value is not served.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..20 {
        assert_ne!(fetch(&b, key, &loads).await.0, old);
    }
    let new = until_l1_serves(&b, key, &loads).await;
    assert_ne!(new, old);
    assert!(b.stats().l1_resets > resets, "emptied on reconnect");
}

/// A mark (`invalidate_tag`, `clear`) by another process reaches this
/// one's L1 and marks through the mark script's announcement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marks_reach_the_other_process() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = untracked_user(&server);
    let ns = unique_ns("marks");
    let b = cache(&ns, RedisBackend::connect(&url).await.unwrap(), LONG);
    let loads = Arc::new(AtomicUsize::new(0));
    let (tagged, _) = fetch_tagged(&b, "p1", &["seller:7"], &loads).await;
    let (untagged, _) = fetch_tagged(&b, "p2", &[], &loads).await;
    assert_eq!(until_l1_serves(&b, "p1", &loads).await, tagged);
    assert_eq!(until_l1_serves(&b, "p2", &loads).await, untagged);
    let urls = [url];

    elsewhere(&urls, &ns, "invalidate_tag", "seller:7").await;
    let start = Instant::now();
    while b.get("p1").await.unwrap().as_deref() == Some(tagged.as_str()) {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "p1 still answered 2 s after the mark"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(b.get("p2").await.unwrap(), Some(untagged.clone()));

    let untagged = until_l1_serves(&b, "p2", &loads).await;
    elsewhere(&urls, &ns, "clear", "-").await;
    let start = Instant::now();
    while b.get("p2").await.unwrap().as_deref() == Some(untagged.as_str()) {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "p2 still answered 2 s after the clear"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `Untracked::Refuse`: the backend learnt of the refusal when it
/// connected, so the cache does not build, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_fails_the_build() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = untracked_user(&server);
    let built = Cache::<String, String>::builder()
        .namespace(unique_ns("refuse"))
        .backend(RedisBackend::connect(&url).await.unwrap())
        .l1(L1::new(100).untracked(Untracked::Refuse))
        .build();
    let Err(error) = built else {
        panic!("built on a server that refuses tracking");
    };
    let error = error.to_string();
    assert!(error.contains("l1"), "{error}");
    assert!(error.contains("client tracking"), "{error}");
    assert!(error.contains("Untracked::Refuse"), "{error}");
    // A server that tracks builds the same configuration.
    let tracked = RedisServer::start();
    Cache::<String, String>::builder()
        .namespace(unique_ns("refuse"))
        .backend(RedisBackend::connect(&tracked.url()).await.unwrap())
        .l1(L1::new(100).untracked(Untracked::Refuse))
        .build()
        .expect("tracked: built");
}

/// A user whose `client|tracking` is taken away after the backend
/// connected (the backend's own question found it allowed): the tracking
/// connection meets the refusal, and the L1 goes on with announcements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_met_later_switches_to_announcements() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = untracked_user(&server);
    server.command(&["ACL", "SETUSER", "app", "+client|tracking"]);
    let ns = unique_ns("later");
    let backend = RedisBackend::connect(&url).await.unwrap();
    server.command(&["ACL", "SETUSER", "app", "-client|tracking"]);
    let b = cache(&ns, backend, LONG);
    other_processes_writes_reach_the_l1(&[url], &ns, &b).await;
    announced_not_tracked(&server, 1);
}

/// The same with `Untracked::Refuse`: the cache was built (nothing was
/// known then), and its L1 never serves; calls go to the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_met_later_never_serves() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = untracked_user(&server);
    server.command(&["ACL", "SETUSER", "app", "+client|tracking"]);
    let backend = RedisBackend::connect(&url).await.unwrap();
    server.command(&["ACL", "SETUSER", "app", "-client|tracking"]);
    let b = Cache::<String, String>::builder()
        .namespace(unique_ns("refuse-later"))
        .backend(backend)
        .l1(L1::new(100).untracked(Untracked::Refuse))
        .build()
        .expect("nothing known yet");
    let loads = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        assert_eq!(fetch(&b, "k", &loads).await.0, "loaded-1");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(b.stats().l1_hits, 0, "never served from the L1");
    assert_eq!(
        clients_with(&server, "psub=1").len(),
        0,
        "no announcement connection"
    );
}

/// A hung server: the L1 on announcements stops serving within the sync
/// bound, as with tracking (the same `PING` confirms it), and serves again
/// once the server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_stops_the_l1_within_the_bound() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = untracked_user(&server);
    let ns = unique_ns("hung");
    let b = cache(&ns, RedisBackend::connect(&url).await.unwrap(), LONG);
    let loads = Arc::new(AtomicUsize::new(0));
    fetch(&b, "k", &loads).await;
    until_l1_serves(&b, "k", &loads).await;
    // The announcement of the load's own fill may come late and drop the
    // entry: the read that follows keeps it again.
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

/// Another client deletes the key (never announced), then the server hangs
/// past `max_age`: the outage fallback does not answer the deleted value
/// either (it keeps a copy no longer than the L1 would); the call loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outage_fallback_keeps_no_copy_past_max_age() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = untracked_user(&server);
    let ns = unique_ns("outage");
    let max_age = Duration::from_millis(300);
    let b = cache(&ns, RedisBackend::connect(&url).await.unwrap(), max_age);
    let loads = Arc::new(AtomicUsize::new(0));
    let key = "k";
    let value_key = FillKeys::new(&ns, key).value().to_owned();
    fetch(&b, key, &loads).await;
    until_l1_serves(&b, key, &loads).await;
    // The last read the fallback kept began before this.
    let read_before = Instant::now();
    server.command(&["DEL", &value_key]);
    server.pause();
    tokio::time::sleep_until((read_before + max_age + Duration::from_millis(20)).into()).await;
    let answer = fetch(&b, key, &loads).await;
    server.resume();
    assert_eq!(
        answer,
        ("loaded-2".into(), Outcome::Degraded),
        "the deleted value is not served from the outage fallback"
    );
}

/// `INFO commandstats` of `server`, as `(command, calls, usec)`, less
/// `info` and `config` (the measurement's own).
fn commandstats(server: &RedisServer) -> Vec<(String, u64, u64)> {
    server
        .command(&["INFO", "commandstats"])
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("cmdstat_")?;
            let (name, fields) = rest.split_once(':')?;
            let field = |f: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0) as u64
            };
            Some((name.to_owned(), field("calls"), field("usec")))
        })
        .filter(|(name, _, _)| !name.starts_with("info") && !name.starts_with("config"))
        .collect()
}

/// `INFO commandstats` summed over `servers`.
fn commandstats_of(servers: &[&RedisServer]) -> Vec<(String, u64, u64)> {
    let mut all: Vec<(String, u64, u64)> = Vec::new();
    for server in servers {
        for (name, calls, usec) in commandstats(server) {
            match all.iter_mut().find(|(n, _, _)| *n == name) {
                Some(entry) => {
                    entry.1 += calls;
                    entry.2 += usec;
                }
                None => all.push((name, calls, usec)),
            }
        }
    }
    all.sort();
    all
}

/// A measurement, not a check (run with `--ignored --nocapture`): the
/// servers' commands for 1000 `set`s, 1000 `invalidate`s and 1000 calls
/// of one key of one process, on servers that track and on servers that
/// refuse (the L1 on announcements), with another process's L1 listening;
/// and for the same calls by an L1 that never serves (tracking refused,
/// `Refuse` met late: what every L1 on such a server did before
/// announcements).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints INFO commandstats"]
async fn measure_commands_per_write_and_hit() {
    let _limit = time_limit(LIMIT);
    const N: usize = 1000;
    async fn connect(urls: &[String]) -> RedisBackend {
        if urls.len() > 1 {
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            RedisBackend::connect_cluster(&urls).await.unwrap()
        } else {
            RedisBackend::connect(&urls[0]).await.unwrap()
        }
    }
    fn reset(servers: &[&RedisServer]) {
        for server in servers {
            server.command(&["CONFIG", "RESETSTAT"]);
        }
    }
    async fn run(label: &str, servers: &[&RedisServer], urls: &[String], untracked: Untracked) {
        let ns = unique_ns("measure");
        let cache_of = |backend| {
            Cache::<String, String>::builder()
                .namespace(&ns)
                .backend(backend)
                .l1(L1::new(10_000).untracked(untracked))
                .ttl(Duration::from_secs(60))
                .build()
                .unwrap()
        };
        let writer = cache_of(connect(urls).await);
        let _listener = cache_of(connect(urls).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let keys: Vec<String> = (0..N).map(|i| format!("k{i}")).collect();
        reset(servers);
        for key in &keys {
            writer.set(key, "v".into()).await.unwrap();
        }
        println!("{label}: {N} sets: {:?}", commandstats_of(servers));
        reset(servers);
        for key in &keys {
            writer.invalidate(key).await.unwrap();
        }
        println!("{label}: {N} invalidates: {:?}", commandstats_of(servers));
        let load = |_: String| async { Ok::<_, std::io::Error>("v".to_owned()) };
        writer.get_or_load(&keys[0], load).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        reset(servers);
        let hits = writer.stats().l1_hits;
        for _ in 0..N {
            writer.get_or_load(&keys[0], load).await.unwrap();
        }
        println!(
            "{label}: {N} calls of one key ({} L1 hits): {:?}",
            writer.stats().l1_hits - hits,
            commandstats_of(servers)
        );
    }
    let tracked = RedisServer::start();
    run(
        "standalone tracked",
        &[&tracked],
        &[tracked.url()],
        Untracked::default(),
    )
    .await;
    let refusing = RedisServer::start();
    let url = untracked_user(&refusing);
    run(
        "standalone announced",
        &[&refusing],
        &[url],
        Untracked::default(),
    )
    .await;
    let cluster = RedisCluster::start(3);
    let nodes: Vec<&RedisServer> = cluster.nodes().iter().collect();
    run(
        "cluster tracked",
        &nodes,
        &cluster.urls(),
        Untracked::default(),
    )
    .await;
    let urls: Vec<String> = cluster.nodes().iter().map(untracked_user).collect();
    run("cluster announced", &nodes, &urls, Untracked::default()).await;

    let late = RedisServer::start();
    let url = untracked_user(&late);
    late.command(&["ACL", "SETUSER", "app", "+client|tracking"]);
    let backend = RedisBackend::connect(&url).await.unwrap();
    late.command(&["ACL", "SETUSER", "app", "-client|tracking"]);
    let never = Cache::<String, String>::builder()
        .namespace(unique_ns("never"))
        .backend(backend)
        .l1(L1::new(100).untracked(Untracked::Refuse))
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let load = |_: String| async { Ok::<_, std::io::Error>("v".to_owned()) };
    never.get_or_load("k", load).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    reset(&[&late]);
    for _ in 0..N {
        never.get_or_load("k", load).await.unwrap();
    }
    println!(
        "never serving: {N} calls of one key ({} L1 hits): {:?}",
        never.stats().l1_hits,
        commandstats(&late)
    );
    let plain = Cache::<String, String>::builder()
        .namespace(unique_ns("no-l1"))
        .backend(RedisBackend::connect(&late.url()).await.unwrap())
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    plain.get_or_load("k", load).await.unwrap();
    reset(&[&late]);
    for _ in 0..N {
        plain.get_or_load("k", load).await.unwrap();
    }
    println!("no L1: {N} calls of one key: {:?}", commandstats(&late));
}
