//! The unconditional writes (`set`, `invalidate`, `expire`): their script,
//! and on a cluster whose slot migrates, the same steps as single-key
//! commands (`expire`'s step on the value stays a script, of that key
//! alone).

use std::time::Duration;

use super::cluster::{self, slot_of, ClusterRouter};
use super::errors::classify;
use super::scripts::ScriptCall;
use super::ttl::px;
use super::{Conn, RedisBackend};
use crate::backend::{BackendError, FillKeys};

impl RedisBackend {
    /// An unconditional write (`set`, `invalidate`, `expire`): its script. On a
    /// cluster, while the key's slot migrates, the script is refused with
    /// `TRYAGAIN` for as long as the migration lasts (its keys are split
    /// between the two nodes, or the lock and the channel are missing on the
    /// importing one); the write then runs as single-key commands
    /// ([`write_apart`](Self::write_apart)), which a migration never refuses.
    pub(super) async fn write(
        &self,
        op: &'static str,
        keys: &FillKeys,
        invocation: &ScriptCall<'_>,
        apart: Unconditional<'_>,
    ) -> Result<(), BackendError> {
        let Conn::Cluster(router) = &self.inner.conn else {
            return self.eval_flag(op, keys, invocation).await.map(drop);
        };
        let slot = slot_of(keys.value().as_bytes());
        let scripts = self.inner.scripts;
        let answer: Result<i64, _> = router
            .run_unless_split(slot, |mut c, asking| async move {
                invocation.invoke(scripts, &mut c, asking).await
            })
            .await;
        match answer {
            Err(e) if cluster::is_try_again(&e) => self.write_apart(router, op, keys, apart).await,
            answer => answer.map(drop).map_err(|e| classify(op, e)),
        }
    }

    /// The steps of an unconditional write as single-key commands, each
    /// routed on its own (through `ASK` to the importing node once the key
    /// moved there): the lease first, so that a fill in flight is fenced out
    /// before the value changes, then the value, then the announcement. The
    /// value is written as the codec encoded it (envelope version 1, without
    /// the server's expiry, which only a script can stamp): readers take its
    /// TTL from the server.
    async fn write_apart(
        &self,
        router: &ClusterRouter,
        op: &'static str,
        keys: &FillKeys,
        apart: Unconditional<'_>,
    ) -> Result<(), BackendError> {
        let slot = slot_of(keys.value().as_bytes());
        let one = |cmd: redis::Cmd| async move {
            let cmd = &cmd;
            router
                .run(slot, |mut c, asking| async move {
                    if asking {
                        let mut pipe = redis::pipe();
                        pipe.cmd("ASKING").ignore().add_command(cmd.clone());
                        let (reply,): (redis::Value,) = pipe.query_async(&mut c).await?;
                        Ok(reply)
                    } else {
                        cmd.query_async::<redis::Value>(&mut c).await
                    }
                })
                .await
                .map_err(|e| classify(op, e))
        };
        one(redis::cmd("DEL").arg(keys.lock()).clone()).await?;
        match apart {
            Unconditional::Set { bytes, ttl } => {
                let mut set = redis::cmd("SET");
                set.arg(keys.value()).arg(bytes).arg("PX").arg(px(ttl));
                one(set).await?;
            }
            Unconditional::Invalidate => {
                one(redis::cmd("DEL").arg(keys.value()).clone()).await?;
            }
            Unconditional::Expire => {
                // Read, judge and rewrite the value in one step: as
                // commands of their own, a `set` landing between the read
                // and the rewrite would be cut to the old value's grace.
                let scripts = self.inner.scripts;
                let mut soften = ScriptCall::new(&scripts.expire_value);
                soften.key(keys.value());
                let soften = &soften;
                router
                    .run(slot, |mut c, asking| async move {
                        soften.invoke::<i64, _>(scripts, &mut c, asking).await
                    })
                    .await
                    .map_err(|e| classify(op, e))?;
            }
        }
        // The write has landed: a lost announcement only leaves the
        // waiters of the key to their next poll, so it does not fail it.
        let _ = one(redis::cmd("SPUBLISH").arg(keys.channel()).arg(op).clone()).await;
        // And for the L1s that cannot track keys, as the scripts do.
        let _ = one(redis::cmd("PUBLISH").arg(keys.channel()).arg(op).clone()).await;
        Ok(())
    }
}

/// What an unconditional write does, for its single-key form.
pub(super) enum Unconditional<'a> {
    Set { bytes: &'a [u8], ttl: Duration },
    Invalidate,
    Expire,
}
