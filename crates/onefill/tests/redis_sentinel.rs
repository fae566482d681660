//! A backend under Redis Sentinel, on a private primary, 2 replicas and 3
//! sentinels: it finds the primary, and after a failover (graceful, a
//! killed primary, a frozen one) its commands, its fill notifications and
//! its L1 all follow the new primary. The loads and answers of a fleet
//! through a failover are measured by the CLI's `sentinel_failover` test.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onefill::redis::{RedisBackend, RedisOptions, SentinelOptions};
use onefill::{BackendErrorKind, Cache, L1};
use onefill_testkit::{time_limit, RedisSentinel, RedisServer};

/// A sentinel set-up forms in a few seconds and a failover takes a few
/// more; past this a test hangs.
const LIMIT: Duration = Duration::from_secs(120);

/// How long the sentinels may take to promote a replica (1 s to call a
/// killed primary down, then the election).
const PROMOTION: Duration = Duration::from_secs(30);

fn unique_ns(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "sentinel-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn connect(kit: &RedisSentinel) -> RedisBackend {
    let urls = kit.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisBackend::connect_sentinel(&urls, kit.master_name())
        .await
        .expect("connects through the sentinels")
}

fn cache(ns: &str, backend: RedisBackend, l1: bool) -> Cache<String, String> {
    let builder = Cache::builder()
        .namespace(ns)
        .backend(backend)
        .ttl(Duration::from_secs(60));
    let builder = if l1 {
        builder.l1(L1::new(1_000))
    } else {
        builder
    };
    builder.build().unwrap()
}

/// Sets `key` to `value` through `cache` until a call succeeds (calls
/// during the failover may fail), at most `PROMOTION`.
async fn set_until_ok(cache: &Cache<String, String>, key: &str, value: &str) {
    let started = Instant::now();
    loop {
        match cache.set(&key.to_owned(), value.to_owned()).await {
            Ok(()) => return,
            Err(e) if started.elapsed() < PROMOTION => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("set still fails {PROMOTION:?} after the fault: {e}"),
        }
    }
}

/// Whether `node` holds `key` of `ns` (its raw value key).
fn holds(node: &RedisServer, ns: &str, key: &str) -> bool {
    let keys = onefill::backend::FillKeys::new(ns, key);
    node.command(&["EXISTS", keys.value()]) == "1"
}

/// Reads `key` until the L1 answers (its tracking connection confirmed),
/// at most 10 s.
async fn until_l1_serves(cache: &Cache<String, String>, key: &str) {
    for _ in 0..1_000 {
        let before = cache.stats().l1_hits;
        let _ = cache
            .get_or_load(&key.to_owned(), |_| async {
                Ok::<_, std::io::Error>("loaded".to_owned())
            })
            .await;
        if cache.stats().l1_hits > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the L1 never served {key}");
}

/// What each fault does to the primary.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Failover,
    Kill,
    Hang,
}

/// After `fault`, a write through the backend lands on the new primary,
/// and the L1 of the process serves what the new primary holds, not what
/// it kept from the old one.
async fn writes_and_the_l1_follow(fault: Fault) {
    let kit = RedisSentinel::start();
    let ns = unique_ns(&format!("{fault:?}"));
    let writer = cache(&ns, connect(&kit).await, true);
    set_until_ok(&writer, "k", "before").await;
    until_l1_serves(&writer, "k").await;
    let resets = writer.stats().l1_resets;
    let old = kit.primary().port();

    match fault {
        Fault::Failover => kit.failover(),
        Fault::Kill => kit.kill_primary(),
        Fault::Hang => {
            kit.pause_primary();
        }
    }
    let (new, _) = wait_new_primary(&kit, old);

    // A write after the promotion lands on the new primary.
    set_until_ok(&writer, "k", "after").await;
    let primary = kit.node_with_port(new).expect("one of ours");
    assert!(
        holds(primary, &ns, "k"),
        "after {fault:?}, the write did not land on the new primary"
    );

    // The L1 was emptied when the primary changed (what the old primary
    // acknowledged may be lost), and serves again, tracking the new one.
    until_l1_serves(&writer, "k").await;
    assert!(
        writer.stats().l1_resets > resets,
        "after {fault:?}, the L1 was not emptied when the primary changed"
    );

    // Another process, on the new primary directly, changes the value:
    // this process's L1 must not keep serving what it had.
    let other = cache(
        &ns,
        RedisBackend::connect(&primary.url()).await.unwrap(),
        false,
    );
    other
        .set(&"k".to_owned(), "other".to_owned())
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let seen = writer.get(&"k".to_owned()).await.ok().flatten();
        if seen.as_deref() == Some("other") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "after {fault:?}, this process still answers {seen:?} for a value the new \
             primary changed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    kit.resume();
}

/// Waits for the sentinels to name a primary other than `old` (the kit
/// polls them, blocking: the runtime's other worker runs the backend).
fn wait_new_primary(kit: &RedisSentinel, old: u16) -> (u16, Duration) {
    tokio::task::block_in_place(|| kit.wait_for_new_primary(old, PROMOTION))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_failover_is_followed() {
    let _limit = time_limit(LIMIT);
    writes_and_the_l1_follow(Fault::Failover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_followed() {
    let _limit = time_limit(LIMIT);
    writes_and_the_l1_follow(Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_is_followed() {
    let _limit = time_limit(LIMIT);
    writes_and_the_l1_follow(Fault::Hang).await;
}

/// A waiter's fill notification comes through the new primary: the
/// subscriber moved with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fill_notifications_follow_the_primary() {
    let _limit = time_limit(LIMIT);
    let kit = RedisSentinel::start();
    let ns = unique_ns("notify");
    let a = cache(&ns, connect(&kit).await, false);
    let b = cache(&ns, connect(&kit).await, false);
    let old = kit.primary().port();
    kit.failover();
    wait_new_primary(&kit, old);
    // Both processes on the new primary.
    set_until_ok(&a, "warm", "up").await;
    set_until_ok(&b, "warm", "up").await;

    // `a` loads slowly; `b` joins and must be woken by `a`'s fill, well
    // before its safety poll.
    let loads = Arc::new(AtomicUsize::new(0));
    let slow = {
        let a = a.clone();
        let loads = loads.clone();
        tokio::spawn(async move {
            a.get_or_load(&"k".to_owned(), move |_| async move {
                loads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, std::io::Error>("filled".to_owned())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fetched = b
        .fetch(&"k".to_owned(), |_| async {
            Ok::<_, std::io::Error>("second load".to_owned())
        })
        .await
        .unwrap();
    assert_eq!(
        fetched.value,
        "filled",
        "the waiter loaded on its own: waiter {:?}, holder {:?}",
        b.stats(),
        a.stats()
    );
    assert_eq!(slow.await.unwrap().unwrap(), "filled");
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    let stats = b.stats();
    assert_eq!(
        stats.wait_notified, 1,
        "the waiter was not woken by the fill notification: {stats:?}"
    );
}

#[tokio::test]
async fn bad_sentinel_input_is_a_typed_error() {
    let _limit = time_limit(LIMIT);
    let empty = RedisBackend::connect_sentinel(&[], "m").await.unwrap_err();
    assert_eq!(empty.kind(), BackendErrorKind::Command, "{empty}");
    let bad_url = RedisBackend::connect_sentinel(&["not a url"], "m")
        .await
        .unwrap_err();
    assert_eq!(bad_url.kind(), BackendErrorKind::Command, "{bad_url}");

    // Nobody listens there: a connection error, within the connect's
    // bounded time.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let options = SentinelOptions::new().redis_options(
        RedisOptions::new()
            .connection_timeout(Duration::from_millis(200))
            .response_timeout(Duration::from_millis(200))
            .reconnect_retries(0),
    );
    let nobody =
        RedisBackend::connect_sentinel_with(&[&format!("redis://127.0.0.1:{port}")], "m", options)
            .await
            .unwrap_err();
    assert!(nobody.is_transient(), "{nobody}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_master_name_is_a_clear_error() {
    let _limit = time_limit(LIMIT);
    let kit = RedisSentinel::start();
    let urls = kit.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let err = RedisBackend::connect_sentinel(&urls, "no-such-primary")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Command, "{err}");
    assert!(err.to_string().contains("no-such-primary"), "{err}");
}
