//! Review probes of the batch call (`get_or_load_many`, `fetch_many`):
//! each test reproduces one finding of the hostile review of the batch
//! merge (d1990a1), in paused time on the memory backend.

mod batch_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use batch_support::Origin;
use onefill::backend::{
    Acquired, Backend, BackendError, FillKeys, FillSubscription, LeaseToken, Stored,
};
use onefill::{Cache, CallOptions, MemoryBackend, Outcome};

const NS: &str = "review";

/// Two shards (as two masters of a cluster): keys containing `bad` live on
/// shard 1, which hangs once `hang_bad` is set. Every command takes a
/// millisecond (a round trip), as on a real server.
#[derive(Debug, Clone, Default)]
struct TwoMasters {
    store: MemoryBackend,
    hang_bad: Arc<AtomicBool>,
    /// Shard 1 answers reads but hangs on lease requests.
    hang_bad_acquire: Arc<AtomicBool>,
}

impl TwoMasters {
    async fn round_trip(&self, keys: &FillKeys) {
        tokio::time::sleep(Duration::from_millis(1)).await;
        if keys.value().contains("bad") && self.hang_bad.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl Backend for TwoMasters {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        self.round_trip(keys).await;
        self.store.get(keys).await
    }
    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        self.round_trip(keys).await;
        if keys.value().contains("bad") && self.hang_bad_acquire.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.store
            .acquire(keys, token, lease_ttl, refresh_window)
            .await
    }
    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.round_trip(keys).await;
        self.store.fill(keys, token, bytes, ttl).await
    }
    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        self.round_trip(keys).await;
        self.store.release(keys, token, entry).await
    }
    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.round_trip(keys).await;
        self.store.extend(keys, token, lease_ttl).await
    }
    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        self.round_trip(keys).await;
        self.store.set(keys, bytes, ttl).await
    }
    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        self.round_trip(keys).await;
        self.store.invalidate(keys).await
    }
    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        self.round_trip(keys).await;
        self.store.subscribe(keys).await
    }
    fn shard(&self, keys: &FillKeys) -> u64 {
        u64::from(keys.value().contains("bad"))
    }
}

fn value_of(key: &str) -> String {
    FillKeys::new(NS, key).value().to_owned()
}

/// One master hangs: the batch's keys on the other master must still be
/// leased, loaded once and stored, as a single call stores them. The
/// failing master's read timeout must not be charged to the healthy
/// master's keys.
#[tokio::test(start_paused = true)]
async fn a_hung_master_does_not_stop_the_keys_of_a_healthy_one_being_stored() {
    let backend = TwoMasters::default();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .backend_timeout(Duration::from_millis(100))
        .no_l1()
        .build()
        .unwrap();
    let origin = Origin::default();
    backend.hang_bad.store(true, Ordering::SeqCst);

    // A single call on the healthy master, for reference: loaded, stored.
    let single = cache
        .fetch(
            &"good0".to_owned(),
            &CallOptions::new(),
            |k: String| async move { Ok::<_, std::io::Error>(format!("v{k}")) },
        )
        .await
        .unwrap();
    assert_eq!(single.outcome, Outcome::Loaded);
    assert!(backend.store.get_raw(&value_of("good0")).is_some());

    let wanted: Vec<String> = ["good1", "good2", "bad1"].map(String::from).to_vec();
    let answers = cache
        .fetch_many(
            &wanted,
            &CallOptions::new(),
            origin.loader(Duration::ZERO, &[]),
        )
        .await
        .unwrap();
    for good in ["good1", "good2"] {
        let answer = answers[good].as_ref().unwrap();
        assert_eq!(
            (answer.value.as_deref(), answer.outcome),
            (Some(format!("v{good}").as_str()), Outcome::Loaded),
            "{good}: {answers:?}"
        );
        assert!(
            backend.store.get_raw(&value_of(good)).is_some(),
            "{good} stored"
        );
    }
    // The hung master's key: loaded without the lease (degraded).
    let bad = answers["bad1"].as_ref().unwrap();
    assert_eq!(bad.outcome, Outcome::Degraded);
}

fn lock_of(key: &str) -> String {
    FillKeys::new(NS, key).lock().to_owned()
}

/// One master hangs on the lease request (its read answered): the keys
/// won on the healthy master must still be filled (their own budget is
/// whole), and no lease is left behind.
#[tokio::test(start_paused = true)]
async fn a_master_hanging_on_the_lease_request_does_not_stop_the_fills_of_the_others() {
    let backend = TwoMasters::default();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .backend_timeout(Duration::from_millis(100))
        .no_l1()
        .build()
        .unwrap();
    let origin = Origin::default();
    backend.hang_bad_acquire.store(true, Ordering::SeqCst);

    let wanted: Vec<String> = ["good1", "good2", "bad1"].map(String::from).to_vec();
    let answers = cache
        .fetch_many(
            &wanted,
            &CallOptions::new(),
            origin.loader(Duration::ZERO, &[]),
        )
        .await
        .unwrap();
    for good in ["good1", "good2"] {
        let answer = answers[good].as_ref().unwrap();
        assert_eq!(answer.outcome, Outcome::Loaded, "{good}: {answers:?}");
        assert!(
            backend.store.get_raw(&value_of(good)).is_some(),
            "{good} stored: {answers:?}"
        );
        assert!(
            backend.store.get_raw(&lock_of(good)).is_none(),
            "{good}: no lease left"
        );
    }
    assert_eq!(origin.calls(), 1, "one load");
}

/// Stale keys served by a batch are refreshed in the background; a hung
/// master in the same batch must not stop the healthy master's refresh
/// from being stored (nor leave its lease behind).
#[tokio::test(start_paused = true)]
async fn a_hung_master_does_not_stop_the_refresh_of_stale_keys_on_a_healthy_one() {
    let backend = TwoMasters::default();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .backend_timeout(Duration::from_millis(100))
        .ttl(Duration::from_secs(10))
        .grace(Duration::from_secs(60))
        .jitter(0.0)
        .no_l1()
        .build()
        .unwrap();
    let wanted: Vec<String> = ["good1", "bad1"].map(String::from).to_vec();
    let first = Origin::default();
    cache
        .get_or_load_many(&wanted, first.loader(Duration::ZERO, &[]))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(11)).await;
    backend.hang_bad.store(true, Ordering::SeqCst);

    let refresh = Origin::default();
    let answers = cache
        .fetch_many(
            &wanted,
            &CallOptions::new(),
            refresh.loader(Duration::from_secs(1), &[]),
        )
        .await
        .unwrap();
    let good = answers["good1"].as_ref().unwrap();
    assert_eq!(good.outcome, Outcome::Stale, "{answers:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(refresh.loads_per_key().get("good1"), Some(&1), "refreshed");
    let (_, ttl) = backend.store.get_raw(&value_of("good1")).unwrap();
    assert!(
        ttl > Duration::from_secs(60),
        "the refreshed value is stored (ttl + grace left: {ttl:?})"
    );
    assert!(
        backend.store.get_raw(&lock_of("good1")).is_none(),
        "no lease left"
    );
}

/// A loader returning a key twice (a join yielding two rows for one id):
/// the batch's first load and a single key's load (a takeover, a
/// refresh) must keep the same pair, the first, whichever path loads it.
#[tokio::test(start_paused = true)]
async fn a_key_returned_twice_keeps_its_first_pair_on_every_path() {
    let backend = MemoryBackend::new();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .ttl(Duration::from_secs(10))
        .grace(Duration::from_secs(60))
        .jitter(0.0)
        .no_l1()
        .build()
        .unwrap();
    let twice = |keys: Vec<String>| async move {
        let mut rows = Vec::new();
        for k in keys {
            rows.push((k.clone(), format!("first {k}")));
            rows.push((k.clone(), format!("second {k}")));
        }
        Ok::<_, std::io::Error>(rows)
    };
    let wanted = vec!["a".to_owned(), "b".to_owned()];
    let found = cache.get_or_load_many(&wanted, twice).await.unwrap();
    assert_eq!(found["a"], "first a", "the batch load");

    // The stale value's background refresh of one key alone: the single
    // key's load of the batch loader.
    tokio::time::advance(Duration::from_secs(11)).await;
    let _ = cache
        .get_or_load_many(&["a".to_owned()], twice)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let found = cache.get_or_load_many(&wanted, twice).await.unwrap();
    assert_eq!(found["a"], "first a", "the refresh");
}

/// Strict mode, one master hung: its keys fail with the backend's error
/// (nothing loaded for them), the healthy master's keys are loaded and
/// stored, and the call is bounded by the backend timeout (plus the load).
#[tokio::test(start_paused = true)]
async fn strict_mode_fails_only_the_hung_masters_keys_within_the_backend_timeout() {
    let backend = TwoMasters::default();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .backend_timeout(Duration::from_millis(100))
        .strict(true)
        .no_l1()
        .build()
        .unwrap();
    let origin = Origin::default();
    backend.hang_bad.store(true, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let wanted: Vec<String> = ["good1", "bad1"].map(String::from).to_vec();
    let answers = cache
        .fetch_many(
            &wanted,
            &CallOptions::new(),
            origin.loader(Duration::ZERO, &[]),
        )
        .await
        .unwrap();
    assert!(
        matches!(answers["bad1"], Err(onefill::Error::Backend(_))),
        "{answers:?}"
    );
    let good = answers["good1"].as_ref().unwrap();
    assert_eq!(good.outcome, Outcome::Loaded, "{answers:?}");
    assert!(backend.store.get_raw(&value_of("good1")).is_some());
    assert_eq!(origin.loaded.lock().clone(), vec!["good1".to_owned()]);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    // And get_or_load_many answers the hung master's error.
    let all = cache
        .get_or_load_many(&wanted, origin.loader(Duration::ZERO, &[]))
        .await;
    assert!(matches!(all, Err(onefill::Error::Backend(_))), "{all:?}");
}

/// A batch dropped while its read hangs: a single call on the same key
/// joins the batch's flight and is answered (the batch's task goes on);
/// nothing is left leased.
#[tokio::test(start_paused = true)]
async fn a_batch_dropped_during_a_hung_read_still_answers_a_single_caller() {
    let backend = TwoMasters::default();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .backend_timeout(Duration::from_millis(100))
        .no_l1()
        .build()
        .unwrap();
    let origin = Origin::default();
    backend.hang_bad.store(true, Ordering::SeqCst);
    let batch = {
        let cache = cache.clone();
        let loader = origin.loader(Duration::ZERO, &[]);
        tokio::spawn(async move { cache.get_or_load_many(&["bad1".to_owned()], loader).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    batch.abort();
    let single = cache
        .fetch(
            &"bad1".to_owned(),
            &CallOptions::new(),
            |k: String| async move { Ok::<_, std::io::Error>(format!("single {k}")) },
        )
        .await
        .unwrap();
    assert!(single.coalesced, "joined the dropped batch's flight");
    assert_eq!(single.value, "vbad1");
    assert_eq!(origin.calls(), 1);
    backend.hang_bad.store(false, Ordering::SeqCst);
    assert!(backend.store.get_raw(&lock_of("bad1")).is_none());
}

/// A key the loader does not return is absent for `negative_ttl`, not
/// `ttl`, in the backend and in the L1 of the process that loaded it and
/// of another that read it.
#[tokio::test(start_paused = true)]
async fn an_absent_key_is_asked_again_after_the_negative_ttl_with_the_l1_on() {
    let backend = MemoryBackend::new();
    let build = || -> Cache<String, String> {
        Cache::builder()
            .namespace(NS)
            .backend(backend.clone())
            .ttl(Duration::from_secs(60))
            .negative_ttl(Duration::from_secs(5))
            .jitter(0.0)
            .l1(onefill::L1::new(100))
            .build()
            .unwrap()
    };
    let (cache, other) = (build(), build());
    let origin = Origin::default();
    let wanted = vec!["here".to_owned(), "gone".to_owned()];
    let found = cache
        .get_or_load_many(&wanted, origin.loader(Duration::ZERO, &["gone"]))
        .await
        .unwrap();
    assert!(!found.contains_key("gone"));
    let read = other
        .fetch_many(
            &wanted,
            &CallOptions::new(),
            origin.loader(Duration::ZERO, &["gone"]),
        )
        .await
        .unwrap();
    assert_eq!(read["gone"].as_ref().unwrap().outcome, Outcome::Hit);
    assert_eq!(origin.calls(), 1);

    tokio::time::advance(Duration::from_secs(6)).await;
    for process in [&cache, &other] {
        let again = process
            .fetch_many(
                &wanted,
                &CallOptions::new(),
                origin.loader(Duration::ZERO, &[]),
            )
            .await
            .unwrap();
        assert_eq!(
            again["gone"].as_ref().unwrap().value.as_deref(),
            Some("vgone"),
            "absence expired after negative_ttl: {again:?}"
        );
        assert_eq!(again["here"].as_ref().unwrap().outcome, Outcome::Hit);
    }
    assert_eq!(
        origin.loads_per_key().get("gone"),
        Some(&2),
        "loaded again once"
    );
    assert_eq!(origin.loads_per_key().get("here"), Some(&1));
}

/// Batches (keys in both orders) and single calls racing on overlapping
/// keys on a multi-threaded runtime: one process never loads a key twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_single_calls_racing_on_overlapping_keys_load_each_key_once() {
    for round in 0..30 {
        let cache: Cache<String, String> = Cache::builder()
            .namespace(NS)
            .backend(MemoryBackend::new())
            .build()
            .unwrap();
        let origin = Origin::default();
        let forward: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
        let backward: Vec<String> = forward.iter().rev().cloned().collect();
        let mut calls = Vec::new();
        for wanted in [forward.clone(), backward, forward[2..6].to_vec()] {
            let cache = cache.clone();
            let loader = origin.loader(Duration::from_millis(2), &[]);
            calls.push(tokio::spawn(async move {
                let found = cache.get_or_load_many(&wanted, loader).await.unwrap();
                assert_eq!(found.len(), wanted.len());
            }));
        }
        for key in forward.iter().step_by(2) {
            let cache = cache.clone();
            let key = key.clone();
            let origin = origin.clone();
            calls.push(tokio::spawn(async move {
                let loaded = cache
                    .get_or_load(&key, move |k: String| async move {
                        origin.loaded.lock().push(k.clone());
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        Ok::<_, std::io::Error>(format!("v{k}"))
                    })
                    .await
                    .unwrap();
                assert_eq!(loaded, format!("v{key}"));
            }));
        }
        for call in calls {
            call.await.unwrap();
        }
        let per_key = origin.loads_per_key();
        assert!(
            per_key.values().all(|n| *n == 1) && per_key.len() == 8,
            "round {round}: {per_key:?}"
        );
    }
}

/// `soft_timeout` does not apply to a batch's own load (documented): a
/// cold batch slower than the soft timeout waits for its load and stores
/// every key.
#[tokio::test(start_paused = true)]
async fn a_soft_timeout_does_not_cut_a_batchs_own_load() {
    let backend = MemoryBackend::new();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .no_l1()
        .build()
        .unwrap();
    let origin = Origin::default();
    let wanted = vec!["a".to_owned(), "b".to_owned()];
    let answers = cache
        .fetch_many(
            &wanted,
            &CallOptions::new().soft_timeout(Duration::from_millis(10)),
            origin.loader(Duration::from_secs(1), &[]),
        )
        .await
        .unwrap();
    for k in &wanted {
        let answer = answers[k].as_ref().unwrap();
        assert_eq!(answer.outcome, Outcome::Loaded, "{answers:?}");
        assert!(backend.get_raw(&value_of(k)).is_some());
    }
    assert_eq!(origin.calls(), 1);
}
