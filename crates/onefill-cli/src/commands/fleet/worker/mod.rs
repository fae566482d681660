//! `onefill worker`: one process of a fleet. Started by `onefill fleet`
//! (and `demo --redis`), never by hand: it connects to Redis, optionally
//! waits for a "go" line on stdin so every process starts together, runs its
//! callers, and prints one JSON summary line on stdout.
//!
//! Loads are counted in Redis (a set of load ids next to the value),
//! so the parent can count loads across processes without trusting them.
//!
//! [`process`] is the worker's life (start, handshake, report) and drives
//! [`callers`], which starts each [`caller`] as a task ([`async_caller`])
//! or an OS thread on the blocking cache ([`blocking_caller`]); their
//! loaders load from the simulated [`origin`], which counts each load with
//! the [`load_counter`] and logs it in the [`load_log`]; the [`sampler`]
//! samples the cache, and [`summary`] sums the calls up.

mod async_caller;
mod blocking_caller;
mod caller;
mod callers;
mod load_counter;
mod load_log;
mod origin;
pub mod process;
mod sampler;
mod summary;
