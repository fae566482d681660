//! A lease holder's liveness on real Redis, every option at its default.
//! Two runtimes stand for two processes, each with a backend of its own:
//! the holder's is shut down (its connections close, as a killed process's
//! do) or blocked (its connections stay open and say nothing, as a stopped
//! process's do), and the waiter must take the lease over when its watch
//! says so, not when the lease (10 s for a watched holder) expires. A live
//! holder is waited for without re-checks, and a holder that learns it lost
//! its lease says so, so nobody waits for a fill that never comes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onefill::backend::FillKeys;
use onefill::redis::RedisBackend;
use onefill::Cache;
use onefill_testkit::{time_limit, RedisCluster, RedisServer, Reply};
use tokio::runtime::Runtime;

/// Each test waits out a load of a few seconds; past this it hangs.
const LIMIT: Duration = Duration::from_secs(60);

fn unique_ns(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "live-{}-{}-{name}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A runtime standing for one process.
fn process(threads: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .unwrap()
}

/// A cache with every option at its default, on a backend of its own.
fn cache(rt: &Runtime, server: &RedisServer, ns: &str) -> Cache<String, String> {
    rt.block_on(async {
        let backend = RedisBackend::connect(&server.url()).await.unwrap();
        Cache::builder()
            .namespace(ns)
            .backend(backend)
            .build()
            .unwrap()
    })
}

/// When each load began, by the cache that ran it.
#[derive(Clone, Default)]
struct Loads(Arc<Mutex<Vec<(&'static str, Instant)>>>);

impl Loads {
    fn started(&self, who: &'static str) {
        self.0.lock().unwrap().push((who, Instant::now()));
    }
    fn all(&self) -> Vec<(&'static str, Instant)> {
        self.0.lock().unwrap().clone()
    }
    fn of(&self, who: &str) -> Option<Instant> {
        self.all()
            .into_iter()
            .find(|(w, _)| *w == who)
            .map(|(_, at)| at)
    }
    /// Waits (polling) until `who` has started a load.
    fn wait_for(&self, who: &str) -> Instant {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(at) = self.of(who) {
                return at;
            }
            assert!(Instant::now() < until, "{who} never loaded");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The holder's process and the waiter's (one and two worker threads),
/// each with a cache of `ns` on `server`.
fn two_processes(
    server: &RedisServer,
    ns: &str,
) -> (
    Runtime,
    Runtime,
    Cache<String, String>,
    Cache<String, String>,
) {
    let (holder_rt, waiter_rt) = (process(1), process(2));
    let holder = cache(&holder_rt, server, ns);
    let waiter = cache(&waiter_rt, server, ns);
    (holder_rt, waiter_rt, holder, waiter)
}

/// The holder's call of the key: a load of `load` (tokio time) answering
/// `holder`, recorded in `loads`.
fn hold(
    rt: &Runtime,
    cache: &Cache<String, String>,
    loads: &Loads,
    load: Duration,
) -> tokio::task::JoinHandle<Result<String, onefill::Error>> {
    let (cache, loads) = (cache.clone(), loads.clone());
    rt.spawn(async move {
        cache
            .get_or_load(&"k".to_owned(), move |_| async move {
                loads.started("holder");
                tokio::time::sleep(load).await;
                Ok::<_, std::io::Error>("holder".to_owned())
            })
            .await
    })
}

/// The waiter's call: a 50 ms load answering `waiter`.
fn waiter_call(
    rt: &Runtime,
    cache: &Cache<String, String>,
    loads: &Loads,
) -> tokio::task::JoinHandle<String> {
    let (cache, loads) = (cache.clone(), loads.clone());
    rt.spawn(async move {
        cache
            .get_or_load(&"k".to_owned(), move |_| async move {
                loads.started("waiter");
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, std::io::Error>("waiter".to_owned())
            })
            .await
            .unwrap()
    })
}

/// Waits until the cache counts one waiting flight (it has watched the
/// holder), at most 5 s.
fn until_waiting(cache: &Cache<String, String>) {
    let until = Instant::now() + Duration::from_secs(5);
    while cache.stats().waits == 0 {
        assert!(Instant::now() < until, "the waiter never waited");
        std::thread::sleep(Duration::from_millis(2));
    }
    // Its watch is made right after the wait starts.
    std::thread::sleep(Duration::from_millis(50));
}

/// Two processes as `two_processes` or `two_cluster_processes` make them.
type Processes = (
    Runtime,
    Runtime,
    Cache<String, String>,
    Cache<String, String>,
);

/// The holder's process dies mid-load: the waiter takes over within about
/// a beat, not at the lease's expiry.
fn a_dead_holder_is_taken_over_within_a_beat((holder_rt, waiter_rt, holder, waiter): Processes) {
    let loads = Loads::default();
    let l = loads.clone();
    let h = holder.clone();
    holder_rt.spawn(async move {
        let _ = h
            .get_or_load(&"k".to_owned(), move |_| async move {
                l.started("holder");
                std::future::pending::<()>().await;
                Ok::<_, std::io::Error>("never".to_owned())
            })
            .await;
    });
    loads.wait_for("holder");
    let answer = waiter_call(&waiter_rt, &waiter, &loads);
    until_waiting(&waiter);
    // The holder's process dies: its tasks are dropped where they stand
    // and its connections close; nothing releases its lease.
    let died = Instant::now();
    holder_rt.shutdown_background();
    let taken = loads.wait_for("waiter");
    assert_eq!(waiter_rt.block_on(answer).unwrap(), "waiter");
    let after = taken - died;
    // Within a beat (90 ms) and the 10 ms it may be late, and a round trip
    // to take the lease over; slack for a busy machine, far below the
    // watched lease's 10 s.
    assert!(
        after < Duration::from_millis(600),
        "taken over after {after:?}"
    );
    let stats = waiter.stats();
    assert_eq!(
        (
            stats.holders_dead,
            stats.holders_frozen,
            stats.lease_takeovers
        ),
        (1, 0, 1),
        "{stats:?}"
    );
    assert_eq!(loads.all().len(), 2);
}

/// The holder's process stops mid-load (connections open, silent): the
/// waiter takes over after a second of silence and the holder's fill,
/// once it thaws, is fenced. Returns the holder's cache.
fn a_frozen_holder_is_taken_over_after_a_second(
    (holder_rt, waiter_rt, holder, waiter): Processes,
) -> Cache<String, String> {
    let loads = Loads::default();
    let frozen_at = Arc::new(Mutex::new(None::<Instant>));
    let (l, f) = (loads.clone(), frozen_at.clone());
    let h = holder.clone();
    let held = holder_rt.spawn(async move {
        h.get_or_load(&"k".to_owned(), move |_| async move {
            l.started("holder");
            // Responsive long enough for the waiter to watch it and for
            // its beats to start, then the whole process stops (its one
            // worker thread blocked): no beat, connections open.
            tokio::time::sleep(Duration::from_millis(400)).await;
            *f.lock().unwrap() = Some(Instant::now());
            std::thread::sleep(Duration::from_millis(3_000));
            Ok::<_, std::io::Error>("holder".to_owned())
        })
        .await
    });
    loads.wait_for("holder");
    let answer = waiter_call(&waiter_rt, &waiter, &loads);
    until_waiting(&waiter);
    let taken = loads.wait_for("waiter");
    assert_eq!(waiter_rt.block_on(answer).unwrap(), "waiter");
    let froze = frozen_at.lock().unwrap().expect("the holder froze");
    let after = taken - froze;
    // A second of silence since the last beat (which came at most a beat
    // before the freeze); the holder's lease had 10 s left.
    assert!(
        after >= Duration::from_millis(850) && after < Duration::from_millis(2_500),
        "taken over {after:?} after the freeze"
    );
    let stats = waiter.stats();
    assert_eq!(
        (
            stats.holders_dead,
            stats.holders_frozen,
            stats.lease_takeovers
        ),
        (0, 1, 1),
        "{stats:?}"
    );
    // Thawed, the holder answers its own callers but stores nothing: its
    // lease is the waiter's now.
    assert_eq!(holder_rt.block_on(held).unwrap().unwrap(), "holder");
    assert_eq!(holder.stats().fills_fenced, 1, "{:?}", holder.stats());
    holder
}

#[test]
fn a_holder_whose_process_dies_is_taken_over_within_a_beat() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("dies");
    a_dead_holder_is_taken_over_within_a_beat(two_processes(&server, &ns));
}

#[test]
fn a_frozen_holder_is_taken_over_after_a_second_of_silence_and_its_fill_is_fenced() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("frozen");
    a_frozen_holder_is_taken_over_after_a_second(two_processes(&server, &ns));
    let keys = FillKeys::new(&ns, "k");
    let stored = server.query(&["GET", keys.value()]);
    assert!(
        matches!(&stored, Reply::Bulk(Some(bytes)) if bytes.ends_with(b"\"waiter\"")),
        "{stored:?}"
    );
}

#[test]
fn a_live_holder_is_waited_for_without_a_re_check() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("alive");
    let (holder_rt, waiter_rt, holder, waiter) = two_processes(&server, &ns);
    let loads = Loads::default();
    // Longer than the safety poll (3 s ±25 %) and than the lease an
    // unwatched holder gets (3 s before any load was measured).
    hold(&holder_rt, &holder, &loads, Duration::from_millis(4_500));
    loads.wait_for("holder");
    let answer = waiter_call(&waiter_rt, &waiter, &loads);
    assert_eq!(waiter_rt.block_on(answer).unwrap(), "holder");
    let stats = waiter.stats();
    // Woken once, by the fill; no poll, no verdict, no load of its own.
    assert_eq!(
        (
            stats.wait_notified,
            stats.wait_polls,
            stats.holders_dead + stats.holders_frozen
        ),
        (1, 0, 0),
        "{stats:?}"
    );
    assert_eq!(loads.all().len(), 1);
}

/// A holder whose lease is deleted behind its back (another client, an
/// eviction) says so when its watchdog next finds it gone, or its fill
/// does: its waiters re-check then, rather than wait (alive, watched) for
/// a fill that never comes.
#[test]
fn a_holder_that_finds_its_lease_gone_says_so_to_its_waiters() {
    let _limit = time_limit(LIMIT);
    for (load_ms, told_by) in [(6_000, "the watchdog"), (2_000, "the fenced fill")] {
        let server = RedisServer::start();
        let ns = unique_ns("lost");
        let (holder_rt, waiter_rt, holder, waiter) = two_processes(&server, &ns);
        let loads = Loads::default();
        hold(&holder_rt, &holder, &loads, Duration::from_millis(load_ms));
        let started = loads.wait_for("holder");
        let answer = waiter_call(&waiter_rt, &waiter, &loads);
        until_waiting(&waiter);
        let keys = FillKeys::new(&ns, "k");
        server.query(&["DEL", keys.lock()]);
        let taken = loads.wait_for("waiter") - started;
        assert_eq!(waiter_rt.block_on(answer).unwrap(), "waiter");
        // The watchdog renews a watched holder's 10 s lease every third
        // of it (3.3 s); the fill comes at the end of the load. Without a
        // word from the holder the waiter would wait for its deadline
        // (10 s).
        let by = match load_ms {
            6_000 => Duration::from_millis(4_500),
            _ => Duration::from_millis(3_000),
        };
        assert!(taken < by, "{told_by}: the waiter loaded after {taken:?}");
        assert_eq!(waiter.stats().degraded_loads, 0, "{told_by}");
        drop(holder_rt);
    }
}

/// The total of connections the server accepted so far.
fn connections_received(server: &RedisServer) -> u64 {
    let info = server.command(&["INFO", "stats"]);
    info.lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats counts connections")
}

/// An ACL that grants a deployment its namespaces' channels but not the
/// holders' presence channels (a least-privilege setup made before
/// liveness existed): the server refuses a `SUBSCRIBE` naming one of
/// them as a whole, which must cost the liveness only, not the fill
/// notifications (nor bring the subscriber connection down to reconnect
/// again and again).
#[test]
fn an_acl_without_the_presence_channels_keeps_the_fill_notifications() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("acl");
    server.query(&[
        "ACL", "SETUSER", "app", "on", ">pw", "~live-*", "&live-*", "+@all",
    ]);
    let url = format!("redis://app:pw@127.0.0.1:{}", server.port());
    let (holder_rt, waiter_rt) = (process(1), process(2));
    let connect = |rt: &Runtime| -> Cache<String, String> {
        rt.block_on(async {
            let backend = RedisBackend::connect(&url).await.unwrap();
            Cache::builder()
                .namespace(&ns)
                .backend(backend)
                .build()
                .unwrap()
        })
    };
    let (holder, waiter) = (connect(&holder_rt), connect(&waiter_rt));
    let before = connections_received(&server);
    let loads = Loads::default();
    hold(&holder_rt, &holder, &loads, Duration::from_millis(1_500));
    loads.wait_for("holder");
    let answer = waiter_call(&waiter_rt, &waiter, &loads);
    until_waiting(&waiter);
    let keys = FillKeys::new(&ns, "k");
    let subscribed = server.query(&["PUBSUB", "NUMSUB", keys.channel()]);
    assert_eq!(waiter_rt.block_on(answer).unwrap(), "holder");
    assert!(
        matches!(&subscribed, Reply::Array(Some(r)) if r.get(1).and_then(Reply::as_int) == Some(1)),
        "the fill channel is not subscribed: {subscribed:?}"
    );
    let stats = waiter.stats();
    // Woken by the fill alone; the holder (anonymous: its presence is not
    // confirmed) is waited for as before liveness, within its lease.
    assert_eq!((stats.wait_notified, stats.wait_polls), (1, 0), "{stats:?}");
    assert_eq!(loads.all().len(), 1);
    // No connection was lost meanwhile: the other clients' at most.
    let after = connections_received(&server);
    assert!(after - before < 5, "{} connections", after - before);
}

/// A waiting process whose own executor stalls (a blocking call on its
/// one thread) for longer than a holder may stay silent: the beats its
/// live holder sent meanwhile are still unread when it wakes, and that is
/// its silence, not the holder's. Eight waits on eight keys of the same
/// holder, each judging alone: none may take it for frozen.
#[test]
fn a_waiter_that_stalls_itself_does_not_take_a_live_holder_for_frozen() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("stall");
    let (holder_rt, waiter_rt) = (process(2), process(1));
    let (holder, waiter) = (
        cache(&holder_rt, &server, &ns),
        cache(&waiter_rt, &server, &ns),
    );
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let loads = Arc::new(AtomicUsize::new(0));
    let held: Vec<_> = keys
        .iter()
        .map(|key| {
            let (h, key) = (holder.clone(), key.clone());
            holder_rt.spawn(async move {
                h.get_or_load(&key, |_| async {
                    tokio::time::sleep(Duration::from_millis(2_500)).await;
                    Ok::<_, std::io::Error>("holder".to_owned())
                })
                .await
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let waits: Vec<_> = keys
        .iter()
        .map(|key| {
            let (w, key, loads) = (waiter.clone(), key.clone(), loads.clone());
            waiter_rt.spawn(async move {
                w.get_or_load(&key, move |_| async move {
                    loads.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>("waiter".to_owned())
                })
                .await
                .unwrap()
            })
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(5);
    while waiter.stats().waits < 8 {
        assert!(Instant::now() < until, "the waiters never waited");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(300));
    // The waiting process stops running for 1.3 s; its holder beats on.
    waiter_rt.spawn(async { std::thread::sleep(Duration::from_millis(1_300)) });
    for wait in waits {
        assert_eq!(waiter_rt.block_on(wait).unwrap(), "holder");
    }
    for h in held {
        holder_rt.block_on(h).unwrap().unwrap();
    }
    let stats = waiter.stats();
    assert_eq!(
        (stats.holders_frozen, loads.load(Ordering::SeqCst)),
        (0, 0),
        "{stats:?}"
    );
}

/// A loader that blocks its process's executor (sync I/O, CPU work on a
/// one-thread runtime) for longer than a second is judged frozen, as
/// decided; the process that takes over runs the same loader and looks
/// frozen in turn, but a lease taken over from a frozen holder is never
/// judged frozen itself: one more load, not one per process. (It once took
/// four loads here, the last answer at 5.7 s.)
#[test]
fn a_blocking_loader_is_not_taken_over_by_every_process_in_turn() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let ns = unique_ns("blocking");
    let processes: Vec<Runtime> = (0..4).map(|_| process(1)).collect();
    let caches: Vec<_> = processes.iter().map(|rt| cache(rt, &server, &ns)).collect();
    let loads = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = processes
        .iter()
        .zip(&caches)
        .map(|(rt, c)| {
            let (c, loads) = (c.clone(), loads.clone());
            let call = rt.spawn(async move {
                c.get_or_load(&"k".to_owned(), move |_| async move {
                    loads.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(2_500));
                    Ok::<_, std::io::Error>("loaded".to_owned())
                })
                .await
            });
            std::thread::sleep(Duration::from_millis(50));
            call
        })
        .collect();
    for (rt, call) in processes.iter().zip(calls) {
        rt.block_on(call).unwrap().unwrap();
    }
    assert!(
        loads.load(Ordering::SeqCst) <= 2,
        "{} loads",
        loads.load(Ordering::SeqCst)
    );
}

/// The holder's process and the waiter's on a Redis Cluster, each with a
/// cache of `ns` on a cluster backend of its own.
fn two_cluster_processes(cluster: &RedisCluster, ns: &str) -> Processes {
    let (holder_rt, waiter_rt) = (process(1), process(2));
    let urls = cluster.urls();
    let cache = |rt: &Runtime| {
        rt.block_on(async {
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            let backend = RedisBackend::connect_cluster(&urls).await.unwrap();
            Cache::builder()
                .namespace(ns)
                .backend(backend)
                .build()
                .unwrap()
        })
    };
    let (holder, waiter) = (cache(&holder_rt), cache(&waiter_rt));
    (holder_rt, waiter_rt, holder, waiter)
}

/// On a Redis Cluster too (presence and beats sharded, on the master of
/// the key's slot): a holder whose process dies is taken over within about
/// a beat, not at its lease's expiry.
#[test]
fn on_a_cluster_a_holder_whose_process_dies_is_taken_over_within_a_beat() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let ns = unique_ns("cluster-dies");
    a_dead_holder_is_taken_over_within_a_beat(two_cluster_processes(&cluster, &ns));
}

/// On a Redis Cluster, a holder whose process stops (its connections open,
/// silent) is taken over after a second of silence.
#[test]
fn on_a_cluster_a_frozen_holder_is_taken_over_after_a_second_of_silence() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let ns = unique_ns("cluster-frozen");
    a_frozen_holder_is_taken_over_after_a_second(two_cluster_processes(&cluster, &ns));
}

/// The server's clients subscribed to at least one channel, by port (the
/// `addr` of `CLIENT LIST`).
fn subscribed_ports(server: &RedisServer) -> Vec<u16> {
    server
        .command(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| {
            line.split(' ')
                .any(|f| f.strip_prefix("sub=").is_some_and(|n| n != "0"))
        })
        .filter_map(|line| {
            let addr = line.split(' ').find_map(|f| f.strip_prefix("addr="))?;
            addr.rsplit(':').next()?.parse().ok()
        })
        .collect()
}

/// The waiter's subscriber connection goes half-open while it waits for a
/// live holder (its bytes dropped both ways, nothing closed: a lost route,
/// a firewall dropping the flow). The holder's beats stop arriving, though
/// it beats on. The waiter does not take that silence for a frozen holder:
/// before its verdict it pings its own connection, which does not answer,
/// so it replaces the connection and cannot tell; the holder's fill, heard
/// on the new connection, answers it. (Before, it judged the live holder
/// frozen after a second and loaded again.)
#[test]
fn a_waiter_whose_own_connection_goes_half_open_does_not_judge_a_live_holder_frozen() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let proxy = onefill_testkit::Endpoint::start(server.port());
    let ns = unique_ns("half-open");
    let (holder_rt, waiter_rt) = (process(1), process(2));
    let holder = cache(&holder_rt, &server, &ns);
    let waiter = waiter_rt.block_on(async {
        let backend = RedisBackend::connect(&proxy.url()).await.unwrap();
        Cache::<String, String>::builder()
            .namespace(&ns)
            .backend(backend)
            .build()
            .unwrap()
    });
    let loads = Loads::default();
    let held = hold(&holder_rt, &holder, &loads, Duration::from_millis(3_000));
    loads.wait_for("holder");
    let answer = waiter_call(&waiter_rt, &waiter, &loads);
    until_waiting(&waiter);
    // The waiter's subscriber: its connection through the proxy that the
    // server counts as subscribed.
    let through_proxy = proxy.upstream_ports();
    let subscriber: Vec<u16> = subscribed_ports(&server)
        .into_iter()
        .filter(|port| through_proxy.contains(port))
        .collect();
    assert_eq!(subscriber.len(), 1, "{subscriber:?} of {through_proxy:?}");
    proxy.blackhole(subscriber[0]);
    assert_eq!(waiter_rt.block_on(answer).unwrap(), "holder");
    assert_eq!(holder_rt.block_on(held).unwrap().unwrap(), "holder");
    let stats = waiter.stats();
    assert_eq!(
        (stats.holders_frozen, stats.lease_takeovers),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(loads.all().len(), 1, "one load: the holder's");
}
