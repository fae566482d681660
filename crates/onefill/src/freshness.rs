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
/// value is served (fresh) older than that.
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
/// plus a fifth of it (a load somewhat slower than the last one still lands
/// in time) plus [`ROUND_TRIPS`]: a refresh started then is stored shortly
/// before the value would have expired, so nobody waits for it and the key
/// still loads about once per TTL. The lease makes it one refresh
/// fleet-wide. The window never exceeds `cap` (half the shortest TTL
/// written), or a value would be due as soon as it is stored and a hot key
/// would reload back to back.
///
/// Deterministic on purpose (decision 0007): XFetch's random draw
/// (`delta · beta · −ln u`) is made by every call, and at hundreds of calls
/// per TTL the earliest draw comes long before expiry: a hot key loaded
/// 16–17 times in 10 s instead of 11.
///
/// Returns `None` when early refresh is off (`beta == 0` or no measured
/// delta) or the value is not due yet.
pub(crate) fn early_refresh(
    fresh_for: Duration,
    delta: Duration,
    beta: f64,
    cap: Duration,
) -> Option<Duration> {
    // Most reads are far from expiry: no window can reach them.
    if beta <= 0.0 || delta.is_zero() || fresh_for > cap {
        return None;
    }
    let ahead = Duration::try_from_secs_f64(delta.as_secs_f64() * beta).unwrap_or(Duration::MAX);
    let window = ahead
        .saturating_add(ahead / 5)
        .saturating_add(ROUND_TRIPS)
        .min(cap);
    (fresh_for <= window).then_some(window)
}

/// The cap of the early-refresh window for values written with `ttl` and
/// `jitter`: half the shortest TTL written.
pub(crate) fn early_refresh_cap(ttl: Duration, jitter: f64) -> Duration {
    ttl.mul_f64((1.0 - jitter.clamp(0.0, 1.0)) / 2.0)
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

    const NO_CAP: Duration = Duration::MAX;

    #[test]
    fn early_refresh_is_off_without_beta_or_delta() {
        let second = Duration::from_secs(1);
        assert_eq!(early_refresh(Duration::ZERO, second, 0.0, NO_CAP), None);
        assert_eq!(
            early_refresh(Duration::ZERO, Duration::ZERO, 1.0, NO_CAP),
            None
        );
    }

    /// One refresh per expiry, started shortly before it,
    /// whatever the call rate: not before `1.2 × beta × delta` (+ round
    /// trips) of fresh time is left, always once it is.
    #[test]
    fn early_refresh_starts_a_load_time_before_expiry() {
        let delta = Duration::from_millis(100);
        let due = |fresh_ms: u64, beta| {
            early_refresh(Duration::from_millis(fresh_ms), delta, beta, NO_CAP)
        };
        for _ in 0..10_000 {
            assert_eq!(due(126, 1.0), None, "too early, at any call rate");
        }
        assert_eq!(due(125, 1.0), Some(Duration::from_millis(125)));
        assert_eq!(due(0, 1.0), Some(Duration::from_millis(125)));
        assert_eq!(due(245, 2.0), Some(Duration::from_millis(245)));
        assert_eq!(due(246, 2.0), None);
        // A huge beta covers any remaining time without overflowing.
        assert!(early_refresh(Duration::MAX, Duration::MAX, 100.0, NO_CAP).is_some());
    }

    /// Regression: with a window as long as the TTL, every
    /// fill was due as soon as it landed, and a hot key reloaded back to
    /// back (29 loads in 3 s at ttl 1 s, beta 100).
    #[test]
    fn the_window_is_at_most_half_the_shortest_ttl() {
        let cap = early_refresh_cap(Duration::from_secs(1), 0.1);
        assert_eq!(cap, Duration::from_millis(450));
        let delta = Duration::from_millis(100);
        assert_eq!(
            early_refresh(Duration::from_millis(900), delta, 100.0, cap),
            None
        );
        assert_eq!(
            early_refresh(Duration::from_millis(450), delta, 100.0, cap),
            Some(cap)
        );
    }
}
