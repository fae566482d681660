//! The herd: N concurrent callers released together on one cold key, under
//! one of three strategies, each with its own simulated origin.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use onefill::backend::FillKeys;
use onefill::{Backend, Cache, MemoryBackend, WaitPolicy};
use tokio::sync::Barrier;

use super::origin::Origin;

/// The namespace of the demo's caches.
pub const NAMESPACE: &str = "demo";
/// TTL of the values written (longer than any run, so nothing expires).
const VALUE_TTL: Duration = Duration::from_secs(600);

/// What one herd looks like.
#[derive(Debug, Clone)]
pub struct HerdConfig {
    /// Concurrent callers.
    pub callers: usize,
    /// Cache instances (simulated processes), at most `callers`.
    pub instances: usize,
    /// How long one origin load takes.
    pub load: Duration,
    /// The key everybody asks for.
    pub key: String,
}

/// How the callers get the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// GET the shared store; on a miss, load from the origin and SET.
    Naive,
    /// One `onefill::Cache` per instance, without the lease (`no_lease`).
    CoalescingOnly,
    /// One `onefill::Cache` per instance with the lease (the defaults).
    Onefill,
}

impl Strategy {
    /// Every strategy, in the order the demo runs them.
    pub const ALL: [Strategy; 3] = [Strategy::Naive, Strategy::CoalescingOnly, Strategy::Onefill];

    /// Short machine-readable name (the JSON `name`).
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Naive => "naive",
            Strategy::CoalescingOnly => "coalescing_only",
            Strategy::Onefill => "onefill",
        }
    }

    /// Human-readable name.
    pub fn title(self) -> &'static str {
        match self {
            Strategy::Naive => "naive cache-aside",
            Strategy::CoalescingOnly => "in-process coalescing only",
            Strategy::Onefill => "onefill (coalescing + lease)",
        }
    }

    /// The number of origin loads this strategy should make, in words.
    pub fn expected_loads(self, config: &HerdConfig) -> String {
        match self {
            Strategy::Naive => format!("≈ {} (one per caller)", config.callers),
            Strategy::CoalescingOnly => format!("≤ {} (one per instance)", config.instances),
            Strategy::Onefill => "1".to_owned(),
        }
    }
}

/// What one strategy's herd did.
#[derive(Debug, Clone)]
pub struct HerdOutcome {
    /// Which strategy.
    pub strategy: Strategy,
    /// Origin loads.
    pub loads: u64,
    /// Latency of every caller that got a value (from the barrier release).
    pub latencies: Vec<Duration>,
    /// Callers that got an error.
    pub errors: u64,
    /// The first error seen, if any.
    pub first_error: Option<String>,
    /// From the release of the herd to the last answer.
    pub wall: Duration,
}

/// The store every instance of one run shares. Each strategy gets a new one,
/// so the key is cold at its start. (A later `--redis URL` mode returns a
/// Redis backend here, with a fresh namespace per run.)
fn shared_backend() -> Arc<dyn Backend> {
    Arc::new(MemoryBackend::new())
}

/// How one caller asks for the value.
#[derive(Debug, Clone)]
enum Client {
    /// Plain cache-aside on the backend protocol.
    Naive {
        backend: Arc<dyn Backend>,
        keys: FillKeys,
    },
    /// Through one onefill cache instance.
    Cache(Cache<String, String>),
}

impl Client {
    async fn call(&self, key: &str, origin: &Arc<Origin>) -> Result<(), String> {
        match self {
            Client::Naive { backend, keys } => {
                if backend
                    .get(keys)
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some()
                {
                    return Ok(());
                }
                let value = origin.load(key).await;
                backend
                    .set(keys, value.as_bytes(), VALUE_TTL)
                    .await
                    .map_err(|e| e.to_string())
            }
            Client::Cache(cache) => {
                let origin = origin.clone();
                cache
                    .get_or_load(&key.to_owned(), move |key: String| async move {
                        Ok::<_, Infallible>(origin.load(&key).await)
                    })
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// Builds the clients of one strategy: one shared store, and for the cache
/// strategies one `Cache` per instance on it.
async fn clients(strategy: Strategy, config: &HerdConfig) -> anyhow::Result<Vec<Client>> {
    let backend = shared_backend();
    if strategy == Strategy::Naive {
        let keys = FillKeys::new(NAMESPACE, &config.key);
        return Ok(vec![Client::Naive { backend, keys }]);
    }
    // Generous bounds, so a long --load-ms is neither aborted nor given up
    // on by the waiters (which would then load too): the comparison is about
    // coalescing, not deadlines.
    let bound = config.load * 3 + Duration::from_secs(5);
    (0..config.instances)
        .map(|_| {
            let builder = Cache::<String, String>::builder()
                .namespace(NAMESPACE)
                .shared_backend(backend.clone())
                .ttl(VALUE_TTL)
                .max_load_time(bound)
                .wait(WaitPolicy::default().deadline(bound));
            let builder = match strategy {
                Strategy::CoalescingOnly => builder.no_lease(),
                _ => builder,
            };
            builder
                .build()
                .map(Client::Cache)
                .context("building a cache instance")
        })
        .collect()
}

/// Runs one strategy: every caller waits at a barrier, then asks for the key
/// and measures its own latency.
pub async fn run(strategy: Strategy, config: &HerdConfig) -> anyhow::Result<HerdOutcome> {
    let clients = clients(strategy, config).await?;
    let origin = Origin::new(config.load);
    let barrier = Arc::new(Barrier::new(config.callers));
    let mut callers = Vec::with_capacity(config.callers);
    for i in 0..config.callers {
        let client = clients[i % clients.len()].clone();
        let (barrier, origin, key) = (barrier.clone(), origin.clone(), config.key.clone());
        callers.push(tokio::spawn(async move {
            barrier.wait().await;
            let start = Instant::now();
            let answer = client.call(&key, &origin).await;
            (start, start.elapsed(), answer)
        }));
    }

    let mut latencies = Vec::with_capacity(config.callers);
    let (mut errors, mut first_error) = (0, None);
    let (mut released, mut last_answer) = (None::<Instant>, None::<Instant>);
    for caller in callers {
        let result = match caller.await {
            Ok((start, took, answer)) => {
                released = Some(released.map_or(start, |r| r.min(start)));
                let end = start + took;
                last_answer = Some(last_answer.map_or(end, |l| l.max(end)));
                answer.map(|()| took)
            }
            Err(join) => Err(format!("caller task failed: {join}")),
        };
        match result {
            Ok(took) => latencies.push(took),
            Err(message) => {
                errors += 1;
                first_error.get_or_insert(message);
            }
        }
    }
    let wall = match (released, last_answer) {
        (Some(r), Some(l)) => l.saturating_duration_since(r),
        _ => Duration::ZERO,
    };
    Ok(HerdOutcome {
        strategy,
        loads: origin.loads(),
        latencies,
        errors,
        first_error,
        wall,
    })
}
