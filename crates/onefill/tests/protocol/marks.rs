//! Tags, `expire_tag` and `clear` (decision 0018) on the embedded backend,
//! in paused time: two caches on one store stand for two processes, each
//! with the L1 the embedded backend gives it by default.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::{Cache, Error, Loaded, MemoryBackend, Outcome};

const NS: &str = "marks";

fn process(store: &MemoryBackend, grace: Duration) -> Cache<String, String> {
    Cache::builder()
        .namespace(NS)
        .backend(store.clone())
        .ttl(Duration::from_secs(60))
        .grace(grace)
        .build()
        .expect("valid options")
}

/// A process whose cache has no L1: it hears of no mark, and rechecks them.
fn process_without_l1(store: &MemoryBackend) -> Cache<String, String> {
    Cache::builder()
        .namespace(NS)
        .backend(store.clone())
        .ttl(Duration::from_secs(60))
        .no_l1()
        .build()
        .expect("valid options")
}

/// A loader that counts its runs and tags what it loads with `tags`
/// (`v<n>` for the n-th run).
#[derive(Clone, Default)]
struct Origin {
    runs: Arc<AtomicUsize>,
}

impl Origin {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Owns what it needs, so it can be spawned.
    fn fetch(
        &self,
        cache: &Cache<String, String>,
        key: &str,
        tags: &[&'static str],
        took: Duration,
    ) -> impl std::future::Future<Output = onefill::Fetched<String>> + Send + 'static {
        let runs = self.runs.clone();
        let tags: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
        let (cache, key) = (cache.clone(), key.to_owned());
        async move {
            cache
                .fetch(key.as_str(), move |_| async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(took).await;
                    Ok::<_, std::io::Error>(Loaded::new(format!("v{n}")).tags(tags))
                })
                .await
                .expect("answered")
        }
    }
}

/// A tag's invalidation reaches every process, their L1s included, and
/// only the values that carry the tag; a value loaded after it is kept
/// (no reload loop).
#[tokio::test(start_paused = true)]
async fn a_tag_invalidation_reaches_every_process_and_only_its_values() {
    let store = MemoryBackend::new();
    let (a, b) = (
        process(&store, Duration::ZERO),
        process(&store, Duration::ZERO),
    );
    let origin = Origin::default();
    origin
        .fetch(&a, "product:1", &["seller:7", "category:3"], Duration::ZERO)
        .await;
    origin
        .fetch(&a, "product:2", &["seller:8"], Duration::ZERO)
        .await;
    origin.fetch(&a, "untagged", &[], Duration::ZERO).await;
    for key in ["product:1", "product:2", "untagged"] {
        // Read by B too: held in both L1s.
        assert_eq!(
            origin.fetch(&b, key, &[], Duration::ZERO).await.outcome,
            Outcome::Hit
        );
    }
    assert_eq!(origin.runs(), 3);

    a.invalidate_tag("seller:7").await.expect("marked");
    for cache in [&a, &b] {
        assert_eq!(
            cache.get("product:1").await.unwrap(),
            None,
            "the tagged value went"
        );
        assert_eq!(cache.get("product:2").await.unwrap().as_deref(), Some("v2"));
        assert_eq!(cache.get("untagged").await.unwrap().as_deref(), Some("v3"));
    }
    let again = origin
        .fetch(&b, "product:1", &["seller:7"], Duration::ZERO)
        .await;
    assert_eq!(
        (again.outcome, again.value.as_str()),
        (Outcome::Loaded, "v4")
    );
    let hit = origin
        .fetch(&a, "product:1", &["seller:7"], Duration::ZERO)
        .await;
    assert_eq!(
        (hit.outcome, hit.value.as_str()),
        (Outcome::Hit, "v4"),
        "kept: loaded after the mark"
    );
    assert_eq!(origin.runs(), 4);
}

/// `clear` makes every value of the namespace a miss in every process,
/// tagged or not, in one command; another namespace on the same store is
/// untouched; values loaded afterwards stay.
#[tokio::test(start_paused = true)]
async fn clear_makes_the_whole_namespace_a_miss_everywhere() {
    let store = MemoryBackend::new();
    let (a, b) = (
        process(&store, Duration::ZERO),
        process(&store, Duration::ZERO),
    );
    let other: Cache<String, String> = Cache::builder()
        .namespace("other")
        .backend(store.clone())
        .build()
        .unwrap();
    let origin = Origin::default();
    for key in ["x", "y"] {
        origin.fetch(&a, key, &["t"], Duration::ZERO).await;
        origin.fetch(&b, key, &[], Duration::ZERO).await;
    }
    b.set("z", "set".to_owned()).await.unwrap();
    other.set("x", "kept".to_owned()).await.unwrap();

    b.clear().await.expect("cleared");
    for cache in [&a, &b] {
        for key in ["x", "y", "z"] {
            assert_eq!(cache.get(key).await.unwrap(), None, "{key}");
        }
    }
    assert_eq!(other.get("x").await.unwrap().as_deref(), Some("kept"));
    let loaded = origin.fetch(&a, "x", &[], Duration::ZERO).await;
    assert_eq!(loaded.outcome, Outcome::Loaded);
    assert_eq!(
        origin.fetch(&b, "x", &[], Duration::ZERO).await.outcome,
        Outcome::Hit
    );
    a.set("z", "after".to_owned()).await.unwrap();
    assert_eq!(b.get("z").await.unwrap().as_deref(), Some("after"));
    assert_eq!(origin.runs(), 3);
}

/// `expire_tag` with a grace window: every caller in both processes gets
/// the old value at once, as stale, while exactly one refresh runs; then
/// the new value is a hit.
#[tokio::test(start_paused = true)]
async fn expire_tag_serves_stale_while_one_refresh_runs() {
    let store = MemoryBackend::new();
    let grace = Duration::from_secs(30);
    let (a, b) = (process(&store, grace), process(&store, grace));
    let origin = Origin::default();
    origin.fetch(&a, "hot", &["seller:7"], Duration::ZERO).await;
    assert_eq!(
        origin.fetch(&b, "hot", &[], Duration::ZERO).await.outcome,
        Outcome::Hit
    );

    a.expire_tag("seller:7").await.expect("marked");
    let callers: Vec<_> = (0..20)
        .map(|i| {
            let (cache, origin) = (
                if i % 2 == 0 { a.clone() } else { b.clone() },
                origin.clone(),
            );
            tokio::spawn(origin.fetch(&cache, "hot", &["seller:7"], Duration::from_millis(200)))
        })
        .collect();
    for caller in callers {
        let got = caller.await.unwrap();
        assert_eq!((got.outcome, got.value.as_str()), (Outcome::Stale, "v1"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for cache in [&a, &b] {
        let got = origin.fetch(cache, "hot", &[], Duration::ZERO).await;
        assert_eq!((got.outcome, got.value.as_str()), (Outcome::Hit, "v2"));
    }
    assert_eq!(origin.runs(), 2, "one refresh, fleet-wide");
}

/// Without a grace window, an expired value is a miss: one caller loads,
/// the others wait for it, as for any miss.
#[tokio::test(start_paused = true)]
async fn expire_tag_without_grace_is_a_miss() {
    let store = MemoryBackend::new();
    let (a, b) = (
        process(&store, Duration::ZERO),
        process(&store, Duration::ZERO),
    );
    let origin = Origin::default();
    origin.fetch(&a, "k", &["t"], Duration::ZERO).await;
    b.expire_tag("t").await.expect("marked");
    let (x, y) = tokio::join!(
        origin.fetch(&a, "k", &["t"], Duration::from_millis(100)),
        origin.fetch(&b, "k", &["t"], Duration::from_millis(100)),
    );
    assert_eq!([x.value.as_str(), y.value.as_str()], ["v2", "v2"]);
    assert_eq!(origin.runs(), 2);
}

/// A load that began before the invalidation (it may have read the data
/// the invalidation is about) answers its own callers, but what it stores
/// is a miss: the next call loads again. Whether the mark is made by the
/// loading process (which then knows the new generation when the load
/// ends: what it stores must still record the one its load began at) or by
/// another.
#[tokio::test(start_paused = true)]
async fn a_load_that_began_before_the_mark_is_not_kept() {
    for marked_here in [true, false] {
        let store = MemoryBackend::new();
        let (a, b) = (
            process(&store, Duration::ZERO),
            process(&store, Duration::ZERO),
        );
        let origin = Origin::default();
        let slow = tokio::spawn(origin.fetch(&a, "k", &["seller:7"], Duration::from_millis(500)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let marker = if marked_here { &a } else { &b };
        marker.invalidate_tag("seller:7").await.expect("marked");
        let answered = slow.await.unwrap();
        assert_eq!(
            (answered.outcome, answered.value.as_str()),
            (Outcome::Loaded, "v1")
        );
        for cache in [&a, &b] {
            assert_eq!(
                cache.get("k").await.unwrap(),
                None,
                "stored, but older than the mark"
            );
        }
        let again = origin.fetch(&b, "k", &["seller:7"], Duration::ZERO).await;
        assert_eq!(
            (again.outcome, again.value.as_str()),
            (Outcome::Loaded, "v2")
        );
        assert_eq!(
            origin.fetch(&a, "k", &[], Duration::ZERO).await.outcome,
            Outcome::Hit
        );
    }
}

/// The same for `clear`, through a batch: every key of a batch load that
/// began before it is stored as older than it.
#[tokio::test(start_paused = true)]
async fn a_batch_load_that_began_before_clear_is_not_kept() {
    let store = MemoryBackend::new();
    let (a, b) = (
        process(&store, Duration::ZERO),
        process(&store, Duration::ZERO),
    );
    let loads = Arc::new(AtomicUsize::new(0));
    let batch = {
        let (a, loads) = (a.clone(), loads.clone());
        tokio::spawn(async move {
            let keys = ["p".to_owned(), "q".to_owned()];
            a.get_or_load_many(&keys, move |keys: Vec<String>| {
                let loads = loads.clone();
                async move {
                    loads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, std::io::Error>(
                        keys.into_iter()
                            .map(|k| (k, "old".to_owned()))
                            .collect::<Vec<_>>(),
                    )
                }
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.clear().await.expect("cleared");
    assert_eq!(batch.await.unwrap().expect("answered").len(), 2);
    for key in ["p", "q"] {
        assert_eq!(b.get(key).await.unwrap(), None, "{key}");
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
}

/// Tags out of bounds are refused before any I/O (a mark), or fail the
/// write of a value that carries them; neither is a panic.
#[tokio::test(start_paused = true)]
async fn tags_out_of_bounds_are_refused() {
    let store = MemoryBackend::new();
    let a = process(&store, Duration::ZERO);
    for tag in [String::new(), "x".repeat(onefill::MAX_TAG_BYTES + 1)] {
        let err = a.invalidate_tag(&tag).await.unwrap_err();
        assert!(err.is_invalid_input(), "{err:?}");
        let err = a.expire_tag(&tag).await.unwrap_err();
        assert!(err.is_invalid_input(), "{err:?}");
    }
    let too_many: Vec<String> = (0..=onefill::MAX_TAGS).map(|i| format!("t{i}")).collect();
    let err = a
        .get_or_load("k", move |_| async move {
            Ok::<_, std::io::Error>(Loaded::new("v".to_owned()).tags(too_many))
        })
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert_eq!(a.get("k").await.unwrap(), None, "nothing stored");
    let err = a
        .get_or_load("k", |_| async {
            Ok::<_, std::io::Error>(Loaded::new("v".to_owned()).tags([""]))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidInput(onefill::InputError::Tag { .. })),
        "{err:?}"
    );
}

/// A tagged value lives at most `TAG_RETENTION` in the store, TTL and
/// grace together: a tag's mark is kept that long, and must outlive it.
#[tokio::test(start_paused = true)]
async fn a_tagged_value_lives_no_longer_than_its_tags_marks() {
    let store = MemoryBackend::new();
    let a = process(&store, Duration::ZERO);
    let year = Duration::from_secs(365 * 24 * 3600);
    a.get_or_load("k", move |_| async move {
        Ok::<_, std::io::Error>(Loaded::new("v".to_owned()).ttl(year).tags(["t"]))
    })
    .await
    .unwrap();
    a.get_or_load("untagged", move |_| async move {
        Ok::<_, std::io::Error>(Loaded::new("v".to_owned()).ttl(year))
    })
    .await
    .unwrap();
    let ttl = |key: &str| {
        store
            .get_raw(onefill::backend::FillKeys::new(NS, key).value())
            .expect("stored")
            .1
    };
    assert_eq!(ttl("k"), onefill::TAG_RETENTION);
    assert!(ttl("untagged") > onefill::TAG_RETENTION);
}

/// A process without an L1 hears of no mark: it trusts the marks it read
/// for a second (`RECHECK`), judges by them for a second more while a read
/// in the background refreshes them, then reads them again before a
/// verdict. So another process's mark reaches it within two seconds, and
/// not sooner than the store is asked: until then it answers what it
/// judged by the marks it held.
#[tokio::test(start_paused = true)]
async fn without_an_l1_a_process_reads_the_marks_again_within_two_seconds() {
    let store = MemoryBackend::new();
    let a = process(&store, Duration::ZERO);
    let b = process_without_l1(&store);
    let origin = Origin::default();
    origin.fetch(&a, "k", &["t"], Duration::ZERO).await;
    assert_eq!(
        b.get("k").await.unwrap().as_deref(),
        Some("v1"),
        "marks read"
    );
    a.invalidate_tag("t").await.expect("marked");
    assert_eq!(
        b.get("k").await.unwrap().as_deref(),
        Some("v1"),
        "the marks it read a moment ago still judge"
    );
    tokio::time::sleep(Duration::from_millis(2_001)).await;
    assert_eq!(
        b.get("k").await.unwrap(),
        None,
        "read again: the mark judges"
    );
}

/// Without an L1, the namespace's mark is refreshed in the background once
/// a recheck period old: a read does not wait for it (the marks' master
/// failing over must not slow every read), and a `clear` elsewhere reaches
/// the process by the refresh, within two periods.
#[tokio::test(start_paused = true)]
async fn without_an_l1_the_namespace_mark_is_refreshed_without_waiting() {
    let store = MemoryBackend::new();
    let a = process(&store, Duration::ZERO);
    let b = process_without_l1(&store);
    b.set("k", "v".to_owned()).await.unwrap();
    assert_eq!(b.get("k").await.unwrap().as_deref(), Some("v"));
    a.clear().await.expect("cleared");
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    // Past one period: answered by the held mark, a refresh started.
    assert_eq!(b.get("k").await.unwrap().as_deref(), Some("v"));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        b.get("k").await.unwrap(),
        None,
        "the refresh brought the clear"
    );
}

/// A write made after another process's mark, which this process has
/// heard of but not yet read, is not judged by it: the writer reads its own
/// write back, and so does the other process. (It recorded the generation
/// it last read, older than the mark, and read back as a miss.)
#[tokio::test(start_paused = true)]
async fn a_write_after_a_mark_heard_of_is_not_judged_by_it() {
    for tagged in [false, true] {
        let store = MemoryBackend::new();
        let (a, b) = (
            process(&store, Duration::ZERO),
            process(&store, Duration::ZERO),
        );
        let origin = Origin::default();
        // A has read the marks once: it holds them, and their generation.
        origin.fetch(&a, "k", &["t"], Duration::ZERO).await;
        if tagged {
            b.invalidate_tag("t").await.expect("marked");
            a.set_tagged("k", "mine".to_owned(), ["t"]).await.unwrap();
        } else {
            b.clear().await.expect("cleared");
            a.set("k", "mine".to_owned()).await.unwrap();
        }
        for cache in [&a, &b] {
            assert_eq!(
                cache.get("k").await.unwrap().as_deref(),
                Some("mine"),
                "tagged: {tagged}"
            );
        }
    }
}

/// Without an L1, a `set` whose reply came after this process's `clear` had
/// returned recorded its value in the outage fallback: the next outage
/// answered a value the clear judged (the server reads it as a miss).
#[tokio::test(start_paused = true)]
async fn a_late_set_reply_keeps_nothing_a_mark_judged_for_outages() {
    use crate::support::{fetch_now, two_pods, Switches, REFUSE};
    use onefill::testing::{Fault, Op};
    for tag in [None, Some("t")] {
        let [(a, pod_a), _] = two_pods(|b| b);
        let loads = Arc::new(AtomicUsize::new(0));
        let key = "k".to_string();
        a.faults().set([Op::Set], Fault::Gated);
        let writing = tokio::spawn({
            let (pod_a, key) = (pod_a.clone(), key.clone());
            async move {
                pod_a
                    .set_tagged(&key, "before the mark".to_owned(), tag)
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        match tag {
            None => pod_a.clear().await.unwrap(),
            Some(tag) => pod_a.invalidate_tag(tag).await.unwrap(),
        }
        a.faults().open_gate(1);
        writing.await.unwrap().unwrap();
        assert_eq!(pod_a.get(&key).await.unwrap(), None, "judged by the mark");
        a.set_mode(REFUSE);
        let f = fetch_now(&pod_a, &key, &loads).await;
        assert_eq!(f.outcome, Outcome::Degraded, "{tag:?}: {:?}", f.value);
    }
}

/// A `set` records the generation its process knows; a mark it heard of
/// but has not read yet (or, in a process's first write, a generation it
/// never read) is read first, so the value is not judged by a mark made
/// before it and read back as a miss.
#[tokio::test(start_paused = true)]
async fn a_set_after_a_mark_elsewhere_is_not_judged_by_it() {
    let store = MemoryBackend::new();
    let (a, b) = (
        process(&store, Duration::ZERO),
        process(&store, Duration::ZERO),
    );
    // `b`'s first call is a write, after a mark it never read.
    a.clear().await.expect("cleared");
    b.set("first", "v1".to_owned()).await.expect("set");
    assert_eq!(b.get("first").await.expect("read"), Some("v1".to_owned()));
    assert_eq!(a.get("first").await.expect("read"), Some("v1".to_owned()));
    // `b` knows the generation now; it hears of the next mark (reported at
    // once here), and its next write comes before any read.
    a.invalidate_tag("t").await.expect("marked");
    b.set_tagged("second", "v2".to_owned(), ["t"])
        .await
        .expect("set");
    assert_eq!(b.get("second").await.expect("read"), Some("v2".to_owned()));
    assert_eq!(a.get("second").await.expect("read"), Some("v2".to_owned()));
}

/// A call after a mark that loads without storing (here: it may not wait
/// for the lease another flight of its process holds) runs a load of its
/// own rather than sharing one that began before the mark.
#[tokio::test(start_paused = true)]
async fn a_call_after_a_mark_does_not_share_a_load_from_before_it() {
    // The mark made here, then one made by another process and reported.
    for elsewhere in [false, true] {
        let store = MemoryBackend::new();
        let cache = process(&store, Duration::ZERO);
        let other = process(&store, Duration::ZERO);
        let marker = if elsewhere { &other } else { &cache };
        after_a_mark(&cache, marker).await;
    }
}

async fn after_a_mark(cache: &Cache<String, String>, marker: &Cache<String, String>) {
    let origin = Origin::default();
    let before = tokio::spawn(origin.fetch(cache, "k", &["t"], Duration::from_millis(100)));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(origin.runs(), 1, "the first load runs, under the lease");
    marker.clear().await.expect("cleared");
    let options = onefill::CallOptions::new().no_lease();
    let runs = origin.runs.clone();
    let after = cache
        .with_options(&options)
        .fetch("k", move |_| async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, std::io::Error>(format!("v{n}"))
        })
        .await
        .expect("answered");
    assert_eq!(after.value, "v2", "a load of its own, begun after the mark");
    assert_eq!(before.await.expect("joined").value, "v1");
}

/// Without an L1, nothing reports another process's mark: the process hears
/// of it when a read of the marks finds the generation moved, and must then
/// drop what it kept from before. Its outage fallback kept answering a
/// value the mark judged, for as long as the value lived.
#[tokio::test(start_paused = true)]
async fn without_an_l1_a_mark_read_later_empties_the_outage_fallback() {
    use crate::support::{fetch_now, two_pods, Switches, REFUSE};
    let [(a, pod_a), (_, pod_b)] = two_pods(|b| b);
    let loads = Arc::new(AtomicUsize::new(0));
    // A's flight loads and keeps the value for outages.
    let loaded = fetch_now(&pod_a, "k", &loads).await;
    assert_eq!(loaded.outcome, Outcome::Loaded);
    pod_b.clear().await.expect("cleared");
    // Past A's recheck period: its next read of another key reads the
    // marks (in the background) and finds the generation moved.
    tokio::time::sleep(Duration::from_millis(1_001)).await;
    pod_a.get("other").await.expect("read");
    tokio::time::sleep(Duration::from_millis(1)).await;
    a.set_mode(REFUSE);
    let f = fetch_now(&pod_a, "k", &loads).await;
    assert_ne!(
        (f.outcome, f.value.as_str()),
        (Outcome::Stale, loaded.value.as_str()),
        "the fallback answered a value the clear judges"
    );
}

/// Without an L1, a process's own mark moves the generation it knows past
/// any mark made elsewhere since its last read of the marks: that read
/// then finds nothing moved, so the marks it held from before (here a
/// tag's, invalidated elsewhere) must go with its own.
#[tokio::test(start_paused = true)]
async fn without_an_l1_a_mark_of_its_own_drops_the_marks_held_before() {
    let store = MemoryBackend::new();
    let (a, b) = (process_without_l1(&store), process_without_l1(&store));
    let origin = Origin::default();
    origin.fetch(&b, "k", &["t"], Duration::ZERO).await;
    assert_eq!(a.get("k").await.unwrap().as_deref(), Some("v1"), "t held");
    b.invalidate_tag("t").await.expect("marked");
    a.expire_tag("u").await.expect("marked");
    assert_eq!(
        a.get("k").await.unwrap(),
        None,
        "the invalidation of t, made before A's own mark, judges"
    );
}

/// A `set` dropped by its caller while it reads the generation (the marks'
/// master slow) cannot be told from one dropped mid-command: it is queued
/// to be replayed, and what the process kept of the key goes.
#[tokio::test(start_paused = true)]
async fn a_set_dropped_while_it_reads_the_generation_is_replayed() {
    use crate::support::two_pods;
    use onefill::testing::{Fault, Op};
    let [(a, pod_a), _] = two_pods(|b| b);
    a.faults().set([Op::ReadMarks], Fault::Gated);
    let set = pod_a.set("k", "v".to_owned());
    let dropped = tokio::time::timeout(Duration::from_millis(50), set).await;
    assert!(dropped.is_err(), "the set waits for the generation");
    assert_eq!(pod_a.pending_writes(), 1, "queued for replay");
}

/// A store that reports nothing (as a tracking connection that went silent
/// does), and lets the test say when the connection is back.
struct Silent {
    store: MemoryBackend,
    listener: Heard,
}

/// Where [`Silent`] keeps the listener the cache registered.
type Heard = Arc<std::sync::Mutex<Option<std::sync::Weak<dyn onefill::backend::ChangeListener>>>>;

impl std::fmt::Debug for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Silent")
    }
}

/// The connection confirmed that every change so far was reported (as it
/// does once after it is made, before it went silent).
fn confirmed(heard: &Heard) {
    let listener = heard.lock().unwrap().clone();
    if let Some(listener) = listener.and_then(|l| l.upgrade()) {
        listener.synced(Some(tokio::time::Instant::now()));
    }
}

/// The connection is back: the cache is told it may have missed changes.
fn back(heard: &Heard) {
    let listener = heard.lock().unwrap().clone();
    if let Some(listener) = listener.and_then(|l| l.upgrade()) {
        listener.reset();
    }
}

#[async_trait::async_trait]
impl onefill::Backend for Silent {
    async fn get(
        &self,
        keys: &onefill::backend::FillKeys,
    ) -> Result<Option<onefill::backend::Stored>, onefill::BackendError> {
        self.store.get(keys).await
    }
    async fn acquire(
        &self,
        keys: &onefill::backend::FillKeys,
        token: &onefill::LeaseToken,
        ttl: Duration,
        window: Duration,
    ) -> Result<onefill::backend::Acquired, onefill::BackendError> {
        self.store.acquire(keys, token, ttl, window).await
    }
    async fn fill(
        &self,
        keys: &onefill::backend::FillKeys,
        token: &onefill::LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, onefill::BackendError> {
        self.store.fill(keys, token, bytes, ttl).await
    }
    async fn release(
        &self,
        keys: &onefill::backend::FillKeys,
        token: &onefill::LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, onefill::BackendError> {
        self.store.release(keys, token, entry).await
    }
    async fn extend(
        &self,
        keys: &onefill::backend::FillKeys,
        token: &onefill::LeaseToken,
        ttl: Duration,
    ) -> Result<bool, onefill::BackendError> {
        self.store.extend(keys, token, ttl).await
    }
    async fn set(
        &self,
        keys: &onefill::backend::FillKeys,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<(), onefill::BackendError> {
        self.store.set(keys, bytes, ttl).await
    }
    async fn invalidate(
        &self,
        keys: &onefill::backend::FillKeys,
    ) -> Result<(), onefill::BackendError> {
        self.store.invalidate(keys).await
    }
    async fn subscribe(
        &self,
        keys: &onefill::backend::FillKeys,
    ) -> Result<Box<dyn onefill::backend::FillSubscription>, onefill::BackendError> {
        self.store.subscribe(keys).await
    }
    async fn mark(
        &self,
        gen_key: &str,
        mark_key: &str,
        kind: onefill::backend::MarkKind,
        retention: Option<Duration>,
    ) -> Result<u64, onefill::BackendError> {
        self.store.mark(gen_key, mark_key, kind, retention).await
    }
    async fn read_marks(
        &self,
        gen_key: &str,
        mark_keys: &[&str],
    ) -> Result<(u64, Vec<onefill::backend::Mark>), onefill::BackendError> {
        self.store.read_marks(gen_key, mark_keys).await
    }
    fn track_changes(
        &self,
        _prefix: &str,
        _every: Duration,
        listener: std::sync::Weak<dyn onefill::backend::ChangeListener>,
    ) -> Result<(), onefill::BackendError> {
        *self.listener.lock().unwrap() = Some(listener);
        Ok(())
    }
}

/// A cache with an L1 on `store` behind [`Silent`], and where it keeps
/// the listener the cache registered.
fn silent_cache(store: &MemoryBackend) -> (Cache<String, String>, Heard) {
    let heard = Heard::default();
    let silent = Silent {
        store: store.clone(),
        listener: heard.clone(),
    };
    let cache = Cache::builder()
        .namespace(NS)
        .backend(silent)
        .ttl(Duration::from_secs(60))
        .l1(onefill::L1::new(64))
        .build()
        .expect("valid options");
    (cache, heard)
}

/// With an L1 whose tracking connection went silent, another process's
/// mark is not reported; the reset when the connection is back says changes
/// may have been missed, a mark among them: a call after it must not share
/// a load that began before (it shared it, and answered a value the mark
/// judged).
#[tokio::test(start_paused = true)]
async fn a_reset_detaches_the_loads_a_missed_mark_would_have() {
    let store = MemoryBackend::new();
    let (cache, heard) = silent_cache(&store);
    confirmed(&heard);
    let other = process(&store, Duration::ZERO);
    let origin = Origin::default();
    let before = tokio::spawn(origin.fetch(&cache, "k", &["t"], Duration::from_millis(100)));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(origin.runs(), 1, "the first load runs, under the lease");
    other.clear().await.expect("cleared");
    back(&heard);
    let options = onefill::CallOptions::new().no_lease();
    let runs = origin.runs.clone();
    let after = cache
        .with_options(&options)
        .fetch("k", move |_| async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, std::io::Error>(format!("v{n}"))
        })
        .await
        .expect("answered");
    assert_eq!(
        after.value, "v2",
        "a load of its own, begun after the reset"
    );
    assert_eq!(before.await.expect("joined").value, "v1");
}

/// The counterpart: a reset before the backend ever confirmed (a tracking
/// connection's first, a few ms after the cache was built) detaches
/// nothing. Until then the cache heard of no change and trusted none, as
/// a cache without an L1, so a start-up herd stays one flight (it split in
/// two when a cache on Redis got the default L1).
#[tokio::test(start_paused = true)]
async fn a_reset_before_the_first_confirmation_splits_no_herd() {
    let store = MemoryBackend::new();
    let (cache, heard) = silent_cache(&store);
    let origin = Origin::default();
    let first = tokio::spawn(origin.fetch(&cache, "k", &[], Duration::from_millis(100)));
    tokio::time::sleep(Duration::from_millis(10)).await;
    back(&heard);
    let second = tokio::spawn(origin.fetch(&cache, "k", &[], Duration::from_millis(100)));
    assert_eq!(first.await.expect("joined").value, "v1");
    assert_eq!(second.await.expect("joined").value, "v1");
    assert_eq!(origin.runs(), 1);
    assert_eq!(
        cache.stats().coalesced,
        1,
        "the call after the reset joined the flight"
    );
}

/// With an L1 whose tracking connection went silent and is not back yet,
/// another process's mark is not reported, and no reset says changes may
/// have been missed. Once the last confirmation is older than the sync
/// bound, a call must not join a flight that began before the mark: it
/// joined, and answered a value the mark judged, for as long as the flight
/// ran. It reads the marks first, finds them moved, and starts its own.
#[tokio::test(start_paused = true)]
async fn past_the_sync_bound_a_call_reads_the_marks_before_it_joins_a_flight() {
    for batch in [false, true] {
        let store = MemoryBackend::new();
        let (cache, heard) = silent_cache(&store);
        confirmed(&heard);
        let other = process(&store, Duration::ZERO);
        let origin = Origin::default();
        let before = tokio::spawn(origin.fetch(&cache, "k", &["t"], Duration::from_secs(1)));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(origin.runs(), 1, "the first load runs, under the lease");
        other.invalidate_tag("t").await.expect("invalidated");
        // Past the sync bound (250 ms) of the only confirmation.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (value, coalesced) = if batch {
            let runs = origin.runs.clone();
            let mut answers = cache
                .fetch_many(&["k".to_owned()], move |keys: Vec<String>| {
                    let runs = runs.clone();
                    async move {
                        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        Ok::<_, std::io::Error>(
                            keys.into_iter()
                                .map(|k| (k, Loaded::new(format!("v{n}")).tags(["t"])))
                                .collect::<Vec<_>>(),
                        )
                    }
                })
                .await
                .expect("answered");
            let fetched = answers.remove("k").expect("k").expect("answered");
            (fetched.value.expect("a value"), fetched.coalesced)
        } else {
            let fetched = origin
                .fetch(&cache, "k", &["t"], Duration::from_secs(1))
                .await;
            (fetched.value, fetched.coalesced)
        };
        assert_eq!(value, "v2", "batch: {batch}: a load begun after the mark");
        assert!(!coalesced, "batch: {batch}");
        assert_eq!(before.await.expect("joined").value, "v1");
    }
}
