//! Waiting on a holder whose liveness the backend watches: the waiter makes
//! no re-check while the holder is alive (but at its lease's expiry, which
//! a live holder's flight may leave behind), takes the lease over at once
//! when the holder is judged dead or frozen (one waiter wins, the others
//! watch the winner), a holder judged wrongly is fenced, and a watch that
//! loses its signal falls back on the lease's expiry. The memory backend
//! with simulated processes (`onefill::testing::Processes`), every option
//! at its default, in paused time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::loaders::Loading;
use onefill::testing::{ProcessBackend, Processes};
use onefill::{Cache, Error, Fetched, MemoryBackend, Outcome};
use tokio::task::JoinHandle;
use tokio::time::Instant;

fn cache(backend: ProcessBackend) -> Cache<String, String> {
    Cache::builder()
        .namespace("live")
        .backend(backend)
        .build()
        .unwrap()
}

/// One cache per process name, in order.
fn caches<const N: usize>(processes: &Processes, names: [&str; N]) -> [Cache<String, String>; N] {
    names.map(|name| cache(processes.process(name)))
}

/// A loader answering `name` after `load`, counting into `loads`.
fn loader(
    name: &str,
    load: Duration,
    loads: &Arc<AtomicUsize>,
) -> impl FnOnce(String) -> Loading + Send + 'static {
    let (loads, name) = (loads.clone(), name.to_owned());
    move |_k: String| -> Loading {
        Box::pin(async move {
            loads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(load).await;
            Ok(name)
        })
    }
}

/// `cache`'s call of the key, loading `name` after `load`.
fn call(
    cache: &Cache<String, String>,
    name: &'static str,
    load: Duration,
    loads: &Arc<AtomicUsize>,
) -> Call {
    let (cache, loader) = (cache.clone(), loader(name, load, loads));
    Call(tokio::spawn(async move {
        cache.fetch(&"k".to_owned(), loader).await
    }))
}

/// A call under way.
struct Call(JoinHandle<Result<Fetched<String>, Error>>);

impl Call {
    /// Its answer and how it was answered.
    async fn answer(self) -> (String, Outcome) {
        let fetched = self.0.await.unwrap().unwrap();
        (fetched.value, fetched.outcome)
    }
}

#[tokio::test(start_paused = true)]
async fn a_live_holder_is_waited_for_without_a_re_check() {
    let processes = Processes::new(MemoryBackend::new());
    let [a, b] = caches(&processes, ["a", "b"]);
    let loads = Arc::new(AtomicUsize::new(0));
    // Longer than the safety poll (3 s ±25 %), shorter than the deadline.
    let holder = call(&a, "a", Duration::from_secs(8), &loads);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiter = call(&b, "b", Duration::ZERO, &loads);
    assert_eq!(waiter.answer().await, ("a".to_owned(), Outcome::Waited));
    holder.answer().await;
    let s = b.stats();
    assert_eq!(
        (s.wait_notified, s.wait_polls, s.lease_takeovers),
        (1, 0, 0),
        "{s:?}"
    );
    assert_eq!(loads.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_killed_holder_is_taken_over_the_moment_its_watch_says_so() {
    let processes = Processes::new(MemoryBackend::new());
    let [a, b] = caches(&processes, ["a", "b"]);
    let loads = Arc::new(AtomicUsize::new(0));
    let _holder = call(&a, "a", Duration::from_secs(3_600), &loads);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let start = Instant::now();
    let waiter = call(&b, "b", Duration::from_millis(100), &loads);
    tokio::time::sleep(Duration::from_millis(500)).await;
    processes.kill("a");
    assert_eq!(waiter.answer().await, ("b".to_owned(), Outcome::Loaded));
    // Taken over at the kill, then a 100 ms load: not at the holder's
    // lease expiry (10 s for a watched holder).
    assert_eq!(start.elapsed(), Duration::from_millis(600));
    let s = b.stats();
    assert_eq!(
        (
            s.holders_dead,
            s.holders_frozen,
            s.lease_takeovers,
            s.wait_polls
        ),
        (1, 0, 1, 0),
        "{s:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_holder_dead_before_the_waiter_watches_it_is_taken_over_without_a_wait() {
    let processes = Processes::new(MemoryBackend::new());
    let [a, b] = caches(&processes, ["a", "b"]);
    let loads = Arc::new(AtomicUsize::new(0));
    let _holder = call(&a, "a", Duration::from_secs(3_600), &loads);
    tokio::time::sleep(Duration::from_millis(10)).await;
    processes.kill("a");
    let start = Instant::now();
    let waiter = call(&b, "b", Duration::from_millis(100), &loads);
    assert_eq!(waiter.answer().await, ("b".to_owned(), Outcome::Loaded));
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(b.stats().holders_dead, 1);
}

/// A holder judged frozen wrongly (it was only slow) loads once more than
/// needed, and no more: its fill is fenced, its callers still get its
/// value, and the store keeps the waiter's.
#[tokio::test(start_paused = true)]
async fn a_holder_judged_frozen_is_fenced_when_it_wakes() {
    let processes = Processes::new(MemoryBackend::new());
    let [a, b] = caches(&processes, ["a", "b"]);
    let loads = Arc::new(AtomicUsize::new(0));
    let holder = call(&a, "a", Duration::from_secs(2), &loads);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiter = call(&b, "b", Duration::from_millis(100), &loads);
    tokio::time::sleep(Duration::from_millis(500)).await;
    processes.freeze("a");
    assert_eq!(waiter.answer().await, ("b".to_owned(), Outcome::Loaded));
    assert_eq!(holder.answer().await, ("a".to_owned(), Outcome::Loaded));
    assert_eq!(loads.load(Ordering::SeqCst), 2);
    assert_eq!((a.stats().fills_fenced, b.stats().holders_frozen), (1, 1));
    // The store keeps the waiter's value: a third process hits it.
    let c = cache(processes.process("c"));
    let third = call(&c, "c", Duration::ZERO, &loads);
    assert_eq!(third.answer().await, ("b".to_owned(), Outcome::Hit));
}

/// Two waiting processes judge the same holder dead: one takes its lease
/// over, the other finds the winner's lease and waits for its fill.
#[tokio::test(start_paused = true)]
async fn of_two_waiters_that_judge_the_holder_dead_one_takes_over() {
    let processes = Processes::new(MemoryBackend::new());
    let [a, b, c] = caches(&processes, ["a", "b", "c"]);
    let loads = Arc::new(AtomicUsize::new(0));
    let _holder = call(&a, "a", Duration::from_secs(3_600), &loads);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let (wb, wc) = (
        call(&b, "b", Duration::from_millis(300), &loads),
        call(&c, "c", Duration::from_millis(300), &loads),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    processes.kill("a");
    let (rb, rc) = (wb.answer().await, wc.answer().await);
    assert_eq!(
        loads.load(Ordering::SeqCst),
        2,
        "the dead load and one takeover"
    );
    assert_eq!(rb.0, rc.0, "both answered by the winner");
    let takeovers = b.stats().lease_takeovers + c.stats().lease_takeovers;
    assert_eq!(takeovers, 1);
}

/// A watch whose signal is gone (here: the registry forgot the holder)
/// leaves the waiter to the lease's expiry and its safety poll again.
#[tokio::test(start_paused = true)]
async fn a_watch_that_loses_its_signal_falls_back_on_re_checks() {
    let processes = Processes::new(MemoryBackend::new());
    let [a, b] = caches(&processes, ["a", "b"]);
    let loads = Arc::new(AtomicUsize::new(0));
    let holder = call(&a, "a", Duration::from_secs(6), &loads);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiter = call(&b, "b", Duration::ZERO, &loads);
    tokio::time::sleep(Duration::from_millis(500)).await;
    processes.forget("a");
    assert_eq!(waiter.answer().await, ("a".to_owned(), Outcome::Waited));
    holder.answer().await;
    // At least the safety poll (3 s ±25 %) after the signal was lost.
    let s = b.stats();
    assert!(s.wait_polls >= 1, "{s:?}");
    assert_eq!(s.holders_dead + s.holders_frozen, 0);
}

/// A live process's lease outlives its flight when releasing it fails
/// (the loader failed, then its release met a dropped connection): the
/// watch, which watches the process, keeps saying "alive", and no fill
/// nor release is announced. The lease's expiry is then the waiter's only
/// way on, as for a holder nobody watches: it takes the lease over when
/// the lease expires, not at its own deadline (here 30 s), with an answer
/// it stores.
#[tokio::test(start_paused = true)]
async fn a_lease_its_live_holder_failed_to_release_is_taken_over_at_its_expiry() {
    use onefill::testing::{Fault, FaultyBackend, Op};
    use onefill::WaitPolicy;

    let processes = Processes::new(MemoryBackend::new());
    let faulty = FaultyBackend::new(processes.process("a"));
    faulty.faults().set([Op::Release, Op::Fill], Fault::Refuse);
    let a: Cache<String, String> = Cache::builder()
        .namespace("live")
        .backend(faulty)
        .build()
        .unwrap();
    let b: Cache<String, String> = Cache::builder()
        .namespace("live")
        .backend(processes.process("b"))
        .wait(WaitPolicy::default().deadline(Duration::from_secs(30)))
        .build()
        .unwrap();
    let start = Instant::now();
    let holder = {
        let a = a.clone();
        tokio::spawn(async move {
            a.fetch(&"k".to_owned(), |_k: String| async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Err::<String, _>(std::io::Error::other("the loader failed"))
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let loads = Arc::new(AtomicUsize::new(0));
    let waiter = call(&b, "b", Duration::from_millis(100), &loads);
    assert!(holder.await.unwrap().is_err());
    assert_eq!(waiter.answer().await, ("b".to_owned(), Outcome::Loaded));
    // The watched holder's lease (10 s) expired, then a 100 ms load.
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(10) && took < Duration::from_secs(11),
        "answered after {took:?}"
    );
    let s = b.stats();
    assert_eq!((s.holders_dead, s.holders_frozen), (0, 0), "{s:?}");
}

/// A holder judged frozen is taken over with a marked token; if the new
/// holder looks frozen too (its loader blocks its executor, as the first
/// one's did), it is not taken over in turn: the third process waits for
/// its fill.
#[tokio::test(start_paused = true)]
async fn a_holder_that_took_over_from_a_frozen_one_is_not_judged_frozen_in_turn() {
    let processes = Processes::new(MemoryBackend::new());
    let [a, b, c] = caches(&processes, ["a", "b", "c"]);
    let loads = Arc::new(AtomicUsize::new(0));
    let holder = call(&a, "a", Duration::from_secs(2), &loads);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second = call(&b, "b", Duration::from_secs(2), &loads);
    tokio::time::sleep(Duration::from_millis(500)).await;
    processes.freeze("a");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(loads.load(Ordering::SeqCst), 2, "b took over");
    let third = call(&c, "c", Duration::ZERO, &loads);
    tokio::time::sleep(Duration::from_millis(100)).await;
    processes.freeze("b");
    assert_eq!(third.answer().await, ("b".to_owned(), Outcome::Waited));
    assert_eq!(second.answer().await, ("b".to_owned(), Outcome::Loaded));
    holder.answer().await;
    assert_eq!(loads.load(Ordering::SeqCst), 2);
    let s = c.stats();
    assert_eq!((s.holders_frozen, s.lease_takeovers), (0, 0), "{s:?}");
}
