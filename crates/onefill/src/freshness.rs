//! Freshness decisions: TTL jitter, the grace window and early refresh
//! (refresh-ahead, a load time before expiry).
//!
//! All of them are computed from what the *server* reports (the remaining
//! TTL) and what the envelope records (grace, delta), never from a client
//! clock, so clock skew between processes cannot matter.

use std::time::Duration;

/// The TTL to write: `ttl` shortened by up to `jitter·ttl`, plus the grace
/// window. Jitter spreads the expiry of keys filled together so they do not
/// expire together; it only shortens, so `ttl` stays what it promises: no
/// value is served (fresh) older than that (issue 9).
pub(crate) fn written_ttl(ttl: Duration, jitter: f64, grace: Duration) -> Duration {
    let spread = if jitter > 0.0 {
        1.0 - jitter * rand::random::<f64>()
    } else {
        1.0
    };
    ttl.mul_f64(spread).max(Duration::from_millis(1)) + grace
}

/// Covers the two round trips of a refresh (its `acquire` and its `fill`)
/// on top of the load itself.
const ROUND_TRIPS: Duration = Duration::from_millis(5);

/// Refresh-ahead: whether a value with `fresh_for` left should be refreshed
/// now, and the window to hand to `acquire` so the server applies the same
/// test. The window is `beta × delta` (the time the value's last load took)
/// plus [`ROUND_TRIPS`]: a refresh started then is stored about when the
/// value would have expired, so nobody waits for it and the key still loads
/// once per TTL. The lease makes it one refresh fleet-wide.
///
/// Deterministic on purpose (decision 0007): XFetch's random draw
/// (`delta · beta · −ln u`) is made by every call, and at hundreds of calls
/// per TTL the earliest draw comes long before expiry: a hot key loaded
/// 16 times in 10 s instead of 10.
///
/// Returns `None` when early refresh is off (`beta == 0` or no measured
/// delta) or the value is not due yet.
pub(crate) fn early_refresh(fresh_for: Duration, delta: Duration, beta: f64) -> Option<Duration> {
    if beta <= 0.0 || delta.is_zero() {
        return None;
    }
    let ahead = Duration::try_from_secs_f64(delta.as_secs_f64() * beta).unwrap_or(Duration::MAX);
    let window = ahead.saturating_add(ROUND_TRIPS);
    (fresh_for <= window).then_some(window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_fraction() {
        let ttl = Duration::from_secs(100);
        let grace = Duration::from_secs(10);
        let mut seen_low = false;
        let mut seen_high = false;
        for _ in 0..2000 {
            let t = written_ttl(ttl, 0.1, grace);
            assert!(
                t > Duration::from_secs(100) && t <= Duration::from_secs(110),
                "never longer than ttl + grace: {t:?}"
            );
            seen_low |= t < Duration::from_secs(102);
            seen_high |= t > Duration::from_secs(108);
        }
        assert!(
            seen_low && seen_high,
            "jitter should spread over its fraction"
        );
        assert_eq!(written_ttl(ttl, 0.0, grace), Duration::from_secs(110));
    }

    #[test]
    fn early_refresh_is_off_without_beta_or_delta() {
        let second = Duration::from_secs(1);
        assert_eq!(early_refresh(Duration::ZERO, second, 0.0), None);
        assert_eq!(early_refresh(Duration::ZERO, Duration::ZERO, 1.0), None);
    }

    /// Issue 9, item 4: one refresh per expiry, started shortly before it,
    /// whatever the call rate: not before `beta × delta` (+ round trips)
    /// of fresh time is left, always once it is.
    #[test]
    fn early_refresh_starts_a_load_time_before_expiry() {
        let delta = Duration::from_millis(100);
        let due = |fresh_ms: u64, beta| early_refresh(Duration::from_millis(fresh_ms), delta, beta);
        for _ in 0..10_000 {
            assert_eq!(due(106, 1.0), None, "too early, at any call rate");
        }
        assert_eq!(due(105, 1.0), Some(Duration::from_millis(105)));
        assert_eq!(due(0, 1.0), Some(Duration::from_millis(105)));
        assert_eq!(due(205, 2.0), Some(Duration::from_millis(205)));
        assert_eq!(due(206, 2.0), None);
        // A huge beta covers any remaining time without overflowing.
        assert!(early_refresh(Duration::MAX, Duration::MAX, 100.0).is_some());
    }
}
