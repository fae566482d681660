//! The Lua scripts that make each [`Backend`](crate::Backend) step atomic.
//!
//! Each script lives in its own file under `scripts/` (so it can be read and
//! linted as Lua) and states its `KEYS`, `ARGV` and reply there. The scripts
//! that announce a change call `redis.call('__PUBLISH__', …)`: the
//! placeholder is a plain Lua string, replaced by `PUBLISH` for a standalone
//! server and by `SPUBLISH` (sharded pub/sub, routed by the channel's slot)
//! on a cluster. The scripts that write a value start with `stamp.lua`
//! (the server's expiry in the envelope, decision 0011). Scripts are sent
//! with `EVALSHA` and loaded again on
//! `NOSCRIPT` (after a server restart or failover) by the driver's
//! [`Script`].

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// One backend's scripts, with its publish command filled in.
pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) fill: Script,
    pub(super) release: Script,
    pub(super) extend: Script,
    pub(super) set: Script,
    pub(super) invalidate: Script,
}

pub(super) static STANDALONE_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("PUBLISH"));
pub(super) static CLUSTER_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("SPUBLISH"));

const ACQUIRE: &str = include_str!("scripts/acquire.lua");
const FILL: &str = include_str!("scripts/fill.lua");
const RELEASE: &str = include_str!("scripts/release.lua");
const EXTEND: &str = include_str!("scripts/extend.lua");
const SET: &str = include_str!("scripts/set.lua");
const INVALIDATE: &str = include_str!("scripts/invalidate.lua");
/// Prepended to the scripts that write a value: `stamp(bytes, ttl_ms)`.
const STAMP: &str = include_str!("scripts/stamp.lua");

/// What the scripts write where the publish command goes.
const PUBLISH_PLACEHOLDER: &str = "__PUBLISH__";

impl Scripts {
    fn new(publish: &str) -> Scripts {
        let script = |lua: &str| Script::new(&lua.replace(PUBLISH_PLACEHOLDER, publish));
        let writing = |lua: &str| script(&format!("{STAMP}\n{lua}"));
        Scripts {
            acquire: script(ACQUIRE),
            fill: writing(FILL),
            release: writing(RELEASE),
            extend: script(EXTEND),
            set: writing(SET),
            invalidate: script(INVALIDATE),
        }
    }
}

/// One call of a script: its keys and arguments, sent as `EVALSHA`, with
/// the script loaded again on `NOSCRIPT`. Unlike the driver's
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
    /// `asking`), loading it first if the server does not know it.
    pub(super) async fn invoke<T: FromRedisValue, C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        asking: bool,
    ) -> RedisResult<T> {
        match self.send(conn, asking).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.send(conn, asking).await
            }
            result => result,
        }
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
        for lua in [FILL, RELEASE, SET, INVALIDATE] {
            assert!(lua.contains(&format!("redis.call('{PUBLISH_PLACEHOLDER}'")));
        }
        for lua in [ACQUIRE, EXTEND] {
            assert!(!lua.contains(PUBLISH_PLACEHOLDER));
        }
    }
}
