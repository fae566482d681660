//! A call for many keys: the L1 for the keys it can answer, then a batch
//! (see `batch.rs`) for the others, in the call's span.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::time::Instant;
use tracing::Instrument;

use crate::answer::{Fetched, Outcome};
use crate::batch::{Batch, KeyAnswer, ManyLoader};
use crate::error::{Error, IntoLoaderError};
use crate::key;
use crate::loader::{BatchLoader, Loaded};
use crate::options::CallOptions;

use super::one::FromL1;
use super::{ended, Cache, NO_OPTIONS};

impl<K, V> Cache<K, V>
where
    K: std::fmt::Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// The primitive of the batch calls: every distinct key's answer, in
    /// the order of `keys`, in the call's
    /// span (`onefill.get_or_load_many`: the namespace and the number of
    /// keys; the batch's task and the keys' flights are its children).
    pub(super) async fn load_many(
        &self,
        keys: &[K],
        options: &CallOptions,
        loader: ManyLoader<K, V>,
    ) -> Result<Vec<(K, KeyAnswer<V>)>, Error> {
        let span = tracing::info_span!(
            "onefill.get_or_load_many",
            namespace = self.shared.namespace.as_str(),
            keys = keys.len(),
            outcome = tracing::field::Empty,
            error = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
        );
        let answers = self
            .fetch_many_in_span(keys, options, loader)
            .instrument(span.clone())
            .await;
        ended(&span, &answers, |_| "ok");
        answers
    }

    async fn fetch_many_in_span(
        &self,
        keys: &[K],
        options: &CallOptions,
        loader: ManyLoader<K, V>,
    ) -> Result<Vec<(K, KeyAnswer<V>)>, Error> {
        let policy = self
            .shared
            .policy
            .with(options)
            .map_err(crate::error::InputError::from)?;
        let batch = Batch {
            shared: self.shared.clone(),
            policy,
            loader,
        };
        let l1 = self.shared.l1.as_ref().filter(|_| *options == NO_OPTIONS);
        let now = Instant::now();
        let mut seen = HashSet::with_capacity(keys.len());
        let mut answers: Vec<(K, Option<KeyAnswer<V>>)> = Vec::with_capacity(keys.len());
        let mut to_run: Vec<(K, String)> = Vec::new();
        let mut stale = Vec::new();
        for key in keys {
            let string = match key::display(key) {
                Ok(string) => string,
                Err(invalid) => {
                    answers.push((key.clone(), Some(Err(invalid.into()))));
                    continue;
                }
            };
            if seen.contains(&string) {
                continue;
            }
            seen.insert(string.clone());
            if let Err(invalid) = key::validate_key(&string, self.shared.policy.max_key_bytes) {
                answers.push((key.clone(), Some(Err(invalid.into()))));
                continue;
            }
            if let Some(l1) = l1 {
                let answered = match self.l1_answer(l1, &string, now) {
                    Some(FromL1::Fresh(value)) => Some((value, Outcome::Hit)),
                    Some(FromL1::Stale(value, refresh)) => {
                        if refresh.is_some() {
                            stale.push((key.clone(), string.clone()));
                        }
                        Some((value, Outcome::Stale))
                    }
                    None => None,
                };
                if let Some((value, outcome)) = answered {
                    let fetched = Fetched {
                        value,
                        outcome,
                        coalesced: false,
                    };
                    answers.push((key.clone(), Some(Ok(fetched))));
                    continue;
                }
            }
            answers.push((key.clone(), None));
            to_run.push((key.clone(), string));
        }
        // The keys past the L1 run their flights in the batch's task (a
        // dropped caller cancels nothing), which also refreshes the keys
        // the L1 served stale, together.
        if !to_run.is_empty() {
            // A flight under way may predate a mark nothing reported.
            let backend = self.shared.calls.backend.as_ref();
            if let Some(read) = self.shared.marks.before_join(backend) {
                self.shared.calls.unless_replaced(read).await;
            }
        }
        let mut running = batch.start(to_run, stale).into_iter();
        for (_, answer) in answers.iter_mut().filter(|(_, a)| a.is_none()) {
            *answer = Some(match running.next() {
                Some((awaiter, coalesced)) => {
                    awaiter.outcome().await.map(|(value, outcome)| Fetched {
                        value,
                        outcome,
                        coalesced,
                    })
                }
                None => Err(Error::FlightAbandoned),
            });
        }
        Ok(answers
            .into_iter()
            .map(|(k, a)| (k, a.unwrap_or(Err(Error::FlightAbandoned))))
            .collect())
    }
}

/// The caller's batch loader, type-erased for the batch: each value it
/// returns (plain or [`Loaded`]) as a `Loaded`.
pub(super) fn erase_many<K, V, T, F>(loader: F) -> ManyLoader<K, V>
where
    K: Send + 'static,
    V: Send + 'static,
    F: BatchLoader<K, T>,
    T: Into<Loaded<V>>,
{
    Arc::new(move |keys| {
        let loading = loader(keys);
        Box::pin(async move {
            match loading.await {
                Ok(found) => Ok(found.into_iter().map(|(k, v)| (k, v.into())).collect()),
                Err(error) => Err(error.into_loader_error()),
            }
        })
    })
}
