//! What a fleet talks to Redis through: the onefill cache of a worker's
//! strategy (with an L1 under `--chaos`), and a plain connection for the
//! load counter, the naive strategy and the chaos run's foreign client.

use std::time::Duration;

use anyhow::Context;
use onefill::redis::RedisBackend;
use onefill::{Cache, LeaseTtl, WaitPolicy, L1};

use crate::commands::fleet::args::{FleetStrategy, RunArgs};
use crate::shared::urls::redact;

/// The onefill backend of the run's server or cluster.
pub async fn connect(args: &RunArgs) -> anyhow::Result<RedisBackend> {
    if args.cluster {
        let urls: Vec<&str> = args.redis.iter().map(String::as_str).collect();
        RedisBackend::connect_cluster(&urls).await.with_context(|| {
            let shown: Vec<String> = args.redis.iter().map(|u| redact(u)).collect();
            format!("connecting to the cluster at {}", shown.join(", "))
        })
    } else {
        RedisBackend::connect(&args.redis[0])
            .await
            .with_context(|| format!("connecting to Redis at {}", redact(&args.redis[0])))
    }
}

/// A plain connection for the load counter and the naive strategy.
pub enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    pub async fn connect(args: &RunArgs) -> anyhow::Result<Raw> {
        if args.cluster {
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
        }
    }
}

/// The onefill cache of the strategy (none for the naive one), with `l1`
/// in front of it if given.
pub async fn cache(
    run: &RunArgs,
    namespace: &str,
    l1: Option<L1>,
) -> anyhow::Result<Option<Cache<String, String>>> {
    Ok(match run.strategy {
        FleetStrategy::Naive => None,
        strategy => {
            let backend = connect(run).await?;
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
            if let Some(l1) = l1 {
                builder = builder.l1(l1);
            }
            Some(builder.build()?)
        }
    })
}
