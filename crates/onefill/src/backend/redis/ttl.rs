//! Durations to and from the whole milliseconds Redis speaks (`PX`, `PTTL`
//! and the scripts' arguments).

use std::time::Duration;

/// The TTL reported for a key that has no expiry (`PTTL` answers -1): 100
/// years. Values written through onefill always expire; this only shows up
/// for keys written by someone else.
pub const NO_EXPIRY_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Millisecond arguments are capped here (about 35 700 years), so that Lua's
/// doubles compare them exactly and `PX` never overflows the server clock.
const MAX_MS: u64 = 1 << 50;

/// Whole milliseconds, rounded up, capped at [`MAX_MS`].
pub(super) fn ms_ceil(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).min(MAX_MS)
}

/// A `PX` argument: at least 1 ms.
pub(super) fn px(d: Duration) -> u64 {
    ms_ceil(d).max(1)
}

/// A `PTTL` answer as a TTL: -1 (no expiry) is [`NO_EXPIRY_TTL`], -2 (no
/// such key) is `None`.
pub(super) fn ttl_from_ms(ms: i64) -> Option<Duration> {
    match ms {
        -1 => Some(NO_EXPIRY_TTL),
        ms if ms >= 0 => Some(Duration::from_millis(ms as u64)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_become_whole_milliseconds() {
        assert_eq!(ms_ceil(Duration::ZERO), 0);
        assert_eq!(px(Duration::ZERO), 1);
        assert_eq!(px(Duration::from_micros(1)), 1);
        assert_eq!(px(Duration::from_micros(1001)), 2);
        assert_eq!(px(Duration::from_secs(3)), 3000);
        assert_eq!(ms_ceil(Duration::MAX), MAX_MS);
        assert!(NO_EXPIRY_TTL.as_millis() < u128::from(MAX_MS));
    }

    #[test]
    fn pttl_answers_become_ttls() {
        assert_eq!(ttl_from_ms(1500), Some(Duration::from_millis(1500)));
        assert_eq!(ttl_from_ms(0), Some(Duration::ZERO));
        assert_eq!(ttl_from_ms(-1), Some(NO_EXPIRY_TTL));
        assert_eq!(ttl_from_ms(-2), None);
    }
}
