//! Soft expiry (`expire`): a value made stale in place is answered stale
//! while one refresh runs; without grace it goes; a fill in flight is
//! fenced out; a missing key; a backend without the step says so.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{fetch_now, pods_with, start_slow_load};
use crate::backend::{
    Acquired, Backend, BackendError, FillKeys, FillSubscription, LeaseToken, Stored, Watch,
};
use crate::testing::{
    cache_with, eventually, herd, lease_held, unique_ns, CacheUnderTest, Harness, Origin,
};
use crate::{BackendErrorKind, Cache, CallOptions, Error, Outcome};

/// The TTL and grace of the scenarios with grace: long enough that only
/// `expire` makes the value stale.
const TTL: Duration = Duration::from_secs(60);
const GRACE: Duration = Duration::from_secs(10);

/// Whether `h`'s backend makes values stale in place; a backend that does
/// not must say so (`Unsupported`), never expire nothing silently.
async fn supports_expire(h: &dyn Harness) -> bool {
    let keys = FillKeys::new(&unique_ns("expire-probe"), "k");
    match h.backend().await.expire(&keys).await {
        Ok(()) => true,
        Err(e) if e.kind() == BackendErrorKind::Unsupported => false,
        Err(e) => panic!("expire of a missing key: {e}"),
    }
}

scenarios! { $ __onefill_conformance_expiry;

    /// After `expire` of a value with grace, every caller gets it at once,
    /// answered `Stale`, and one refresh runs fleet-wide; its value is then
    /// a hit everywhere.
    pub async fn expire_serves_stale_while_one_refresh_runs(h: &dyn Harness) {
        if !supports_expire(h).await {
            return;
        }
        let ns = unique_ns("expire");
        let pods = pods_with(h, &ns, 3, |b| b.ttl(TTL).grace(GRACE).early_refresh_beta(0.0)).await;
        let origin = Origin::default();
        assert_eq!(fetch_now(&pods[0], "k", &origin).await.outcome, Outcome::Loaded);
        assert_eq!(fetch_now(&pods[1], "k", &origin).await.outcome, Outcome::Hit);
        pods[2].expire("k").await.expect("expire");
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        let stored = backend.get(&keys).await.unwrap().expect("kept, stale");
        assert!(stored.ttl <= GRACE, "stale at once: {:?} left", stored.ttl);
        let results = herd(
            &pods,
            60,
            "k",
            &origin,
            Duration::from_millis(300),
            CallOptions::new(),
        )
        .await;
        for r in &results {
            let f = r.as_ref().expect("an answer");
            assert_eq!(
                (f.outcome, f.value.as_str()),
                (Outcome::Stale, "k-v1"),
                "no caller waits for the refresh"
            );
        }
        eventually(Duration::from_secs(5), || origin.count() == 2).await;
        // The refresh's fill lands (stale answers until then, no load).
        let start = Instant::now();
        while fetch_now(&pods[1], "k", &origin).await.outcome != Outcome::Hit {
            assert!(start.elapsed() < Duration::from_secs(5), "the refresh never landed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!lease_held(&*backend, &keys).await);
        for pod in &pods {
            let hit = fetch_now(pod, "k", &origin).await;
            assert_eq!((hit.outcome, hit.value.as_str()), (Outcome::Hit, "k-v2"));
        }
        assert_eq!(origin.count(), 2, "exactly one refresh across 3 pods");
    }

    /// A value stored without grace cannot be served stale: `expire`
    /// removes it, the next caller loads and the others wait for that one
    /// load.
    pub async fn expire_without_grace_removes_the_value(h: &dyn Harness) {
        if !supports_expire(h).await {
            return;
        }
        let ns = unique_ns("expire0");
        let pods = pods_with(h, &ns, 3, |b| b.ttl(TTL).grace(Duration::ZERO)).await;
        let origin = Origin::default();
        assert_eq!(fetch_now(&pods[0], "k", &origin).await.outcome, Outcome::Loaded);
        pods[1].expire("k").await.expect("expire");
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        assert!(backend.get(&keys).await.unwrap().is_none(), "removed");
        let results = herd(
            &pods,
            30,
            "k",
            &origin,
            Duration::from_millis(300),
            CallOptions::new(),
        )
        .await;
        for r in &results {
            let f = r.as_ref().expect("an answer");
            assert_eq!(f.value, "k-v2", "{:?}", f.outcome);
            assert_ne!(f.outcome, Outcome::Stale);
        }
        assert_eq!(origin.count(), 2, "one load for the herd, fleet-wide");
    }

    /// `expire` during a slow load: its callers get the value, but it is not
    /// stored (the fill is fenced out, as by `invalidate`) and the lease
    /// loss is counted.
    pub async fn expire_fences_a_fill_in_flight(h: &dyn Harness) {
        if !supports_expire(h).await {
            return;
        }
        let ns = unique_ns("expirefence");
        let c = cache_with(h, &ns, |b| b.ttl(TTL).grace(GRACE)).await;
        let origin = Origin::default();
        let task = start_slow_load(&c, &origin, Duration::from_millis(500)).await;
        c.expire("k").await.expect("expire");
        assert_eq!(task.await.unwrap().unwrap().value, "k-v1");
        let keys = FillKeys::new(&ns, "k");
        let backend = h.backend().await;
        assert!(backend.get(&keys).await.unwrap().is_none(), "fenced out");
        assert!(!lease_held(&*backend, &keys).await);
        assert_eq!(c.stats().lease_lost, 1);
    }

    /// `expire` of a key never written is done, and leaves it missing; of a
    /// value stale already, leaves it as it is.
    pub async fn expire_of_a_missing_or_stale_key(h: &dyn Harness) {
        if !supports_expire(h).await {
            return;
        }
        let ns = unique_ns("expiremiss");
        let c = cache_with(h, &ns, |b| b.ttl(TTL).grace(GRACE)).await;
        c.expire("k").await.expect("a missing key is no error");
        let backend = h.backend().await;
        let keys = FillKeys::new(&ns, "k");
        assert!(backend.get(&keys).await.unwrap().is_none());
        c.set("k", "v".to_string()).await.unwrap();
        c.expire("k").await.unwrap();
        let first = backend.get(&keys).await.unwrap().expect("kept").ttl;
        let pause = Duration::from_millis(300);
        tokio::time::sleep(pause).await;
        c.expire("k").await.unwrap();
        let second = backend.get(&keys).await.unwrap().expect("kept").ttl;
        assert!(
            second + pause / 2 < first,
            "a second expire does not restart the grace window: {first:?}, then {second:?}"
        );
    }

    /// On a backend that does not implement `expire`, the call is an
    /// `Unsupported` backend error and nothing changes.
    pub async fn expire_on_a_backend_without_it_is_an_error(h: &dyn Harness) {
        let ns = unique_ns("expirenone");
        let cache = Cache::builder()
            .namespace(&ns)
            .shared_backend(Arc::new(WithoutExpire(h.backend().await)))
            .ttl(TTL)
            .grace(GRACE)
            .jitter(0.0)
            .build()
            .expect("valid options");
        let c = CacheUnderTest::new(cache, h.blocking());
        let origin = Origin::default();
        assert_eq!(fetch_now(&c, "k", &origin).await.outcome, Outcome::Loaded);
        match c.expire("k").await {
            Err(Error::Backend(e)) => {
                assert_eq!(e.kind(), BackendErrorKind::Unsupported, "{e}");
                assert!(!e.is_transient());
            }
            other => panic!("expected an unsupported backend call: {other:?}"),
        }
        let hit = fetch_now(&c, "k", &origin).await;
        assert_eq!((hit.outcome, hit.value.as_str()), (Outcome::Hit, "k-v1"));
    }
}

/// The harness's backend, as a backend written before `expire` existed
/// would be: every step but that one.
#[derive(Debug)]
struct WithoutExpire(Arc<dyn Backend>);

#[async_trait]
impl Backend for WithoutExpire {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        self.0.get(keys).await
    }
    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        self.0.acquire(keys, token, lease_ttl, refresh_window).await
    }
    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.0.fill(keys, token, bytes, ttl).await
    }
    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        self.0.release(keys, token, entry).await
    }
    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.0.extend(keys, token, lease_ttl).await
    }
    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        self.0.set(keys, bytes, ttl).await
    }
    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        self.0.invalidate(keys).await
    }
    async fn invalidate_older_than(
        &self,
        keys: &FillKeys,
        age: Duration,
    ) -> Result<bool, BackendError> {
        self.0.invalidate_older_than(keys, age).await
    }
    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        self.0.subscribe(keys).await
    }
    fn new_token(&self, keys: &FillKeys) -> LeaseToken {
        self.0.new_token(keys)
    }
    async fn watch_holder(
        &self,
        keys: &FillKeys,
        holder: &LeaseToken,
    ) -> Result<Watch, BackendError> {
        self.0.watch_holder(keys, holder).await
    }
}
