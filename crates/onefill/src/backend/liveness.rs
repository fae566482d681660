//! Whether a lease's holder is alive: the types of the three `Backend`
//! methods that tell (see [`HolderWatch`]).

use async_trait::async_trait;

/// Why a watched holder is taken to be gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Gone {
    /// Its process is dead: its connections to the store closed.
    Dead,
    /// Its process is alive but has done nothing it should for too long (a
    /// stopped process, a stalled machine).
    Frozen,
}

/// How a waiter learns that the process holding a lease is gone, before
/// the lease expires.
///
/// A lease's TTL bounds how long a dead holder can block a key, but a TTL
/// long enough for a slow load is long to wait for a holder that died
/// half a second into it. A backend that can tell whether a holder is
/// alive says so through three methods of [`Backend`](super::Backend):
///
/// - [`new_token`](super::Backend::new_token) makes the tokens of this
///   backend's leases name it ([`LeaseToken::for_holder`](crate::LeaseToken::for_holder)), so a waiter
///   knows whom to watch from the lease alone;
/// - [`watch_holder`](super::Backend::watch_holder) starts watching the
///   holder named by the token a waiter found in the lease (made after the
///   waiter subscribed to the key's fills, and re-checking that the lease
///   still holds that token);
/// - [`take_over`](super::Backend::take_over) replaces a lease only if it
///   still holds the token of the holder judged gone, so of the waiters
///   that judged it, one wins.
///
/// A waiter whose holder is watched makes no safety poll: its holder's
/// fill notification (or its word that it lost the lease, which
/// [`fill`](super::Backend::fill) and [`extend`](super::Backend::extend)
/// announce), its watch, the lease's expiry (a live process may leave a
/// lease behind when its release fails) and its deadline wake it. A holder judged gone wrongly (a reconnection, a
/// stall) is fenced as a holder whose lease expired is: its fill finds
/// another token and stores nothing, so a wrong verdict costs at most one
/// more load.
///
/// The defaults watch nothing: a backend without them keeps the lease
/// expiry as its waiters' way to learn of a dead holder.
///
/// A `HolderWatch` is what the watch tells a waiting process: it resolves
/// once the holder is gone, or once the watch can no longer tell.
#[async_trait]
pub trait HolderWatch: Send {
    /// Resolves when the holder is judged gone (`Some`), or when the watch
    /// lost its signal (`None`: the waiter falls back on the lease's
    /// expiry). Cancel-safe: a waiter calls it again after another wake-up.
    async fn gone(&mut self) -> Option<Gone>;
}

/// The answer of [`Backend::watch_holder`](super::Backend::watch_holder).
#[non_exhaustive]
pub enum Watch {
    /// The holder was alive when the watch began; the watch says when that
    /// ends.
    Alive(Box<dyn HolderWatch>),
    /// The holder is gone already.
    Gone(Gone),
    /// The lease no longer holds the holder's token (it was filled,
    /// released, written over or taken over meanwhile): re-check the key.
    Moved,
    /// This backend cannot tell whether the holder is alive (the default).
    Unsupported,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Watch::Alive(_) => f.write_str("Alive"),
            Watch::Gone(gone) => write!(f, "Gone({gone:?})"),
            Watch::Moved => f.write_str("Moved"),
            Watch::Unsupported => f.write_str("Unsupported"),
        }
    }
}
