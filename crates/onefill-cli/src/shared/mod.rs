//! What more than one command uses: progress on stderr, latency percentiles.

pub mod percentile;
pub mod progress;
