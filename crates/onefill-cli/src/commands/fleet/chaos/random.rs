//! A small pseudo-random source for the chaos run's choices (which key,
//! which operation): the picks need no quality beyond being spread and
//! differing between processes, so no dependency is pulled in for them.

use std::time::{SystemTime, UNIX_EPOCH};

/// xorshift64*, seeded from the clock and the process id.
pub struct Random(u64);

impl Random {
    /// A source no other process of the run shares.
    pub fn new() -> Random {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let seed = nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15;
        Random(seed.max(1))
    }

    /// The next number.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` at least 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A number in `range` (inclusive).
    pub fn within(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_stay_in_range_and_spread() {
        let mut r = Random::new();
        let mut seen = [0u32; 4];
        for _ in 0..4_000 {
            seen[r.below(4) as usize] += 1;
            let x = r.within(50, 500);
            assert!((50..=500).contains(&x));
        }
        assert!(seen.iter().all(|&n| n > 500), "{seen:?}");
    }
}
