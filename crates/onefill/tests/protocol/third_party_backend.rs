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
    /// Asks for the default L1 (`Backend::default_l1`), though it does not
    /// forward `track_changes`.
    asks_for_l1: bool,
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
    fn default_l1(&self) -> bool {
        self.asks_for_l1
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
/// reach directly. It cannot read their marks, and judging the values they
/// wrote gone would reload them for ever (each fill records the marks
/// again): they are answered, and the cache says once, as an error in the
/// log, that the fleet's `invalidate_tag` and `clear` do not reach it.
#[tokio::test(start_paused = true)]
async fn a_wrapper_that_does_not_forward_marks_is_told_once() {
    use onefill::{Cache, Loaded};
    use tracing_subscriber::layer::SubscriberExt;
    let told = Arc::new(AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(Told(told.clone()));
    let _log = tracing::subscriber::set_default(subscriber);
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
    // Nothing marked yet: the value records generation 0, no evidence of
    // marks in use, nothing said.
    assert_eq!(told.load(Ordering::SeqCst), 0);
    direct.invalidate_tag("t").await.unwrap();
    assert_eq!(direct.get("k").await.unwrap(), None);
    // The invalidated value is still answered behind the wrapper (the
    // documented limit)...
    assert_eq!(behind.get("k").await.unwrap().as_deref(), Some("v"));
    // ...and a value written after a mark says marks are in use: told once.
    direct
        .get_or_load("k2", |_| async {
            Ok::<_, std::io::Error>(Loaded::new("w".to_owned()).tags(["t"]))
        })
        .await
        .unwrap();
    for _ in 0..3 {
        assert_eq!(behind.get("k2").await.unwrap().as_deref(), Some("w"));
    }
    assert_eq!(told.load(Ordering::SeqCst), 1);
    assert!(matches!(
        behind.invalidate_tag("t").await,
        Err(onefill::Error::Backend(e)) if e.kind() == onefill::BackendErrorKind::Unsupported
    ));
}

/// Counts the error events that say a backend cannot read the fleet's
/// marks.
struct Told(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Told {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 |= format!("{value:?}").contains("read_marks answers Unsupported");
                }
            }
        }
        let mut message = Message(false);
        event.record(&mut message);
        if message.0 && *event.metadata().level() == tracing::Level::ERROR {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A cache on a backend that keeps no L1 coherent (it does not forward
/// `track_changes`): by default it has no L1 and builds as it always did,
/// even when the backend asks for the default L1; an L1 asked for fails
/// the build, saying why.
#[tokio::test(start_paused = true)]
async fn a_default_l1_the_backend_cannot_keep_gives_way_to_none() {
    use onefill::{Cache, ConfigError, L1};
    for asks_for_l1 in [false, true] {
        let relay = Relay {
            asks_for_l1,
            ..Relay::default()
        };
        let cache: Cache<String, String> = Cache::builder()
            .namespace("default-l1")
            .backend(relay.clone())
            .build()
            .expect("the default L1 never fails a build");
        cache.set(&"k".to_owned(), "v".to_owned()).await.unwrap();
        for _ in 0..3 {
            let value = cache
                .get_or_load(&"k".to_owned(), |_| async {
                    Ok::<_, std::io::Error>("loaded".to_owned())
                })
                .await
                .unwrap();
            assert_eq!(value, "v");
        }
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.l1_hits), (3, 0), "asks: {asks_for_l1}");

        let explicit = Cache::<String, String>::builder()
            .namespace("default-l1")
            .backend(relay)
            .l1(L1::new(100))
            .build();
        match explicit {
            Err(ConfigError::Option { option, reason }) => {
                assert_eq!(option, "l1");
                assert!(reason.contains("cannot be kept coherent"), "{reason}");
            }
            Err(other) => panic!("another error: {other}"),
            Ok(_) => panic!("an L1 the backend cannot keep coherent was built"),
        }
    }
}
