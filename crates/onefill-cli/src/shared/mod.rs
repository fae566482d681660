//! What more than one command uses: results on stdout, progress on stderr,
//! latency percentiles, URLs fit to print.

pub mod output;
pub mod percentile;
pub mod progress;
pub mod urls;
