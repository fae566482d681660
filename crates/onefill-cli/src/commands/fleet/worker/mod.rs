//! `onefill worker`: one process of a fleet. Started by `onefill fleet`
//! (and `demo --redis`), never by hand: it connects to Redis, optionally
//! waits for a "go" line on stdin so every process starts together, runs its
//! callers, and prints one JSON summary line on stdout.
//!
//! Loads are counted in Redis (a set of load ids next to the value),
//! so the parent can count loads across processes without trusting them.
//!
//! [`process`] is the worker's life (start, handshake, report) and drives
//! [`callers`]; the callers use the fleet's connections, count their loads
//! with the [`load_counter`], log them in the [`load_log`], sample the
//! cache with the [`sampler`] and are summed up by [`summary`].

mod callers;
mod load_counter;
mod load_log;
pub mod process;
mod sampler;
mod summary;
