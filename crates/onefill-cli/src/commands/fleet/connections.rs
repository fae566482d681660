//! What a fleet talks to Redis through: the onefill cache of a worker's
//! strategy (with an L1 under `--chaos`), and a plain connection for the
//! load counter, the naive strategy and the chaos run's foreign client.

use std::time::Duration;

use anyhow::Context;
use onefill::redis::{Durability, RedisBackend, RedisOptions, SentinelOptions};
use onefill::{Cache, LeaseTtl, WaitPolicy, L1};

use crate::commands::fleet::args::{FleetStrategy, RunArgs};
use crate::shared::urls::redact;

/// The onefill backend of the run's server, cluster or Sentinel set-up.
pub async fn connect(args: &RunArgs) -> anyhow::Result<RedisBackend> {
    let options = RedisOptions::new().durability(Durability::Replicas {
        count: args.durability_replicas,
        timeout: Duration::from_millis(args.durability_timeout_ms),
    });
    if let Some(name) = sentinel_name(args) {
        let sentinels: Vec<&str> = args.sentinel.iter().map(String::as_str).collect();
        let options = SentinelOptions::new().redis_options(options);
        RedisBackend::connect_sentinel_with(&sentinels, name, options)
            .await
            .with_context(|| {
                let shown: Vec<String> = args.sentinel.iter().map(|u| redact(u)).collect();
                format!(
                    "connecting to {name} through the Sentinels at {}",
                    shown.join(", ")
                )
            })
    } else if args.cluster {
        let urls: Vec<&str> = args.redis.iter().map(String::as_str).collect();
        RedisBackend::connect_cluster_with(&urls, options)
            .await
            .with_context(|| {
                let shown: Vec<String> = args.redis.iter().map(|u| redact(u)).collect();
                format!("connecting to the cluster at {}", shown.join(", "))
            })
    } else {
        RedisBackend::connect_with(&args.redis[0], options)
            .await
            .with_context(|| format!("connecting to Redis at {}", redact(&args.redis[0])))
    }
}

/// The master name of a run through Sentinels.
fn sentinel_name(args: &RunArgs) -> Option<&str> {
    match (&args.master_name, args.sentinel.is_empty()) {
        (Some(name), false) => Some(name),
        _ => None,
    }
}

/// `redis://ip:port` of the primary the first Sentinel that answers names
/// for `name` (`SENTINEL get-master-addr-by-name`).
async fn named_primary(sentinels: &[String], name: &str) -> anyhow::Result<String> {
    let mut errors = Vec::new();
    for url in sentinels {
        let asked = async {
            let client = redis::Client::open(url.as_str())?;
            let mut con = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(name)
                .query_async::<Option<(String, u16)>>(&mut con)
                .await
        };
        match tokio::time::timeout(RAW_ATTEMPT, asked).await {
            Ok(Ok(Some((ip, port)))) => return Ok(node_url(&ip, port)),
            Ok(Ok(None)) => errors.push(format!("{}: no primary named {name}", redact(url))),
            Ok(Err(e)) => errors.push(format!("{}: {e}", redact(url))),
            Err(_) => errors.push(format!("{}: no answer", redact(url))),
        }
    }
    anyhow::bail!(
        "no Sentinel named the primary {name}: {}",
        errors.join("; ")
    )
}

/// `redis://ip:port`, with an IPv6 address in brackets.
fn node_url(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("redis://[{ip}]:{port}")
    } else {
        format!("redis://{ip}:{port}")
    }
}

/// How long one command of a [`Raw::Sentinel`] connection (or one question
/// to a Sentinel) may take before the connection is given up: the load
/// counter retries every count, so a hung primary must not hold its
/// connection for long.
const RAW_ATTEMPT: Duration = Duration::from_secs(1);

/// How often a [`Raw::Sentinel`] connection asks the Sentinels which
/// node is the primary, failure or not: after a failover the old primary
/// may answer as a master for seconds, and what the fleet counts there is
/// lost.
const RAW_RECHECK: Duration = Duration::from_millis(500);

/// The primary of a Sentinel set-up, asked of the Sentinels again every
/// [`RAW_RECHECK`] and after every failure.
pub struct SentinelRaw {
    sentinels: Vec<String>,
    name: String,
    con: tokio::sync::Mutex<Option<Primary>>,
}

/// A connection to the primary, whose address, and when the Sentinels last
/// named it.
struct Primary {
    url: String,
    con: redis::aio::MultiplexedConnection,
    named_at: std::time::Instant,
}

impl SentinelRaw {
    /// The connection to the primary the Sentinels name: the one there is,
    /// unless they name another now.
    async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let mut held = self.con.lock().await;
        if let Some(p) = held.as_ref() {
            if p.named_at.elapsed() < RAW_RECHECK {
                return Ok(p.con.clone());
            }
        }
        let url = named_primary(&self.sentinels, &self.name)
            .await
            .map_err(|e| {
                redis::RedisError::from((redis::ErrorKind::Io, "no primary", e.to_string()))
            })?;
        if let Some(p) = held.as_mut().filter(|p| p.url == url) {
            p.named_at = std::time::Instant::now();
            return Ok(p.con.clone());
        }
        let client = redis::Client::open(url.as_str())?;
        let con = client.get_multiplexed_async_connection().await?;
        *held = Some(Primary {
            url,
            con: con.clone(),
            named_at: std::time::Instant::now(),
        });
        Ok(con)
    }

    /// Runs `query` on the primary; on a failure or after
    /// [`RAW_ATTEMPT`], forgets the connection, so the next call asks the
    /// Sentinels again (the primary may have changed).
    async fn run<T, F, Fut>(&self, query: F) -> redis::RedisResult<T>
    where
        F: FnOnce(redis::aio::MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let attempt = async { query(self.connection().await?).await };
        let result = match tokio::time::timeout(RAW_ATTEMPT, attempt).await {
            Ok(r) => r,
            Err(_) => Err(redis::RedisError::from((redis::ErrorKind::Io, "timed out"))),
        };
        if result.is_err() {
            *self.con.lock().await = None;
        }
        result
    }
}

/// A plain connection for the load counter and the naive strategy.
pub enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
    Sentinel(SentinelRaw),
}

impl Raw {
    pub async fn connect(args: &RunArgs) -> anyhow::Result<Raw> {
        if let Some(name) = sentinel_name(args) {
            let raw = SentinelRaw {
                sentinels: args.sentinel.clone(),
                name: name.to_owned(),
                con: tokio::sync::Mutex::new(None),
            };
            raw.connection()
                .await
                .with_context(|| format!("connecting to {name} through the Sentinels"))?;
            Ok(Raw::Sentinel(raw))
        } else if args.cluster {
            let shown = || {
                let shown: Vec<String> = args.redis.iter().map(|u| redact(u)).collect();
                format!("connecting to the cluster at {}", shown.join(", "))
            };
            let client =
                redis::cluster::ClusterClient::new(args.redis.clone()).with_context(shown)?;
            Ok(Raw::Cluster(
                client.get_async_connection().await.with_context(shown)?,
            ))
        } else {
            let shown = || format!("connecting to Redis at {}", redact(&args.redis[0]));
            let client = redis::Client::open(args.redis[0].as_str()).with_context(shown)?;
            Ok(Raw::Single(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .with_context(shown)?,
            ))
        }
    }
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self {
            Raw::Single(c) => cmd.query_async(&mut c.clone()).await,
            Raw::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            Raw::Sentinel(s) => {
                s.run(|mut c| async move { cmd.query_async(&mut c).await })
                    .await
            }
        }
    }
    /// A pipeline of commands on one key (one slot, on a cluster).
    pub async fn pipe<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<T> {
        match self {
            Raw::Single(c) => pipe.query_async(&mut c.clone()).await,
            Raw::Cluster(c) => pipe.query_async(&mut c.clone()).await,
            Raw::Sentinel(s) => {
                s.run(|mut c| async move { pipe.query_async(&mut c).await })
                    .await
            }
        }
    }
}

/// The L1 of a cache of the fleet's.
pub enum L1Choice {
    /// The library's default (on Redis, an L1 of 10,000 entries).
    Default,
    /// None (`CacheBuilder::no_l1`).
    Off,
    /// This one.
    On(L1),
}

/// The onefill cache of the strategy (none for the naive one), with the L1
/// chosen.
pub async fn cache(
    run: &RunArgs,
    namespace: &str,
    l1: L1Choice,
) -> anyhow::Result<Option<Cache<String, String>>> {
    Ok(match run.strategy {
        FleetStrategy::Naive => None,
        strategy => {
            let backend = connect(run).await?;
            // A user short of a grant fails here, naming it, rather than
            // at the calls that need it.
            backend
                .check_namespace(namespace)
                .await
                .with_context(|| format!("checking what namespace {namespace} needs"))?;
            let load = Duration::from_millis(run.load_ms);
            let mut builder = Cache::<String, String>::builder()
                .namespace(namespace)
                .backend(backend)
                .ttl(Duration::from_millis(run.ttl_ms))
                .grace(Duration::from_millis(run.grace_ms))
                .max_load_time(load * 3 + Duration::from_secs(5));
            if let Some(ms) = run.backend_timeout_ms {
                builder = builder.backend_timeout(Duration::from_millis(ms));
            }
            if let Some(ms) = run.wait_deadline_ms {
                builder = builder.wait(WaitPolicy::default().deadline(Duration::from_millis(ms)));
            }
            if let Some(ms) = run.lease_ttl_ms {
                builder = builder.lease_ttl(LeaseTtl::Fixed(Duration::from_millis(ms)));
            }
            if strategy == FleetStrategy::CoalescingOnly {
                builder = builder.no_lease();
            }
            if run.strict {
                builder = builder.strict(true);
            }
            builder = match l1 {
                L1Choice::Default => builder,
                L1Choice::Off => builder.no_l1(),
                L1Choice::On(l1) => builder.l1(l1),
            };
            Some(builder.build()?)
        }
    })
}
