//! What a backend's change report does to this process's copies of a value
//! (see `backend/tracking.rs`): a cache with an L1 registers itself, not its
//! L1, so that one report reaches both copies it keeps, the L1 entry and
//! the outage fallback's.
//!
//! The fallback serves only while the backend fails, so it cannot hear of
//! what changes during an outage; but a change reported *before* one must
//! not come back from it. A slot migrating under a key is enough to show
//! why: the scripts of a migrating slot are refused with `TRYAGAIN` while
//! the server answers plain reads, so a call fails over to the fallback
//! seconds after another process replaced the value it kept, and the push
//! that dropped the L1 entry had long arrived.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use crate::backend::ChangeListener;
use crate::l1::Ticket;
use crate::shared::Shared;

impl<V: Clone + Send + Sync + 'static> ChangeListener for Shared<V> {
    fn changed(&self, value_key: &[u8]) {
        if self.marks.changed(value_key) {
            // A tag's or the namespace's mark moved: any value kept here
            // may be one it judges now. Which ones, only their marks tell,
            // and the copies do not keep them: they all go (marks are rare
            // next to writes; a value read again is judged again).
            self.forget_every_copy();
            self.flights.detach_all();
            // A load under way may have begun before the mark: a degraded
            // call from now on must not share its answer.
            self.loads.detach_all();
            return;
        }
        let Some(l1) = &self.l1 else {
            return;
        };
        // The L1 first: a flight that records in the fallback after this
        // sees the change in its ticket (`remember`).
        let Some(key) = l1.changed(value_key) else {
            return;
        };
        if let Ok(value_key) = std::str::from_utf8(value_key) {
            self.fallback.forget_kept(value_key);
        }
        // A call from now on must not join a flight that read (or loaded)
        // before the change: it would answer what the change replaced, or
        // a load whose fill the change fenced out. The flights under way
        // still answer the callers they have, as after this process's own
        // `set`. (Loads stay shared: a flight that loads under a lease runs
        // its own, and a degraded load's answer is the origin's, not a
        // copy of what the server held.)
        self.flights.detach(&key);
    }

    fn reset(&self) {
        self.marks.reset();
        // Changes went unreported for a while: anything kept before may
        // have been replaced since.
        self.forget_every_copy();
        // A mark among them would have detached the flights and loads under
        // way (they may predate it): a call from now on must not share them.
        // Not before the backend first confirmed its reports (the reset
        // of a cache's first tracking connection, a few ms after it was
        // built): until then the cache heard of no change, no mark, and
        // trusted none of what it read, as a cache without an L1; its
        // flights are shared as that cache's would be, and a herd at
        // start-up stays one flight.
        if self.ever_synced.load(Ordering::SeqCst) {
            self.flights.detach_all();
            self.loads.detach_all();
        }
    }

    fn untracked(&self, refusal: &crate::error::BackendError) -> bool {
        // Marks stay reported (onefill's mark script announces its key):
        // only the L1 has a say. Without an L1 nothing is tracked.
        self.l1.as_ref().is_some_and(|l1| l1.untracked(refusal))
    }

    fn synced(&self, as_of: Option<Instant>) {
        if as_of.is_some() {
            self.ever_synced.store(true, Ordering::SeqCst);
        }
        self.marks.synced(as_of);
        if let Some(l1) = &self.l1 {
            l1.synced(as_of);
        }
    }
}

impl<V: Clone + Send + Sync + 'static> Shared<V> {
    /// A read of the marks found that another process marked, and no
    /// report said so (without an L1, none ever does; with one, the
    /// backend could not vouch for its reports then): what this process
    /// keeps of values goes, as when a mark is reported (`changed`), and
    /// the flights and loads under way are detached (they may predate the
    /// mark).
    pub(crate) fn marked_elsewhere(&self) {
        self.forget_every_copy();
        self.flights.detach_all();
        self.loads.detach_all();
    }

    /// Every copy of every value this process keeps goes: the L1's
    /// entries and the outage fallback's. (After a mark, or a reset that
    /// may have hidden one, the flights under way are detached too, so a
    /// call from now on does not share an answer read before it.)
    pub(crate) fn forget_every_copy(&self) {
        if let Some(l1) = &self.l1 {
            l1.reset();
        }
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        self.fallback.forget_all_before(epoch);
    }

    /// Keeps a flight's answer for outages: `value`, read or loaded by a
    /// flight that started at `epoch` (holding the L1's `ticket`, if the
    /// cache has an L1), served no later than `usable_until`. Not kept if
    /// the backend reported a change of the key since the flight started:
    /// what it read may be what the change replaced. (A flight's own fill
    /// is reported too, so a loaded value is kept by the next read, as the
    /// L1 keeps it.)
    pub(crate) fn remember(
        &self,
        key: &str,
        value_key: &str,
        value: &Option<V>,
        usable_until: Instant,
        epoch: u64,
        ticket: Option<Ticket>,
    ) {
        let changed = || match (&self.l1, ticket) {
            (Some(l1), Some(ticket)) => !l1.unchanged_since(key, ticket),
            _ => false,
        };
        if changed() {
            return;
        }
        // Kept no longer than the L1 would keep it: without tracking, a
        // foreign write after the read is never heard of.
        let usable_until = match (&self.l1, ticket) {
            (Some(l1), Some(ticket)) => l1.capped(usable_until, ticket),
            _ => usable_until,
        };
        let kept = self.fallback.record(value_key, value, usable_until, epoch);
        // A report that came in during the record found nothing to forget
        // yet (or an entry the record then replaced): it is seen here.
        if let Some(kept) = kept.filter(|_| changed()) {
            self.fallback.take_back(value_key, kept);
        }
    }
}
