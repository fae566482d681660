//! The hit: [`Backend::get`](crate::Backend::get) on Redis, and the
//! direct entry a cache calls it by ([`RedisBackend::read_within`]). On a
//! standalone server a plain `GET` when the server's clock, estimated from
//! samples, tells the value is fresh, or stale in its grace window; else
//! the pipelined `GET` + `PTTL`.
//!
//! A key an L1 of this process may keep ([`KeptPrefixes`]) is always read
//! with the pair: the L1 entry, and the outage fallback's copy, then live no
//! longer than the TTL the server has now. A plain `GET` answers what the
//! server holds, but the TTL it reports is the one the value was written
//! with (stamped in it), which another client's `EXPIRE` or `PEXPIRE` may
//! have shortened since; the L1's tracking drops the entry when that
//! happens, and the next read must not bring the written TTL back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::RwLock;

use redis::aio::ConnectionManager;
use redis::RedisError;
use tokio::time::Instant;

use super::errors::classify;
use super::server_clock::{self, Plan};
use super::ttl::ttl_from_ms;
use super::{Conn, RedisBackend};
use crate::backend::{BackendError, FillKeys, Stored};
use crate::deadline;
use crate::envelope;

/// The key prefixes whose values an L1 of this process keeps (each
/// [`Backend::track_changes`](crate::Backend::track_changes) on the backend
/// adds its own): reads of their keys report the server's own TTL.
#[derive(Default)]
pub(super) struct KeptPrefixes {
    /// Whether any prefix was added: the one check a backend with no L1
    /// pays per hit.
    any: AtomicBool,
    prefixes: RwLock<Vec<String>>,
}

impl KeptPrefixes {
    pub(super) fn add(&self, prefix: &str) {
        let mut prefixes = self.prefixes.write();
        if !prefixes.iter().any(|p| p == prefix) {
            prefixes.push(prefix.to_owned());
        }
        self.any.store(true, Ordering::Release);
    }

    fn covers(&self, key: &str) -> bool {
        self.any.load(Ordering::Acquire)
            && self
                .prefixes
                .read()
                .iter()
                .any(|p| key.starts_with(p.as_str()))
    }
}

impl RedisBackend {
    /// A standalone hit: a plain `GET` when the value's envelope records
    /// its expiry and the server's clock is known well enough to tell that
    /// it is fresh; the pipelined `GET` + `PTTL` otherwise (see
    /// `server_clock.rs`, decision 0011).
    async fn get_standalone(
        &self,
        mut conn: ConnectionManager,
        keys: &FillKeys,
        began: Instant,
    ) -> Result<Option<Stored>, BackendError> {
        // The rare paths are boxed: the hit's future stays small, and a
        // cache moves it (into its timeout) on every hit.
        let estimate = match self.inner.clock.plan(began) {
            Plan::Get(estimate) => estimate,
            Plan::GetPttl => return Box::pin(self.get_pttl(keys)).await,
            Plan::Sample(sampling) => {
                return Box::pin(self.get_sampling(conn, keys, sampling)).await
            }
        };
        let bytes: Option<Vec<u8>> = redis::cmd("GET")
            .arg(keys.value())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.saw(classify("get", e)))?;
        let Some(mut bytes) = bytes else {
            return Ok(None);
        };
        let now = Instant::now();
        // Fresh by the lower bound of the TTL left is fresh by the server's
        // clock too; in its grace window by the upper bound too, it is
        // stale by the server's clock (the lower bound reported, as for a
        // fresh value). Only a value whose bounds straddle the end of its
        // freshness, or that may have expired since the `GET` (its bytes
        // still came back, so it had not), has the server's own `PTTL`
        // decide: a stale answer costs a round trip, as a hit does.
        let known = envelope::expires_at_ms(&bytes)
            .zip(envelope::grace_of(&bytes))
            .and_then(|(at, grace)| estimate.judged_ttl(at, grace, now));
        match known {
            Some(ttl) => {
                envelope::strip_expiry(&mut bytes);
                Ok(Some(Stored { bytes, ttl }))
            }
            None => Box::pin(self.get_pttl(keys)).await,
        }
    }

    /// A standalone read that samples the server's clock: `GET` + `TIME`,
    /// two commands, as the pair was. `TIME` runs right after the `GET`, so
    /// a version-2 value's TTL is read against the server's own clock, as
    /// `PTTL` would be.
    async fn get_sampling(
        &self,
        mut conn: ConnectionManager,
        keys: &FillKeys,
        sampling: server_clock::Sampling<'_>,
    ) -> Result<Option<Stored>, BackendError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(keys.value()).cmd("TIME");
        let answer: Result<SampledRead, RedisError> = pipe.query_async(&mut conn).await;
        match answer {
            Ok((bytes, (secs, micros))) => {
                let server_us = sampling.record(secs, micros);
                let Some(mut bytes) = bytes else {
                    return Ok(None);
                };
                match envelope::expires_at_ms(&bytes) {
                    Some(at) => {
                        let left_us = at.saturating_mul(1_000).saturating_sub(server_us);
                        envelope::strip_expiry(&mut bytes);
                        Ok(Some(Stored {
                            bytes,
                            ttl: Duration::from_micros(left_us),
                        }))
                    }
                    // Version 1 or another client's bytes: the server's
                    // `PTTL` (a second round trip, rare).
                    None => self.get_pttl(keys).await,
                }
            }
            // The server refused (a `TIME` renamed away, say): the hit is
            // still answered, by the pair, and the next sample is tried a
            // second later.
            Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {
                sampling.refused();
                self.get_pttl(keys).await
            }
            Err(e) => Err(self.saw(classify("get", e))),
        }
    }

    /// [`Backend::get`](crate::Backend::get) as a cache calls it, directly (see `Calls::get`),
    /// within `limit` (the cache's own timeout): bounded by the response
    /// timeout too where that is shorter, so a hit waits no longer for a
    /// reply than any other command; with the defaults the cache's timeout
    /// is the shorter, and a hit has one timer.
    ///
    /// `now` is when the call began (one clock read serves the caller's
    /// timer and this read's plan).
    pub(crate) async fn read_within(
        &self,
        keys: &FillKeys,
        limit: Duration,
        now: Instant,
    ) -> Result<Option<Stored>, BackendError> {
        let response = self.inner.options.response_timeout;
        match &self.inner.conn {
            // Boxed: not the defaults' path, and the hit's future stays
            // small (see `get_standalone`).
            Conn::Single(_) if response < limit => {
                Box::pin(deadline::within("get", now, response, self.read(keys, now))).await
            }
            _ => self.read(keys, now).await,
        }
    }

    /// [`Backend::get`], unboxed and unbounded.
    async fn read(&self, keys: &FillKeys, now: Instant) -> Result<Option<Stored>, BackendError> {
        match &self.inner.conn {
            Conn::Single(c) if !self.inner.kept.covers(keys.value()) => {
                let flight = c.in_flight();
                let answer = self.get_standalone(c.manager(), keys, now).await;
                flight.answered();
                answer
            }
            _ => Box::pin(self.get_pttl(keys)).await,
        }
    }

    /// The pipelined `GET` + `PTTL`: the server's own TTL (one round trip,
    /// two commands).
    async fn get_pttl(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET")
            .arg(keys.value())
            .cmd("PTTL")
            .arg(keys.value());
        let result: Result<(Option<Vec<u8>>, i64), RedisError> = match &self.inner.conn {
            Conn::Single(c) => {
                let flight = c.in_flight();
                let answer = pipe.query_async(&mut c.manager()).await;
                flight.answered();
                answer
            }
            Conn::Cluster(router) => {
                let pipe = &pipe;
                // After an `ASK`: `ASKING` before each command.
                let mut asking_pipe = redis::pipe();
                asking_pipe
                    .cmd("ASKING")
                    .ignore()
                    .cmd("GET")
                    .arg(keys.value())
                    .cmd("ASKING")
                    .ignore()
                    .cmd("PTTL")
                    .arg(keys.value());
                let asking_pipe = &asking_pipe;
                super::run_about(router, keys, |mut c, asking| async move {
                    let pipe = if asking { asking_pipe } else { pipe };
                    pipe.query_async(&mut c).await
                })
                .await
            }
        };
        let (bytes, pttl) = result.map_err(|e| self.saw(classify("get", e)))?;
        Ok(stored(bytes, pttl))
    }
}

/// A clock sample's answer: `GET`, `TIME` (seconds, microseconds).
type SampledRead = (Option<Vec<u8>>, (u64, u64));

/// A `GET` and a `PTTL` answer: a value that expired between the two (-2)
/// is gone. The bytes are those written (a version-2 envelope's expiry,
/// stamped by the script, is taken back out).
pub(super) fn stored(bytes: Option<Vec<u8>>, pttl: i64) -> Option<Stored> {
    bytes.and_then(|mut bytes| {
        envelope::strip_expiry(&mut bytes);
        ttl_from_ms(pttl).map(|ttl| Stored { bytes, ttl })
    })
}
