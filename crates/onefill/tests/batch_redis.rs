//! The batch call on real Redis (private servers from the testkit):
//! separate `Cache` + `RedisBackend` instances, each with its own
//! connections, stand for processes. Round trips are counted as backend
//! calls (a counting wrapper: each call is one request and its reply, a
//! pipeline for the batch methods) and checked against the server's own
//! `INFO commandstats`.

mod batch_support;

use std::collections::HashMap;
use std::time::Duration;

use batch_support::{count_calls, Counting, Counts, Origin};
use onefill::backend::{Acquired, Backend, FillKeys, LeaseRequest};
use onefill::redis::RedisBackend;
use onefill::{Cache, LeaseToken, Outcome};
use onefill_testkit::{time_limit, RedisCluster, RedisServer};

/// Cluster tests take seconds each (a 3-master cluster forms in a few); past this they hang.
const LIMIT: Duration = Duration::from_secs(120);

fn unique_ns(name: &str) -> String {
    format!("{name}-{}", &LeaseToken::random().as_str()[..8])
}

/// `calls=` of each command in the server's `INFO commandstats`.
fn commandstats(node: &RedisServer) -> HashMap<String, u64> {
    node.command(&["INFO", "commandstats"])
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("k{i}")).collect()
}

async fn process(
    backend: RedisBackend,
    ns: &str,
) -> (Cache<String, String>, Counting<RedisBackend>) {
    let counting = count_calls(backend);
    let cache = Cache::builder()
        .namespace(ns)
        .backend(counting.clone())
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    (cache, counting)
}

/// The batch's herd: 4 processes × the same 100 cold keys, at once.
async fn four_processes(processes: &[(Cache<String, String>, Counting<RedisBackend>)]) -> Origin {
    let origin = Origin::default();
    let wanted = keys(100);
    let calls: Vec<_> = processes
        .iter()
        .map(|(cache, _)| {
            let cache = cache.clone();
            let wanted = wanted.clone();
            let loader = origin.loader(Duration::from_millis(50), &[]);
            tokio::spawn(async move { cache.get_or_load_many(&wanted, loader).await })
        })
        .collect();
    for call in calls {
        let found = call.await.unwrap().unwrap();
        assert_eq!(found.len(), 100);
        assert!(wanted.iter().all(|k| found[k] == format!("v{k}")));
    }
    let per_key = origin.loads_per_key();
    assert_eq!(per_key.len(), 100);
    assert!(per_key.values().all(|n| *n == 1), "{per_key:?}");
    assert!(origin.calls() <= 4, "{} loader calls", origin.calls());
    for (i, (_, counting)) in processes.iter().enumerate() {
        eprintln!("cold, process {i}: {:?}", counting.faults());
        // Read, lease requests and the wait's re-checks all batched: no
        // key went through a single-key read or lease request.
        assert_eq!(
            counting.of("get") + counting.of("acquire"),
            0,
            "{:?}",
            counting.faults()
        );
    }
    origin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_load_100_cold_keys_once_fleet_wide_standalone() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("batch");
    let mut processes = Vec::new();
    for _ in 0..4 {
        let backend = RedisBackend::connect(&server.url()).await.unwrap();
        processes.push(process(backend, &ns).await);
    }
    let origin = four_processes(&processes).await;

    // The hit path: one round trip per process (one pipeline of
    // GET + PTTL for the 100 keys), nothing else on the server.
    let before = commandstats(&server);
    for (cache, counting) in &processes {
        counting.reset();
        let answers = cache
            .fetch_many(&keys(100), origin.loader(Duration::ZERO, &[]))
            .await
            .unwrap();
        assert!(answers
            .values()
            .all(|a| a.as_ref().unwrap().outcome == Outcome::Hit));
        assert_eq!(counting.round_trips(), 1, "{:?}", counting.faults());
        assert_eq!(counting.of("get_many"), 1);
    }
    let after = commandstats(&server);
    let delta = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    assert_eq!((delta("get"), delta("pttl")), (400, 400));
    assert_eq!(delta("evalsha") + delta("eval"), 0);
    assert!(origin.calls() <= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_load_100_cold_keys_once_fleet_wide_on_a_cluster() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let ns = unique_ns("batch");
    let mut processes = Vec::new();
    for _ in 0..4 {
        let backend = RedisBackend::connect_cluster(&urls).await.unwrap();
        processes.push(process(backend, &ns).await);
    }
    let origin = four_processes(&processes).await;

    // The hit path: one pipeline per master (3), in parallel.
    for (cache, counting) in &processes {
        counting.reset();
        let found = cache
            .get_or_load_many(&keys(100), origin.loader(Duration::ZERO, &[]))
            .await
            .unwrap();
        assert_eq!(found.len(), 100);
        assert!(counting.round_trips() <= 3, "{:?}", counting.faults());
    }
    assert!(origin.calls() <= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batch_steps_answer_each_key_and_survive_a_script_flush() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&server.url()).await.unwrap();
    let ns = unique_ns("steps");
    let k = |s: &str| FillKeys::new(&ns, s);
    // "held": someone's lease; "fresh": a value; "free": nothing.
    server.command(&["SET", k("held").lock(), "someone", "PX", "60000"]);
    let cache: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(backend.clone())
        .build()
        .unwrap();
    cache
        .set(&"fresh".to_owned(), "v".to_owned())
        .await
        .unwrap();
    server.command(&["SCRIPT", "FLUSH"]);

    let requests: Vec<LeaseRequest> = ["held", "fresh", "free"]
        .iter()
        .map(|s| LeaseRequest::new(k(s), LeaseToken::random(), Duration::ZERO))
        .collect();
    let answers = backend
        .acquire_many(&requests, Duration::from_secs(5))
        .await;
    assert!(
        matches!(answers[0], Ok(Acquired::Held { .. })),
        "{answers:?}"
    );
    assert!(matches!(answers[1], Ok(Acquired::Fresh(_))), "{answers:?}");
    assert!(
        matches!(answers[2], Ok(Acquired::Won { stale: None })),
        "{answers:?}"
    );
    assert_eq!(
        server.command(&["GET", k("free").lock()]).trim(),
        requests[2].token.as_str()
    );

    let read = backend.get_many(&[k("fresh"), k("free"), k("held")]).await;
    assert!(matches!(&read[0], Ok(Some(s)) if !s.bytes.is_empty()));
    assert!(matches!(read[1], Ok(None)));
    assert!(matches!(read[2], Ok(None)));
}

/// A slot migrating (`ASK`), then moved (`MOVED`), under a batch: the keys
/// whose pipelined command was redirected are sent again alone and
/// followed; a strict cache (backend errors surface) sees no error, and
/// nothing is loaded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_follows_a_migrating_then_moved_slot() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let ns = unique_ns("batch-migrate");
    let backend = RedisBackend::connect_cluster(&urls).await.unwrap();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(backend)
        .strict(true)
        .build()
        .unwrap();
    let origin = Origin::default();
    let wanted = keys(20);
    cache
        .get_or_load_many(&wanted, origin.loader(Duration::ZERO, &[]))
        .await
        .unwrap();

    let moving = FillKeys::new(&ns, "k0");
    let source = cluster.node_for_key(moving.value());
    let target = cluster
        .nodes()
        .iter()
        .find(|n| n.port() != source.port())
        .unwrap();
    let slot = cluster.slot_of(moving.value());
    cluster.begin_migration(slot, source, target);
    cluster.migrate_keys(source, target, &[moving.value()]);

    // Migrating: the source answers ASK for k0.
    let answers = cache
        .fetch_many(&wanted, origin.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    assert!(
        answers
            .values()
            .all(|a| a.as_ref().unwrap().outcome == Outcome::Hit),
        "{answers:?}"
    );

    // Moved: the source answers MOVED; k0 is gone, so it is read, leased,
    // loaded and filled through the redirection.
    cluster.end_migration(slot, target, &[]);
    target.command(&["DEL", moving.value()]);
    let answers = cache
        .fetch_many(&wanted, origin.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    let k0 = answers["k0"].as_ref().unwrap();
    assert_eq!(
        (k0.value.as_deref(), k0.outcome),
        (Some("vk0"), Outcome::Loaded)
    );
    assert!(
        !target.query(&["GET", moving.value()]).is_nil(),
        "filled on the new master"
    );
    assert_eq!(origin.loads_per_key().get("k0"), Some(&2));
    assert_eq!(cache.stats().backend_errors, 0, "{:?}", cache.stats());
}

/// A batch against a SIGSTOPped server: bounded by the backend timeout, and
/// no lease left behind.
mod frozen_server {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::batch_support::Origin;
    use onefill::backend::FillKeys;
    use onefill::redis::RedisBackend;
    use onefill::{Cache, LeaseToken, Outcome};
    use onefill_testkit::{time_limit, RedisServer};

    /// A test on private servers takes seconds; past this it hangs.
    const LIMIT: Duration = Duration::from_secs(60);

    fn unique_ns(name: &str) -> String {
        format!("{name}-{}", &LeaseToken::random().as_str()[..8])
    }

    fn keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("k{i}")).collect()
    }

    async fn cache(server: &RedisServer, ns: &str) -> Cache<String, String> {
        let backend = RedisBackend::connect(&server.url()).await.unwrap();
        Cache::builder()
            .namespace(ns)
            .backend(backend)
            .backend_timeout(Duration::from_millis(200))
            .ttl(Duration::from_secs(60))
            .no_l1()
            .build()
            .unwrap()
    }

    fn leases_left(server: &RedisServer, ns: &str, wanted: &[String]) -> Vec<String> {
        wanted
            .iter()
            .filter(|k| {
                let lock = FillKeys::new(ns, k).lock().to_owned();
                server.command(&["EXISTS", &lock]).trim() == "1"
            })
            .cloned()
            .collect()
    }

    /// Frozen before the batch: every key is loaded degraded (unstored) within
    /// a bound of the backend timeout, and nothing is leased once the server
    /// runs again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_frozen_server_bounds_the_batch_and_leaves_no_lease() {
        let _limit = time_limit(LIMIT);
        let server = RedisServer::start();
        let ns = unique_ns("frozen");
        let cache = cache(&server, &ns).await;
        let origin = Origin::default();
        let wanted = keys(50);
        server.pause();
        let started = Instant::now();
        let answers = cache
            .fetch_many(&wanted, origin.loader(Duration::ZERO, &[]))
            .await
            .unwrap();
        let took = started.elapsed();
        server.resume();
        assert!(
            answers
                .values()
                .all(|a| a.as_ref().unwrap().outcome == Outcome::Degraded),
            "{answers:?}"
        );
        assert_eq!(origin.calls(), 1, "one load for every key");
        assert!(took < Duration::from_secs(2), "{took:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(leases_left(&server, &ns, &wanted), Vec::<String>::new());
    }

    /// Frozen while the loader runs (after the leases were won): the fills
    /// time out, the batch answers the loaded values within a bound, and once
    /// the server runs again the leases are released or expire with their
    /// TTL, no later.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_frozen_during_the_load_bounds_the_fills_and_the_leases_expire() {
        let _limit = time_limit(LIMIT);
        let server = Arc::new(RedisServer::start());
        let ns = unique_ns("frozen");
        let cache = cache(&server, &ns).await;
        let wanted = keys(20);
        let freezer = server.clone();
        let started = Instant::now();
        let answers = cache
            .fetch_many(&wanted, move |keys: Vec<String>| {
                let freezer = freezer.clone();
                async move {
                    freezer.pause();
                    Ok::<_, std::io::Error>(
                        keys.into_iter()
                            .map(|k| {
                                let v = format!("v{k}");
                                (k, v)
                            })
                            .collect::<Vec<_>>(),
                    )
                }
            })
            .await
            .unwrap();
        let took = started.elapsed();
        server.resume();
        for k in &wanted {
            let answer = answers[k].as_ref().unwrap();
            assert_eq!(answer.value.as_deref(), Some(format!("v{k}").as_str()));
        }
        assert!(took < Duration::from_secs(3), "{took:?}");
        // The releases that timed out are not retried: what is left once the
        // server has answered the queued commands expires with its TTL.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let left = leases_left(&server, &ns, &wanted);
        eprintln!("leases left a second after the resume: {}", left.len());
        for k in &left {
            let lock = FillKeys::new(&ns, k).lock().to_owned();
            let pttl: i64 = server.command(&["PTTL", &lock]).trim().parse().unwrap();
            assert!(
                pttl > 0 && pttl <= 60_000,
                "a lease left has its TTL ({pttl} ms)"
            );
        }
    }
}
