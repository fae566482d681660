//! The backend as a cache sees it: every value it reads judged by the
//! namespace's marks first. A value a mark invalidated reads as absent, one
//! a mark expired as stale; so the protocol above (hits, leases, waits,
//! batches) goes on as for any miss or stale value, and a lease is never
//! refused because the server, which knows nothing of marks, still finds
//! the value fresh: such an acquire is asked again with the value counted
//! as not fresh.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{
    Acquired, Backend, BackendError, ChangeListener, FillKeys, FillSubscription, LeaseRequest,
    LeaseToken, Mark, MarkKind, Stored, Watch,
};

use super::{Beside, Marks, Verdict};

/// A backend whose reads are judged by `marks`.
pub(crate) struct Judged {
    pub(crate) inner: Arc<dyn Backend>,
    pub(crate) marks: Arc<Marks>,
}

impl std::fmt::Debug for Judged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

/// What an acquire answered once the marks judged what it found: the
/// answer to hand on, or `None` if a value the server found fresh is not
/// (the acquire must be asked again, the value counted as not fresh).
fn judged_acquire(acquired: Acquired, verdict: Verdict) -> Option<Acquired> {
    let judge = |stale: Option<Stored>| stale.and_then(|s| Marks::apply(s, verdict));
    Some(match acquired {
        Acquired::Fresh(stored) if verdict == Verdict::Valid => Acquired::Fresh(stored),
        Acquired::Fresh(_) => return None,
        Acquired::Won { stale } => Acquired::Won {
            stale: judge(stale),
        },
        Acquired::Held {
            stale,
            lease_ttl,
            holder,
        } => Acquired::Held {
            stale: judge(stale),
            lease_ttl,
            holder,
        },
    })
}

/// A backend that answers a value fresh when asked for it not to be: its
/// contract broken, said rather than acted on.
fn fresh_again() -> BackendError {
    BackendError::new(
        crate::error::BackendErrorKind::Protocol,
        "acquire: a value was answered fresh with a refresh window of forever",
    )
}

fn found(acquired: &Acquired) -> Option<&Stored> {
    match acquired {
        Acquired::Fresh(s) => Some(s),
        Acquired::Won { stale } | Acquired::Held { stale, .. } => stale.as_ref(),
    }
}

impl Judged {
    /// `stored` as the marks judge it.
    pub(crate) async fn judge_one(
        marks: &Marks,
        backend: &dyn Backend,
        stored: Option<Stored>,
        beside: &Beside,
    ) -> Result<Option<Stored>, BackendError> {
        let Some(stored) = stored else {
            return Ok(None);
        };
        let verdict = marks.judge(backend, &[Some(&stored)], beside).await?;
        Ok(Marks::apply(stored, verdict[0]))
    }

    /// The marks' verdict on what an acquire found.
    async fn judge_won(
        &self,
        acquired: &Acquired,
        beside: &Beside,
    ) -> Result<Verdict, BackendError> {
        Ok(self
            .marks
            .judge(&*self.inner, &[found(acquired)], beside)
            .await?[0])
    }

    /// An acquire's answer judged; a value found fresh that the marks say
    /// is not makes `again` ask once more, with the value counted as not
    /// fresh. A lease won is preceded by a current generation for the load.
    async fn judge_acquire<F>(
        &self,
        (keys, token): (&FillKeys, &LeaseToken),
        acquired: Acquired,
        beside: &Beside,
        again: impl FnOnce() -> F,
    ) -> Result<Acquired, BackendError>
    where
        F: std::future::Future<Output = Result<Acquired, BackendError>>,
    {
        let verdict = self.judge_won(&acquired, beside).await?;
        let acquired = match judged_acquire(acquired, verdict) {
            Some(acquired) => acquired,
            None => {
                let acquired = again().await?;
                let verdict = self.judge_won(&acquired, beside).await?;
                // Asked with the value not fresh, the answer is not `Fresh`
                // unless the value was replaced meanwhile by a valid one.
                judged_acquire(acquired, verdict).ok_or_else(fresh_again)?
            }
        };
        if matches!(acquired, Acquired::Won { .. }) {
            if let Some(refused) = self.marks.refused() {
                let _ = self.inner.release(keys, token, None).await;
                return Err(refused);
            }
            self.marks.before_load(&*self.inner, beside).await;
        }
        Ok(acquired)
    }
}

#[async_trait]
impl Backend for Judged {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        let marks = self.marks.namespace_beside(&self.inner);
        let (stored, beside) = futures_util::future::join(self.inner.get(keys), marks).await;
        Judged::judge_one(&self.marks, &*self.inner, stored?, &beside).await
    }

    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let marks = self.marks.namespace_beside(&self.inner);
        let acquire = self.inner.acquire(keys, token, lease_ttl, refresh_window);
        let (acquired, beside) = futures_util::future::join(acquire, marks).await;
        let acquired = acquired?;
        self.judge_acquire((keys, token), acquired, &beside, || {
            self.inner.acquire(keys, token, lease_ttl, Duration::MAX)
        })
        .await
    }

    async fn get_many(&self, keys: &[FillKeys]) -> Vec<Result<Option<Stored>, BackendError>> {
        let marks = self.marks.namespace_beside(&self.inner);
        let (read, beside) = futures_util::future::join(self.inner.get_many(keys), marks).await;
        let stored: Vec<Option<&Stored>> = read
            .iter()
            .map(|r| r.as_ref().ok().and_then(Option::as_ref))
            .collect();
        let verdicts = self.marks.judge(&*self.inner, &stored, &beside).await;
        read.into_iter()
            .enumerate()
            .map(|(at, r)| {
                let stored = r?;
                match &verdicts {
                    Ok(v) => Ok(stored.and_then(|s| Marks::apply(s, v[at]))),
                    Err(e) if stored.is_some() => Err(e.clone()),
                    Err(_) => Ok(None),
                }
            })
            .collect()
    }

    async fn acquire_many(
        &self,
        requests: &[LeaseRequest],
        lease_ttl: Duration,
    ) -> Vec<Result<Acquired, BackendError>> {
        let marks = self.marks.namespace_beside(&self.inner);
        let acquire = self.inner.acquire_many(requests, lease_ttl);
        let (answers, beside) = futures_util::future::join(acquire, marks).await;
        let stored: Vec<Option<&Stored>> = answers
            .iter()
            .map(|a| a.as_ref().ok().and_then(found))
            .collect();
        let verdicts = match self.marks.judge(&*self.inner, &stored, &beside).await {
            Ok(v) => v,
            Err(e) => {
                return answers
                    .into_iter()
                    .map(|a| match a {
                        Ok(a) if found(&a).is_some() => Err(e.clone()),
                        other => other,
                    })
                    .collect();
            }
        };
        let mut judged: Vec<Result<Option<Acquired>, BackendError>> = answers
            .into_iter()
            .zip(&verdicts)
            .map(|(a, v)| a.map(|a| judged_acquire(a, *v)))
            .collect();
        // Found fresh by the server, not by the marks: asked again together.
        let again: Vec<usize> = (0..judged.len())
            .filter(|at| matches!(judged[*at], Ok(None)))
            .collect();
        if !again.is_empty() {
            let requests: Vec<LeaseRequest> = again
                .iter()
                .map(|at| {
                    let r = &requests[*at];
                    LeaseRequest::new(r.keys.clone(), r.token.clone(), Duration::MAX)
                })
                .collect();
            let answers = self.inner.acquire_many(&requests, lease_ttl).await;
            let stored: Vec<Option<&Stored>> = answers
                .iter()
                .map(|a| a.as_ref().ok().and_then(found))
                .collect();
            let verdicts = self.marks.judge(&*self.inner, &stored, &beside).await;
            for (i, (at, answer)) in again.into_iter().zip(answers).enumerate() {
                judged[at] = match (answer, &verdicts) {
                    (Err(e), _) => Err(e),
                    (Ok(a), Ok(v)) => judged_acquire(a, v[i]).map(Some).ok_or_else(fresh_again),
                    (Ok(_), Err(e)) => Err(e.clone()),
                };
            }
        }
        let won = judged
            .iter()
            .any(|a| matches!(a, Ok(Some(Acquired::Won { .. }))));
        if won {
            if let Some(refused) = self.marks.refused() {
                // Not loaded under a generation nobody could read: each
                // lease won is released and its caller gets the refusal.
                for (a, request) in judged.iter_mut().zip(requests) {
                    if matches!(a, Ok(Some(Acquired::Won { .. }))) {
                        let _ = self
                            .inner
                            .release(&request.keys, &request.token, None)
                            .await;
                        *a = Err(refused.clone());
                    }
                }
            } else {
                self.marks.before_load(&*self.inner, &beside).await;
            }
        }
        judged
            .into_iter()
            .map(|a| a.and_then(|a| a.ok_or_else(fresh_again)))
            .collect()
    }

    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.inner.fill(keys, token, bytes, ttl).await
    }

    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        self.inner.release(keys, token, entry).await
    }

    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.inner.extend(keys, token, lease_ttl).await
    }

    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        self.inner.set(keys, bytes, ttl).await
    }

    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        self.inner.invalidate(keys).await
    }
    async fn invalidate_older_than(
        &self,
        keys: &FillKeys,
        age: Duration,
    ) -> Result<bool, BackendError> {
        self.inner.invalidate_older_than(keys, age).await
    }
    async fn expire(&self, keys: &FillKeys) -> Result<(), BackendError> {
        self.inner.expire(keys).await
    }

    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        self.inner.subscribe(keys).await
    }

    fn new_token(&self, keys: &FillKeys) -> LeaseToken {
        self.inner.new_token(keys)
    }

    async fn watch_holder(
        &self,
        keys: &FillKeys,
        holder: &LeaseToken,
    ) -> Result<Watch, BackendError> {
        self.inner.watch_holder(keys, holder).await
    }

    async fn take_over(
        &self,
        keys: &FillKeys,
        gone: &LeaseToken,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let marks = self.marks.namespace_beside(&self.inner);
        let take_over = self
            .inner
            .take_over(keys, gone, token, lease_ttl, refresh_window);
        let (acquired, beside) = futures_util::future::join(take_over, marks).await;
        let acquired = acquired?;
        self.judge_acquire((keys, token), acquired, &beside, || {
            self.inner
                .take_over(keys, gone, token, lease_ttl, Duration::MAX)
        })
        .await
    }

    fn shard(&self, keys: &FillKeys) -> u64 {
        self.inner.shard(keys)
    }

    fn shard_serves_keys(&self, shard: u64) -> bool {
        self.inner.shard_serves_keys(shard)
    }

    fn track_changes(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: Weak<dyn ChangeListener>,
    ) -> Result<(), BackendError> {
        self.inner.track_changes(prefix, confirm_every, listener)
    }

    fn in_process(&self) -> bool {
        self.inner.in_process()
    }

    fn default_l1(&self) -> bool {
        self.inner.default_l1()
    }

    async fn mark(
        &self,
        gen_key: &str,
        mark_key: &str,
        kind: MarkKind,
        retention: Option<Duration>,
    ) -> Result<u64, BackendError> {
        self.inner.mark(gen_key, mark_key, kind, retention).await
    }

    async fn read_marks(
        &self,
        gen_key: &str,
        mark_keys: &[&str],
    ) -> Result<(u64, Vec<Mark>), BackendError> {
        self.inner.read_marks(gen_key, mark_keys).await
    }
}
