//! [`WithOptions`]: a cache's calls with per-call options, borrowed.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt::{self, Display};
use std::hash::Hash;

use crate::answer::Fetched;
use crate::error::Error;
use crate::loader::{BatchLoader, Loaded, Loader};
use crate::options::CallOptions;

use super::Cache;

/// A cache's calls with per-call overrides of its policy: made by
/// [`Cache::with_options`], cheap to copy, borrowed for as long as the
/// options.
///
/// Each call means what the [`Cache`] call of the same name means, with the
/// options applied; options out of range fail the call with
/// [`Error::InvalidInput`] before any I/O. A call that joins a load already
/// under way in this process shares that load's outcome, which was decided
/// with the first caller's options.
pub struct WithOptions<'a, K, V> {
    cache: &'a Cache<K, V>,
    options: &'a CallOptions,
}

impl<K, V> Clone for WithOptions<'_, K, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, V> Copy for WithOptions<'_, K, V> {}

impl<K, V> fmt::Debug for WithOptions<'_, K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithOptions")
            .field("namespace", &self.cache.shared.namespace)
            .field("options", self.options)
            .finish()
    }
}

impl<'a, K, V> WithOptions<'a, K, V> {
    pub(super) fn new(cache: &'a Cache<K, V>, options: &'a CallOptions) -> Self {
        WithOptions { cache, options }
    }
}

impl<K, V> WithOptions<'_, K, V>
where
    K: Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// [`Cache::get_or_load`] with these options.
    ///
    /// # Errors
    ///
    /// As [`Cache::get_or_load`].
    pub async fn get_or_load<Q, F, T>(self, key: &Q, loader: F) -> Result<V, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<V>>,
    {
        let fetched = self.cache.load_value(key, self.options, loader).await;
        fetched.map(|f| f.value)
    }

    /// [`Cache::fetch`] with these options.
    ///
    /// # Errors
    ///
    /// As [`Cache::get_or_load`].
    pub async fn fetch<Q, F, T>(self, key: &Q, loader: F) -> Result<Fetched<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<V>>,
    {
        self.cache.load_value(key, self.options, loader).await
    }

    /// [`Cache::get_or_load_optional`] with these options.
    ///
    /// # Errors
    ///
    /// As [`Cache::get_or_load_optional`].
    pub async fn get_or_load_optional<Q, F, T>(self, key: &Q, loader: F) -> Result<Option<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<Option<V>>>,
    {
        let fetched = self.cache.load_one(key, self.options, loader).await;
        fetched.map(|f| f.value)
    }

    /// [`Cache::fetch_optional`] with these options.
    ///
    /// # Errors
    ///
    /// As [`Cache::get_or_load_optional`].
    pub async fn fetch_optional<Q, F, T>(
        self,
        key: &Q,
        loader: F,
    ) -> Result<Fetched<Option<V>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<Option<V>>>,
    {
        self.cache.load_one(key, self.options, loader).await
    }

    /// [`Cache::get_or_load_many`] with these options.
    ///
    /// # Errors
    ///
    /// As [`Cache::get_or_load_many`].
    pub async fn get_or_load_many<F, T>(self, keys: &[K], loader: F) -> Result<HashMap<K, V>, Error>
    where
        K: Hash + Eq,
        F: BatchLoader<K, T>,
        T: Into<Loaded<V>>,
    {
        self.cache.many_values(keys, self.options, loader).await
    }

    /// [`Cache::fetch_many`] with these options.
    ///
    /// # Errors
    ///
    /// As [`Cache::fetch_many`]: invalid options fail the call as a whole.
    pub async fn fetch_many<F, T>(
        self,
        keys: &[K],
        loader: F,
    ) -> Result<HashMap<K, Result<Fetched<Option<V>>, Error>>, Error>
    where
        K: Hash + Eq,
        F: BatchLoader<K, T>,
        T: Into<Loaded<V>>,
    {
        self.cache.many_answers(keys, self.options, loader).await
    }

    /// [`Cache::set`] with these options: the value's `ttl`, `grace` and
    /// `jitter` (the others do not apply to a write), as a loader may choose
    /// them with [`Loaded`](crate::Loaded).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use std::time::Duration;
    /// let cache = onefill::Cache::<String, String>::builder().build().unwrap();
    /// let draft = onefill::CallOptions::new().ttl(Duration::from_secs(5));
    /// cache.with_options(&draft).set("post:1", "draft".to_owned()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Cache::set`]; out-of-range options are [`Error::InvalidInput`]
    /// (nothing is written).
    pub async fn set<Q>(self, key: &Q, value: V) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        self.cache.write(key, value, self.options, &[]).await
    }

    /// [`set`](WithOptions::set), the value carrying `tags`. As
    /// [`Cache::set_tagged`].
    ///
    /// # Errors
    ///
    /// As [`Cache::set_tagged`]; out-of-range options are
    /// [`Error::InvalidInput`] (nothing is written).
    pub async fn set_tagged<Q, I, T>(self, key: &Q, value: V, tags: I) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let tags: Vec<String> = tags.into_iter().map(Into::into).collect();
        self.cache.write(key, value, self.options, &tags).await
    }
}
