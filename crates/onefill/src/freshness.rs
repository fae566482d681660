//! Freshness decisions: TTL jitter, the grace window and probabilistic early
//! refresh (XFetch).
//!
//! All of them are computed from what the *server* reports (the remaining
//! TTL) and what the envelope records (grace, delta), never from a client
//! clock, so clock skew between processes cannot matter.

use std::time::Duration;

/// The TTL to write: `ttl ± jitter·ttl`, plus the grace window. Jitter spreads
/// the expiry of keys filled together so they do not expire together.
pub(crate) fn written_ttl(ttl: Duration, jitter: f64, grace: Duration) -> Duration {
    let spread = if jitter > 0.0 {
        1.0 + jitter * (2.0 * rand::random::<f64>() - 1.0)
    } else {
        1.0
    };
    ttl.mul_f64(spread).max(Duration::from_millis(1)) + grace
}

/// The XFetch draw (Vattani, Chierichetti, Lowenstein, VLDB 2015): a window
/// `delta · beta · (−ln u)`, `u` uniform in (0, 1]. A value whose remaining
/// fresh time is inside the window is refreshed now, so the probability of
/// refreshing grows as expiry nears and with how long a load takes.
///
/// Returns `None` when early refresh is off (`beta == 0` or no measured delta).
pub(crate) fn xfetch_window(delta: Duration, beta: f64) -> Option<Duration> {
    if beta <= 0.0 || delta.is_zero() {
        return None;
    }
    // 1 - random() is in (0, 1], so ln() is finite and ≤ 0.
    let u = 1.0 - rand::random::<f64>();
    let gap = delta.as_secs_f64() * beta * -u.ln();
    Some(Duration::try_from_secs_f64(gap).unwrap_or(Duration::MAX))
}

/// Whether a value with `fresh_for` left should be refreshed early, and the
/// window to hand to `acquire` so the server applies the same test.
pub(crate) fn early_refresh(fresh_for: Duration, delta: Duration, beta: f64) -> Option<Duration> {
    xfetch_window(delta, beta).filter(|window| *window >= fresh_for)
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
                t >= Duration::from_secs(100) && t <= Duration::from_secs(120),
                "{t:?}"
            );
            seen_low |= t < Duration::from_secs(105);
            seen_high |= t > Duration::from_secs(115);
        }
        assert!(seen_low && seen_high, "jitter should spread both ways");
        assert_eq!(written_ttl(ttl, 0.0, grace), Duration::from_secs(110));
    }

    #[test]
    fn xfetch_is_off_without_beta_or_delta() {
        assert_eq!(xfetch_window(Duration::from_secs(1), 0.0), None);
        assert_eq!(xfetch_window(Duration::ZERO, 1.0), None);
    }

    #[test]
    fn xfetch_probability_grows_as_expiry_nears() {
        let delta = Duration::from_millis(100);
        let rate = |fresh_for: Duration| {
            (0..20_000)
                .filter(|_| early_refresh(fresh_for, delta, 1.0).is_some())
                .count() as f64
                / 20_000.0
        };
        // P(window >= t) = exp(-t / (delta·beta)).
        let far = rate(Duration::from_millis(500)); // e^-5 ≈ 0.0067
        let near = rate(Duration::from_millis(50)); // e^-0.5 ≈ 0.61
        assert!(far < 0.02, "far from expiry: {far}");
        assert!((0.55..0.67).contains(&near), "near expiry: {near}");
        assert!(early_refresh(Duration::ZERO, delta, 1.0).is_some());
    }
}
