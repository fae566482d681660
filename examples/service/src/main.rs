//! `onefill-service`: an HTTP service whose origin is PostgreSQL, with
//! onefill in front of it. See this example's README for the walkthrough.

mod config;
mod origin;
mod routes;

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use metrics_exporter_prometheus::PrometheusBuilder;
use onefill::{Cache, WaitPolicy, L1};

use crate::config::Config;
use crate::origin::{Item, Origin};
use crate::routes::App;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    match run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("onefill-service: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> anyhow::Result<()> {
    // Installed before any cache is built: onefill registers its metrics
    // when a cache is built.
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .context("cannot install the Prometheus recorder")?;
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        // Without the exporter's own HTTP listener, its histograms are
        // drained only by this upkeep (and by scrapes).
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });

    let origin = Origin::connect(
        &config.database_url,
        config.db_pool,
        config.items,
        config.origin_delay,
    )
    .await
    .with_context(|| {
        format!(
            "cannot set up the database at {}",
            redact(&config.database_url)
        )
    })?;

    let (cache, cache_kind) = if config.no_cache {
        (None, "off")
    } else {
        let cache = build_cache(&config).await?;
        let kind = if config.redis.is_some() {
            "redis"
        } else {
            "memory"
        };
        (Some(cache), kind)
    };

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let addr = listener.local_addr()?;
    // The first line of standard output says where it listens (a test or a
    // script started with port 0 reads the port from it).
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "onefill-service listening on http://{addr} (cache: {cache_kind}, database: {})",
        origin.database()
    )?;
    stdout.flush()?;
    drop(stdout);

    let app = routes::router(App {
        origin,
        cache,
        cache_kind,
        prometheus: Arc::new(prometheus),
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("the server failed")?;
    Ok(())
}

async fn build_cache(config: &Config) -> anyhow::Result<Cache<i64, Item>> {
    let builder = Cache::<i64, Item>::builder()
        .namespace(config.namespace.clone())
        .ttl(config.ttl)
        .grace(config.grace)
        .wait(WaitPolicy::default().deadline(config.wait))
        .backend_timeout(config.backend_timeout);
    let builder = match &config.redis {
        Some(url) => {
            let backend = onefill::redis::RedisBackend::connect(url)
                .await
                // The error's own message says why; its chain repeats it.
                .map_err(|e| anyhow::anyhow!("cannot connect to Redis at {}: {e}", redact(url)))?;
            let builder = builder.backend(backend);
            if config.l1 > 0 {
                builder.l1(L1::new(config.l1))
            } else {
                builder
            }
        }
        None => builder.backend(onefill::MemoryBackend::new()),
    };
    builder.build().context("bad cache options")
}

/// Ctrl-C or SIGTERM: stop accepting, finish the requests in flight.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// A URL without its password (`scheme://user:***@host/...`).
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("redis://:pw@h:6379"), "redis://:***@h:6379");
        assert_eq!(redact("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact("not a url"), "not a url");
    }
}
