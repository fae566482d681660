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

/// [`connect`] with `options` for every connection.
async fn connect_with(kit: &RedisSentinel, options: RedisOptions) -> RedisBackend {
    let urls = kit.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let options = SentinelOptions::new().redis_options(options);
    RedisBackend::connect_sentinel_with(&urls, kit.master_name(), options)
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
        builder.no_l1()
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

/// Sets `key` through `cache` until the write is seen on `node`: the
/// process writes to that server. Each try writes its own value, so a
/// value written elsewhere and replicated cannot pass for it.
async fn writes_reach(cache: &Cache<String, String>, node: &RedisServer, ns: &str, key: &str) {
    let started = Instant::now();
    for attempt in 0u32.. {
        let value = format!("try {attempt}");
        let _ = cache.set(&key.to_owned(), value.clone()).await;
        let keys = onefill::backend::FillKeys::new(ns, key);
        if node.command(&["GET", keys.value()]).contains(&value) {
            return;
        }
        assert!(
            started.elapsed() < PROMOTION,
            "this process still does not write to the new primary {PROMOTION:?} after the fault"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
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
    let (new, _) = wait_new_primary(&kit, old);
    // Both processes on the new primary before the scenario starts. The
    // sentinels name it before every client has heard: for a moment one
    // process may still write to the old primary, which goes on answering
    // as a master, and two processes would then hold one lease on two
    // servers. That window belongs to Sentinel, not to this test.
    let new = kit
        .node_with_port(new)
        .expect("the new primary is a kit node");
    writes_reach(&a, new, &ns, "warm-a").await;
    writes_reach(&b, new, &ns, "warm-b").await;

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

/// Clients of `server` that no server opened (not a replica's link, not
/// a sentinel's named link) and not the question asking it: a backend's.
fn outside_clients(server: &RedisServer) -> usize {
    server
        .command(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| l.contains(" name= ") && !l.contains("flags=S") && !l.contains("cmd=client"))
        .count()
}

/// A dropped backend (and its cache, its L1 tracking) lets go of the
/// sentinels and the primary at once (a round trip or so, not a ping
/// interval or a periodic look later): its follower and its sentinel
/// listeners end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_backend_leaves_no_connection_behind() {
    let _limit = time_limit(LIMIT);
    let kit = RedisSentinel::start();
    let sentinels_before: Vec<usize> = kit.sentinels().iter().map(outside_clients).collect();
    let primary_before = outside_clients(kit.primary());
    let ns = unique_ns("drop");
    let c = cache(&ns, connect(&kit).await, true);
    set_until_ok(&c, "k", "v").await;
    until_l1_serves(&c, "k").await;
    let sentinels_with: Vec<usize> = kit.sentinels().iter().map(outside_clients).collect();
    assert!(
        sentinels_with
            .iter()
            .zip(&sentinels_before)
            .all(|(with, before)| with > before),
        "the backend holds no connection to each sentinel: {sentinels_with:?} vs {sentinels_before:?}"
    );
    drop(c);
    let started = Instant::now();
    loop {
        let sentinels_now: Vec<usize> = kit.sentinels().iter().map(outside_clients).collect();
        let primary_now = outside_clients(kit.primary());
        if sentinels_now == sentinels_before && primary_now == primary_before {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "2 s after the drop, connections remain: sentinels {sentinels_now:?} (before \
             {sentinels_before:?}), primary {primary_now} (before {primary_before})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A sentinel that hangs (SIGSTOP) does not keep the others' answer from
/// the connect, nor the backend from following a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_sentinel_does_not_hold_the_answer_back() {
    let _limit = time_limit(LIMIT);
    let kit = RedisSentinel::start();
    kit.sentinels()[0].pause();
    let started = Instant::now();
    let backend = connect(&kit).await;
    let connect_took = started.elapsed();
    let ns = unique_ns("hung");
    let c = cache(&ns, backend, false);
    set_until_ok(&c, "k", "before").await;
    let old = kit.primary().port();
    kit.failover();
    let (new, _) = wait_new_primary(&kit, old);
    let promoted = Instant::now();
    let primary = kit.node_with_port(new).expect("one of ours");
    loop {
        let _ = c.set(&"k".to_owned(), "after".to_owned()).await;
        if primary.command(&["EXISTS", onefill::backend::FillKeys::new(&ns, "k").value()]) == "1"
            && holds_value(primary, &ns, "k", "after")
        {
            break;
        }
        assert!(promoted.elapsed() < PROMOTION, "never followed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let follow_took = promoted.elapsed();
    kit.sentinels()[0].resume();
    eprintln!("connect took {connect_took:?}; following took {follow_took:?} after the promotion");
}

/// Whether `node`'s copy of `key` carries `value`.
fn holds_value(node: &RedisServer, ns: &str, key: &str, value: &str) -> bool {
    let keys = onefill::backend::FillKeys::new(ns, key);
    node.command(&["GET", keys.value()]).contains(value)
}

/// A primary killed while calls fail opens its breaker; the new primary
/// is another shard, whose breaker starts closed: calls go through
/// without waiting out the old breaker, and the cache reports closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_primarys_breaker_stays_behind() {
    let _limit = time_limit(LIMIT);
    let kit = RedisSentinel::start();
    let ns = unique_ns("breaker");
    let c: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(connect(&kit).await)
        .ttl(Duration::from_secs(60))
        .circuit_breaker(onefill::CircuitBreaker::new(3, Duration::from_secs(3600)))
        .build()
        .unwrap();
    set_until_ok(&c, "k", "before").await;
    let old = kit.primary().port();
    kit.kill_primary();
    let started = Instant::now();
    while c.circuit_state() != onefill::CircuitState::Open {
        let _ = c.set(&"k".to_owned(), "during".to_owned()).await;
        assert!(started.elapsed() < Duration::from_secs(10), "never opened");
    }
    let (new, _) = wait_new_primary(&kit, old);
    set_until_ok(&c, "k", "after").await;
    assert!(holds_value(
        kit.node_with_port(new).unwrap(),
        &ns,
        "k",
        "after"
    ));
    assert_eq!(c.circuit_state(), onefill::CircuitState::Closed);
}

/// Two failovers in quick succession: the backend ends on the last
/// primary, with a closed breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_failovers_in_a_row_end_on_the_last_primary() {
    let _limit = time_limit(LIMIT);
    let kit = RedisSentinel::start();
    let ns = unique_ns("flap");
    let c = cache(&ns, connect(&kit).await, true);
    set_until_ok(&c, "k", "v0").await;
    let first = kit.primary().port();
    kit.failover();
    let (second, _) = wait_new_primary(&kit, first);
    tokio::task::block_in_place(|| kit.wait_until_ready());
    kit.failover();
    let (third, _) = wait_new_primary(&kit, second);
    let started = Instant::now();
    loop {
        let _ = c.set(&"k".to_owned(), "v2".to_owned()).await;
        if holds_value(kit.node_with_port(third).unwrap(), &ns, "k", "v2") {
            break;
        }
        assert!(started.elapsed() < PROMOTION, "not on the last primary");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("{first} -> {second} -> {third}");
    assert_eq!(c.circuit_state(), onefill::CircuitState::Closed);
    until_l1_serves(&c, "k").await;
}

/// A primary with a password, a sentinel with another one (in its URL):
/// both work, and neither shows in the backend's `Debug` or an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_of_sentinels_and_data_nodes() {
    let _limit = time_limit(LIMIT);
    let primary = RedisServer::start_with(&["--requirepass", "data-secret-1"]);
    let conf = format!(
        "sentinel resolve-hostnames no\n\
         sentinel monitor m 127.0.0.1 {} 1\n\
         sentinel auth-pass m data-secret-1\n\
         requirepass sentinel-secret-2\n",
        primary.port()
    );
    let sentinel = RedisServer::start_sentinel(&conf);
    let url = format!("redis://:sentinel-secret-2@127.0.0.1:{}", sentinel.port());
    let good = SentinelOptions::new().password("data-secret-1");
    let backend = RedisBackend::connect_sentinel_with(&[&url], "m", good)
        .await
        .expect("connects with both passwords");
    let shown = format!("{backend:?}");
    assert!(!shown.contains("secret"), "{shown}");
    let ns = unique_ns("auth");
    let c = cache(&ns, backend, true);
    set_until_ok(&c, "k", "v").await;
    let direct = RedisBackend::connect(&format!(
        "redis://:data-secret-1@127.0.0.1:{}",
        primary.port()
    ))
    .await
    .unwrap();
    let direct = cache(&ns, direct, false);
    assert_eq!(
        direct.get(&"k".to_owned()).await.unwrap().as_deref(),
        Some("v")
    );

    // A wrong data password, a wrong sentinel password: typed errors that
    // do not show either.
    let bad = SentinelOptions::new().password("wrong-secret-3");
    let err = RedisBackend::connect_sentinel_with(&[&url], "m", bad)
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("secret"), "{err}");
    let bad_url = format!("redis://:wrong-secret-4@127.0.0.1:{}", sentinel.port());
    let err = RedisBackend::connect_sentinel_with(&[&bad_url], "m", SentinelOptions::new())
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("secret"), "{err}");
    eprintln!("errors: {err}");
}

/// How many `ROLE` questions `node` has answered: every look of a
/// follower at the sentinels asks the primary they name its role (the
/// sentinels ask `INFO`, and the kit is not asked meanwhile).
fn role_questions(node: &RedisServer) -> u64 {
    node.command(&["INFO", "commandstats"])
        .lines()
        .find(|l| l.starts_with("cmdstat_role:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Calls that time out on a primary that stops answering them (the
/// cache's own timeout, 250 ms by default, shorter than the response
/// timeout, drops them) make the follower look at the sentinels, as a
/// connection failure does: at most every 250 ms, so 3 s of timeouts
/// bring several looks (the one every 5 s regardless adds one at most).
/// Writes are held by `CLIENT PAUSE WRITE`, so the looks' `ROLE` is
/// answered and counted, and the sentinels see nothing wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_make_the_follower_look() {
    let _limit = time_limit(LIMIT);
    let kit = RedisSentinel::start();
    let ns = unique_ns("timeout-look");
    let c: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(connect(&kit).await)
        .ttl(Duration::from_secs(60))
        .circuit_breaker(onefill::CircuitBreaker::disabled())
        .build()
        .unwrap();
    set_until_ok(&c, "k", "v").await;
    let primary = kit.primary();
    // Past the start-up looks (one per sentinel subscription).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = role_questions(primary);
    primary.command(&["CLIENT", "PAUSE", "3000", "WRITE"]);
    let paused = Instant::now();
    let mut timed_out = 0;
    while paused.elapsed() < Duration::from_millis(2_900) {
        if let Err(e) = c.set(&"k".to_owned(), "v".to_owned()).await {
            assert!(e.is_timeout(), "{e}");
            timed_out += 1;
        }
    }
    let looks = role_questions(primary) - before;
    assert!(timed_out >= 5, "{timed_out} calls timed out");
    assert!(
        looks >= 3,
        "{timed_out} calls timed out, yet the follower looked at the sentinels {looks} time(s)"
    );
}

/// A primary the sentinels see down (mid-failover, say) fails the connect
/// with a transient error: retrying is the answer, unlike an unknown name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_seen_down_is_a_transient_error() {
    let _limit = time_limit(LIMIT);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let conf = format!(
        "sentinel resolve-hostnames no\n\
         sentinel monitor m 127.0.0.1 {port} 1\n\
         sentinel down-after-milliseconds m 200\n"
    );
    let sentinel = RedisServer::start_sentinel(&conf);
    // Until the sentinel flags it down.
    let started = Instant::now();
    while !sentinel
        .command(&["SENTINEL", "MASTER", "m"])
        .contains("s_down")
    {
        assert!(started.elapsed() < Duration::from_secs(10), "never s_down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = RedisBackend::connect_sentinel(&[&sentinel.url()], "m")
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{:?}: {err}", err.kind());
}

/// Channels of `ns` that `node` has a subscriber for.
fn subscribed_channels(node: &RedisServer, ns: &str) -> usize {
    node.command(&["PUBSUB", "CHANNELS", "*"])
        .lines()
        .filter(|c| c.contains(ns))
        .count()
}

/// A subscriber that lost a hung primary is reconnecting to it (a
/// stopped server accepts the connection and answers nothing) when the
/// new primary is named: it moves to the new one at once, not when that
/// attempt times out. The long connection timeout makes the difference
/// plain: without the move, the waiters' channels reach the new primary
/// only once the attempt on the old one gives up, 20 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reconnecting_to_a_hung_primary_moves_at_the_promotion() {
    use onefill::Backend as _;
    let _limit = time_limit(LIMIT);
    let kit = RedisSentinel::start();
    let ns = unique_ns("hung-reconnect");
    let options = RedisOptions::new()
        .connection_timeout(Duration::from_secs(20))
        .ping_interval(Duration::from_millis(100));
    let backend = connect_with(&kit, options).await;
    let keys = onefill::backend::FillKeys::new(&ns, "k");
    let _subscription = backend.subscribe(&keys).await.expect("subscribes");
    let old = kit.primary();
    let started = Instant::now();
    while subscribed_channels(old, &ns) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the channel was never subscribed on the primary"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let old_port = old.port();
    kit.pause_primary();
    let (new, _) = wait_new_primary(&kit, old_port);
    let promoted = Instant::now();
    let new = kit
        .node_with_port(new)
        .expect("the new primary is a kit node");
    while subscribed_channels(new, &ns) == 0 {
        assert!(
            promoted.elapsed() < Duration::from_secs(3),
            "the channel was not subscribed on the new primary within 3 s of its promotion: \
             the subscriber is still connecting to the hung one"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "subscribed on the new primary {:?} after the kit saw it promoted",
        promoted.elapsed()
    );
    kit.resume();
}

/// A read sent to the primary just before it hung is given up when the
/// backend moves to the new primary and made again there: the caller
/// gets the new primary's answer (a hit on the replicated value), not the
/// end of its timeout and a load without the lease. The timeouts are long
/// here (10 s) so that the read is still out at the promotion, and waiting
/// it out would show plainly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_out_on_a_hung_primary_is_answered_by_the_new_one() {
    let _limit = time_limit(LIMIT);
    let kit = RedisSentinel::start();
    let ns = unique_ns("read-moved");
    let long = Duration::from_secs(10);
    let backend = connect_with(&kit, RedisOptions::new().response_timeout(long)).await;
    let cache: Cache<String, String> = Cache::builder()
        .namespace(&ns)
        .backend(backend)
        .ttl(Duration::from_secs(60))
        .backend_timeout(long)
        .no_l1()
        .build()
        .unwrap();
    set_until_ok(&cache, "k", "stored").await;
    let started = Instant::now();
    while !kit.replicas().iter().all(|r| holds(r, &ns, "k")) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the value never reached the replicas"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let old = kit.primary().port();
    kit.pause_primary();
    let read = {
        let cache = cache.clone();
        tokio::spawn(async move {
            cache
                .fetch(&"k".to_owned(), |_| async {
                    Ok::<_, std::io::Error>("loaded".to_owned())
                })
                .await
        })
    };
    wait_new_primary(&kit, old);
    let promoted = Instant::now();
    let fetched = read.await.unwrap().expect("answered");
    let after = promoted.elapsed();
    kit.resume();
    assert_eq!(
        (fetched.value.as_str(), fetched.outcome),
        ("stored", onefill::Outcome::Hit),
        "the read did not get the new primary's answer"
    );
    assert!(
        after < Duration::from_secs(2),
        "the read answered {after:?} after the promotion: it waited on the hung primary"
    );
}
