//! A chaos worker: one caller reading random keys at `--rate` for
//! `--duration-ms` through a cache with an L1, recording every answer and
//! every load. One call at a time, so the growth of the cache's `l1_hits`
//! during a call says whether the L1 answered it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onefill::Cache;

use super::random::Random;
use super::records::{now_us, Answer, ChaosWorkerReport, Load};
use super::version::{value_of, version_in};
use crate::commands::fleet::args::RunArgs;
use crate::commands::fleet::outcome::outcome_name;

/// Calls per second per process when `--rate` is not given.
pub const DEFAULT_RATE: u32 = 500;

/// The most answers one worker keeps (about 35 minutes at the default
/// rate); the calls go on, unrecorded, beyond it.
const MAX_ANSWERS: usize = 1_000_000;

/// How long one call may take before it counts as an error: far beyond
/// any bound of the library's (a load, the wait deadline, a minute).
fn patience(run: &RunArgs) -> Duration {
    Duration::from_secs(60)
        + Duration::from_millis(run.load_ms)
        + Duration::from_millis(run.wait_deadline_ms.unwrap_or(10_000))
}

/// Reads random keys of `run` through `cache` and reports every answer.
pub async fn read_at_random(run: &RunArgs, cache: Cache<String, String>) -> ChaosWorkerReport {
    let pid = std::process::id();
    let loads: Arc<Mutex<Vec<Load>>> = Arc::new(Mutex::new(Vec::new()));
    let counter = Arc::new(AtomicU64::new(0));
    let mut random = Random::new();
    let mut report = ChaosWorkerReport {
        pid,
        ..Default::default()
    };
    let rate = run.rate.unwrap_or(DEFAULT_RATE).max(1);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let origin = Instant::now();
    let duration = Duration::from_millis(run.duration_ms);
    let load_time = Duration::from_millis(run.load_ms);
    let patience = patience(run);
    while origin.elapsed() < duration {
        tick.tick().await;
        let index = random.below(run.keys.len() as u64) as usize;
        let key = run.keys[index].clone();
        let loader = {
            let loads = loads.clone();
            let counter = counter.clone();
            move |_key: String| async move {
                let start = now_us();
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let version = format!("w{pid}.{n}");
                tokio::time::sleep(load_time).await;
                let mut loads = loads.lock().unwrap_or_else(|p| p.into_inner());
                loads.push(Load {
                    key: index as u32,
                    version: version.clone(),
                    start,
                    end: now_us(),
                });
                Ok::<_, std::io::Error>(value_of(&version))
            }
        };
        let l1_before = cache.stats().l1_hits;
        let start = now_us();
        let answer = tokio::time::timeout(patience, cache.fetch(&key, loader)).await;
        let end = now_us();
        let l1 = cache.stats().l1_hits > l1_before;
        let (outcome, version) = match answer {
            Ok(Ok(fetched)) => (
                outcome_name(fetched.outcome).to_owned(),
                version_in(fetched.value.as_bytes()),
            ),
            Ok(Err(e)) => {
                report.errors += 1;
                if report.error_messages.len() < 5 {
                    report.error_messages.push(e.to_string());
                }
                ("error".to_owned(), None)
            }
            Err(_) => {
                report.errors += 1;
                if report.error_messages.len() < 5 {
                    report
                        .error_messages
                        .push(format!("no answer within {patience:?}"));
                }
                ("error".to_owned(), None)
            }
        };
        if report.answers.len() < MAX_ANSWERS {
            report.answers.push(Answer {
                key: index as u32,
                start,
                end,
                outcome,
                l1,
                version,
            });
        }
    }
    report.loads = std::mem::take(&mut *loads.lock().unwrap_or_else(|p| p.into_inner()));
    report.stats = Some(cache.stats());
    report
}
