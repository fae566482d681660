//! `#[onefill::cached]`: async and sync functions, each form of return
//! type, keys, namespaces, freshness, errors and reference arguments,
//! observed through the calls' answers, the loads counted in the bodies,
//! and what a second cache on the same backend reads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use onefill::{BlockingCache, Cache, MemoryBackend};
use onefill_testkit::time_limit;

/// The backend every function without `cache = …` shares; the tests read
/// it through caches of their own to see the namespaces and keys.
static BACKEND: LazyLock<MemoryBackend> = LazyLock::new(MemoryBackend::new);

onefill::default_backend!(BACKEND.clone());

const LIMIT: Duration = Duration::from_secs(60);

/// A cache on the shared backend, reading what a function stored.
fn reader(namespace: &str) -> Cache<String, String> {
    Cache::builder()
        .namespace(namespace)
        .backend(BACKEND.clone())
        .build()
        .unwrap()
}

/// A connection pool as applications have them: a cheap `Clone` handle,
/// neither `Display` nor `'static` when borrowed.
#[derive(Clone)]
struct Pool {
    loads: Arc<AtomicUsize>,
}

impl Pool {
    fn new() -> Pool {
        Pool {
            loads: Arc::new(AtomicUsize::new(0)),
        }
    }
    fn loads(&self) -> usize {
        self.loads.load(Ordering::SeqCst)
    }
    fn query(&self, what: String) -> String {
        self.loads.fetch_add(1, Ordering::SeqCst);
        what
    }
}

mod async_fns {
    use super::*;

    #[onefill::cached(skip(pool))]
    async fn slow_user(id: u64, pool: &Pool) -> anyhow::Result<String> {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok(pool.query(format!("user {id}")))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_load_for_many_concurrent_callers() {
        let _limit = time_limit(LIMIT);
        let pool = Pool::new();
        let callers: Vec<_> = (0..50)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { slow_user(7, &pool).await.unwrap() })
            })
            .collect();
        for caller in callers {
            assert_eq!(caller.await.unwrap(), "user 7");
        }
        assert_eq!(pool.loads(), 1, "fifty callers, one load");
    }

    #[onefill::cached(key = "{id}", namespace = "async-keys")]
    async fn translated(id: u64, lang: &str, pool: &Pool) -> anyhow::Result<String> {
        Ok(pool.query(format!("{id} in {lang}")))
    }

    #[tokio::test]
    async fn the_key_is_what_the_format_names() {
        let pool = Pool::new();
        assert_eq!(translated(1, "en", &pool).await.unwrap(), "1 in en");
        assert_eq!(
            translated(1, "fr", &pool).await.unwrap(),
            "1 in en",
            "lang is not in the key"
        );
        assert_eq!(translated(2, "fr", &pool).await.unwrap(), "2 in fr");
        assert_eq!(pool.loads(), 2);
        let stored = reader("async-keys").get("1").await.unwrap();
        assert_eq!(
            stored.as_deref(),
            Some("1 in en"),
            "key `1` in namespace `async-keys`"
        );
    }

    #[onefill::cached(skip(pool))]
    async fn pair(a: &str, b: u32, pool: &Pool) -> anyhow::Result<String> {
        Ok(pool.query(format!("{a}/{b}")))
    }

    #[tokio::test]
    async fn the_default_key_joins_the_arguments_not_skipped_in_the_functions_namespace() {
        let pool = Pool::new();
        assert_eq!(pair("a:b", 1, &pool).await.unwrap(), "a:b/1");
        assert_eq!(
            pair("a:b", 1, &Pool::new()).await.unwrap(),
            "a:b/1",
            "pool is skipped"
        );
        assert_eq!(pool.loads(), 1);
        // The namespace is the function's path; several parts are joined
        // by `:`, each escaped.
        let stored = reader("cached::async_fns::pair")
            .get("a%3Ab:1")
            .await
            .unwrap();
        assert_eq!(stored.as_deref(), Some("a:b/1"));
    }

    #[onefill::cached(namespace = "one-argument")]
    async fn bracketed(text: &str) -> Option<String> {
        Some(format!("<{text}>"))
    }

    #[onefill::cached]
    async fn bracketed_fallible(text: String) -> anyhow::Result<String> {
        Ok(format!("<{text}>"))
    }

    /// A key cannot be empty: an argument alone in the key that displays
    /// as nothing has a key of its own (`%`, which no other one is, as
    /// `%` is escaped), not an invalid-key error (an `Option` function's
    /// `None`).
    #[tokio::test]
    async fn an_argument_displaying_as_nothing_is_cached_too() {
        assert_eq!(bracketed("").await.as_deref(), Some("<>"));
        assert_eq!(bracketed("%").await.as_deref(), Some("<%>"));
        assert_eq!(bracketed_fallible(String::new()).await.unwrap(), "<>");
        let stored = reader("one-argument");
        assert_eq!(stored.get("%").await.unwrap().as_deref(), Some("<>"));
        assert_eq!(stored.get("%25").await.unwrap().as_deref(), Some("<%>"));
    }

    #[onefill::cached(namespace = "long-keys", max_key_bytes = 4096)]
    async fn long_key(text: String) -> anyhow::Result<usize> {
        Ok(text.len())
    }

    /// The longest key is an option of the function's cache: a text
    /// argument over the default 1024 bytes can be cached.
    #[tokio::test]
    async fn max_key_bytes_is_the_caches() {
        let text = "x".repeat(2000);
        assert_eq!(long_key(text.clone()).await.unwrap(), 2000);
        let stored: Cache<String, usize> = Cache::builder()
            .namespace("long-keys")
            .backend(BACKEND.clone())
            .max_key_bytes(4096)
            .build()
            .unwrap();
        assert_eq!(stored.get(&text).await.unwrap(), Some(2000));
    }

    #[onefill::cached(ttl = "5m")]
    async fn fresh_for_five_minutes(id: u64) -> anyhow::Result<u64> {
        static LOADS: AtomicUsize = AtomicUsize::new(0);
        Ok(id * 1000 + LOADS.fetch_add(1, Ordering::SeqCst) as u64)
    }

    #[tokio::test(start_paused = true)]
    async fn the_ttl_is_honoured() {
        let first = fresh_for_five_minutes(3).await.unwrap();
        tokio::time::advance(Duration::from_secs(4 * 60)).await;
        // The jitter shortens a TTL by 10 % at most: fresh at 4 minutes.
        assert_eq!(fresh_for_five_minutes(3).await.unwrap(), first);
        tokio::time::advance(Duration::from_secs(2 * 60)).await;
        assert_eq!(
            fresh_for_five_minutes(3).await.unwrap(),
            first + 1,
            "reloaded"
        );
    }

    #[onefill::cached(skip(pool))]
    async fn maybe(id: u64, pool: &Pool) -> Option<String> {
        let found = pool.query(format!("item {id}"));
        (id != 0).then_some(found)
    }

    #[onefill::cached(skip(pool))]
    async fn maybe_fallible(id: u64, pool: &Pool) -> Result<Option<String>, onefill::BoxError> {
        let found = pool.query(format!("item {id}"));
        Ok((id != 0).then_some(found))
    }

    #[tokio::test]
    async fn absence_is_cached_in_both_optional_forms() {
        let pool = Pool::new();
        assert_eq!(maybe(0, &pool).await, None);
        assert_eq!(maybe(0, &pool).await, None);
        assert_eq!(maybe(1, &pool).await.as_deref(), Some("item 1"));
        assert_eq!(maybe_fallible(0, &pool).await.unwrap(), None);
        assert_eq!(maybe_fallible(0, &pool).await.unwrap(), None);
        assert_eq!(
            maybe_fallible(1, &pool).await.unwrap().as_deref(),
            Some("item 1")
        );
        assert_eq!(pool.loads(), 4, "each absence loaded once");
    }

    #[onefill::cached(ttl = "1h", negative_ttl = "1m", skip(pool))]
    async fn briefly_absent(id: u64, pool: &Pool) -> anyhow::Result<Option<u64>> {
        pool.query(String::new());
        Ok((id != 0).then_some(id))
    }

    #[onefill::cached(ttl = "1h", negative_ttl = "1m", skip(pool))]
    async fn briefly_none(id: u64, pool: &Pool) -> Option<u64> {
        pool.query(String::new());
        (id != 0).then_some(id)
    }

    /// An absence is kept for `negative_ttl`, a value for `ttl`: the
    /// optional forms call `get_or_load_optional`, not `get_or_load` of an
    /// `Option` (which would keep `None` for `ttl` as any value).
    #[tokio::test(start_paused = true)]
    async fn an_absence_is_kept_for_the_negative_ttl() {
        let pool = Pool::new();
        assert_eq!(briefly_absent(0, &pool).await.unwrap(), None);
        assert_eq!(briefly_absent(1, &pool).await.unwrap(), Some(1));
        assert_eq!(briefly_none(0, &pool).await, None);
        assert_eq!(briefly_none(1, &pool).await, Some(1));
        assert_eq!(pool.loads(), 4);
        tokio::time::advance(Duration::from_secs(2 * 60)).await;
        assert_eq!(briefly_absent(0, &pool).await.unwrap(), None);
        assert_eq!(briefly_absent(1, &pool).await.unwrap(), Some(1));
        assert_eq!(briefly_none(0, &pool).await, None);
        assert_eq!(briefly_none(1, &pool).await, Some(1));
        assert_eq!(pool.loads(), 6, "the absences loaded again, the values not");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("row {0} is locked")]
    struct Locked(u64);

    #[derive(Debug, thiserror::Error)]
    enum AppError {
        #[error("the database failed")]
        Db(#[source] Locked),
        #[error(transparent)]
        Cache(#[from] onefill::Error),
    }

    #[onefill::cached]
    async fn locked(id: u64) -> Result<String, AppError> {
        Err(AppError::Db(Locked(id)))
    }

    #[onefill::cached]
    async fn locked_anyhow(id: u64) -> anyhow::Result<String> {
        Err(anyhow::Error::new(Locked(id)).context("loading"))
    }

    #[tokio::test]
    async fn a_loader_error_reaches_the_caller_with_its_source() {
        let AppError::Cache(error) = locked(9).await.unwrap_err() else {
            panic!("the cache's error, as `AppError::from(onefill::Error)`");
        };
        assert!(matches!(error, onefill::Error::Loader(_)), "{error:?}");
        assert!(matches!(
            error.loader_error::<AppError>(),
            Some(AppError::Db(_))
        ));
        assert_eq!(error.loader_error::<Locked>().map(|l| l.0), Some(9));

        let error = locked_anyhow(9).await.unwrap_err();
        let locked = error.chain().find_map(|e| e.downcast_ref::<Locked>());
        assert_eq!(locked.map(|l| l.0), Some(9), "{error:?}");
        let cache = error.downcast_ref::<onefill::Error>();
        assert!(
            matches!(cache, Some(onefill::Error::Loader(_))),
            "{error:?}"
        );
    }

    static NAMED: LazyLock<Cache<String, String>> =
        LazyLock::new(|| Cache::builder().namespace("named-async").build().unwrap());

    #[onefill::cached(cache = NAMED)]
    async fn on_a_named_cache(id: &str) -> anyhow::Result<String> {
        Ok(format!("named {id}"))
    }

    #[tokio::test]
    async fn a_named_cache_is_the_one_called() {
        assert_eq!(on_a_named_cache("x").await.unwrap(), "named x");
        assert_eq!(NAMED.get("x").await.unwrap().as_deref(), Some("named x"));
    }
}

mod sync_fns {
    use super::*;

    #[onefill::cached(skip(pool))]
    fn slow_user(id: &str, pool: &Pool) -> anyhow::Result<String> {
        std::thread::sleep(Duration::from_millis(100));
        Ok(pool.query(format!("user {id}")))
    }

    #[test]
    fn one_load_for_many_threads() {
        let _limit = time_limit(LIMIT);
        let pool = Pool::new();
        let start = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (pool, start) = (pool.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    slow_user("ada", &pool).unwrap()
                })
            })
            .collect();
        for thread in threads {
            assert_eq!(thread.join().unwrap(), "user ada");
        }
        assert_eq!(pool.loads(), 1, "eight threads, one load");
    }

    #[onefill::cached(key = "{lang}")]
    fn greeting(lang: &str, name: String) -> Option<String> {
        (lang == "en").then(|| format!("hello, {name}"))
    }

    #[onefill::cached(namespace = "sync-optional", skip(pool))]
    fn sync_maybe(id: u64, mut pool: Pool) -> Result<Option<String>, onefill::BoxError> {
        pool = pool.clone();
        Ok((id != 0).then(|| pool.query(format!("item {id}"))))
    }

    #[test]
    fn keys_and_optional_forms() {
        let _limit = time_limit(LIMIT);
        assert_eq!(greeting("en", "ada".into()).as_deref(), Some("hello, ada"));
        assert_eq!(greeting("en", "bob".into()).as_deref(), Some("hello, ada"));
        assert_eq!(greeting("fr", "ada".into()), None);
        let pool = Pool::new();
        assert_eq!(sync_maybe(0, pool.clone()).unwrap(), None);
        assert_eq!(
            sync_maybe(5, pool.clone()).unwrap().as_deref(),
            Some("item 5")
        );
        assert_eq!(
            sync_maybe(5, pool.clone()).unwrap().as_deref(),
            Some("item 5")
        );
        assert_eq!(pool.loads(), 1);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let stored = runtime.block_on(reader("sync-optional").get("5")).unwrap();
        assert_eq!(stored.as_deref(), Some("item 5"));
        let stored = runtime
            .block_on(reader("cached::sync_fns::greeting").get("en"))
            .unwrap();
        assert_eq!(stored.as_deref(), Some("hello, ada"));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("no such file")]
    struct Missing;

    #[onefill::cached]
    fn read_config(path: &str) -> Result<String, onefill::BoxError> {
        Err(Missing.into())
    }

    #[test]
    fn a_loader_error_reaches_the_caller() {
        let _limit = time_limit(LIMIT);
        let error = read_config("/etc/app.toml").unwrap_err();
        let cache = error
            .downcast_ref::<onefill::Error>()
            .expect("the cache's error");
        assert!(cache.loader_error::<Missing>().is_some(), "{cache:?}");
    }

    static NAMED: LazyLock<BlockingCache<String, u64>> = LazyLock::new(|| {
        Cache::builder()
            .namespace("named-sync")
            .build_blocking()
            .unwrap()
    });

    #[onefill::cached(cache = NAMED)]
    fn doubled(n: u64) -> anyhow::Result<u64> {
        Ok(n * 2)
    }

    #[test]
    fn a_named_blocking_cache_is_the_one_called() {
        let _limit = time_limit(LIMIT);
        assert_eq!(doubled(21).unwrap(), 42);
        assert_eq!(NAMED.get("21").unwrap(), Some(42));
    }
}

/// Functions of one name in one module (associated functions of two
/// types, two implementations of a trait, nested functions): each has a
/// namespace of its own, its path with its type or enclosing function, so
/// none answers with another's values.
mod namespaces {
    use super::*;

    struct Users;
    struct Orders;

    impl Users {
        #[onefill::cached]
        async fn get(id: u64) -> anyhow::Result<String> {
            Ok(format!("user {id}"))
        }
    }

    impl Orders {
        #[onefill::cached]
        async fn get(id: u64) -> anyhow::Result<String> {
            Ok(format!("order {id}"))
        }
    }

    trait Load {
        fn load(id: u64) -> anyhow::Result<String>;
    }

    impl Load for Users {
        #[onefill::cached]
        fn load(id: u64) -> anyhow::Result<String> {
            Ok(format!("user {id}"))
        }
    }

    impl Load for Orders {
        #[onefill::cached]
        fn load(id: u64) -> anyhow::Result<String> {
            Ok(format!("order {id}"))
        }
    }

    async fn first_inner(id: u64) -> anyhow::Result<String> {
        #[onefill::cached]
        async fn inner(id: u64) -> anyhow::Result<String> {
            Ok(format!("first {id}"))
        }
        inner(id).await
    }

    async fn second_inner(id: u64) -> anyhow::Result<String> {
        #[onefill::cached]
        async fn inner(id: u64) -> anyhow::Result<String> {
            Ok(format!("second {id}"))
        }
        inner(id).await
    }

    #[tokio::test]
    async fn associated_and_nested_functions_of_one_name_keep_their_values() {
        assert_eq!(Users::get(1).await.unwrap(), "user 1");
        assert_eq!(Orders::get(1).await.unwrap(), "order 1");
        assert_eq!(first_inner(1).await.unwrap(), "first 1");
        assert_eq!(second_inner(1).await.unwrap(), "second 1");
        let stored = reader("cached::namespaces::Orders::get").get("1").await;
        assert_eq!(stored.unwrap().as_deref(), Some("order 1"));
        let stored = reader("cached::namespaces::second_inner::inner")
            .get("1")
            .await;
        assert_eq!(stored.unwrap().as_deref(), Some("second 1"));
    }

    #[test]
    fn trait_implementations_keep_their_values() {
        let _limit = time_limit(LIMIT);
        assert_eq!(<Users as Load>::load(1).unwrap(), "user 1");
        assert_eq!(<Orders as Load>::load(1).unwrap(), "order 1");
    }
}
