//! The shared store as one instance's commands reach it, past the fault
//! injector (`injector.rs`): each command runs and is logged with what it
//! did, the value key's state after every change is logged and reported
//! on the tracking connections (`tracking.rs`), reads report the TTL Redis
//! would, and the broken variants break the protocol here.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use onefill::backend::{
    Acquired, Backend, FillKeys, FillSubscription, Gone, Mark, MarkKind, Stored, Watch,
};
use onefill::{BackendError, LeaseToken, MemoryBackend};

use crate::events::{
    grace_of, marks_of_envelope, origin_of_envelope, Change, Ev, Exec, MarkOp, Reply, World,
};
use crate::injector::frozen_if_dead;
use crate::liveness::{self, holder_name, holder_of};
use crate::scenario::{NS, TAGS};
use crate::variants::Variant;

/// The shared store as one instance's commands reach it, past the faults:
/// each command runs (unless the instance died meanwhile, as during a
/// delay) and is logged with what it did.
#[derive(Clone)]
pub(crate) struct Store {
    pub(crate) inst: usize,
    pub(crate) inner: MemoryBackend,
    pub(crate) world: Arc<World>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.inst)
    }
}

impl Store {
    /// This instance's command changed the value key (see
    /// [`World::value_changed`]).
    fn value_changed(&self, keys: &FillKeys, change: Change) {
        let key = self.world.key_of(keys);
        self.world.value_changed(key, change, Some(self.inst));
    }

    /// Runs a step on the store and logs what it did, if it answered.
    async fn logged<T>(
        &self,
        key: usize,
        step: impl Future<Output = Result<T, BackendError>>,
        what: impl FnOnce(&T) -> Exec,
    ) -> Result<T, BackendError> {
        frozen_if_dead(&self.world, self.inst).await;
        let result = step.await;
        if let Ok(value) = &result {
            self.world.record(Ev::Exec {
                inst: self.inst,
                key,
                exec: what(value),
            });
        }
        result
    }

    /// A step fenced on the token (fill, release), logged. If `unfenced()`
    /// says so when it runs (a broken variant), the token is first made to
    /// hold the lease, whatever held it.
    async fn fenced(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        unfenced: impl Fn() -> bool,
        step: impl Future<Output = Result<bool, BackendError>>,
        what: impl FnOnce(bool) -> Exec,
    ) -> Result<bool, BackendError> {
        let key = self.world.key_of(keys);
        frozen_if_dead(&self.world, self.inst).await;
        if unfenced() {
            self.inner
                .put_raw(keys.lock(), token.as_bytes(), Duration::from_secs(60));
        }
        self.logged(key, step, |&ok| what(ok)).await
    }

    /// Logs a read of a version the fleet can read.
    fn read(&self, key: usize, bytes: &[u8], expires: Duration, reported: Duration) {
        if let Some(origin) = origin_of_envelope(bytes) {
            self.world.record(Ev::Read {
                inst: self.inst,
                key,
                origin,
                expires,
                reported,
            });
        }
    }

    /// Logs the stored value an `acquire` answered with (the script reads
    /// the server's TTL).
    fn acquire_read(&self, key: usize, acquired: &Acquired) {
        let stored = match acquired {
            Acquired::Fresh(stored) => Some(stored),
            Acquired::Held { stale, .. } | Acquired::Won { stale } => stale.as_ref(),
        };
        if let Some(stored) = stored {
            let expires = self.world.since_t0() + stored.ttl;
            self.read(key, &stored.bytes, expires, expires);
        }
    }

    /// Whether the stored value is fresh beyond `window` (the test of the
    /// backends' `acquire`).
    fn fresh_beyond(&self, keys: &FillKeys, window: Duration) -> bool {
        self.inner
            .get_raw(keys.value())
            .is_some_and(|(bytes, ttl)| {
                grace_of(&bytes).is_some_and(|grace| ttl > grace.saturating_add(window))
            })
    }

    /// Whether the stored value is fresh and one of the fleet's own (a
    /// value or failure with an origin, not another type's).
    fn fresh_and_readable(&self, keys: &FillKeys) -> bool {
        self.inner
            .get_raw(keys.value())
            .is_some_and(|(bytes, ttl)| {
                origin_of_envelope(&bytes).is_some()
                    && grace_of(&bytes).is_some_and(|grace| ttl > grace)
            })
    }

    /// `acquire` without the re-check (the `NoRecheck` variant): a fresh
    /// value does not stop `SET NX`.
    async fn acquire_without_recheck(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<Acquired, BackendError> {
        let stale = self.inner.get(keys).await?;
        Ok(match self.inner.get_raw(keys.lock()) {
            Some((token, ttl)) => Acquired::Held {
                stale,
                lease_ttl: ttl,
                holder: LeaseToken::from_stored(&token),
            },
            None => {
                self.inner.put_raw(keys.lock(), token.as_bytes(), lease_ttl);
                Acquired::Won { stale }
            }
        })
    }

    /// Whether the stored value of `keys` is older than a mark it is
    /// subject to, on the store now (hard or soft: either way the cache
    /// counts it as not fresh, and asks for the lease regardless). The
    /// marks a process holds are at most the store's, so a value the cache
    /// judges so is judged so here.
    fn judged_on_store(&self, keys: &FillKeys) -> bool {
        self.inner
            .get_raw(keys.value())
            .is_some_and(|(bytes, _)| self.judged_now(&bytes))
    }

    /// Whether the version in `bytes` is older than a mark it is subject
    /// to, on the store now.
    fn judged_now(&self, bytes: &[u8]) -> bool {
        let Some((as_of, tags)) = marks_of_envelope(bytes) else {
            return false;
        };
        let mark = |key: String| {
            self.inner
                .get_raw(&key)
                .map_or_else(Mark::default, |(bytes, _)| Mark::from_stored(&bytes))
        };
        let prefix = format!("{NS}:{{#}}:");
        let mut marks = vec![mark(format!("{prefix}clear"))];
        marks.extend(
            (0..TAGS)
                .filter(|t| tags & (1 << t) != 0)
                .map(|t| mark(format!("{prefix}tag:t{t}"))),
        );
        marks.iter().any(|m| m.soft > as_of)
    }

    /// Whether `keys`' lease holds `token` now.
    fn lease_holds(&self, keys: &FillKeys, token: &LeaseToken) -> bool {
        self.inner
            .get_raw(keys.lock())
            .is_some_and(|(held, _)| held == token.as_bytes())
    }

    /// An `acquire`, or with `gone` a `take_over` (a lease still holding
    /// `gone` counts as free), logged with whether the value was fresh
    /// before it and what it answered. The `NoRecheck` variant breaks the
    /// `acquire`, the `TakeOverAny` variant the `take_over` (any lease
    /// counts as free).
    async fn lease_step(
        &self,
        keys: &FillKeys,
        gone: Option<&LeaseToken>,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let key = self.world.key_of(keys);
        // An unbounded window asks for the lease regardless of an
        // unreadable value (another type or version), in a flight's first
        // `acquire` (its `get` found one; a fill may land in between) or
        // after an `acquire` that found one. A flight that asks so again
        // after losing the lease to a holder would win it from under that
        // holder's fresh fill: a duplicate of a fresh value.
        let task = tokio::task::try_id();
        // (Nor after a fresh value a mark judges by now: the cache judges an
        // answer when it comes, which a late reply makes later than the
        // command, and asks again at once if a mark made meanwhile judges it.)
        let again = task.is_some_and(|task| {
            let judged = self
                .world
                .fresh_answered
                .lock()
                .unwrap()
                .get(&task)
                .is_some_and(|bytes| self.judged_now(bytes));
            self.world.saw_unreadable.lock().unwrap().get(&task) == Some(&false) && !judged
        });
        // A value a mark judges is not fresh to the cache: it asks for the
        // lease with an unbounded window too (see `marks/judged.rs`).
        let fresh_before = if refresh_window == Duration::MAX {
            again && self.fresh_and_readable(keys)
        } else {
            self.fresh_beyond(keys, refresh_window)
        } && !self.judged_on_store(keys);
        let replaced = gone.is_some_and(|gone| self.lease_holds(keys, gone));
        let acquired = async {
            let acquired = match gone {
                None if self.world.variant == Variant::NoRecheck && fresh_before => {
                    self.acquire_without_recheck(keys, token, lease_ttl).await
                }
                None => {
                    self.inner
                        .acquire(keys, token, lease_ttl, refresh_window)
                        .await
                }
                Some(gone) => {
                    if self.world.variant == Variant::TakeOverAny {
                        self.inner.delete_raw(keys.lock());
                    }
                    self.inner
                        .take_over(keys, gone, token, lease_ttl, refresh_window)
                        .await
                }
            };
            if let Ok(a) = &acquired {
                self.acquire_read(key, a);
            }
            if let (Some(task), Ok(a)) = (task, &acquired) {
                // Or one a mark judges: the cache asks again at once with
                // the value counted as not fresh (`marks/judged.rs`), as
                // after reading another type's.
                let unreadable = matches!(a, Acquired::Fresh(stored) if origin_of_envelope(&stored.bytes).is_none())
                    || matches!(a, Acquired::Fresh(_)) && self.judged_on_store(keys);
                self.world
                    .saw_unreadable
                    .lock()
                    .unwrap()
                    .insert(task, unreadable);
                let mut fresh = self.world.fresh_answered.lock().unwrap();
                match a {
                    Acquired::Fresh(stored) => fresh.insert(task, stored.bytes.clone()),
                    _ => fresh.remove(&task),
                };
            }
            acquired
        };
        self.logged(key, acquired, |a| {
            let (token, ttl, window) = (token.as_str().to_owned(), lease_ttl, refresh_window);
            let reply = acquired_reply(a);
            match gone {
                None => Exec::Acquire {
                    token,
                    ttl,
                    window,
                    fresh_before,
                    reply,
                },
                Some(gone) => Exec::TakeOver {
                    gone: gone.as_str().to_owned(),
                    replaced,
                    token,
                    ttl,
                    window,
                    fresh_before,
                    reply,
                },
            }
        })
        .await
    }
}

#[async_trait]
impl Backend for Store {
    /// A read as Redis's: the TTL the server has, for a key whose prefix
    /// this backend object tracks (`GET` + `PTTL`, decision 0014); else the
    /// one written in the value, as the one-`GET` hit reports (decision
    /// 0011), which a raw `PEXPIRE` may have made wrong. The `StampedTtl`
    /// variant reports the written one for every read.
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        frozen_if_dead(&self.world, self.inst).await;
        let Some(mut stored) = self.inner.get(keys).await? else {
            return Ok(None);
        };
        let key = self.world.key_of(keys);
        let now = self.world.since_t0();
        let expires = now + stored.ttl;
        let stamped =
            self.world.variant == Variant::StampedTtl || !self.world.tracking.tracks(self.inst);
        let written = self.world.written_expiry.lock().unwrap()[key];
        if let (true, Some(written)) = (stamped, written.filter(|w| *w > now)) {
            stored.ttl = written - now;
        }
        self.read(key, &stored.bytes, expires, now + stored.ttl);
        Ok(Some(stored))
    }

    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        self.lease_step(keys, None, token, lease_ttl, refresh_window)
            .await
    }

    /// A token of this instance (naming it, if the store watches holders).
    fn new_token(&self, _keys: &FillKeys) -> LeaseToken {
        if self.world.liveness.on() {
            LeaseToken::for_holder(&holder_name(self.inst))
        } else {
            LeaseToken::random()
        }
    }

    /// The lease re-checked, then the holder's instance: dead already, or
    /// alive and watched (`liveness.rs`).
    async fn watch_holder(
        &self,
        keys: &FillKeys,
        holder: &LeaseToken,
    ) -> Result<Watch, BackendError> {
        frozen_if_dead(&self.world, self.inst).await;
        if !self.lease_holds(keys, holder) {
            return Ok(Watch::Moved);
        }
        let Some(of) = holder_of(holder).filter(|_| self.world.liveness.on()) else {
            return Ok(Watch::Unsupported);
        };
        if self.world.is_dead(of) {
            return Ok(Watch::Gone(Gone::Dead));
        }
        let key = self.world.key_of(keys);
        let watch = liveness::watch_holder(&self.world, self.inst, key, holder, of);
        Ok(Watch::Alive(watch))
    }

    async fn take_over(
        &self,
        keys: &FillKeys,
        gone: &LeaseToken,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        self.lease_step(keys, Some(gone), token, lease_ttl, refresh_window)
            .await
    }

    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.world.stamp(bytes);
        // The UnfencedFill variant: whatever held the lease.
        let unfenced = || self.world.variant == Variant::UnfencedFill;
        let filled = self.inner.fill(keys, token, bytes, ttl);
        let filled = self
            .fenced(keys, token, unfenced, filled, |ok| Exec::Fill {
                token: token.as_str().to_owned(),
                ok,
                origin: origin_of_envelope(bytes),
            })
            .await;
        if let Ok(true) = filled {
            self.value_changed(keys, Change::Write);
        }
        filled
    }

    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        // The BareDelRelease variant: DEL whatever holds the lease.
        let unfenced = || {
            self.world.variant == Variant::BareDelRelease
                && self.inner.get_raw(keys.lock()).is_some()
        };
        if let Some((bytes, _)) = entry {
            self.world.stamp(bytes);
        }
        let released = self.inner.release(keys, token, entry);
        let released = self
            .fenced(keys, token, unfenced, released, |ok| Exec::Release {
                token: token.as_str().to_owned(),
                ok,
                entry: entry.and_then(|(bytes, _)| origin_of_envelope(bytes)),
            })
            .await;
        if let (Ok(true), Some(_)) = (&released, entry) {
            self.value_changed(keys, Change::Write);
        }
        released
    }

    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        let key = self.world.key_of(keys);
        let extended = self.inner.extend(keys, token, lease_ttl);
        self.logged(key, extended, |&ok| Exec::Extend {
            token: token.as_str().to_owned(),
            ttl: lease_ttl,
            ok,
        })
        .await
    }

    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        let key = self.world.key_of(keys);
        self.world.stamp(bytes);
        self.logged(key, self.inner.set(keys, bytes, ttl), |()| Exec::Set {
            origin: origin_of_envelope(bytes),
        })
        .await?;
        self.value_changed(keys, Change::Write);
        Ok(())
    }

    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let key = self.world.key_of(keys);
        self.logged(key, self.inner.invalidate(keys), |()| Exec::Invalidate)
            .await?;
        self.value_changed(keys, Change::Delete);
        Ok(())
    }

    /// The memory backend's `expire`, logged with the version it leaves
    /// (stale); the value key's change is a TTL cut (`Change::Soft`, which
    /// makes the expiry written in it the key's, as the Redis script does)
    /// or a deletion.
    async fn expire(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let key = self.world.key_of(keys);
        let before = self.inner.get_raw(keys.value());
        let inner = &self.inner;
        self.logged(key, self.inner.expire(keys), |()| Exec::Expire {
            kept: inner
                .get_raw(keys.value())
                .and_then(|(bytes, _)| origin_of_envelope(&bytes)),
        })
        .await?;
        let after = self.inner.get_raw(keys.value());
        match (before, after) {
            (Some(_), None) => self.value_changed(keys, Change::Delete),
            // Shortened, or stale already: either way the expiry written
            // in it is made the key's (another client's `PEXPIRE` may have
            // cut the TTL under it).
            (Some(_), Some(_)) => self.value_changed(keys, Change::Soft),
            (None, _) => {}
        }
        Ok(())
    }

    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        frozen_if_dead(&self.world, self.inst).await;
        self.inner.subscribe(keys).await
    }

    /// The memory backend's mark (the generation counts up by one, as the
    /// Redis script's does while its key is not lost), logged with what it
    /// marked and the generation it wrote; both keys' changes are reported
    /// on the tracking connections, as Redis's are (they are under the
    /// prefix an L1 tracks).
    async fn mark(
        &self,
        gen_key: &str,
        mark_key: &str,
        kind: MarkKind,
        retention: Option<Duration>,
    ) -> Result<u64, BackendError> {
        frozen_if_dead(&self.world, self.inst).await;
        let generation = self.inner.mark(gen_key, mark_key, kind, retention).await?;
        self.world.record(Ev::Marked {
            inst: self.inst,
            op: mark_op(mark_key, kind),
            generation,
        });
        self.world.tracking.report(gen_key);
        self.world.tracking.report(mark_key);
        Ok(generation)
    }

    async fn read_marks(
        &self,
        gen_key: &str,
        mark_keys: &[&str],
    ) -> Result<(u64, Vec<Mark>), BackendError> {
        frozen_if_dead(&self.world, self.inst).await;
        let mut read = self.inner.read_marks(gen_key, mark_keys).await?;
        if self.world.variant == Variant::MarksOffByOne {
            for mark in &mut read.1 {
                *mark = Mark {
                    hard: mark.hard.saturating_sub(1),
                    soft: mark.soft.saturating_sub(1),
                };
            }
        }
        self.world.record(Ev::MarksRead {
            inst: self.inst,
            generation: read.0,
        });
        Ok(read)
    }
}

/// What the mark under `mark_key` is (`…:clear`: the namespace's; `…:tag:t<n>`).
fn mark_op(mark_key: &str, kind: MarkKind) -> MarkOp {
    let tag = mark_key
        .rsplit_once(":tag:t")
        .and_then(|(_, n)| n.parse().ok());
    MarkOp {
        hard: kind == MarkKind::Hard,
        tag,
    }
}

pub(crate) fn acquired_reply(a: &Acquired) -> Reply {
    match a {
        Acquired::Won { .. } => Reply::Won,
        Acquired::Held { lease_ttl, .. } => Reply::Held(*lease_ttl),
        Acquired::Fresh(_) => Reply::Fresh,
    }
}
