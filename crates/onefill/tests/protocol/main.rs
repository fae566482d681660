//! The protocol on the embedded backend, one file per feature (most in
//! paused tokio time; a few cases run again on a private Redis): built as
//! one test binary, so the library's generic code is compiled and linked
//! once for all of them rather than once per file. Run one file's tests
//! with a filter: `cargo test -p onefill --test protocol soft_timeout::`.

#[path = "../batch_support/mod.rs"]
mod batch_support;
#[path = "../support/mod.rs"]
mod support;

mod batch_memory;
mod borrowed_keys;
mod guard_rails;
mod input;
mod l1_memory;
mod leases;
mod liveness;
mod loader_errors;
mod loader_freshness;
mod marks;
mod no_store;
mod outage_memory;
mod replays;
mod round_trip;
mod soft_timeout;
mod stale_lives;
mod stale_refresh;
mod third_party_backend;
mod unreplicated;
mod wait_pacing;
mod writes;
