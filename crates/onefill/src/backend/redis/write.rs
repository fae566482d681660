//! The unconditional writes (`set`, `invalidate`, `expire`): their script,
//! and on a cluster whose slot migrates, the same steps as single-key
//! commands (`expire`'s step on the value stays a script, of that key
//! alone).

use std::time::Duration;

use super::cluster::{self, slot_of, ClusterRouter};
use super::durability::{sends, Wait};
use super::errors::classify;
use super::scripts::ScriptCall;
use super::ttl::px;
use super::{flag, Conn, RedisBackend};
use crate::backend::{BackendError, FillKeys};

impl RedisBackend {
    /// An unconditional write (`set`, `invalidate`, `expire`): its script. On a
    /// cluster, while the key's slot migrates, the script is refused with
    /// `TRYAGAIN` for as long as the migration lasts (its keys are split
    /// between the two nodes, or the lock and the channel are missing on the
    /// importing one); the write then runs as single-key commands
    /// ([`write_apart`](Self::write_apart)), which a migration never refuses.
    /// The script's flag: whether it wrote (only a replayed invalidation
    /// may not: it keeps a newer value).
    pub(super) async fn write(
        &self,
        op: &'static str,
        keys: &FillKeys,
        invocation: &ScriptCall<'_>,
        apart: Unconditional<'_>,
    ) -> Result<bool, BackendError> {
        let wait = self.wait();
        let Conn::Cluster(router) = &self.inner.conn else {
            let (answer, acked) = self
                .eval_then_wait::<i64>(op, keys, invocation, wait)
                .await?;
            let wrote = flag(op, answer)?;
            return self.confirmed(op, wait, acked).map(|()| wrote);
        };
        let slot = slot_of(keys.value().as_bytes());
        let scripts = self.inner.scripts;
        let answer: Result<(i64, Option<i64>), _> = router
            .run_unless_split(slot, |mut c, asking| async move {
                invocation
                    .invoke_then_wait(scripts, &mut c, asking, wait)
                    .await
            })
            .await;
        match answer {
            Err(e) if cluster::is_try_again(&e) => {
                self.write_apart(router, op, keys, apart, wait).await
            }
            Err(e) => Err(classify(op, e)),
            Ok((answer, acked)) => {
                let wrote = flag(op, answer)?;
                self.confirmed(op, wait, acked).map(|()| wrote)
            }
        }
    }

    /// The steps of an unconditional write as single-key commands, each
    /// routed on its own (through `ASK` to the importing node once the key
    /// moved there): the lease first, so that a fill in flight is fenced out
    /// before the value changes, then the value, then the announcement. The
    /// value is written as the codec encoded it (envelope version 1, without
    /// the server's expiry, which only a script can stamp): readers take its
    /// TTL from the server. The step on the value is the one sent with
    /// `wait`'s `WAIT`, on the connection it ran on.
    async fn write_apart(
        &self,
        router: &ClusterRouter,
        op: &'static str,
        keys: &FillKeys,
        apart: Unconditional<'_>,
        wait: Option<Wait>,
    ) -> Result<bool, BackendError> {
        let slot = slot_of(keys.value().as_bytes());
        let one = |cmd: redis::Cmd, wait: Option<Wait>| async move {
            let cmd = &cmd;
            router
                .run(slot, |mut c, asking| async move {
                    let mut pipe = redis::pipe();
                    if asking {
                        pipe.cmd("ASKING").ignore();
                    }
                    pipe.add_command(cmd.clone());
                    match wait.filter(|w| sends(Some(*w))) {
                        Some(wait) => {
                            wait.append(&mut pipe);
                            let (_, acked): (redis::Value, i64) = pipe.query_async(&mut c).await?;
                            Ok(Some(acked))
                        }
                        None => {
                            let (_,): (redis::Value,) = pipe.query_async(&mut c).await?;
                            Ok(None)
                        }
                    }
                })
                .await
                .map_err(|e| classify(op, e))
        };
        one(redis::cmd("DEL").arg(keys.lock()).clone(), None).await?;
        let scripts = self.inner.scripts;
        let (wrote, acked) = match apart {
            Unconditional::Set { bytes, ttl } => {
                let mut set = redis::cmd("SET");
                set.arg(keys.value()).arg(bytes).arg("PX").arg(px(ttl));
                (true, one(set, wait).await?)
            }
            Unconditional::Invalidate { older_than: None } => (
                true,
                one(redis::cmd("DEL").arg(keys.value()).clone(), wait).await?,
            ),
            Unconditional::Invalidate {
                older_than: Some(age),
            } => {
                // Judge and delete in one step, as `expire` below does.
                let mut invalidate = ScriptCall::new(&scripts.invalidate_value);
                invalidate.key(keys.value()).arg(px(age));
                let invalidate = &invalidate;
                let (answer, acked) = router
                    .run(slot, |mut c, asking| async move {
                        invalidate
                            .invoke_then_wait::<i64, _>(scripts, &mut c, asking, wait)
                            .await
                    })
                    .await
                    .map_err(|e| classify(op, e))?;
                (flag(op, answer)?, acked)
            }
            Unconditional::Expire => {
                // Read, judge and rewrite the value in one step: as
                // commands of their own, a `set` landing between the read
                // and the rewrite would be cut to the old value's grace.
                let mut soften = ScriptCall::new(&scripts.expire_value);
                soften.key(keys.value());
                let soften = &soften;
                let (_, acked) = router
                    .run(slot, |mut c, asking| async move {
                        soften
                            .invoke_then_wait::<i64, _>(scripts, &mut c, asking, wait)
                            .await
                    })
                    .await
                    .map_err(|e| classify(op, e))?;
                (true, acked)
            }
        };
        // The write has landed: a lost announcement only leaves the
        // waiters of the key to their next poll, so it does not fail it.
        let publish = redis::cmd("SPUBLISH").arg(keys.channel()).arg(op).clone();
        let _ = one(publish, None).await;
        // And for the L1s that cannot track keys, as the scripts do.
        let publish = redis::cmd("PUBLISH").arg(keys.channel()).arg(op).clone();
        let _ = one(publish, None).await;
        self.confirmed(op, wait, acked).map(|()| wrote)
    }
}

/// What an unconditional write does, for its single-key form.
pub(super) enum Unconditional<'a> {
    Set {
        bytes: &'a [u8],
        ttl: Duration,
    },
    /// `older_than`: a replay's (see `Backend::invalidate_older_than`).
    Invalidate {
        older_than: Option<Duration>,
    },
    Expire,
}
