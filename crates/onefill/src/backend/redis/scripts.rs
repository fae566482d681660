//! The Lua scripts that make each [`Backend`](crate::Backend) step atomic.
//!
//! Each script lives in its own file under `scripts/` (so it can be read and
//! linted as Lua) and states its `KEYS`, `ARGV` and reply there. A script
//! that tells waiters of a key's lease (a lost lease) calls
//! `redis.call('__PUBLISH__', …)`: the placeholder is a plain Lua string,
//! replaced by `PUBLISH` for a standalone server and by `SPUBLISH` (sharded
//! pub/sub, routed by the channel's slot) on a cluster. A script that
//! changes a value calls `announce(channel, message)`, prepended to it
//! ([`ANNOUNCE_STANDALONE`], [`ANNOUNCE_CLUSTER`]): the waiters hear of it as
//! before, and so do the L1s that cannot track keys (a server that refuses
//! `CLIENT TRACKING`, decision 0021), which pattern-subscribe to their
//! namespace's channels on every master. On a standalone server that is
//! the same `PUBLISH`; on a cluster a sharded message reaches no pattern,
//! so a plain `PUBLISH` of the same channel follows (one more command in
//! the script, no round trip). The mark script publishes its mark's
//! channel with a plain `PUBLISH` everywhere. The scripts that write a value start with `stamp.lua`
//! (the server's expiry in the envelope, decision 0011); the scripts that
//! expire one in place start with `soften.lua`, which keeps that recorded
//! expiry true.
//!
//! Scripts are sent with `EVALSHA`, and the server knows every one before
//! a call needs it: all are loaded when a standalone backend connects
//! ([`Scripts::load_all`]), and all again when one meets `NOSCRIPT` (a
//! restart, a failover, a flush; a cluster node's first script call). A
//! cluster node is not loaded when its connection is made: measured, that
//! made calls of a graceful failover slower than 100 ms seconds after the
//! promotion, every run; its first `NOSCRIPT` loads them all. Loading a script only when its own call
//! meets `NOSCRIPT` is not enough: a call whose caller gave up while the
//! server hung still runs when the server resumes, and if it meets
//! `NOSCRIPT` then, nobody is left to load the script and send it again.
//! The cache relies on such a call: after a lease request whose reply was
//! lost, it sends the compare-and-delete of its token, which runs right
//! after the request once the server resumes. A healthy lease ends with
//! its fill, so the release script was the one the server did not know
//! yet, and the lease the late request took stayed held for its TTL.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

use super::durability::{sends, Wait};

/// One backend's scripts, with its publish command filled in.
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) fill: Script,
    pub(super) release: Script,
    pub(super) extend: Script,
    pub(super) set: Script,
    pub(super) invalidate: Script,
    pub(super) expire: Script,
    /// `expire`'s step on the value alone (a cluster slot that migrates).
    pub(super) expire_value: Script,
    /// `invalidate`'s step on the value alone (a cluster slot that
    /// migrates).
    pub(super) invalidate_value: Script,
    pub(super) mark: Script,
}

pub(super) static STANDALONE_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("PUBLISH"));
pub(super) static CLUSTER_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("SPUBLISH"));

const ACQUIRE: &str = include_str!("scripts/acquire.lua");
const FILL: &str = include_str!("scripts/fill.lua");
const RELEASE: &str = include_str!("scripts/release.lua");
const EXTEND: &str = include_str!("scripts/extend.lua");
const SET: &str = include_str!("scripts/set.lua");
const INVALIDATE: &str = include_str!("scripts/invalidate.lua");
const EXPIRE: &str = include_str!("scripts/expire.lua");
const EXPIRE_VALUE: &str = include_str!("scripts/expire_value.lua");
const INVALIDATE_VALUE: &str = include_str!("scripts/invalidate_value.lua");
/// Prepended to the scripts that invalidate: `written_since(key, age_ms)`.
const WRITTEN: &str = include_str!("scripts/written.lua");
/// Prepended to the scripts that expire a value in place: `soften(key)`.
const SOFTEN: &str = include_str!("scripts/soften.lua");
const MARK: &str = include_str!("scripts/mark.lua");
/// Prepended to the scripts that write a value: `stamp(bytes, ttl_ms)`.
const STAMP: &str = include_str!("scripts/stamp.lua");

/// What the scripts write where the publish command goes.
const PUBLISH_PLACEHOLDER: &str = "__PUBLISH__";

/// `announce` on a standalone server: the waiters' `PUBLISH` is the one
/// the L1s' pattern subscriptions receive.
const ANNOUNCE_STANDALONE: &str =
    "local function announce(channel, message) redis.call('PUBLISH', channel, message) end";

/// `announce` on a cluster: the waiters' sharded message reaches no pattern
/// subscription, so the L1s get a plain one, which the node delivers to
/// its own subscribers before the script returns (and sends to the other
/// nodes over the cluster bus).
const ANNOUNCE_CLUSTER: &str = "local function announce(channel, message) \
     redis.call('SPUBLISH', channel, message) redis.call('PUBLISH', channel, message) end";

impl Scripts {
    /// Loads every script into the server's script cache; the loads go out
    /// together on the multiplexed connection.
    pub(super) async fn load_all<C: ConnectionLike + Clone + Send>(
        &self,
        conn: &C,
    ) -> RedisResult<()> {
        let all = [
            &self.acquire,
            &self.fill,
            &self.release,
            &self.extend,
            &self.set,
            &self.invalidate,
            &self.expire,
            &self.expire_value,
            &self.invalidate_value,
            &self.mark,
        ];
        let loads = all.map(|script| {
            let mut conn = conn.clone();
            async move { script.load_async(&mut conn).await }
        });
        futures_util::future::try_join_all(loads).await.map(drop)
    }

    fn new(publish: &str) -> Scripts {
        let announce = if publish == "PUBLISH" {
            ANNOUNCE_STANDALONE
        } else {
            ANNOUNCE_CLUSTER
        };
        let script = |lua: &str| Script::new(&lua.replace(PUBLISH_PLACEHOLDER, publish));
        let announcing = |lua: &str| script(&format!("{announce}\n{lua}"));
        let writing = |lua: &str| announcing(&format!("{STAMP}\n{lua}"));
        let softening = |lua: &str| announcing(&format!("{SOFTEN}\n{lua}"));
        Scripts {
            acquire: script(ACQUIRE),
            fill: writing(FILL),
            release: writing(RELEASE),
            extend: script(EXTEND),
            set: writing(SET),
            invalidate: announcing(&format!("{WRITTEN}\n{INVALIDATE}")),
            expire: softening(EXPIRE),
            expire_value: softening(EXPIRE_VALUE),
            invalidate_value: script(&format!("{WRITTEN}\n{INVALIDATE_VALUE}")),
            mark: script(MARK),
        }
    }
}

/// One call of a script: its keys and arguments, sent as `EVALSHA`, with
/// every script of its set loaded again on `NOSCRIPT`. Unlike the driver's
/// `ScriptInvocation`, it can also be sent right after an `ASKING`, in one
/// pipeline, as a Redis Cluster `ASK` redirection needs on a shared
/// connection.
pub(super) struct ScriptCall<'a> {
    script: &'a Script,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl<'a> ScriptCall<'a> {
    pub(super) fn new(script: &'a Script) -> Self {
        ScriptCall {
            script,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    pub(super) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub(super) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    pub(super) fn evalsha(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// Runs the script on `conn` (after an `ASKING`, in one pipeline, if
    /// `asking`). If the server does not know it, it forgot them all: every
    /// script of `scripts` (the set this one belongs to) is loaded again
    /// before it is sent again (see the module docs).
    pub(super) async fn invoke<T: FromRedisValue, C: ConnectionLike + Clone + Send>(
        &self,
        scripts: &Scripts,
        conn: &mut C,
        asking: bool,
    ) -> RedisResult<T> {
        match self.send(conn, asking).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                scripts.load_all(conn).await?;
                self.send(conn, asking).await
            }
            result => result,
        }
    }

    /// [`invoke`](Self::invoke), with `wait`'s `WAIT` right behind the
    /// script in the same pipeline (one round trip, on the same
    /// connection, so it waits for this write): the script's reply and
    /// how many replicas confirmed, `None` without a `wait`.
    pub(super) async fn invoke_then_wait<T: FromRedisValue, C: ConnectionLike + Clone + Send>(
        &self,
        scripts: &Scripts,
        conn: &mut C,
        asking: bool,
        wait: Option<Wait>,
    ) -> RedisResult<(T, Option<i64>)> {
        let Some(wait) = wait.filter(|w| sends(Some(*w))) else {
            return Ok((self.invoke(scripts, conn, asking).await?, None));
        };
        match self.send_then_wait(conn, asking, wait).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                scripts.load_all(conn).await?;
                self.send_then_wait(conn, asking, wait).await
            }
            result => result,
        }
    }

    async fn send_then_wait<T: FromRedisValue, C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        asking: bool,
        wait: Wait,
    ) -> RedisResult<(T, Option<i64>)> {
        let mut pipe = redis::pipe();
        if asking {
            pipe.cmd("ASKING").ignore();
        }
        pipe.add_command(self.evalsha());
        wait.append(&mut pipe);
        let (value, acked): (T, i64) = pipe.query_async(conn).await?;
        Ok((value, Some(acked)))
    }

    async fn send<T: FromRedisValue, C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        asking: bool,
    ) -> RedisResult<T> {
        if asking {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").ignore().add_command(self.evalsha());
            let (value,): (T,) = pipe.query_async(conn).await?;
            Ok(value)
        } else {
            self.evalsha().query_async(conn).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_script_sets_publish_the_right_way() {
        assert!(!STANDALONE_SCRIPTS.fill.get_hash().is_empty());
        assert_ne!(
            STANDALONE_SCRIPTS.fill.get_hash(),
            CLUSTER_SCRIPTS.fill.get_hash()
        );
        assert_eq!(
            STANDALONE_SCRIPTS.acquire.get_hash(),
            CLUSTER_SCRIPTS.acquire.get_hash()
        );
        // The placeholder sits in code, not only in the header comment.
        for lua in [FILL, RELEASE, EXTEND] {
            assert!(lua.contains(&format!("redis.call('{PUBLISH_PLACEHOLDER}'")));
        }
        // Every write of a value announces it.
        for lua in [FILL, RELEASE, SET, INVALIDATE, EXPIRE] {
            assert!(lua.contains("\nannounce(KEYS[3], ") || lua.contains("  announce(KEYS[3], "));
        }
        assert!(MARK.contains("redis.call('PUBLISH', KEYS[2] .. ':filled', 'mark')"));
        assert!(!ACQUIRE.contains(PUBLISH_PLACEHOLDER));
        assert!(!EXPIRE_VALUE.contains(PUBLISH_PLACEHOLDER));
    }
}
