//! The verbs that judge many values at once without touching them:
//! [`Cache::invalidate_tag`], [`Cache::expire_tag`] and [`Cache::clear`]
//! (decision 0018). Each is one backend call that records a mark; the
//! values stay where they are and are judged by it when read.

use std::fmt::Display;
use std::sync::{Arc, Weak};

use tracing::Instrument;

use crate::backend::MarkKind;
use crate::error::Error;
use crate::key::MarkKeys;
use crate::marks::{self, Marks, Target};
use crate::replay::{Host, Write};
use crate::shared::Shared;

use super::primitives::ended;
use super::Cache;

/// A mark under way: however it ends (recorded, failed, or its caller's
/// future dropped while the command may still land), what this process
/// keeps of the namespace's values goes, and its view of the mark with it,
/// so no call that starts after it returns answers a value it may judge.
/// One that did not land for want of the backend (an error other than a
/// refusal, or dropped mid-way) is queued to be replayed (`replay.rs`); one
/// that landed retires the same mark queued before it started.
struct Marking<'a, V: Clone + Send + Sync + 'static> {
    shared: &'a Arc<Shared<V>>,
    write: Option<Write>,
    ticket: u64,
}

impl<V: Clone + Send + Sync + 'static> Marking<'_, V> {
    /// The mark ran, at `generation`.
    fn landed(mut self, generation: u64) {
        if let Some(write) = self.write.take() {
            self.shared.replays.landed(&write.target(), self.ticket);
            if let Write::Mark { mark_key, .. } = &write {
                self.shared.marks.marked(mark_key, generation);
            }
        }
    }

    /// The mark failed with `error`: replayed later unless the backend
    /// refused it (an answer: a replay would meet the same refusal, and
    /// `Unsupported` is one) or it ran without enough replicas confirming
    /// it.
    fn failed(&mut self, error: &Error) {
        if let Error::Backend(e) = error {
            if e.is_not_replicated() {
                self.ran_unconfirmed();
            } else if !e.is_transient() {
                self.write = None;
            }
        }
    }

    /// The mark ran, but too few replicas confirmed it (the generation it
    /// was given is not known here): not replayed (it would be made
    /// again), the same mark queued before it is done with, and this
    /// process reads the mark and the generation again before it judges
    /// or writes a value.
    fn ran_unconfirmed(&mut self) {
        if let Some(write) = self.write.take() {
            self.shared.replays.landed(&write.target(), self.ticket);
            if let Write::Mark {
                gen_key, mark_key, ..
            } = &write
            {
                self.shared.marks.changed(mark_key.as_bytes());
                self.shared.marks.changed(gen_key.as_bytes());
            }
        }
    }
}

impl<V: Clone + Send + Sync + 'static> Drop for Marking<'_, V> {
    fn drop(&mut self) {
        let shared = self.shared;
        if let Some(write) = self.write.take() {
            if let Write::Mark { mark_key, .. } = &write {
                shared.marks.changed(mark_key.as_bytes());
            }
            let host = || -> Weak<dyn Host> {
                let weak: Weak<Shared<V>> = Arc::downgrade(shared);
                weak
            };
            shared.replays.push(write, host);
        }
        shared.forget_every_copy();
        shared.flights.detach_all();
        // And the loads under way: a call after the mark that may not wait
        // (a degraded load) must not share one that began before it.
        shared.loads.detach_all();
    }
}

impl<K, V> Cache<K, V>
where
    K: Display + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Makes every value tagged `tag` ([`Loaded::tags`](crate::Loaded::tags))
    /// and written before this call a miss, in every process of the fleet
    /// (their L1s included), in one backend command whatever the number of
    /// values. A load under way that began before it still answers its own
    /// callers, but what it stores is a miss too.
    ///
    /// After it returns, this cache answers no such value. Another cache
    /// with an [`L1`](crate::L1) stops within the time its backend takes to
    /// tell it (one round trip on Redis, whose tracking reports the mark),
    /// and at most [`L1::sync_bound`](crate::L1::sync_bound) (250 ms by
    /// default) if it cannot hear of it; one without an L1, within two
    /// seconds (it judges by the marks it read that long).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// use onefill::Loaded;
    ///
    /// let cache = onefill::Cache::<String, String>::builder().build().unwrap();
    /// let load = |id: String| async move {
    ///     Ok::<_, std::io::Error>(Loaded::new(format!("{id} by seller 7")).tags(["seller:7"]))
    /// };
    /// cache.get_or_load("product:1", load).await?;
    /// cache.invalidate_tag("seller:7").await?;
    /// assert_eq!(cache.get("product:1").await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an empty tag or one over
    /// [`MAX_TAG_BYTES`](crate::MAX_TAG_BYTES); [`Error::Backend`] if the
    /// backend fails, or is one that stores no marks
    /// ([`BackendErrorKind::Unsupported`](crate::BackendErrorKind::Unsupported)).
    pub async fn invalidate_tag(&self, tag: &str) -> Result<(), Error> {
        let span = call_span!("onefill.invalidate_tag", self);
        self.mark(Target::Tag(tag), MarkKind::Hard, span).await
    }

    /// Makes every value tagged `tag` and written before this call stale,
    /// in every process: a reader within the value's grace window gets it
    /// at once ([`Outcome::Stale`](crate::Outcome::Stale)) while one
    /// refresh runs fleet-wide; a value without a grace window is a miss,
    /// as after [`invalidate_tag`](Cache::invalidate_tag). The coherence
    /// bound is `invalidate_tag`'s.
    ///
    /// # Errors
    ///
    /// As [`invalidate_tag`](Cache::invalidate_tag).
    pub async fn expire_tag(&self, tag: &str) -> Result<(), Error> {
        let span = call_span!("onefill.expire_tag", self);
        self.mark(Target::Tag(tag), MarkKind::Soft, span).await
    }

    /// Makes every value of this cache's namespace written before this
    /// call a miss, in every process (their L1s included), in one backend
    /// command: nothing is scanned or deleted, the old values are left to
    /// expire by their TTL. A load under way that began before it still
    /// answers its own callers, but what it stores is a miss too. The
    /// coherence bound is [`invalidate_tag`](Cache::invalidate_tag)'s.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), onefill::Error> {
    /// let cache = onefill::Cache::<String, u32>::builder().build().unwrap();
    /// cache.set("a", 1).await?;
    /// cache.clear().await?;
    /// assert_eq!(cache.get("a").await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] as for [`invalidate_tag`](Cache::invalidate_tag).
    pub async fn clear(&self) -> Result<(), Error> {
        let span = call_span!("onefill.clear", self);
        self.mark(Target::Namespace, MarkKind::Hard, span).await
    }

    /// Records a mark of `kind` on `target`, in `span`.
    async fn mark(
        &self,
        target: Target<'_>,
        kind: MarkKind,
        span: tracing::Span,
    ) -> Result<(), Error> {
        let shared = &self.shared;
        let marked = async {
            if let Target::Tag(tag) = target {
                marks::check_tag(tag)?;
            }
            let mark_key = shared.marks.key_of(target);
            let generation_key = shared.marks.keys().generation();
            let slot = MarkKeys::slot(&shared.namespace);
            let retention = Marks::retention(target, kind);
            let mut marking = Marking {
                shared,
                ticket: shared.replays.ticket(),
                write: Some(Write::Mark {
                    gen_key: generation_key.clone(),
                    mark_key: mark_key.clone(),
                    kind,
                    retention,
                    slot: slot.clone(),
                }),
            };
            let backend = &shared.calls.backend;
            let marked = self
                .call(
                    &slot,
                    "mark",
                    backend.mark(&generation_key, &mark_key, kind, retention),
                )
                .await;
            match marked {
                Ok(generation) => {
                    marking.landed(generation);
                    Ok(())
                }
                Err(e) => {
                    marking.failed(&e);
                    Err(e)
                }
            }
        };
        let marked = marked.instrument(span.clone()).await;
        ended(&span, &marked, |_| "ok");
        marked
    }
}
