//! A call for one key: the L1 if it can answer, else the key's flight in
//! this process, joined or led (the leader's first read in the caller's
//! task, see `hit.rs`), in the call's span.

use std::borrow::Borrow;
use std::fmt::Display;

use tokio::time::Instant;
use tracing::Instrument;

use crate::answer::{Fetched, Outcome};
use crate::coalesce::Joined;
use crate::error::{Error, IntoLoaderError};
use crate::flight::Flight;
use crate::hit::Leader;
use crate::key::{self, FillKeys, KeyBuf};
use crate::l1::{Local, Lookup};
use crate::loader::{Load, Loaded, Loader};
use crate::options::CallOptions;

use super::{ended, Cache, NO_OPTIONS};

impl<K, V> Cache<K, V>
where
    K: Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The primitive of every single-key loading call: the L1 if it can
    /// answer, else the key's flight (joined, or led from this task).
    pub(super) async fn load_one<Q, F, T>(
        &self,
        key: &Q,
        options: &CallOptions,
        loader: F,
    ) -> Result<Fetched<Option<V>>, Error>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<Option<V>>>,
    {
        let loader = match &self.shared.l1 {
            Some(l1) => match self.answer_from_l1(l1, key, options, loader) {
                Ok(fetched) => return Ok(fetched),
                Err(loader) => loader,
            },
            None => loader,
        };
        // Erased (the key copied, the loader boxed) only if a flight needs
        // it: a hit and a coalesced call never do (two allocations fewer
        // per hit).
        self.fetch_erased(key, options, move || erase(key, loader))
            .await
    }

    /// The L1 hit path: a lookup and a clone, no task, no channel, no
    /// allocation (for keys up to 128 bytes). `Err(loader)`: not in the L1
    /// (or not servable from it); the flight answers.
    fn answer_from_l1<Q, F, T>(
        &self,
        l1: &Local<V>,
        key: &Q,
        options: &CallOptions,
        loader: F,
    ) -> Result<Fetched<Option<V>>, F>
    where
        K: Borrow<Q>,
        Q: Display + ToOwned<Owned = K> + ?Sized,
        F: Loader<K, T>,
        T: Into<Loaded<Option<V>>>,
    {
        // Call options are checked (and bad ones refused) by the flight.
        if *options != NO_OPTIONS {
            return Err(loader);
        }
        let buf = KeyBuf::new(key);
        let Ok(user_key) = buf.checked() else {
            return Err(loader);
        };
        if user_key.is_empty() || user_key.len() > self.shared.policy.max_key_bytes {
            return Err(loader);
        }
        let (value, outcome) = match self.l1_answer(l1, user_key, Instant::now()) {
            Some(FromL1::Fresh(value)) => (value, Outcome::Hit),
            Some(FromL1::Stale(value, refresh)) => {
                if let Some(keys) = refresh {
                    let load = erase(key, loader);
                    let policy = self.shared.policy.clone();
                    let flight =
                        Flight::new(self.shared.clone(), user_key.to_owned(), keys, policy, load);
                    tokio::spawn(Box::pin(flight.refresh_stale()));
                }
                (value, Outcome::Stale)
            }
            None => return Err(loader),
        };
        Ok(Fetched {
            value,
            outcome,
            coalesced: false,
        })
    }

    /// What the L1 answers for `user_key` under the cache's own policy (a
    /// call with options skips the L1), counted: a fresh value, or a stale
    /// one to serve while the key is refreshed; `None`, and a flight
    /// answers. With a soft timeout a stale value waits for a load first,
    /// which is a flight's business. The one L1 lookup of the loading
    /// calls, one key or many.
    pub(super) fn l1_answer(
        &self,
        l1: &Local<V>,
        user_key: &str,
        now: Instant,
    ) -> Option<FromL1<V>> {
        match l1.get(user_key, now) {
            Lookup::Fresh(value) => {
                self.shared.recorder.l1_hit();
                Some(FromL1::Fresh(value))
            }
            Lookup::Stale(_) if self.shared.policy.soft_timeout.is_some() => None,
            Lookup::Stale(value) => {
                self.shared.recorder.stale_served();
                let keys = FillKeys::new(&self.shared.namespace, user_key);
                let running = self.shared.refreshing.contains(keys.value());
                Some(FromL1::Stale(value, (!running).then_some(keys)))
            }
            Lookup::Miss => None,
        }
    }

    /// A call past the L1, in its span (`onefill.get_or_load`, see the
    /// crate docs' "Observability"): the flight's work, in this task or its
    /// own, is the span's children.
    async fn fetch_erased<Q: Display + ?Sized>(
        &self,
        key: &Q,
        options: &CallOptions,
        load: impl FnOnce() -> Load<V>,
    ) -> Result<Fetched<Option<V>>, Error> {
        let span = tracing::info_span!(
            "onefill.get_or_load",
            namespace = self.shared.namespace.as_str(),
            outcome = tracing::field::Empty,
            coalesced = tracing::field::Empty,
            error = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
        );
        // Without a subscriber for the span, the flight is not wrapped at
        // all: wrapping moved its (large) future once more, +8% of the
        // instructions of an embedded hit without an L1 (callgrind).
        let fetched = if span.is_disabled() {
            self.fetch_in_flight(key, options, load, &span).await
        } else {
            self.fetch_in_flight(key, options, load, &span)
                .instrument(span.clone())
                .await
        };
        ended(&span, &fetched, |f| f.outcome.as_str());
        fetched
    }

    async fn fetch_in_flight<Q: Display + ?Sized>(
        &self,
        key: &Q,
        options: &CallOptions,
        load: impl FnOnce() -> Load<V>,
        span: &tracing::Span,
    ) -> Result<Fetched<Option<V>>, Error> {
        // A flight under way may predate a mark nothing reported.
        let backend = self.shared.calls.backend.as_ref();
        if let Some(read) = self.shared.marks.before_join(backend) {
            self.shared.calls.unless_replaced(read).await;
        }
        let joined = {
            // Formatted on the stack: the coalescer's entry is the one copy
            // of the key a hit makes.
            let key = KeyBuf::new(key);
            let key = key.checked()?;
            key::validate_key(key, self.shared.policy.max_key_bytes)?;
            let policy = self.policy_of(options)?;
            match self.shared.flights.join_in_span(key, span.id()) {
                Joined::Leader(completion) => Err(Leader {
                    shared: &self.shared,
                    policy,
                    keys: FillKeys::new(&self.shared.namespace, key),
                    load,
                    completion,
                }),
                Joined::Follower(awaiter) => Ok(awaiter),
            }
        };
        span.record("coalesced", joined.is_ok());
        let ((value, outcome), coalesced) = match joined {
            Ok(awaiter) => {
                if let Some(leader) = awaiter.leader_span() {
                    // Its wait is the leader's flight: link the two.
                    span.follows_from(leader.clone());
                }
                self.shared.recorder.coalesced();
                (awaiter.outcome().await?, true)
            }
            Err(leader) => (leader.answer().await?, false),
        };
        Ok(Fetched {
            value,
            outcome,
            coalesced,
        })
    }
}

/// What the L1 answers for a key (see `Cache::l1_answer`).
pub(super) enum FromL1<V> {
    /// A fresh value.
    Fresh(Option<V>),
    /// A stale value; the key's backend keys if no refresh of it runs in
    /// this process yet, so the caller starts one.
    Stale(Option<V>, Option<FillKeys>),
}

/// The caller's loader, type-erased for the flight.
pub(super) fn erase<Q, K, V, F, T>(key: &Q, loader: F) -> Load<V>
where
    Q: ToOwned<Owned = K> + ?Sized,
    K: Send + 'static,
    F: Loader<K, T>,
    T: Into<Loaded<Option<V>>>,
{
    let owned = key.to_owned();
    Box::new(move || {
        Box::pin(async move {
            loader(owned)
                .await
                .map(Into::into)
                .map_err(IntoLoaderError::into_loader_error)
        })
    })
}
