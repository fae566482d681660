//! `fleet --chaos`: does any answer outlive the server's copy?
//!
//! Each worker reads random keys of a small key space through a cache with
//! an L1 ([`reader`]) and records every answer: the version it carried
//! (every loaded value names its process and load, [`version`]), how it
//! was answered, whether the L1 answered it, and when the call started and
//! ended. Meanwhile the parent acts on the same keys as another client
//! would ([`foreign`]): writes through a cache of its own, raw `DEL`,
//! `PEXPIRE`, `PERSIST` and unreadable `SET`s, each in a script that also
//! returns what the key held before and after, and the server's `TIME`.
//! On a cluster a slot migrates and a master fails over too
//! ([`reshard`]). After the run a pure function ([`check`]) rebuilds each
//! key's history from all that ([`records`]) and counts the answers whose
//! version had certainly left the server more than the bound before the
//! call started ([`report`]). [`drive`] runs it all.
//!
//! The files only look down: `random`, `version` and `records` at the
//! bottom; `reader`, `foreign` and `reshard` record; `check` and `report`
//! read the records; `drive` on top.

pub mod check;
pub mod drive;
mod foreign;
mod random;
pub mod reader;
pub mod records;
pub mod report;
mod reshard;
mod version;
