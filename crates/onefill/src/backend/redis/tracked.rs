//! What one backend tracks for its L1s: the namespaces' prefixes and their
//! listeners, shared by one tracking connection per server (`tracking.rs`)
//! however many caches with an L1 the backend serves.
//!
//! A cache registers when it is built; the connections take its prefix on
//! at their next confirmation (`CLIENT TRACKING ON BCAST PREFIX` again, on
//! the live connection, adds it). A confirmation counts for a listener
//! only once every connection it comes from has taken that listener's
//! prefix on: each registration gets a number, each connection says up to
//! which number it has taken on, and a listener is in sync only as of
//! confirmations that cover its number. Reports are handed to the
//! listeners whose prefix the key starts with; a reset or a lost
//! connection reaches them all.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::backend::{BackendError, ChangeListener};
use crate::error::BackendErrorKind;

/// `CLIENT TRACKING`: every change of a key is reported.
pub(super) const TRACKED: u8 = 0;
/// The server refuses tracking and the listeners make do with what
/// onefill's writes announce.
pub(super) const ANNOUNCED: u8 = 1;
/// The server refuses tracking and no listener goes on without it.
pub(super) const REFUSED: u8 = 2;

/// A confirmation from the connections: every change before `at` was
/// reported, for the registrations up to `covers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Confirmed {
    pub at: Instant,
    pub covers: u64,
}

/// The prefixes and listeners of one backend's L1s.
pub(super) struct Tracked {
    state: Mutex<State>,
    /// How the connections hear of changes ([`TRACKED`], [`ANNOUNCED`] or
    /// [`REFUSED`]), shared by all of them.
    mode: AtomicU8,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    /// The number the next registration gets (the first is 1, so that a
    /// connection that has taken nothing on covers 0).
    next: u64,
    /// Whether tracking tasks run for these entries.
    running: bool,
    /// The server's refusal of tracking, once a connection met it.
    refusal: Option<BackendError>,
}

struct Entry {
    number: u64,
    prefix: String,
    /// How often its L1 wants the sync confirmed (a fifth of its
    /// `sync_bound`).
    confirm_every: Duration,
    listener: Weak<dyn ChangeListener>,
}

/// What a connection has to take on: the prefixes registered after what
/// it covers, each once.
pub(super) struct Additions {
    pub prefixes: Vec<String>,
    pub covers: u64,
}

impl Tracked {
    pub(super) fn new() -> Tracked {
        Tracked {
            state: Mutex::new(State {
                next: 1,
                ..State::default()
            }),
            mode: AtomicU8::new(TRACKED),
        }
    }

    pub(super) fn mode(&self) -> u8 {
        self.mode.load(Ordering::SeqCst)
    }

    /// How often the connections confirm: as often as the most demanding
    /// live listener asks.
    pub(super) fn confirm_every(&self) -> Duration {
        self.state
            .lock()
            .entries
            .iter()
            .filter(|e| e.listener.strong_count() > 0)
            .map(|e| e.confirm_every)
            .min()
            .unwrap_or(Duration::from_millis(50))
    }

    /// Registers `listener` for the keys under `prefix`. `refusal`: the
    /// server refused tracking when the backend connected. An error if
    /// the server refuses tracking and the listener will not go on
    /// without it; otherwise whether the tracking tasks must be started
    /// (none runs).
    pub(super) fn add(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: Weak<dyn ChangeListener>,
        refusal: Option<&BackendError>,
    ) -> Result<bool, BackendError> {
        let mut state = self.state.lock();
        let known = state.refusal.clone().or_else(|| refusal.cloned());
        if let Some(refusal) = known {
            let accepted = listener.upgrade().is_some_and(|l| l.untracked(&refusal));
            if !accepted {
                return Err(BackendError::new(
                    BackendErrorKind::Unsupported,
                    format!(
                        "the server refuses client tracking ({refusal}), and the L1 is told \
                         not to go on without it (Untracked::Refuse)"
                    ),
                ));
            }
            self.mode.store(ANNOUNCED, Ordering::SeqCst);
        }
        let number = state.next;
        state.next += 1;
        state.entries.push(Entry {
            number,
            prefix: prefix.to_owned(),
            confirm_every,
            listener,
        });
        Ok(!std::mem::replace(&mut state.running, true))
    }

    /// Whether the tracking tasks go on: false once every listener is
    /// gone (the tasks then stop, and the next registration starts them
    /// again).
    pub(super) fn keep_going(&self) -> bool {
        let mut state = self.state.lock();
        state.entries.retain(|e| e.listener.strong_count() > 0);
        if state.entries.is_empty() || self.mode() == REFUSED {
            state.running = false;
        }
        state.running
    }

    /// Whether a tracking task has anything to do: a listener lives, and
    /// the server's refusal has not ended tracking for good.
    pub(super) fn live(&self) -> bool {
        self.mode() != REFUSED
            && self
                .state
                .lock()
                .entries
                .iter()
                .any(|e| e.listener.strong_count() > 0)
    }

    /// Every prefix registered so far, each once, for a connection just
    /// made.
    pub(super) fn all(&self) -> Additions {
        self.after(0, &HashSet::new())
    }

    /// The prefixes registered after `covers` that a live connection has
    /// not `taken` on, each once: Redis refuses a prefix the connection
    /// tracks already (as overlapping itself), and the registration that
    /// brought it may be gone while another of the namespace came. The
    /// listeners gone are dropped here, at every confirmation.
    pub(super) fn after(&self, covers: u64, taken: &HashSet<String>) -> Additions {
        let mut state = self.state.lock();
        state.entries.retain(|e| e.listener.strong_count() > 0);
        let mut prefixes: Vec<String> = Vec::new();
        for e in state.entries.iter().filter(|e| e.number > covers) {
            if !taken.contains(&e.prefix) && !prefixes.contains(&e.prefix) {
                prefixes.push(e.prefix.clone());
            }
        }
        Additions {
            prefixes,
            covers: state.next - 1,
        }
    }

    /// The live listeners registered after `after` and up to `upto`.
    fn listeners(&self, after: u64, upto: u64) -> Vec<Arc<dyn ChangeListener>> {
        self.state
            .lock()
            .entries
            .iter()
            .filter(|e| e.number > after && e.number <= upto)
            .filter_map(|e| e.listener.upgrade())
            .collect()
    }

    /// `value_key` changed: told to the listeners of its prefix.
    pub(super) fn changed(&self, value_key: &[u8]) {
        let listeners: Vec<Arc<dyn ChangeListener>> = self
            .state
            .lock()
            .entries
            .iter()
            .filter(|e| value_key.starts_with(e.prefix.as_bytes()))
            .filter_map(|e| e.listener.upgrade())
            .collect();
        for l in listeners {
            l.changed(value_key);
        }
    }

    /// Changes may have gone unreported, for the registrations after
    /// `after` and up to `upto` (a connection made, or prefixes taken
    /// on).
    pub(super) fn reset(&self, after: u64, upto: u64) {
        for l in self.listeners(after, upto) {
            l.reset();
        }
    }

    /// Every listener: changes may have gone unreported (a flush).
    pub(super) fn reset_all(&self) {
        self.reset(0, u64::MAX);
    }

    /// The connections' confirmation (`None`: not in sync): a listener is
    /// in sync as of it if it covers the listener's registration.
    pub(super) fn synced(&self, confirmed: Option<Confirmed>) {
        let state = self.state.lock();
        let told: Vec<(Arc<dyn ChangeListener>, Option<Instant>)> = state
            .entries
            .iter()
            .filter_map(|e| {
                let at = confirmed.filter(|c| c.covers >= e.number).map(|c| c.at);
                Some((e.listener.upgrade()?, at))
            })
            .collect();
        drop(state);
        for (l, at) in told {
            l.synced(at);
        }
    }

    /// A connection met the server's refusal of tracking: each listener
    /// says whether it goes on with onefill's announcements (those that do
    /// not are dropped, never in sync again). Whether any goes on.
    pub(super) fn refused(&self, refusal: &BackendError) -> bool {
        let asked: Vec<(u64, Arc<dyn ChangeListener>)> = {
            let mut state = self.state.lock();
            state.refusal = Some(refusal.clone());
            state
                .entries
                .iter()
                .filter_map(|e| Some((e.number, e.listener.upgrade()?)))
                .collect()
        };
        // Asked without the lock (a listener may take its own); the
        // entries stay meanwhile, so other connections' reports still
        // reach them. Those registered meanwhile were asked by `add`.
        let mut out = Vec::new();
        for (number, l) in asked {
            if !l.untracked(refusal) {
                l.synced(None);
                out.push(number);
            }
        }
        let mut state = self.state.lock();
        state.entries.retain(|e| !out.contains(&e.number));
        let any = !state.entries.is_empty();
        let mode = if any { ANNOUNCED } else { REFUSED };
        let _ = self
            .mode
            .compare_exchange(TRACKED, mode, Ordering::SeqCst, Ordering::SeqCst);
        any
    }

    /// The server refused the channels `prefix`'s changes are announced
    /// on (an ACL without them): its listeners go, never in sync again
    /// (their L1s do not serve), and the others go on.
    pub(super) fn refuse_prefix(&self, prefix: &str, error: &BackendError) {
        let gone: Vec<Arc<dyn ChangeListener>> = {
            let mut state = self.state.lock();
            let (gone, kept): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut state.entries)
                .into_iter()
                .partition(|e| e.prefix == prefix);
            state.entries = kept;
            gone.iter().filter_map(|e| e.listener.upgrade()).collect()
        };
        if gone.is_empty() {
            return;
        }
        tracing::warn!(
            prefix,
            %error,
            "L1: the server refuses the channels of this namespace's announced changes (grant \
             them to the ACL user, see the Redis guide): its L1 does not serve"
        );
        for l in gone {
            l.synced(None);
        }
    }

    /// The prefix `key` starts with, of a live registration.
    pub(super) fn prefix_of(&self, key: &[u8]) -> Option<String> {
        self.state
            .lock()
            .entries
            .iter()
            .find(|e| key.starts_with(e.prefix.as_bytes()))
            .map(|e| e.prefix.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: Duration = Duration::from_millis(50);

    #[derive(Default)]
    struct Heard(Mutex<Vec<String>>);

    impl ChangeListener for Heard {
        fn changed(&self, value_key: &[u8]) {
            self.0
                .lock()
                .push(String::from_utf8_lossy(value_key).into());
        }
        fn reset(&self) {
            self.0.lock().push("reset".into());
        }
        fn synced(&self, at: Option<Instant>) {
            self.0.lock().push(format!("synced {}", at.is_some()));
        }
    }

    fn listener() -> (Arc<Heard>, Weak<dyn ChangeListener>) {
        let heard = Arc::new(Heard::default());
        let as_listener: Arc<dyn ChangeListener> = heard.clone();
        let weak = Arc::downgrade(&as_listener);
        drop(as_listener);
        (heard, weak)
    }

    fn heard(h: &Heard) -> Vec<String> {
        std::mem::take(&mut *h.0.lock())
    }

    #[test]
    fn reports_reach_the_listeners_of_their_prefix() {
        let tracked = Tracked::new();
        let (users, u) = listener();
        let (orders, o) = listener();
        assert_eq!(tracked.add("users:{", EVERY, u, None).ok(), Some(true));
        assert_eq!(tracked.add("orders:{", EVERY, o, None).ok(), Some(false));
        tracked.changed(b"users:{1}");
        tracked.changed(b"orders:{2}");
        assert_eq!(heard(&users), ["users:{1}"]);
        assert_eq!(heard(&orders), ["orders:{2}"]);
        tracked.reset_all();
        assert_eq!(heard(&users), ["reset"]);
        assert_eq!(heard(&orders), ["reset"]);
    }

    #[test]
    fn a_confirmation_counts_only_for_the_registrations_it_covers() {
        let tracked = Tracked::new();
        let (first, f) = listener();
        tracked.add("a:{", EVERY, f, None).unwrap();
        let taken = tracked.all();
        assert_eq!(
            (taken.prefixes.as_slice(), taken.covers),
            (&["a:{".to_owned()][..], 1)
        );
        // Registered after the connection took its prefixes on.
        let (second, s) = listener();
        tracked.add("b:{", EVERY, s, None).unwrap();
        let at = Instant::now();
        tracked.synced(Some(Confirmed { at, covers: 1 }));
        assert_eq!(heard(&first), ["synced true"]);
        assert_eq!(heard(&second), ["synced false"]);
        // The connection takes the new prefix on, once.
        let (same, s2) = listener();
        tracked.add("b:{", EVERY, s2, None).unwrap();
        let mut taken: HashSet<String> = taken.prefixes.into_iter().collect();
        let more = tracked.after(1, &taken);
        assert_eq!(
            (more.prefixes.as_slice(), more.covers),
            (&["b:{".to_owned()][..], 3)
        );
        taken.extend(more.prefixes);
        tracked.reset(1, 3);
        assert_eq!(heard(&first), Vec::<String>::new());
        assert_eq!(heard(&second), ["reset"]);
        assert_eq!(heard(&same), ["reset"]);
        tracked.synced(Some(Confirmed { at, covers: 3 }));
        assert_eq!(heard(&second), ["synced true"]);
        // A prefix taken on already is not sent again, even once the
        // registration that brought it is gone.
        drop(first);
        assert!(tracked.after(3, &taken).prefixes.is_empty());
        let (_again, a) = listener();
        tracked.add("a:{", EVERY, a, None).unwrap();
        let more = tracked.after(3, &taken);
        assert_eq!((more.prefixes.len(), more.covers), (0, 4));
    }

    #[test]
    fn the_tasks_stop_with_the_last_listener_and_start_again() {
        let tracked = Tracked::new();
        let (one, l) = listener();
        assert_eq!(tracked.add("a:{", EVERY, l, None).ok(), Some(true));
        assert!(tracked.keep_going());
        drop(one);
        assert!(!tracked.keep_going());
        let (_two, l) = listener();
        assert_eq!(tracked.add("a:{", EVERY, l, None).ok(), Some(true));
    }
}
