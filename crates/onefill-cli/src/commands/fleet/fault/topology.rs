//! Reading a cluster's layout: which master owns which slots, which node
//! took a victim's slots over, and each node's URL. Pure parsing apart from
//! [`key_slots`], [`connect`] and [`slots_of`], whose questions are each
//! bounded by a short timeout.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};

/// How long one question to one node may take.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// One range of `CLUSTER SLOTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    /// First slot.
    pub start: u16,
    /// Last slot (inclusive).
    pub end: u16,
    /// `ip:port` of the master.
    pub master: String,
    /// `ip:port` of its replicas.
    pub replicas: Vec<String>,
}

/// The owner of `slot` in `ranges`.
pub fn owner(ranges: &[SlotRange], slot: u16) -> Option<&SlotRange> {
    ranges.iter().find(|r| (r.start..=r.end).contains(&slot))
}

/// The master that owns the most of `slots` (ties: the lowest address),
/// and how many it owns.
pub fn busiest_master(ranges: &[SlotRange], slots: &[u16]) -> Option<(String, usize)> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for slot in slots {
        if let Some(r) = owner(ranges, *slot) {
            *counts.entry(r.master.as_str()).or_default() += 1;
        }
    }
    let mut best: Option<(&str, usize)> = None;
    for (master, n) in counts {
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((master, n));
        }
    }
    best.map(|(m, n)| (m.to_owned(), n))
}

/// The node serving every one of `victim_ranges` in `now`, if it is not
/// the victim any more (the first such range's new master).
pub fn replacement(now: &[SlotRange], victim_ranges: &[SlotRange], victim: &str) -> Option<String> {
    let mut first = None;
    for range in victim_ranges {
        for slot in [range.start, range.end] {
            let owner = owner(now, slot)?;
            if owner.master == victim {
                return None;
            }
            first.get_or_insert_with(|| owner.master.clone());
        }
    }
    first
}

/// `url` with its host and port replaced by `addr` (`ip:port`): the
/// scheme, credentials and database of the user's URL reach every node.
pub fn node_url(url: &str, addr: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let userinfo = authority.rfind('@').map_or("", |i| &authority[..=i]);
    let addr = match addr.rsplit_once(':') {
        Some((ip, port)) if ip.contains(':') && !ip.starts_with('[') => format!("[{ip}]:{port}"),
        _ => addr.to_owned(),
    };
    format!("{scheme}://{userinfo}{addr}{path}")
}

/// A synchronous connection with short timeouts.
pub fn connect(url: &str) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let con = client.get_connection_with_timeout(NODE_TIMEOUT)?;
    con.set_read_timeout(Some(NODE_TIMEOUT))?;
    con.set_write_timeout(Some(NODE_TIMEOUT))?;
    Ok(con)
}

/// Runs `cmd` on the first of `urls` that answers.
fn first_answer<T: redis::FromRedisValue>(urls: &[String], cmd: &redis::Cmd) -> anyhow::Result<T> {
    let mut errors = Vec::new();
    for url in urls {
        match connect(url).and_then(|mut con| cmd.query::<T>(&mut con)) {
            Ok(v) => return Ok(v),
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    bail!("no node answered: {}", errors.join("; "))
}

/// The slot of each of `value_keys` (`CLUSTER KEYSLOT` on a node that
/// answers).
pub fn key_slots(urls: &[String], value_keys: &[String]) -> anyhow::Result<Vec<u16>> {
    let mut slots = Vec::with_capacity(value_keys.len());
    for key in value_keys {
        let slot: i64 = first_answer(urls, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .context("CLUSTER KEYSLOT")?;
        slots.push(u16::try_from(slot).context("a slot out of range")?);
    }
    Ok(slots)
}

/// `CLUSTER SLOTS` parsed; `host` stands in for an empty node address.
pub fn parse_slots(reply: &redis::Value, host: &str) -> Vec<SlotRange> {
    use redis::Value;
    fn text(v: &Value) -> Option<String> {
        match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        }
    }
    let node = |v: &Value| -> Option<String> {
        let Value::Array(fields) = v else { return None };
        let ip = text(fields.first()?)?;
        let Value::Int(port) = fields.get(1)? else {
            return None;
        };
        let ip = if ip.is_empty() { host.to_owned() } else { ip };
        Some(format!("{ip}:{port}"))
    };
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Value::Int(start), Value::Int(end)) = (fields.first()?, fields.get(1)?) else {
                return None;
            };
            Some(SlotRange {
                start: u16::try_from(*start).ok()?,
                end: u16::try_from(*end).ok()?,
                master: node(fields.get(2)?)?,
                replicas: fields.iter().skip(3).filter_map(node).collect(),
            })
        })
        .collect()
}

/// `CLUSTER SLOTS` of the node at `url`.
pub fn slots_of(con: &mut redis::Connection, url: &str) -> redis::RedisResult<Vec<SlotRange>> {
    let reply: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(con)?;
    Ok(parse_slots(&reply, &host_of(url)))
}

/// The host of a URL (for an empty address in `CLUSTER SLOTS`).
pub fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or("");
    let hostport = authority.rsplit('@').next().unwrap_or("");
    match hostport.rsplit_once(':') {
        Some((host, _)) => host.trim_matches(['[', ']']).to_owned(),
        None => hostport.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u16, end: u16, master: &str, replicas: &[&str]) -> SlotRange {
        SlotRange {
            start,
            end,
            master: master.to_owned(),
            replicas: replicas.iter().map(|r| r.to_string()).collect(),
        }
    }

    #[test]
    fn the_victim_owns_the_most_keys() {
        let ranges = [
            range(0, 5460, "a:1", &["d:4"]),
            range(5461, 10922, "b:2", &["e:5"]),
            range(10923, 16383, "c:3", &["f:6"]),
        ];
        assert_eq!(
            busiest_master(&ranges, &[1, 6000, 7000, 12000]),
            Some(("b:2".to_owned(), 2))
        );
        assert_eq!(
            busiest_master(&ranges, &[1, 12000]),
            Some(("a:1".to_owned(), 1)),
            "ties: the lowest address"
        );
        assert_eq!(busiest_master(&ranges, &[]), None);
    }

    #[test]
    fn the_replacement_is_seen_once_every_victim_range_moved() {
        let before = [
            range(0, 99, "a:1", &["d:4"]),
            range(100, 199, "b:2", &[]),
            range(200, 299, "a:1", &["d:4"]),
        ];
        let victim: Vec<SlotRange> = vec![before[0].clone(), before[2].clone()];
        assert_eq!(replacement(&before, &victim, "a:1"), None);
        let half = [
            range(0, 99, "d:4", &[]),
            range(100, 199, "b:2", &[]),
            range(200, 299, "a:1", &[]),
        ];
        assert_eq!(replacement(&half, &victim, "a:1"), None);
        let after = [
            range(0, 99, "d:4", &[]),
            range(100, 199, "b:2", &[]),
            range(200, 299, "d:4", &[]),
        ];
        assert_eq!(replacement(&after, &victim, "a:1"), Some("d:4".to_owned()));
        assert_eq!(
            replacement(&[], &victim, "a:1"),
            None,
            "no owner is no replacement"
        );
    }

    #[test]
    fn node_urls_keep_scheme_credentials_and_database() {
        assert_eq!(
            node_url("redis://127.0.0.1:7000", "127.0.0.1:7003"),
            "redis://127.0.0.1:7003"
        );
        assert_eq!(
            node_url("rediss://user:pw@host:7000/2", "10.0.0.5:7004"),
            "rediss://user:pw@10.0.0.5:7004/2"
        );
        assert_eq!(
            node_url("redis://[::1]:7000", "::1:7001"),
            "redis://[::1]:7001"
        );
        assert_eq!(host_of("redis://user:pw@[::1]:7000/0"), "::1");
        assert_eq!(host_of("redis://h:1"), "h");
    }

    #[test]
    fn cluster_slots_are_parsed() {
        use redis::Value;
        let node = |ip: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(ip.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
                node("127.0.0.1", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("", 7001)]),
            Value::Int(3),
        ]);
        assert_eq!(
            parse_slots(&reply, "h"),
            vec![
                range(0, 5460, "127.0.0.1:7000", &["127.0.0.1:7003"]),
                range(5461, 16383, "h:7001", &[]),
            ]
        );
        assert!(parse_slots(&Value::Nil, "h").is_empty());
    }
}
