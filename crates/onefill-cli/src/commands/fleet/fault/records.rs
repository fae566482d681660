//! What the fault analyses and the HTML report read: the workers' calls
//! and loads on the parent's clock, and the shape of the run they are
//! measured against.

/// Added to `ttl + grace` for the age limit of an answer: the longest a
/// fill may take after its load ends (the default backend timeout).
pub const AGE_SLACK_MS: u64 = 250;
/// The least slow limit, whatever the load time.
pub const SLOW_FLOOR_MS: f64 = 100.0;

/// One call, on the parent's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallRecord {
    /// When it started, ms after the parent's "go".
    pub started_ms: f64,
    /// Index of its key in the run's keys.
    pub key: usize,
    /// Its outcome code (`fleet::outcome`).
    pub outcome: u64,
    /// How long it took, ms.
    pub latency_ms: f64,
    /// Age of the value it answered, ms (0 for an error).
    pub age_ms: u64,
}

/// One load, on the parent's clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadRecord {
    /// When it started, ms after the parent's "go".
    pub started_ms: f64,
    /// Index of its key in the run's keys.
    pub key: usize,
    /// When it ended (or was dropped), ms after the parent's "go"; `None`
    /// if its worker did not say.
    pub ended_ms: Option<f64>,
}

/// The shape of the run the figures are measured against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunShape {
    /// Keys of the run.
    pub keys: usize,
    /// `--duration-ms`.
    pub duration_ms: u64,
    /// `--ttl-ms`.
    pub ttl_ms: u64,
    /// `--grace-ms`.
    pub grace_ms: u64,
    /// `--load-ms`.
    pub load_ms: u64,
}

impl RunShape {
    /// `ttl + grace + 250 ms`.
    pub fn age_limit_ms(&self) -> u64 {
        self.ttl_ms + self.grace_ms + AGE_SLACK_MS
    }

    /// `max(100 ms, 2 × load)`, the floor of the slow limit.
    pub fn slow_limit_ms(&self) -> f64 {
        SLOW_FLOOR_MS.max(2.0 * self.load_ms as f64)
    }

    /// The loads one key needs over `ms` of steady demand: one per
    /// `ttl + load`.
    pub fn ideal_loads(&self, keys: usize, ms: f64) -> f64 {
        keys as f64 * ms / (self.ttl_ms + self.load_ms) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_age_limit_and_slow_limit_follow_the_run() {
        let s = RunShape {
            keys: 4,
            duration_ms: 10_000,
            ttl_ms: 1_000,
            grace_ms: 5_000,
            load_ms: 200,
        };
        assert_eq!(s.age_limit_ms(), 6_250);
        assert_eq!(s.slow_limit_ms(), 400.0);
    }
}
