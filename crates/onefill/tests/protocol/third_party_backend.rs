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

/// A wrapper written before marks existed (as `Relay`: it does not forward
/// `mark` nor `read_marks`) over a store that processes of the same fleet
/// reach directly: their `invalidate_tag` and `clear` must not be ignored
/// by the process behind the wrapper. It cannot read the marks, but the
/// values it reads say marks are in use (a tag, a generation): judging them
/// valid answers what the fleet invalidated, for as long as they live.
#[tokio::test(start_paused = true)]
#[ignore = "a backend without marks judges every value valid, even values whose marks block shows a fleet that marks: another process's invalidate_tag and clear are silently ignored behind a wrapper that does not forward the new methods (a decision for the lead: a miss, an error, or at least a warning)"]
async fn a_wrapper_that_does_not_forward_marks_does_not_ignore_the_fleets() {
    use onefill::{Cache, Loaded};
    let relay = Relay::default();
    let build = |cache: onefill::CacheBuilder<String, String>| {
        cache
            .namespace("fleet")
            .ttl(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let behind: Cache<String, String> = build(Cache::builder().backend(relay.clone()));
    let direct: Cache<String, String> = build(Cache::builder().backend(relay.inner.clone()));
    direct
        .get_or_load("k", |_| async {
            Ok::<_, std::io::Error>(Loaded::new("v".to_owned()).tags(["t"]))
        })
        .await
        .unwrap();
    assert_eq!(behind.get("k").await.unwrap().as_deref(), Some("v"));
    direct.invalidate_tag("t").await.unwrap();
    assert_eq!(direct.get("k").await.unwrap(), None);
    assert_eq!(
        behind.get("k").await.unwrap(),
        None,
        "invalidated by the fleet"
    );
}
