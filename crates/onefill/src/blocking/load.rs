//! A blocking loader (a plain closure) as an async one: it runs on a
//! blocking pool, never on an async worker, and its panic stays a panic of
//! the load, which the flight reports to every caller as
//! [`Error::LoaderPanicked`](crate::Error::LoaderPanicked).
//!
//! The pool is the process's own pool of loader threads, not the blocking
//! pool of the runtime driving the cache: synchronous callers often wait
//! on that one (`spawn_blocking`, actix-web's `web::block`), and a herd of
//! them can fill it, leaving the one load they all wait for queued behind
//! them until the load timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;

/// The loader threads: tokio's blocking pool (capped, idle threads
/// retire) of a runtime that runs nothing else. `None` if it could not
/// start: loaders then share the driving runtime's pool.
static LOADERS: OnceLock<Option<Runtime>> = OnceLock::new();

/// Runs `work` on a loader thread, inside the context of the runtime that
/// drives the cache (`Handle::current()` there is that runtime, as in
/// `spawn_blocking`).
fn spawn<R: Send + 'static>(work: impl FnOnce() -> R + Send + 'static) -> OnBlockingPool<R> {
    let driving = Handle::current();
    let pool = LOADERS.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .thread_name("onefill-loader")
            .build()
            .ok()
    });
    let on_thread = {
        let driving = driving.clone();
        move || {
            let _entered = driving.enter();
            work()
        }
    };
    OnBlockingPool(match pool {
        Some(pool) => pool.handle().spawn_blocking(on_thread),
        None => driving.spawn_blocking(on_thread),
    })
}

/// The async face of one blocking load.
pub(crate) struct OnBlockingPool<R>(JoinHandle<R>);

impl<R> Future for OnBlockingPool<R> {
    type Output = R;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<R> {
        match Pin::new(&mut self.0).poll(cx) {
            Poll::Ready(Ok(answer)) => Poll::Ready(answer),
            // Unwound in the load's own task, where the flight catches it
            // (as it catches an async loader's), without running the panic
            // hook a second time.
            Poll::Ready(Err(joined)) => std::panic::resume_unwind(match joined.try_into_panic() {
                Ok(payload) => payload,
                Err(_) => {
                    Box::new("the blocking loader was cancelled: its runtime is shutting down")
                }
            }),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// One key's blocking loader, as the loader of an async call.
pub(crate) fn one<K, R, F>(loader: F) -> impl FnOnce(K) -> OnBlockingPool<R> + Send + 'static
where
    K: Send + 'static,
    R: Send + 'static,
    F: FnOnce(K) -> R + Send + 'static,
{
    move |key| spawn(move || loader(key))
}

/// A blocking batch loader, as the loader of an async batch call.
pub(crate) fn many<K, R, F>(
    loader: F,
) -> impl Fn(Vec<K>) -> OnBlockingPool<R> + Send + Sync + 'static
where
    K: Send + 'static,
    R: Send + 'static,
    F: Fn(Vec<K>) -> R + Send + Sync + 'static,
{
    let loader = Arc::new(loader);
    move |keys| {
        let loader = loader.clone();
        spawn(move || loader(keys))
    }
}
