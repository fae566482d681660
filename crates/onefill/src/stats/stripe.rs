//! Threads dealt stripes in turn, so counts on the hit path do not take
//! cache lines from each other.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How many stripes the counters are split into.
pub(super) const STRIPES: usize = 8;

/// The calling thread's stripe (threads are dealt stripes in turn).
pub(super) fn stripe() -> usize {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Relaxed) as usize % STRIPES;
    }
    STRIPE.with(|s| *s)
}

/// A count on cache lines of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct Padded(pub(super) AtomicU64);
