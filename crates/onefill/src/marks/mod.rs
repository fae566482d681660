//! The namespace's marks as this process knows them, and what they make
//! of a stored value (decision 0018).
//!
//! `invalidate_tag`, `expire_tag` and `clear` do not touch values: they
//! move the namespace's generation forward and record it in a mark (a
//! tag's, or the whole namespace's). Every value records the generation
//! its load began at (`as_of`) and its tags, so a value older than a hard
//! mark it is subject to is gone (a miss), older than a soft one stale.
//!
//! The marks a value needs are held here, and trusted in one of two ways
//! ([`Trust`]): with an L1, the backend vouches for them as for the L1's
//! values (the keys are tracked: every change reported, and the sync
//! confirmed every so often; a mark is trusted within the sync bound of
//! the last confirmation); without one, a held mark is trusted for a
//! second after it was read, then judged by for one more while a read in
//! the background refreshes the namespace's (no tracking connection, no
//! `PING`s: a process that does not read costs nothing). So an untagged
//! hit costs nothing more than its read, and a tagged one nothing more
//! while its tags' marks are held; otherwise one read of the marks (all in
//! one slot: one round trip) before the verdict.
//!
//! Longer than most files: the two ways of trusting the marks, and what
//! the process does when it cannot read them, share every step here
//! (held, read, judged), and apart they would each need the others'.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::backend::{Backend, Mark, MarkKind, Stored};
use crate::envelope::{self, ValueMarks};
use crate::error::{BackendError, BackendErrorKind};
use crate::key::{MarkKeys, MarkName};

mod judged;
mod tags;
mod verdict;
pub(crate) use judged::Judged;
pub(crate) use tags::{check_tag, check_tags};
use verdict::verdict;
pub(crate) use verdict::Verdict;

/// How long a tag's mark is kept after its last invalidation or expiry,
/// and so the longest a tagged value lives in the store (its TTL and grace
/// together are cut to it): a mark must outlive every value it may judge.
pub const TAG_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most marks held at once; past it, the held marks are dropped (and
/// read again as values need them).
const HELD_MARKS: usize = 10_000;

/// How long a cache without an L1 trusts a mark it read before it refreshes
/// it (and judges by it for one such period more meanwhile; see [`Trust`]).
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// How a process trusts the marks it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trust {
    /// The backend reports their changes and confirms its sync: trusted
    /// within this bound of the last confirmation.
    Reported(Duration),
    /// Nothing reports them: each is trusted for this long after it was
    /// read.
    Rechecked(Duration),
}

/// A mark held, and when the read that found it began.
#[derive(Debug, Clone, Copy)]
struct Held {
    mark: Mark,
    read_at: Instant,
}

const SUPPORT_UNKNOWN: u8 = 0;
const SUPPORTED: u8 = 1;
const UNSUPPORTED: u8 = 2;

/// One cache's view of its namespace's marks.
pub(crate) struct Marks {
    keys: MarkKeys,
    /// The highest generation seen: at most the store's (loads record it
    /// as their `as_of`, which errs on the old side: a value stamped too
    /// old can only be judged by a mark it was not subject to, and
    /// reloaded).
    generation: AtomicU64,
    /// Whether the generation may have moved since it was read (a change
    /// of its key was reported, or it was never read).
    generation_stale: std::sync::atomic::AtomicBool,
    /// The marks held, by tag (the empty tag: the whole namespace's).
    held: Mutex<HashMap<Box<[u8]>, Held>>,
    /// Bumped by every change report and reset: a read of marks that began
    /// before one does not keep what it read.
    changes: AtomicU64,
    base: Instant,
    /// Milliseconds since `base` until which held marks are trusted.
    trusted_until: AtomicU64,
    /// With an L1: milliseconds since `base` until which the last read of
    /// the marks that succeeded vouches for the flights under way, as a
    /// confirmation would (see [`Marks::before_join`]).
    read_vouches_until: AtomicU64,
    /// A read of the marks succeeded once: the generation known is the
    /// store's as of then, not the 0 a cache starts with.
    ever_read: std::sync::atomic::AtomicBool,
    /// With an L1: the backend vouched for the marks once.
    ever_confirmed: std::sync::atomic::AtomicBool,
    /// With an L1: until when (milliseconds since `base`) calls judge by
    /// the last marks known, a read of them having failed, rather than
    /// each wait for a read of their own (see [`Marks::read`]); and the
    /// change count then (a change reported since ends it).
    unreachable_until: AtomicU64,
    /// The ACL's refusal of the last read of the marks, if it was refused
    /// ([`refused`](Marks::refused)).
    refused: Mutex<Option<BackendError>>,
    unreachable_at: AtomicU64,
    trust: Trust,
    /// How long a read of the marks may take while some are held: within
    /// the calls it is made for (half the backend timeout), so that a value
    /// whose marks are out of reach (their cluster master frozen) is still
    /// judged by the last ones known before its call times out.
    read_limit: Duration,
    support: AtomicU8,
    /// A background read of the namespace's mark is under way.
    refreshing: std::sync::atomic::AtomicBool,
    /// Without an L1: what the cache does when a read finds that another
    /// process marked since the last one (see [`Marks::on_moved`]).
    on_moved: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Told once: the backend cannot read marks, but a value it read was
    /// written by a process that knew of some.
    warned: std::sync::atomic::AtomicBool,
}

/// How the read of the namespace's mark made beside a read of values
/// went: if it failed, the verdict on what that read found does not try
/// again (the call would not have the time), it judges by the marks last
/// known.
#[derive(Debug, Default)]
pub(crate) struct Beside(Option<(BackendError, u64)>);

impl std::fmt::Debug for Marks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Marks")
            .field("prefix", &self.keys.prefix())
            .field("generation", &self.generation.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Marks {
    /// The marks of `namespace`, trusted as `trust` says; a read of them
    /// takes at most `read_limit` while some are held.
    pub(crate) fn new(namespace: &str, trust: Trust, read_limit: Duration) -> Self {
        Marks {
            keys: MarkKeys::new(namespace),
            generation: AtomicU64::new(0),
            generation_stale: std::sync::atomic::AtomicBool::new(true),
            held: Mutex::default(),
            changes: AtomicU64::new(0),
            base: Instant::now(),
            trusted_until: AtomicU64::new(0),
            read_vouches_until: AtomicU64::new(0),
            ever_read: std::sync::atomic::AtomicBool::new(false),
            ever_confirmed: std::sync::atomic::AtomicBool::new(false),
            unreachable_until: AtomicU64::new(0),
            refused: Mutex::new(None),
            unreachable_at: AtomicU64::new(0),
            trust,
            read_limit,
            support: AtomicU8::new(SUPPORT_UNKNOWN),
            refreshing: std::sync::atomic::AtomicBool::new(false),
            on_moved: std::sync::OnceLock::new(),
            warned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A read of the marks that finds the generation moved since the last
    /// one, where nothing vouched that every mark was reported (without an
    /// L1 never; with one, while the backend's confirmation is older than
    /// the sync bound), calls `moved`, which empties what the cache keeps
    /// of values and detaches the flights under way, as a reported mark
    /// does, and drops the marks held (any of them may be older than the
    /// store's now).
    pub(crate) fn on_moved(&self, moved: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_moved.set(moved);
    }

    pub(crate) fn keys(&self) -> &MarkKeys {
        &self.keys
    }

    /// The generation a load that begins now records as its `as_of`.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether `held` may judge at `now`.
    fn trusted(&self, held: &Held, now: Instant) -> bool {
        match self.trust {
            Trust::Reported(_) => self.millis(now) < self.trusted_until.load(Ordering::Acquire),
            // Fresh for one period; judged by for a second one while the
            // background read refreshes it (see `namespace_beside`).
            Trust::Rechecked(every) => now < held.read_at + 2 * every,
        }
    }

    /// Whether a read of the marks failed less than a recheck period ago,
    /// and no change of them (or reset) was reported since (with an L1
    /// only; see [`Marks::read`]).
    /// The server's ACL refused the last read of the marks: a
    /// configuration error that lasts, which a load must not go on
    /// without (its value would record a generation nobody read, and every
    /// later read of it would meet the same refusal).
    pub(crate) fn refused(&self) -> Option<BackendError> {
        self.refused.lock().clone()
    }

    fn recently_unreachable(&self, now: Instant) -> bool {
        self.millis(now) < self.unreachable_until.load(Ordering::Acquire)
            && self.changes() == self.unreachable_at.load(Ordering::Acquire)
    }

    fn unsupported(&self) -> bool {
        self.support.load(Ordering::Relaxed) == UNSUPPORTED
    }

    /// The verdict on `marks` from the marks held, if they are all held
    /// and trusted (or `trust` is false: the last known, for when the
    /// marks cannot be read).
    fn held_verdict(&self, marks: &ValueMarks<'_>, now: Instant, trust: bool) -> Option<Verdict> {
        if self.unsupported() {
            self.warn_unjudged(marks);
            return Some(Verdict::Valid);
        }
        let held = self.held.lock();
        let usable = |h: &Held| !trust || self.trusted(h, now);
        // Every hit past the L1 is judged here: no allocation.
        let namespace = held.get(&b""[..]).filter(|h| usable(h))?;
        let mut judged = verdict(marks.as_of, [&namespace.mark]);
        for tag in marks.tags() {
            let mark = &held.get(tag).filter(|h| usable(h))?.mark;
            judged = judged.max(verdict(marks.as_of, [mark]));
        }
        Some(judged)
    }

    /// A value was judged valid because the backend cannot read marks. If
    /// its writer knew a generation, the store holds marks that other
    /// processes read (this one is behind a backend that does not pass
    /// them on: a wrapper written before marks, say), and their
    /// `invalidate_tag` and `clear` do not reach this cache's answers.
    /// Judging such values gone instead would reload them for ever (every
    /// fill records the marks again): an error in the log, once.
    fn warn_unjudged(&self, marks: &ValueMarks<'_>) {
        if marks.as_of > 0 && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::error!(
                namespace = %self.keys.prefix(),
                "values here were written by processes that read marks, but this cache's \
                 backend cannot (its read_marks answers Unsupported): their invalidate_tag, \
                 expire_tag and clear are not applied to this cache's answers; a Backend \
                 wrapper must forward mark and read_marks"
            );
        }
    }

    /// Reads the namespace's mark, `tags`' marks and the generation
    /// together; keeps them if no change was reported meanwhile. Returns
    /// the marks read (the namespace's first), or `None` if the backend
    /// stores no marks (nothing can be marked there).
    async fn read(
        &self,
        backend: &dyn Backend,
        tags: &[&[u8]],
    ) -> Result<Option<Vec<Mark>>, BackendError> {
        self.read_within(backend, tags, None).await
    }

    /// [`read`](Self::read), within `limit` if given (else within the
    /// read limit only while the namespace's mark is held).
    async fn read_within(
        &self,
        backend: &dyn Backend,
        tags: &[&[u8]],
        limit: Option<Duration>,
    ) -> Result<Option<Vec<Mark>>, BackendError> {
        let ticket = self.changes.load(Ordering::SeqCst);
        let read_at = Instant::now();
        // With an L1 whose backend vouches for the marks as this read
        // begins, every mark made before it was reported or soon will be
        // (and detached what it judges): a generation found moved is news
        // to nobody. Nor is it before the backend first vouched: until
        // then the cache heard of no mark and trusted none, and its
        // flights are shared as they would be without tracking (a
        // start-up herd stays one flight, as after a reset then).
        let reported = match self.trust {
            Trust::Rechecked(_) => false,
            Trust::Reported(_) => {
                !self.ever_confirmed.load(Ordering::SeqCst)
                    || self.millis(read_at) < self.trusted_until.load(Ordering::Acquire)
                    || !self.ever_read.load(Ordering::SeqCst)
            }
        };
        let mut keys = vec![self.keys.clear()];
        keys.extend(tags.iter().map(|t| self.keys.tag(t)));
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let gen_key = self.keys.generation();
        let read = backend.read_marks(&gen_key, &refs);
        // Bounded only when the last marks known can stand in (a slow read
        // with nothing to fall back on may as well use the call's time).
        let limit = match limit {
            Some(limit) => limit,
            None if self.held.lock().contains_key(&b""[..]) => self.read_limit,
            None => Duration::MAX,
        };
        let read = crate::deadline::within("read_marks", Instant::now(), limit, read);
        let (generation, marks) = match read.await {
            Ok(read) => read,
            Err(e) if e.kind() == BackendErrorKind::Unsupported => {
                self.support.store(UNSUPPORTED, Ordering::Relaxed);
                return Ok(None);
            }
            Err(e) => {
                if e.kind() == BackendErrorKind::NotPermitted {
                    *self.refused.lock() = Some(e.clone());
                }
                // Without an L1, the marks out of reach (their master down
                // or failing over: nobody can mark meanwhile) keep judging
                // for another period, so reads do not each wait for the
                // next read of them to fail.
                match self.trust {
                    Trust::Rechecked(every) => {
                        let floor = Instant::now().checked_sub(every).unwrap_or(read_at);
                        for held in self.held.lock().values_mut() {
                            held.read_at = held.read_at.max(floor);
                        }
                    }
                    // With an L1, the marks are read again whenever the
                    // backend cannot vouch for them (any master's tracking
                    // lost): while their own master is out of reach, calls
                    // judge by the last ones known for a recheck period
                    // rather than each wait for its read to fail (a hung
                    // master of the marks made every load of every key
                    // half a second slower). A reset since lets a call try
                    // again (`judge`).
                    Trust::Reported(_) => {
                        let until = self
                            .millis(Instant::now())
                            .saturating_add(u64::try_from(RECHECK.as_millis()).unwrap_or(0));
                        self.unreachable_at.store(ticket, Ordering::Release);
                        self.unreachable_until.store(until, Ordering::Release);
                    }
                }
                return Err(e);
            }
        };
        self.support.store(SUPPORTED, Ordering::Relaxed);
        self.unreachable_until.store(0, Ordering::Release);
        *self.refused.lock() = None;
        if marks.len() != keys.len() {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("read_marks: {} marks for {} keys", marks.len(), keys.len()),
            ));
        }
        let before = self.generation.fetch_max(generation, Ordering::SeqCst);
        // (Without an L1, past 0 too: what the process kept before its
        // first read of the marks, a degraded load's value say, was judged
        // by none. With one, the first read splits no start-up herd: until
        // then the cache trusted no mark, as one without an L1 does.)
        let moved = !reported && generation > before;
        self.ever_read.store(true, Ordering::SeqCst);
        if let Trust::Reported(bound) = self.trust {
            let until = self
                .millis(read_at)
                .saturating_add(u64::try_from(bound.as_millis()).unwrap_or(u64::MAX));
            self.read_vouches_until.fetch_max(until, Ordering::AcqRel);
        }
        let mut held = self.held.lock();
        // Under the lock, as reports are handled: a report either came
        // before this check (and what was read is not kept) or comes after
        // the insert (and removes it).
        let keep = self.changes.load(Ordering::SeqCst) == ticket;
        if moved {
            // Marked elsewhere since: every mark held may be older than
            // the store's, and a read under way keeps none it read.
            self.changes.fetch_add(1, Ordering::SeqCst);
            held.clear();
        }
        if keep {
            self.generation_stale.store(false, Ordering::SeqCst);
            if held.len() + marks.len() > HELD_MARKS {
                held.clear();
            }
            let kept = |mark: Mark| Held { mark, read_at };
            held.insert(Box::from(&b""[..]), kept(marks[0]));
            for (tag, mark) in tags.iter().zip(&marks[1..]) {
                held.insert(Box::from(*tag), kept(*mark));
            }
        }
        drop(held);
        if let (true, Some(moved)) = (moved, self.on_moved.get()) {
            moved();
        }
        Ok(Some(marks))
    }

    /// Reads the namespace's mark (and the generation) unless it is held
    /// and trusted: made beside a read of values (the two concurrently, so
    /// a process's first read, or its first after a `clear`, still costs
    /// one round trip of time), since every value needs it. Its error is
    /// the verdict's business (it reads again, or judges by what it knew).
    ///
    /// Without an L1 (marks rechecked), a namespace mark read less than two
    /// recheck periods ago still judges while one read in the background
    /// refreshes it: a value read never waits for the marks' master once
    /// they are known (that master failing over made every process's reads
    /// slow once a second).
    pub(crate) async fn namespace_beside(self: &Arc<Self>, backend: &Arc<dyn Backend>) -> Beside {
        let now = Instant::now();
        if self.unsupported() || self.namespace_held(now) {
            return Beside::default();
        }
        if self.recently_unreachable(now) {
            // The verdict judges by the last marks known (`judge`), while
            // one read in the background finds whether they are back.
            self.refresh_in_background(backend);
            return Beside::default();
        }
        if let Trust::Rechecked(every) = self.trust {
            let usable = self
                .held
                .lock()
                .get(&b""[..])
                .is_some_and(|h| now < h.read_at + 2 * every);
            if usable {
                self.refresh_in_background(backend);
                return Beside::default();
            }
        }
        let ticket = self.changes();
        Beside(
            self.read(backend.as_ref(), &[])
                .await
                .err()
                .map(|e| (e, ticket)),
        )
    }

    /// One read of the namespace's mark in the background, unless one is
    /// under way.
    fn refresh_in_background(self: &Arc<Self>, backend: &Arc<dyn Backend>) {
        if !self.refreshing.swap(true, Ordering::SeqCst) {
            let (marks, backend) = (self.clone(), backend.clone());
            tokio::spawn(async move {
                let _ = marks.read(&*backend, &[]).await;
                marks.refreshing.store(false, Ordering::SeqCst);
            });
        }
    }

    /// The verdict on `stored` from the marks held and trusted now, if
    /// that is enough (no command): the hit path's case.
    #[cfg(feature = "redis")]
    pub(crate) fn held_judgement(&self, stored: &Stored) -> Option<Verdict> {
        let Some(marks) = envelope::marks_of(&stored.bytes) else {
            return Some(Verdict::Valid);
        };
        self.held_verdict(&marks, Instant::now(), true)
    }

    /// Whether the namespace's mark is held and trusted at `now`.
    #[cfg(feature = "redis")]
    pub(crate) fn namespace_held_at(&self, now: Instant) -> bool {
        self.unsupported() || self.namespace_held(now)
    }

    /// Whether the namespace's mark is held and needs no read now (without
    /// an L1: read less than one recheck period ago).
    fn namespace_held(&self, now: Instant) -> bool {
        let held = self.held.lock();
        held.get(&b""[..]).is_some_and(|h| match self.trust {
            Trust::Rechecked(every) => now < h.read_at + every,
            Trust::Reported(_) => self.trusted(h, now),
        })
    }

    /// Makes sure the generation a load records is current: read again if
    /// a change of it was reported since (one round trip, before the load
    /// begins; after a mark only, and once when the cache starts). If it
    /// cannot be read, the load records the last one known: older than the
    /// truth, which can only make its value judged by a mark it was not
    /// subject to (and loaded again), never the other way.
    pub(crate) async fn before_load(&self, backend: &dyn Backend, beside: &Beside) {
        let stale = self.generation_stale.load(Ordering::SeqCst);
        if self.unsupported() || !stale && self.namespace_held(Instant::now()) {
            return;
        }
        if beside.0.is_some() || self.recently_unreachable(Instant::now()) {
            // Out of reach a moment ago: not worth the call's time.
            return;
        }
        if let Err(e) = self.read(backend, &[]).await {
            tracing::debug!(%e, "the load records the last generation known");
        }
    }

    /// With an L1, before a call joins a flight under way: if the backend
    /// has not vouched for the marks within the sync bound (its tracking
    /// connection silent, or lost and not yet back), a mark made elsewhere
    /// may have gone unreported, and a flight that began before it would
    /// answer what it judges. One read of the marks then (within the read
    /// limit), unless one that began within the bound succeeded: a
    /// generation found moved detaches the flights and loads under way
    /// (`on_moved`), so the call starts its own. Out of reach, the call
    /// joins as before (nobody can mark while the marks' master is down).
    /// Nothing to do before the first read of the marks (there is no
    /// generation to find moved) or the backend's first confirmation
    /// (until then the cache trusted no mark: see [`Marks::read`]).
    /// Returns the read to await, if one is needed.
    pub(crate) fn before_join<'a>(
        &'a self,
        backend: &'a dyn Backend,
    ) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>> {
        if let Trust::Rechecked(_) = self.trust {
            return None;
        }
        if !self.ever_read.load(Ordering::SeqCst) || !self.ever_confirmed.load(Ordering::SeqCst) {
            return None;
        }
        let now = Instant::now();
        let at = self.millis(now);
        if at < self.trusted_until.load(Ordering::Acquire)
            || at < self.read_vouches_until.load(Ordering::Acquire)
            || self.unsupported()
            || self.recently_unreachable(now)
        {
            return None;
        }
        // Boxed: the read is rare, and the hit path's future stays small.
        Some(Box::pin(async move {
            let read = self.read_within(backend, &[], Some(self.read_limit));
            if let Err(e) = read.await {
                tracing::debug!(%e, "the call joins by the marks last known");
            }
        }))
    }

    /// The generation a write that begins at `began` records: read again
    /// first if a change of it was reported (as [`before_load`](Self::before_load)),
    /// within the write's own `limit`. A write made after a mark this
    /// process has heard of must not record an older generation: it would
    /// read back as a miss, here and everywhere. Out of time, it records
    /// the last one known.
    pub(crate) async fn for_write(
        &self,
        backend: &dyn Backend,
        began: Instant,
        limit: Duration,
    ) -> u64 {
        let beside = Beside::default();
        let refresh = self.before_load(backend, &beside);
        let _ = crate::deadline::timer(began, limit, refresh).await;
        self.generation()
    }

    /// The verdicts on `stored` (each `None`: nothing stored, judged
    /// [`Verdict::Valid`]), reading the marks they need that are not held
    /// (in one read), unless the read `beside` them failed.
    pub(crate) async fn judge(
        &self,
        backend: &dyn Backend,
        stored: &[Option<&Stored>],
        beside: &Beside,
    ) -> Result<Vec<Verdict>, BackendError> {
        let now = Instant::now();
        let marks: Vec<Option<ValueMarks<'_>>> = stored
            .iter()
            .map(|s| s.and_then(|s| envelope::marks_of(&s.bytes)))
            .collect();
        let held: Vec<Option<Verdict>> = marks
            .iter()
            .map(|m| match m {
                None => Some(Verdict::Valid),
                Some(m) => self.held_verdict(m, now, true),
            })
            .collect();
        if held.iter().all(Option::is_some) {
            return Ok(held
                .into_iter()
                .map(|v| v.unwrap_or(Verdict::Valid))
                .collect());
        }
        // One read for every mark any of them needs.
        let mut tags: Vec<&[u8]> = Vec::new();
        for (m, v) in marks.iter().zip(&held) {
            if let (Some(m), None) = (m, v) {
                for tag in m.tags() {
                    if !tags.contains(&tag) {
                        tags.push(tag);
                    }
                }
            }
        }
        // The marks are out of reach (on a cluster, their master may be
        // down while the value's answers): the last marks known judge, if
        // this process knows every one needed. Nobody can mark while their
        // master is down, and what was marked before reached this process
        // unless it came in the last moments before; a value whose marks
        // were never known is not answered.
        let last_known = || {
            marks
                .iter()
                .zip(&held)
                .map(|(m, v)| match (m, v) {
                    (_, Some(v)) => Some(*v),
                    (None, None) => Some(Verdict::Valid),
                    (Some(m), None) => self.held_verdict(m, now, false),
                })
                .collect::<Option<Vec<Verdict>>>()
        };
        // Out of reach a moment ago: the last known judge without a read,
        // if they can (else a read, whose failure is this call's).
        if beside.0.is_none() && self.recently_unreachable(now) {
            if let Some(verdicts) = last_known() {
                return Ok(verdicts);
            }
        }
        let (read, ticket) = match &beside.0 {
            Some((e, ticket)) => (Err(e.clone()), *ticket),
            None => {
                let ticket = self.changes();
                (self.read(backend, &tags).await, ticket)
            }
        };
        let read = match read {
            Ok(Some(read)) => read,
            Ok(None) => return Ok(vec![Verdict::Valid; stored.len()]),
            Err(e) => match last_known().ok_or(e) {
                Ok(verdicts) => return Ok(verdicts),
                // A reset came while the read failed (a cluster's tracking
                // took on a new master, say: the marks' master failed over)
                // and took what was known with it: one more read, which
                // finds the marks where they are now, rather than an error
                // for a value whose marks were known a moment ago.
                Err(e) if self.changes() != ticket => match self.read(backend, &tags).await {
                    Ok(Some(read)) => read,
                    Ok(None) => return Ok(vec![Verdict::Valid; stored.len()]),
                    Err(_) => return Err(e),
                },
                Err(e) => return Err(e),
            },
        };
        let of = |tag: &[u8]| {
            let at = tags.iter().position(|t| *t == tag)?;
            read.get(at + 1)
        };
        Ok(marks
            .iter()
            .zip(held)
            .map(|(m, v)| match (m, v) {
                (_, Some(v)) => v,
                (None, None) => Verdict::Valid,
                (Some(m), None) => {
                    let mut all = vec![&read[0]];
                    all.extend(m.tags().filter_map(of));
                    verdict(m.as_of, all)
                }
            })
            .collect())
    }

    /// The backend reported a change of `key`: whether it was one of the
    /// marks (a tag's or the namespace's: what the cache kept of values may
    /// be judged otherwise now).
    pub(crate) fn changed(&self, key: &[u8]) -> bool {
        let Some(name) = self.keys.name(key) else {
            return false;
        };
        let mut held = self.held.lock();
        self.changes.fetch_add(1, Ordering::SeqCst);
        match name {
            MarkName::Generation => {
                self.generation_stale.store(true, Ordering::SeqCst);
                false
            }
            MarkName::Clear => {
                held.remove(&b""[..]);
                true
            }
            MarkName::Tag(tag) => {
                held.remove(tag);
                true
            }
        }
    }

    /// How many changes of the marks were reported so far: a write that
    /// lands after one began keeps nothing of its value (the mark may judge
    /// it).
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// Anything may have changed.
    pub(crate) fn reset(&self) {
        let mut held = self.held.lock();
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.generation_stale.store(true, Ordering::SeqCst);
        held.clear();
    }

    /// See [`ChangeListener::synced`](crate::backend::ChangeListener::synced).
    pub(crate) fn synced(&self, as_of: Option<Instant>) {
        let Trust::Reported(bound) = self.trust else {
            return;
        };
        if as_of.is_some() {
            self.ever_confirmed.store(true, Ordering::SeqCst);
        }
        let until = match as_of {
            Some(at) => self
                .millis(at)
                .saturating_add(u64::try_from(bound.as_millis()).unwrap_or(u64::MAX)),
            None => 0,
        };
        self.trusted_until.store(until, Ordering::Release);
    }

    /// This process marked: what it holds of the mark goes (the backend
    /// reports it too, but a process must see its own marks before they
    /// return, whatever its backend's reports do).
    pub(crate) fn marked(&self, mark_key: &str, generation: u64) {
        self.generation.fetch_max(generation, Ordering::SeqCst);
        if let Trust::Rechecked(_) = self.trust {
            // The generation it knows may now be past another process's
            // mark made since its last read of the marks: a read would not
            // find that the generation moved, so every mark held goes.
            self.reset();
        }
        self.changed(mark_key.as_bytes());
    }

    /// The backend key of `target`'s mark.
    pub(crate) fn key_of(&self, target: Target<'_>) -> String {
        match target {
            Target::Namespace => self.keys.clear(),
            Target::Tag(tag) => self.keys.tag(tag.as_bytes()),
        }
    }

    /// How long `target`'s mark of `kind` is kept.
    pub(crate) fn retention(target: Target<'_>, kind: MarkKind) -> Option<Duration> {
        let _ = kind;
        match target {
            // One key per namespace, and untagged values may live up to
            // the longest TTL: kept for ever.
            Target::Namespace => None,
            Target::Tag(_) => Some(TAG_RETENTION),
        }
    }
}

/// What a mark is made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target<'a> {
    /// Every value of the namespace (`clear`).
    Namespace,
    Tag(&'a str),
}
