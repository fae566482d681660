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
    let pool = pool.as_ref().map_or(&driving, Runtime::handle);
    spawn_on(pool, &driving, work)
}

/// [`spawn`] on the blocking pool of `pool`'s runtime.
fn spawn_on<R: Send + 'static>(
    pool: &Handle,
    driving: &Handle,
    work: impl FnOnce() -> R + Send + 'static,
) -> OnBlockingPool<R> {
    let driving = driving.clone();
    OnBlockingPool(pool.spawn_blocking(move || {
        let _entered = driving.enter();
        work()
    }))
}

/// The async face of one blocking load.
pub(crate) struct OnBlockingPool<R>(JoinHandle<R>);

impl<R> Drop for OnBlockingPool<R> {
    /// A load nobody waits for any more (its flight timed out, or was
    /// abandoned) that is still queued for a thread never starts: when a
    /// slow origin fills the pool, the loads queued behind it would
    /// otherwise each run later, for nobody, on the origin that is already
    /// struggling. One that has started runs on: nothing can interrupt a
    /// closure.
    fn drop(&mut self) {
        self.0.abort();
    }
}

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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    use super::*;

    /// Regression: a load whose flight had given up while it waited for a
    /// loader thread still ran once one was free.
    #[test]
    fn a_queued_load_nobody_waits_for_never_starts() {
        let pool = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        let driving = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (release, released) = mpsc::channel::<()>();
        // Holds the pool's only thread until released.
        let first = spawn_on(pool.handle(), driving.handle(), move || released.recv());
        let ran = Arc::new(AtomicBool::new(false));
        let abandoned = spawn_on(pool.handle(), driving.handle(), {
            let ran = ran.clone();
            move || ran.store(true, Ordering::SeqCst)
        });
        drop(abandoned);
        release.send(()).unwrap();
        // Queued after the abandoned load: by the time it has run, so
        // would have the abandoned one.
        let last = spawn_on(pool.handle(), driving.handle(), || ());
        driving.block_on(async {
            first.await.unwrap();
            last.await;
        });
        assert!(!ran.load(Ordering::SeqCst), "the abandoned load ran");
    }
}
