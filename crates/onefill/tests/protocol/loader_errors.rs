//! Loaders return the error types users write: `anyhow::Result`,
//! `Result<V, Box<dyn Error + Send + Sync>>`, `io::Result` and their own
//! enum, with no adapter, in every loading entry point; every caller gets
//! the loader's own error back typed, and the source chain shows it.

use std::error::Error as _;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use onefill::{BoxError, Cache, CallOptions, Error, MemoryBackend};

#[derive(Debug, thiserror::Error)]
enum OriginError {
    #[error("no row {0}")]
    NoRow(u32),
    #[error("origin down")]
    Down(#[source] io::Error),
}

fn no_row(err: &Error) -> Option<u32> {
    match err.loader_error::<OriginError>()? {
        OriginError::NoRow(n) => Some(*n),
        OriginError::Down(_) => None,
    }
}

fn cache() -> Cache<u32, String> {
    Cache::builder()
        .namespace("errors")
        .backend(MemoryBackend::new())
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// The four kinds compile in every entry point, and a success is a value.
#[tokio::test(start_paused = true)]
async fn every_kind_compiles_in_every_entry_point() {
    let c = cache();
    let opts = CallOptions::new();
    let v = c
        .get_or_load(&1, |k| async move { anyhow::Ok(format!("a{k}")) })
        .await
        .unwrap();
    assert_eq!(v, "a1");
    let v = c
        .with_options(&opts)
        .get_or_load(&2, |k| async move { Ok::<_, BoxError>(format!("b{k}")) })
        .await
        .unwrap();
    assert_eq!(v, "b2");
    let v = c
        .with_options(&opts)
        .fetch(&3, |k| async move { io::Result::Ok(format!("c{k}")) })
        .await
        .unwrap();
    assert_eq!(v.value, "c3");
    let v = c
        .get_or_load_optional(&4, |_| async move { Ok::<_, OriginError>(None) })
        .await
        .unwrap();
    assert_eq!(v, None);
    let v = c
        .with_options(&opts)
        .fetch_optional(&5, |k| async move { anyhow::Ok(Some(format!("e{k}"))) })
        .await
        .unwrap();
    assert_eq!(v.value.as_deref(), Some("e5"));
}

/// Every coalesced caller gets the loader's error, typed, whichever kind
/// carried it; one load.
async fn shared_and_typed<E, F>(key: u32, make: F) -> Vec<Error>
where
    E: onefill::IntoLoaderError,
    F: Fn() -> E + Send + Sync + 'static,
{
    let c = cache();
    let loads = Arc::new(AtomicUsize::new(0));
    let make = Arc::new(make);
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let (c, loads, make) = (c.clone(), loads.clone(), make.clone());
        tasks.push(tokio::spawn(async move {
            c.get_or_load(&key, move |_| async move {
                loads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err::<String, E>(make())
            })
            .await
            .unwrap_err()
        }));
    }
    let mut errors = Vec::new();
    for t in tasks {
        errors.push(t.await.unwrap());
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    errors
}

#[tokio::test(start_paused = true)]
async fn the_users_own_enum_comes_back_typed() {
    for err in shared_and_typed(1, || OriginError::NoRow(1)).await {
        assert_eq!(no_row(&err), Some(1));
        assert_eq!(err.to_string(), "loader failed: no row 1");
    }
}

#[tokio::test(start_paused = true)]
async fn io_errors_come_back_typed() {
    for err in shared_and_typed(2, || io::Error::new(io::ErrorKind::TimedOut, "slow")).await {
        let io = err.loader_error::<io::Error>().expect("the io error");
        assert_eq!(io.kind(), io::ErrorKind::TimedOut);
        assert!(err.loader_error::<OriginError>().is_none());
    }
}

#[tokio::test(start_paused = true)]
async fn boxed_errors_come_back_typed() {
    let errors = shared_and_typed(3, || -> BoxError { Box::new(OriginError::NoRow(3)) }).await;
    for err in errors {
        assert_eq!(no_row(&err), Some(3));
        assert_eq!(err.to_string(), "loader failed: no row 3");
    }
}

#[tokio::test(start_paused = true)]
async fn anyhow_errors_come_back_typed_through_context() {
    let errors = shared_and_typed(4, || {
        Err::<(), _>(OriginError::Down(io::Error::other("refused")))
            .context("loading user 4")
            .unwrap_err()
    })
    .await;
    for err in errors {
        // Under the context, the user's error and its own cause are found.
        assert!(matches!(
            err.loader_error::<OriginError>(),
            Some(OriginError::Down(_))
        ));
        assert_eq!(
            err.loader_error::<io::Error>().map(|e| e.to_string()),
            Some("refused".to_owned())
        );
        assert_eq!(err.to_string(), "loader failed: loading user 4");
        // The chain: the caller's error, the loader's (transparent), then
        // its causes, as `anyhow` would report them.
        let chain: Vec<String> = std::iter::successors(err.source(), |e| (*e).source())
            .map(|e| e.to_string())
            .collect();
        assert_eq!(chain, ["loading user 4", "origin down", "refused"]);
    }
    // A plain message works too.
    let errors = shared_and_typed(5, || anyhow::anyhow!("gone")).await;
    assert_eq!(errors[0].to_string(), "loader failed: gone");
    let Error::Loader(loader) = &errors[0] else {
        panic!("{:?}", errors[0]);
    };
    assert!(!loader.is::<io::Error>());
}

/// `?` on mixed error types inside an `anyhow` loader: the natural code.
#[tokio::test(start_paused = true)]
async fn question_mark_in_an_anyhow_loader() {
    let c = cache();
    let err = c
        .get_or_load(&6, |k| async move {
            let n: u32 = "not a number".parse().context("parsing")?;
            anyhow::Ok(format!("{k}{n}"))
        })
        .await
        .unwrap_err();
    assert!(err.loader_error::<std::num::ParseIntError>().is_some());
}

/// A plain message works too (`String`, `&'static str` convert into a
/// boxed error), and shows as the error.
#[tokio::test(start_paused = true)]
async fn message_errors_work_too() {
    let c = cache();
    let err = c
        .get_or_load(&8, |_| async { Err::<String, _>("no such row") })
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "loader failed: no such row");
    let err = c
        .get_or_load(
            &9,
            |k| async move { Err::<String, _>(format!("row {k} gone")) },
        )
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "loader failed: row 9 gone");
}

/// A loader's error through the cache: typed, in the source chain, through
/// nested caches and coalesced callers, and anyhow's context kept.
mod through_caches {
    use std::error::Error as _;
    use std::io;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use onefill::{Cache, MemoryBackend};

    const NS: &str = "errors";

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[derive(Debug, thiserror::Error)]
    #[error("no row {0}")]
    struct NoRow(u32);

    fn errors_cache() -> Cache<u32, String> {
        Cache::builder()
            .namespace(NS)
            .backend(MemoryBackend::new())
            .build()
            .unwrap()
    }

    // ---------------------------------------------------------------------
    // Loader errors
    // ---------------------------------------------------------------------

    /// The most common `anyhow` loader: `?` (or `bail!`) on a typed error, no
    /// `.context(..)`. The README and `Error::loader_error` promise the typed
    /// error back "also from inside an `anyhow::Error`".
    #[tokio::test(start_paused = true)]
    async fn anyhow_without_context_comes_back_typed() {
        let c = errors_cache();
        let err = c
            .get_or_load(&1, |k| async move {
                let row: Result<String, NoRow> = Err(NoRow(k));
                let row = row?; // into anyhow::Error, no context
                anyhow::Ok(row)
            })
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "loader failed: no row 1");
        assert_eq!(err.loader_error::<NoRow>().map(|e| e.0), Some(1));
    }

    /// A caller that hands `onefill::Error` up a generic error path (`?` into
    /// `anyhow`, a `Box<dyn Error>`, a web framework) walks `source()` to find
    /// the cause; the loader's own error must be in that chain, not only its
    /// Display.
    #[tokio::test(start_paused = true)]
    async fn the_loaders_error_is_in_the_source_chain() {
        let c = errors_cache();
        let err = c
            .get_or_load(&2, |_| async {
                Err::<String, _>(io::Error::other("db down"))
            })
            .await
            .unwrap_err();
        let mut next = err.source();
        let mut found = false;
        while let Some(e) = next {
            found |= e.is::<io::Error>();
            next = e.source();
        }
        assert!(found, "no io::Error in the chain of {err:?}");
        // The same through anyhow, as a handler would see it.
        let any = anyhow::Error::from(err);
        assert!(any.chain().any(|e| e.is::<io::Error>()));
    }

    /// A loader that uses another cache (a layered lookup) returns
    /// `onefill::Error`; the outer caller's `loader_error` should find the
    /// inner loader's error.
    #[tokio::test(start_paused = true)]
    async fn nested_caches_keep_the_inner_error_type() {
        let inner = errors_cache();
        let outer: Cache<u32, String> = Cache::builder()
            .namespace("outer")
            .backend(MemoryBackend::new())
            .build()
            .unwrap();
        let err = outer
            .get_or_load(&3, move |k| async move {
                inner
                    .get_or_load(&k, |k| async move { Err::<String, _>(NoRow(k)) })
                    .await
            })
            .await
            .unwrap_err();
        assert_eq!(err.loader_error::<NoRow>().map(|e| e.0), Some(3));
    }

    /// Nested `anyhow` contexts and a coalesced caller: found (works).
    #[tokio::test(start_paused = true)]
    async fn nested_anyhow_contexts_through_coalesced_callers() {
        use anyhow::Context as _;
        let c = errors_cache();
        let loads = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let (c, loads) = (c.clone(), loads.clone());
            tasks.push(tokio::spawn(async move {
                c.get_or_load(&4, move |k| async move {
                    loads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(ms(10)).await;
                    Err::<String, _>(NoRow(k))
                        .context("inner")
                        .context("middle")
                        .context("outer")
                })
                .await
                .unwrap_err()
            }));
        }
        for t in tasks {
            let err = t.await.unwrap();
            assert_eq!(err.loader_error::<NoRow>().map(|e| e.0), Some(4));
            assert_eq!(err.to_string(), "loader failed: outer");
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
    }

    /// The workaround (and the shape of a fix) for anyhow losing the type: anyhow's
    /// relocating conversion makes the box downcastable to the original type.
    #[tokio::test(start_paused = true)]
    async fn anyhow_relocated_into_a_box_comes_back_typed() {
        let c = errors_cache();
        let err = c
            .get_or_load(&5, |k| async move {
                let row: anyhow::Result<String> = Err(NoRow(k).into());
                row.map_err(|e| e.reallocate_into_boxed_dyn_error_without_backtrace())
            })
            .await
            .unwrap_err();
        assert_eq!(err.loader_error::<NoRow>().map(|e| e.0), Some(5));
    }
}
