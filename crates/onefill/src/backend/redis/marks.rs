//! The namespace's marks on Redis (decision 0018): one script writes the
//! generation and a mark together, one `MGET` reads them. Every key of a
//! namespace's marks shares one slot (`MarkKeys`), so on a cluster both
//! are single-slot commands on its master.

use std::time::Duration;

use redis::Value;

use super::cluster::slot_of;
use super::errors::{classify, with_deadline};
use super::scripts::ScriptCall;
use super::ttl::px;
use super::{process_listeners, Conn, RedisBackend};
use crate::backend::{generation_from_stored, BackendError, BackendErrorKind, Mark, MarkKind};

impl RedisBackend {
    pub(super) async fn write_mark(
        &self,
        gen_key: &str,
        mark_key: &str,
        kind: MarkKind,
        retention: Option<Duration>,
    ) -> Result<u64, BackendError> {
        let mut invocation = ScriptCall::new(&self.inner.scripts.mark);
        invocation.key(gen_key).key(mark_key);
        invocation.arg(match kind {
            MarkKind::Hard => "hard",
            MarkKind::Soft => "soft",
        });
        match retention {
            Some(keep) => invocation.arg(px(keep)),
            None => invocation.arg(""),
        };
        let scripts = self.inner.scripts;
        let wait = self.wait();
        let written: Result<(i64, Option<i64>), BackendError> = match &self.inner.conn {
            Conn::Single(c) => {
                self.single_eval_then_wait(c, "mark", &invocation, wait)
                    .await
            }
            Conn::Cluster(router) => router
                .run(slot_of(gen_key.as_bytes()), |mut c, asking| {
                    let invocation = &invocation;
                    async move {
                        invocation
                            .invoke_then_wait(scripts, &mut c, asking, wait)
                            .await
                    }
                })
                .await
                .map_err(|e| classify("mark", e)),
        };
        // Landed or not, this process's caches must not trust what they
        // held of the mark (their tracking push comes later).
        process_listeners().changed(mark_key);
        process_listeners().changed(gen_key);
        let (generation, acked) = written?;
        self.confirmed("mark", wait, acked)?;
        u64::try_from(generation).map_err(|_| {
            BackendError::new(
                BackendErrorKind::Protocol,
                format!("mark: the script answered generation {generation}"),
            )
        })
    }

    pub(super) async fn mget_marks(
        &self,
        gen_key: &str,
        mark_keys: &[&str],
    ) -> Result<(u64, Vec<Mark>), BackendError> {
        let mut mget = redis::cmd("MGET");
        mget.arg(gen_key).arg(mark_keys);
        let mget = &mget;
        let values: Vec<Value> = match &self.inner.conn {
            Conn::Single(c) => {
                let limit = self.inner.options.response_timeout;
                let mut conn = c.manager();
                let flight = c.in_flight();
                let read = with_deadline("read_marks", limit, async move {
                    mget.query_async(&mut conn).await
                })
                .await;
                flight.answered();
                read.inspect_err(|e| c.saw(e))?
            }
            Conn::Cluster(router) => router
                .run(slot_of(gen_key.as_bytes()), |mut c, asking| async move {
                    if asking {
                        let mut pipe = redis::pipe();
                        pipe.cmd("ASKING").ignore().add_command(mget.clone());
                        let (reply,): (Vec<Value>,) = pipe.query_async(&mut c).await?;
                        Ok(reply)
                    } else {
                        mget.query_async(&mut c).await
                    }
                })
                .await
                .map_err(|e| classify("read_marks", e))?,
        };
        if values.len() != mark_keys.len() + 1 {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!(
                    "read_marks: {} answers for {} keys",
                    values.len(),
                    mark_keys.len() + 1
                ),
            ));
        }
        let bytes = |v: &Value| match v {
            Value::BulkString(b) => Some(b.clone()),
            Value::SimpleString(s) => Some(s.clone().into_bytes()),
            _ => None,
        };
        let generation = bytes(&values[0]).map_or(0, |b| generation_from_stored(&b));
        let marks = values[1..]
            .iter()
            .map(|v| bytes(v).map_or_else(Mark::default, |b| Mark::from_stored(&b)))
            .collect();
        Ok((generation, marks))
    }
}
