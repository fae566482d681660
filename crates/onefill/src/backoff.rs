//! Jittered exponential backoff, the one pacing for everything that polls
//! or retries: waiters polling for a fill (and a subscribed waiter's
//! safety-net poll), the Redis subscriber reconnecting, the replay of
//! writes that failed in an outage.

use std::time::Duration;

/// `interval` ±25 %, at random: the jitter of every interval here.
/// Saturates at [`Duration::MAX`] instead of panicking.
pub(crate) fn jittered(interval: Duration) -> Duration {
    let factor = 0.75 + rand::random::<f64>() * 0.5;
    Duration::try_from_secs_f64(interval.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

/// Jittered exponential backoff: each interval is the current base ±25 %,
/// and the base doubles up to `max`.
///
/// The jitter keeps processes that started together (a herd of waiters, a
/// fleet that lost the same server) from polling or reconnecting in
/// lockstep.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    /// Where [`Backoff::reset`] starts over (the Redis subscriber and the
    /// replay task reset; waiters make a new backoff per wait).
    initial: Duration,
    base: Duration,
    max: Duration,
}

impl Backoff {
    /// Starts at `initial` (at most `max`) and doubles up to `max`.
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.min(max);
        Backoff {
            initial,
            base: initial,
            max,
        }
    }

    /// The next interval: the current base ±25 %; the base then doubles,
    /// up to the max. Saturates at [`Duration::MAX`] instead of panicking
    /// however large the max is.
    pub(crate) fn next_interval(&mut self) -> Duration {
        let interval = jittered(self.base);
        self.base = self.base.saturating_mul(2).min(self.max);
        interval
    }

    /// Starts over from the initial interval (after a success).
    pub(crate) fn reset(&mut self) {
        self.base = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn grows_with_jitter_up_to_the_max() {
        let mut b = Backoff::new(ms(20), ms(500));
        let first = b.next_interval();
        assert!(first >= ms(15) && first <= ms(25), "{first:?}");
        let second = b.next_interval();
        assert!(second >= ms(30) && second <= ms(50), "{second:?}");
        for _ in 0..20 {
            assert!(b.next_interval() <= ms(625));
        }
        let late = b.next_interval();
        assert!(late >= ms(375), "{late:?}");
    }

    #[test]
    fn jitter_is_a_quarter_either_way() {
        for _ in 0..100 {
            let j = jittered(ms(2000));
            assert!(j >= ms(1500) && j <= ms(2500), "{j:?}");
        }
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
        assert!(jittered(Duration::MAX) >= Duration::MAX.mul_f64(0.5));
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::new(ms(100), ms(10_000));
        for _ in 0..10 {
            b.next_interval();
        }
        b.reset();
        let first = b.next_interval();
        assert!(first >= ms(75) && first <= ms(125), "{first:?}");
    }

    #[test]
    fn the_initial_interval_is_at_most_the_max() {
        let mut b = Backoff::new(ms(900), ms(100));
        assert!(b.next_interval() <= ms(125));
    }

    #[test]
    fn huge_bounds_saturate_instead_of_panicking() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::MAX);
        for _ in 0..200 {
            b.next_interval();
        }
        assert!(b.next_interval() >= Duration::MAX.mul_f64(0.5));
        let mut b = Backoff::new(Duration::MAX, Duration::MAX);
        let _ = b.next_interval();
    }
}
