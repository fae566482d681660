//! Review probes of the batch call on a private redis-server: a server
//! frozen (SIGSTOP) under a batch, at the read and during the fills.

mod batch_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use batch_support::Origin;
use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::{Cache, CallOptions, LeaseToken, Outcome};
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
    let ns = unique_ns("review");
    let cache = cache(&server, &ns).await;
    let origin = Origin::default();
    let wanted = keys(50);
    server.pause();
    let started = Instant::now();
    let answers = cache
        .fetch_many(
            &wanted,
            &CallOptions::new(),
            origin.loader(Duration::ZERO, &[]),
        )
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
    let ns = unique_ns("review");
    let cache = cache(&server, &ns).await;
    let wanted = keys(20);
    let freezer = server.clone();
    let started = Instant::now();
    let answers = cache
        .fetch_many(&wanted, &CallOptions::new(), move |keys: Vec<String>| {
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
