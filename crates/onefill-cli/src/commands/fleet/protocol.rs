//! What the parent and its worker processes agree on besides the JSON of
//! the run and of the report: the lines of the start handshake and where
//! the loads are counted in Redis.

use onefill::backend::FillKeys;

/// The line a worker prints once it is connected (with `--sync`).
pub const READY: &str = "ready";
/// The line the parent sends every worker to start them together.
pub const GO: &str = "go";
/// The first word of the line a worker prints instead of `ready` when it
/// cannot start (with `--sync`): the parent prints the reason once for the
/// whole fleet, instead of every worker printing it on stderr.
pub const NOT_READY: &str = "not-ready:";

/// The counter key of `key`'s loads; shares the value's hash tag.
pub fn load_counter_key(namespace: &str, key: &str) -> String {
    format!("{}:loads", FillKeys::new(namespace, key).value())
}
