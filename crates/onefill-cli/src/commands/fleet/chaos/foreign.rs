//! The foreign client of a chaos run: another client of the same server
//! acting on the fleet's keys at random, never through the fleet's caches.
//!
//! It writes new versions through a cache of its own (no L1, its own
//! backend: to the fleet it is another process), and acts on the value
//! keys directly: `DEL`, `PEXPIRE` to 50–500 ms, `PERSIST`, and `SET` of
//! bytes no cache can read (with a short TTL). Each raw act runs in a
//! script that reads the key (`GET`, `PTTL`), acts, reads it again and
//! returns the server's `TIME`, so the record says exactly what the server
//! held on either side of the act and when; a write through the cache is
//! framed by two such reads.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use onefill::backend::FillKeys;
use onefill::Cache;

use super::random::Random;
use super::records::{now_us, ForeignOp, Observation, OpKind};
use super::version::{held, value_of};
use crate::commands::fleet::args::RunArgs;
use crate::commands::fleet::connections::{cache, L1Choice, Raw};

/// Read, act, read, `TIME`: one atomic step on the server.
const ACT: &str = r"
local before = redis.call('GET', KEYS[1])
local before_ttl = redis.call('PTTL', KEYS[1])
local op = ARGV[1]
local changed = 0
if op == 'del' then
  changed = redis.call('DEL', KEYS[1])
elseif op == 'pexpire' then
  changed = redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif op == 'persist' then
  changed = redis.call('PERSIST', KEYS[1])
elseif op == 'unreadable' then
  redis.call('SET', KEYS[1], 'not a cached value', 'PX', ARGV[2])
  changed = 1
end
local after = redis.call('GET', KEYS[1])
local after_ttl = redis.call('PTTL', KEYS[1])
local t = redis.call('TIME')
return {before or false, before_ttl, changed, after or false, after_ttl, t[1], t[2]}
";

/// How long one foreign act may take before it counts as failed.
const ACT_TIMEOUT: Duration = Duration::from_secs(5);

/// The foreign client's thread, connected and waiting for the start.
pub struct Foreign {
    go: mpsc::Sender<Instant>,
    thread: JoinHandle<anyhow::Result<Vec<ForeignOp>>>,
}

impl Foreign {
    /// Connects (a cache without L1 and a plain connection) on a thread of
    /// its own; returns once connected.
    pub fn connect(run: &RunArgs, namespace: &str, ops_per_sec: u32) -> anyhow::Result<Foreign> {
        let (go, started) = mpsc::channel::<Instant>();
        let (ready_tx, ready) = mpsc::channel::<anyhow::Result<()>>();
        let run = run.clone();
        let namespace = namespace.to_owned();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the foreign client's runtime")?;
            runtime.block_on(async move {
                let connected = async {
                    let raw = Raw::connect(&run).await?;
                    let cache = cache(&run, &namespace, L1Choice::Off)
                        .await?
                        .context("the chaos run needs a onefill strategy")?;
                    anyhow::Ok((raw, cache))
                }
                .await;
                let (raw, cache) = match connected {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let message = format!("{e:#}");
                        let _ = ready_tx.send(Err(e));
                        return Err(anyhow!(message));
                    }
                };
                let Ok(start) = started.recv() else {
                    return Ok(Vec::new());
                };
                let client = Client {
                    raw,
                    cache,
                    value_keys: run
                        .keys
                        .iter()
                        .map(|k| FillKeys::new(&namespace, k).value().to_owned())
                        .collect(),
                    keys: run.keys.clone(),
                };
                Ok(client
                    .act_until(start + Duration::from_millis(run.duration_ms), ops_per_sec)
                    .await)
            })
        });
        ready
            .recv()
            .context("the foreign client stopped before it connected")??;
        Ok(Foreign { go, thread })
    }

    /// Starts acting now, until `--duration-ms` after `start`.
    pub fn start(&self, start: Instant) {
        let _ = self.go.send(start);
    }

    /// Waits for the end of the run and returns what it did.
    pub fn finish(self) -> anyhow::Result<Vec<ForeignOp>> {
        drop(self.go);
        self.thread
            .join()
            .map_err(|_| anyhow!("the foreign client panicked"))?
    }
}

struct Client {
    raw: Raw,
    cache: Cache<String, String>,
    keys: Vec<String>,
    value_keys: Vec<String>,
}

impl Client {
    async fn act_until(&self, end: Instant, ops_per_sec: u32) -> Vec<ForeignOp> {
        let mut random = Random::new();
        let mut ops = Vec::new();
        let mut tick =
            tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(ops_per_sec.max(1))));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut written = 0u64;
        while Instant::now() < end {
            tick.tick().await;
            let key = random.below(self.keys.len() as u64) as u32;
            // Writes and deletions most, so answers are often of a
            // replaced version; TTL changes next.
            let op = match random.below(20) {
                0..=5 => {
                    written += 1;
                    self.write(key, &format!("f{written}")).await
                }
                6..=9 => self.act(key, OpKind::Del, None).await,
                10..=14 => {
                    let ttl = random.within(50, 500);
                    self.act(key, OpKind::Pexpire, Some(ttl)).await
                }
                15..=17 => self.act(key, OpKind::Persist, None).await,
                _ => {
                    let ttl = random.within(100, 1_000);
                    self.act(key, OpKind::Unreadable, Some(ttl)).await
                }
            };
            ops.push(op);
        }
        ops
    }

    /// One raw act in the script.
    async fn act(&self, key: u32, kind: OpKind, ttl_ms: Option<u64>) -> ForeignOp {
        let name = match kind {
            OpKind::Del => "del",
            OpKind::Pexpire => "pexpire",
            OpKind::Persist => "persist",
            OpKind::Unreadable => "unreadable",
            OpKind::Set => "probe",
        };
        let sent = now_us();
        let reply = self.script(key, name, ttl_ms).await;
        let returned = now_us();
        let mut op = ForeignOp {
            key,
            kind,
            sent,
            returned,
            before: None,
            after: None,
            changed: false,
            ttl_ms,
            version: None,
            error: None,
        };
        match reply {
            Ok((before, changed, after)) => {
                op.before = Some(before);
                op.after = Some(after);
                op.changed = changed;
            }
            Err(e) => op.error = Some(e),
        }
        op
    }

    /// A new version through the parent's own cache, between two reads.
    async fn write(&self, key: u32, id: &str) -> ForeignOp {
        let sent = now_us();
        let before = self.script(key, "probe", None).await;
        let wrote = tokio::time::timeout(
            ACT_TIMEOUT,
            self.cache.set(&self.keys[key as usize], value_of(id)),
        )
        .await;
        let after = self.script(key, "probe", None).await;
        let returned = now_us();
        let error = match wrote {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {ACT_TIMEOUT:?}")),
        };
        ForeignOp {
            key,
            kind: OpKind::Set,
            sent,
            returned,
            before: before.ok().map(|(b, _, _)| b),
            after: after.ok().map(|(_, _, a)| a),
            changed: error.is_none(),
            ttl_ms: None,
            version: Some(id.to_owned()),
            error,
        }
    }

    /// Runs the script on `key`: what it held before, whether the act
    /// changed it, what it held after.
    async fn script(
        &self,
        key: u32,
        op: &str,
        arg: Option<u64>,
    ) -> Result<(Observation, bool, Observation), String> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(ACT)
            .arg(1)
            .arg(&self.value_keys[key as usize])
            .arg(op)
            .arg(arg.unwrap_or(0));
        let reply = tokio::time::timeout(ACT_TIMEOUT, self.raw.query::<redis::Value>(&cmd))
            .await
            .map_err(|_| format!("no answer within {ACT_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        parse_reply(&reply).ok_or_else(|| format!("an unexpected reply: {reply:?}"))
    }
}

/// The script's reply: `[before, before_ttl, changed, after, after_ttl,
/// seconds, microseconds]`.
fn parse_reply(reply: &redis::Value) -> Option<(Observation, bool, Observation)> {
    use redis::Value;
    let Value::Array(fields) = reply else {
        return None;
    };
    let bytes = |v: &Value| -> Option<Option<Vec<u8>>> {
        match v {
            Value::Nil => Some(None),
            Value::BulkString(b) => Some(Some(b.clone())),
            _ => None,
        }
    };
    let int = |v: &Value| -> Option<i64> {
        match v {
            Value::Int(n) => Some(*n),
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    };
    let [before, before_ttl, changed, after, after_ttl, secs, micros] = fields.as_slice() else {
        return None;
    };
    let t = u64::try_from(int(secs)?).ok()? * 1_000_000 + u64::try_from(int(micros)?).ok()?;
    let before = bytes(before)?;
    let after = bytes(after)?;
    Some((
        Observation {
            t,
            held: held(before.as_deref()),
            pttl_ms: int(before_ttl)?,
        },
        int(changed)? == 1,
        Observation {
            t,
            held: held(after.as_deref()),
            pttl_ms: int(after_ttl)?,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::fleet::chaos::records::Held;
    use redis::Value;

    #[test]
    fn the_script_s_reply_is_read() {
        let reply = Value::Array(vec![
            Value::BulkString(b"\xf1\x02....\"chaos|f3|\"".to_vec()),
            Value::Int(1_200),
            Value::Int(1),
            Value::Nil,
            Value::Int(-2),
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"123456".to_vec()),
        ]);
        let (before, changed, after) = parse_reply(&reply).expect("parses");
        assert_eq!(before.held, Held::Version("f3".to_owned()));
        assert_eq!((before.pttl_ms, changed), (1_200, true));
        assert_eq!((after.held, after.pttl_ms), (Held::Absent, -2));
        assert_eq!(after.t, 1_700_000_000_123_456);
        assert!(parse_reply(&Value::Nil).is_none());
        assert!(parse_reply(&Value::Array(vec![Value::Int(1)])).is_none());
    }
}
