//! `fleet --fault`: injecting one fault into a Redis Cluster or the primary
//! of a Sentinel set-up in the middle of a steady run, or into the worker
//! holding a lease in a herd, and what callers saw of it.
//!
//! The parent computes the slot of every key's value key before the run
//! ([`topology::key_slots`]); the [`injector`] thread faults the victim at
//! `--fault-at-ms` (by [`signals`] for `kill` and `hang`) and watches for
//! its replacement. What callers saw is worked out from the workers' logs
//! ([`records`]) by a pure function ([`analysis`]) into the report's
//! `fault` section ([`report`]). A lease holder is found and signalled by
//! the [`holder`] injector, and what the other processes saw is worked out
//! by [`holder_report`] into the report's `holder_fault` section.
//!
//! The files only look down: `kind` and `topology` import nothing of the
//! others; `signals` reads the topology; `injector` uses all three;
//! `records` is plain data; `report` names the kind; `analysis` reads
//! records and writes the report; `holder` uses `kind`, `signals` and the
//! topology's connection; `holder_report` reads `holder` and `records`;
//! [`sentinel`], the injector of a Sentinel set-up's primary, uses `kind`,
//! `signals` and the topology's connection.

pub mod analysis;
pub mod holder;
pub mod holder_report;
pub mod injector;
pub mod kind;
pub mod records;
pub mod report;
pub mod sentinel;
mod signals;
pub mod topology;
