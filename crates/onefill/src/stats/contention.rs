//! The "contention approaches the request rate" guard rail.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::stripe::{stripe, Padded, STRIPES};

/// The "contention approaches the request rate" guard rail: flights and
/// waits in the current 10 s window, counted since the window's first wait
/// (the window moves on when a wait sees it changed: a flight, on every
/// hit, only adds one to its thread's stripe, with no clock read).
#[derive(Debug)]
pub(super) struct Contention {
    epoch: std::time::Instant,
    window: AtomicU64,
    flights: [Padded; STRIPES],
    waits: AtomicU64,
    warned_window: AtomicU64,
}

const CONTENTION_WINDOW: Duration = Duration::from_secs(10);
const CONTENTION_MIN_FLIGHTS: u64 = 20;

impl Contention {
    pub(super) fn new() -> Self {
        Contention {
            epoch: std::time::Instant::now(),
            window: AtomicU64::new(0),
            flights: std::array::from_fn(|_| Padded::default()),
            waits: AtomicU64::new(0),
            warned_window: AtomicU64::new(u64::MAX),
        }
    }

    /// Moves to the current window, resetting the counts when it changed.
    fn roll(&self) -> u64 {
        let now = (self.epoch.elapsed().as_millis() / CONTENTION_WINDOW.as_millis()) as u64;
        let seen = self.window.load(Relaxed);
        if now != seen
            && self
                .window
                .compare_exchange(seen, now, Relaxed, Relaxed)
                .is_ok()
        {
            for flights in &self.flights {
                flights.0.store(0, Relaxed);
            }
            self.waits.store(0, Relaxed);
        }
        now
    }

    pub(super) fn flight(&self) {
        self.flights[stripe()].0.fetch_add(1, Relaxed);
    }

    /// Records a wait; true the first time in a window that waits reach
    /// half of the flights.
    pub(super) fn wait(&self) -> bool {
        let window = self.roll();
        let waits = self.waits.fetch_add(1, Relaxed) + 1;
        let flights: u64 = self.flights.iter().map(|f| f.0.load(Relaxed)).sum();
        flights >= CONTENTION_MIN_FLIGHTS
            && waits * 2 >= flights
            && self.warned_window.swap(window, Relaxed) != window
    }
}
