//! A blocking loader (a plain closure) as an async one: it runs on the
//! runtime's blocking pool, never on an async worker, and its panic stays
//! a panic of the load, which the flight reports to every caller as
//! [`Error::LoaderPanicked`](crate::Error::LoaderPanicked).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::task::JoinHandle;

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
    move |key| OnBlockingPool(tokio::task::spawn_blocking(move || loader(key)))
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
        OnBlockingPool(tokio::task::spawn_blocking(move || loader(keys)))
    }
}
