//! The service's command line (every flag also reads an environment
//! variable, as a container would set it).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

/// An HTTP service whose origin is PostgreSQL, with onefill in front of it.
///
/// `GET /items/{id}` reads through the cache (one PostgreSQL query per item
/// per TTL across every process sharing the Redis); `PUT /items/{id}`
/// writes PostgreSQL, then invalidates the key fleet-wide. `/stats` counts
/// the origin's queries from PostgreSQL itself; `/metrics` is Prometheus'
/// text format; `/healthz` checks the database.
#[derive(Debug, Clone, Parser)]
#[command(name = "onefill-service", version)]
pub struct Config {
    /// Address to listen on; port 0 picks a free port (the address chosen
    /// is printed on the first line of standard output).
    #[arg(long, env = "SERVICE_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,

    /// PostgreSQL URL. Its database is created if missing (through the
    /// server's `postgres` database), with the `items` table and the
    /// `origin_reads` counter.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/onefill_service"
    )]
    pub database_url: String,

    /// Redis URL shared by the fleet (AUTH in the URL:
    /// `redis://:password@host:6379`). Without it each process caches in
    /// its own memory (onefill's embedded backend): coalesced within the
    /// process, not across processes.
    #[arg(long, env = "REDIS_URL")]
    pub redis: Option<String>,

    /// No cache: every request queries PostgreSQL (the comparison).
    #[arg(long, env = "SERVICE_NO_CACHE", conflicts_with = "redis")]
    pub no_cache: bool,

    /// How many items the table is seeded with (ids 1 to N; rows that
    /// exist are left as they are).
    #[arg(long, env = "SERVICE_ITEMS", default_value_t = 1000)]
    pub items: i64,

    /// Connections to PostgreSQL in this process's pool.
    #[arg(long, env = "SERVICE_DB_POOL", default_value_t = 16)]
    pub db_pool: usize,

    /// Simulated extra origin latency added to every loader query (e.g.
    /// `20ms`), as a heavier query would take; 0 by default.
    #[arg(long, env = "SERVICE_ORIGIN_DELAY", value_parser = parse_duration, default_value = "0ms")]
    pub origin_delay: Duration,

    /// onefill: how long an item stays fresh.
    #[arg(long, env = "CACHE_TTL", value_parser = parse_duration, default_value = "60s")]
    pub ttl: Duration,

    /// onefill: how long after the TTL a stale item is still served while
    /// one refresh runs fleet-wide (0: off).
    #[arg(long, env = "CACHE_GRACE", value_parser = parse_duration, default_value = "0s")]
    pub grace: Duration,

    /// onefill: how long a caller waits for another process's load before
    /// the fallback (stale, or one degraded load).
    #[arg(long, env = "CACHE_WAIT", value_parser = parse_duration, default_value = "10s")]
    pub wait: Duration,

    /// onefill: the backend time one flight may lose to failures before
    /// its callers are answered (degrading to in-process coalescing).
    #[arg(long, env = "CACHE_BACKEND_TIMEOUT", value_parser = parse_duration, default_value = "250ms")]
    pub backend_timeout: Duration,

    /// onefill: an L1 of this many entries in front of Redis, kept
    /// coherent by Redis (`CLIENT TRACKING`); 0: none. (The embedded
    /// backend always has one.)
    #[arg(long, env = "CACHE_L1", default_value_t = 0)]
    pub l1: usize,

    /// onefill: the cache's namespace (its keys are `<namespace>:{<id>}`).
    #[arg(long, env = "CACHE_NAMESPACE", default_value = "items")]
    pub namespace: String,
}

/// `250ms`, `5s`, `2m`; a bare number is milliseconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 250ms, 5s, 2m)"))?;
    match unit {
        "" | "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => n
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("`{s}` is too long")),
        _ => Err(format!("`{s}`: unknown unit `{unit}` (ms, s or m)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_bad_ones_are_errors() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("40"), Ok(Duration::from_millis(40)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("99999999999999999999m").is_err());
    }

    #[test]
    fn defaults_and_conflicts() {
        let c = Config::try_parse_from(["onefill-service"]).unwrap();
        assert_eq!(c.listen.port(), 3000);
        assert!(c.redis.is_none() && !c.no_cache);
        assert_eq!(c.ttl, Duration::from_secs(60));
        let both = Config::try_parse_from([
            "onefill-service",
            "--no-cache",
            "--redis",
            "redis://127.0.0.1:6379",
        ]);
        assert!(both.is_err(), "--no-cache with --redis is a mistake");
    }
}
