//! The writer thread of `fleet --expire-at-ms` / `--invalidate-at-ms`: a
//! onefill cache of the run's namespace (the workers' options), connected
//! before the run starts, that makes the one write of the run's first key
//! at its time after the parent's "go" and says when it was made
//! ([`Written`]).

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};

use super::args::RunArgs;
use super::connections::{cache, L1Choice};
use super::written::{WriteKind, WritePlan, Written};

/// The running writer: join it after the run.
pub struct Writer {
    thread: JoinHandle<anyhow::Result<Written>>,
}

impl Writer {
    /// Starts the writer thread; `started` is the parent's "go" (the
    /// write is made `plan.at_ms` after it).
    pub fn start(plan: WritePlan, run: &RunArgs, namespace: &str, started: Instant) -> Writer {
        let (run, namespace) = (run.clone(), namespace.to_owned());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the writer's runtime")?;
            runtime.block_on(write(plan, run, namespace, started))
        });
        Writer { thread }
    }

    /// Waits for the write and returns when it was made.
    pub fn finish(self) -> anyhow::Result<Written> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err(anyhow!("the writer panicked")))
    }
}

async fn write(
    plan: WritePlan,
    run: RunArgs,
    namespace: String,
    started: Instant,
) -> anyhow::Result<Written> {
    // One write, no read: an L1 would only open a tracking connection.
    let cache = cache(&run, &namespace, L1Choice::Off)
        .await?
        .context("--expire-at-ms and --invalidate-at-ms need a onefill strategy")?;
    let key = run.keys.first().context("no key")?.clone();
    let at = started + Duration::from_millis(plan.at_ms);
    tokio::time::sleep_until(at.into()).await;
    let ms = || started.elapsed().as_secs_f64() * 1000.0;
    let sent_ms = ms();
    let done = match plan.kind {
        WriteKind::Expire => cache.expire(&key).await,
        WriteKind::Invalidate => cache.invalidate(&key).await,
    };
    let done_ms = ms();
    done.with_context(|| format!("{:?} of {key}", plan.kind))?;
    Ok(Written {
        kind: plan.kind,
        key,
        sent_ms,
        done_ms,
    })
}
