//! What operators see: the lock-level metrics in the scenarios that make
//! them move (a stalled holder taken over, a refresh overtaken by a new
//! load, a fill fenced out), counted through `metrics`' `DebuggingRecorder`
//! and checked against `stats()`; and the `tracing` spans of a call, with
//! their parents and fields, through a capturing layer. Memory backend in
//! paused time, then the stalled holder again on a private `redis-server`.
//! (A little over 600 lines: one scenario per metric that moves, each
//! checked against `stats()`, and the span tree in one place.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use onefill::backend::Backend;
use onefill::testing::{Fault, FaultyBackend, Op};
use onefill::{Cache, LeaseTtl, MemoryBackend, Outcome, WaitPolicy, L1};
use parking_lot::Mutex;
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

const NS: &str = "obs";

/// A process's cache: a fixed lease TTL, no jitter, no early refresh, no L1.
fn pod(backend: Arc<dyn Backend>, lease: Duration) -> Cache<String, String> {
    Cache::builder()
        .namespace(NS)
        .shared_backend(backend)
        .no_l1()
        .ttl(Duration::from_secs(60))
        .jitter(0.0)
        .early_refresh_beta(0.0)
        .lease_ttl(LeaseTtl::Fixed(lease))
        .max_load_time(Duration::from_secs(30))
        .wait(WaitPolicy::default().deadline(Duration::from_secs(20)))
        .build()
        .unwrap()
}

/// A pod whose `metrics` handles are bound to a recorder of its own.
fn pod_with_recorder(
    backend: Arc<dyn Backend>,
    lease: Duration,
) -> (Cache<String, String>, Snapshotter) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let cache = metrics::with_local_recorder(&recorder, || pod(backend, lease));
    (cache, snapshotter)
}

/// A recorder's series: counters by (name, extra label value), histograms
/// and gauges by name.
#[derive(Debug, Default)]
struct Series {
    counters: HashMap<(String, Option<String>), u64>,
    histograms: HashMap<String, Vec<f64>>,
    gauges: HashMap<String, f64>,
}

impl Series {
    /// Everything recorded so far. A snapshot drains the recorder (gauges
    /// included: they restart from 0), so one `Series` per recorder adds up
    /// successive snapshots with [`Series::add`].
    fn of(snapshotter: &Snapshotter) -> Series {
        let mut series = Series::default();
        series.add(snapshotter);
        series
    }

    fn add(&mut self, snapshotter: &Snapshotter) {
        let series = self;
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let name = key.name().to_owned();
            let extra = key
                .labels()
                .find(|l| l.key() != "namespace")
                .map(|l| l.value().to_owned());
            match value {
                DebugValue::Counter(n) => *series.counters.entry((name, extra)).or_default() += n,
                DebugValue::Histogram(xs) => series
                    .histograms
                    .entry(name)
                    .or_default()
                    .extend(xs.iter().map(|x| x.0)),
                DebugValue::Gauge(x) => *series.gauges.entry(name).or_default() += x.0,
            }
        }
    }
    fn counter(&self, name: &str) -> u64 {
        self.counters[&(name.to_owned(), None)]
    }
    fn labelled(&self, name: &str, value: &str) -> u64 {
        self.counters[&(name.to_owned(), Some(value.to_owned()))]
    }
    fn histogram(&self, name: &str) -> &[f64] {
        &self.histograms[name]
    }
}

/// Sleeps 10 ms at a time until `done` (at most 2 s, then fails).
async fn until(done: impl Fn() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not reached in 2 s");
}

async fn slow(value: &'static str, ms: u64) -> Result<String, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Ok(value.to_owned())
}

/// The stalled holder: A wins the lease, then its renewals fail while its
/// load runs 3 s; B waits, takes the lease over when it runs out (1 s, with
/// no notification: a takeover), loads and fills; A's fill is fenced out.
/// Each side counts its part, in `stats()` and in `metrics` alike.
async fn stalled_holder_is_taken_over(store: Arc<dyn Backend>, b_store: Arc<dyn Backend>) {
    let lease = Duration::from_secs(1);
    // Its lease renewals fail (a holder cut off from the store, or stalled):
    // the lease runs out under its load.
    let stalling = FaultyBackend::shared(store);
    stalling.faults().set([Op::Extend], Fault::Refuse);
    let (a, a_metrics) = pod_with_recorder(Arc::new(stalling), lease);
    let (b, b_metrics) = pod_with_recorder(b_store, lease);
    let k = "k".to_owned();

    let holder = tokio::spawn({
        let (a, k) = (a.clone(), k.clone());
        async move { a.fetch(&k, |_| slow("a", 3_000)).await }
    });
    until(|| a.stats().lease_acquired == 1).await;
    let waiter = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.fetch(&k, |_| slow("b", 100)).await }
    });
    until(|| b.stats().waits == 1).await;
    let mut mb = Series::of(&b_metrics);
    assert_eq!(mb.gauges["onefill_lease_waiters"], 1.0, "B waits now");

    let waited = waiter.await.unwrap().unwrap();
    assert_eq!(
        (waited.value.as_str(), waited.outcome),
        ("b", Outcome::Loaded)
    );
    let held = holder.await.unwrap().unwrap();
    assert_eq!((held.value.as_str(), held.outcome), ("a", Outcome::Loaded));
    assert_eq!(
        b.get(&k).await.unwrap().as_deref(),
        Some("b"),
        "A's late fill did not land"
    );

    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.lease_acquired, sa.loads_ok), (1, 1), "{sa:?}");
    assert_eq!((sa.fills_fenced, sa.lease_lost), (1, 1), "{sa:?}");
    assert!(sa.lease_renewal_failures >= 2, "{sa:?}");
    assert_eq!((sa.lease_takeovers, sa.duplicate_loads), (0, 0), "{sa:?}");
    assert_eq!(
        (sb.lease_takeovers, sb.waits, sb.lease_acquired),
        (1, 1, 1),
        "{sb:?}"
    );
    assert_eq!(
        (sb.fills_fenced, sb.lease_lost, sb.loads_ok),
        (0, 0, 1),
        "{sb:?}"
    );

    let ma = Series::of(&a_metrics);
    assert_eq!(ma.counter("onefill_fills_fenced_total"), 1);
    assert_eq!(ma.counter("onefill_leases_lost_total"), 1);
    assert_eq!(
        ma.labelled("onefill_lease_renewals_total", "error"),
        sa.lease_renewal_failures
    );
    assert_eq!(ma.counter("onefill_lease_takeovers_total"), 0);
    let a_held = ma.histogram("onefill_lease_hold_duration_seconds");
    assert_eq!(a_held.len(), 1, "{a_held:?}");
    assert!(a_held[0] >= 3.0, "held for its whole load: {a_held:?}");
    assert!(ma
        .histogram("onefill_lease_wait_duration_seconds")
        .is_empty());

    mb.add(&b_metrics);
    assert_eq!(mb.counter("onefill_lease_takeovers_total"), 1);
    assert_eq!(mb.counter("onefill_waits_total"), 1);
    assert_eq!(mb.counter("onefill_fills_fenced_total"), 0);
    let b_waited = mb.histogram("onefill_lease_wait_duration_seconds");
    assert_eq!(b_waited.len(), 1);
    assert!(
        (0.9..2.0).contains(&b_waited[0]),
        "until A's lease ran out: {b_waited:?}"
    );
    assert_eq!(mb.histogram("onefill_lease_hold_duration_seconds").len(), 1);
    assert_eq!(mb.gauges["onefill_lease_waiters"], 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_holder_is_taken_over_and_its_fill_fenced() {
    let store = MemoryBackend::new();
    stalled_holder_is_taken_over(Arc::new(store.clone()), Arc::new(store)).await;
}

/// The same on real Redis (a private server; real time).
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_stalled_holder_is_taken_over_and_its_fill_fenced_on_redis() {
    // Seconds of work on a private server; past this it hangs.
    let _limit = onefill_testkit::time_limit(Duration::from_secs(60));
    use onefill::redis::RedisBackend;
    let server = onefill_testkit::RedisServer::start();
    let a = RedisBackend::connect(&server.url()).await.unwrap();
    let b = RedisBackend::connect(&server.url()).await.unwrap();
    stalled_holder_is_taken_over(Arc::new(a), Arc::new(b)).await;
}

/// A holder that releases (its load failed) is not taken over: the waiter
/// is told, and wins the lease before the old one would have run out.
#[tokio::test(start_paused = true)]
async fn a_released_lease_is_no_takeover() {
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let a = pod(store.clone(), Duration::from_secs(5));
    let b = pod(store, Duration::from_secs(5));
    let k = "k".to_owned();
    let holder = tokio::spawn({
        let (a, k) = (a.clone(), k.clone());
        async move {
            a.get_or_load(&k, |_| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Err::<String, _>(std::io::Error::other("origin down"))
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let waited = b.fetch(&k, |_| slow("b", 100)).await;
    assert_eq!(waited.unwrap().outcome, Outcome::Loaded);
    assert!(holder.await.unwrap().is_err());
    let sb = b.stats();
    assert_eq!(
        (sb.waits, sb.lease_acquired, sb.lease_takeovers),
        (1, 1, 0),
        "{sb:?}"
    );
}

/// The waiters gauge goes back down however a wait ends, here with its
/// runtime shutting down under it (the flight's task dropped mid-wait).
#[test]
fn the_waiters_gauge_comes_back_down_when_a_wait_is_dropped() {
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let (b, snapshotter) = pod_with_recorder(store.clone(), Duration::from_secs(5));
    let mut gauge = Series::default();
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let a = pod(store, Duration::from_secs(5));
            let k = "k".to_owned();
            tokio::spawn({
                let (a, k) = (a.clone(), k.clone());
                async move { a.get_or_load(&k, |_| slow("a", 60_000)).await }
            });
            until(|| a.stats().lease_acquired == 1).await;
            tokio::spawn({
                let (b, k) = (b.clone(), k.clone());
                async move { b.get_or_load(&k, |_| slow("b", 1)).await }
            });
            until(|| b.stats().waits == 1).await;
        });
        gauge.add(&snapshotter);
        assert_eq!(gauge.gauges["onefill_lease_waiters"], 1.0);
    }
    gauge.add(&snapshotter);
    assert_eq!(gauge.gauges["onefill_lease_waiters"], 0.0);
    assert_eq!(b.stats().wait_timeouts, 0);
}

/// A background refresh still loading when the value expires and its lease
/// is gone (invalidated by another process): a new flight in the same
/// process wins the lease and loads too. Two loads of one key at once in
/// one process: a duplicate load, and the refresh's fill is fenced out.
#[tokio::test(start_paused = true)]
async fn a_load_overtaking_a_running_refresh_is_a_duplicate() {
    let store = MemoryBackend::new();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let a: Cache<String, String> = metrics::with_local_recorder(&recorder, || {
        Cache::builder()
            .namespace(NS)
            .backend(store.clone())
            .no_l1()
            .ttl(Duration::from_secs(1))
            .grace(Duration::from_secs(60))
            .jitter(0.0)
            .build()
            .unwrap()
    });
    let b = pod(Arc::new(store), Duration::from_secs(5));
    let k = "k".to_owned();
    a.set(&k, "v0".to_owned()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let stale = a.fetch(&k, |_| slow("refreshed", 5_000)).await.unwrap();
    assert_eq!(
        (stale.value.as_str(), stale.outcome),
        ("v0", Outcome::Stale)
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.invalidate(&k).await.unwrap();
    let loaded = a.fetch(&k, |_| slow("new", 100)).await.unwrap();
    assert_eq!(
        (loaded.value.as_str(), loaded.outcome),
        ("new", Outcome::Loaded)
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(a.get(&k).await.unwrap().as_deref(), Some("new"));

    let s = a.stats();
    assert_eq!((s.duplicate_loads, s.loads_ok), (1, 2), "{s:?}");
    assert_eq!((s.lease_lost, s.background_refreshes), (1, 1), "{s:?}");
    let m = Series::of(&snapshotter);
    assert_eq!(m.counter("onefill_duplicate_loads_total"), 1);
    assert_eq!(m.labelled("onefill_refreshes_total", "stale"), 1);
    assert_eq!(m.labelled("onefill_loads_total", "ok"), 2);
    assert_eq!(m.histogram("onefill_lease_hold_duration_seconds").len(), 2);
}

/// Five callers of one key in one process share a flight: the callers
/// histogram says so; a later hit is a flight of one.
#[tokio::test(start_paused = true)]
async fn callers_per_flight_are_recorded() {
    let (a, snapshotter) =
        pod_with_recorder(Arc::new(MemoryBackend::new()), Duration::from_secs(5));
    let k = "k".to_owned();
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let (a, k) = (a.clone(), k.clone());
            tokio::spawn(async move { a.get_or_load(&k, |_| slow("v", 100)).await })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), "v");
    }
    a.get_or_load(&k, |_| slow("v", 100)).await.unwrap();
    let m = Series::of(&snapshotter);
    assert_eq!(m.histogram("onefill_flight_callers"), [5.0, 1.0]);
    assert_eq!(m.counter("onefill_coalesced_total"), 4);
}

// --- tracing -------------------------------------------------------------

/// One span as the capturing layer saw it.
#[derive(Debug, Clone)]
struct SpanRecord {
    name: &'static str,
    /// Index of the parent in the capture.
    parent: Option<usize>,
    fields: HashMap<String, String>,
    /// Indexes of the spans it follows from.
    follows: Vec<usize>,
    closed: bool,
}

/// A layer that keeps every span, its parent, its fields (as recorded up to
/// its close) and its `follows_from` links.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(u64, SpanRecord)>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Capture {
    /// The open span with this id (ids are reused once closed).
    fn index(spans: &[(u64, SpanRecord)], id: &Id) -> Option<usize> {
        spans
            .iter()
            .rposition(|(i, s)| *i == id.into_u64() && !s.closed)
    }
    fn spans(&self) -> Vec<SpanRecord> {
        self.0.lock().iter().map(|(_, s)| s.clone()).collect()
    }
}

thread_local! {
    /// The capture of the test running on this thread (each test runs on a
    /// current-thread runtime, its tasks included).
    static SINK: std::cell::RefCell<Option<Capture>> = const { std::cell::RefCell::new(None) };
}

fn sink() -> Option<Capture> {
    SINK.with(|s| s.borrow().clone())
}

/// The one global subscriber's layer, handing spans to this thread's
/// capture. Global rather than a scoped default per test: a callsite's
/// interest is cached process-wide, and scoped subscribers coming and
/// going on parallel test threads made spans go missing now and then.
struct ToSink;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for ToSink {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(capture) = sink() else { return };
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| p.id());
        let mut spans = capture.0.lock();
        let parent = parent.and_then(|p| Capture::index(&spans, &p));
        spans.push((
            id.into_u64(),
            SpanRecord {
                name: attrs.metadata().name(),
                parent,
                fields,
                follows: Vec::new(),
                closed: false,
            },
        ));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let Some(capture) = sink() else { return };
        let mut spans = capture.0.lock();
        if let Some(i) = Capture::index(&spans, id) {
            values.record(&mut Fields(&mut spans[i].1.fields));
        }
    }
    fn on_follows_from(&self, id: &Id, follows: &Id, _: Context<'_, S>) {
        let Some(capture) = sink() else { return };
        let mut spans = capture.0.lock();
        if let (Some(i), Some(f)) = (Capture::index(&spans, id), Capture::index(&spans, follows)) {
            spans[i].1.follows.push(f);
        }
    }
    fn on_close(&self, id: Id, _: Context<'_, S>) {
        let Some(capture) = sink() else { return };
        let mut spans = capture.0.lock();
        if let Some(i) = Capture::index(&spans, &id) {
            spans[i].1.closed = true;
        }
    }
}

/// Stops capturing on this thread when dropped.
struct Capturing;

impl Drop for Capturing {
    fn drop(&mut self) {
        SINK.with(|s| s.borrow_mut().take());
    }
}

/// Captures the spans made on this thread from now on.
fn capture() -> (Capture, Capturing) {
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(ToSink))
            .expect("no other global subscriber in this test binary");
    });
    let capture = Capture::default();
    SINK.with(|s| *s.borrow_mut() = Some(capture.clone()));
    (capture, Capturing)
}

fn field<'a>(span: &'a SpanRecord, name: &str) -> Option<&'a str> {
    span.fields.get(name).map(String::as_str)
}

fn named<'a>(spans: &'a [SpanRecord], name: &str) -> Vec<(usize, &'a SpanRecord)> {
    spans
        .iter()
        .enumerate()
        .filter(|(_, s)| s.name == name)
        .collect()
}

/// Three callers of one key: three call spans (one leader, two coalesced),
/// the load and every backend call of the flight (run in a task of its
/// own) under the leader's span; all closed once answered.
#[tokio::test(start_paused = true)]
async fn a_call_span_holds_its_load_and_backend_calls() {
    let (capture, _guard) = capture();
    let a = pod(Arc::new(MemoryBackend::new()), Duration::from_secs(5));
    let k = "k".to_owned();
    let (x, y, z) = tokio::join!(
        a.get_or_load(&k, |_| slow("v", 100)),
        a.get_or_load(&k, |_| slow("v", 100)),
        a.get_or_load(&k, |_| slow("v", 100)),
    );
    assert_eq!([x.unwrap(), y.unwrap(), z.unwrap()], ["v", "v", "v"]);
    tokio::time::sleep(Duration::from_millis(10)).await;

    let spans = capture.spans();
    let calls = named(&spans, "onefill.get_or_load");
    assert_eq!(calls.len(), 3, "{spans:#?}");
    let leaders: Vec<_> = calls
        .iter()
        .filter(|(_, s)| field(s, "coalesced") == Some("false"))
        .collect();
    assert_eq!(leaders.len(), 1, "{calls:#?}");
    let leader = leaders[0].0;
    for (i, call) in &calls {
        // A coalesced call's span follows from the leader's.
        let follows: &[usize] = if *i == leader { &[] } else { &[leader] };
        assert_eq!(call.follows, follows, "{call:?}");
        assert_eq!(field(call, "namespace"), Some(NS));
        assert_eq!(field(call, "outcome"), Some("loaded"), "{call:?}");
        assert_eq!(call.parent, None);
        assert!(call.closed);
    }
    let loads = named(&spans, "onefill.load");
    assert_eq!(loads.len(), 1);
    assert_eq!(loads[0].1.parent, Some(leader));
    assert_eq!(field(loads[0].1, "outcome"), Some("ok"));
    assert_eq!(field(loads[0].1, "not_stored"), Some("0"));
    let ops: Vec<_> = named(&spans, "onefill.backend")
        .into_iter()
        .map(|(_, s)| {
            assert_eq!(s.parent, Some(leader), "{s:?}");
            field(s, "op").unwrap().to_owned()
        })
        .collect();
    assert_eq!(ops, ["get", "acquire", "fill"]);
    assert!(spans.iter().all(|s| s.closed), "{spans:#?}");
}

/// A load whose value must not be stored (`Loaded::no_store`): its span
/// says so, the flight releases instead of filling, and the counter moves
/// in `stats()` and in `metrics` alike.
#[tokio::test(start_paused = true)]
async fn a_value_not_stored_shows_on_its_load_span_and_counter() {
    let (capture, _guard) = capture();
    let (a, snapshotter) =
        pod_with_recorder(Arc::new(MemoryBackend::new()), Duration::from_secs(5));
    let k = "k".to_owned();
    let f = a
        .fetch(&k, |_| async {
            Ok::<_, std::io::Error>(onefill::Loaded::new("partial".to_owned()).no_store())
        })
        .await
        .unwrap();
    assert_eq!((f.value.as_str(), f.outcome), ("partial", Outcome::Loaded));
    tokio::time::sleep(Duration::from_millis(10)).await;

    let spans = capture.spans();
    let loads = named(&spans, "onefill.load");
    assert_eq!(loads.len(), 1);
    assert_eq!(field(loads[0].1, "outcome"), Some("ok"));
    assert_eq!(field(loads[0].1, "not_stored"), Some("1"));
    let ops: Vec<_> = named(&spans, "onefill.backend")
        .into_iter()
        .map(|(_, s)| field(s, "op").unwrap().to_owned())
        .collect();
    assert_eq!(ops, ["get", "acquire", "release"]);
    assert_eq!(a.stats().loads_not_stored, 1);
    let m = Series::of(&snapshotter);
    assert_eq!(m.counter("onefill_loads_not_stored_total"), 1);
    assert_eq!(m.labelled("onefill_loads_total", "ok"), 1);
}

/// A process that waits for another's load: its call span says `waited`
/// and holds an `onefill.wait` span, woken once by the fill.
#[tokio::test(start_paused = true)]
async fn a_waiter_span_shows_the_wait() {
    let (capture, _guard) = capture();
    let store: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let a = pod(store.clone(), Duration::from_secs(5));
    let b = pod(store, Duration::from_secs(5));
    let k = "k".to_owned();
    let holder = tokio::spawn({
        let (a, k) = (a.clone(), k.clone());
        async move { a.get_or_load(&k, |_| slow("a", 500)).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waited = b.fetch(&k, |_| slow("b", 1)).await.unwrap();
    assert_eq!(waited.outcome, Outcome::Waited);
    holder.await.unwrap().unwrap();

    let spans = capture.spans();
    let waits = named(&spans, "onefill.wait");
    assert_eq!(waits.len(), 1, "{spans:#?}");
    let (_, wait) = waits[0];
    let call = &spans[wait.parent.expect("under the call")];
    assert_eq!(call.name, "onefill.get_or_load");
    assert_eq!(field(call, "outcome"), Some("waited"));
    assert_eq!(field(wait, "notified"), Some("1"));
    assert_eq!(field(wait, "polls"), Some("0"));
    assert_eq!(field(wait, "timed_out"), Some("false"));
    assert!(wait.closed);
}

/// An L1 hit makes no span at all; a failed load says `error`; a stale
/// answer's background refresh is a root span that follows from the call.
#[tokio::test(start_paused = true)]
async fn l1_hits_make_no_span_and_refreshes_follow_their_call() {
    let (capture, _guard) = capture();
    let a: Cache<String, String> = Cache::builder()
        .namespace(NS)
        .backend(MemoryBackend::new())
        .l1(L1::new(100))
        .ttl(Duration::from_secs(1))
        .grace(Duration::from_secs(60))
        .jitter(0.0)
        .build()
        .unwrap();
    let k = "k".to_owned();
    a.get_or_load(&k, |_| slow("v", 10)).await.unwrap();
    // Its own fill told the L1 of a change: the next read is the backend's.
    a.get_or_load(&k, |_| slow("v", 10)).await.unwrap();
    let before = capture.spans().len();
    let hit = a.fetch(&k, |_| slow("x", 10)).await.unwrap();
    assert_eq!((hit.value.as_str(), hit.outcome), ("v", Outcome::Hit));
    assert_eq!(a.stats().l1_hits, 1, "{:?}", a.stats());
    assert_eq!(capture.spans().len(), before, "no span for an L1 hit");

    let failed = a
        .get_or_load(&"bad".to_owned(), |_| async {
            Err::<String, _>(std::io::Error::other("boom"))
        })
        .await;
    assert!(failed.is_err());
    let spans = capture.spans();
    let (_, bad) = *named(&spans, "onefill.get_or_load").last().unwrap();
    assert_eq!(field(bad, "outcome"), Some("error"));
    assert!(field(bad, "error").unwrap().contains("boom"), "{bad:?}");
    assert_eq!(field(bad, "otel.status_code"), Some("ERROR"));

    // A stale answer from the backend (a cache without an L1).
    let b = Cache::<String, String>::builder()
        .namespace(NS)
        .backend(MemoryBackend::new())
        .no_l1()
        .ttl(Duration::from_secs(1))
        .grace(Duration::from_secs(60))
        .jitter(0.0)
        .build()
        .unwrap();
    b.get_or_load(&k, |_| slow("v", 10)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stale = b.fetch(&k, |_| slow("w", 10)).await.unwrap();
    assert_eq!(stale.outcome, Outcome::Stale);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let spans = capture.spans();
    let refreshes = named(&spans, "onefill.refresh");
    assert_eq!(refreshes.len(), 1, "{spans:#?}");
    let (r, refresh) = refreshes[0];
    assert_eq!(refresh.parent, None, "a root: nobody waits for it");
    assert_eq!(field(refresh, "reason"), Some("stale"));
    assert_eq!(refresh.follows.len(), 1);
    assert_eq!(spans[refresh.follows[0]].name, "onefill.get_or_load");
    assert_eq!(field(&spans[refresh.follows[0]], "outcome"), Some("stale"));
    let loads: Vec<_> = named(&spans, "onefill.load")
        .into_iter()
        .filter(|(_, l)| l.parent == Some(r))
        .collect();
    assert_eq!(loads.len(), 1, "the refresh's load is its child");
}
