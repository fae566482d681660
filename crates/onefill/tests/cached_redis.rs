//! `#[onefill::cached]` on the Redis default named by `ONEFILL_REDIS_URL`
//! (a private server of the test kit): connected once, in the default's
//! own runtime, so the runtime of whichever caller came first may end and
//! later callers, async or sync, still reach it. One test: the binary's one
//! default is set from the environment at its first call.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use onefill::redis::RedisBackend;
use onefill::Cache;
use onefill_testkit::{time_limit, RedisServer};

onefill::default_backend!(onefill::DefaultBackend::redis_from_env());

static LOADS: AtomicUsize = AtomicUsize::new(0);

#[onefill::cached(ttl = "1h", namespace = "cached-redis")]
async fn user(id: u64) -> anyhow::Result<String> {
    LOADS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("user {id}"))
}

#[onefill::cached(ttl = "1h", namespace = "cached-redis-sync")]
fn user_sync(id: u64) -> anyhow::Result<String> {
    LOADS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("user {id}"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn the_redis_default_outlives_the_first_callers_runtime() {
    let _limit = time_limit(Duration::from_secs(60));
    let server = RedisServer::start();
    // Safe here: the binary's only test, before any thread reads it.
    std::env::set_var(onefill::REDIS_URL_VAR, server.url());

    // The first caller's runtime connects nothing of its own, and ends.
    let first = runtime();
    assert_eq!(first.block_on(user(1)).unwrap(), "user 1");
    drop(first);

    let second = runtime();
    assert_eq!(second.block_on(user(1)).unwrap(), "user 1");
    assert_eq!(second.block_on(user(2)).unwrap(), "user 2");
    assert_eq!(user_sync(3).unwrap(), "user 3");
    assert_eq!(user_sync(3).unwrap(), "user 3");
    assert_eq!(
        LOADS.load(Ordering::SeqCst),
        3,
        "user 1 once, user 2, user 3 once"
    );

    // The values are on the server, under the functions' namespaces.
    second.block_on(async {
        let backend = RedisBackend::connect(&server.url()).await.unwrap();
        let reader = |namespace: &str| -> Cache<String, String> {
            Cache::builder()
                .namespace(namespace)
                .backend(backend.clone())
                .build()
                .unwrap()
        };
        let stored = reader("cached-redis").get("1").await.unwrap();
        assert_eq!(stored.as_deref(), Some("user 1"));
        let stored = reader("cached-redis-sync").get("3").await.unwrap();
        assert_eq!(stored.as_deref(), Some("user 3"));
    });
}
