//! The steps a flight may take together with other flights.
//!
//! A flight runs the one per-key protocol whoever drives it. Alone (a
//! single call), it makes each backend call and runs its load itself. In a
//! batch, the flights of the batch's keys run side by side, and three of
//! their steps are worth making together: the read, the lease request and
//! the load (one pipeline per shard, one call of the batch's loader). A
//! flight in a group hands those steps to the group, which answers each on
//! the flight's own reply channel; everything else (the wait, the fill, the
//! release, what an answer means) the flight does as it would alone.
//!
//! This is the seam between the protocol and a driver: the flight sees
//! only this trait, and the batch, which drives flights, implements it.

use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::Stored;
use crate::error::{BackendError, Error};
use crate::key::FillKeys;
use crate::lease::Acquisition;
use crate::loader::Done;
use crate::token::LeaseToken;

/// Where a step's answer goes.
pub(crate) type Reply<T> = oneshot::Sender<T>;

/// Steps made together with the other flights of a group.
///
/// Each call only queues the step: the group makes the queued steps once
/// every flight of the group is waiting on something, so steps that
/// become due at the same moment go to the backend (or the loader)
/// together. A reply that cannot be delivered (its flight is gone) is
/// dropped; a lease won for it is released by the lease's drop.
pub(crate) trait Group<V>: Send + Sync {
    /// Reads `keys` (as [`Backend::get`](crate::Backend::get)) within
    /// `timeout`.
    fn read(
        &self,
        keys: &FillKeys,
        timeout: Duration,
        reply: Reply<Result<Option<Stored>, BackendError>>,
    );

    /// Asks for the lease of `keys` (as
    /// [`Backend::acquire`](crate::Backend::acquire), with `token`, fresh
    /// for this request) within `timeout`.
    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &self,
        keys: &FillKeys,
        token: LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
        timeout: Duration,
        reply: Reply<Result<Acquisition, BackendError>>,
    );

    /// Loads the value of the user key `key` (the flight has its place in
    /// the process's loads already: only the loader call is shared).
    fn load(&self, key: &str, reply: Reply<Result<Done<V>, Error>>);
}

/// A reply that never came: the group was dropped before it made the step
/// (its task ended with the runtime).
pub(crate) fn step_dropped() -> BackendError {
    BackendError::new(
        crate::error::BackendErrorKind::Protocol,
        "the batch ended before it made this step",
    )
}
