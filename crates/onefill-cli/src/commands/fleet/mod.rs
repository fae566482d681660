//! `onefill fleet`: real worker processes against a real Redis.
//!
//! [`command`] is the subcommand: its flags ([`args`]) made into a run, run
//! by [`run`] (which `demo --redis` uses too), and printed ([`report`]).
//! A run starts `--processes` copies of this binary as the hidden
//! `onefill worker` ([`worker`]), which [`protocol`] and the run's JSON tie
//! to the parent; the parent reads the servers directly ([`redis_admin`]).
//! With `--cluster --fault` (or `--sentinel --fault`), a thread of the
//! parent faults one master (the primary) in the middle of a steady run and the report gets a `fault` section worked out
//! from the workers' call logs ([`fault`], [`outcome`]); with `--fault
//! kill-holder|stop-holder` it faults the worker holding a lease in a herd,
//! and the report gets a `holder_fault` section. With `--report FILE` the
//! run is also written as an HTML page of charts ([`html`]). With `--chaos`,
//! the workers read random keys through an L1 while the parent changes
//! them, and every answer is checked against the server's history
//! ([`chaos`]). With `--expire-at-ms` or `--invalidate-at-ms`, a thread of
//! the parent makes that write of the run's first key in the middle of a
//! steady run ([`writer`]) and the report gets a `write` section
//! ([`written`]).
//!
//! The files only look down. At the bottom `protocol`, `outcome` and
//! `fault` (which reads `outcome`'s codes), and `written` (which reads them
//! and the fault's records); then `args` (which names a
//! fault's kind); then `report`, `redis_admin`, `connections` and
//! `processes`; then `chaos` (which uses the connections and the fault's
//! topology) and `writer` (which uses the connections); then `worker` and
//! `run`, which build on all of those; `html`
//! over `report` and `args`; `command` on top, over `run`, `html` and
//! `chaos`. Nothing here imports this
//! file or the command line.

pub mod args;
mod chaos;
pub mod command;
mod connections;
mod fault;
mod html;
mod outcome;
mod processes;
mod protocol;
mod redis_admin;
mod report;
pub mod run;
pub mod worker;
mod writer;
mod written;
