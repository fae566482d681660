//! What the memory-backend fault tests share (`mod support;`): a real
//! [`MemoryBackend`] behind switches ([`Switched`]), pods built on it,
//! loaders that count their loads, and the few set-ups and checks several
//! tests repeat. Each test file uses a part of it (hence `dead_code`).
#![allow(dead_code)]

pub mod loaders;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::FillKeys;
use onefill::testing::{BoxFuture, Fault, FaultyBackend, Op, Origin, OriginError};
use onefill::{
    Cache, CacheBuilder, CallOptions, CircuitBreaker, Error, Fetched, LeaseTtl, MemoryBackend,
    Outcome,
};
use tokio::task::JoinHandle;

/// What a [`Switched`] store does, switched at run time with
/// [`Switches::set_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every call runs on the store.
    Healthy,
    /// Every call hangs (a SIGSTOPped Redis).
    Hang,
    /// Every call is refused (a dead Redis).
    Refuse,
    /// Every call fails with a non-transient error (as OOM, NOAUTH,
    /// CROSSSLOT).
    Command,
    /// `acquire` runs on the store, then its reply is lost (a timeout).
    LoseAcquireReply,
    /// The first two calls answer, every later one hangs.
    HangFromThird,
    /// `set` and `invalidate` run on the store, then their reply never
    /// comes (a Redis that executed the command, then stalled or lost the
    /// reply).
    WriteThenHang,
}
/// The modes by the names the tests use.
pub const HEALTHY: Mode = Mode::Healthy;
pub const HANG: Mode = Mode::Hang;
pub const REFUSE: Mode = Mode::Refuse;
pub const COMMAND: Mode = Mode::Command;
pub const LOSE_ACQUIRE_REPLY: Mode = Mode::LoseAcquireReply;
pub const HANG_FROM_THIRD: Mode = Mode::HangFromThird;
pub const WRITE_THEN_HANG: Mode = Mode::WriteThenHang;

/// The namespace of every pod.
pub const NS: &str = "faults";

/// A real [`MemoryBackend`] behind the library's fault-injecting wrapper,
/// driven through [`Switches`]: a mode, a latency, and lost `fill`
/// requests.
pub type Switched = FaultyBackend<MemoryBackend>;

/// A new store behind switches, healthy.
pub fn switched() -> Switched {
    FaultyBackend::new(MemoryBackend::new())
}

/// The switches the fault tests use, in the words of the faults they play.
pub trait Switches {
    /// Switches to `mode` (the lost-fill switch stays as it is).
    fn set_mode(&self, mode: Mode);
    /// Every call waits `ms` before it reaches the store (40 ms: a healthy
    /// server in another region).
    fn delay(&self, ms: u64);
    /// While `lost`, `fill` requests are lost: nothing runs on the store and
    /// the call times out after 10 ms.
    fn lose_fill(&self, lost: bool);
    /// How many calls reached this view so far.
    fn calls(&self) -> usize;
    /// The store itself, past every switch.
    fn store(&self) -> &MemoryBackend;
}

impl Switches for Switched {
    fn set_mode(&self, mode: Mode) {
        let faults = self.faults();
        let lost_fill = faults.fault_of(Op::Fill) == Some(Fault::LoseRequest(LOST_FILL));
        faults.clear();
        match mode {
            Mode::Healthy => {}
            Mode::Hang => faults.set_all(Fault::Hang),
            Mode::Refuse => faults.set_all(Fault::Refuse),
            Mode::Command => faults.set_all(Fault::CommandError),
            Mode::LoseAcquireReply => faults.set([Op::Acquire, Op::AcquireMany], Fault::LoseReply),
            Mode::HangFromThird => faults.set_all_from_call(3, Fault::Hang),
            Mode::WriteThenHang => faults.set(Op::WRITES, Fault::RunThenHang),
        }
        if lost_fill {
            faults.set([Op::Fill], Fault::LoseRequest(LOST_FILL));
        }
    }
    fn delay(&self, ms: u64) {
        self.faults().set_latency(Duration::from_millis(ms));
    }
    fn lose_fill(&self, lost: bool) {
        if lost {
            self.faults().set([Op::Fill], Fault::LoseRequest(LOST_FILL));
        } else {
            self.faults().clear_for([Op::Fill]);
        }
    }
    fn calls(&self) -> usize {
        self.faults().total_calls()
    }
    fn store(&self) -> &MemoryBackend {
        self.inner()
    }
}

/// How long a lost `fill` takes to time out.
const LOST_FILL: Duration = Duration::from_millis(10);

/// A pod on `backend`: 200 ms backend timeout, no jitter, no early refresh,
/// then whatever `f` sets.
pub fn pod(
    backend: &Switched,
    f: impl FnOnce(CacheBuilder<String, String>) -> CacheBuilder<String, String>,
) -> Cache<String, String> {
    f(Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .jitter(0.0)
        .early_refresh_beta(0.0)
        .backend_timeout(Duration::from_millis(200)))
    .build()
    .unwrap()
}

/// The key most tests use.
pub fn key() -> String {
    "k".to_string()
}

/// The store's keys of [`key`] in a [`pod`].
pub fn keys() -> FillKeys {
    FillKeys::new(NS, "k")
}

/// A loader that counts its load into `loads`, sleeps `took` (tokio time),
/// then answers `"{key}-v{n}"`, `n` being that count.
pub fn counting_loader(
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> impl FnOnce(String) -> BoxFuture<Result<String, OriginError>> + Send + 'static {
    Origin {
        loads: loads.clone(),
    }
    .loader(took)
}

/// A call with an instant loader counting into `loads`.
pub async fn fetch_now(
    c: &Cache<String, String>,
    key: &str,
    loads: &Arc<AtomicUsize>,
) -> Fetched<String> {
    fetch_loading(c, key, loads, Duration::ZERO).await
}

/// A call with a loader counting into `loads` that takes `took`.
pub async fn fetch_loading(
    c: &Cache<String, String>,
    key: &str,
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> Fetched<String> {
    let loader = counting_loader(loads, took);
    c.fetch(&key.to_owned(), loader).await.unwrap()
}

/// A call on [`key`] in a task of its own, with a loader counting into
/// `loads` that takes `took`: a load under way while the test goes on.
pub fn spawn_fetch(
    c: &Cache<String, String>,
    options: CallOptions,
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> JoinHandle<Result<Fetched<String>, Error>> {
    let c = c.clone();
    let loader = counting_loader(loads, took);
    tokio::spawn(async move { c.with_options(&options).fetch(&key(), loader).await })
}

/// `get_or_load` of `key` on `c` in a task of its own: a load under way
/// while the test goes on.
pub fn spawn_get_or_load(
    c: &Cache<String, String>,
    key: &str,
    loader: impl FnOnce(String) -> loaders::Loading + Send + 'static,
) -> JoinHandle<Result<String, Error>> {
    let (c, key) = (c.clone(), key.to_owned());
    tokio::spawn(async move { c.get_or_load(&key, loader).await })
}

/// Two processes on one store, each with its own switches and its own
/// [`pod`] (adjusted by `f`).
pub fn two_pods(
    f: impl Fn(CacheBuilder<String, String>) -> CacheBuilder<String, String>,
) -> [(Switched, Cache<String, String>); 2] {
    let a = switched();
    let b = a.peer();
    let (pod_a, pod_b) = (pod(&a, &f), pod(&b, &f));
    [(a, pod_a), (b, pod_b)]
}

/// A pod adjustment: leases of a fixed `ttl`.
pub fn fixed_lease(
    ttl: Duration,
) -> impl Fn(CacheBuilder<String, String>) -> CacheBuilder<String, String> + Copy {
    move |b| b.lease_ttl(LeaseTtl::Fixed(ttl))
}

/// A pod adjustment: a circuit breaker opening after `threshold`
/// consecutive failures, for `open_for`.
pub fn breaker(
    threshold: u32,
    open_for: Duration,
) -> impl Fn(CacheBuilder<String, String>) -> CacheBuilder<String, String> + Copy {
    move |b| b.circuit_breaker(CircuitBreaker::new(threshold, open_for))
}

/// Two processes on one store ([`two_pods`]), the first 10 ms into a load
/// of [`key`] that takes `took` (counted into `loads`); its call runs in a
/// task of its own.
pub async fn a_load_under_way(
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> (
    [(Switched, Cache<String, String>); 2],
    JoinHandle<Result<Fetched<String>, Error>>,
) {
    let pods = two_pods(|b| b);
    let call = spawn_fetch(&pods[0].1, CallOptions::new(), loads, took);
    tokio::time::sleep(Duration::from_millis(10)).await;
    (pods, call)
}

/// A holder next to the server loads [`key`] for 2 s; 10 ms later a waiter
/// `delay_ms` away from the server asks for it. Returns the waiter's
/// answer, the holder's, and how many loads ran.
pub async fn a_far_waiter_of_a_long_load(
    delay_ms: u64,
) -> (Fetched<String>, Fetched<String>, usize) {
    let loads = Arc::new(AtomicUsize::new(0));
    let ([_, (far, waiter)], slow) = a_load_under_way(&loads, Duration::from_secs(2)).await;
    far.delay(delay_ms);
    let waited = fetch_now(&waiter, "k", &loads).await;
    let held = slow.await.unwrap().unwrap();
    (waited, held, loads.load(Ordering::SeqCst))
}

/// Makes the backend refuse, then checks that the next call on [`key`]
/// loads afresh (`"k-v2"`, degraded): the outage fallback has nothing for
/// it.
pub async fn assert_the_fallback_forgot(
    backend: &Switched,
    c: &Cache<String, String>,
    loads: &Arc<AtomicUsize>,
    why: &str,
) {
    backend.set_mode(REFUSE);
    let f = fetch_now(c, "k", loads).await;
    assert_eq!(
        (f.value.as_str(), f.outcome),
        ("k-v2", Outcome::Degraded),
        "{why}"
    );
}
