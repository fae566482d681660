//! `fleet --cluster --fault`: injecting one fault into a Redis Cluster in
//! the middle of a steady run, and what callers saw of it.
//!
//! The parent computes the slot of every key's value key before the run
//! ([`topology::key_slots`]); the [`injector`] thread faults the victim at
//! `--fault-at-ms` (by [`signals`] for `kill` and `hang`) and watches for
//! its replacement. What callers saw is worked out from the workers' logs
//! ([`records`]) by a pure function ([`analysis`]) into the report's
//! `fault` section ([`report`]).
//!
//! The files only look down: `kind` and `topology` import nothing of the
//! others; `signals` reads the topology; `injector` uses all three;
//! `records` is plain data; `report` names the kind; `analysis` reads
//! records and writes the report.

pub mod analysis;
pub mod injector;
pub mod kind;
pub mod records;
pub mod report;
mod signals;
pub mod topology;
