//! Where the holders' presence and beats are published, and what their
//! channels are called: a standalone server's connection (`PUBLISH`), or
//! on a cluster the master of the channel's slot (`SPUBLISH`, which counts
//! the receivers on that node, where the channel's subscribers are).

use std::time::Duration;

use super::super::cluster::{slot_of, ClusterRouter};
use super::super::errors::with_deadline;
use super::super::primary::Primary;
use crate::backend::{BackendError, FillKeys};

/// Where presence and beats go (see the module docs).
#[derive(Clone)]
pub(in super::super) enum Publisher {
    Single(Primary),
    Cluster(ClusterRouter),
}

/// A holder's two channels: where waiters ask, where it beats.
pub(super) struct Channels {
    pub(super) presence: String,
    pub(super) beats: String,
}

impl Publisher {
    /// The channels of the holder named `name` in tokens. Standalone: the
    /// backend's id. On a cluster: the id, `_`, and a hash tag in a slot of
    /// the master the holder's lease lives on, so the channels fail over
    /// with the lease (`None` for a name without one: a token this shape
    /// of backend does not make).
    pub(super) fn channels(&self, name: &str) -> Option<Channels> {
        match self {
            Publisher::Single(_) => Some(Channels {
                presence: format!("onefill:holder:{name}"),
                beats: format!("onefill:holder:{name}:beats"),
            }),
            Publisher::Cluster(_) => {
                let (id, tag) = name.split_once('_')?;
                Some(Channels {
                    presence: format!("onefill:holder:{{{tag}}}:{id}"),
                    beats: format!("onefill:holder:{{{tag}}}:{id}:beats"),
                })
            }
        }
    }

    /// Publishes `message` on `channel`: how many received it.
    pub(in super::super) async fn publish(
        &self,
        op: &'static str,
        channel: &str,
        message: &str,
        limit: Duration,
    ) -> Result<i64, BackendError> {
        match self {
            Publisher::Single(primary) => {
                let mut conn = primary.manager();
                let publish = redis::cmd("PUBLISH").arg(channel).arg(message).clone();
                with_deadline(op, limit, publish.query_async(&mut conn)).await
            }
            Publisher::Cluster(router) => {
                let publish = redis::cmd("SPUBLISH").arg(channel).arg(message).clone();
                let sent = router.run(slot_of(channel.as_bytes()), |mut c, _| {
                    let publish = publish.clone();
                    async move { publish.query_async::<i64>(&mut c).await }
                });
                with_deadline(op, limit, sent).await
            }
        }
    }

    /// The lease of `keys` (its token, if any) and the receivers of `ask`
    /// on `presence`: one round trip on a standalone server; on a cluster,
    /// two at once (the key's master and the channel's, usually the same).
    pub(super) async fn lease_and_ask(
        &self,
        keys: &FillKeys,
        presence: &str,
        ask: &str,
        limit: Duration,
    ) -> Result<(Option<Vec<u8>>, i64), BackendError> {
        match self {
            Publisher::Single(primary) => {
                let mut pipe = redis::pipe();
                pipe.cmd("GET")
                    .arg(keys.lock())
                    .cmd("PUBLISH")
                    .arg(presence)
                    .arg(ask);
                let mut conn = primary.manager();
                with_deadline("watch holder", limit, pipe.query_async(&mut conn)).await
            }
            Publisher::Cluster(router) => {
                let get = redis::cmd("GET").arg(keys.lock()).clone();
                let lock = router.run(slot_of(keys.value().as_bytes()), |mut c, asking| {
                    let get = get.clone();
                    async move {
                        if asking {
                            let mut pipe = redis::pipe();
                            pipe.cmd("ASKING").ignore().add_command(get);
                            let (lock,): (Option<Vec<u8>>,) = pipe.query_async(&mut c).await?;
                            Ok(lock)
                        } else {
                            get.query_async::<Option<Vec<u8>>>(&mut c).await
                        }
                    }
                });
                let lock = with_deadline("watch holder", limit, lock);
                let asked = self.publish("watch holder", presence, ask, limit);
                let (lock, receivers) = tokio::join!(lock, asked);
                Ok((lock?, receivers?))
            }
        }
    }
}
