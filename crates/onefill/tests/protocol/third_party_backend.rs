//! A `Backend` implemented outside the crate, as a third party would (here
//! a wrapper that counts its calls and delegates to `MemoryBackend`), runs
//! the whole conformance suite through the public path: `onefill::testing`
//! and `onefill::conformance_suite!`, in paused tokio time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use onefill::backend::{
    Acquired, Backend, BackendError, FillKeys, FillSubscription, LeaseToken, Stored,
};
use onefill::testing::CloneHarness;
use onefill::MemoryBackend;

/// Another store, for all the suite knows: every call goes through here.
#[derive(Debug, Clone, Default)]
struct Relay {
    inner: MemoryBackend,
    calls: Arc<AtomicUsize>,
}

impl Relay {
    fn inner(&self) -> &MemoryBackend {
        self.calls.fetch_add(1, Ordering::Relaxed);
        &self.inner
    }
}

#[async_trait]
impl Backend for Relay {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        self.inner().get(keys).await
    }
    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        self.inner()
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
        self.inner().fill(keys, token, bytes, ttl).await
    }
    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        self.inner().release(keys, token, entry).await
    }
    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.inner().extend(keys, token, lease_ttl).await
    }
    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        self.inner().set(keys, bytes, ttl).await
    }
    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        self.inner().invalidate(keys).await
    }
    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        self.inner().subscribe(keys).await
    }
}

/// One relayed store; each `backend()` is a clone of it.
async fn relay() -> CloneHarness<Relay> {
    CloneHarness {
        backend: Relay::default(),
        paused: true,
    }
}

onefill::conformance_suite!(relay(), tokio::test(start_paused = true));

/// The suite's traffic really goes through the third-party backend, and one
/// scenario can also be called on its own.
#[tokio::test(start_paused = true)]
async fn scenarios_talk_to_the_backend_under_test() {
    let harness = relay().await;
    onefill::testing::conformance::herd_across_pods(&harness).await;
    let calls = harness.backend.calls.load(Ordering::Relaxed);
    assert!(calls >= 8, "8 pods' worth of calls, got {calls}");
}

/// No scenario went missing from the suite: the 24 of the library's first
/// version, at least.
#[test]
fn the_suite_keeps_its_scenarios() {
    let themes = onefill::testing::conformance::THEMES;
    let scenarios: usize = themes.iter().map(|(_, names)| names.len()).sum();
    assert!(scenarios >= 24, "{scenarios} scenarios in {themes:?}");
}
