//! What more than one command uses: the limits and parsers of shared flags,
//! results on stdout, progress on stderr, latency percentiles, URLs fit to
//! print. Nothing here imports a command.

pub mod args;
pub mod output;
pub mod percentile;
pub mod progress;
pub mod urls;
