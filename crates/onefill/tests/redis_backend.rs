//! `RedisBackend` against private Redis servers: every `Backend` method on a
//! standalone server and on a 3-master cluster, then outages (kill and
//! restart on the same port, pause), URLs and errors.
//!
//! Longer than most files (about 800 lines) on purpose: it is the one place
//! that shows, method by method, what the Redis backend does on the wire,
//! and each test starts its own servers, so splitting it would only
//! scatter that picture.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use onefill::backend::{Acquired, Backend, FillKeys, FillSubscription, Stored};
use onefill::redis::{RedisBackend, RedisOptions, NO_EXPIRY_TTL};
use onefill::{BackendErrorKind, LeaseToken};
use onefill_testkit::{time_limit, RedisCluster, RedisServer, Reply};

/// Cluster tests take seconds each (a 3-master cluster forms in a few); past this they hang.
const LIMIT: Duration = Duration::from_secs(120);

/// A namespace no other test uses.
fn unique_ns(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "t{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A version-1 envelope (see `envelope.rs`): magic, version, kind, reserved,
/// grace ms (u64 BE), delta ms (u32 BE), payload.
fn envelope(grace: Duration, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0xF1, 1, 0, 0];
    out.extend_from_slice(&(grace.as_millis() as u64).to_be_bytes());
    out.extend_from_slice(&7u32.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

async fn notified_within(sub: &mut Box<dyn FillSubscription>, within: Duration) -> bool {
    tokio::time::timeout(within, sub.notified()).await.is_ok()
}

/// Where raw commands for a key go: the server, or the key's cluster node.
trait Raw {
    fn node(&self, key: &str) -> &RedisServer;
    fn cmd(&self, args: &[&str]) -> String {
        self.node(args[1]).command(args)
    }
    fn pttl(&self, key: &str) -> i64 {
        self.node(key)
            .query(&["PTTL", key])
            .as_int()
            .expect("PTTL answers an integer")
    }
    fn numsub(&self, channel: &str) -> i64;
}

impl Raw for RedisServer {
    fn node(&self, _key: &str) -> &RedisServer {
        self
    }
    fn numsub(&self, channel: &str) -> i64 {
        match self.query(&["PUBSUB", "NUMSUB", channel]) {
            Reply::Array(Some(items)) => items[1].as_int().unwrap(),
            other => panic!("PUBSUB NUMSUB answered {other:?}"),
        }
    }
}

impl Raw for RedisCluster {
    fn node(&self, key: &str) -> &RedisServer {
        self.node_for_key(key)
    }
    fn numsub(&self, channel: &str) -> i64 {
        match self
            .node_for_key(channel)
            .query(&["PUBSUB", "SHARDNUMSUB", channel])
        {
            Reply::Array(Some(items)) => items[1].as_int().unwrap(),
            other => panic!("PUBSUB SHARDNUMSUB answered {other:?}"),
        }
    }
}

fn fast() -> RedisOptions {
    RedisOptions::new()
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(2))
        .max_backoff(Duration::from_millis(300))
        .ping_interval(Duration::from_millis(500))
}

async fn standalone(server: &RedisServer) -> RedisBackend {
    RedisBackend::connect_with(&server.url(), fast())
        .await
        .expect("connect")
}

async fn clustered(cluster: &RedisCluster) -> RedisBackend {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    RedisBackend::connect_cluster_with(&urls, fast())
        .await
        .expect("connect_cluster")
}

const LEASE: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(60);

async fn lease_lifecycle(backend: &RedisBackend, raw: &dyn Raw) {
    let keys = FillKeys::new(&unique_ns("lease"), "k");
    let a = LeaseToken::random();
    let b = LeaseToken::random();

    // Empty: the first acquire wins and writes its token with the lease TTL.
    let won = backend
        .acquire(&keys, &a, LEASE, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(won, Acquired::Won { stale: None });
    assert_eq!(raw.cmd(&["GET", keys.lock()]), a.as_str());
    let pttl = raw.pttl(keys.lock());
    assert!(pttl > 9_000 && pttl <= 10_000, "lease PTTL {pttl}");

    // Another token: held, with the lease's remaining TTL.
    match backend
        .acquire(&keys, &b, LEASE, Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Held {
            stale: None,
            lease_ttl,
            holder,
        } => {
            assert!(
                lease_ttl > Duration::from_secs(9) && lease_ttl <= LEASE,
                "{lease_ttl:?}"
            );
            // The holder's token comes back, so a waiter can watch it.
            assert_eq!(holder, Some(a.clone()));
        }
        other => panic!("expected Held, got {other:?}"),
    }

    // A fill with the wrong token writes nothing.
    let bytes = envelope(Duration::from_secs(5), b"v1");
    assert!(!backend.fill(&keys, &b, &bytes, TTL).await.unwrap());
    assert_eq!(raw.cmd(&["EXISTS", keys.value()]), "0");
    assert_eq!(raw.cmd(&["GET", keys.lock()]), a.as_str());

    // A subscriber made before the fill hears of it.
    let mut sub = backend.subscribe(&keys).await.unwrap();
    assert!(
        !notified_within(&mut sub, Duration::from_millis(50)).await,
        "no spurious wake right after subscribing"
    );
    assert!(backend.fill(&keys, &a, &bytes, TTL).await.unwrap());
    assert!(
        notified_within(&mut sub, Duration::from_secs(2)).await,
        "fill notification"
    );
    assert_eq!(
        raw.cmd(&["EXISTS", keys.lock()]),
        "0",
        "fill deletes the lease"
    );
    let pttl = raw.pttl(keys.value());
    assert!(pttl > 59_000 && pttl <= 60_000, "value PTTL {pttl}");
    let stored = backend.get(&keys).await.unwrap().expect("stored");
    assert_eq!(stored.bytes, bytes);
    assert!(stored.ttl > Duration::from_secs(59) && stored.ttl <= TTL);

    // A late fill of the old lease is fenced out.
    assert!(!backend.fill(&keys, &a, b"late", TTL).await.unwrap());
    assert_eq!(backend.get(&keys).await.unwrap().unwrap().bytes, bytes);

    // Now fresh: acquire returns it and takes no lease.
    match backend
        .acquire(&keys, &b, LEASE, Duration::ZERO)
        .await
        .unwrap()
    {
        Acquired::Fresh(Stored { bytes: got, ttl }) => {
            assert_eq!(got, bytes);
            assert!(ttl > Duration::from_secs(59));
        }
        other => panic!("expected Fresh, got {other:?}"),
    }
    assert_eq!(raw.cmd(&["EXISTS", keys.lock()]), "0");
}

async fn release_and_extend(backend: &RedisBackend, raw: &dyn Raw) {
    let keys = FillKeys::new(&unique_ns("release"), "k");
    let a = LeaseToken::random();
    let b = LeaseToken::random();
    let short = Duration::from_secs(2);
    assert!(matches!(
        backend
            .acquire(&keys, &a, short, Duration::ZERO)
            .await
            .unwrap(),
        Acquired::Won { stale: None }
    ));

    // Extend: only with our token.
    assert!(!backend.extend(&keys, &b, LEASE).await.unwrap());
    assert!(raw.pttl(keys.lock()) <= 2_000);
    assert!(backend.extend(&keys, &a, LEASE).await.unwrap());
    assert!(raw.pttl(keys.lock()) > 9_000);

    // Release with the wrong token leaves the lease alone.
    let mut sub = backend.subscribe(&keys).await.unwrap();
    assert!(!backend.release(&keys, &b, None).await.unwrap());
    assert_eq!(raw.cmd(&["GET", keys.lock()]), a.as_str());
    assert!(!notified_within(&mut sub, Duration::from_millis(100)).await);

    // Release with our token and a short negative entry.
    let failure = {
        let mut e = envelope(Duration::ZERO, b"origin down");
        e[2] = 1;
        e
    };
    let neg = Duration::from_secs(5);
    assert!(backend
        .release(&keys, &a, Some((&failure, neg)))
        .await
        .unwrap());
    assert!(
        notified_within(&mut sub, Duration::from_secs(2)).await,
        "release notification"
    );
    assert_eq!(raw.cmd(&["EXISTS", keys.lock()]), "0");
    let stored = backend.get(&keys).await.unwrap().expect("negative entry");
    assert_eq!(stored.bytes, failure);
    assert!(stored.ttl <= neg && stored.ttl > Duration::from_secs(2));

    // Extend after release: not ours any more.
    assert!(!backend.extend(&keys, &a, LEASE).await.unwrap());

    // Release without an entry writes nothing.
    let keys = FillKeys::new(&unique_ns("release-bare"), "k");
    backend
        .acquire(&keys, &a, LEASE, Duration::ZERO)
        .await
        .unwrap();
    assert!(backend.release(&keys, &a, None).await.unwrap());
    assert_eq!(raw.cmd(&["EXISTS", keys.value()]), "0");
    assert_eq!(raw.cmd(&["EXISTS", keys.lock()]), "0");
    assert!(!backend.release(&keys, &a, None).await.unwrap());
}

async fn set_and_invalidate(backend: &RedisBackend, raw: &dyn Raw) {
    let keys = FillKeys::new(&unique_ns("set"), "k");
    let a = LeaseToken::random();
    let mut sub = backend.subscribe(&keys).await.unwrap();

    backend
        .acquire(&keys, &a, LEASE, Duration::ZERO)
        .await
        .unwrap();
    let bytes = envelope(Duration::from_secs(1), b"written");
    backend.set(&keys, &bytes, TTL).await.unwrap();
    assert!(
        notified_within(&mut sub, Duration::from_secs(2)).await,
        "set notification"
    );
    assert_eq!(
        raw.cmd(&["EXISTS", keys.lock()]),
        "0",
        "set fences out the lease"
    );
    assert!(raw.pttl(keys.value()) > 59_000);
    assert!(!backend.fill(&keys, &a, b"late", TTL).await.unwrap());
    assert_eq!(backend.get(&keys).await.unwrap().unwrap().bytes, bytes);

    backend
        .acquire(&keys, &a, LEASE, Duration::MAX)
        .await
        .unwrap();
    assert_eq!(raw.cmd(&["GET", keys.lock()]), a.as_str());
    backend.invalidate(&keys).await.unwrap();
    assert!(
        notified_within(&mut sub, Duration::from_secs(2)).await,
        "invalidate notification"
    );
    assert_eq!(raw.cmd(&["EXISTS", keys.value()]), "0");
    assert_eq!(raw.cmd(&["EXISTS", keys.lock()]), "0");
    assert_eq!(backend.get(&keys).await.unwrap(), None);
    // Invalidating nothing is fine.
    backend.invalidate(&keys).await.unwrap();
}

async fn freshness(backend: &RedisBackend, raw: &dyn Raw) {
    let ns = unique_ns("fresh");
    let grace = Duration::from_secs(10);
    let good = envelope(grace, b"ok");

    // Fresh while PTTL > grace + window.
    let keys = FillKeys::new(&ns, "window");
    backend.set(&keys, &good, TTL).await.unwrap();
    for (window, fresh) in [
        (Duration::ZERO, true),
        (Duration::from_secs(45), true),
        (Duration::from_secs(55), false),
        (Duration::MAX, false),
    ] {
        let got = backend
            .acquire(&keys, &LeaseToken::random(), LEASE, window)
            .await
            .unwrap();
        assert_eq!(
            matches!(got, Acquired::Fresh(_)),
            fresh,
            "window {window:?}: {got:?}"
        );
        if let Acquired::Won { stale } = got {
            assert_eq!(stale.unwrap().bytes, good);
        }
        raw.cmd(&["DEL", keys.lock()]);
    }

    // Within the grace period: stale, not fresh.
    let keys = FillKeys::new(&ns, "stale");
    backend
        .set(&keys, &good, Duration::from_secs(9))
        .await
        .unwrap();
    assert!(matches!(
        backend
            .acquire(&keys, &LeaseToken::random(), LEASE, Duration::ZERO)
            .await
            .unwrap(),
        Acquired::Won { stale: Some(_) }
    ));

    // Bytes that are not a readable envelope are never fresh.
    let mut bad_version = good.clone();
    bad_version[1] = 2;
    let mut bad_kind = good.clone();
    bad_kind[2] = 9;
    let mut bad_magic = good.clone();
    bad_magic[0] = 0;
    for (name, bytes) in [
        ("garbage", b"not an envelope at all".to_vec()),
        ("short", good[..15].to_vec()),
        ("empty", Vec::new()),
        ("version", bad_version),
        ("kind", bad_kind),
        ("magic", bad_magic),
    ] {
        let keys = FillKeys::new(&ns, name);
        backend.set(&keys, &bytes, TTL).await.unwrap();
        match backend
            .acquire(&keys, &LeaseToken::random(), LEASE, Duration::ZERO)
            .await
            .unwrap()
        {
            Acquired::Won { stale: Some(stale) } => assert_eq!(stale.bytes, bytes, "{name}"),
            other => panic!("{name}: expected Won with the unreadable value, got {other:?}"),
        }
    }

    // A huge grace (more than any TTL) is never fresh.
    let keys = FillKeys::new(&ns, "huge-grace");
    let mut huge = good.clone();
    huge[4..12].copy_from_slice(&u64::MAX.to_be_bytes());
    backend.set(&keys, &huge, TTL).await.unwrap();
    assert!(matches!(
        backend
            .acquire(&keys, &LeaseToken::random(), LEASE, Duration::ZERO)
            .await
            .unwrap(),
        Acquired::Won { .. }
    ));

    // A key without expiry (written by someone else) has a huge TTL.
    let keys = FillKeys::new(&ns, "persistent");
    let node = raw.node(keys.value());
    let value_key = keys.value().as_bytes();
    assert_eq!(
        node.query_bytes(&[b"SET", value_key, &good]),
        Reply::Status("OK".into())
    );
    assert_eq!(
        backend.get(&keys).await.unwrap().unwrap().ttl,
        NO_EXPIRY_TTL
    );
    assert!(matches!(
        backend
            .acquire(&keys, &LeaseToken::random(), LEASE, Duration::ZERO)
            .await
            .unwrap(),
        Acquired::Fresh(Stored {
            ttl: NO_EXPIRY_TTL,
            ..
        })
    ));
    assert!(matches!(
        backend
            .acquire(&keys, &LeaseToken::random(), LEASE, Duration::MAX)
            .await
            .unwrap(),
        Acquired::Won { .. }
    ));

    // Sub-millisecond TTLs round up to 1 ms instead of failing.
    let keys = FillKeys::new(&ns, "tiny");
    let a = LeaseToken::random();
    backend
        .acquire(&keys, &a, Duration::from_micros(10), Duration::ZERO)
        .await
        .unwrap();
    backend
        .set(&keys, &good, Duration::from_nanos(1))
        .await
        .unwrap();
}

async fn errors_are_classified(backend: &RedisBackend, raw: &dyn Raw) {
    let keys = FillKeys::new(&unique_ns("wrongtype"), "k");
    raw.cmd(&["LPUSH", keys.value(), "x"]);
    let err = backend.get(&keys).await.unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Command, "{err}");
    let err = backend
        .acquire(&keys, &LeaseToken::random(), LEASE, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Command, "{err}");
    assert!(!err.is_transient());
    // The driver's error is kept as the cause; the message says the kind in
    // words, then the operation.
    let source = std::error::Error::source(&err).expect("the driver's error");
    let redis_error = source
        .downcast_ref::<redis::RedisError>()
        .expect("a RedisError");
    assert_eq!(redis_error.code(), Some("WRONGTYPE"), "{redis_error}");
    assert!(
        err.to_string().starts_with("command rejected: acquire: "),
        "{err}"
    );
}

async fn shared_subscriptions(backend: &RedisBackend, raw: &dyn Raw) {
    let keys = FillKeys::new(&unique_ns("shared"), "k");
    let other = FillKeys::new(&unique_ns("shared"), "other");
    let mut one = backend.subscribe(&keys).await.unwrap();
    let mut two = backend.subscribe(&keys).await.unwrap();
    let mut elsewhere = backend.subscribe(&other).await.unwrap();
    assert_eq!(
        raw.numsub(keys.channel()),
        1,
        "one server subscription per channel"
    );

    backend.invalidate(&keys).await.unwrap();
    assert!(notified_within(&mut one, Duration::from_secs(2)).await);
    assert!(notified_within(&mut two, Duration::from_secs(2)).await);
    assert!(!notified_within(&mut elsewhere, Duration::from_millis(100)).await);

    drop(one);
    backend.invalidate(&keys).await.unwrap();
    assert!(notified_within(&mut two, Duration::from_secs(2)).await);

    // The last subscription gone, the channel is unsubscribed.
    drop(two);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while raw.numsub(keys.channel()) != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "channel never unsubscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(raw.numsub(other.channel()), 1);

    // Subscribing again works.
    let mut again = backend.subscribe(&keys).await.unwrap();
    backend.invalidate(&keys).await.unwrap();
    assert!(notified_within(&mut again, Duration::from_secs(2)).await);

    // Many keys at once (a herd of different keys).
    let herd: Vec<FillKeys> = (0..50)
        .map(|i| FillKeys::new("herd", &format!("{}-{i}", unique_ns("h"))))
        .collect();
    let mut subs = Vec::new();
    for keys in &herd {
        subs.push(backend.subscribe(keys).await.unwrap());
    }
    for keys in &herd {
        backend.invalidate(keys).await.unwrap();
    }
    for sub in &mut subs {
        assert!(notified_within(sub, Duration::from_secs(2)).await);
    }
}

/// Retries `op` until it succeeds (the driver reconnects in the background).
async fn eventually<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, onefill::BackendError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: still failing: {e}"
                );
                assert!(e.is_transient(), "{what}: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Kill the node of `keys` and restart it on its port: commands (and the
/// scripts, which the new process does not have) and notifications work
/// again. `standalone`: the subscriber's own connection is lost with the
/// server, so while it is, the subscription wakes its waiter at the
/// polling pace (a cluster's driver keeps its subscriptions itself).
async fn survives_restart(
    backend: &RedisBackend,
    node: &RedisServer,
    keys: &FillKeys,
    standalone: bool,
) {
    let a = LeaseToken::random();
    let bytes = envelope(Duration::ZERO, b"before");
    assert!(matches!(
        backend
            .acquire(keys, &a, LEASE, Duration::ZERO)
            .await
            .unwrap(),
        Acquired::Won { .. }
    ));
    let mut sub = backend.subscribe(keys).await.unwrap();

    node.kill();
    let err = backend.get(keys).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    if standalone {
        // Nothing can be published or confirmed while the server is down:
        // any wake-up is the pace of an unconfirmed channel (the first call
        // may have started before the loss was seen, and waits on).
        let woken = notified_within(&mut sub, Duration::from_secs(2)).await
            || notified_within(&mut sub, Duration::from_secs(2)).await;
        assert!(woken, "a lost channel wakes its waiter at the polling pace");
        assert!(
            notified_within(&mut sub, Duration::from_millis(700)).await,
            "and again, at most 500 ms ±25 % later"
        );
    }
    node.restart();

    // Commands work again; the scripts are loaded again after NOSCRIPT.
    let b = LeaseToken::random();
    let got = eventually("acquire after restart", || {
        backend.acquire(keys, &b, LEASE, Duration::ZERO)
    })
    .await;
    assert_eq!(
        got,
        Acquired::Won { stale: None },
        "the restarted server is empty"
    );
    let stats = node.command(&["INFO", "commandstats"]);
    assert!(
        stats.contains("cmdstat_script|load"),
        "scripts reloaded: {stats}"
    );

    // The subscription is renewed, and woken once for what it may have missed.
    assert!(
        notified_within(&mut sub, Duration::from_secs(15)).await,
        "woken after resubscription"
    );
    // Once it is confirmed again, it wakes only for messages: drain the
    // wake-ups of the resubscription (and any pace tick before it) until
    // it stays quiet, so the one below can only be the fill's.
    let quiet_by = tokio::time::Instant::now() + Duration::from_secs(15);
    while notified_within(&mut sub, Duration::from_millis(700)).await {
        assert!(
            tokio::time::Instant::now() < quiet_by,
            "the subscription keeps waking up once confirmed again"
        );
    }
    assert!(backend.fill(keys, &b, &bytes, TTL).await.unwrap());
    assert!(
        notified_within(&mut sub, Duration::from_secs(2)).await,
        "fill notification after the restart"
    );
    let mut fresh = backend.subscribe(keys).await.unwrap();
    backend.invalidate(keys).await.unwrap();
    assert!(notified_within(&mut fresh, Duration::from_secs(2)).await);
    assert!(notified_within(&mut sub, Duration::from_secs(2)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_backend_methods() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = standalone(&server).await;
    assert!(format!("{backend:?}").contains("standalone"));
    lease_lifecycle(&backend, &server).await;
    release_and_extend(&backend, &server).await;
    set_and_invalidate(&backend, &server).await;
    freshness(&backend, &server).await;
    errors_are_classified(&backend, &server).await;
    shared_subscriptions(&backend, &server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_backend_methods() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let backend = clustered(&cluster).await;
    assert!(format!("{backend:?}").contains("cluster"));
    lease_lifecycle(&backend, &cluster).await;
    release_and_extend(&backend, &cluster).await;
    set_and_invalidate(&backend, &cluster).await;
    freshness(&backend, &cluster).await;
    errors_are_classified(&backend, &cluster).await;
    shared_subscriptions(&backend, &cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_survives_a_restart_on_the_same_port() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = standalone(&server).await;
    let keys = FillKeys::new(&unique_ns("restart"), "k");
    survives_restart(&backend, &server, &keys, true).await;
    // And a second time.
    let keys = FillKeys::new(&unique_ns("restart"), "again");
    survives_restart(&backend, &server, &keys, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_survives_a_node_restart() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let backend = clustered(&cluster).await;
    let keys = FillKeys::new(&unique_ns("restart"), "k");
    let node = cluster.node_for_key(keys.value());
    survives_restart(&backend, node, &keys, false).await;
    cluster.wait_until_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_times_out_then_recovers() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = RedisBackend::connect_with(
        &server.url(),
        fast().response_timeout(Duration::from_millis(200)),
    )
    .await
    .unwrap();
    let keys = FillKeys::new(&unique_ns("pause"), "k");
    backend.set(&keys, b"x", TTL).await.unwrap();

    server.pause();
    let started = std::time::Instant::now();
    let err = backend.get(&keys).await.unwrap_err();
    server.resume();
    assert_eq!(err.kind(), BackendErrorKind::Timeout, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    let got = eventually("get after resume", || backend.get(&keys)).await;
    assert_eq!(got.unwrap().bytes, b"x");
    let mut sub = backend.subscribe(&keys).await.unwrap();
    backend.invalidate(&keys).await.unwrap();
    assert!(notified_within(&mut sub, Duration::from_secs(5)).await);
}

/// The acquire script as the library sends it (it announces nothing, so
/// its text is the file's).
const ACQUIRE_LUA: &str = include_str!("../src/backend/redis/scripts/acquire.lua");

/// A lease request sent while the server hangs, whose caller gives up (its
/// reply is lost, as a cache's timeout loses it), then the compare-and-delete
/// of its token that the cache sends after such a request: both reach the
/// server when it resumes, in that order, so the lease is free then. Before
/// it, a lease is taken on another key and left (a miss served, nothing
/// released): the acquire script is in use, the release script never ran.
async fn a_lost_lease_request_is_released(backend: &RedisBackend, server: &RedisServer, ns: &str) {
    let before = FillKeys::new(ns, "before");
    let got = backend
        .acquire(&before, &LeaseToken::random(), LEASE, Duration::ZERO)
        .await
        .unwrap();
    assert!(matches!(got, Acquired::Won { .. }), "{got:?}");

    let keys = FillKeys::new(ns, "k");
    let token = LeaseToken::random();
    let gave_up = Duration::from_millis(100);
    server.pause();
    let request = backend.acquire(&keys, &token, LEASE, Duration::ZERO);
    let lost = tokio::time::timeout(gave_up, request).await;
    let release = tokio::time::timeout(gave_up, backend.release(&keys, &token, None)).await;
    server.resume();
    assert!(lost.is_err() && release.is_err(), "the server hung");
    // Sent after both on the same connection: answered once both ran.
    let got = backend
        .acquire(&keys, &LeaseToken::random(), LEASE, Duration::ZERO)
        .await
        .unwrap();
    assert!(
        matches!(got, Acquired::Won { .. }),
        "the lease taken by the late request is still held: {got:?}"
    );
}

/// A call whose caller gave up while the server hung still runs when the
/// server resumes, whatever scripts the server knew: on a fresh server,
/// after it forgot them all (a restart, a failover), and on one that knows
/// only the acquire script (as one that served caches which loaded each
/// script when its own call first met `NOSCRIPT`). A script unknown then
/// met `NOSCRIPT` with nobody left to load it, and the lease stayed held
/// for its whole TTL while every process waited for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_abandoned_while_the_server_hangs_runs_when_it_resumes() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = standalone(&server).await;
    a_lost_lease_request_is_released(&backend, &server, &unique_ns("fresh")).await;

    server.command(&["SCRIPT", "FLUSH"]);
    a_lost_lease_request_is_released(&backend, &server, &unique_ns("flushed")).await;

    server.command(&["SCRIPT", "FLUSH"]);
    server.command(&["SCRIPT", "LOAD", ACQUIRE_LUA]);
    let backend = standalone(&server).await;
    a_lost_lease_request_is_released(&backend, &server, &unique_ns("partial")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_are_reported() {
    let _limit = time_limit(LIMIT);
    // Nothing listens on a port just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = RedisBackend::connect_with(&format!("redis://127.0.0.1:{port}"), fast())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Connection, "{err}");
    let err = RedisBackend::connect_cluster_with(&[&format!("redis://127.0.0.1:{port}")], fast())
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");

    // Authentication comes from the URL.
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let url = format!("redis://:s3cret@127.0.0.1:{}", server.port());
    let backend = RedisBackend::connect_with(&url, fast()).await.unwrap();
    assert!(!format!("{backend:?}").contains("s3cret"));
    let keys = FillKeys::new(&unique_ns("auth"), "k");
    let mut sub = backend.subscribe(&keys).await.unwrap();
    backend.set(&keys, b"x", TTL).await.unwrap();
    assert!(notified_within(&mut sub, Duration::from_secs(2)).await);
    let err = RedisBackend::connect_with(&server.url(), fast())
        .await
        .unwrap_err();
    assert!(
        !err.is_transient(),
        "a missing password is not transient: {err}"
    );
}

#[tokio::test]
async fn a_bad_url_says_what_is_wrong_without_the_password() {
    for (url, problem) in [
        ("redis://user:hunter2@host:notaport", "invalid port number"),
        ("http://user:hunter2@host:6379", "unknown scheme `http`"),
        ("redis://user:hunter2@127.0.0.1:6379/notadb", "database"),
    ] {
        let err = RedisBackend::connect_with(url, fast()).await.unwrap_err();
        let shown = format!("{err} / {err:?}");
        assert!(err.message().contains(problem), "{url}: {shown}");
        assert!(!shown.contains("hunter2"), "{url}: {shown}");
        assert!(!err.is_transient(), "{url}: {shown}");
        let err = RedisBackend::connect_cluster_with(&["redis://127.0.0.1:7000", url], fast())
            .await
            .unwrap_err();
        let shown = format!("{err} / {err:?}");
        assert!(err.message().contains(problem), "{url}: {shown}");
        assert!(!shown.contains("hunter2"), "{url}: {shown}");
    }
}

/// A cluster node restarts (no failover: it comes back with its slots)
/// while a process is subscribed to two keys of it in two slots. The
/// driver subscribes a reconnected node's channels again in one
/// `SSUBSCRIBE`, which the node refuses (`CROSSSLOT`) for channels of two
/// slots: before, both subscriptions stayed deaf (and counted as
/// confirmed, so nothing polled). Each is subscribed again on its own and
/// hears the next fill of its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_restarted_node_gets_back_its_channels_of_every_slot() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let backend = clustered(&cluster).await;
    let ns = unique_ns("slots");
    let first = FillKeys::new(&ns, "k0");
    let node = cluster.node_for_key(first.value());
    let second = (1..)
        .map(|i| FillKeys::new(&ns, &format!("k{i}")))
        .find(|k| {
            cluster.node_for_key(k.value()).port() == node.port()
                && cluster.slot_of(k.value()) != cluster.slot_of(first.value())
        })
        .expect("a second key of the node");
    let mut subs = Vec::new();
    for keys in [&first, &second] {
        subs.push(backend.subscribe(keys).await.unwrap());
    }
    node.kill();
    node.restart();
    for keys in [&first, &second] {
        eventually("invalidate after the restart", || backend.invalidate(keys)).await;
    }
    // Drain the wake-ups of the restart until each stays quiet.
    for sub in subs.iter_mut() {
        let quiet_by = tokio::time::Instant::now() + Duration::from_secs(15);
        while notified_within(sub, Duration::from_millis(700)).await {
            assert!(tokio::time::Instant::now() < quiet_by, "never quiet");
        }
    }
    for (keys, sub) in [&first, &second].into_iter().zip(subs.iter_mut()) {
        backend.invalidate(keys).await.unwrap();
        assert!(
            notified_within(sub, Duration::from_secs(2)).await,
            "{} not heard after the restart",
            keys.value()
        );
    }
    cluster.wait_until_ok();
}
