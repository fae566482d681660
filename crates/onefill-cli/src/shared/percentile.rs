//! Latency percentiles, for the demo's table and each worker's report.

use std::time::Duration;

/// The `p`-th percentile (0 to 100) of `sorted` (ascending), by nearest
/// rank: the smallest sample with at least `p` % of the samples at or below
/// it. `None` for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let p = if p.is_nan() {
        100.0
    } else {
        p.clamp(0.0, 100.0)
    };
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms_list(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn percentile_of_nothing_is_none() {
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn percentile_uses_the_nearest_rank() {
        let hundred = ms_list(&(1..=100).collect::<Vec<_>>());
        let at = |p| percentile(&hundred, p).map(|d| d.as_millis());
        assert_eq!(at(50.0), Some(50));
        assert_eq!(at(99.0), Some(99));
        assert_eq!(at(99.5), Some(100));
        assert_eq!(at(100.0), Some(100));
        assert_eq!(at(0.0), Some(1));
        assert_eq!(at(1.0), Some(1));
        assert_eq!(at(1.5), Some(2));
    }

    #[test]
    fn percentile_of_small_samples() {
        let one = ms_list(&[7]);
        for p in [0.0, 50.0, 99.0, 100.0] {
            assert_eq!(percentile(&one, p), Some(Duration::from_millis(7)));
        }
        let four = ms_list(&[10, 20, 30, 40]);
        assert_eq!(percentile(&four, 50.0), Some(Duration::from_millis(20)));
        assert_eq!(percentile(&four, 51.0), Some(Duration::from_millis(30)));
        assert_eq!(percentile(&four, 99.0), Some(Duration::from_millis(40)));
    }

    #[test]
    fn percentile_clamps_odd_inputs() {
        let three = ms_list(&[1, 2, 3]);
        assert_eq!(percentile(&three, -5.0), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&three, 250.0), Some(Duration::from_millis(3)));
        assert_eq!(percentile(&three, f64::NAN), Some(Duration::from_millis(3)));
    }
}
