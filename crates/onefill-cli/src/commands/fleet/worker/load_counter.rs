//! Counting a worker's loads in Redis, off the loaders' path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::commands::fleet::connections::Raw;

/// Counts loads in Redis (`SADD` of the load's `pid:n` to the key's
/// counter set, and `SET` of the loading pid beside it, for fault tests that
/// kill the holder), each in a task of its own: a load is never slowed by a
/// hung Redis, one hung node does not hold up the counts of the others, and
/// a count that fails (or takes over a second) is retried until Redis
/// answers, so none is lost to a short outage; `SADD` makes a retry whose
/// first try did land (its reply lost) count once. The worker waits for the
/// counts a few seconds at most at the end: what has not landed by then is
/// reported, never waited for (a node hung until the run ends would
/// otherwise hold up the whole fleet).
pub struct LoadCounter {
    task: tokio::task::JoinHandle<()>,
    /// Counts sent and not (yet) landed.
    pending: Arc<AtomicU64>,
}

/// How long a count is retried before it is given up (and reported).
const COUNT_PATIENCE: Duration = Duration::from_secs(30);
/// How long one attempt at a count may take.
const COUNT_ATTEMPT: Duration = Duration::from_secs(1);
/// How long a load counter (and the loading pid beside it) lives in Redis
/// if the parent does not delete it after the run (it was killed, say):
/// longer than any run (at most an hour), and nothing the fleet writes is
/// left without a TTL.
const COUNTER_TTL: Duration = Duration::from_secs(6 * 3_600);

/// One load to count: the counter key, the load's number in this process,
/// and whether it is this process's first load of the key.
pub struct Count {
    pub counter: String,
    pub n: u64,
    pub first: bool,
}
/// How long the worker waits for its last counts at the end.
const COUNT_FINISH: Duration = Duration::from_secs(5);

impl LoadCounter {
    pub fn start(raw: Arc<Raw>) -> (mpsc::UnboundedSender<Count>, LoadCounter) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Count>();
        let pending = Arc::new(AtomicU64::new(0));
        let counting = pending.clone();
        let task = tokio::spawn(async move {
            // Dropped (so its counts aborted) if the task is aborted.
            let mut counts = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    next = rx.recv() => match next {
                        Some(count) => {
                            counting.fetch_add(1, Ordering::SeqCst);
                            counts.spawn(Self::count(raw.clone(), count, counting.clone()));
                        }
                        None => break,
                    },
                    Some(_) = counts.join_next(), if !counts.is_empty() => {}
                }
            }
            while counts.join_next().await.is_some() {}
        });
        (tx, LoadCounter { task, pending })
    }

    /// Counts one load.
    async fn count(raw: Arc<Raw>, count: Count, pending: Arc<AtomicU64>) {
        let Count { counter, n, first } = count;
        let given_up = Instant::now() + COUNT_PATIENCE;
        let id = format!("{}:{n}", std::process::id());
        // The set is created by some process's first count, which sends its
        // PEXPIRE in the same write: the counter never lives without a TTL,
        // even if the parent (which deletes it) dies. Later counts keep the
        // TTL (SADD does not clear it) and cost one command.
        let mut sadd = redis::pipe();
        sadd.cmd("SADD").arg(&counter).arg(&id);
        if first {
            sadd.cmd("PEXPIRE")
                .arg(&counter)
                .arg(COUNTER_TTL.as_millis() as u64)
                .ignore();
        }
        loop {
            let attempt = tokio::time::timeout(COUNT_ATTEMPT, raw.pipe::<(i64,)>(&sadd)).await;
            if let Ok(Ok(_)) = attempt {
                pending.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            if Instant::now() > given_up {
                eprintln!("worker: a load could not be counted in Redis");
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pid = redis::cmd("SET")
            .arg(format!("{counter}:pid"))
            .arg(std::process::id())
            .arg("PX")
            .arg(COUNTER_TTL.as_millis() as u64)
            .clone();
        let _ = tokio::time::timeout(COUNT_ATTEMPT, raw.query::<()>(&pid)).await;
    }

    /// Waits (up to 5 s) until every load sent so far is counted (the
    /// senders must be dropped first); returns how many were not.
    pub async fn finish(mut self) -> u64 {
        if tokio::time::timeout(COUNT_FINISH, &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
        self.pending.load(Ordering::SeqCst)
    }
}
