//! Talking to Redis directly from the parent: reading the load counters and
//! the servers' command statistics around a run.
//!
//! Every connection has a timeout; in a cluster a node that cannot be
//! reached (killed by `--fault kill`, say) is skipped.

use std::time::Duration;

use super::args::RunArgs;

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
    let single_key_command = matches!(cmd[0], "GET" | "SCARD");
    for url in &args.redis {
        let Some(mut con) = reach(args, url)? else {
            continue;
        };
        let mut c = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            c.arg(*a);
        }
        if single_key_command && args.cluster {
            // Route by asking every node; only the owner answers a value.
            let reply: redis::RedisResult<Option<String>> = c.query(&mut con);
            if let Ok(Some(v)) = reply {
                return Ok(v);
            }
            continue;
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

/// Sum of `calls=` over INFO commandstats of every node (that answers, in a
/// cluster), less the parent's own admin commands.
pub fn command_count(args: &RunArgs) -> anyhow::Result<u64> {
    let mut total = 0;
    for url in &args.redis {
        let Some(mut con) = reach(args, url)? else {
            continue;
        };
        match redis::cmd("INFO")
            .arg("commandstats")
            .query::<String>(&mut con)
        {
            Ok(info) => total += parse_commandstats(&info),
            Err(e) if args.cluster && (e.is_timeout() || e.is_io_error()) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(total)
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
