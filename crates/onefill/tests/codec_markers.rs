//! What an `Encrypted` cache stores when it caches no value: a key's
//! absence, a loader's failure (negative caching). Sealed as values are,
//! they are neither readable in the store nor forgeable by someone who can
//! write to it, nor passable for one another.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::FillKeys;
use onefill::{Cache, Compressed, Encrypted, Error, JsonCodec, KeyRing, MemoryBackend, KEY_LEN};

const NS: &str = "markers";
const ENVELOPE_HEADER: usize = 16;

fn cache(store: &MemoryBackend) -> Cache<String, String> {
    Cache::builder()
        .namespace(NS)
        .backend(store.clone())
        .no_l1()
        .ttl(Duration::from_secs(60))
        .negative_ttl(Duration::from_secs(60))
        .codec(Encrypted::new(JsonCodec, KeyRing::new(1, &[0x11; KEY_LEN])))
        .build()
        .expect("valid options")
}

fn whole(store: &MemoryBackend, key: &str) -> Vec<u8> {
    store
        .get_raw(FillKeys::new(NS, key).value())
        .expect("a stored entry")
        .0
}

/// An optional loader that counts its runs and finds nothing.
fn nothing(
    runs: &Arc<AtomicUsize>,
) -> impl FnOnce(String) -> std::future::Ready<Result<Option<String>, std::io::Error>> {
    let runs = runs.clone();
    move |_| {
        runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(None))
    }
}

#[tokio::test(start_paused = true)]
async fn a_failure_is_cached_sealed_and_still_answered() {
    let store = MemoryBackend::new();
    let cache = cache(&store);
    let failing = |_: String| async { Err::<String, _>(std::io::Error::other("password=hunter2")) };
    let first = cache.get_or_load("k", failing).await.expect_err("it fails");
    assert!(matches!(first, Error::Loader(_)), "{first:?}");
    let stored = whole(&store, "k");
    assert_eq!(stored[2], 1, "a cached failure");
    assert!(
        !String::from_utf8_lossy(&stored).contains("hunter2"),
        "the message is not in the store in clear"
    );
    // Cached: the next call is answered from the store, message and all.
    let again = cache
        .get_or_load("k", |_| async {
            Ok::<_, std::io::Error>("loaded".to_owned())
        })
        .await
        .expect_err("the cached failure");
    assert!(
        matches!(&again, Error::CachedFailure(m) if m.contains("hunter2")),
        "{again:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_absence_is_cached_sealed() {
    let store = MemoryBackend::new();
    let cache = cache(&store);
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        cache
            .get_or_load_optional("k", nothing(&runs))
            .await
            .expect("absent"),
        None
    );
    assert_eq!(
        cache
            .get_or_load_optional("k", nothing(&runs))
            .await
            .expect("absent"),
        None
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the absence was cached");
    let stored = whole(&store, "k");
    assert_eq!(stored[2], 2, "a cached absence");
    assert!(
        stored.len() > ENVELOPE_HEADER,
        "sealed, not an empty payload"
    );
}

/// Regression: absences and failures were stored as they are whatever the
/// codec, so anyone who could write to the store could plant one (a user
/// "not found", a page "failed") under an encrypted cache.
#[tokio::test(start_paused = true)]
async fn a_planted_absence_or_failure_is_unreadable_and_reloaded() {
    let store = MemoryBackend::new();
    let cache = cache(&store);
    let keys = FillKeys::new(NS, "k");
    for (kind, payload) in [(2u8, &b""[..]), (1u8, &b"planted"[..])] {
        let mut planted = vec![0xF1, 1, kind, 0];
        planted.resize(ENVELOPE_HEADER, 0);
        planted.extend_from_slice(payload);
        store.put_raw(keys.value(), &planted, Duration::from_secs(600));
        let runs = Arc::new(AtomicUsize::new(0));
        let loader = {
            let runs = runs.clone();
            move |_: String| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(Some("real".to_owned()))
            }
        };
        let answer = cache.get_or_load_optional("k", loader).await;
        assert_eq!(
            answer.expect("loaded"),
            Some("real".to_owned()),
            "kind {kind}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "kind {kind}");
    }
    assert_eq!(cache.stats().decode_errors, 2);
}

/// A sealed absence copied over another key, or a sealed failure passed
/// off as an absence, does not open.
#[tokio::test(start_paused = true)]
async fn sealed_markers_are_bound_to_their_key_and_kind() {
    let store = MemoryBackend::new();
    let cache = cache(&store);
    let runs = Arc::new(AtomicUsize::new(0));
    cache
        .get_or_load_optional("a", nothing(&runs))
        .await
        .expect("absent");
    let absent = whole(&store, "a");
    // Another key.
    store.put_raw(
        FillKeys::new(NS, "b").value(),
        &absent,
        Duration::from_secs(600),
    );
    assert_eq!(
        cache
            .get_or_load_optional("b", nothing(&runs))
            .await
            .expect("reloaded"),
        None
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "not opened under another key"
    );
    // Another kind, same key.
    let mut as_failure = absent.clone();
    as_failure[2] = 1;
    store.put_raw(
        FillKeys::new(NS, "a").value(),
        &as_failure,
        Duration::from_secs(600),
    );
    assert_eq!(
        cache
            .get_or_load_optional("a", nothing(&runs))
            .await
            .expect("reloaded"),
        None
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3, "an absence is no failure");
}

/// In the wrong order, the compression outside still hands markers to the
/// encryption inside.
#[tokio::test(start_paused = true)]
async fn a_wrapper_outside_the_encryption_still_seals_markers() {
    let store = MemoryBackend::new();
    let cache: Cache<String, String> = Cache::builder()
        .namespace(NS)
        .backend(store.clone())
        .no_l1()
        .codec(Compressed::new(Encrypted::new(
            JsonCodec,
            KeyRing::new(1, &[0x11; KEY_LEN]),
        )))
        .build()
        .expect("valid options");
    let runs = Arc::new(AtomicUsize::new(0));
    cache
        .get_or_load_optional("k", nothing(&runs))
        .await
        .expect("absent");
    assert!(whole(&store, "k").len() > ENVELOPE_HEADER, "sealed");
}
