//! Guard rails that warn (log + counter) rather than fail.

use std::time::Duration;

use onefill::backend::{Backend, FillKeys};
use onefill::{Cache, LeaseToken, MemoryBackend, OnWaitTimeout, WaitPolicy};

fn cache(backend: &MemoryBackend) -> Cache<String, String> {
    Cache::builder()
        .namespace("rail")
        .backend(backend.clone())
        .wait(
            WaitPolicy::default()
                .deadline(Duration::from_millis(100))
                .on_timeout(OnWaitTimeout::Error),
        )
        .build()
        .unwrap()
}

async fn ok(key: String) -> Result<String, std::io::Error> {
    Ok(key)
}

/// When most flights wait on another process's lease, the cache says so
/// once per window, not once per wait.
#[tokio::test(start_paused = true)]
async fn contention_near_the_request_rate_is_flagged_once() {
    let backend = MemoryBackend::new();
    let c = cache(&backend);
    for i in 0..30 {
        let key = format!("k{i}");
        // Another process holds every key's lease.
        backend
            .acquire(
                &FillKeys::new("rail", &key),
                &LeaseToken::random(),
                Duration::from_secs(60),
                Duration::ZERO,
            )
            .await
            .unwrap();
        assert!(c.get_or_load(&key, ok).await.is_err());
    }
    let s = c.stats();
    assert_eq!(s.waits, 30);
    assert_eq!(s.contention_warnings, 1);
}

/// Flights that mostly hit never trip it.
#[tokio::test(start_paused = true)]
async fn hits_do_not_trip_the_contention_guard() {
    let backend = MemoryBackend::new();
    let c = cache(&backend);
    for i in 0..30 {
        c.get_or_load(&format!("k{i}"), ok).await.unwrap();
        c.get_or_load(&format!("k{i}"), ok).await.unwrap();
    }
    assert_eq!(c.stats().contention_warnings, 0);
    assert_eq!(c.stats().waits, 0);
}
