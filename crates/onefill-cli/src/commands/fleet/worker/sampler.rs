//! Sampling a worker's cache counters over the run.

use std::time::{Duration, Instant};

use anyhow::Context;
use onefill::Cache;
use tokio::sync::oneshot;

/// One sample: `[t_ms, lease_acquired, loads_ok, degraded_loads, stale_served]`.
pub type Sample = [u64; 5];

/// The most samples one worker keeps (almost three hours' worth).
const MAX_SAMPLES: usize = 100_000;

/// Samples a cache's counters every 100 ms into a buffer of its own, which
/// [`Sampler::finish`] hands back.
pub struct Sampler {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    /// Starts sampling; `origin` is t = 0 of the samples.
    pub fn start(cache: Cache<String, String>, origin: Instant) -> Sampler {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stopped => return samples,
                    _ = tick.tick() => {}
                }
                if samples.len() < MAX_SAMPLES {
                    let s = cache.stats();
                    samples.push([
                        origin.elapsed().as_millis() as u64,
                        s.lease_acquired,
                        s.loads_ok,
                        s.degraded_loads,
                        s.stale_served,
                    ]);
                }
            }
        });
        Sampler { stop, task }
    }

    /// Stops sampling and returns the samples.
    pub async fn finish(self) -> anyhow::Result<Vec<Sample>> {
        drop(self.stop);
        self.task.await.context("the sampler task")
    }
}
