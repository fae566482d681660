//! The batch steps on Redis: [`get_many`](crate::Backend::get_many) and
//! [`acquire_many`](crate::Backend::acquire_many) as pipelines.
//!
//! Standalone: one pipeline for the whole call. Cluster: one pipeline per
//! master (grouped by the slot map as it is known now), the masters in
//! parallel, each sent through the router like any command (so a master
//! that does not answer counts against its circuit and its slots are
//! looked up again). The pipelines ignore per-command errors, so each key
//! gets its own answer: a key whose slot moved (`MOVED`, `ASK`), whose
//! cluster is busy (`TRYAGAIN`, `CLUSTERDOWN`) or whose script the server
//! forgot (`NOSCRIPT`) did not run, and is sent again alone by the
//! single-key step, which follows redirections and loads scripts. Other
//! errors are the key's answer.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, FromRedisValue, RedisError, RedisResult, ServerErrorKind, Value};

use super::errors::driver_within;
use super::primary::is_readonly_reply;
use super::{
    acquired_from, classify, ms_ceil, px, slot_of, stored, AcquireAnswer, Conn, RedisBackend,
    ScriptCall, NO_EXPIRY_TTL,
};
use crate::backend::{
    Acquired, Backend, BackendError, BackendErrorKind, FillKeys, LeaseRequest, Stored,
};

/// One key's replies (one per command sent for it), or why there are none.
type Replies = Result<Vec<Value>, RedisError>;

impl RedisBackend {
    pub(super) async fn pipelined_get_many(
        &self,
        keys: &[FillKeys],
    ) -> Vec<Result<Option<Stored>, BackendError>> {
        let build = |pipe: &mut redis::Pipeline, i: usize| {
            let key = keys[i].value();
            pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
        };
        let replies = self.pipelined(keys, 2, &build).await;
        // Concurrently: the keys sent again go out together.
        let answers = keys.iter().zip(replies).map(|(keys, replies)| async move {
            match replies {
                Err(e) if sent_again(&e) => self.get(keys).await,
                Err(e) => Err(classify("get", e)),
                Ok(replies) => {
                    parse::<(Option<Vec<u8>>, i64)>("get", replies).map(|(bytes, pttl)| {
                        // A value that expired between GET and PTTL (-2) is gone.
                        stored(bytes, pttl)
                    })
                }
            }
        });
        futures_util::future::join_all(answers).await
    }

    pub(super) async fn pipelined_acquire_many(
        &self,
        requests: &[LeaseRequest],
        lease_ttl: Duration,
    ) -> Vec<Result<Acquired, BackendError>> {
        let keys: Vec<FillKeys> = requests.iter().map(|r| r.keys.clone()).collect();
        // Held from before the requests are sent (see `acquire.rs`); a
        // request sent again on its own holds its token there too.
        let acquiring: Vec<_> = requests.iter().map(|r| self.acquiring(&r.token)).collect();
        let script = &self.inner.scripts.acquire;
        let build = |pipe: &mut redis::Pipeline, i: usize| {
            let request = &requests[i];
            let mut invocation = ScriptCall::new(script);
            invocation
                .key(request.keys.value())
                .key(request.keys.lock())
                .arg(request.token.as_bytes())
                .arg(px(lease_ttl))
                .arg(ms_ceil(request.refresh_window))
                .arg(NO_EXPIRY_TTL.as_millis() as u64);
            pipe.add_command(invocation.evalsha());
        };
        let replies = self.pipelined(&keys, 1, &build).await;
        let answers = requests
            .iter()
            .zip(replies)
            .map(|(request, replies)| async move {
                match replies {
                    // Not run: the single-key step runs it (loading the script,
                    // following the redirection, or the backend to the new
                    // primary after a `READONLY`); the token is still free.
                    Err(e) if sent_again(&e) => {
                        self.acquire(
                            &request.keys,
                            &request.token,
                            lease_ttl,
                            request.refresh_window,
                        )
                        .await
                    }
                    Err(e) => Err(classify("acquire", e)),
                    Ok(replies) => parse::<(AcquireAnswer,)>("acquire", replies)
                        .and_then(|(answer,)| acquired_from(answer)),
                }
            });
        let answers = futures_util::future::join_all(answers).await;
        for (answer, acquiring) in answers.iter().zip(acquiring) {
            if let (Ok(Acquired::Won { .. }), Some(acquiring)) = (answer, acquiring) {
                acquiring.won();
            }
        }
        answers
    }

    /// Sends `per_key` commands for every key (as `build` adds them), in
    /// one pipeline per master, and hands each key its replies.
    async fn pipelined(
        &self,
        keys: &[FillKeys],
        per_key: usize,
        build: &(dyn Fn(&mut redis::Pipeline, usize) + Sync),
    ) -> Vec<Replies> {
        match &self.inner.conn {
            Conn::Single(c) => {
                let all: Vec<usize> = (0..keys.len()).collect();
                // The command connection has no response timeout of its
                // own (see `connect_with`).
                let limit = self.inner.options.response_timeout;
                let flight = c.in_flight();
                let sent = driver_within(
                    "get_many",
                    limit,
                    send(&mut c.manager(), &all, per_key, build),
                )
                .await;
                flight.answered();
                match sent {
                    Ok(replies) => replies,
                    Err(e) => {
                        c.saw(&classify("get_many", e.clone()));
                        keys.iter().map(|_| Err(e.clone())).collect()
                    }
                }
            }
            Conn::Cluster(router) => {
                let mut groups: HashMap<u64, Vec<usize>> = HashMap::new();
                for (i, k) in keys.iter().enumerate() {
                    let shard = router.shard_of(slot_of(k.value().as_bytes()));
                    groups.entry(shard).or_default().push(i);
                }
                let runs = groups.into_values().map(|group| async move {
                    let slot = slot_of(keys[group[0]].value().as_bytes());
                    // Per-command errors are replies, so the router never
                    // sees an `ASK` and `asking` stays false.
                    let group_ref = &group;
                    let sent = router
                        .run(slot, |mut c, _asking| async move {
                            send(&mut c, group_ref, per_key, build).await
                        })
                        .await;
                    (group, sent)
                });
                let mut out: Vec<Option<Replies>> = keys.iter().map(|_| None).collect();
                for (group, sent) in futures_util::future::join_all(runs).await {
                    match sent {
                        Ok(replies) => {
                            for (i, r) in group.into_iter().zip(replies) {
                                out[i] = Some(r);
                            }
                        }
                        Err(e) => {
                            for i in group {
                                out[i] = Some(Err(e.clone()));
                            }
                        }
                    }
                }
                out.into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(missing_reply())))
                    .collect()
            }
        }
    }
}

/// One pipeline of `per_key` commands for each of `keys` (indices for
/// `build`); a transport error fails the whole pipeline, a command's error
/// only its key.
async fn send<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &[usize],
    per_key: usize,
    build: &(dyn Fn(&mut redis::Pipeline, usize) + Sync),
) -> RedisResult<Vec<Replies>> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for &i in keys {
        build(&mut pipe, i);
    }
    let replies: Vec<RedisResult<Value>> = pipe.query_async(conn).await?;
    if replies.len() != keys.len() * per_key {
        return Err(missing_reply());
    }
    let mut replies = replies.into_iter();
    Ok(keys
        .iter()
        .map(|_| {
            replies
                .by_ref()
                .take(per_key)
                .collect::<RedisResult<Vec<Value>>>()
        })
        .collect())
}

fn missing_reply() -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "a pipeline answered with fewer replies than commands",
    ))
}

/// A command that did not run on the server and that the single-key step
/// knows how to send again.
fn sent_again(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::NoScript
        )
    ) || is_readonly_reply(e)
}

fn parse<T: FromRedisValue>(op: &str, replies: Vec<Value>) -> Result<T, BackendError> {
    T::from_redis_value(Value::Array(replies)).map_err(|e| {
        BackendError::new(
            BackendErrorKind::Protocol,
            format!("{op}: unexpected reply: {e}"),
        )
    })
}
