//! [`BlockingWithOptions`]: a blocking cache's calls with per-call options.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt::{self, Display};
use std::hash::Hash;

use crate::answer::Fetched;
use crate::error::{Error, IntoLoaderError};
use crate::loader::Loaded;
use crate::options::CallOptions;

use super::{load, BlockingCache};

/// A blocking cache's calls with per-call overrides of its policy: made by
/// [`BlockingCache::with_options`]. Each call is the
/// [`WithOptions`](crate::WithOptions) call of the same name, blocking.
pub struct BlockingWithOptions<'a, K, V> {
    cache: &'a BlockingCache<K, V>,
    options: &'a CallOptions,
}

impl<K, V> Clone for BlockingWithOptions<'_, K, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, V> Copy for BlockingWithOptions<'_, K, V> {}

impl<K, V> fmt::Debug for BlockingWithOptions<'_, K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingWithOptions")
            .field("cache", &self.cache.cache)
            .field("options", self.options)
            .finish()
    }
}

impl<'a, K, V> BlockingWithOptions<'a, K, V> {
    pub(super) fn new(cache: &'a BlockingCache<K, V>, options: &'a CallOptions) -> Self {
        BlockingWithOptions { cache, options }
    }
}

impl<K, V> BlockingWithOptions<'_, K, V>
where
    K: Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// [`BlockingCache::get_or_load`] with these options.
    ///
    /// # Errors
    ///
    /// As [`BlockingCache::get_or_load`]; out-of-range options are
    /// [`Error::InvalidInput`].
    pub fn get_or_load<Q, F, T, E>(self, key: &Q, loader: F) -> Result<V, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(K) -> Result<T, E> + Send + 'static,
        T: Into<Loaded<V>> + Send + 'static,
        E: IntoLoaderError,
    {
        self.fetch(key, loader).map(|fetched| fetched.value)
    }

    /// [`BlockingCache::fetch`] with these options.
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](BlockingWithOptions::get_or_load).
    pub fn fetch<Q, F, T, E>(self, key: &Q, loader: F) -> Result<Fetched<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(K) -> Result<T, E> + Send + 'static,
        T: Into<Loaded<V>> + Send + 'static,
        E: IntoLoaderError,
    {
        let call = self.cache.cache.with_options(self.options);
        self.cache.driver.run(call.fetch(key, load::one(loader)))?
    }

    /// [`BlockingCache::get_or_load_optional`] with these options.
    ///
    /// # Errors
    ///
    /// As [`get_or_load`](BlockingWithOptions::get_or_load), except that a
    /// cached absence is `Ok(None)`.
    pub fn get_or_load_optional<Q, F, T, E>(self, key: &Q, loader: F) -> Result<Option<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(K) -> Result<T, E> + Send + 'static,
        T: Into<Loaded<Option<V>>> + Send + 'static,
        E: IntoLoaderError,
    {
        self.fetch_optional(key, loader)
            .map(|fetched| fetched.value)
    }

    /// [`BlockingCache::fetch_optional`] with these options.
    ///
    /// # Errors
    ///
    /// As [`get_or_load_optional`](BlockingWithOptions::get_or_load_optional).
    pub fn fetch_optional<Q, F, T, E>(self, key: &Q, loader: F) -> Result<Fetched<Option<V>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: FnOnce(K) -> Result<T, E> + Send + 'static,
        T: Into<Loaded<Option<V>>> + Send + 'static,
        E: IntoLoaderError,
    {
        let call = self.cache.cache.with_options(self.options);
        self.cache
            .driver
            .run(call.fetch_optional(key, load::one(loader)))?
    }

    /// [`BlockingCache::get_or_load_many`] with these options.
    ///
    /// # Errors
    ///
    /// As [`BlockingCache::get_or_load_many`]: invalid options fail the call
    /// as a whole.
    pub fn get_or_load_many<F, I, T, E>(self, keys: &[K], loader: F) -> Result<HashMap<K, V>, Error>
    where
        K: Hash + Eq,
        F: Fn(Vec<K>) -> Result<I, E> + Send + Sync + 'static,
        I: IntoIterator<Item = (K, T)> + Send + 'static,
        T: Into<Loaded<V>>,
        E: IntoLoaderError,
    {
        let call = self.cache.cache.with_options(self.options);
        self.cache
            .driver
            .run(call.get_or_load_many(keys, load::many(loader)))?
    }

    /// [`BlockingCache::fetch_many`] with these options.
    ///
    /// # Errors
    ///
    /// As [`BlockingCache::fetch_many`]: invalid options fail the call as a
    /// whole.
    #[allow(clippy::type_complexity)]
    pub fn fetch_many<F, I, T, E>(
        self,
        keys: &[K],
        loader: F,
    ) -> Result<HashMap<K, Result<Fetched<Option<V>>, Error>>, Error>
    where
        K: Hash + Eq,
        F: Fn(Vec<K>) -> Result<I, E> + Send + Sync + 'static,
        I: IntoIterator<Item = (K, T)> + Send + 'static,
        T: Into<Loaded<V>>,
        E: IntoLoaderError,
    {
        let call = self.cache.cache.with_options(self.options);
        self.cache
            .driver
            .run(call.fetch_many(keys, load::many(loader)))?
    }

    /// [`BlockingCache::set`] with these options (the value's `ttl`,
    /// `grace` and `jitter`).
    ///
    /// # Errors
    ///
    /// As [`BlockingCache::set`]; out-of-range options are
    /// [`Error::InvalidInput`] (nothing is written).
    pub fn set<Q>(self, key: &Q, value: V) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        let call = self.cache.cache.with_options(self.options);
        self.cache.driver.run(call.set(key, value))?
    }

    /// [`set`](BlockingWithOptions::set), the value carrying `tags`. As
    /// [`Cache::set_tagged`](crate::Cache::set_tagged).
    ///
    /// # Errors
    ///
    /// As [`Cache::set_tagged`](crate::Cache::set_tagged), and
    /// [`Error::BlockingInAsync`].
    pub fn set_tagged<Q, I, T>(self, key: &Q, value: V, tags: I) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let call = self.cache.cache.with_options(self.options);
        self.cache.driver.run(call.set_tagged(key, value, tags))?
    }
}
