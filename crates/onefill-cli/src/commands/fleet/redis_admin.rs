//! Talking to Redis directly from the parent: reading the load counters and
//! the servers' command statistics around a run.

use super::args::RunArgs;

/// Runs one command on every node (or the one server) with a short-lived
/// connection and returns the first node's reply as text.
pub fn admin(args: &RunArgs, cmd: &[&str]) -> anyhow::Result<String> {
    let mut first = None;
    let single_key_command = matches!(cmd[0], "GET" | "SCARD");
    for url in &args.redis {
        let client = redis::Client::open(url.as_str())?;
        let mut con = client.get_connection()?;
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
        let reply: redis::Value = c.query(&mut con)?;
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

/// Sum of `calls=` over INFO commandstats of every node, less the parent's
/// own admin commands.
pub fn command_count(args: &RunArgs) -> anyhow::Result<u64> {
    let mut total = 0;
    for url in &args.redis {
        let client = redis::Client::open(url.as_str())?;
        let mut con = client.get_connection()?;
        let info: String = redis::cmd("INFO").arg("commandstats").query(&mut con)?;
        total += parse_commandstats(&info);
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
