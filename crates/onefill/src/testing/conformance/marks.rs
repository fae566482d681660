//! Marks (decision 0018): tags, `expire_tag` and `clear`. A backend stores
//! them ([`Backend::mark`](crate::Backend::mark),
//! [`Backend::read_marks`](crate::Backend::read_marks)) or says it cannot,
//! with [`BackendErrorKind::Unsupported`] from both, and the cache's marks
//! then fail with that error: never a silent no-op.

use std::time::Duration;

use super::fetch_now;
use crate::backend::{Mark, MarkKind};
use crate::error::BackendErrorKind;
use crate::testing::{cache, cache_with, eventually, unique_ns, CacheUnderTest, Harness, Origin};
use crate::{Error, Loaded, Outcome};

/// Whether `h`'s backend stores marks; if it does not, that both methods
/// and the cache's verbs say so.
async fn stores_marks(h: &dyn Harness, ns: &str) -> bool {
    let backend = h.backend().await;
    let marked = backend
        .mark(
            &format!("{ns}:{{#}}:gen"),
            &format!("{ns}:{{#}}:clear"),
            MarkKind::Hard,
            None,
        )
        .await;
    match marked {
        Err(e) if e.kind() == BackendErrorKind::Unsupported => {
            let read = backend.read_marks(&format!("{ns}:{{#}}:gen"), &[]).await;
            assert!(
                matches!(&read, Err(e) if e.kind() == BackendErrorKind::Unsupported),
                "marks unsupported, but read_marks answered {read:?}"
            );
            let c = cache(h, ns).await;
            for err in [
                c.invalidate_tag("t").await.unwrap_err(),
                c.expire_tag("t").await.unwrap_err(),
                c.clear().await.unwrap_err(),
            ] {
                assert!(
                    matches!(&err, Error::Backend(e) if e.kind() == BackendErrorKind::Unsupported),
                    "{err:?}"
                );
            }
            false
        }
        other => {
            other.expect("a mark");
            true
        }
    }
}

/// What a tagged load answers.
type TaggedLoad = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Loaded<String>, std::io::Error>> + Send>,
>;

/// A loader whose `n`-th run answers `<key>-v<n>`, tagged `tags`.
fn tagged(
    origin: &Origin,
    tags: &'static [&'static str],
) -> impl FnOnce(String) -> TaggedLoad + Send + 'static {
    let plain = origin.loader(Duration::ZERO);
    move |key| {
        Box::pin(async move {
            let value = plain(key).await.map_err(std::io::Error::other)?;
            Ok(Loaded::new(value).tags(tags.iter().copied()))
        })
    }
}

async fn get(c: &CacheUnderTest, key: &str) -> Option<String> {
    c.get(key).await.expect("an answer")
}

scenarios! { $ __onefill_conformance_marks;

    /// The generation moves forward with every mark; a mark records it,
    /// hard and soft; marks and the generation are read together; a key
    /// never marked reads as no mark.
    pub async fn marks_are_stored_and_read_together(h: &dyn Harness) {
        let ns = unique_ns("mark-store");
        if !stores_marks(h, &ns).await {
            return;
        }
        let backend = h.backend().await;
        let gen_key = format!("{ns}:{{#}}:gen");
        let (tag, other) = (format!("{ns}:{{#}}:tag:t"), format!("{ns}:{{#}}:tag:u"));
        let (g0, _) = backend.read_marks(&gen_key, &[]).await.unwrap();
        let hard = backend.mark(&gen_key, &tag, MarkKind::Hard, Some(Duration::from_secs(60))).await.unwrap();
        assert!(hard > g0, "{hard} after {g0}");
        let soft = backend.mark(&gen_key, &tag, MarkKind::Soft, Some(Duration::from_secs(60))).await.unwrap();
        assert!(soft > hard, "{soft} after {hard}");
        let (generation, marks) = backend.read_marks(&gen_key, &[&tag, &other]).await.unwrap();
        assert_eq!(generation, soft);
        assert_eq!(marks, [Mark { hard, soft }, Mark::default()]);
    }

    /// A tag's invalidation makes every value carrying it a miss in every
    /// pod (at once in the pod that made it), and no other value; a value
    /// loaded after it is kept.
    pub async fn invalidate_tag_reaches_every_pod(h: &dyn Harness) {
        let ns = unique_ns("tags");
        if !stores_marks(h, &ns).await {
            return;
        }
        let (a, b) = (cache(h, &ns).await, cache(h, &ns).await);
        let origin = Origin::default();
        a.fetch("p1", tagged(&origin, &["seller:7"])).await.unwrap();
        a.set_tagged("p2", "set".to_owned(), &["seller:8"]).await.unwrap();
        fetch_now(&a, "plain", &origin).await;
        for key in ["p1", "p2", "plain"] {
            assert!(get(&b, key).await.is_some(), "{key}");
        }
        a.invalidate_tag("seller:7").await.unwrap();
        assert_eq!(get(&a, "p1").await, None);
        let deadline = Duration::from_secs(5);
        let start = tokio::time::Instant::now();
        while get(&b, "p1").await.is_some() {
            assert!(start.elapsed() < deadline, "the other pod still answers p1");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(get(&b, "p2").await.as_deref(), Some("set"));
        assert_eq!(get(&b, "plain").await.as_deref(), Some("plain-v2"));
        let again = b.fetch("p1", tagged(&origin, &["seller:7"])).await.unwrap();
        assert_eq!((again.outcome, again.value.as_str()), (Outcome::Loaded, "p1-v3"));
        let hit = a.fetch("p1", tagged(&origin, &["seller:7"])).await.unwrap();
        assert_eq!((hit.outcome, hit.value.as_str()), (Outcome::Hit, "p1-v3"));
        eventually(deadline, || origin.count() == 3).await;
    }

    /// `clear` makes every value of the namespace a miss in every pod, and
    /// leaves another namespace alone.
    pub async fn clear_reaches_every_pod(h: &dyn Harness) {
        let ns = unique_ns("clear");
        if !stores_marks(h, &ns).await {
            return;
        }
        let (a, b) = (cache(h, &ns).await, cache(h, &ns).await);
        let other = cache(h, &unique_ns("other")).await;
        let origin = Origin::default();
        for key in ["x", "y"] {
            fetch_now(&a, key, &origin).await;
        }
        other.set("x", "kept".to_owned()).await.unwrap();
        b.clear().await.unwrap();
        assert_eq!(get(&b, "x").await, None);
        let start = tokio::time::Instant::now();
        while get(&a, "x").await.is_some() || get(&a, "y").await.is_some() {
            assert!(start.elapsed() < Duration::from_secs(5), "the other pod still answers");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(get(&other, "x").await.as_deref(), Some("kept"));
        assert_eq!(fetch_now(&a, "x", &origin).await.outcome, Outcome::Loaded);
        assert_eq!(fetch_now(&b, "x", &origin).await.outcome, Outcome::Hit);
    }

    /// `expire_tag` with a grace window: the old value is answered stale at
    /// once while one refresh runs, then the new one is a hit.
    pub async fn expire_tag_answers_stale_while_one_refresh_runs(h: &dyn Harness) {
        let ns = unique_ns("expire-tag");
        if !stores_marks(h, &ns).await {
            return;
        }
        let grace = |b: crate::CacheBuilder<String, String>| b.grace(Duration::from_secs(60));
        let (a, b) = (cache_with(h, &ns, grace).await, cache_with(h, &ns, grace).await);
        let origin = Origin::default();
        a.fetch("k", tagged(&origin, &["t"])).await.unwrap();
        b.expire_tag("t").await.unwrap();
        let stale = b.fetch("k", tagged(&origin, &["t"])).await.unwrap();
        assert_eq!((stale.outcome, stale.value.as_str()), (Outcome::Stale, "k-v1"));
        eventually(Duration::from_secs(5), || origin.count() == 2).await;
        let start = tokio::time::Instant::now();
        loop {
            let got = a.fetch("k", tagged(&origin, &["t"])).await.unwrap();
            if got.value == "k-v2" {
                break;
            }
            assert_eq!(got.outcome, Outcome::Stale);
            assert!(start.elapsed() < Duration::from_secs(5), "the refresh never landed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(origin.count(), 2, "one refresh");
    }
}
