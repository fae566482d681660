//! onefill's `tracing` spans exported through OpenTelemetry.
//!
//! ```sh
//! cargo run -p onefill --example otel
//! ```
//!
//! `tracing-opentelemetry` turns every `tracing` span into an OpenTelemetry
//! span; here the SDK prints them with the stdout exporter. For a
//! collector (Jaeger, Tempo, Honeycomb…) swap the exporter for
//! `opentelemetry_otlp::SpanExporter::builder().with_tonic().build()?`
//! (crate `opentelemetry-otlp`, same version as `opentelemetry_sdk`) and
//! use a batch exporter (`with_batch_exporter`).
//!
//! What it shows: a request span of the application holding onefill's
//! call span (`onefill.get_or_load`, with `namespace`, `outcome` and
//! `coalesced`), and under it the flight's backend calls
//! (`onefill.backend`, with `op`) and the load (`onefill.load`), though
//! the flight runs in a task of its own; a second "process" waiting for
//! that load (`outcome = waited`, an `onefill.wait` child); a caller
//! that shared the first one's flight (`coalesced = true`).

use std::time::Duration;

use onefill::{Cache, MemoryBackend};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    let tracer = provider.tracer("onefill-example");
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
    tracing::subscriber::set_global_default(subscriber)?;

    let store = MemoryBackend::new();
    let build = || {
        Cache::<String, String>::builder()
            .namespace("users")
            .backend(store.clone())
            .build()
    };
    let (a, b) = (build()?, build()?);
    let load = |key: String| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        Ok::<_, std::io::Error>(format!("user {key}"))
    };
    let key = "42".to_owned();

    let request = |name: &'static str, cache: Cache<String, String>| {
        let key = key.clone();
        let span = tracing::info_span!("request", handler = name);
        tokio::spawn(async move { cache.get_or_load(&key, load).await }.instrument(span))
    };
    let leader = request("process A", a.clone());
    let follower = request("process A, same key", a);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiter = request("process B", b);
    for call in [leader, follower, waiter] {
        call.await??;
    }

    // Flushes and prints the spans.
    provider.shutdown()?;
    Ok(())
}
