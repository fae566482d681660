//! [`CacheUnderTest`]: the cache a scenario drives, called the way its
//! harness says: through the async [`Cache`], or through the
//! [`BlockingCache`] on top of it, from a blocking thread, with each async
//! loader turned into a plain closure. The scenarios are written once; a
//! harness wrapped in [`Blocking`] runs them all through the blocking
//! handle.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::runtime::Handle;

use super::Harness;
use crate::backend::Backend;
use crate::loader::{BatchLoader, Loaded, Loader};
use crate::{BlockingCache, Cache, CallOptions, Error, Fetched, Stats};

/// A harness whose scenarios call the cache through [`BlockingCache`]
/// (from `spawn_blocking`, as a thread of synchronous code would) instead
/// of the async [`Cache`]. It needs a multi-thread runtime in real time:
/// `tokio::test(flavor = "multi_thread")`.
#[derive(Debug, Clone, Default)]
pub struct Blocking<H>(pub H);

#[async_trait]
impl<H: Harness> Harness for Blocking<H> {
    async fn backend(&self) -> Arc<dyn Backend> {
        self.0.backend().await
    }
    fn paused(&self) -> bool {
        self.0.paused()
    }
    fn blocking(&self) -> bool {
        true
    }
}

/// One simulated process's cache, with the calls the scenarios make.
/// Each means what the [`Cache`] call of the same name means.
#[derive(Debug, Clone)]
pub struct CacheUnderTest {
    cache: Cache<String, String>,
    /// Set when the calls go through the blocking handle.
    blocking: Option<BlockingCache<String, String>>,
}

/// A scenario's panic on a broken blocking call: the thread it ran on.
const JOINED: &str = "the blocking caller's thread";

impl CacheUnderTest {
    /// Calls `cache` directly, or, if `blocking`, through its blocking
    /// handle on the current runtime (which must be multi-threaded).
    ///
    /// # Panics
    ///
    /// If `blocking` and the current runtime cannot carry a blocking handle.
    pub fn new(cache: Cache<String, String>, blocking: bool) -> Self {
        let blocking = blocking.then(|| {
            cache
                .blocking()
                .expect("a blocking harness runs on a multi-thread runtime")
        });
        CacheUnderTest { cache, blocking }
    }

    /// The async cache underneath.
    pub fn as_async(&self) -> &Cache<String, String> {
        &self.cache
    }

    /// [`Cache::fetch`].
    pub async fn fetch<F, T>(&self, key: &str, loader: F) -> Result<Fetched<String>, Error>
    where
        F: Loader<String, T>,
        T: Into<Loaded<String>> + Send + 'static,
    {
        self.with_options(&CallOptions::NONE)
            .fetch(key, loader)
            .await
    }

    /// [`Cache::get_or_load`].
    pub async fn get_or_load<F, T>(&self, key: &str, loader: F) -> Result<String, Error>
    where
        F: Loader<String, T>,
        T: Into<Loaded<String>> + Send + 'static,
    {
        self.fetch(key, loader).await.map(|fetched| fetched.value)
    }

    /// [`Cache::get_or_load_optional`].
    pub async fn get_or_load_optional<F, T>(
        &self,
        key: &str,
        loader: F,
    ) -> Result<Option<String>, Error>
    where
        F: Loader<String, T>,
        T: Into<Loaded<Option<String>>> + Send + 'static,
    {
        let Some(blocking) = self.blocking.clone() else {
            return self.cache.get_or_load_optional(key, loader).await;
        };
        let key = key.to_owned();
        let loader = plain(loader);
        tokio::task::spawn_blocking(move || blocking.get_or_load_optional(&key, loader))
            .await
            .expect(JOINED)
    }

    /// [`Cache::get_or_load_many`].
    pub async fn get_or_load_many<F, T>(
        &self,
        keys: &[String],
        loader: F,
    ) -> Result<HashMap<String, String>, Error>
    where
        F: BatchLoader<String, T>,
        T: Into<Loaded<String>> + Send + 'static,
        F::Found: Send + 'static,
    {
        let Some(blocking) = self.blocking.clone() else {
            return self.cache.get_or_load_many(keys, loader).await;
        };
        let keys = keys.to_vec();
        let handle = Handle::current();
        let loader = move |keys: Vec<String>| handle.block_on(loader(keys));
        tokio::task::spawn_blocking(move || blocking.get_or_load_many(&keys, loader))
            .await
            .expect(JOINED)
    }

    /// [`Cache::with_options`].
    pub fn with_options<'a>(&'a self, options: &'a CallOptions) -> UnderTestWithOptions<'a> {
        UnderTestWithOptions {
            cache: self,
            options,
        }
    }

    /// [`Cache::get`].
    pub async fn get(&self, key: &str) -> Result<Option<String>, Error> {
        let Some(blocking) = self.blocking.clone() else {
            return self.cache.get(key).await;
        };
        let key = key.to_owned();
        tokio::task::spawn_blocking(move || blocking.get(&key))
            .await
            .expect(JOINED)
    }

    /// [`Cache::set`].
    pub async fn set(&self, key: &str, value: String) -> Result<(), Error> {
        self.with_options(&CallOptions::NONE).set(key, value).await
    }

    /// [`Cache::invalidate`].
    pub async fn invalidate(&self, key: &str) -> Result<(), Error> {
        let Some(blocking) = self.blocking.clone() else {
            return self.cache.invalidate(key).await;
        };
        let key = key.to_owned();
        tokio::task::spawn_blocking(move || blocking.invalidate(&key))
            .await
            .expect(JOINED)
    }

    /// [`Cache::expire`].
    pub async fn expire(&self, key: &str) -> Result<(), Error> {
        let Some(blocking) = self.blocking.clone() else {
            return self.cache.expire(key).await;
        };
        let key = key.to_owned();
        tokio::task::spawn_blocking(move || blocking.expire(&key))
            .await
            .expect(JOINED)
    }

    /// [`Cache::invalidate_tag`].
    pub async fn invalidate_tag(&self, tag: &str) -> Result<(), Error> {
        let Some(blocking) = self.blocking.clone() else {
            return self.cache.invalidate_tag(tag).await;
        };
        let tag = tag.to_owned();
        tokio::task::spawn_blocking(move || blocking.invalidate_tag(&tag))
            .await
            .expect(JOINED)
    }

    /// [`Cache::expire_tag`].
    pub async fn expire_tag(&self, tag: &str) -> Result<(), Error> {
        let Some(blocking) = self.blocking.clone() else {
            return self.cache.expire_tag(tag).await;
        };
        let tag = tag.to_owned();
        tokio::task::spawn_blocking(move || blocking.expire_tag(&tag))
            .await
            .expect(JOINED)
    }

    /// [`Cache::clear`].
    pub async fn clear(&self) -> Result<(), Error> {
        let Some(blocking) = self.blocking.clone() else {
            return self.cache.clear().await;
        };
        tokio::task::spawn_blocking(move || blocking.clear())
            .await
            .expect(JOINED)
    }

    /// [`Cache::set_tagged`].
    pub async fn set_tagged(&self, key: &str, value: String, tags: &[&str]) -> Result<(), Error> {
        let tags: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
        let Some(blocking) = self.blocking.clone() else {
            return self.cache.set_tagged(key, value, tags).await;
        };
        let key = key.to_owned();
        tokio::task::spawn_blocking(move || blocking.set_tagged(&key, value, tags))
            .await
            .expect(JOINED)
    }

    /// [`Cache::stats`].
    pub fn stats(&self) -> Stats {
        self.cache.stats()
    }
}

/// [`CacheUnderTest`]'s calls with per-call options.
#[derive(Debug, Clone, Copy)]
pub struct UnderTestWithOptions<'a> {
    cache: &'a CacheUnderTest,
    options: &'a CallOptions,
}

impl UnderTestWithOptions<'_> {
    /// [`WithOptions::fetch`](crate::WithOptions::fetch).
    pub async fn fetch<F, T>(self, key: &str, loader: F) -> Result<Fetched<String>, Error>
    where
        F: Loader<String, T>,
        T: Into<Loaded<String>> + Send + 'static,
    {
        // With no options of its own, a call with options is the plain
        // call (the L1 included): the cache compares them with none.
        let Some(blocking) = self.cache.blocking.clone() else {
            let call = self.cache.cache.with_options(self.options);
            return call.fetch(key, loader).await;
        };
        let (key, options, loader) = (key.to_owned(), self.options.clone(), plain(loader));
        tokio::task::spawn_blocking(move || blocking.with_options(&options).fetch(&key, loader))
            .await
            .expect(JOINED)
    }

    /// [`WithOptions::set`](crate::WithOptions::set).
    pub async fn set(self, key: &str, value: String) -> Result<(), Error> {
        let Some(blocking) = self.cache.blocking.clone() else {
            return self
                .cache
                .cache
                .with_options(self.options)
                .set(key, value)
                .await;
        };
        let (key, options) = (key.to_owned(), self.options.clone());
        tokio::task::spawn_blocking(move || blocking.with_options(&options).set(&key, value))
            .await
            .expect(JOINED)
    }
}

/// An async loader as the plain closure a blocking caller passes: it runs
/// on a loader thread, which may wait for the async work on the scenario's
/// runtime.
fn plain<K, T, F>(loader: F) -> impl FnOnce(K) -> Result<T, F::Error> + Send + 'static
where
    F: Loader<K, T>,
{
    let handle = Handle::current();
    move |key| handle.block_on(loader(key))
}
