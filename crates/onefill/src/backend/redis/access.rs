//! What a namespace needs from the server's ACL, asked once at start
//! ([`RedisBackend::check_namespace`]): a user granted a namespace in
//! part meets a refusal only in the calls that need the missing part, one
//! at a time, and some of them (a refused channel) only slow waiters
//! down. Each need is tried as the calls meet it, on a key of the
//! namespace of the check's own (a fresh name each time, so two processes
//! checking at once do not meet), which it deletes again: a lease taken,
//! extended and filled, the value made stale and invalidated, each step
//! the script a cache runs, with every command inside it.

use std::collections::HashSet;

use parking_lot::Mutex;

use super::liveness::Publisher;
use super::{Conn, RedisBackend};
use crate::backend::{Backend as _, BackendError, FillKeys};
use crate::error::BackendErrorKind;
use crate::key::MarkKeys;
use crate::token::LeaseToken;

/// The key of a namespace the check works on (no cache writes it), with a
/// random suffix.
const PROBE_KEY: &str = "onefill-access-check";

/// The namespaces checked so far on one backend, so that every cache
/// built on it does not check again.
#[derive(Default)]
pub(super) struct Checked(Mutex<HashSet<String>>);

impl Checked {
    /// Whether `namespace` is checked for the first time.
    fn first(&self, namespace: &str) -> bool {
        self.0.lock().insert(namespace.to_owned())
    }
}

/// One need of a namespace, and how it is tried.
#[derive(Clone, Copy)]
enum Need {
    /// `MGET` of the namespace's marks (every call reads them).
    Marks,
    /// A value read (`GET` of a value key).
    Read,
    /// The scripts on the namespace's keys, and each command inside them:
    /// a lease taken, extended and filled, the value made stale, then
    /// invalidated (the marks' script, which would judge every value of
    /// the namespace, is not run).
    Scripts,
    /// Publishing on the namespace's channels (every fill announces).
    Announce,
    /// Subscribing to them (waiters hear fills).
    Listen,
    /// The holders' presence channels, `onefill:holder:*` (waiters watch
    /// holders).
    Presence,
}

impl Need {
    const ALL: [Need; 6] = [
        Need::Marks,
        Need::Read,
        Need::Scripts,
        Need::Announce,
        Need::Listen,
        Need::Presence,
    ];

    fn what(self) -> &'static str {
        match self {
            Need::Marks => "MGET of its marks",
            Need::Read => "GET of its values",
            Need::Scripts => "the scripts on its keys",
            Need::Announce => "PUBLISH on its channels",
            Need::Listen => "SUBSCRIBE to its channels",
            Need::Presence => "publish and subscribe on the channels onefill:holder:*",
        }
    }
}

impl RedisBackend {
    /// Checks that the server's ACL grants what a cache of `namespace`
    /// needs: reading its marks and values, running the scripts on its
    /// keys, publishing and subscribing on its channels, and the holders'
    /// presence channels (`onefill:holder:*`). Call it once at start to
    /// fail there, rather than at the first call that needs what is
    /// missing; a cache built on this backend runs a lighter one (nothing
    /// written: the scripts sent, not run through) once in the
    /// background, and logs a warning naming what is missing.
    ///
    /// Costs about ten commands and one subscription; writes one key of
    /// its own for a moment (a lease and a value of a fresh key, deleted
    /// again), and not the namespace's marks.
    ///
    /// # Errors
    ///
    /// [`NotPermitted`](BackendErrorKind::NotPermitted), naming every need
    /// the ACL refuses (with the server's words); a transient error
    /// (timeout, connection) if the server could not be asked.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), onefill::BackendError> {
    /// let backend = onefill::redis::RedisBackend::connect("redis://app:secret@127.0.0.1/").await?;
    /// backend.check_namespace("users").await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_namespace(&self, namespace: &str) -> Result<(), BackendError> {
        self.check(namespace, true).await
    }

    /// [`check_namespace`](Self::check_namespace); not `thorough`, the
    /// scripts are only sent (a release whose token matches nothing:
    /// nothing written, no `WAIT`), not run through.
    async fn check(&self, namespace: &str, thorough: bool) -> Result<(), BackendError> {
        if let Err(e) = crate::key::validate_namespace(namespace) {
            return Err(BackendError::new(
                BackendErrorKind::Command,
                format!("check namespace: {e}"),
            ));
        }
        self.inner.checked.first(namespace);
        let mut refused = Vec::new();
        for need in Need::ALL {
            match self.try_need(namespace, need, thorough).await {
                Ok(()) => {}
                Err(e) if e.kind() == BackendErrorKind::NotPermitted => {
                    refused.push(format!("{} ({e})", need.what()));
                }
                Err(e) => return Err(e),
            }
        }
        if refused.is_empty() {
            return Ok(());
        }
        Err(BackendError::new(
            BackendErrorKind::NotPermitted,
            format!(
                "namespace {namespace}: the ACL user lacks {}",
                refused.join("; ")
            ),
        ))
    }

    /// [`check_namespace`](Self::check_namespace) in the background, once
    /// per namespace and backend (a cache's build, inside a runtime), and
    /// lighter: nothing written (a cache built must not write, nor wait
    /// for replicas), so a command refused inside a script is not found
    /// there. A refusal is a warning.
    pub(crate) fn check_namespace_in_background(&self, namespace: &str) {
        if tokio::runtime::Handle::try_current().is_err() || !self.inner.checked.first(namespace) {
            return;
        }
        let (backend, namespace) = (self.clone(), namespace.to_owned());
        tokio::spawn(async move {
            match backend.check(&namespace, false).await {
                Ok(()) => {}
                Err(e) if e.kind() == BackendErrorKind::NotPermitted => {
                    tracing::warn!(
                        namespace,
                        error = %e,
                        "the Redis user is not granted what this namespace needs: the calls \
                         that need it will fail (see the README's least-privilege ACL)"
                    );
                }
                Err(e) => tracing::debug!(namespace, error = %e, "could not check the ACL"),
            }
        });
    }

    /// Tries one need: `NotPermitted` if the ACL refuses it.
    async fn try_need(
        &self,
        namespace: &str,
        need: Need,
        thorough: bool,
    ) -> Result<(), BackendError> {
        let probe = FillKeys::new(
            namespace,
            &format!("{PROBE_KEY}-{:016x}", rand::random::<u64>()),
        );
        let limit = self.inner.options.response_timeout;
        let publisher = || match &self.inner.conn {
            Conn::Single(primary) => Publisher::Single(primary.clone()),
            Conn::Cluster(router) => Publisher::Cluster(router.clone()),
        };
        match need {
            Need::Marks => {
                let marks = MarkKeys::new(namespace);
                let clear = marks.clear();
                self.read_marks(&marks.generation(), &[clear.as_str()])
                    .await
                    .map(drop)
            }
            Need::Read => self.get(&probe).await.map(drop),
            Need::Scripts if thorough => self.try_scripts(&probe).await,
            Need::Scripts => self
                .release(&probe, &LeaseToken::random(), None)
                .await
                .map(drop),
            Need::Announce => publisher()
                .publish("check namespace", probe.channel(), "", limit)
                .await
                .map(drop),
            Need::Listen => {
                let channel = probe.channel().to_owned();
                let _subscription = self.inner.pubsub.subscription(channel.clone()).await;
                self.inner.pubsub.confirmation(&channel, limit).await;
                // The server's confirmation, not whether the slot map has
                // settled (on a cluster, no channel counts as confirmed for
                // a while after a change of it).
                if self.inner.pubsub.subscribed(&channel) {
                    Ok(())
                } else {
                    Err(BackendError::new(
                        BackendErrorKind::NotPermitted,
                        format!("SUBSCRIBE {channel}: not confirmed within {limit:?}"),
                    ))
                }
            }
            Need::Presence => match self.inner.liveness.get() {
                Some(liveness) => liveness.present().await,
                None => Ok(()),
            },
        }
    }
}

impl RedisBackend {
    /// The scripts a cache runs, on `probe` (see [`Need::Scripts`]); the
    /// key is deleted again however it ends.
    async fn try_scripts(&self, probe: &FillKeys) -> Result<(), BackendError> {
        let tried = self.script_steps(probe).await;
        // Whatever the steps left (a refused step stops them).
        let _ = self.invalidate(probe).await;
        tried
    }

    async fn script_steps(&self, probe: &FillKeys) -> Result<(), BackendError> {
        let token = LeaseToken::random();
        let lease = std::time::Duration::from_secs(5);
        self.acquire(probe, &token, lease, std::time::Duration::MAX)
            .await?;
        self.extend(probe, &token, lease).await?;
        // An envelope with a grace, so that making it stale rewrites it.
        let grace = std::time::Duration::from_secs(1);
        let value = crate::envelope::encode(
            crate::envelope::Kind::Value,
            grace,
            std::time::Duration::ZERO,
            None,
            0,
            &[],
            b"",
        );
        self.fill(probe, &token, &value, grace * 2).await?;
        self.expire(probe).await?;
        self.invalidate(probe).await
    }
}
