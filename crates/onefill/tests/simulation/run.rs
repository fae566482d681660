//! The run: the fleet's caches on one store, the operations and their
//! loaders, to quiescence.

use std::future::Future;
use std::panic;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::task::Poll;
use std::time::Duration;

use onefill::backend::FillKeys;
use onefill::{Cache, CallOptions, CircuitState, Error, Loaded, MemoryBackend};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::time::Instant;

use crate::events::{Answer, CallKind, Change, Ev, Exec, LoadEnd, World};
use crate::injector::Injector;
use crate::liveness::Liveness;
use crate::scenario::{ms, ForeignOp, LoadResult, LoadSpec, Op, OpKind, Scenario, NS, TICK};
use crate::tracking::Tracking;
use crate::variants::Variant;

#[derive(Debug)]
struct SimError(String);

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sim loader error ({})", self.0)
    }
}

impl std::error::Error for SimError {}

const PANIC_MARK: &str = "sim loader panic";

/// Loader panics are part of the scenario: keep them off stderr.
pub(crate) fn quiet_loader_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let text = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !text.starts_with(PANIC_MARK) {
                default(info);
            }
        }));
    });
}

/// Records the end of a load, however it ends (a panic or an abort drops it).
struct LoadGuard {
    world: Arc<World>,
    load: u64,
    end: LoadEnd,
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.world.record(Ev::LoadEnd {
            load: self.load,
            end: self.end,
        });
    }
}

/// The names of the tags in `tags` (a bit per tag `t<n>`).
fn tag_names(tags: u8) -> Vec<String> {
    (0..8)
        .filter(|t| tags & (1 << t) != 0)
        .map(|t| format!("t{t}"))
        .collect()
}

type LoadFuture = std::pin::Pin<Box<dyn Future<Output = Result<Loaded<String>, SimError>> + Send>>;

fn loader(
    world: &Arc<World>,
    inst: usize,
    key: usize,
    spec: LoadSpec,
    tags: u8,
) -> impl FnOnce(String) -> LoadFuture + Send + 'static {
    let world = world.clone();
    move |name: String| {
        Box::pin(async move {
            if world.is_dead(inst) {
                std::future::pending::<()>().await;
            }
            let load = world.next_id.fetch_add(1, Ordering::SeqCst);
            let flight = world.load_spans.current_flight();
            world.record(Ev::LoadStart {
                load,
                inst,
                key,
                flight,
                tags,
            });
            doom(&world, inst);
            let mut guard = LoadGuard {
                world: world.clone(),
                load,
                end: LoadEnd::Gone,
            };
            match spec.took {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending::<()>().await,
            }
            if world.is_dead(inst) {
                std::future::pending::<()>().await;
            }
            let value = format!("{name}/L{load}");
            match spec.result {
                LoadResult::Value => {
                    guard.end = LoadEnd::Value;
                    Ok(Loaded::new(value).tags(tag_names(tags)))
                }
                LoadResult::Error => {
                    guard.end = LoadEnd::Error;
                    Err(SimError(value))
                }
                LoadResult::Panic => panic!("{PANIC_MARK} ({value})"),
            }
        })
    }
}

/// A load of a doomed instance started: it dies a while into it (unless
/// the run's healthy tail began meanwhile).
fn doom(world: &Arc<World>, inst: usize) {
    let mut doomed = world.doomed.lock().unwrap();
    let Some((_, into)) = doomed.filter(|(i, _)| *i == inst) else {
        return;
    };
    *doomed = None;
    let world = world.clone();
    tokio::spawn(async move {
        tokio::time::sleep(into).await;
        if !world.healthy.load(Ordering::SeqCst) {
            world.die(inst);
        }
    });
}

fn key_name(key: usize) -> String {
    format!("k{key}")
}

async fn run_op(world: Arc<World>, cache: Cache<String, String>, op: Op, probe_patience: Duration) {
    let call = world.next_call.fetch_add(1, Ordering::SeqCst);
    let name = key_name(op.key);
    let kind = match op.kind {
        OpKind::Fetch { .. } => CallKind::Fetch,
        OpKind::Get => CallKind::Get,
        OpKind::Set => CallKind::Set,
        OpKind::Invalidate => CallKind::Invalidate,
        OpKind::Expire => CallKind::Expire,
        OpKind::Mark(mark) => CallKind::Mark(mark),
        OpKind::SetOther | OpKind::Foreign(_) => unreachable!("run by `simulate`"),
    };
    let set_id =
        matches!(op.kind, OpKind::Set).then(|| world.next_id.fetch_add(1, Ordering::SeqCst));
    world.record(Ev::CallStart {
        call,
        inst: op.inst,
        key: op.key,
        kind,
        set_id,
        rejected: cache.stats().circuit_rejected,
    });
    let call_future = async {
        match op.kind {
            OpKind::Fetch { load } => {
                let options = match op.past_l1 {
                    Some(ttl) => CallOptions::new().ttl(ttl),
                    None => CallOptions::new(),
                };
                let loader = loader(&world, op.inst, op.key, load, op.tags);
                match cache.with_options(&options).fetch(&name, loader).await {
                    Ok(f) => Answer::Fetched {
                        value: f.value,
                        outcome: f.outcome,
                        coalesced: f.coalesced,
                    },
                    Err(e) => Answer::Failed(e.to_string()),
                }
            }
            OpKind::Get => answer_of(cache.get(&name).await.map(Answer::Got)),
            OpKind::Set => {
                let value = format!("{name}/S{}", set_id.unwrap_or_default());
                let set = if op.tags == 0 {
                    cache.set(&name, value).await
                } else {
                    let tags = tag_names(op.tags);
                    cache.set_tagged(&name, value, &tags).await
                };
                answer_of(set.map(|()| Answer::Done))
            }
            OpKind::Invalidate => answer_of(cache.invalidate(&name).await.map(|()| Answer::Done)),
            OpKind::Expire => answer_of(cache.expire(&name).await.map(|()| Answer::Done)),
            OpKind::Mark(mark) => {
                let marked = match mark.tag {
                    None => cache.clear().await,
                    Some(tag) if mark.hard => cache.invalidate_tag(&format!("t{tag}")).await,
                    Some(tag) => cache.expire_tag(&format!("t{tag}")).await,
                };
                answer_of(marked.map(|()| Answer::Done))
            }
            OpKind::SetOther | OpKind::Foreign(_) => unreachable!("run by `simulate`"),
        }
    };
    let from_l1 = AtomicBool::new(false);
    let call_future = first_poll(&world, &cache, op.inst, call_future, &from_l1);

    // A `get`, `set` or `invalidate` that would be the breaker's half-open
    // probe is dropped if it does not answer within half a backend timeout,
    // and half of them hang (the injector's next call in this process is
    // this one's, made in its first poll): its backend call, under way, is
    // dropped with the probe's permit, which must free the probe slot.
    let probe =
        !matches!(op.kind, OpKind::Fetch { .. }) && cache.circuit_state() == CircuitState::HalfOpen;
    if probe && op.probe_hangs {
        world.hang_next[op.inst].store(true, Ordering::SeqCst);
    }
    let drop_after = op.drop_after.or(probe.then_some(probe_patience));
    world.hang_next[op.inst].store(false, Ordering::SeqCst);
    let answer = match drop_after {
        Some(d) => match tokio::time::timeout(d, call_future).await {
            Ok(answer) => answer,
            Err(_) => {
                world.record(Ev::CallDropped { call });
                return;
            }
        },
        None => call_future.await,
    };
    world.record(Ev::CallEnd {
        call,
        answer,
        rejected: cache.stats().circuit_rejected,
        closed: cache.circuit_state() == CircuitState::Closed,
        l1: from_l1.load(Ordering::SeqCst),
    });
}

/// What tells an L1 answer: counted as an L1 hit (or a stale answer), with
/// no backend call entered and none refused by the breaker.
fn l1_marks(world: &World, cache: &Cache<String, String>, inst: usize) -> (u64, u64, u64) {
    let stats = cache.stats();
    (
        stats.l1_hits + stats.stale_served,
        stats.circuit_rejected,
        world.entered[inst].load(Ordering::SeqCst),
    )
}

/// `call`, noting in `from_l1` whether it was answered from the L1: an L1
/// answers in the call's first poll, without a backend call (on this
/// one-thread runtime nothing else runs during a poll, so the counters
/// moved for this call); anything else answers after a backend call, or
/// after the breaker refused one.
async fn first_poll<T>(
    world: &World,
    cache: &Cache<String, String>,
    inst: usize,
    call: impl Future<Output = T>,
    from_l1: &AtomicBool,
) -> T {
    let mut call = std::pin::pin!(call);
    // Without an L1 nothing to tell (and the stats' snapshots are not free
    // in a debug build).
    let mut first = world.tracking.tracks(inst);
    std::future::poll_fn(|cx| {
        let before = first.then(|| l1_marks(world, cache, inst));
        first = false;
        let polled = call.as_mut().poll(cx);
        if let (Some(before), Poll::Ready(_)) = (before, &polled) {
            let after = l1_marks(world, cache, inst);
            let l1 = after.0 > before.0 && after.1 == before.1 && after.2 == before.2;
            from_l1.store(l1, Ordering::SeqCst);
        }
        polled
    })
    .await
}

/// The foreign writer's op on the shared store.
async fn foreign(
    world: &World,
    s: &Scenario,
    scratch: &mut Option<(Cache<String, String>, MemoryBackend)>,
    key: usize,
    op: ForeignOp,
) {
    let value_key = &world.key_names[key];
    let (version, change) = match op {
        ForeignOp::Set { ttl } => {
            // Valid bytes of the fleet's type, made the supported way: a
            // cache of that type writes the value on a scratch store.
            let version = world.next_id.fetch_add(1, Ordering::SeqCst);
            let name = key_name(key);
            let scratch = scratch.get_or_insert_with(|| {
                let store = MemoryBackend::new();
                (s.foreign_cache(store.clone()), store)
            });
            let written = scratch.0.set(&name, format!("{name}/F{version}")).await;
            let Some((bytes, _)) = written.ok().and_then(|()| scratch.1.get_raw(value_key)) else {
                return;
            };
            world.store.put_raw(value_key, &bytes, ttl);
            (Some(version), Some(Change::Write))
        }
        ForeignOp::Delete => (
            None,
            world.store.delete_raw(value_key).then_some(Change::Delete),
        ),
        ForeignOp::Expire { ttl } => (
            None,
            world
                .store
                .expire_raw(value_key, ttl)
                .then_some(Change::Ttl),
        ),
    };
    world.record(Ev::Foreign { key, op, version });
    if let Some(change) = change {
        world.value_changed(key, change, None);
    }
}

/// Waits until no live instance has failed writes left to replay (polled
/// every 10 ms, from one backend timeout into the healthy tail: a write
/// under way when it began fails, and is queued, by then), then logs it;
/// gives up after `patience` (the checker then reports the queue stuck).
async fn drained(
    world: Arc<World>,
    caches: Vec<Cache<String, String>>,
    writes_end: Duration,
    patience: Duration,
) -> bool {
    let started = Instant::now();
    tokio::time::sleep(writes_end).await;
    loop {
        let pending =
            (caches.iter().enumerate()).any(|(i, c)| !world.is_dead(i) && c.pending_writes() > 0);
        if !pending {
            world.record(Ev::Drained);
            return true;
        }
        if started.elapsed() > patience {
            return false;
        }
        tokio::time::sleep(ms(10)).await;
    }
}

fn answer_of(result: Result<Answer, Error>) -> Answer {
    result.unwrap_or_else(|e| Answer::Failed(e.to_string()))
}

/// Runs one scenario to quiescence and returns its log.
pub(crate) async fn simulate(seed: u64, s: &Scenario, variant: Variant) -> Arc<World> {
    let store = MemoryBackend::new();
    let key_names = (0..=s.keys)
        .map(|k| FillKeys::new(NS, &key_name(k)).value().to_owned())
        .collect();
    let world = Arc::new(World {
        t0: Instant::now(),
        log: Mutex::new(Vec::with_capacity(1024)),
        closed: AtomicBool::new(false),
        healthy: AtomicBool::new(false),
        dead: (0..s.instances).map(|_| AtomicBool::new(false)).collect(),
        hang_next: (0..s.instances).map(|_| AtomicBool::new(false)).collect(),
        saw_unreadable: Mutex::default(),
        fresh_answered: Mutex::default(),
        next_id: AtomicU64::new(1),
        next_call: AtomicUsize::new(0),
        variant,
        key_names,
        final_stats: Mutex::new(vec![None; s.instances]),
        load_spans: Arc::default(),
        store: store.clone(),
        written_expiry: Mutex::new(vec![None; s.keys + 1]),
        entered: (0..s.instances).map(|_| AtomicU64::new(0)).collect(),
        late_reply: (0..s.instances).map(|_| Mutex::new(None)).collect(),
        reply_floor: (0..s.instances)
            .map(|_| Mutex::new(Instant::now()))
            .collect(),
        unreachable: (0..s.instances).map(|_| AtomicBool::new(false)).collect(),
        tracking: Tracking::new(&s.process_of, seed),
        settling: AtomicBool::new(false),
        liveness: Liveness::new(s.liveness, s.instances, seed),
        doomed: Mutex::new(None),
        stamped: Mutex::default(),
    });
    let _spans = world.load_spans.install();
    let caches: Vec<Cache<String, String>> = (0..s.instances)
        .map(|i| {
            let stream = seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let (fault_rate, notify_rate) = s.fault_rates[i];
            let injector = Injector::new(
                i,
                store.clone(),
                world.clone(),
                StdRng::seed_from_u64(stream),
                (fault_rate, notify_rate),
                s.backend_timeout * 2,
            );
            s.cache(injector, variant)
        })
        .collect();
    let other = s.other_cache(store.clone());
    let mut scratch = None;
    for &(inst, from, lasts, noticed) in &s.tracking_losses {
        let world = world.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(world.t0 + from).await;
            world.record(Ev::TrackingLost { inst, noticed });
            world.tracking.lose(inst, noticed);
            // A loss the backend notices at once is the store's outage for
            // this instance: its calls fail too (the L1 stops serving, the
            // outage fallback answers).
            world.unreachable[inst].store(noticed, Ordering::SeqCst);
            tokio::time::sleep(lasts).await;
            world.unreachable[inst].store(false, Ordering::SeqCst);
            world.tracking.restore(inst);
            world.record(Ev::TrackingBack { inst });
        });
    }
    let t0 = world.t0;
    let mut death = s.death;
    for op in &s.ops {
        tokio::time::sleep_until(t0 + op.at).await;
        if let Some((inst, _)) = death.filter(|(_, at)| *at <= op.at) {
            match s.dies_in_load {
                Some(into) => *world.doomed.lock().unwrap() = Some((inst, into)),
                None => world.die(inst),
            }
            death = None;
        }
        if let OpKind::SetOther = op.kind {
            // On the store at once (the memory backend answers in the
            // call's first poll), logged as a write of no origin.
            let name = key_name(op.key);
            let value = vec![op.at.as_millis() as u64];
            if other.set(&name, value).await.is_ok() {
                world.record(Ev::Exec {
                    inst: op.inst,
                    key: op.key,
                    exec: Exec::Set { origin: None },
                });
                world.value_changed(op.key, Change::Write, None);
            }
            continue;
        }
        if let OpKind::Foreign(foreign_op) = op.kind {
            foreign(&world, s, &mut scratch, op.key, foreign_op).await;
            continue;
        }
        // A caller that peeks with a `get` before its `fetch` while the
        // breaker is half-open: that `get` probes (see `run_op`).
        let half_open = caches[op.inst].circuit_state() == CircuitState::HalfOpen;
        if matches!(op.kind, OpKind::Fetch { .. }) && op.probe_hangs && half_open {
            let peek = Op {
                kind: OpKind::Get,
                drop_after: None,
                ..op.clone()
            };
            tokio::spawn(run_op(
                world.clone(),
                caches[op.inst].clone(),
                peek,
                s.backend_timeout / 2,
            ));
        }
        tokio::spawn(run_op(
            world.clone(),
            caches[op.inst].clone(),
            op.clone(),
            s.backend_timeout / 2,
        ));
    }
    // The healthy tail: no new faults; once the breaker's window has
    // passed, one call per live instance must reach the backend.
    world.healthy.store(true, Ordering::SeqCst);
    world.record(Ev::Healthy);
    let drained = tokio::spawn(drained(
        world.clone(),
        caches.clone(),
        s.backend_timeout + TICK,
        s.drain_patience(),
    ));
    tokio::time::sleep(s.breaker_window()).await;
    for (i, cache) in caches.iter().enumerate() {
        if !world.is_dead(i) {
            let probe = Op {
                at: Duration::ZERO,
                inst: i,
                key: s.keys,
                kind: OpKind::Get,
                drop_after: None,
                probe_hangs: false,
                past_l1: None,
                tags: 0,
            };
            run_op(world.clone(), cache.clone(), probe, s.backend_timeout * 4).await;
        }
    }
    // Once every queue of failed writes is replayed and every L1 has had
    // the time to hear of it (a report, or its sync bound with tracking
    // lost, which lasts at most 500 ms into the tail), every live instance
    // reads every key: invariant 9.
    if drained.await.unwrap_or(false) {
        tokio::time::sleep(s.sync_bound + ms(500) + TICK).await;
        world.record(Ev::FinalReads);
        for (i, cache) in caches.iter().enumerate() {
            for key in (0..s.keys).filter(|_| !world.is_dead(i)) {
                let read = Op {
                    at: Duration::ZERO,
                    inst: i,
                    key,
                    kind: OpKind::Get,
                    drop_after: None,
                    probe_hangs: false,
                    past_l1: None,
                    tags: 0,
                };
                run_op(world.clone(), cache.clone(), read, s.backend_timeout * 4).await;
            }
        }
    }
    // Quiescence: every flight, load, refresh, deferred fill and lease is
    // over long before this.
    let settle = (s.fetch_bound() + s.longest_lease + s.ttl + s.grace + s.fail_safe_throttle) * 3;
    world.settling.store(true, Ordering::SeqCst);
    tokio::time::sleep(settle).await;
    let stats = caches.iter().map(|c| Some(c.stats())).collect();
    *world.final_stats.lock().unwrap() = stats;
    world.closed.store(true, Ordering::SeqCst);
    world
}
