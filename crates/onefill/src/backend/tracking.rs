//! How a backend tells an in-process L1 that values changed.
//!
//! An L1 ([`L1`](crate::L1)) may serve a value without asking the backend
//! only while the backend vouches that it would hear of any change to it.
//! [`Backend::track_changes`](super::Backend::track_changes) registers a
//! [`ChangeListener`]; the backend then reports, for the value keys under a
//! prefix:
//!
//! - [`changed`](ChangeListener::changed): this key was written, deleted,
//!   expired or evicted, whoever did it;
//! - [`reset`](ChangeListener::reset): anything may have changed (the
//!   backend lost track for a while: a reconnection, a `FLUSHALL`);
//! - [`synced`](ChangeListener::synced): every change the store made before
//!   this instant has been reported (`None`: the backend cannot vouch for
//!   anything now, e.g. its connection is down).
//!
//! The [`MemoryBackend`](crate::MemoryBackend) reports every change before
//! the write returns and is always in sync; the Redis backend uses
//! server-assisted client-side caching (`CLIENT TRACKING ... BCAST`) and
//! confirms its sync with a `PING` on the tracking connection. If its
//! server refuses tracking, it asks the listener
//! ([`untracked`](ChangeListener::untracked)) whether the changes onefill's
//! own writes announce are enough.

use std::sync::Weak;

use parking_lot::RwLock;
use tokio::time::Instant;

/// Receives a backend's reports of changed values (see the module docs).
///
/// Implemented by onefill's L1; a [`Backend`](super::Backend) implementation
/// only calls it. Calls must be cheap and must not block: they may be made
/// while the backend holds a lock.
pub trait ChangeListener: Send + Sync + 'static {
    /// The value stored at `value_key` (a [`FillKeys::value`](super::FillKeys::value)
    /// key, or any other key under the registered prefix, which the listener
    /// ignores) changed or vanished.
    fn changed(&self, value_key: &[u8]);

    /// Anything under the prefix may have changed.
    fn reset(&self);

    /// Every change made before `as_of` has been reported (`None`: no longer
    /// in sync, until the next `Some`).
    fn synced(&self, as_of: Option<Instant>);

    /// The backend cannot report every change, only those that onefill's
    /// own writes announce (`refusal` says why: on Redis, the server
    /// refused `CLIENT TRACKING`). Returns whether that is enough for the
    /// listener, which then bounds by age what it keeps (an
    /// [`L1`](crate::L1)'s [`Untracked::Announced`](crate::Untracked::Announced)):
    /// the backend goes on reporting the announced changes and confirming
    /// its sync as before. If not (the default), the backend reports
    /// nothing more and never confirms a sync again.
    fn untracked(&self, refusal: &crate::error::BackendError) -> bool {
        let _ = refusal;
        false
    }
}

/// The listeners registered with one backend, by key prefix: how a backend
/// tells the caches of this process about a change it made itself, before
/// the write returns (every cache of the process, not only the one that
/// wrote, sees its own process's writes at once).
#[derive(Default)]
pub(crate) struct Listeners {
    by_prefix: RwLock<Vec<(String, Weak<dyn ChangeListener>)>>,
}

impl Listeners {
    pub(crate) fn register(&self, prefix: &str, listener: Weak<dyn ChangeListener>) {
        let mut all = self.by_prefix.write();
        all.retain(|(_, l)| l.strong_count() > 0);
        all.push((prefix.to_owned(), listener));
    }

    /// `key` changed: every listener whose prefix it has hears of it.
    pub(crate) fn changed(&self, key: &str) {
        for (prefix, listener) in self.by_prefix.read().iter() {
            if key.starts_with(prefix.as_str()) {
                if let Some(listener) = listener.upgrade() {
                    listener.changed(key.as_bytes());
                }
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.by_prefix.read().len()
    }
}
