//! A caller as a tokio task: the async cache of the strategy, or naive
//! cache-aside over the raw connection.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use onefill::backend::FillKeys;
use onefill::Cache;
use tokio::task::JoinHandle;

use super::caller::{Answer, Caller};
use super::summary::Call;
use crate::commands::fleet::connections::Raw;
use crate::commands::fleet::outcome::outcome_name;

/// Naive cache-aside: what a caller does without a cache.
#[derive(Clone)]
pub struct Naive {
    pub raw: Arc<Raw>,
    pub namespace: String,
    pub ttl_ms: u64,
}

/// Starts `caller` as a task, on `cache` or, without one, `naive`.
pub fn spawn(
    caller: Caller,
    cache: Option<Cache<String, String>>,
    naive: Naive,
) -> JoinHandle<Call> {
    tokio::spawn(async move {
        let started = caller.epoch.elapsed();
        let t0 = Instant::now();
        let loader = {
            let origin = caller.origin.clone();
            let key_index = caller.key_index;
            move |key: String| async move { origin.load(key_index, &key).await }
        };
        let patience = caller.patience;
        let answer = tokio::time::timeout(patience, async {
            match cache {
                Some(cache) => cache
                    .fetch(&caller.key, loader)
                    .await
                    .map(|f| (outcome_name(f.outcome), f.value))
                    .map_err(|e| e.to_string()),
                None => naive.get(&caller.key, loader).await,
            }
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {patience:?}")));
        Call::new(started, caller.key_index, t0.elapsed(), answer, false)
    })
}

impl Naive {
    /// GET; on a miss, load and SET. Answers the outcome's name and the
    /// value.
    async fn get<F, Fut>(&self, key: &str, loader: F) -> Answer
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<String, std::io::Error>>,
    {
        let value_key = format!("{}:naive", FillKeys::new(&self.namespace, key).value());
        let found: Option<String> = self
            .raw
            .query(redis::cmd("GET").arg(&value_key))
            .await
            .map_err(|e| e.to_string())?;
        if let Some(found) = found {
            return Ok(("naive_hit", found));
        }
        let value = loader(key.to_owned()).await.map_err(|e| e.to_string())?;
        self.raw
            .query::<()>(
                redis::cmd("SET")
                    .arg(&value_key)
                    .arg(&value)
                    .arg("PX")
                    .arg(self.ttl_ms),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(("naive_load", value))
    }
}
