//! The hit path under faults and races: `set` and `invalidate` racing a
//! hit's read, callers dropped mid-read, panics and backend errors on the
//! first read, early refresh and counters from the hit path, a value's
//! deadlines counted from when its read began, the Redis command
//! connection's response timeout (a paused server), and keys whose
//! `Display` fails. Memory backend behind a gate ([`FaultyBackend`]) in
//! paused time for the in-process races; private redis-servers (SIGSTOP)
//! for the Redis ones. Tests whose case once broke the library say what
//! used to happen.
//!
//! Longer than most files on purpose: the hit path is the one every call
//! takes first, and its faults (in process and on Redis) are read best
//! together, against one another.
//!
//! [`FaultyBackend`]: onefill::testing::FaultyBackend

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use onefill::backend::{Backend, FillKeys, LeaseRequest};
use onefill::redis::{RedisBackend, RedisOptions};
use onefill::testing::{BoxFuture, OriginError};
use onefill::testing::{Fault, FaultyBackend, Op};
use onefill::{
    Cache, CacheBuilder, CallOptions, CircuitBreaker, Codec, CodecError, Error, Fetched,
    LeaseToken, MemoryBackend, Outcome, L1,
};
use onefill_testkit::{time_limit, RedisServer};
use tokio::time::Instant;

/// A test on private servers takes seconds; past this it hangs.
const LIMIT: Duration = Duration::from_secs(60);

const NS: &str = "hit";

/// Reads run on the store, then wait at the gate (when closed) before they
/// answer: a read that saw the old value while a write goes on.
const OPEN: u8 = 0;
const GATED: u8 = 1;
/// Every `get` fails at once (a refused connection).
const REFUSE: u8 = 2;
/// Every `get` hangs.
const HANG: u8 = 3;
/// Every `get` panics.
const PANIC: u8 = 4;

/// A store whose reads can be held at a gate, refused, hung or made to
/// panic ([`Gate::set_mode`]); every other call reaches it.
type Gated = FaultyBackend<MemoryBackend>;

fn gated() -> Gated {
    FaultyBackend::new(MemoryBackend::new())
}

/// The read switches, in the words of the tests.
trait Gate {
    /// Switches the reads (`get`, and batches' `get_many`) to `mode`.
    fn set_mode(&self, mode: u8);
    /// Lets `n` gated reads answer.
    fn let_through(&self, n: usize);
    /// How many reads were made.
    fn gets(&self) -> usize;
}

impl Gate for Gated {
    fn set_mode(&self, mode: u8) {
        let reads = [Op::Get, Op::GetMany];
        self.faults().clear_for(reads);
        let fault = match mode {
            GATED => Fault::Gated,
            REFUSE => Fault::Refuse,
            HANG => Fault::Hang,
            PANIC => Fault::Panic,
            _ => return,
        };
        self.faults().set(reads, fault);
    }
    fn let_through(&self, n: usize) {
        self.faults().open_gate(n);
    }
    fn gets(&self) -> usize {
        self.faults().calls(Op::Get) + self.faults().calls(Op::GetMany)
    }
}

/// JSON strings, except that decoding a value containing "boom" panics.
struct PanickingCodec;

impl Codec<String> for PanickingCodec {
    fn encode(&self, _key: &str, value: &String) -> Result<Vec<u8>, CodecError> {
        serde_json::to_vec(value).map_err(CodecError::new)
    }
    fn decode(&self, _key: &str, bytes: &[u8]) -> Result<String, CodecError> {
        let s: String = serde_json::from_slice(bytes).map_err(CodecError::new)?;
        if s.contains("boom") {
            panic!("codec panicked on {s}");
        }
        Ok(s)
    }
    fn check_round_trip(&self, _key: &str, _: &[u8]) -> Result<(), CodecError> {
        Ok(())
    }
}

fn base(backend: &Gated) -> CacheBuilder<String, String> {
    Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .jitter(0.0)
        .early_refresh_beta(0.0)
        .ttl(Duration::from_secs(60))
        .backend_timeout(Duration::from_millis(200))
}

fn counting(
    loads: &Arc<AtomicUsize>,
    took: Duration,
) -> impl FnOnce(String) -> BoxFuture<Result<String, OriginError>> + Send + 'static {
    let loads = loads.clone();
    move |key| {
        Box::pin(async move {
            let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(took).await;
            Ok(format!("{key}-v{n}"))
        })
    }
}

fn spawn_fetch(
    c: &Cache<String, String>,
    key: &str,
    loads: &Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Result<Fetched<String>, Error>> {
    let c = c.clone();
    let key = key.to_owned();
    let loader = counting(loads, Duration::ZERO);
    tokio::spawn(async move { c.fetch(&key, loader).await })
}

async fn fetch(c: &Cache<String, String>, key: &str, loads: &Arc<AtomicUsize>) -> Fetched<String> {
    c.fetch(&key.to_owned(), counting(loads, Duration::ZERO))
        .await
        .unwrap()
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
}

// ---------------------------------------------------------------------------
// set / invalidate racing a hit's read
// ---------------------------------------------------------------------------

/// The leader reads "old", a `set` of "new" completes while the read's
/// answer is held back, then the read answers. The leader (and those that
/// joined before the set) may get "old"; nobody after the set may: not a
/// caller that starts during the read, not the L1, not the outage fallback
/// (checked on a cache without an L1, which would answer first).
#[tokio::test(start_paused = true)]
async fn a_set_during_the_hit_read_keeps_the_old_answer_out_of_l1_fallback_and_late_callers() {
    for with_l1 in [true, false] {
        let wire = gated();
        let c = if with_l1 {
            base(&wire).l1(L1::new(100)).build().unwrap()
        } else {
            base(&wire).no_l1().build().unwrap()
        };
        let writer = base(&wire.peer()).build().unwrap();
        writer.set(&"k".to_owned(), "old".into()).await.unwrap();
        let loads = Arc::new(AtomicUsize::new(0));

        wire.set_mode(GATED);
        let leader = spawn_fetch(&c, "k", &loads);
        settle().await;
        let early = spawn_fetch(&c, "k", &loads);
        settle().await;
        wire.set_mode(OPEN);
        c.set(&"k".to_owned(), "new".into()).await.unwrap();
        // A caller after the set: must not join the leader's flight.
        let late = fetch(&c, "k", &loads).await;
        assert_eq!((late.value.as_str(), late.coalesced), ("new", false));
        wire.let_through(1);
        let l = leader.await.unwrap().unwrap();
        let e = early.await.unwrap().unwrap();
        assert_eq!((l.value.as_str(), l.outcome), ("old", Outcome::Hit));
        assert_eq!((e.value.as_str(), e.coalesced), ("old", true));
        // Neither the L1 nor the fallback kept "old".
        let again = fetch(&c, "k", &loads).await;
        assert_eq!(again.value, "new");
        if !with_l1 {
            wire.set_mode(REFUSE);
            let outage = fetch(&c, "k", &loads).await;
            assert_eq!(
                (outage.value.as_str(), outage.outcome),
                ("new", Outcome::Stale),
                "the fallback serves the set's value"
            );
        }
        assert_eq!(loads.load(Ordering::SeqCst), 0);
    }
}

/// As above with `invalidate`: nothing from before it comes back (L1,
/// fallback tombstone, a caller starting after it).
#[tokio::test(start_paused = true)]
async fn an_invalidate_during_the_hit_read_is_not_undone() {
    let wire = gated();
    let c = base(&wire).l1(L1::new(100)).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "old".into()).await.unwrap();

    wire.set_mode(GATED);
    let leader = spawn_fetch(&c, "k", &loads);
    settle().await;
    wire.set_mode(OPEN);
    c.invalidate(&"k".to_owned()).await.unwrap();
    let late = fetch(&c, "k", &loads).await;
    assert_eq!(
        (late.value.as_str(), late.outcome, late.coalesced),
        ("k-v1", Outcome::Loaded, false)
    );
    wire.let_through(1);
    assert_eq!(leader.await.unwrap().unwrap().value, "old");
    c.invalidate(&"k".to_owned()).await.unwrap();
    wire.set_mode(REFUSE);
    let outage = fetch(&c, "k", &loads).await;
    assert_eq!(
        (outage.value.as_str(), outage.outcome),
        ("k-v2", Outcome::Degraded),
        "nothing from before the invalidate is served"
    );
}

/// Many rounds of set racing hits on several keys, with and without an
/// L1: after each set returns, a fetch gives the set's value (never an
/// older one from a flight it joined, the L1 or the fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_racing_hits_never_answer_older_values_after_they_return() {
    sets_racing_hits(true).await;
    sets_racing_hits(false).await;
}

async fn sets_racing_hits(with_l1: bool) {
    let backend = MemoryBackend::new();
    let builder = Cache::builder()
        .namespace(NS)
        .backend(backend.clone())
        .jitter(0.0);
    let builder = if with_l1 {
        builder.l1(L1::new(1000))
    } else {
        builder.no_l1()
    };
    let c: Cache<String, String> = builder.build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..4 {
        let c = c.clone();
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            let loads = Arc::new(AtomicUsize::new(0));
            while !stop.load(Ordering::Relaxed) {
                for k in ["a", "b", "c"] {
                    let _ = c
                        .fetch(&k.to_owned(), counting(&loads, Duration::ZERO))
                        .await;
                }
            }
        }));
    }
    let loads = Arc::new(AtomicUsize::new(0));
    for i in 0..3_000 {
        let k = ["a", "b", "c"][i % 3];
        let v = format!("v{i}");
        c.set(&k.to_owned(), v.clone()).await.unwrap();
        let got = fetch(&c, k, &loads).await;
        assert_eq!(got.value, v, "round {i}, L1: {with_l1}");
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }
}

// ---------------------------------------------------------------------------
// Callers dropped mid-read
// ---------------------------------------------------------------------------

/// Leaders dropped during their first read (a hit), round after round, with
/// followers that joined: the followers get the hit, the flight is not left
/// behind (the next call leads a new one), nothing loads.
#[tokio::test(start_paused = true)]
async fn leaders_dropped_during_a_hit_read_in_a_loop() {
    let wire = gated();
    let c = base(&wire).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "v".into()).await.unwrap();
    for round in 0..50 {
        wire.set_mode(GATED);
        let leader = spawn_fetch(&c, "k", &loads);
        settle().await;
        let followers: Vec<_> = (0..3).map(|_| spawn_fetch(&c, "k", &loads)).collect();
        settle().await;
        leader.abort();
        assert!(leader.await.unwrap_err().is_cancelled());
        // The restarted flight's read is gated too.
        wire.set_mode(OPEN);
        wire.let_through(2);
        for f in followers {
            let f = f.await.unwrap().unwrap();
            assert_eq!(
                (f.value.as_str(), f.outcome, f.coalesced),
                ("v", Outcome::Hit, true),
                "round {round}"
            );
        }
        let alone = fetch(&c, "k", &loads).await;
        assert!(!alone.coalesced, "round {round}: a flight was left behind");
        // Drain any permit left over.
        wire.faults().close_gate();
    }
    assert_eq!(loads.load(Ordering::SeqCst), 0);
}

/// Many callers of many keys, a random half of them (leaders included)
/// dropped mid-read: every survivor gets its key's value, none gets
/// FlightAbandoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_dropped_at_random_mid_read() {
    let wire = gated();
    let c = base(&wire)
        .backend_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for k in 0..8 {
        c.set(&format!("k{k}"), format!("v{k}")).await.unwrap();
    }
    let loads = Arc::new(AtomicUsize::new(0));
    for round in 0..40u64 {
        wire.set_mode(GATED);
        let mut calls = Vec::new();
        for i in 0..64u64 {
            let key = format!("k{}", i % 8);
            calls.push((key.clone(), spawn_fetch(&c, &key, &loads)));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        let mut kept = Vec::new();
        for (i, (key, call)) in calls.into_iter().enumerate() {
            if (i as u64 * 7 + round).is_multiple_of(2) {
                call.abort();
            } else {
                kept.push((key, call));
            }
        }
        wire.set_mode(OPEN);
        wire.let_through(1_000);
        for (key, call) in kept {
            match call.await {
                Ok(Ok(f)) => assert_eq!(f.value, key.replace('k', "v"), "round {round}"),
                Ok(Err(e)) => panic!("round {round}: {key}: {e}"),
                Err(e) => panic!("round {round}: {e}"),
            }
        }
        wire.faults().close_gate();
    }
    assert_eq!(loads.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// Panics during the first read
// ---------------------------------------------------------------------------

/// A codec that panics on a hit: the leader and its followers get
/// FlightAbandoned (the panic does not reach them), and the key is usable
/// again at once.
#[tokio::test(start_paused = true)]
async fn a_codec_panicking_on_a_hit_abandons_the_flight_and_leaves_nothing_behind() {
    let wire = gated();
    let c = base(&wire).codec(PanickingCodec).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "boom".into()).await.unwrap();
    wire.set_mode(GATED);
    let leader = spawn_fetch(&c, "k", &loads);
    settle().await;
    let followers: Vec<_> = (0..3).map(|_| spawn_fetch(&c, "k", &loads)).collect();
    settle().await;
    wire.let_through(1);
    let err = leader.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::FlightAbandoned), "{err}");
    for f in followers {
        let err = f.await.unwrap().unwrap_err();
        assert!(matches!(err, Error::FlightAbandoned), "{err}");
    }
    wire.set_mode(OPEN);
    c.set(&"k".to_owned(), "fine".into()).await.unwrap();
    let f = fetch(&c, "k", &loads).await;
    assert_eq!(
        (f.value.as_str(), f.outcome, f.coalesced),
        ("fine", Outcome::Hit, false)
    );
}

/// A backend whose `get` panics: FlightAbandoned for all, then usable.
#[tokio::test(start_paused = true)]
async fn a_backend_panicking_on_the_first_read_abandons_the_flight() {
    let wire = gated();
    let c = base(&wire).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "v".into()).await.unwrap();
    wire.set_mode(PANIC);
    let err = c
        .fetch(&"k".to_owned(), counting(&loads, Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FlightAbandoned), "{err}");
    wire.set_mode(OPEN);
    let f = fetch(&c, "k", &loads).await;
    assert_eq!((f.value.as_str(), f.coalesced), ("v", false));
}

// ---------------------------------------------------------------------------
// Backend errors on the first read
// ---------------------------------------------------------------------------

/// A hung first read costs the backend timeout once (charged to the
/// budget: the flight degrades, no second timeout), then a degraded load.
#[tokio::test(start_paused = true)]
async fn a_hung_first_read_costs_one_timeout_then_degrades() {
    let wire = gated();
    let c = base(&wire).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    wire.set_mode(HANG);
    let start = Instant::now();
    let f = c
        .fetch(&"k".to_owned(), counting(&loads, Duration::from_millis(30)))
        .await
        .unwrap();
    assert_eq!(f.outcome, Outcome::Degraded);
    assert_eq!(start.elapsed(), Duration::from_millis(230));
    assert_eq!(c.stats().backend_errors, 1);
}

/// Refused reads: degraded loads, strict mode surfaces the error, the
/// breaker opens after its threshold and then rejects without calling.
#[tokio::test(start_paused = true)]
async fn refused_first_reads_degrade_or_fail_strict_and_open_the_breaker() {
    let wire = gated();
    let c = base(&wire)
        .circuit_breaker(CircuitBreaker::new(3, Duration::from_secs(10)))
        .build()
        .unwrap();
    let strict = base(&wire).strict(true).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    wire.set_mode(REFUSE);
    let err = strict
        .fetch(&"k".to_owned(), counting(&loads, Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{err}");
    // A degraded load, then its value from the outage fallback.
    assert_eq!(fetch(&c, "k", &loads).await.outcome, Outcome::Degraded);
    for _ in 0..2 {
        assert_eq!(fetch(&c, "k", &loads).await.outcome, Outcome::Stale);
    }
    let before = wire.gets();
    assert_eq!(fetch(&c, "k", &loads).await.outcome, Outcome::Stale);
    assert_eq!(
        wire.gets(),
        before,
        "the open breaker rejects without a call"
    );
    assert!(c.stats().circuit_rejected >= 1);
}

// ---------------------------------------------------------------------------
// Early refresh, stats
// ---------------------------------------------------------------------------

/// A hit due for early refresh answers at once and refreshes once in the
/// background; a hit far from expiry does not.
#[tokio::test(start_paused = true)]
async fn early_refresh_from_the_hit_path() {
    let wire = gated();
    let c = base(&wire)
        .ttl(Duration::from_secs(1))
        .early_refresh_beta(1.0)
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    let load = |loads: &Arc<AtomicUsize>| counting(loads, Duration::from_millis(100));
    let k = "k".to_owned();
    let first = c.fetch(&k, load(&loads)).await.unwrap();
    assert_eq!(first.outcome, Outcome::Loaded);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let far = c.fetch(&k, load(&loads)).await.unwrap();
    assert_eq!(far.outcome, Outcome::Hit);
    settle().await;
    assert_eq!(
        loads.load(Ordering::SeqCst),
        1,
        "no refresh far from expiry"
    );
    // Stored at 100 ms, expiring at 1.1 s, 100 ms as the load's delta: due
    // 125 ms before expiry.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let near = c.fetch(&k, load(&loads)).await.unwrap();
    assert_eq!((near.value.as_str(), near.outcome), ("k-v1", Outcome::Hit));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(loads.load(Ordering::SeqCst), 2, "one early refresh");
    let after = c.fetch(&k, load(&loads)).await.unwrap();
    assert_eq!(
        (after.value.as_str(), after.outcome),
        ("k-v2", Outcome::Hit)
    );
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.loads_ok), (3, 1, 2), "{s:?}");
}

/// One hit flight with followers, then alone: the counters a flight keeps.
#[tokio::test(start_paused = true)]
async fn counters_of_a_coalesced_hit() {
    let wire = gated();
    let c = base(&wire).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "v".into()).await.unwrap();
    wire.set_mode(GATED);
    let leader = spawn_fetch(&c, "k", &loads);
    settle().await;
    let followers: Vec<_> = (0..4).map(|_| spawn_fetch(&c, "k", &loads)).collect();
    settle().await;
    wire.let_through(1);
    assert!(!leader.await.unwrap().unwrap().coalesced);
    for f in followers {
        assert!(f.await.unwrap().unwrap().coalesced);
    }
    wire.set_mode(OPEN);
    fetch(&c, "k", &loads).await;
    let s = c.stats();
    assert_eq!(
        (
            s.hits,
            s.coalesced,
            s.misses,
            s.stale_served,
            s.backend_errors
        ),
        (2, 4, 0, 0, 0),
        "{s:?}"
    );
    assert_eq!(wire.gets(), 2);
}

// ---------------------------------------------------------------------------
// A value's deadlines count from when its read began (the second pass)
// ---------------------------------------------------------------------------
//
// A value's deadlines in this process (its L1 entry, the outage fallback's
// copy) count from when the read began, not from its reply: the TTL is read
// after the request reached the server, so a deadline counted from the
// reply outlives the server's copy by the reply's latency (the hit, a
// restarted flight and a batch each did so once). And a
// half-open probe frees its slot however its read ends (the backend's
// future is made after the breaker admits the call).

/// `base` with a 1 s TTL (values expire within the test) and a backend
/// timeout longer than the replies held back.
fn short(backend: &Gated) -> CacheBuilder<String, String> {
    base(backend)
        .ttl(Duration::from_secs(1))
        .backend_timeout(Duration::from_secs(1))
}

/// "v" written (expiring at t0 + 1 s), read half a second later with the
/// replies held back from then on.
async fn written_then_gated(c: &Cache<String, String>, wire: &Gated) {
    c.set(&"k".to_owned(), "v".into()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    wire.set_mode(GATED);
}

/// A hit on "v" whose reply is held back 300 ms.
async fn a_hit_held_back_300_ms(c: &Cache<String, String>, wire: &Gated, loads: &Arc<AtomicUsize>) {
    let hit = spawn_fetch(c, "k", loads);
    settle().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    wire.let_through(1);
    let hit = hit.await.unwrap().unwrap();
    assert_eq!((hit.value.as_str(), hit.outcome), ("v", Outcome::Hit));
}

/// At t0 + ~1.1 s, "v" is gone on the server for ~100 ms: in an outage
/// the fallback no longer serves it (the call degrades to a load).
async fn the_fallback_no_longer_serves_it(
    c: &Cache<String, String>,
    wire: &Gated,
    loads: &Arc<AtomicUsize>,
) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    wire.set_mode(REFUSE);
    let outage = fetch(c, "k", loads).await;
    assert_eq!(
        (outage.value.as_str(), outage.outcome),
        ("k-v1", Outcome::Degraded),
        "the fallback served a value the server no longer keeps"
    );
}

async fn try_fetch(
    c: &Cache<String, String>,
    loads: &Arc<AtomicUsize>,
) -> Result<Fetched<String>, Error> {
    c.fetch(&"k".to_owned(), counting(loads, Duration::ZERO))
        .await
}

/// A hit whose reply is slow (300 ms of response latency): the outage
/// fallback must not serve the value past the server's expiry. Before the
/// change the expiry counted from after the reply (server + 300 ms).
#[tokio::test(start_paused = true)]
async fn a_slow_hit_reply_never_stretches_the_fallback_past_the_server_expiry() {
    let wire = gated();
    let c = short(&wire).no_l1().build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    written_then_gated(&c, &wire).await;
    a_hit_held_back_300_ms(&c, &wire, &loads).await;
    the_fallback_no_longer_serves_it(&c, &wire, &loads).await;
}

/// The same with an L1: its entry must not outlive the server's copy.
#[tokio::test(start_paused = true)]
async fn a_slow_hit_reply_never_stretches_the_l1_past_the_server_expiry() {
    let wire = gated();
    let c = short(&wire).l1(L1::new(100)).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    written_then_gated(&c, &wire).await;
    a_hit_held_back_300_ms(&c, &wire, &loads).await;
    wire.set_mode(OPEN);
    let l1_before = c.stats().l1_hits;
    tokio::time::sleep(Duration::from_millis(250)).await; // t0 + ~1.05 s
    let after = fetch(&c, "k", &loads).await;
    assert_eq!(
        c.stats().l1_hits,
        l1_before,
        "an L1 hit on an expired value: {after:?}"
    );
    assert_eq!(
        (after.value.as_str(), after.outcome),
        ("k-v1", Outcome::Loaded)
    );
}

/// A half-open probe whose read panics frees the probe slot (the permit is
/// dropped while unwinding): the next call probes and closes the breaker.
#[tokio::test(start_paused = true)]
async fn a_probe_that_panics_frees_the_probe_slot() {
    let wire = gated();
    let c = short(&wire)
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(1)))
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    c.set(&"k".to_owned(), "v".into()).await.unwrap();
    wire.set_mode(REFUSE);
    let _ = try_fetch(&c, &loads).await; // opens the breaker
    tokio::time::sleep(Duration::from_millis(1_100)).await; // half-open
    c.set(&"k".to_owned(), "v2".into()).await.ok();
    wire.set_mode(PANIC);
    let err = try_fetch(&c, &loads).await.unwrap_err();
    assert!(matches!(err, Error::FlightAbandoned), "{err}");
    wire.set_mode(OPEN);
    let before = wire.gets();
    let _ = try_fetch(&c, &loads).await;
    assert_eq!(
        wire.gets(),
        before + 1,
        "the next call was not admitted as a probe"
    );
    // Closed again: a plain hit.
    let f = fetch(&c, "k", &loads).await;
    assert_eq!(f.outcome, Outcome::Hit);
}

/// A half-open probe whose caller is dropped mid-read frees its slot: the
/// flight restarted in a task probes again (and closes the breaker).
#[tokio::test(start_paused = true)]
async fn a_probe_dropped_mid_read_frees_the_probe_slot() {
    let wire = gated();
    let c = short(&wire)
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(1)))
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    wire.set_mode(REFUSE);
    let _ = try_fetch(&c, &loads).await; // opens the breaker
    wire.set_mode(OPEN);
    tokio::time::sleep(Duration::from_millis(1_100)).await; // half-open
    c.set(&"k".to_owned(), "v".into()).await.unwrap();
    wire.set_mode(GATED);
    let before = wire.gets();
    let leader = spawn_fetch(&c, "k", &loads);
    settle().await;
    assert_eq!(wire.gets(), before + 1);
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    settle().await;
    assert_eq!(
        wire.gets(),
        before + 2,
        "the restarted flight was not admitted"
    );
    wire.set_mode(OPEN);
    wire.let_through(1);
    settle().await;
    let f = fetch(&c, "k", &loads).await;
    assert_eq!((f.value.as_str(), f.outcome), ("v", Outcome::Hit));
    assert_eq!(
        loads.load(Ordering::SeqCst),
        1,
        "only the degraded load that opened it"
    );
}

/// The flight's own reads (here: a leader dropped mid-read, its flight
/// restarted in a task that reads again) count from before the read too.
/// Regression: the flight counted from after the reply, and the fallback
/// served the value ~100 ms after the server dropped it.
#[tokio::test(start_paused = true)]
async fn a_restarted_flight_with_a_slow_reply_never_stretches_the_fallback() {
    let wire = gated();
    let c = short(&wire).no_l1().build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    written_then_gated(&c, &wire).await;
    let leader = spawn_fetch(&c, "k", &loads);
    settle().await;
    let follower = spawn_fetch(&c, "k", &loads);
    settle().await;
    leader.abort();
    let _ = leader.await;
    settle().await; // the restarted flight reads (ttl ~500 ms), its reply held
    tokio::time::sleep(Duration::from_millis(300)).await;
    wire.let_through(1);
    let f = follower.await.unwrap().unwrap();
    assert_eq!((f.value.as_str(), f.outcome), ("v", Outcome::Hit));
    the_fallback_no_longer_serves_it(&c, &wire, &loads).await;
}

/// The same through `get_or_load_many` (a batch reads for many flights and
/// hands each its answer). Regression: the L1 answered a hit ~50 ms after
/// the server dropped the value.
#[tokio::test(start_paused = true)]
async fn a_slow_batch_reply_never_stretches_the_l1_past_the_server_expiry() {
    let wire = gated();
    let c = short(&wire).l1(L1::new(100)).build().unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    written_then_gated(&c, &wire).await;
    let many = {
        let c = c.clone();
        tokio::spawn(async move {
            c.get_or_load_many(&["k".to_owned()], |ids: Vec<String>| async move {
                Ok::<_, OriginError>(
                    ids.into_iter()
                        .map(|k| (k, "loaded".to_owned()))
                        .collect::<Vec<_>>(),
                )
            })
            .await
        })
    };
    settle().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    wire.let_through(1);
    let got = many.await.unwrap().unwrap();
    assert_eq!(got["k"], "v");
    wire.set_mode(OPEN);
    tokio::time::sleep(Duration::from_millis(250)).await; // t0 + ~1.05 s
    let l1_before = c.stats().l1_hits;
    let after = fetch(&c, "k", &loads).await;
    assert_eq!(
        c.stats().l1_hits,
        l1_before,
        "an L1 hit on a value the server expired: {after:?}"
    );
}

// ---------------------------------------------------------------------------
// Redis: the command connection has no driver response timeout
// ---------------------------------------------------------------------------

fn fast(response: Duration) -> RedisOptions {
    RedisOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .response_timeout(response)
        .reconnect_retries(0)
}

/// Every `Backend` method of a standalone `RedisBackend` used directly
/// times out on a paused server within about the response timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_method_times_out_on_a_paused_server() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let backend = RedisBackend::connect_with(&server.url(), fast(Duration::from_millis(200)))
        .await
        .unwrap();
    let keys = FillKeys::new(&format!("rv{}", std::process::id()), "k");
    let token = LeaseToken::random();
    backend
        .set(&keys, b"x", Duration::from_secs(60))
        .await
        .unwrap();
    server.pause();
    let limit = Duration::from_millis(1_500);
    macro_rules! times_out {
        ($name:literal, $call:expr) => {{
            let started = std::time::Instant::now();
            let answer = tokio::time::timeout(Duration::from_secs(5), $call).await;
            let took = started.elapsed();
            assert!(answer.is_ok(), "{} hung", $name);
            assert!(took < limit, "{} took {:?}", $name, took);
            answer.unwrap()
        }};
    }
    let e = times_out!("get", backend.get(&keys)).unwrap_err();
    assert!(e.is_timeout(), "{e}");
    let e = times_out!(
        "acquire",
        backend.acquire(&keys, &token, Duration::from_secs(5), Duration::ZERO)
    )
    .unwrap_err();
    assert!(e.is_timeout(), "{e}");
    let e = times_out!(
        "fill",
        backend.fill(&keys, &token, b"y", Duration::from_secs(5))
    )
    .unwrap_err();
    assert!(e.is_timeout(), "{e}");
    let e = times_out!("release", backend.release(&keys, &token, None)).unwrap_err();
    assert!(e.is_timeout(), "{e}");
    let e = times_out!(
        "extend",
        backend.extend(&keys, &token, Duration::from_secs(5))
    )
    .unwrap_err();
    assert!(e.is_timeout(), "{e}");
    let e = times_out!("set", backend.set(&keys, b"z", Duration::from_secs(5))).unwrap_err();
    assert!(e.is_timeout(), "{e}");
    let e = times_out!("invalidate", backend.invalidate(&keys)).unwrap_err();
    assert!(e.is_timeout(), "{e}");
    let many = vec![keys.clone(), FillKeys::new("other", "k2")];
    for r in times_out!("get_many", backend.get_many(&many)) {
        assert!(r.unwrap_err().is_timeout());
    }
    let requests = vec![LeaseRequest::new(
        keys.clone(),
        LeaseToken::random(),
        Duration::ZERO,
    )];
    for r in times_out!(
        "acquire_many",
        backend.acquire_many(&requests, Duration::from_secs(5))
    ) {
        assert!(r.unwrap_err().is_timeout());
    }
    server.resume();
}

/// A cache on a standalone `RedisBackend` (the direct `read`), a hit on a
/// paused server: bounded by the cache's backend timeout, then degraded;
/// through `shared_backend` (the trait's `get`) too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_hit_on_a_paused_server_is_bounded_by_the_backend_timeout() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let redis = RedisBackend::connect_with(&server.url(), fast(Duration::from_secs(1)))
        .await
        .unwrap();
    let ns = format!("rc{}", std::process::id());
    let build = |b: CacheBuilder<String, String>| {
        b.namespace(ns.clone())
            .no_l1()
            .backend_timeout(Duration::from_millis(150))
            .build()
            .unwrap()
    };
    let direct = build(Cache::builder().backend(redis.clone()));
    let shared: Arc<dyn Backend> = Arc::new(redis.clone());
    let through_trait = build(Cache::builder().shared_backend(shared));
    let loads = Arc::new(AtomicUsize::new(0));
    assert_eq!(fetch(&direct, "k", &loads).await.outcome, Outcome::Loaded);
    assert_eq!(
        fetch(&through_trait, "k", &loads).await.outcome,
        Outcome::Hit
    );
    assert_eq!(fetch(&direct, "k", &loads).await.outcome, Outcome::Hit);
    server.pause();
    for c in [&direct, &through_trait] {
        let started = std::time::Instant::now();
        let f = fetch(c, "k", &loads).await;
        let took = started.elapsed();
        assert_eq!(f.outcome, Outcome::Stale, "the outage fallback");
        assert!(took < Duration::from_millis(600), "{took:?}");
    }
    server.resume();
}

/// Regression: a cache whose backend timeout is longer than the Redis
/// response timeout (here 3 s vs 200 ms: a user who wants the budget for a
/// far, slow but healthy server, and a driver that gives up on a single
/// hung reply quickly). Before the change a hit on a hung server failed
/// after the response timeout (200 ms, then the fallback / a degraded
/// load); now the cache's hit path calls `RedisBackend::read` on a
/// connection with no response timeout, so it hangs the whole backend
/// timeout (3 s), 15x longer, contrary to `RedisOptions::response_timeout`'s
/// docs ("How long the driver waits for one reply before failing the
/// command"). `Cache::get` likewise. The same cache built with
/// `shared_backend` (trait `get`, bounded) still answers in 200 ms.
/// Fixed: the direct read is bounded by the response timeout where that
/// is shorter than the cache's (`RedisBackend::read_within`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_hit_is_bounded_by_the_redis_response_timeout_too() {
    let _limit = time_limit(LIMIT);
    let server = RedisServer::start();
    let redis = RedisBackend::connect_with(&server.url(), fast(Duration::from_millis(200)))
        .await
        .unwrap();
    let c: Cache<String, String> = Cache::builder()
        .namespace(format!("rt{}", std::process::id()))
        .backend(redis)
        .no_l1()
        .backend_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    assert_eq!(fetch(&c, "k", &loads).await.outcome, Outcome::Loaded);
    server.pause();
    let started = std::time::Instant::now();
    let f = fetch(&c, "k", &loads).await;
    let fetch_took = started.elapsed();
    let started = std::time::Instant::now();
    let got = c.get(&"k".to_owned()).await;
    let get_took = started.elapsed();
    server.resume();
    assert_eq!(f.outcome, Outcome::Stale);
    assert!(got.is_err());
    assert!(
        fetch_took < Duration::from_secs(1) && get_took < Duration::from_secs(1),
        "a hit on a hung server took {fetch_took:?} (fetch) and {get_took:?} (get), \
         the response timeout is 200 ms"
    );
}

// ---------------------------------------------------------------------------
// Keys formatted on the stack (`KeyBuf`)
// ---------------------------------------------------------------------------

/// A key type whose `Display` writes a prefix and then reports an error
/// (a field that fails to format, say).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Failing(u32);

impl std::fmt::Display for Failing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("user:")?;
        Err(std::fmt::Error)
    }
}

/// Regression: `fetch_in_flight` now formats the key with `KeyBuf`, which
/// keeps what a failing `Display` wrote before its error ("user:") where
/// `to_string` (before the change, and still in `set`/`invalidate`)
/// panicked. Two distinct keys then share one cache entry: the second
/// caller gets the first key's value, silently (a cross-key leak), while
/// `set` of the same key panics. Before: every call on such a key panicked.
/// Fixed: such a key is refused (`InputError::KeyDisplay`) by every call,
/// and none panics.
#[tokio::test(start_paused = true)]
async fn a_key_whose_display_fails_is_refused_by_every_call() {
    let c: Cache<Failing, String> = Cache::builder()
        .namespace(NS)
        .backend(MemoryBackend::new())
        .no_l1()
        .build()
        .unwrap();
    let load = |k: Failing| async move { Ok::<_, OriginError>(format!("secret of {}", k.0)) };
    let first = {
        let c = c.clone();
        tokio::spawn(async move { c.fetch(&Failing(1), load).await }).await
    };
    let second = {
        let c = c.clone();
        tokio::spawn(async move { c.fetch(&Failing(2), load).await }).await
    };
    if let (Ok(Ok(a)), Ok(Ok(b))) = (&first, &second) {
        assert_ne!(
            b.value, a.value,
            "key 2 answered with key 1's value ({:?})",
            b.outcome
        );
    }
    fn refused<T>(r: &Result<T, Error>) -> bool {
        matches!(r, Err(Error::InvalidInput(onefill::InputError::KeyDisplay)))
    }
    assert!(refused(&first.unwrap()), "fetch");
    assert!(refused(&second.unwrap()), "fetch");
    assert!(refused(&c.get(&Failing(1)).await), "get");
    assert!(refused(&c.set(&Failing(1), "x".into()).await), "set");
    assert!(refused(&c.invalidate(&Failing(1)).await), "invalidate");
    let many = c
        .fetch_many(&[Failing(1)], |_| async {
            Ok::<_, OriginError>(Vec::<(Failing, String)>::new())
        })
        .await
        .unwrap();
    assert!(
        refused(many.get(&Failing(1)).expect("an answer for the key")),
        "fetch_many"
    );
}

/// Regression (the hit's future): every layer of a call moves its
/// inner future at least once, and an async fn keeps its arguments for its
/// whole life, so a large argument held by value is paid for at every
/// layer. A `get_or_load` future was 3,360 bytes (the leader, with the
/// call's policy inline, held five times; the backend's future twice; a
/// `&CallOptions::default()` temporary held through the call); 1,624 since.
/// The bound leaves a compiler's layout some room, not the options
/// temporary (232 bytes) or a policy (296) held again. The size is the
/// type's: the Redis arm of the read is compiled in with the feature,
/// whatever the cache's backend.
#[tokio::test]
async fn a_redis_hit_future_stays_small() {
    let cache: Cache<String, String> = Cache::builder().build().unwrap();
    let key = "k".to_owned();
    let plain = cache.get_or_load(&key, |k| async move { Ok::<_, OriginError>(k) });
    let options = CallOptions::new().ttl(Duration::from_secs(5));
    let with_options = cache
        .with_options(&options)
        .fetch(&key, |k| async move { Ok::<_, OriginError>(k) });
    for (what, size) in [
        ("get_or_load", std::mem::size_of_val(&plain)),
        ("fetch with options", std::mem::size_of_val(&with_options)),
    ] {
        assert!(size <= 1_760, "a {what} future is {size} bytes");
    }
    // Both still answer.
    assert_eq!(plain.await.unwrap(), "k");
    assert_eq!(with_options.await.unwrap().value, "k");
}
