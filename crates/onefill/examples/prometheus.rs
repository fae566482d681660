//! onefill's metrics in Prometheus's text format.
//!
//! ```sh
//! cargo run -p onefill --example prometheus
//! ```
//!
//! Installs `metrics-exporter-prometheus` as the `metrics` recorder
//! (before building any cache: a cache registers its series when it is
//! built), drives a small herd through two caches sharing one embedded
//! backend (two "processes"), and prints what a `/metrics` endpoint would
//! serve. In a service, hand `handle.render()` to your HTTP framework's
//! `/metrics` route (or enable the exporter's own `http-listener` feature
//! and call `PrometheusBuilder::install`). Every name is listed in the
//! `onefill::metrics` docs.

use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use onefill::{Cache, MemoryBackend};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. The exporter first; durations as histograms with these buckets
    //    (without buckets, the exporter renders summaries).
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            &[0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0],
        )?
        .install_recorder()?;

    // 2. Then the caches (here two "processes" on one embedded store).
    let store = MemoryBackend::new();
    let build = || {
        Cache::<String, String>::builder()
            .namespace("users")
            .backend(store.clone())
            .ttl(Duration::from_secs(60))
            .build()
    };
    let (a, b) = (build()?, build()?);

    // 3. A herd: 10 callers in each process miss the same key together.
    let load = |key: String| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok::<_, std::io::Error>(format!("user {key}"))
    };
    let key = "42".to_owned();
    let calls = (0..10).flat_map(|_| {
        [a.clone(), b.clone()].map(|cache| {
            let key = key.clone();
            tokio::spawn(async move { cache.get_or_load(&key, load).await })
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await??;
    }

    // 4. What Prometheus would scrape.
    print!("{}", handle.render());
    Ok(())
}
