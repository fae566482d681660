//! onefill as the README's least-privilege ACL user, taken word for word
//! (its namespaces `users` and `orders`): on a standalone server and on a
//! cluster, caches of those namespaces run a herd across two processes,
//! watch the holder and keep their L1s coherent without one refusal in
//! the server's `ACL LOG`; a namespace the line does not grant is an error
//! to its callers, never a silent load on the origin; and a user without
//! `SCRIPT LOAD` fails the connect. The conformance suite and the L1 tests
//! run as the same user (`redis_conformance.rs`, `l1_redis.rs`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::redis::RedisBackend;
use onefill::{BackendErrorKind, Cache, Error, L1};
use onefill_testkit::{time_limit, RedisCluster, RedisServer};

mod acl;

/// A cluster forms in a few seconds; past this a test hangs.
const LIMIT: Duration = Duration::from_secs(120);

/// What a herd's loader takes: long enough that every caller of both
/// processes arrives while it runs.
const LOAD: Duration = Duration::from_millis(300);

/// The README's line as it stands, with the L1's addition (and the
/// cluster's).
fn readme_line(cluster: bool) -> String {
    acl::readme(acl::Deployment { l1: true, cluster })
}

fn cache(ns: &str, backend: &RedisBackend) -> Cache<String, String> {
    Cache::builder()
        .namespace(ns)
        .backend(backend.clone())
        .l1(L1::new(1_000))
        .ttl(Duration::from_secs(60))
        .build()
        .expect("a cache")
}

/// 20 callers of `key` in each of two processes: one load between them.
async fn herd(a: &Cache<String, String>, b: &Cache<String, String>, key: &str) {
    let loads = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for cache in [a, b] {
        for _ in 0..20 {
            let (cache, loads, key) = (cache.clone(), loads.clone(), key.to_owned());
            calls.push(tokio::spawn(async move {
                cache
                    .get_or_load(&key, move |_| async move {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(LOAD).await;
                        Ok::<_, std::io::Error>("loaded".to_owned())
                    })
                    .await
            }));
        }
    }
    for call in calls {
        assert_eq!(call.await.expect("a call").expect("an answer"), "loaded");
    }
    assert_eq!(
        loads.load(Ordering::SeqCst),
        1,
        "one load for the herd of {key}"
    );
}

/// A `set` in one process reaches the other's L1 (which served the old
/// value from its L1 first).
async fn coherent(a: &Cache<String, String>, b: &Cache<String, String>, key: &str) {
    let key = key.to_owned();
    let served_from_l1 = async {
        for _ in 0..500 {
            let before = b.stats().l1_hits;
            b.get_or_load(&key, |_| async {
                Err::<String, _>(std::io::Error::other("no load"))
            })
            .await
            .expect("the stored value");
            if b.stats().l1_hits > before {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("B's L1 never served {key}");
    };
    served_from_l1.await;
    a.set(&key, "set by a".to_owned()).await.expect("a set");
    for _ in 0..200 {
        if b.get_or_load(&key, |_| async {
            Err::<String, _>(std::io::Error::other("no load"))
        })
        .await
        .expect("a value")
            == "set by a"
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("A's set never reached B's L1");
}

/// A cache of a namespace the user is not granted: its calls are errors
/// naming the refusal, strict mode or not, its loader never runs, and its
/// refused writes are not queued for replay.
async fn refused(backend: &RedisBackend) {
    let sessions = cache("sessions", backend);
    let loads = Arc::new(AtomicUsize::new(0));
    let counted = loads.clone();
    let err = sessions
        .get_or_load(&"s1".to_owned(), move |_| async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>("loaded".to_owned())
        })
        .await
        .expect_err("a namespace the ACL does not grant");
    let Error::Backend(e) = &err else {
        panic!("not a backend error: {err:?}");
    };
    assert_eq!(e.kind(), BackendErrorKind::NotPermitted, "{err}");
    assert!(
        err.to_string().contains("NOPERM") || err.to_string().contains("NoPerm"),
        "{err}"
    );
    assert_eq!(loads.load(Ordering::SeqCst), 0, "the origin was called");
    let err = sessions
        .set(&"s1".to_owned(), "v".to_owned())
        .await
        .expect_err("a write the ACL refuses");
    assert!(
        matches!(&err, Error::Backend(e) if e.kind() == BackendErrorKind::NotPermitted),
        "{err:?}"
    );
    assert_eq!(
        sessions.pending_writes(),
        0,
        "a refused write queued for replay"
    );
}

/// The server's `ACL LOG`: one line per refusal, naming what was refused.
fn acl_log(server: &RedisServer) -> Vec<String> {
    let log = server.command(&["ACL", "LOG"]);
    let mut refused = Vec::new();
    let mut lines = log.lines();
    while let Some(line) = lines.next() {
        if line == "object" {
            refused.push(lines.next().unwrap_or_default().to_owned());
        }
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_the_readme_user_runs_its_namespaces_and_nothing_else() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let url = server.acl_user(&readme_line(false));
    let (a, b) = (
        RedisBackend::connect(&url)
            .await
            .expect("connect as the user"),
        RedisBackend::connect(&url)
            .await
            .expect("connect as the user"),
    );
    for ns in ["users", "orders"] {
        let (ca, cb) = (cache(ns, &a), cache(ns, &b));
        herd(&ca, &cb, "1").await;
        coherent(&ca, &cb, "1").await;
    }
    assert_eq!(acl_log(&server), Vec::<String>::new(), "refusals");
    refused(&a).await;
    let log = acl_log(&server);
    assert!(
        !log.is_empty() && log.iter().all(|o| o.starts_with("sessions:")),
        "only the ungranted namespace is refused: {log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_the_readme_user_runs_its_namespaces_and_nothing_else() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let urls = cluster.acl_user(&readme_line(true));
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let (a, b) = (
        RedisBackend::connect_cluster(&urls)
            .await
            .expect("connect as the user"),
        RedisBackend::connect_cluster(&urls)
            .await
            .expect("connect as the user"),
    );
    for ns in ["users", "orders"] {
        let (ca, cb) = (cache(ns, &a), cache(ns, &b));
        // Keys on every master.
        for key in ["1", "2", "3", "4", "5", "6"] {
            herd(&ca, &cb, key).await;
        }
        coherent(&ca, &cb, "1").await;
    }
    for node in cluster.nodes() {
        assert_eq!(acl_log(node), Vec::<String>::new(), "refusals");
    }
    refused(&a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_script_load_the_backend_does_not_connect() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let line = readme_line(false);
    assert!(line.contains(" +script|load"), "{line}");
    let url = server.acl_user(&line.replace(" +script|load", ""));
    let err = RedisBackend::connect(&url)
        .await
        .expect_err("a user that cannot load the scripts");
    assert_eq!(err.kind(), BackendErrorKind::NotPermitted, "{err}");
    assert!(err.to_string().contains("'script|load'"), "{err}");
}

/// A user that may write a namespace's keys but not announce the changes
/// (no `+publish`): a fill whose announcement the ACL refuses (after its
/// value was written: a script does not roll back) is a `NotPermitted`
/// error to its callers, not an `Ok` whose waiters in other processes were
/// told nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_whose_announcement_is_refused_is_an_error() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let line = readme_line(false);
    assert!(line.contains(" +publish "), "{line}");
    let url = server.acl_user(&line.replace(" +publish ", " "));
    let backend = RedisBackend::connect(&url)
        .await
        .expect("connect as the user");
    let users = cache("users", &backend);
    let err = users
        .get_or_load(&"1".to_owned(), |_| async {
            Ok::<_, std::io::Error>("loaded".to_owned())
        })
        .await
        .expect_err("a fill the ACL refused in part");
    assert!(
        matches!(&err, Error::Backend(e) if e.kind() == BackendErrorKind::NotPermitted),
        "{err:?}"
    );
    assert!(err.to_string().contains("fill"), "{err}");
}

/// A user without `MGET` (the read of the namespace's marks): every call
/// is a `NotPermitted` error naming it, the first (cold) one too, and the
/// origin is never called, nothing stored: a value loaded under marks
/// nobody could read would be judged by a generation that was never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_mget_every_call_is_refused_and_nothing_is_loaded() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let line = readme_line(false);
    assert!(line.contains(" +mget "), "{line}");
    let url = server.acl_user(&line.replace(" +mget ", " "));
    let backend = RedisBackend::connect(&url)
        .await
        .expect("connect as the user");
    for l1 in [true, false] {
        let ns = if l1 { "users" } else { "orders" };
        let builder = Cache::builder()
            .namespace(ns)
            .backend(backend.clone())
            .ttl(Duration::from_secs(60));
        let cache: Cache<String, String> = if l1 {
            builder.l1(L1::new(1_000)).build().expect("a cache")
        } else {
            builder.no_l1().build().expect("a cache")
        };
        let loads = Arc::new(AtomicUsize::new(0));
        for attempt in 0..3 {
            let counted = loads.clone();
            let err = cache
                .get_or_load(&"1".to_owned(), move |_| async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>("loaded".to_owned())
                })
                .await
                .expect_err("a call whose marks the ACL refuses");
            assert!(
                matches!(&err, Error::Backend(e) if e.kind() == BackendErrorKind::NotPermitted),
                "call {attempt} (L1 {l1}): {err:?}"
            );
        }
        assert_eq!(
            loads.load(Ordering::SeqCst),
            0,
            "the origin was called (L1 {l1})"
        );
        let value_key = onefill::backend::FillKeys::new(ns, "1").value().to_owned();
        assert_eq!(
            server.command(&["EXISTS", &value_key]),
            "0",
            "a value was stored"
        );
    }
}

/// The Redis guide's line for an L1 without `CLIENT TRACKING`: the
/// README's without `+client|tracking`, with `+psubscribe` and the
/// announcement pattern of `users` as written. The users' L1s keep
/// coherent through onefill's announcements; the orders' pattern is not
/// granted, and that leaves their L1s out, not the users'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_l1_without_tracking_keeps_coherent_with_the_guides_grant() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let line = acl::readme(acl::Deployment {
        l1: false,
        cluster: false,
    });
    let url = server.acl_user(&format!("{line} +psubscribe &users:{{*:filled"));
    let (a, b) = (
        RedisBackend::connect(&url)
            .await
            .expect("connect as the user"),
        RedisBackend::connect(&url)
            .await
            .expect("connect as the user"),
    );
    // A namespace whose announcements the line does not grant, its
    // caches built first on the same backends: their L1s never serve,
    // and the users' L1s, on the same connections, are not held back.
    let (oa, ob) = (cache("orders", &a), cache("orders", &b));
    let (ca, cb) = (cache("users", &a), cache("users", &b));
    herd(&ca, &cb, "1").await;
    coherent(&ca, &cb, "1").await;
    herd(&oa, &ob, "1").await;
    for _ in 0..20 {
        let value = oa
            .get_or_load(&"1".to_owned(), |_| async {
                Err::<String, _>(std::io::Error::other("no load"))
            })
            .await
            .expect("the stored value");
        assert_eq!(value, "loaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(oa.stats().l1_hits, 0, "an L1 whose changes it cannot hear");
    let log = acl_log(&server);
    assert!(
        log.iter()
            .all(|o| o == "client|tracking" || o == "orders:{*:filled"),
        "refusals other than tracking and the orders' announcements: {log:?}"
    );
}

/// The Redis guide shows the README's line, word for word.
#[test]
fn the_guide_shows_the_readme_line() {
    let guide = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide/redis.md"));
    let line = acl::readme(acl::Deployment {
        l1: true,
        cluster: false,
    });
    assert!(guide.lines().any(|l| l == line), "{line}");
}

/// `check_namespace` with the README's user, and with that user missing
/// one grant at a time: each missing grant is named (with the server's
/// words), a granted namespace passes, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_namespace_names_every_grant_the_user_lacks() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let line = readme_line(false);
    let backend = RedisBackend::connect(&server.acl_user(&line))
        .await
        .expect("connect as the user");
    backend.check_namespace("users").await.expect("granted");
    backend.check_namespace("orders").await.expect("granted");
    let err = backend
        .check_namespace("sessions")
        .await
        .expect_err("not granted");
    assert_eq!(err.kind(), BackendErrorKind::NotPermitted, "{err}");
    for need in [
        "MGET of its marks",
        "GET of its values",
        "the scripts on its keys",
        "PUBLISH on its channels",
        "SUBSCRIBE to its channels",
    ] {
        assert!(err.to_string().contains(need), "{need}: {err}");
    }
    assert!(err.to_string().contains("sessions"), "{err}");
    assert!(!err.to_string().contains("onefill:holder"), "{err}");

    // The user without one grant at a time, on a backend of its own.
    let presence = "onefill:holder:*";
    for (grant, named) in [
        (" +mget ", &["MGET of its marks"][..]),
        // The scripts announce their changes: refused inside them too.
        (
            " +publish ",
            &[
                "the scripts on its keys",
                "PUBLISH on its channels",
                presence,
            ],
        ),
        (" +subscribe ", &["SUBSCRIBE to its channels", presence]),
        (" +evalsha ", &["the scripts on its keys"]),
        // Commands a script runs: refused inside it.
        (" +set ", &["the scripts on its keys"]),
        (" +pexpireat ", &["the scripts on its keys"]),
        (" &onefill:holder:* ", &[presence]),
    ] {
        assert!(line.contains(grant), "{grant}: {line}");
        let url = server.acl_user(&line.replace(grant, " "));
        let backend = RedisBackend::connect(&url)
            .await
            .expect("connect as the user");
        let err = backend.check_namespace("users").await.expect_err(grant);
        assert_eq!(err.kind(), BackendErrorKind::NotPermitted, "{grant}: {err}");
        for need in named {
            assert!(err.to_string().contains(need), "{grant}: {need}: {err}");
        }
        assert_eq!(
            err.to_string().matches("; ").count() + 1,
            named.len(),
            "{grant}: only what is missing is named: {err}"
        );
    }
    assert_eq!(
        server.command(&["DBSIZE"]),
        "0",
        "the check wrote something"
    );
}

/// On a cluster, the README's user with the cluster's additions passes
/// the check, and a namespace it is not granted does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_check_namespace_passes_the_readme_user() {
    let _limit = time_limit(LIMIT);
    let cluster = RedisCluster::start(3);
    let urls = cluster.acl_user(&readme_line(true));
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let backend = RedisBackend::connect_cluster(&urls)
        .await
        .expect("connect as the user");
    backend.check_namespace("users").await.expect("granted");
    let err = backend
        .check_namespace("sessions")
        .await
        .expect_err("not granted");
    assert_eq!(err.kind(), BackendErrorKind::NotPermitted, "{err}");
    assert!(err.to_string().contains("MGET of its marks"), "{err}");

    // Right after a change of the slot map (an empty slot moved, and a
    // read of it learning so), no channel counts as confirmed for a
    // while: the check still passes (it once reported SUBSCRIBE refused
    // for about two seconds).
    let moved = onefill::backend::FillKeys::new("users", "moved");
    let slot = cluster.slot_of(moved.value());
    let source = cluster.master_of_slot(slot, None).expect("an owner");
    let target = cluster
        .nodes()
        .iter()
        .find(|n| n.port() != source.port())
        .expect("another master");
    cluster.begin_migration(slot, source, target);
    cluster.end_migration(slot, target, &[]);
    let _ = onefill::backend::Backend::get(&backend, &moved).await;
    backend
        .check_namespace("users")
        .await
        .expect("granted, the slot map just changed");
    // And a namespace the builder would refuse is an error, not a probe.
    let err = backend.check_namespace("a{b}").await.expect_err("refused");
    assert_eq!(err.kind(), BackendErrorKind::Command, "{err}");
}

/// Every warning event's message and fields, for the whole test binary
/// (the background check logs from a task on any worker thread).
fn warnings() -> &'static std::sync::Mutex<Vec<String>> {
    use tracing_subscriber::layer::SubscriberExt;

    static WARNINGS: std::sync::OnceLock<std::sync::Mutex<Vec<String>>> =
        std::sync::OnceLock::new();
    struct Warnings;
    struct Text(String);
    impl tracing::field::Visit for Text {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            if *event.metadata().level() == tracing::Level::WARN {
                let mut text = Text(String::new());
                event.record(&mut text);
                if let Some(warnings) = WARNINGS.get() {
                    warnings
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(text.0);
                }
            }
        }
    }
    WARNINGS.get_or_init(|| {
        let _ =
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Warnings));
        std::sync::Mutex::new(Vec::new())
    })
}

/// A cache built on a Redis backend checks its namespace's grants in the
/// background, once per backend: a user lacking one is a warning naming
/// the namespace and what is missing, before any call is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn building_a_cache_warns_of_a_missing_grant() {
    let _limit = time_limit(LIMIT);
    let warnings = warnings();
    let server = RedisServer::start();
    let line = readme_line(false);
    let url = server.acl_user(&line.replace(" +publish ", " "));
    let backend = RedisBackend::connect(&url)
        .await
        .expect("connect as the user");
    let warned = |ns: &str| {
        warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|w| w.contains(&format!("namespace={ns:?}")))
            .cloned()
            .collect::<Vec<_>>()
    };
    let _users = cache("users", &backend);
    let _again = cache("users", &backend);
    let began = std::time::Instant::now();
    while warned("users").is_empty() && began.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Time for a second check's warning, if the second build ran one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let users = warned("users");
    assert_eq!(
        users.len(),
        1,
        "one warning per namespace and backend: {users:?}"
    );
    assert!(users[0].contains("PUBLISH on its channels"), "{users:?}");
}
