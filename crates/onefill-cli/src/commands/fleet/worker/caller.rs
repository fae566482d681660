//! One caller, of either kind: the key it asks for, the origin its loader
//! loads from, and how long the worker waits for its answer.

use std::time::{Duration, Instant};

use super::origin::Origin;

/// What a caller is given.
pub struct Caller {
    /// The key's index in the run's keys.
    pub key_index: usize,
    pub key: String,
    pub origin: Origin,
    /// The worker's t = 0, which calls are logged from.
    pub epoch: Instant,
    /// How long the worker waits for the answer before it counts the call
    /// as an error.
    pub patience: Duration,
}

/// An answer: the outcome's name and the value, or what went wrong.
pub type Answer = Result<(&'static str, String), String>;
