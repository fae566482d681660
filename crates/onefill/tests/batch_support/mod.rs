//! What the batch tests share (`mod batch_support;`): a backend wrapper
//! that counts its calls (each call is one request and its answer: one
//! round trip, a pipeline for the batch methods), and a batch loader that
//! counts its calls and the keys it loaded.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use onefill::backend::{
    Acquired, Backend, BackendError, ChangeListener, FillKeys, FillSubscription, LeaseRequest,
    LeaseToken, Stored,
};
use parking_lot::Mutex;

/// Delegates to `inner` and counts every call, by method.
#[derive(Debug, Clone)]
pub struct Counting<B> {
    pub inner: B,
    pub calls: Arc<Mutex<HashMap<&'static str, usize>>>,
}

impl<B> Counting<B> {
    pub fn new(inner: B) -> Self {
        Counting {
            inner,
            calls: Arc::default(),
        }
    }
    fn count(&self, op: &'static str) {
        *self.calls.lock().entry(op).or_default() += 1;
    }
    /// Calls of `op` so far.
    pub fn of(&self, op: &str) -> usize {
        self.calls.lock().get(op).copied().unwrap_or(0)
    }
    /// Every call so far, but the watchdog's `extend` and the waiters'
    /// `subscribe` (a subscription is a message on the subscriber
    /// connection, no request of the call's own).
    pub fn round_trips(&self) -> usize {
        self.calls
            .lock()
            .iter()
            .filter(|(op, _)| !matches!(**op, "extend" | "subscribe"))
            .map(|(_, n)| n)
            .sum()
    }
    pub fn reset(&self) {
        self.calls.lock().clear();
    }
}

#[async_trait]
impl<B: Backend + Clone> Backend for Counting<B> {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        self.count("get");
        self.inner.get(keys).await
    }
    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        self.count("acquire");
        self.inner
            .acquire(keys, token, lease_ttl, refresh_window)
            .await
    }
    async fn get_many(&self, keys: &[FillKeys]) -> Vec<Result<Option<Stored>, BackendError>> {
        self.count("get_many");
        self.inner.get_many(keys).await
    }
    async fn acquire_many(
        &self,
        requests: &[LeaseRequest],
        lease_ttl: Duration,
    ) -> Vec<Result<Acquired, BackendError>> {
        self.count("acquire_many");
        self.inner.acquire_many(requests, lease_ttl).await
    }
    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.count("fill");
        self.inner.fill(keys, token, bytes, ttl).await
    }
    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        self.count("release");
        self.inner.release(keys, token, entry).await
    }
    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.count("extend");
        self.inner.extend(keys, token, lease_ttl).await
    }
    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        self.count("set");
        self.inner.set(keys, bytes, ttl).await
    }
    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        self.count("invalidate");
        self.inner.invalidate(keys).await
    }
    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        self.count("subscribe");
        self.inner.subscribe(keys).await
    }
    fn shard(&self, keys: &FillKeys) -> u64 {
        self.inner.shard(keys)
    }
    fn track_changes(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: Weak<dyn ChangeListener>,
    ) -> Result<(), BackendError> {
        self.inner.track_changes(prefix, confirm_every, listener)
    }
    fn in_process(&self) -> bool {
        self.inner.in_process()
    }
}

/// What a test's batch loader returns.
pub type Loading = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Vec<(String, String)>, std::io::Error>> + Send>,
>;

/// A batch loader's record: its calls and every key it loaded.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub calls: Arc<AtomicUsize>,
    pub loaded: Arc<Mutex<Vec<String>>>,
}

impl Origin {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    /// How many times each key was loaded.
    pub fn loads_per_key(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for k in self.loaded.lock().iter() {
            *counts.entry(k.clone()).or_default() += 1;
        }
        counts
    }
    /// A loader answering `v<key>` for every key but those in `absent`,
    /// after `delay`.
    pub fn loader(
        &self,
        delay: Duration,
        absent: &'static [&'static str],
    ) -> impl Fn(Vec<String>) -> Loading + Send + Sync + 'static {
        let origin = self.clone();
        move |keys: Vec<String>| {
            let origin = origin.clone();
            Box::pin(async move {
                origin.calls.fetch_add(1, Ordering::SeqCst);
                origin.loaded.lock().extend(keys.iter().cloned());
                tokio::time::sleep(delay).await;
                Ok(keys
                    .into_iter()
                    .filter(|k| !absent.contains(&k.as_str()))
                    .map(|k| {
                        let v = format!("v{k}");
                        (k, v)
                    })
                    .collect())
            })
        }
    }
}
