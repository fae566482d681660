//! onefill on Redis: two caches (standing for two processes) share one
//! server; 100 concurrent callers on one cold key make one load.
//!
//! ```sh
//! cargo run -p onefill --example redis -- redis://127.0.0.1:6379
//! # a cluster: list its nodes
//! cargo run -p onefill --example redis -- redis://10.0.0.1:7000 redis://10.0.0.2:7000 redis://10.0.0.3:7000
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::redis::RedisBackend;
use onefill::Cache;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct User {
    id: u64,
    name: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let urls: Vec<String> = std::env::args().skip(1).collect();
    let urls = if urls.is_empty() {
        vec!["redis://127.0.0.1:6379".to_owned()]
    } else {
        urls
    };
    let connect = || async {
        if urls.len() == 1 {
            RedisBackend::connect(&urls[0]).await
        } else {
            let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
            RedisBackend::connect_cluster(&refs).await
        }
    };
    // A fresh namespace per run, so the key starts cold.
    let namespace = format!("example-{}", std::process::id());
    let mut pods = Vec::new();
    for _ in 0..2 {
        pods.push(
            Cache::<u64, User>::builder()
                .namespace(&namespace)
                .backend(connect().await?)
                .ttl(Duration::from_secs(30))
                .build()?,
        );
    }

    let loads = Arc::new(AtomicUsize::new(0));
    let mut callers = Vec::new();
    for i in 0..100 {
        let cache = pods[i % 2].clone();
        let loads = loads.clone();
        callers.push(tokio::spawn(async move {
            cache
                .get_or_load(&42, move |id| async move {
                    loads.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await; // the "database"
                    Ok::<_, std::io::Error>(User {
                        id,
                        name: format!("user {id}"),
                    })
                })
                .await
        }));
    }
    for caller in callers {
        let user = caller.await??;
        assert_eq!(user.id, 42);
    }
    println!(
        "100 callers over 2 caches: {} load(s)",
        loads.load(Ordering::SeqCst)
    );
    for (i, pod) in pods.iter().enumerate() {
        let s = pod.stats();
        println!(
            "cache {i}: loads_ok={} lease_acquired={} waits={} wait_notified={} coalesced={}",
            s.loads_ok, s.lease_acquired, s.waits, s.wait_notified, s.coalesced
        );
    }
    pods[0].invalidate(&42).await?;
    Ok(())
}
