//! Redis Cluster on a private 3-master cluster, inside one process: routing
//! (a slot that migrates answers `ASK`, then `MOVED`; neither reaches a
//! strict caller) and failure per shard (a hung master degrades its own
//! keys only; the keys of the healthy masters keep their normal service).
//! The failover of a master to its replica, across real processes, is in
//! the CLI's `tests/cluster_failover.rs`.

use std::time::Duration;

use onefill::backend::{Backend, FillKeys};
use onefill::redis::RedisBackend;
use onefill::{Cache, CircuitState, Outcome};
use onefill_testkit::{time_limit, RedisCluster, RedisServer};

// The caches here have no L1: these tests follow calls to the masters
// (redirections, migrations, a hung master's breaker), which an L1 would
// answer first. `l1_redis.rs` has the L1 on a cluster.

/// Cluster tests take seconds each (a 3-master cluster forms in a few); past this they hang.
const LIMIT: Duration = Duration::from_secs(120);

fn unique_ns(name: &str) -> String {
    format!("{name}-{}", &onefill::LeaseToken::random().as_str()[..8])
}

async fn connect(cluster: &RedisCluster) -> RedisBackend {
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    // The default options: what users run.
    RedisBackend::connect_cluster(&urls)
        .await
        .expect("connect to the cluster")
}

fn info_field(node: &RedisServer, section: &str, field: &str) -> u64 {
    node.command(&["INFO", section])
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(str::to_owned))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn cluster_slots_calls(cluster: &RedisCluster) -> u64 {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            n.command(&["INFO", "commandstats"])
                .lines()
                .find(|l| l.starts_with("cmdstat_cluster|slots:"))
                .and_then(|l| l.split("calls=").nth(1))
                .and_then(|r| r.split(',').next())
                .and_then(|c| c.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

async fn fetch(cache: &Cache<String, String>, key: &str) -> Result<Outcome, onefill::Error> {
    cache
        .fetch(&key.to_owned(), |k: String| async move {
            Ok::<_, std::io::Error>(format!("loaded {k}"))
        })
        .await
        .map(|f| f.outcome)
}

/// A key whose slot has started to migrate ([`a_key_whose_slot_starts_to_migrate`]).
struct Migrating<'c> {
    /// A strict cache: every backend error reaches its caller.
    cache: Cache<String, String>,
    key: String,
    keys: FillKeys,
    source: &'c RedisServer,
    target: &'c RedisServer,
    slot: u16,
}

/// A strict cache on `cluster` with `"moving"` set to `"v1"`, then the
/// migration of its slot begun, from the master that holds it to another.
async fn a_key_whose_slot_starts_to_migrate<'c>(
    cluster: &'c RedisCluster,
    name: &str,
) -> Migrating<'c> {
    a_key_with_grace_whose_slot_starts_to_migrate(cluster, name, Duration::ZERO).await
}

/// [`a_key_whose_slot_starts_to_migrate`], the cache storing with `grace`.
async fn a_key_with_grace_whose_slot_starts_to_migrate<'c>(
    cluster: &'c RedisCluster,
    name: &str,
    grace: Duration,
) -> Migrating<'c> {
    let ns = unique_ns(name);
    let cache = Cache::<String, String>::builder()
        .namespace(&ns)
        .backend(connect(cluster).await)
        .no_l1()
        .grace(grace)
        .strict(true)
        .build()
        .unwrap();
    let key = "moving".to_owned();
    cache.set(&key, "v1".to_owned()).await.unwrap();
    let keys = FillKeys::new(&ns, &key);
    let source = cluster.node_for_key(keys.value());
    let target = cluster
        .nodes()
        .iter()
        .find(|n| n.port() != source.port())
        .unwrap();
    let slot = cluster.slot_of(keys.value());
    cluster.begin_migration(slot, source, target);
    Migrating {
        cache,
        key,
        keys,
        source,
        target,
        slot,
    }
}

/// A slot migrating from one master to another: while it migrates, the
/// source answers `ASK` for the key it no longer has; once it moved, the
/// source answers `MOVED`. A strict cache (which surfaces backend errors)
/// sees neither: both are followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_is_followed_and_never_reaches_a_strict_caller() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let Migrating {
        cache,
        key,
        keys,
        source,
        target,
        slot,
    } = a_key_whose_slot_starts_to_migrate(&cluster, "migrate").await;
    cluster.migrate_keys(source, target, &[keys.value()]);

    // Migrating: the source answers ASK for the value, which is followed,
    // on the connection the backend already has to the target (each ASK
    // used to open a connection of its own).
    let connections_before = info_field(target, "stats", "total_connections_received");
    for _ in 0..50 {
        assert_eq!(cache.get(&key).await.unwrap().as_deref(), Some("v1"));
    }
    assert_eq!(fetch(&cache, &key).await.unwrap(), Outcome::Hit);
    let opened = info_field(target, "stats", "total_connections_received") - connections_before;
    assert!(opened <= 2, "{opened} connections opened for 51 ASKs");

    // Migrated: every node says the slot is the target's; the backend
    // still thinks it is the source's, which answers MOVED.
    cluster.end_migration(slot, target, &[]);
    cache.set(&key, "v2".to_owned()).await.unwrap();
    assert_eq!(cache.get(&key).await.unwrap().as_deref(), Some("v2"));
    assert!(
        !target.query(&["GET", keys.value()]).is_nil(),
        "the value was written on the slot's new master"
    );
    cache.invalidate(&key).await.unwrap();
    assert_eq!(fetch(&cache, &key).await.unwrap(), Outcome::Loaded);
    assert_eq!(fetch(&cache, &key).await.unwrap(), Outcome::Hit);
    assert_eq!(cache.stats().backend_errors, 0, "{:?}", cache.stats());
}

/// `set` and `invalidate` while their key's slot migrates, on a strict
/// cache (which surfaces every backend error): before the key moved (its
/// value on the source, its lock and channel on neither node) and after
/// (the value on the importing node). Their scripts are refused with
/// `TRYAGAIN` for as long as the slot migrates, so both used to fail (after
/// the backend timeout); they now succeed, and a read sees what they wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_succeed_while_their_slot_migrates() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let Migrating {
        cache,
        key,
        keys,
        source,
        target,
        ..
    } = a_key_whose_slot_starts_to_migrate(&cluster, "migrate-writes").await;

    // Migrating, the value still on the source.
    cache.set(&key, "v2".to_owned()).await.unwrap();
    assert_eq!(cache.get(&key).await.unwrap().as_deref(), Some("v2"));

    // The value moved to the target.
    cluster.migrate_keys(source, target, &[keys.value()]);
    cache.set(&key, "v3".to_owned()).await.unwrap();
    assert_eq!(cache.get(&key).await.unwrap().as_deref(), Some("v3"));
    assert!(
        !target.query(&["GET", keys.value()]).is_nil(),
        "written on the importing node"
    );
    cache.invalidate(&key).await.unwrap();
    assert_eq!(cache.get(&key).await.unwrap(), None);
    assert_eq!(cache.stats().backend_errors, 0, "{:?}", cache.stats());
}

/// `expire` while its key's slot migrates, on a strict cache: its script
/// (value, lock, channel) is refused with `TRYAGAIN` as `set`'s is, so it
/// runs apart: the lock deleted, then the value made stale by a script of
/// that key alone (read, judged and rewritten in one step, through `ASK` once
/// the key moved), then the announcement. The value stays readable, stale
/// for its grace window (its stamp, if it has one, kept equal to its
/// expiry), before the key moved and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_makes_the_value_stale_while_its_slot_migrates() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let grace = Duration::from_secs(20);
    let Migrating {
        cache,
        key,
        keys,
        source,
        target,
        slot,
    } = a_key_with_grace_whose_slot_starts_to_migrate(&cluster, "migrate-expire", grace).await;
    let stale_on = |node: &RedisServer| {
        let pttl = node.query(&["PTTL", keys.value()]).as_int().unwrap();
        assert!((0..=20_000).contains(&pttl), "PTTL {pttl}");
        assert!(
            pttl > 10_000,
            "the grace window from the first expire: {pttl}"
        );
        let stored = node.query(&["GET", keys.value()]);
        let stored = stored.as_bytes().expect("kept");
        // Odd versions (written apart, by a plain `SET`) carry no stamp.
        if stored[1] % 2 == 1 {
            return;
        }
        let mut at = [0u8; 8];
        at.copy_from_slice(&stored[16..24]);
        let expiry = node.query(&["PEXPIRETIME", keys.value()]).as_int();
        assert_eq!(Some(u64::from_be_bytes(at) as i64), expiry, "the stamp");
    };

    // Migrating, the value (written before, by a script: stamped) on the
    // source.
    cache.expire(&key).await.unwrap();
    stale_on(source);
    assert_eq!(cache.get(&key).await.unwrap().as_deref(), Some("v1"));

    // The value moved to the target, and written again there (through
    // `ASK`, by a plain `SET`: version 1, unstamped); then made stale there.
    // (The target answers the test's own commands once the slot is its
    // own.)
    cluster.migrate_keys(source, target, &[keys.value()]);
    cache.set(&key, "v2".to_owned()).await.unwrap();
    cache.expire(&key).await.unwrap();
    assert_eq!(cache.get(&key).await.unwrap().as_deref(), Some("v2"));
    cluster.end_migration(slot, target, &[]);
    stale_on(target);
    assert_eq!(cache.stats().backend_errors, 0, "{:?}", cache.stats());
}

/// A load whose lease was taken before its key's slot began to migrate,
/// overtaken by another process's `set` while the slot migrated (the lease
/// had moved to the importing node with the key's other keys), its fill
/// made once the slot has moved: the load answers its own caller, but the
/// fill finds its lease gone and never stores the older value over the
/// write. What fences it is the `set`'s lock delete, which during the
/// migration runs as a command of its own and must follow the lease to the
/// importing node. (While the slot migrates, no fill can land at all: its
/// script names the key's channel, which never exists as a key, so both
/// nodes refuse it with `TRYAGAIN`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_leased_before_a_migration_never_stores_over_a_write_made_during_it() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let ns = unique_ns("migrate-fill");
    // Two processes: one loads, the other writes.
    let loading = Cache::<String, String>::builder()
        .namespace(&ns)
        .backend(connect(&cluster).await)
        .no_l1()
        .build()
        .unwrap();
    let writing = Cache::<String, String>::builder()
        .namespace(&ns)
        .backend(connect(&cluster).await)
        .no_l1()
        .strict(true)
        .build()
        .unwrap();
    let key = "moving".to_owned();
    let keys = FillKeys::new(&ns, &key);
    let source = cluster.node_for_key(keys.value());
    let target = cluster
        .nodes()
        .iter()
        .find(|n| n.port() != source.port())
        .unwrap();
    let slot = cluster.slot_of(keys.value());

    let (go, gate) = tokio::sync::oneshot::channel::<()>();
    let load = tokio::spawn({
        let cache = loading.clone();
        let key = key.clone();
        async move {
            cache
                .fetch(&key, move |_k: String| async move {
                    let _ = gate.await;
                    Ok::<_, std::io::Error>("loaded before the write".to_owned())
                })
                .await
        }
    });
    let leased = std::time::Instant::now();
    while source.query(&["GET", keys.lock()]).is_nil() {
        assert!(leased.elapsed() < Duration::from_secs(10), "no lease taken");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    cluster.begin_migration(slot, source, target);
    cluster.migrate_keys(source, target, &[keys.lock()]);
    writing.set(&key, "written".to_owned()).await.unwrap();
    cluster.end_migration(slot, target, &[]);

    go.send(()).unwrap();
    let fetched = load.await.unwrap().unwrap();
    assert_eq!(fetched.value, "loaded before the write", "its own caller");
    assert_eq!(
        writing.get(&key).await.unwrap().as_deref(),
        Some("written"),
        "the fill stored its older value over the write"
    );
    assert_eq!(loading.get(&key).await.unwrap().as_deref(), Some("written"));
    assert!(
        target.query(&["GET", keys.lock()]).is_nil(),
        "no lease left"
    );
}

/// Resumes a paused node however the test ends.
struct Resume<'a>(&'a RedisServer);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// Regression: one circuit breaker per process covered every
/// key, so a hung master opened it and the keys of the two healthy masters
/// were served degraded too. Now each master has its own breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_degrades_only_its_own_keys() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let ns = unique_ns("hung");
    let cache = Cache::<String, String>::builder()
        .namespace(&ns)
        .backend(connect(&cluster).await)
        .no_l1()
        .build()
        .unwrap();
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let victim_port = cluster
        .node_for_key(FillKeys::new(&ns, &keys[0]).value())
        .port();
    let on_victim =
        |key: &str| cluster.node_for_key(FillKeys::new(&ns, key).value()).port() == victim_port;
    let victim = cluster
        .nodes()
        .iter()
        .find(|n| n.port() == victim_port)
        .unwrap();
    // Warm every key, so the healthy ones are hits from now on.
    for key in &keys {
        fetch(&cache, key).await.unwrap();
    }

    victim.pause();
    let _resume = Resume(victim);
    let (mut healthy, mut degraded) = (Vec::new(), 0);
    for _round in 0..4 {
        let calls: Vec<_> = keys
            .iter()
            .map(|key| {
                let cache = cache.clone();
                let key = key.clone();
                tokio::spawn(async move { (key.clone(), fetch(&cache, &key).await) })
            })
            .collect();
        for call in calls {
            let (key, outcome) = call.await.unwrap();
            let outcome = outcome.unwrap_or_else(|e| panic!("{key}: {e}"));
            if on_victim(&key) {
                // Served from the outage fallback (the last value this
                // process saw), or loaded without storing.
                assert!(
                    matches!(outcome, Outcome::Stale | Outcome::Degraded),
                    "{key} is on the hung master: {outcome:?}"
                );
                degraded += 1;
            } else {
                healthy.push(outcome);
            }
        }
    }
    assert!(degraded >= 8, "enough victim calls to open its circuit");
    assert!(!healthy.is_empty());
    assert!(
        healthy.iter().all(|o| *o == Outcome::Hit),
        "keys on healthy masters keep their normal service: {healthy:?}"
    );
    // Open, or half-open while one of its probes waits on the hung master
    // (an open breaker probes 25 ms after it opened, then every 50 and
    // 100 ms): not closed.
    assert!(
        matches!(
            cache.circuit_state(),
            CircuitState::Open | CircuitState::HalfOpen
        ),
        "the victim's: {:?}",
        cache.circuit_state()
    );
    assert!(cache.stats().circuit_opened >= 1);

    // The master comes back: its keys return to normal after its
    // breaker's probe.
    victim.resume();
    let victim_key = keys[0].clone();
    let mut back = false;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if matches!(
            fetch(&cache, &victim_key).await,
            Ok(Outcome::Hit | Outcome::Loaded)
        ) {
            back = true;
            break;
        }
    }
    assert!(back, "the victim's keys are served normally again");
}

/// Regression: an unsubscription and the next subscription of the
/// same channel ran in tasks of their own, and the `SUNSUBSCRIBE` could
/// reach the server last: the channel was deaf while its subscriber state
/// said subscribed (5 in 1,500 rounds). A subscription now waits for the
/// channel's unsubscription to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_subscribed_again_right_after_its_unsubscription_hears_its_fills() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let backend = connect(&cluster).await;
    let keys = FillKeys::new(&unique_ns("deaf"), "k");
    let node = cluster.node_for_key(keys.channel());
    for round in 0..400u64 {
        drop(backend.subscribe(&keys).await.unwrap());
        // Vary the gap, to meet the unsubscription at every stage.
        let spin = Duration::from_micros((round % 12) * 25);
        let t = std::time::Instant::now();
        while t.elapsed() < spin {
            std::hint::spin_loop();
        }
        let mut held = backend.subscribe(&keys).await.unwrap();
        let mut heard = false;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let subscribers = node.command(&["PUBSUB", "SHARDNUMSUB", keys.channel()]);
            if subscribers.trim_end().ends_with('1') {
                heard = true;
                break;
            }
        }
        assert!(
            heard,
            "round {round}: a held subscription with none on the server"
        );
        if round % 50 == 0 {
            backend
                .set(&keys, b"x", Duration::from_secs(10))
                .await
                .unwrap();
            tokio::time::timeout(Duration::from_secs(2), held.notified())
                .await
                .unwrap_or_else(|_| panic!("round {round}: the fill was not heard"));
        }
    }
}

/// Regression: a call its caller gave up on at once (a healthy
/// master had no time to answer) marked the master failing, and the
/// slot map was refreshed every 100–400 ms from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_at_once_does_not_count_against_a_healthy_master() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let backend = connect(&cluster).await;
    let keys = FillKeys::new(&unique_ns("cancel"), "k");
    backend.get(&keys).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = cluster_slots_calls(&cluster);
    let mut cancelled = 0;
    for _ in 0..20 {
        // Polled once, then dropped before the master could answer. On a
        // loaded machine the answer can come within that one poll (the
        // connection's task runs on the other worker): that call was not
        // given up, and is not counted.
        let mut get = backend.get(&keys);
        let pending =
            std::future::poll_fn(|cx| std::task::Poll::Ready(get.as_mut().poll(cx).is_pending()))
                .await;
        cancelled += usize::from(pending);
    }
    assert!(
        cancelled >= 10,
        "only {cancelled} of 20 calls were given up"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let refreshes = cluster_slots_calls(&cluster) - before;
    assert!(
        refreshes <= 1,
        "{refreshes} CLUSTER SLOTS after 20 cancelled calls"
    );
    backend.get(&keys).await.unwrap();
}

/// After a failover the old master's breaker is never called again. The
/// cache's circuit state leaves it out as soon as the slot map no longer
/// gives it a slot: `Closed` once the key is served by the promoted
/// replica. It used to count for 10 s more (as a master called recently),
/// so `circuit_state()` reported an outage that was over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_circuit_state_forgets_a_master_whose_slots_moved() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start_with_replicas(3, 1);
    let ns = unique_ns("orphan");
    let cache = Cache::<String, String>::builder()
        .namespace(&ns)
        .backend(connect(&cluster).await)
        .no_l1()
        .build()
        .unwrap();
    let key = "victim".to_owned();
    let keys = FillKeys::new(&ns, &key);
    let victim = cluster.node_for_key(keys.value());
    let slot = cluster.slot_of(keys.value());
    fetch(&cache, &key).await.unwrap();
    victim.pause();
    let _resume = Resume(victim);
    for _ in 0..8 {
        let _ = fetch(&cache, &key).await;
    }
    assert_eq!(cache.circuit_state(), CircuitState::Open);
    // Its replica is promoted (node timeout 1 s): every slot of the victim
    // moves.
    assert!(
        cluster
            .wait_until_slot_moves(slot, victim, Duration::from_secs(20))
            .is_some(),
        "the replica was promoted"
    );
    let mut served = false;
    for _ in 0..50 {
        if matches!(
            fetch(&cache, &key).await,
            Ok(Outcome::Loaded | Outcome::Hit)
        ) {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the key is served by its new master");
    assert_eq!(cache.circuit_state(), CircuitState::Closed);
}

/// Regression: with `cluster-preferred-endpoint-type
/// unknown-endpoint` (nodes behind a load balancer), `CLUSTER SLOTS` names
/// masters with a NULL endpoint, meaning "the node you asked".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_endpoints_mean_the_node_that_answered() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    for node in cluster.nodes() {
        node.command(&[
            "CONFIG",
            "SET",
            "cluster-preferred-endpoint-type",
            "unknown-endpoint",
        ]);
    }
    let cache = Cache::<String, String>::builder()
        .namespace(unique_ns("unknown"))
        .backend(connect(&cluster).await)
        .no_l1()
        .build()
        .unwrap();
    // Each master is found at the host of the node that answered, with the
    // port the cluster gives: keys of every master are served.
    for i in 0..20 {
        assert!(matches!(
            fetch(&cache, &format!("k{i}")).await,
            Ok(Outcome::Loaded)
        ));
    }
}
