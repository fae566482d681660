//! The private primitives every public verb of [`Cache`] and
//! [`WithOptions`](super::WithOptions) is a few lines over: a single-key
//! value, a batch's values or answers, a write; and what they share (the
//! call's policy, a validated key, a backend call, how a call ended).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use tracing::Instrument;

use crate::answer::Fetched;
use crate::error::{BackendError, Error};
use crate::freshness;
use crate::key::{self, FillKeys};
use crate::loader::{BatchLoader, Loaded, Loader};
use crate::options::{CallOptions, Policy, PolicyRef};
use crate::shared::Writing;

use super::{many, Cache, NO_OPTIONS};

/// The private primitives every public verb is a few lines over.
impl<K, V> Cache<K, V>
where
    K: Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// A single-key call whose loader finds a value (or a [`Loaded`] one):
    /// [`load_one`](Cache::load_one), a cached absence being
    /// [`Error::NotFound`].
    pub(super) async fn load_value<Q, F, T>(
        &self,
        key: &Q,
        options: &CallOptions,
        loader: F,
    ) -> Result<Fetched<V>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<V>>,
    {
        let found = move |key| async move { loader(key).await.map(|t| t.into().map(Some)) };
        let fetched = self.load_one(key, options, found).await?;
        match fetched.value {
            Some(value) => Ok(Fetched {
                value,
                outcome: fetched.outcome,
                coalesced: fetched.coalesced,
            }),
            None => Err(Error::NotFound),
        }
    }

    /// A batch call's values: the keys found, or the first key's error.
    pub(super) async fn many_values<F, T>(
        &self,
        keys: &[K],
        options: &CallOptions,
        loader: F,
    ) -> Result<HashMap<K, V>, Error>
    where
        K: Hash + Eq,
        F: BatchLoader<K, T>,
        T: Into<Loaded<V>>,
    {
        for key in keys {
            self.validated(key)?;
        }
        let answers = self
            .load_many(keys, options, many::erase_many(loader))
            .await?;
        let mut found = HashMap::with_capacity(answers.len());
        for (key, answer) in answers {
            if let Some(value) = answer?.value {
                found.insert(key, value);
            }
        }
        Ok(found)
    }

    /// A batch call's answers, each key's own.
    pub(super) async fn many_answers<F, T>(
        &self,
        keys: &[K],
        options: &CallOptions,
        loader: F,
    ) -> Result<HashMap<K, Result<Fetched<Option<V>>, Error>>, Error>
    where
        K: Hash + Eq,
        F: BatchLoader<K, T>,
        T: Into<Loaded<V>>,
    {
        let answers = self
            .load_many(keys, options, many::erase_many(loader))
            .await?;
        Ok(answers.into_iter().collect())
    }

    /// A write of `value` with `options` and `tags`, in its span.
    pub(super) async fn write<Q>(
        &self,
        key: &Q,
        value: V,
        options: &CallOptions,
        tags: &[String],
    ) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: Display + ?Sized,
    {
        let span = call_span!("onefill.set", self);
        let set = self
            .set_in_span(key, value, options, tags)
            .instrument(span.clone())
            .await;
        ended(&span, &set, |_| "ok");
        set
    }

    pub(super) async fn set_in_span<Q: Display + ?Sized>(
        &self,
        key: &Q,
        value: V,
        options: &CallOptions,
        tags: &[String],
    ) -> Result<(), Error> {
        let (key, policy) = self.prepare(key, options)?;
        let keys = FillKeys::new(&self.shared.namespace, &key);
        let value = Some(value);
        let mut ttl = freshness::written_ttl(policy.ttl, policy.jitter, policy.grace);
        if !tags.is_empty() {
            // A tag's mark is kept this long: the value must not outlive it.
            ttl = ttl.min(crate::marks::TAG_RETENTION);
        }
        let fresh = ttl.saturating_sub(policy.grace);
        // As of the newest generation this process knows, read again if a
        // mark was reported since: a mark made before this write does not
        // judge it (one this process has not heard of yet may: the value
        // is then read as older than it is). Within the write's deadline.
        let began = tokio::time::Instant::now();
        let timeout = self.shared.policy.backend_timeout;
        let backend = &*self.shared.calls.backend;
        // Under way from here: a caller that drops the write while the
        // generation is read cannot tell it from one dropped mid-command,
        // so it is replayed as such a write is.
        let writing = Writing::start(&self.shared, &key, &keys);
        let as_of = self.shared.marks.for_write(backend, began, timeout).await;
        let encoded = self.shared.encode(
            &key,
            keys.value(),
            &policy,
            &value,
            Duration::ZERO,
            Some(fresh),
            (as_of, tags),
        );
        let bytes = match encoded {
            Ok(bytes) => bytes,
            Err(e) => {
                writing.not_sent();
                return Err(e);
            }
        };
        let set = || backend.set(&keys, &bytes, ttl);
        let set = self
            .shared
            .calls
            .call_with(&keys, began, timeout, "set", set)
            .await
            .map_err(Error::Backend);
        match set {
            Ok(()) => writing.landed(&value, ttl),
            Err(e) => {
                writing.failed(&e);
                return Err(e);
            }
        }
        Ok(())
    }

    pub(super) fn prepare<Q: Display + ?Sized>(
        &self,
        key: &Q,
        options: &CallOptions,
    ) -> Result<(String, Policy), Error> {
        let key = self.validated(key)?;
        let policy = self.policy_of(options)?.into_owned();
        Ok((key, policy))
    }

    /// The policy of a call with `options`: the cache's own, not copied,
    /// if the call sets none.
    pub(super) fn policy_of(&self, options: &CallOptions) -> Result<PolicyRef<'_>, Error> {
        if *options == NO_OPTIONS {
            return Ok(PolicyRef::Cache(&self.shared.policy));
        }
        let policy = self
            .shared
            .policy
            .with(options)
            .map_err(crate::error::InputError::from)?;
        Ok(PolicyRef::Call(Box::new(policy)))
    }

    pub(super) fn validated<Q: Display + ?Sized>(&self, key: &Q) -> Result<String, Error> {
        let key = key::display(key)?;
        key::validate_key(&key, self.shared.policy.max_key_bytes)?;
        Ok(key)
    }

    pub(super) fn keys<Q: Display + ?Sized>(&self, key: &Q) -> Result<FillKeys, Error> {
        Ok(FillKeys::new(&self.shared.namespace, &self.validated(key)?))
    }

    pub(super) async fn call<T>(
        &self,
        keys: &FillKeys,
        op: &'static str,
        fut: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, Error> {
        self.shared
            .calls
            .call(keys, self.shared.policy.backend_timeout, op, fut)
            .await
            .map_err(Error::Backend)
    }
}

/// Records how a call ended in its span.
pub(super) fn ended<T>(
    span: &tracing::Span,
    result: &Result<T, Error>,
    outcome: impl Fn(&T) -> &'static str,
) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(value) => span.record("outcome", outcome(value)),
        Err(e) => span
            .record("outcome", "error")
            .record("error", tracing::field::display(e))
            // `tracing-opentelemetry` sets the span's status from it.
            .record("otel.status_code", "ERROR"),
    };
}
