//! Processes on one [`MemoryBackend`] whose lease holders can be watched,
//! for tests of the waiting side (feature `test-support`).
//!
//! The memory backend alone cannot tell whether a holder is alive (every
//! cache on it lives in one process). [`Processes`] gives each simulated
//! process a handle, [`ProcessBackend`], whose lease tokens name it and
//! whose [`watch_holder`](Backend::watch_holder) answers from a registry the
//! test controls: [`Processes::kill`] is a process whose connections
//! closed (its watchers learn it at once), [`Processes::freeze`] one that
//! stopped (its watchers judge it frozen at once: the test chooses when).
//! What a process does once killed or frozen is the test's business: it
//! keeps running, so a wrong verdict's cost (a fenced fill) shows.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::backend::{
    Acquired, Backend, ChangeListener, FillKeys, FillSubscription, Gone, HolderWatch, LeaseRequest,
    Mark, MarkKind, Stored, Watch,
};
use crate::{BackendError, LeaseToken, MemoryBackend};

/// What a process's watchers see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Alive,
    Gone(Gone),
}

/// The simulated processes on one store; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct Processes {
    store: MemoryBackend,
    lives: Arc<Mutex<HashMap<String, watch::Sender<Life>>>>,
}

impl Processes {
    /// Processes on `store`.
    pub fn new(store: MemoryBackend) -> Processes {
        Processes {
            store,
            lives: Arc::default(),
        }
    }

    /// The handle of the process `name` (alive), made once per name.
    pub fn process(&self, name: &str) -> ProcessBackend {
        self.lives
            .lock()
            .entry(name.to_owned())
            .or_insert_with(|| watch::channel(Life::Alive).0);
        ProcessBackend {
            store: self.store.clone(),
            name: name.to_owned(),
            lives: self.lives.clone(),
        }
    }

    /// The process `name`'s connections closed: its watchers learn it now.
    pub fn kill(&self, name: &str) {
        self.set(name, Life::Gone(Gone::Dead));
    }

    /// The process `name` went silent: its watchers judge it frozen now.
    pub fn freeze(&self, name: &str) {
        self.set(name, Life::Gone(Gone::Frozen));
    }

    /// The registry forgets the process `name`: its watches lose their
    /// signal (as a waiter's own subscriber connection dropping would), and
    /// new watches of it cannot tell.
    pub fn forget(&self, name: &str) {
        self.lives.lock().remove(name);
    }

    fn set(&self, name: &str, life: Life) {
        if let Some(tx) = self.lives.lock().get(name) {
            tx.send_replace(life);
        }
    }
}

/// One simulated process's handle on the store (see [`Processes`]).
#[derive(Debug, Clone)]
pub struct ProcessBackend {
    store: MemoryBackend,
    name: String,
    lives: Arc<Mutex<HashMap<String, watch::Sender<Life>>>>,
}

/// A watch of one simulated process.
struct Watching(watch::Receiver<Life>);

#[async_trait]
impl HolderWatch for Watching {
    async fn gone(&mut self) -> Option<Gone> {
        loop {
            if let Life::Gone(gone) = *self.0.borrow_and_update() {
                return Some(gone);
            }
            if self.0.changed().await.is_err() {
                return None;
            }
        }
    }
}

#[async_trait]
impl Backend for ProcessBackend {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        self.store.get(keys).await
    }
    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        self.store
            .acquire(keys, token, lease_ttl, refresh_window)
            .await
    }
    async fn acquire_many(
        &self,
        requests: &[LeaseRequest],
        lease_ttl: Duration,
    ) -> Vec<Result<Acquired, BackendError>> {
        self.store.acquire_many(requests, lease_ttl).await
    }
    async fn get_many(&self, keys: &[FillKeys]) -> Vec<Result<Option<Stored>, BackendError>> {
        self.store.get_many(keys).await
    }
    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.store.fill(keys, token, bytes, ttl).await
    }
    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        self.store.release(keys, token, entry).await
    }
    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.store.extend(keys, token, lease_ttl).await
    }
    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        self.store.set(keys, bytes, ttl).await
    }
    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        self.store.invalidate(keys).await
    }
    async fn invalidate_older_than(
        &self,
        keys: &FillKeys,
        age: Duration,
    ) -> Result<bool, BackendError> {
        self.store.invalidate_older_than(keys, age).await
    }
    async fn expire(&self, keys: &FillKeys) -> Result<(), BackendError> {
        self.store.expire(keys).await
    }
    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        self.store.subscribe(keys).await
    }
    async fn mark(
        &self,
        gen_key: &str,
        mark_key: &str,
        kind: MarkKind,
        retention: Option<Duration>,
    ) -> Result<u64, BackendError> {
        self.store.mark(gen_key, mark_key, kind, retention).await
    }
    async fn read_marks(
        &self,
        gen_key: &str,
        mark_keys: &[&str],
    ) -> Result<(u64, Vec<Mark>), BackendError> {
        self.store.read_marks(gen_key, mark_keys).await
    }
    fn track_changes(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: Weak<dyn ChangeListener>,
    ) -> Result<(), BackendError> {
        self.store.track_changes(prefix, confirm_every, listener)
    }
    fn in_process(&self) -> bool {
        self.store.in_process()
    }

    /// A token naming this process.
    fn new_token(&self, _keys: &FillKeys) -> LeaseToken {
        LeaseToken::for_holder(&self.name)
    }

    /// The lease re-checked (as the Redis backend does, after the
    /// subscription), then the registry's word on the holder.
    async fn watch_holder(
        &self,
        keys: &FillKeys,
        holder: &LeaseToken,
    ) -> Result<Watch, BackendError> {
        let holds = self
            .store
            .get_raw(keys.lock())
            .is_some_and(|(token, _)| token == holder.as_bytes());
        if !holds {
            return Ok(Watch::Moved);
        }
        let Some(name) = holder.holder() else {
            return Ok(Watch::Unsupported);
        };
        let Some(mut life) = self.lives.lock().get(name).map(watch::Sender::subscribe) else {
            return Ok(Watch::Unsupported);
        };
        let now = *life.borrow_and_update();
        Ok(match now {
            Life::Gone(gone) => Watch::Gone(gone),
            Life::Alive => Watch::Alive(Box::new(Watching(life))),
        })
    }

    async fn take_over(
        &self,
        keys: &FillKeys,
        gone: &LeaseToken,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        self.store
            .take_over(keys, gone, token, lease_ttl, refresh_window)
            .await
    }
}
