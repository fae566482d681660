//! Loaders the tests share: one that counts its loads, sleeps, then
//! answers a value, fails or panics; one that answers a given value (or
//! error) after a given time.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy)]
pub enum Then {
    /// `v{n}`, `n` being the load's number.
    Value,
    /// An I/O error.
    Fail,
    /// A panic.
    Panic,
}

/// A loader counting into `loads`, sleeping `took`, then `then`.
pub fn load(
    loads: &Arc<AtomicUsize>,
    took: Duration,
    then: Then,
) -> impl FnOnce(
    String,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<String>> + Send>>
       + Send
       + 'static {
    let loads = loads.clone();
    move |_| {
        Box::pin(async move {
            let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(took).await;
            match then {
                Then::Value => Ok(format!("v{n}")),
                Then::Fail => Err(io::Error::other(format!("load {n} failed"))),
                Then::Panic => panic!("load {n} panicked"),
            }
        })
    }
}

/// A loader's boxed future, as [`after`] makes it.
pub type Loading = std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<String>> + Send>>;

/// A loader that answers after `ms` (tokio time): `answer`'s value, or an
/// I/O error carrying its message.
pub fn after(
    ms: u64,
    answer: Result<&'static str, &'static str>,
) -> impl FnOnce(String) -> Loading {
    move |_| {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            answer.map(str::to_owned).map_err(io::Error::other)
        })
    }
}

/// `n` milliseconds.
pub fn ms(n: u64) -> std::time::Duration {
    Duration::from_millis(n)
}

/// A call on `"k"` whose loader counts into `loads`, sleeps `took`, then
/// does as `then` says ([`load`]).
pub async fn fetch_then(
    c: &onefill::Cache<String, String>,
    loads: &Arc<AtomicUsize>,
    took: Duration,
    then: Then,
) -> Result<onefill::Fetched<String>, onefill::Error> {
    c.fetch("k", load(loads, took, then)).await
}

/// The bytes stored for `"k"` in namespace `ns`, envelope included.
pub async fn stored_bytes(backend: &onefill::MemoryBackend, ns: &str) -> Option<Vec<u8>> {
    use onefill::backend::{Backend, FillKeys};
    backend
        .get(&FillKeys::new(ns, "k"))
        .await
        .unwrap()
        .map(|s| s.bytes)
}
