//! Reports of changed values for an L1 (`Backend::track_changes`), from
//! Redis's server-assisted client-side caching.
//!
//! (A little over 600 lines with its tests: one node's connection, the
//! cluster's supervisor over them, and what a push means are one protocol,
//! read together; what the backend tracks is `tracked.rs`.)
//!
//! Each tracked node gets one RESP3 connection per backend with
//! `CLIENT TRACKING ON BCAST PREFIX <namespace>:{` for the namespace of
//! every cache with an L1 on the backend (`tracked.rs` keeps them and
//! their listeners; a prefix registered while the connection is up is
//! added to it before its next `PING`): the server then pushes an
//! `invalidate` message for every key under the prefixes that changes,
//! whoever changed it (onefill anywhere, `redis-cli`, an expiry, an
//! eviction); a `FLUSHALL` or `FLUSHDB` is a `nil` invalidation.
//!
//! A `PING` (on a cluster `WAIT 0 0`, see below) on the same connection
//! every `confirm_every` is the sync confirmation: its answer comes after
//! every invalidation the server sent before handling it, so once the answer is in and the pushes received
//! so far are handled, every change before the `PING` was sent has been
//! reported. (In `BCAST` mode the server sends a change's invalidations at
//! the end of the event-loop iteration that made it, in the same write as
//! the answer to a `PING` handled in that iteration: they arrive together.)
//!
//! The connection is a [`PushConnection`] (`push.rs`), which connects,
//! turns tracking on, pings and reconnects with backoff; what is the L1's
//! own is here. When the connection fails (the `PING` times out, the
//! connection drops) the listeners are told at once that nothing is in
//! sync; once reconnected with tracking on again, they are reset (changes
//! made meanwhile were not reported) before the next confirmation.
//!
//! On a cluster a supervisor keeps one such connection per master of the
//! router's slot map, adding and dropping them as the map changes; the
//! listener is in sync as of the oldest confirmation among the current
//! masters, so a new master (a promoted replica) must be tracked and
//! confirmed before the L1 serves again. There a node's confirmation is
//! `WAIT 0 0` rather than `PING`: answered at once by a master, refused by
//! a replica. A master demoted by a failover still answers `PING`s and
//! still pushes what it replicates from the new master (late, or never if
//! its link is cut), and L1 hits send no command that a `MOVED` could
//! answer, so without it the L1 served on the old master's word. Now the
//! refusal stops the L1; the calls it no longer answers meet the `MOVED`
//! that teaches the router the new master, whose tracking the supervisor
//! then starts. (Until then the refused connection reconnects with its
//! backoff, and each reconnection resets the L1 and the outage fallback.)
//!
//! # Without tracking (decision 0021)
//!
//! A server may refuse `CLIENT TRACKING` (a managed service or proxy that
//! does not offer it, a renamed `CLIENT`, an ACL without it): the
//! backend asks when it connects ([`refused`]), and a node's connection
//! may meet it later. The listener is then asked whether the changes
//! onefill's writes announce are enough ([`ChangeListener::untracked`]):
//!
//! - if so, each node's connection `PSUBSCRIBE`s to the namespace's
//!   channels (`<namespace>:{*:filled`) instead: every script that changes
//!   a value publishes its key's channel there (`scripts.rs`), and the mark
//!   script its mark's. The confirmation is the same `PING` (`WAIT 0 0`):
//!   a script's `PUBLISH` is written to the node's subscribers while it
//!   runs, before the answer to any later command. So everything else
//!   holds as with tracking: no confirmation, no serving; a reconnection
//!   resets the listener. (On a cluster a plain `PUBLISH` also reaches the
//!   other nodes over the bus: each message comes once per master, the
//!   duplicates drop what was dropped already.)
//! - if not, the node's task ends without confirming anything (and a
//!   cluster's supervisor stops with it): the L1 never serves.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::{Client, PushInfo, PushKind, Value};
use tokio::task::JoinHandle;

use super::cluster::WeakRouter;
use super::errors::with_deadline;
use super::options::{RedisOptions, MIN_BACKOFF};
use super::primary::Primary;
use super::push::{resp3, Due, Names, PushConnection};
use super::tracked::{Confirmed, Tracked, ANNOUNCED};
use crate::backend::BackendError;
use crate::backoff::Backoff;

/// What one node's tracking task needs.
#[derive(Clone)]
pub(super) struct Tracking {
    /// The backend's prefixes and their listeners (`tracked.rs`).
    pub tracked: Arc<Tracked>,
    pub options: RedisOptions,
}

/// Whether the server refuses `CLIENT TRACKING` to this client, asked with
/// a harmless `CLIENT TRACKING OFF` (refused by a server without the
/// command, a renamed `CLIENT`, an ACL without `client|tracking`, a proxy
/// that does not pass it on): the refusal, if it is one. A failure that
/// may pass (a timeout, a dropped connection) is no answer.
pub(super) async fn refused<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    timeout: Duration,
) -> Option<BackendError> {
    let off = redis::cmd("CLIENT").arg("TRACKING").arg("OFF").clone();
    let asked = off.query_async::<Value>(conn);
    match with_deadline("CLIENT TRACKING", timeout, asked).await {
        Err(e) if is_refusal(&e) => Some(e),
        _ => None,
    }
}

/// A refusal of the command itself (an error reply), not a failure to get
/// an answer.
fn is_refusal(e: &BackendError) -> bool {
    super::errors::is_refusal(e)
}

/// The channel pattern of the changes announced under `prefix`
/// (`<namespace>:{`): `<namespace>:{*:filled`, the namespace's glob
/// characters escaped.
fn announced_pattern(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 10);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    // Not `*}`: a mark's channel has no `}` before its suffix.
    pattern.push('*');
    pattern.push_str(ANNOUNCED_SUFFIX);
    pattern
}

/// What an announced key's channel adds to it (`FillKeys::channel`).
const ANNOUNCED_SUFFIX: &str = ":filled";

/// Where a node's task reports its confirmations.
trait Confirm: Send + Sync + 'static {
    fn confirmed(&self, tracked: &Tracked, confirmed: Option<Confirmed>);
}

/// A standalone server: its confirmations are the listeners'.
struct Direct;

impl Confirm for Direct {
    fn confirmed(&self, tracked: &Tracked, confirmed: Option<Confirmed>) {
        tracked.synced(confirmed);
    }
}

/// Tracks a standalone server (under Sentinel, whichever is the primary:
/// a change of primary is a reconnection, which resets the listeners),
/// for as long as a listener lives.
pub(super) fn track_standalone(primary: Primary, tracking: Tracking) {
    tokio::spawn(async move {
        loop {
            track_node(
                primary.resp3().0,
                Some(primary.clone()),
                tracking.clone(),
                Arc::new(Direct),
                redis::cmd("PING"),
            )
            .await;
            // Registered while the task was ending: it goes on.
            if !tracking.tracked.keep_going() {
                return;
            }
        }
    });
}

/// One node's tracking connection, while a listener lives: a
/// [`PushConnection`] with tracking turned on for every registered prefix
/// as it connects (and for the prefixes registered later before its next
/// confirmation), whose answered `check`s (sent in place of its `PING`s)
/// are the confirmations.
async fn track_node(
    client: Client,
    following: Option<Primary>,
    tracking: Tracking,
    confirm: Arc<dyn Confirm>,
    check: redis::Cmd,
) {
    // A `PING` slower than this cannot confirm anything useful (the L1
    // stops serving after five confirmation intervals anyway).
    // Not below 200 ms: the connection is shared, and one L1 with a tight
    // `sync_bound` must not make a latency spike drop (and reset) every
    // L1 on the backend; a slow answer only makes its confirmation older.
    let response_timeout = tracking.options.response_timeout;
    let pace = |every: Duration| {
        let timeout = (every * 4).max(Duration::from_millis(200));
        (every, timeout.min(response_timeout))
    };
    let (every, ping_timeout) = pace(tracking.tracked.confirm_every());
    let names = Names {
        connect: "L1 tracking connect",
        ping: "L1 tracking ping",
    };
    let options = tracking.options.clone();
    // Tracking is turned on (or the announcements subscribed) here, not as
    // the connection's setup: a refusal of it must be told from a failure
    // to connect.
    let mut conn = PushConnection::new(client, options, names, every, ping_timeout)
        .health_check(check)
        .ping_at_connect();
    if let Some(primary) = &following {
        conn = conn.following(primary);
    }
    let tracked = &*tracking.tracked;
    // The first failure to track is worth a warning (the L1 does not serve
    // meanwhile); the retries after it are not.
    let mut warned = false;
    confirm.confirmed(tracked, None);
    // What this connection is set up for (the shared mode may move on
    // while it is up: it is read again at each connection).
    let mut announced = false;
    // The registrations this connection has taken on, and their prefixes
    // (a prefix sent twice is refused as overlapping itself: a namespace's
    // cache dropped and built again must not send its prefix again).
    let mut covers = 0;
    let mut taken: HashSet<String> = HashSet::new();
    // The connection's backoff starts over once connected: a setup that
    // keeps failing on a working connection backs off here instead.
    let mut setup_backoff = Backoff::new(MIN_BACKOFF, tracking.options.max_backoff);
    let mut setup_failed = false;
    while tracked.live() {
        match conn.due().await {
            Due::Connect => {
                if std::mem::take(&mut setup_failed) {
                    tokio::time::sleep(setup_backoff.next_interval()).await;
                }
                let mut taking = tracked.all();
                let mut connected = conn.connect().await;
                if connected.is_ok() {
                    announced = tracked.mode() == ANNOUNCED;
                    connected = set_up(&mut conn, &tracking, &taking.prefixes, announced).await;
                    setup_failed = connected.is_err();
                }
                match connected {
                    // Only the setup's own refusal: an error reply to the
                    // connection's handshake (too many clients, a user not
                    // yet created on a new primary) passes, and must not
                    // switch the whole backend to announcements for good.
                    Err(e) if setup_failed && !announced && is_refusal(&e) => {
                        if !tracked.refused(&e) {
                            confirm.confirmed(tracked, None);
                            return;
                        }
                        // The connection is fine, only tracking was
                        // refused: the listeners that go on without it.
                        announced = true;
                        taking = tracked.all();
                        connected = set_up(&mut conn, &tracking, &taking.prefixes, true).await;
                    }
                    _ => {}
                }
                match connected {
                    // From now on every change is reported, but changes
                    // made before were not.
                    Ok(()) => {
                        warned = false;
                        setup_failed = false;
                        setup_backoff.reset();
                        covers = taking.covers;
                        taken = taking.prefixes.into_iter().collect();
                        tracked.reset(0, covers);
                        let (every, timeout) = pace(tracked.confirm_every());
                        conn.pace(every, timeout);
                    }
                    Err(e) => {
                        conn.lost();
                        if std::mem::replace(&mut warned, true) {
                            tracing::debug!(error = %e, "L1 tracking: connect failed");
                        } else {
                            tracing::warn!(
                                error = %e,
                                "L1 tracking: cannot open the tracking connection; the L1 \
                                 does not serve until it can"
                            );
                        }
                    }
                }
            }
            Due::Push(push) => handle(tracked, &push),
            Due::Lost => confirm.confirmed(tracked, None),
            Due::Ping => {
                // Registered since the last confirmation: taken on before
                // this one, which then counts for them too.
                let more = tracked.after(covers, &taken);
                if more.covers > covers {
                    if !more.prefixes.is_empty() {
                        let added = set_up(&mut conn, &tracking, &more.prefixes, announced).await;
                        if let Err(e) = added {
                            tracing::debug!(error = %e, "L1 tracking: adding a prefix failed");
                            conn.lost();
                            confirm.confirmed(tracked, None);
                            continue;
                        }
                        taken.extend(more.prefixes);
                    }
                    tracked.reset(covers, more.covers);
                    covers = more.covers;
                    // A listener that asks for more frequent confirmations.
                    let (every, timeout) = pace(tracked.confirm_every());
                    conn.pace(every, timeout);
                }
                // Pushes are handled while the `PING` is out: a slow answer
                // must not hold back an invalidation already received, or
                // the L1 would serve a changed value for as long as the
                // `PING` takes.
                let answered = conn.ping(|push| handle(tracked, &push)).await;
                let confirmed = answered.ok().map(|at| Confirmed { at, covers });
                confirm.confirmed(tracked, confirmed);
            }
        }
    }
}

/// Turns tracking on for `prefixes`, or subscribes to their announced
/// changes, on the connection (just made, or live and tracking others).
async fn set_up(
    conn: &mut PushConnection,
    tracking: &Tracking,
    prefixes: &[String],
    announced: bool,
) -> Result<(), BackendError> {
    let timeout = tracking.options.response_timeout;
    if prefixes.is_empty() {
        return Ok(());
    }
    let Some(c) = conn.conn() else {
        return Err(super::push::disconnected("CLIENT TRACKING"));
    };
    if announced {
        // One at a time: a server refuses the whole command for one
        // pattern its ACL does not grant, and one cache's namespace left
        // out of the ACL must not stop the other caches' L1s.
        for prefix in prefixes {
            let pattern = announced_pattern(prefix);
            match with_deadline("PSUBSCRIBE", timeout, c.psubscribe(&pattern)).await {
                Ok(()) => {}
                Err(e) if is_refusal(&e) => tracking.tracked.refuse_prefix(prefix, &e),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    } else {
        let mut on = redis::cmd("CLIENT");
        on.arg("TRACKING").arg("ON").arg("BCAST");
        for prefix in prefixes {
            on.arg("PREFIX").arg(prefix);
        }
        with_deadline("CLIENT TRACKING", timeout, on.query_async::<Value>(c))
            .await
            .map(drop)
    }
}

/// Handles one push: a tracking invalidation, or an announced change.
fn handle(tracked: &Tracked, push: &PushInfo) {
    if push.kind == PushKind::PMessage {
        announced(tracked, push);
        return;
    }
    if push.kind != PushKind::Invalidate {
        return;
    }
    match push.data.first() {
        Some(Value::Array(keys)) | Some(Value::Set(keys)) => {
            for key in keys {
                match key {
                    Value::BulkString(key) => tracked.changed(key),
                    Value::SimpleString(key) => tracked.changed(key.as_bytes()),
                    _ => tracked.reset_all(),
                }
            }
        }
        // `nil`: the database was flushed.
        _ => tracked.reset_all(),
    }
}

/// Handles an announced change: `[pattern, channel, message]`, the channel
/// a value's (`<value key>:filled`) or a mark's (`<mark key>:filled`).
fn announced(tracked: &Tracked, push: &PushInfo) {
    let bytes = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) => Some(b.clone()),
        Some(Value::SimpleString(s)) => Some(s.clone().into_bytes()),
        _ => None,
    };
    let (Some(channel), message) = (bytes(push.data.get(1)), bytes(push.data.get(2))) else {
        return;
    };
    // A lost lease changed no value.
    if message.as_deref() == Some(b"lost".as_slice()) {
        return;
    }
    let Some(key) = channel.strip_suffix(ANNOUNCED_SUFFIX.as_bytes()) else {
        return;
    };
    let Some(prefix) = tracked.prefix_of(key) else {
        return;
    };
    // A mark moves the namespace's generation too (one script, one
    // announcement): reported first, as tracking would.
    let marks = format!("{prefix}#}}:");
    if key.starts_with(marks.as_bytes()) {
        tracked.changed(format!("{marks}gen").as_bytes());
    }
    tracked.changed(key);
}

/// The cluster's masters' confirmations: the listeners are in sync as of
/// the oldest among the current masters, for the registrations every one
/// of them has taken on (none yet: not in sync).
struct Confirmations {
    nodes: Mutex<HashMap<String, Option<Confirmed>>>,
}

/// A cluster node's confirmations, reported into [`Confirmations`].
struct NodeConfirm {
    addr: String,
    all: Arc<Confirmations>,
}

impl Confirmations {
    /// Tells the listeners, under the lock: a confirmation computed before
    /// another node's loss must not be told after it.
    fn publish(&self, tracked: &Tracked) {
        let nodes = self.nodes.lock();
        let oldest = nodes
            .values()
            .try_fold(None::<Confirmed>, |oldest, node| {
                let node = (*node)?;
                Some(Some(match oldest {
                    None => node,
                    Some(o) => Confirmed {
                        at: o.at.min(node.at),
                        covers: o.covers.min(node.covers),
                    },
                }))
            })
            .flatten();
        tracked.synced(oldest);
        drop(nodes);
    }
}

impl Confirm for NodeConfirm {
    fn confirmed(&self, tracked: &Tracked, confirmed: Option<Confirmed>) {
        if let Some(slot) = self.all.nodes.lock().get_mut(&self.addr) {
            *slot = confirmed;
        } else {
            // No longer a master: its word does not count.
            return;
        }
        self.all.publish(tracked);
    }
}

/// Tracks every master of the cluster, following the router's slot map,
/// for as long as a listener lives.
pub(super) fn track_cluster(router: WeakRouter, tracking: Tracking) {
    tokio::spawn(async move {
        let all = Arc::new(Confirmations {
            nodes: Mutex::new(HashMap::new()),
        });
        let mut tasks: HashMap<String, JoinHandle<()>> = HashMap::new();
        let mut changes = match router.upgrade() {
            Some(router) => router.changes(),
            None => return,
        };
        let tracked = tracking.tracked.clone();
        loop {
            let Some(router) = router.upgrade() else {
                break;
            };
            let masters = router.masters();
            drop(router);
            if !tracked.keep_going() {
                // Every listener gone, or refused for good (those told
                // they are not in sync when they refused).
                break;
            }
            let mut changed = false;
            tasks.retain(|addr, task| {
                let keep = masters.iter().any(|(a, _)| a == addr) && !task.is_finished();
                if !keep {
                    task.abort();
                    all.nodes.lock().remove(addr);
                    changed = true;
                }
                keep
            });
            // A master no longer in the map: its word goes (one whose
            // connection could not be made is in the map without a task).
            all.nodes
                .lock()
                .retain(|addr, _| masters.iter().any(|(a, _)| a == addr));
            for (addr, client) in masters {
                if tasks.contains_key(&addr) {
                    continue;
                }
                // A master without a connection is not in sync: entered
                // before the connection is tried, so that one that cannot
                // be made keeps the listeners out of sync until it is.
                all.nodes.lock().insert(addr.clone(), None);
                changed = true;
                let Ok(client) = resp3(&client) else {
                    continue;
                };
                let confirm = Arc::new(NodeConfirm {
                    addr: addr.clone(),
                    all: all.clone(),
                });
                // Answered by a master only (see the module docs).
                let mut master_only = redis::cmd("WAIT");
                master_only.arg(0).arg(0);
                tasks.insert(
                    addr,
                    tokio::spawn(track_node(
                        client,
                        None,
                        tracking.clone(),
                        confirm,
                        master_only,
                    )),
                );
                changed = true;
            }
            if changed {
                all.publish(&tracked);
            }
            // The slot map changed, or a periodic look (a node's task may
            // have ended, or the map may have changed without a
            // notification we saw).
            let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
        }
        for task in tasks.values() {
            task.abort();
        }
    });
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;
    use tokio::time::Instant;

    use super::*;
    use crate::backend::ChangeListener;

    #[derive(Default)]
    struct Heard(Mutex<Vec<String>>);

    impl ChangeListener for Heard {
        fn changed(&self, value_key: &[u8]) {
            self.0
                .lock()
                .push(String::from_utf8_lossy(value_key).into());
        }
        fn reset(&self) {
            self.0.lock().push("reset".into());
        }
        fn synced(&self, _: Option<Instant>) {}
    }

    fn pmessage(channel: &str, message: &str) -> PushInfo {
        PushInfo {
            kind: PushKind::PMessage,
            data: vec![
                Value::BulkString(b"pattern".to_vec()),
                Value::BulkString(channel.as_bytes().to_vec()),
                Value::BulkString(message.as_bytes().to_vec()),
            ],
        }
    }

    #[test]
    fn the_pattern_escapes_the_namespace() {
        assert_eq!(announced_pattern("users:{"), "users:{*:filled");
        assert_eq!(
            announced_pattern("a*b?[c]\\:{"),
            "a\\*b\\?\\[c\\]\\\\:{*:filled"
        );
    }

    #[test]
    fn announcements_name_the_changed_keys() {
        let heard = Arc::new(Heard::default());
        let listener: Arc<dyn ChangeListener> = heard.clone();
        let tracked = Tracked::new();
        tracked
            .add(
                "ns:{",
                Duration::from_millis(50),
                Arc::downgrade(&listener),
                None,
            )
            .unwrap();
        handle(&tracked, &pmessage("ns:{k}:filled", "set"));
        // A lost lease changed nothing.
        handle(&tracked, &pmessage("ns:{k}:filled", "lost"));
        // A mark: the generation, then the mark.
        handle(&tracked, &pmessage("ns:{#}:tag:t:filled", "mark"));
        // Not an announcement.
        handle(&tracked, &pmessage("ns:{k}:other", "set"));
        // Another namespace's.
        handle(&tracked, &pmessage("other:{k}:filled", "set"));
        assert_eq!(
            *heard.0.lock(),
            ["ns:{k}", "ns:{#}:gen", "ns:{#}:tag:t"].map(String::from)
        );
    }
}
