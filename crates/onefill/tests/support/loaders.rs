//! A loader the soft-timeout, freshness and codec tests share: it counts
//! its loads, sleeps, then answers a value, fails or panics.

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
