//! The state one cache shares between its handles and its flights: its
//! way to the backend, its coalescers, L1 and outage fallback, and what
//! every flight does with stored bytes (turn envelopes into values and back
//! with the cache's codec).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::answer::Answer;
use crate::backend::{Backend, FillKeys, Stored};
use crate::calls::Calls;
use crate::circuit::Breakers;
use crate::coalesce::Coalescer;
use crate::codec::{Codec, Marker};
use crate::envelope::{self, Kind};
use crate::error::CodecError;
use crate::error::{Error, InputError};
use crate::fallback::Fallback;
use crate::l1::{Local, L1};
use crate::loader::Done;
use crate::loader::LoadTimes;
use crate::marks::{Judged, Marks, Trust, RECHECK};
use crate::options::Policy;
use crate::refreshing::Refreshing;
use crate::replay::{Host, Replays, Target, Write};
use crate::stats::Recorder;

/// Shared state of one cache: everything a flight needs.
pub(crate) struct Shared<V> {
    pub namespace: String,
    /// The way to the backend (with the same recorder as below).
    pub calls: Calls,
    pub codec: Arc<dyn Codec<V>>,
    /// The cache-wide defaults (a call's overrides make its own copy).
    pub policy: Policy,
    pub recorder: Recorder,
    pub load_times: LoadTimes,
    /// The flights under way in this process, one per key.
    pub flights: Coalescer<Answer<V>>,
    /// The loads under way in this process, one per key: a flight that
    /// needs a load while another flight's (a background refresh's) is
    /// still running shares it instead of running a second one.
    pub loads: Coalescer<Done<V>>,
    /// Bumped by every `set` and `invalidate` once its write is done; a
    /// flight notes it when it starts, so what it read or loaded can be
    /// told apart from what those writes put there (see `fallback.rs`).
    pub epoch: AtomicU64,
    /// Keys with a background refresh under way in this process.
    pub refreshing: Refreshing,
    pub fallback: Fallback<V>,
    /// The in-process L1, if configured.
    pub l1: Option<Arc<Local<V>>>,
    /// The namespace's marks (tags, `clear`) as this process knows them.
    pub marks: Arc<Marks>,
    /// Whether the backend ever confirmed it reports every change (see
    /// `coherence.rs`: until then, a reset splits no flight).
    pub ever_synced: std::sync::atomic::AtomicBool,
    /// Writes that failed for want of the backend, to replay once it
    /// answers (see `replay.rs`).
    pub replays: Replays,
}

/// What a stored value turned out to be, for this cache's codec.
pub(crate) enum Read<V> {
    /// A value (`None`: a cached absence) and how long it stays fresh.
    Value {
        value: Option<V>,
        fresh_for: Duration,
        /// How long the load that produced it took (for early refresh).
        delta: Duration,
        /// At most the fresh TTL it was written with, if recorded (for
        /// early refresh; see `envelope.rs`).
        written_ttl: Option<Duration>,
        /// The grace window it was written with (a loader may have chosen
        /// it): early refresh is for values without one.
        grace: Duration,
    },
    /// A cached loader failure (negative caching).
    Failure { message: String, fresh: bool },
    /// Not an envelope, or a payload this codec cannot decode.
    Unreadable,
}

impl<V: Clone + 'static> Shared<V> {
    pub(crate) fn new(
        namespace: String,
        backend: Arc<dyn Backend>,
        codec: Arc<dyn Codec<V>>,
        policy: Policy,
        l1: Option<&L1>,
    ) -> Self {
        let recorder = Recorder::new(&namespace);
        // With an L1, the marks are trusted as its values are (one
        // tracking connection reports both); without, for a while after
        // they were read.
        let trust = l1.map_or(Trust::Rechecked(RECHECK), |l1| {
            Trust::Reported(l1.sync_bound)
        });
        // Half the backend timeout: a read of the marks out of reach leaves
        // the call the time to judge by the last ones known.
        let marks = Arc::new(Marks::new(&namespace, trust, policy.backend_timeout / 2));
        Shared {
            l1: l1.map(|l1| Arc::new(Local::new(l1, &namespace, recorder.clone()))),
            calls: Calls {
                backend: Arc::new(Judged {
                    inner: backend,
                    marks: marks.clone(),
                }),
                #[cfg(feature = "redis")]
                marks: marks.clone(),
                #[cfg(feature = "redis")]
                redis: None,
                breakers: Breakers::new(policy.circuit_breaker),
                recorder: recorder.clone(),
                timeout: policy.backend_timeout,
            },
            fallback: Fallback::new(policy.outage_fallback_capacity),
            replays: Replays::new(
                policy.replay_queue_capacity,
                policy.backend_timeout,
                recorder.clone(),
            ),
            namespace,
            codec,
            policy,
            recorder,
            load_times: LoadTimes::default(),
            flights: Coalescer::default(),
            loads: Coalescer::default(),
            epoch: AtomicU64::new(0),
            refreshing: Refreshing::default(),
            marks,
            ever_synced: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// This process wrote `key` (`set` or `invalidate`, done or failed):
    /// detaches the key's flight and load, so a call that starts after the
    /// write never gets an answer from before it, and returns the new epoch.
    /// (Flights are keyed by the user's key, loads by the value key.)
    pub(crate) fn written(&self, key: &str, keys: &FillKeys) -> u64 {
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(l1) = &self.l1 {
            l1.forget(key);
        }
        self.flights.detach(key);
        self.loads.detach(keys.value());
        self.refreshing.written(keys.value());
        epoch
    }

    /// A write of `key` by this process, done or failed: what it
    /// remembers of the key goes ([`written`](Shared::written)), and the
    /// outage fallback keeps a tombstone that older flights cannot
    /// overwrite.
    fn forget_written(&self, key: &str, keys: &FillKeys) {
        let epoch = self.written(key, keys);
        let until = Instant::now() + self.policy.longest_flight();
        self.fallback.forget(keys.value(), until, epoch);
    }
}

impl<V: Clone + Send + Sync + 'static> Host for Shared<V> {
    fn calls(&self) -> &Calls {
        &self.calls
    }
    fn replays(&self) -> &Replays {
        &self.replays
    }
    fn replayed(&self, key: &str, keys: &FillKeys) {
        // As after a write, but the key's load stays attached: the failed
        // write detached every load from before it, so the ones under way
        // now started after it, and sharing them loses nothing.
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(l1) = &self.l1 {
            l1.forget(key);
        }
        self.flights.detach(key);
        self.refreshing.written(keys.value());
        let until = Instant::now() + self.policy.longest_flight();
        self.fallback.forget(keys.value(), until, epoch);
    }
    fn marked(&self, mark_key: &str, generation: u64) {
        self.marks.marked(mark_key, generation);
        if generation == 0 {
            // Not known: read again before a value is written or loaded.
            let gen_key = self.marks.keys().generation();
            self.marks.changed(gen_key.as_bytes());
        }
        self.forget_every_copy();
        self.flights.detach_all();
        self.loads.detach_all();
    }
}

impl<V: Clone + 'static> Shared<V> {
    /// Decodes the bytes stored under `value_key`; `count` says whether an
    /// unreadable value is counted (once per flight, not at every re-read).
    pub(crate) fn read(&self, stored: &Stored, value_key: &str, count: bool) -> Read<V> {
        let env = match envelope::decode(&stored.bytes) {
            Ok(env) => env,
            Err(why) => {
                if count {
                    self.recorder.decode_error(value_key, &format!("{why:?}"));
                }
                return Read::Unreadable;
            }
        };
        // With no grace window, a value still stored is fresh: Redis rounds
        // its last millisecond down to a `PTTL` of 0, which must not make it
        // "stale" (served as such, and refreshed in the background).
        let fresh_for = if env.grace.is_zero() {
            stored.ttl.max(Duration::from_millis(1))
        } else {
            stored.ttl.saturating_sub(env.grace)
        };
        match env.kind {
            Kind::Value => match self.codec.decode(value_key, env.payload) {
                Ok(value) => Read::Value {
                    value: Some(value),
                    fresh_for,
                    delta: env.delta,
                    written_ttl: env.written_ttl,
                    grace: env.grace,
                },
                Err(why) => self.unreadable(value_key, count, &why),
            },
            Kind::Absent => match self.codec.open(value_key, Marker::Absent, env.payload) {
                Ok(_) => Read::Value {
                    value: None,
                    fresh_for,
                    delta: env.delta,
                    written_ttl: env.written_ttl,
                    grace: env.grace,
                },
                Err(why) => self.unreadable(value_key, count, &why),
            },
            Kind::Failure => match self.codec.open(value_key, Marker::Failure, env.payload) {
                Ok(message) => Read::Failure {
                    message: String::from_utf8_lossy(&message).into_owned(),
                    fresh: !fresh_for.is_zero(),
                },
                Err(why) => self.unreadable(value_key, count, &why),
            },
        }
    }

    /// A stored entry the codec could not read, counted if `count`.
    fn unreadable(&self, value_key: &str, count: bool, why: &CodecError) -> Read<V> {
        if count {
            self.recorder.decode_error(value_key, &why.to_string());
        }
        Read::Unreadable
    }

    /// The stored bytes of a cached failure of the value under
    /// `value_key`, its message sealed by the codec; `None` if the codec
    /// cannot seal it (the failure is then not cached).
    pub(crate) fn encode_failure(
        &self,
        value_key: &str,
        message: &str,
        as_of: u64,
    ) -> Option<Vec<u8>> {
        let seal = || {
            self.codec
                .seal(value_key, Marker::Failure, message.as_bytes())
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(seal)) {
            Ok(Ok(payload)) => Some(envelope::encode(
                Kind::Failure,
                Duration::ZERO,
                Duration::ZERO,
                None,
                as_of,
                &[],
                &payload,
            )),
            Ok(Err(why)) => {
                tracing::warn!(key = value_key, %why, "the failure is not cached: the codec cannot seal it");
                None
            }
            Err(_) => {
                tracing::warn!(
                    key = value_key,
                    "the failure is not cached: the codec's seal panicked"
                );
                None
            }
        }
    }

    /// The value of stored bytes, fresh or stale (`None`: not a value).
    pub(crate) fn value_of(
        &self,
        stored: &Stored,
        value_key: &str,
        count: bool,
    ) -> Option<Option<V>> {
        match self.read(stored, value_key, count) {
            Read::Value { value, .. } => Some(value),
            _ => None,
        }
    }

    /// The envelope for `key`'s `value` (`None`: a cached absence), to be
    /// stored under `value_key`, under
    /// `policy`, written with the fresh TTL `written_ttl` (recorded if
    /// known), with its `marks` (the generation its load began at, its
    /// tags). The encoding is decoded once before anything is stored: a
    /// value that does not read back would be a miss, and a reload, at every
    /// read.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] if the codec fails or its encoding does not decode
    /// back, [`InputError::ValueTooLarge`] over the size limit,
    /// [`InputError::Tag`] for a tag out of bounds.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode(
        &self,
        key: &str,
        value_key: &str,
        policy: &Policy,
        value: &Option<V>,
        took: Duration,
        written_ttl: Option<Duration>,
        (as_of, tags): (u64, &[String]),
    ) -> Result<Vec<u8>, Error> {
        crate::marks::check_tags(tags).map_err(Error::InvalidInput)?;
        let encode_error = |source| Error::Encode {
            key: key.to_owned(),
            source,
        };
        let too_large = |len: usize| {
            Error::InvalidInput(InputError::ValueTooLarge {
                len,
                max: policy.max_value_bytes,
            })
        };
        let (kind, payload) = match value {
            Some(v) => {
                // An encode that panics (a `Serialize` impl's or a codec's
                // bug) fails the write as one that errs, as a decode that
                // panics does below, rather than abandoning the flight.
                let encode = || self.codec.encode(value_key, v);
                let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(encode))
                    .unwrap_or_else(|_| Err(CodecError::msg("the codec's encode panicked")))
                    .map_err(encode_error)?;
                // Refused by size before the round trip: decoding a value
                // that cannot be stored anyway would only cost its decode.
                let len = envelope::encoded_len(payload.len(), tags);
                if len > policy.max_value_bytes {
                    return Err(too_large(len));
                }
                // A decode that panics (a bug in user code) fails the write
                // as one that errs, rather than the whole flight.
                let check = || self.codec.check_round_trip(value_key, &payload);
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(check))
                    .unwrap_or_else(|_| Err(CodecError::msg("the codec's decode panicked")))
                    .map_err(|e| encode_error(CodecError::round_trip(e)))?;
                (Kind::Value, payload)
            }
            None => {
                let seal = || self.codec.seal(value_key, Marker::Absent, &[]);
                let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(seal))
                    .unwrap_or_else(|_| Err(CodecError::msg("the codec's seal panicked")))
                    .map_err(encode_error)?;
                (Kind::Absent, payload)
            }
        };
        let bytes = envelope::encode(kind, policy.grace, took, written_ttl, as_of, tags, &payload);
        if bytes.len() > policy.max_value_bytes {
            return Err(too_large(bytes.len()));
        }
        Ok(bytes)
    }
}

/// A write of one key by this process (`set` or `invalidate`) under way.
///
/// However it ends (done, failed, or its caller's future dropped while the
/// command may still land), the key's flight and load are detached and the
/// outage fallback forgets the key (a tombstone that older flights cannot
/// overwrite), so nothing from before the write answers after it. Only a
/// `set` known to have landed, in a cache without an L1, records its own
/// value instead.
///
/// A write that did not land for want of the backend (an error other than
/// a refusal, or its future dropped mid-way: its outcome unknown) is queued
/// to be replayed as an invalidation of the key (`replay.rs`); one that
/// landed retires the key's writes queued before it started.
pub(crate) struct Writing<'a, V: Clone + Send + Sync + 'static> {
    shared: &'a Arc<Shared<V>>,
    key: &'a str,
    keys: &'a FillKeys,
    /// `false` once [`Writing::landed`] did the bookkeeping.
    armed: bool,
    /// Queue a replay when dropped: unset by an answer that says whether
    /// the write ran.
    replay: bool,
    /// Its place among the writes to replay (see [`Replays::landed`]).
    ticket: u64,
    /// The marks' changes when the write began.
    marks: u64,
    /// When the write began (before it was sent): its replay keeps a
    /// value written since.
    began: tokio::time::Instant,
}

impl<'a, V: Clone + Send + Sync + 'static> Writing<'a, V> {
    pub(crate) fn start(shared: &'a Arc<Shared<V>>, key: &'a str, keys: &'a FillKeys) -> Self {
        Writing {
            shared,
            key,
            keys,
            armed: true,
            replay: true,
            ticket: shared.replays.ticket(),
            marks: shared.marks.changes(),
            began: tokio::time::Instant::now(),
        }
    }

    /// The write of `value`, stored for `ttl` (grace included), is known to
    /// have landed: it is what the outage fallback remembers of the key now
    /// (without an L1). With an L1 the key is forgotten as after a failed
    /// write, and the next read keeps what the server holds: another
    /// writer's change that lands between this write and its reply is
    /// reported before the reply is seen, and recording this value after
    /// it would put back what the change replaced (the L1 keeps nothing of
    /// its own writes either).
    ///
    /// A mark made while the write was under way may judge the value
    /// (the write may have landed before it): nothing is kept then either.
    pub(crate) fn landed(mut self, value: &Option<V>, ttl: Duration) {
        self.ran();
        if self.shared.l1.is_some() || self.shared.marks.changes() != self.marks {
            return;
        }
        self.armed = false;
        let epoch = self.shared.written(self.key, self.keys);
        let usable_until = Instant::now() + ttl;
        self.shared
            .fallback
            .record(self.keys.value(), value, usable_until, epoch);
    }

    /// The write (a delete) is known to have run.
    pub(crate) fn deleted(mut self) {
        self.ran();
    }

    /// The write (an `expire`) is known to have run: no replay. Unlike a
    /// `set` or an `invalidate`, it leaves the key's writes queued before
    /// it queued: their replays (invalidations) remove the value it left
    /// readable, stale.
    pub(crate) fn expired(mut self) {
        self.replay = false;
    }

    /// The write was refused before anything was sent (its value could
    /// not be encoded): nothing to replay.
    pub(crate) fn not_sent(mut self) {
        self.replay = false;
    }

    /// The write failed with `error`: replayed later unless the backend
    /// refused it (an answer, not an outage: a replay would meet the same
    /// refusal) or it ran without enough replicas confirming it.
    pub(crate) fn failed(mut self, error: &Error) {
        if let Error::Backend(e) = error {
            if e.is_not_replicated() {
                // It ran (too few replicas confirmed it): a replay of an
                // older write queued before it would undo it. What this
                // process held of the key still goes.
                self.ran();
            } else if !e.is_transient() {
                self.replay = false;
            }
        }
    }

    /// The write ran: no replay, and the key's writes queued before this
    /// one started are done with.
    fn ran(&mut self) {
        self.replay = false;
        let target = Target::Key(self.key.to_owned());
        self.shared.replays.landed(&target, self.ticket);
    }
}

impl<V: Clone + Send + Sync + 'static> Drop for Writing<'_, V> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.forget_written(self.key, self.keys);
        }
        if self.replay {
            let write = Write::Invalidate {
                key: self.key.to_owned(),
                keys: self.keys.clone(),
                began: self.began,
            };
            let host = || -> Weak<dyn Host> {
                let weak: Weak<Shared<V>> = Arc::downgrade(self.shared);
                weak
            };
            self.shared.replays.push(write, host);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryBackend;
    use crate::codec::JsonCodec;

    fn shared() -> Shared<String> {
        Shared::new(
            "t".to_owned(),
            Arc::new(MemoryBackend::new()),
            Arc::new(JsonCodec),
            Policy::default(),
            None,
        )
    }

    fn stored(grace: Duration, ttl: Duration) -> Stored {
        let payload = serde_json::to_vec("v").unwrap();
        Stored {
            bytes: envelope::encode(Kind::Value, grace, Duration::ZERO, None, 0, &[], &payload),
            ttl,
        }
    }

    /// Regression (seen in fleet runs): with grace 0, a value whose
    /// `PTTL` had rounded down to 0 ms was read as stale: served as
    /// `Stale` and refreshed in the background, 5 times in 10 s of a steady
    /// run on healthy keys.
    #[test]
    fn without_grace_a_stored_value_is_fresh_to_its_last_millisecond() {
        let shared = shared();
        let Read::Value { fresh_for, .. } =
            shared.read(&stored(Duration::ZERO, Duration::ZERO), "t:k", false)
        else {
            panic!("a value");
        };
        assert!(!fresh_for.is_zero());
        // With a grace window, the same remaining TTL is stale.
        let Read::Value { fresh_for, .. } = shared.read(
            &stored(Duration::from_secs(1), Duration::from_millis(500)),
            "t:k",
            false,
        ) else {
            panic!("a value");
        };
        assert!(fresh_for.is_zero());
    }
}
