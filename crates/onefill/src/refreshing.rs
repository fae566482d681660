//! The keys this process refreshes in the background: one refresh per key
//! per process. A refresh that found another process's lease keeps its key
//! here for a pause (see `flight/load.rs`), so the process's next stale
//! reads do not each ask for that lease again; a write of the key by this
//! process ends the pause, since it removed that lease (a `set`, an
//! `invalidate`, an `expire`): the value an `expire` left stale would
//! otherwise wait out the pause with nobody refreshing it.

use std::collections::HashMap;

use parking_lot::Mutex;

/// A key's mark: which refresh holds it, and whether that refresh only
/// waits out another process's lease.
#[derive(Clone, Copy, Debug)]
struct Mark {
    id: u64,
    paused: bool,
}

/// The keys (value keys) with a background refresh under way here.
#[derive(Debug, Default)]
pub(crate) struct Refreshing {
    marks: Mutex<HashMap<String, Mark>>,
    next: std::sync::atomic::AtomicU64,
}

impl Refreshing {
    /// Marks `key` as refreshing, unless it is already: the mark's number,
    /// which [`pause`](Refreshing::pause) and [`end`](Refreshing::end) take.
    pub(crate) fn start(&self, key: &str) -> Option<u64> {
        let mut marks = self.marks.lock();
        if marks.contains_key(key) {
            return None;
        }
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        marks.insert(key.to_owned(), Mark { id, paused: false });
        Some(id)
    }

    /// The refresh `id` of `key` waits out another process's lease.
    pub(crate) fn pause(&self, key: &str, id: u64) {
        if let Some(mark) = self.marks.lock().get_mut(key) {
            if mark.id == id {
                mark.paused = true;
            }
        }
    }

    /// The refresh `id` of `key` ended: its mark goes (not a later
    /// refresh's, after a write ended its pause).
    pub(crate) fn end(&self, key: &str, id: u64) {
        let mut marks = self.marks.lock();
        if marks.get(key).is_some_and(|mark| mark.id == id) {
            marks.remove(key);
        }
    }

    /// This process wrote `key`: a pause of its refresh ends (the lease it
    /// waited out is gone); a refresh under way keeps its mark.
    pub(crate) fn written(&self, key: &str) {
        let mut marks = self.marks.lock();
        if marks.get(key).is_some_and(|mark| mark.paused) {
            marks.remove(key);
        }
    }

    /// Whether `key` is marked (refreshing, or pausing).
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.marks.lock().contains_key(key)
    }
}
