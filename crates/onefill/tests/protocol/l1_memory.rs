//! The L1 on the embedded backend, with paused time: several caches on one
//! `MemoryBackend` stand for processes sharing one Redis, and each one's
//! L1 must never serve a value after another changed it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::FillKeys;
use onefill::{Cache, MemoryBackend, Outcome, L1};

fn cache(backend: &MemoryBackend, ttl: Duration, grace: Duration) -> Cache<String, String> {
    Cache::builder()
        .namespace("users")
        .backend(backend.clone())
        .l1(L1::new(1_000))
        .ttl(ttl)
        .grace(grace)
        .jitter(0.0)
        .build()
        .unwrap()
}

/// A loader that counts its runs and answers `"<prefix><run>"`.
fn counting(
    loads: &Arc<AtomicUsize>,
    prefix: &'static str,
) -> impl Fn(String) -> std::future::Ready<Result<String, std::io::Error>> + Clone {
    let loads = loads.clone();
    move |_| {
        let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(Ok(format!("{prefix}{n}")))
    }
}

async fn fetch(
    cache: &Cache<String, String>,
    key: &str,
    loads: &Arc<AtomicUsize>,
) -> (String, Outcome) {
    let load = counting(loads, "v");
    let f = cache.fetch(&key.to_owned(), load).await.unwrap();
    (f.value, f.outcome)
}

#[tokio::test(start_paused = true)]
async fn hits_come_from_the_l1_and_writes_anywhere_reach_every_l1() {
    let backend = MemoryBackend::new();
    let a = cache(&backend, Duration::from_secs(60), Duration::ZERO);
    let b = cache(&backend, Duration::from_secs(60), Duration::ZERO);
    let loads = Arc::new(AtomicUsize::new(0));

    assert_eq!(fetch(&a, "k", &loads).await, ("v1".into(), Outcome::Loaded));
    // B reads the backend once, then its L1.
    assert_eq!(fetch(&b, "k", &loads).await, ("v1".into(), Outcome::Hit));
    assert_eq!(fetch(&b, "k", &loads).await, ("v1".into(), Outcome::Hit));
    assert_eq!(b.stats().l1_hits, 1);
    assert_eq!(b.stats().hits, 1, "one flight");

    // A `set` in A: B's next call sees it (read-your-writes, fleet-wide).
    a.set(&"k".to_owned(), "new".into()).await.unwrap();
    assert_eq!(fetch(&b, "k", &loads).await.0, "new");
    assert!(b.stats().l1_invalidations >= 1);
    // And A's own L1 too.
    assert_eq!(fetch(&a, "k", &loads).await.0, "new");

    // An `invalidate` in B: A loads again.
    b.invalidate(&"k".to_owned()).await.unwrap();
    assert_eq!(fetch(&a, "k", &loads).await, ("v2".into(), Outcome::Loaded));
    assert_eq!(loads.load(Ordering::SeqCst), 2);

    // A raw write of the value key (outside any cache) drops it too.
    let keys = FillKeys::new("users", "k");
    backend.put_raw(keys.value(), b"not an envelope", Duration::from_secs(60));
    let (value, outcome) = fetch(&b, "k", &loads).await;
    assert_eq!((value.as_str(), outcome), ("v3", Outcome::Loaded));
}

#[tokio::test(start_paused = true)]
async fn an_entry_never_outlives_the_freshness_the_backend_gave_it() {
    let backend = MemoryBackend::new();
    let a = cache(&backend, Duration::from_secs(10), Duration::ZERO);
    let b = cache(&backend, Duration::from_secs(10), Duration::ZERO);
    let loads = Arc::new(AtomicUsize::new(0));
    fetch(&a, "k", &loads).await;
    tokio::time::advance(Duration::from_secs(6)).await;
    // B reads it with 4 s left: its L1 keeps it 4 s, not 10.
    assert_eq!(fetch(&b, "k", &loads).await.1, Outcome::Hit);
    tokio::time::advance(Duration::from_millis(3_900)).await;
    assert_eq!(fetch(&b, "k", &loads).await.1, Outcome::Hit);
    assert_eq!(b.stats().l1_hits, 1);
    tokio::time::advance(Duration::from_millis(200)).await;
    assert_eq!(fetch(&b, "k", &loads).await, ("v2".into(), Outcome::Loaded));
}

#[tokio::test(start_paused = true)]
async fn stale_from_the_l1_refreshes_once() {
    let backend = MemoryBackend::new();
    let a = cache(&backend, Duration::from_secs(1), Duration::from_secs(10));
    let loads = Arc::new(AtomicUsize::new(0));
    fetch(&a, "k", &loads).await;
    fetch(&a, "k", &loads).await; // into the L1
    tokio::time::advance(Duration::from_millis(1_500)).await;
    for _ in 0..50 {
        let (value, outcome) = fetch(&a, "k", &loads).await;
        if outcome == Outcome::Stale {
            assert_eq!(value, "v1");
        }
    }
    // Let the one background refresh finish.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        loads.load(Ordering::SeqCst),
        2,
        "one refresh for 50 stale calls"
    );
    assert_eq!(fetch(&a, "k", &loads).await.0, "v2");
}

/// A flight that read the old value before a `set` must not put it into
/// the L1 after it (the ticket taken before the read). Real threads: the
/// read and the write race for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_races_a_write_does_not_put_back_the_old_value() {
    let backend = MemoryBackend::new();
    let a = cache(&backend, Duration::from_secs(60), Duration::ZERO);
    let b = cache(&backend, Duration::from_secs(60), Duration::ZERO);
    let loads = Arc::new(AtomicUsize::new(0));
    for round in 0..2_000 {
        let key = format!("k{round}");
        fetch(&a, &key, &loads).await;
        let reader = {
            let b = b.clone();
            let key = key.clone();
            let loads = loads.clone();
            tokio::spawn(async move { fetch(&b, &key, &loads).await })
        };
        a.set(&key, format!("new{round}")).await.unwrap();
        let _ = reader.await.unwrap();
        assert_eq!(
            fetch(&b, &key, &loads).await.0,
            format!("new{round}"),
            "round {round}"
        );
    }
}

/// A store whose reads answer 100 ms after they read: a read that starts
/// before a write and answers after it, deterministically.
#[derive(Debug)]
struct SlowReads(MemoryBackend);

#[async_trait::async_trait]
impl onefill::Backend for SlowReads {
    async fn get(
        &self,
        keys: &FillKeys,
    ) -> Result<Option<onefill::backend::Stored>, onefill::BackendError> {
        let read = self.0.get(keys).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        read
    }
    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &onefill::LeaseToken,
        ttl: Duration,
        window: Duration,
    ) -> Result<onefill::backend::Acquired, onefill::BackendError> {
        self.0.acquire(keys, token, ttl, window).await
    }
    async fn fill(
        &self,
        keys: &FillKeys,
        token: &onefill::LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, onefill::BackendError> {
        self.0.fill(keys, token, bytes, ttl).await
    }
    async fn release(
        &self,
        keys: &FillKeys,
        token: &onefill::LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, onefill::BackendError> {
        self.0.release(keys, token, entry).await
    }
    async fn extend(
        &self,
        keys: &FillKeys,
        token: &onefill::LeaseToken,
        ttl: Duration,
    ) -> Result<bool, onefill::BackendError> {
        self.0.extend(keys, token, ttl).await
    }
    async fn set(
        &self,
        keys: &FillKeys,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<(), onefill::BackendError> {
        self.0.set(keys, bytes, ttl).await
    }
    async fn invalidate(&self, keys: &FillKeys) -> Result<(), onefill::BackendError> {
        self.0.invalidate(keys).await
    }
    async fn invalidate_older_than(
        &self,
        keys: &FillKeys,
        age: Duration,
    ) -> Result<bool, onefill::BackendError> {
        self.0.invalidate_older_than(keys, age).await
    }
    async fn subscribe(
        &self,
        keys: &FillKeys,
    ) -> Result<Box<dyn onefill::backend::FillSubscription>, onefill::BackendError> {
        self.0.subscribe(keys).await
    }
    fn track_changes(
        &self,
        prefix: &str,
        every: Duration,
        listener: std::sync::Weak<dyn onefill::backend::ChangeListener>,
    ) -> Result<(), onefill::BackendError> {
        self.0.track_changes(prefix, every, listener)
    }
}

/// Regression guard for the L1's ticket: a read that started before a
/// write elsewhere and answers after it must not leave the old value in
/// the L1 (without the ticket it would be served until its TTL).
#[tokio::test(start_paused = true)]
async fn a_slow_read_overtaken_by_a_write_stays_out_of_the_l1() {
    let backend = MemoryBackend::new();
    let a = cache(&backend, Duration::from_secs(60), Duration::ZERO);
    let b: Cache<String, String> = Cache::builder()
        .namespace("users")
        .backend(SlowReads(backend.clone()))
        .l1(L1::new(100))
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    fetch(&a, "k", &loads).await;
    let reader = {
        let b = b.clone();
        let loads = loads.clone();
        tokio::spawn(async move { fetch(&b, "k", &loads).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await; // B has read v1
    a.set(&"k".to_owned(), "new".into()).await.unwrap();
    assert_eq!(reader.await.unwrap().0, "v1", "it started before the set");
    assert_eq!(fetch(&b, "k", &loads).await.0, "new");
    assert_eq!(fetch(&b, "k", &loads).await.0, "new");
}

/// A codec whose decode panics (a bug in user code).
struct PanickyCodec;

impl onefill::Codec<String> for PanickyCodec {
    fn encode(&self, _key: &str, value: &String) -> Result<Vec<u8>, onefill::CodecError> {
        Ok(value.as_bytes().to_vec())
    }
    fn decode(&self, _key: &str, _bytes: &[u8]) -> Result<String, onefill::CodecError> {
        panic!("decode bug");
    }
    // Skips the check before a write (whose panic would fail the write),
    // so a value is stored for the read to panic on.
    fn check_round_trip(&self, _key: &str, _bytes: &[u8]) -> Result<(), onefill::CodecError> {
        Ok(())
    }
}

/// Regression: the leader's first read runs in the
/// caller's task, so a panicking decode unwound into the caller of
/// `get_or_load`, and the leader's guard ran the read again in a task,
/// which panicked again. Now the caller gets `FlightAbandoned`, as when
/// the whole flight ran in a task of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_decode_in_the_first_read_does_not_reach_the_caller() {
    let cache: Cache<String, String> = Cache::builder()
        .namespace("panicky")
        .codec(PanickyCodec)
        .no_l1()
        .build()
        .unwrap();
    let load = |_k: String| async { Ok::<_, std::io::Error>("v".to_owned()) };
    cache.get_or_load(&"k".to_owned(), load).await.unwrap();
    let c = cache.clone();
    let joined = tokio::spawn(async move { c.get_or_load(&"k".to_owned(), load).await }).await;
    let answer = joined.expect("the caller's task does not panic");
    assert!(
        matches!(answer, Err(onefill::Error::FlightAbandoned)),
        "{answer:?}"
    );
}

/// Regression: with no grace, a value read in its last
/// millisecond was answered from the L1 as a hit after the store had
/// dropped it.
#[tokio::test(start_paused = true)]
async fn the_l1_never_answers_past_the_stores_expiry() {
    let backend = MemoryBackend::new();
    let a = cache(&backend, Duration::from_millis(10), Duration::ZERO);
    let loads = Arc::new(AtomicUsize::new(0));
    fetch(&a, "k", &loads).await;
    tokio::time::advance(Duration::from_micros(9_700)).await;
    assert_eq!(fetch(&a, "k", &loads).await, ("v1".into(), Outcome::Hit));
    tokio::time::advance(Duration::from_micros(600)).await;
    assert_eq!(fetch(&a, "k", &loads).await, ("v2".into(), Outcome::Loaded));
}
