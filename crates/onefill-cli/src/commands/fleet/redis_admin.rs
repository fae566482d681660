//! Talking to Redis directly from the parent: reading the load counters and
//! the servers' command statistics around a run.
//!
//! Every connection has a timeout; in a cluster a node that cannot be
//! reached (killed by `--fault kill`, say) is skipped. Through Sentinels,
//! the parent talks to the primary they name at the time ([`admin_run`]):
//! after a failover, the command counts before and after the run are
//! then of different servers (the new primary's count from zero).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::bail;

use super::args::RunArgs;
use super::fault::sentinel::{node_url, primary_named};
use crate::shared::urls::redact;

/// The run as the parent's own commands see it: through Sentinels, the
/// one server they name as the primary now (asked again at each call, so
/// after a failover the new one); otherwise the run as given.
pub fn admin_run(args: &RunArgs) -> anyhow::Result<RunArgs> {
    let Some(name) = args
        .master_name
        .as_deref()
        .filter(|_| !args.sentinel.is_empty())
    else {
        return Ok(args.clone());
    };
    let primary = primary_named(&args.sentinel, name)?;
    Ok(RunArgs {
        redis: vec![node_url(&primary)],
        sentinel: Vec::new(),
        master_name: None,
        ..args.clone()
    })
}

/// Connect, read and write timeout of the parent's own commands.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// A short-lived connection with timeouts.
fn connect(url: &str) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let con = client.get_connection_with_timeout(ADMIN_TIMEOUT)?;
    con.set_read_timeout(Some(ADMIN_TIMEOUT))?;
    con.set_write_timeout(Some(ADMIN_TIMEOUT))?;
    Ok(con)
}

/// A connection to `url`, or `None` for a cluster node that cannot be
/// reached (one server that cannot be reached is an error).
fn reach(args: &RunArgs, url: &str) -> anyhow::Result<Option<redis::Connection>> {
    match connect(url) {
        Ok(con) => Ok(Some(con)),
        Err(_) if args.cluster => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Runs one command on every node (or the one server) with a short-lived
/// connection and returns the first node's reply as text.
pub fn admin(args: &RunArgs, cmd: &[&str]) -> anyhow::Result<String> {
    let mut first = None;
    let single_key_command = matches!(cmd[0], "GET" | "SCARD" | "DEL");
    for url in &args.redis {
        let Some(mut con) = reach(args, url)? else {
            continue;
        };
        let mut c = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            c.arg(*a);
        }
        if single_key_command && args.cluster {
            // Route by asking every node; only the owner answers (the
            // others say MOVED, an error here).
            let reply: redis::RedisResult<redis::Value> = c.query(&mut con);
            match reply {
                Ok(redis::Value::Nil) | Err(_) => continue,
                Ok(redis::Value::Int(n)) => return Ok(n.to_string()),
                Ok(redis::Value::BulkString(b)) => {
                    return Ok(String::from_utf8_lossy(&b).into_owned())
                }
                Ok(other) => return Ok(format!("{other:?}")),
            }
        }
        let reply: redis::Value = match c.query(&mut con) {
            Ok(reply) => reply,
            // A cluster node that stopped answering (a fault) is skipped.
            Err(e) if args.cluster && (e.is_timeout() || e.is_io_error()) => continue,
            Err(e) => return Err(e.into()),
        };
        if first.is_none() {
            first = Some(match reply {
                redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                redis::Value::VerbatimString { text, .. } => text,
                redis::Value::SimpleString(s) => s,
                redis::Value::Nil => String::new(),
                redis::Value::Int(n) => n.to_string(),
                other => format!("{other:?}"),
            });
        }
        if single_key_command {
            break;
        }
    }
    Ok(first.unwrap_or_default())
}

/// Checks that the server (or, in a cluster, at least one node) answers a
/// `PING`, before any worker is started: a fleet that cannot connect fails
/// with one line naming the URL (never its password), not once per worker.
pub fn check_reachable(args: &RunArgs) -> anyhow::Result<()> {
    let mut last_error = None;
    for url in &args.redis {
        let answer = connect(url).and_then(|mut con| redis::cmd("PING").query::<String>(&mut con));
        match answer {
            Ok(_) => return Ok(()),
            Err(e) => last_error = Some((url, e)),
        }
    }
    match last_error {
        Some((url, e)) if args.redis.len() == 1 => {
            bail!("cannot reach Redis at {}: {e}", redact(url))
        }
        Some((_, e)) => {
            let shown: Vec<String> = args.redis.iter().map(|u| redact(u)).collect();
            bail!(
                "cannot reach any of the cluster nodes {}: {e}",
                shown.join(", ")
            )
        }
        None => bail!("no Redis URL given"),
    }
}

/// Every node's command count (`INFO commandstats`, less the parent's own
/// `INFO` and `CONFIG` commands), read before and after a run: the run's
/// cost is the difference. (Resetting the statistics would be simpler and
/// would wipe a server's statistics its owner may be watching; the
/// difference also counts other clients' commands during the run, on a
/// server shared with them.)
#[derive(Debug, Default, Clone)]
pub struct CommandCounts {
    by_node: HashMap<String, u64>,
}

impl CommandCounts {
    /// Reads every node's count (nodes that do not answer, in a cluster,
    /// are left out).
    pub fn read(args: &RunArgs) -> anyhow::Result<CommandCounts> {
        let mut by_node = HashMap::new();
        for url in &args.redis {
            let Some(mut con) = reach(args, url)? else {
                continue;
            };
            match redis::cmd("INFO")
                .arg("commandstats")
                .query::<String>(&mut con)
            {
                Ok(info) => {
                    by_node.insert(url.clone(), parse_commandstats(&info));
                }
                Err(e) if args.cluster && (e.is_timeout() || e.is_io_error()) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(CommandCounts { by_node })
    }

    /// The commands run since `before`, summed over the nodes. A node that
    /// answers now and did not then counts from zero; a count that went
    /// down (the node restarted, or someone reset its statistics) counts
    /// from the reset.
    pub fn since(&self, before: &CommandCounts) -> u64 {
        self.by_node
            .iter()
            .map(|(node, &now)| match before.by_node.get(node) {
                Some(&then) if then <= now => now - then,
                _ => now,
            })
            .sum()
    }
}

/// Deletes keys of the run (the load counters and the loading pids beside
/// them, a chaos run's values): on one server in batches over one
/// connection; on a cluster each key on its own (they live in different
/// slots), through whichever node owns it.
pub fn delete_keys(args: &RunArgs, keys: &[String]) -> anyhow::Result<()> {
    if args.cluster {
        for key in keys {
            admin(args, &["DEL", key])?;
        }
        return Ok(());
    }
    // One server: one connection, up to 1,000 keys per `DEL`.
    let Some(mut con) = reach(args, &args.redis[0])? else {
        return Ok(());
    };
    for batch in keys.chunks(1_000) {
        redis::cmd("DEL").arg(batch).query::<i64>(&mut con)?;
    }
    Ok(())
}

/// `cmdstat_get:calls=12,usec=…` lines → total calls, without the `info`
/// and `config` commands the measurement itself sends.
pub fn parse_commandstats(info: &str) -> u64 {
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter(|line| !line.starts_with("info:") && !line.starts_with("config"))
        .filter_map(|line| {
            let calls = line.split_once(":calls=")?.1;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_are_summed_without_our_own_commands() {
        let info = "# Commandstats\r\ncmdstat_get:calls=12,usec=30,usec_per_call=2.5\r\n\
                    cmdstat_evalsha:calls=3,usec=9\r\ncmdstat_info:calls=2,usec=1\r\n\
                    cmdstat_config|resetstat:calls=1,usec=1\r\n";
        assert_eq!(parse_commandstats(info), 15);
    }
}
