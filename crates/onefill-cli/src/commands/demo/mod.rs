//! `onefill demo`: the herd under three strategies, then the lesson.
//!
//! In this process on the embedded `MemoryBackend` ([`herd`], [`lesson`],
//! printed by [`report`]), or with `--redis URL` as real worker processes of
//! a fleet ([`on_redis`]); [`command`] picks one.

pub mod args;
pub mod command;
mod herd;
mod lesson;
mod on_redis;
mod origin;
mod report;
