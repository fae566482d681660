//! The fault injector: one instance's way to the shared store, in three
//! layers. Outside, [`Injector`] logs each call as the cache sees it (its
//! entry, its answer, or that it was dropped before one), makes its
//! subscriptions' notifications late, lost or doubled (`subscription.rs`),
//! registers its L1 on a tracking connection and tells its process's L1s
//! of its writes (`tracking.rs`). In the middle, the fault-injecting
//! wrapper every test uses ([`FaultyBackend`]), whose faults this
//! instance's seeded stream decides. Inside, [`Store`] (`store.rs`) runs
//! each command on the shared store and logs what it did there.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use onefill::backend::{
    Acquired, Backend, FillKeys, FillSubscription, Mark, MarkKind, Stored, Watch,
};
use onefill::testing::{self, FaultyBackend, Op};
use onefill::{BackendError, BackendErrorKind, LeaseToken, MemoryBackend};
use rand::rngs::StdRng;
use rand::RngExt;
use tokio::time::Instant;

use crate::events::{BOp, Ev, Fault, Reply, World, MARKS_KEY};
use crate::scenario::ms;
use crate::store::{acquired_reply, Store};
use crate::subscription::Subscription;
use crate::variants::Variant;

/// A fault-injecting [`Backend`] for one instance, on the shared store.
#[derive(Clone)]
pub(crate) struct Injector {
    pub(crate) inst: usize,
    pub(crate) world: Arc<World>,
    pub(crate) rng: Arc<Mutex<StdRng>>,
    pub(crate) notify_rate: f64,
    fault_rate: f64,
    max_delay: Duration,
    faulty: FaultyBackend<Store>,
}

impl std::fmt::Debug for Injector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Injector({})", self.inst)
    }
}

/// Records an injector call dropped before it answered.
struct Abandon<'a> {
    injector: &'a Injector,
    op: BOp,
    key: usize,
    token: Option<String>,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.injector.world.record(Ev::Abandoned {
                inst: self.injector.inst,
                op: self.op,
                key: self.key,
                token: self.token.take(),
                task: tokio::task::try_id(),
            });
        }
    }
}

/// How a drawn fault is played by the wrapper.
fn played(fault: Fault) -> Option<testing::Fault> {
    match fault {
        Fault::Pass => None,
        Fault::Delay(wait) => Some(testing::Fault::Delay(wait)),
        Fault::Hang => Some(testing::Fault::Hang),
        Fault::Fail(kind) => Some(testing::Fault::Fail(kind)),
        Fault::RunThenFail => Some(testing::Fault::LoseReply),
        Fault::RunThenHang => Some(testing::Fault::RunThenHang),
        // Played by `Injector::call`, after the command ran.
        Fault::LateReply(_) => None,
    }
}

/// The log's name of a kind of call.
fn bop(op: Op) -> BOp {
    match op {
        Op::Get | Op::GetMany => BOp::Get,
        Op::Acquire | Op::AcquireMany => BOp::Acquire,
        Op::Fill => BOp::Fill,
        Op::Release => BOp::Release,
        Op::Extend => BOp::Extend,
        Op::Set => BOp::Set,
        Op::Invalidate => BOp::Invalidate,
        Op::Expire => BOp::Expire,
        Op::Subscribe => BOp::Subscribe,
        Op::Mark => BOp::Mark,
        Op::ReadMarks => BOp::ReadMarks,
    }
}

impl Injector {
    /// Instance `inst`'s backend on `store`: a call meets a fault with
    /// probability `fault_rate` (a delay up to `max_delay`, a hang, an
    /// error of each transport kind, or a command that runs and loses its
    /// reply), a notification with `notify_rate`; both drawn from `rng`.
    pub(crate) fn new(
        inst: usize,
        store: MemoryBackend,
        world: Arc<World>,
        rng: StdRng,
        (fault_rate, notify_rate): (f64, f64),
        max_delay: Duration,
    ) -> Self {
        let rng = Arc::new(Mutex::new(rng));
        let faulty = FaultyBackend::new(Store {
            inst,
            inner: store,
            world: world.clone(),
        });
        let (drawn, log) = (rng.clone(), world.clone());
        faulty.faults().decide_with(move |op, _keys| {
            // `take_over` meets the faults of `acquire` (logged as one).
            played(draw(&log, inst, &drawn, (fault_rate, max_delay), bop(op)))
        });
        Injector {
            inst,
            world,
            rng,
            notify_rate,
            fault_rate,
            max_delay,
            faulty,
        }
    }

    /// This instance's write of `keys` was answered `Ok`: the L1s of its
    /// process hear of it before it returns.
    fn own_write(&self, keys: &FillKeys) {
        self.own_change(keys.value());
    }

    /// This instance's write of `key` (a value's, or a mark's) was answered
    /// `Ok`: the L1s of its process hear of it before it returns.
    fn own_change(&self, key: &str) {
        let only_own = self.world.variant == Variant::PerBackendListeners;
        self.world.tracking.own_write(self.inst, key, only_own);
    }

    /// Runs one backend call through the faults, logging its entry and how
    /// it was answered (or that it was dropped before an answer).
    async fn call<T>(
        &self,
        op: BOp,
        key: usize,
        token: Option<&LeaseToken>,
        run: impl Future<Output = Result<T, BackendError>>,
        reply: impl Fn(&T) -> Reply,
    ) -> Result<T, BackendError> {
        frozen_if_dead(&self.world, self.inst).await;
        self.world.entered[self.inst].fetch_add(1, Ordering::SeqCst);
        let entered = Instant::now();
        let token = token.map(|t| t.as_str().to_owned());
        self.world.record(Ev::Entry {
            inst: self.inst,
            op,
            key,
            token: token.clone(),
        });
        let mut abandon = Abandon {
            injector: self,
            op,
            key,
            token: token.clone(),
            armed: true,
        };
        self.world.late_reply[self.inst].lock().unwrap().take();
        let result = run.await;
        // A late reply was drawn for this call by the wrapper's decision,
        // made in the poll that ran the command and returned here (nothing
        // else ran in between): its answer now waits, the command done.
        // Replies keep their commands' order, as on one connection: none
        // overtakes a late one (else a `set` answered after a later `set`
        // would look like the newer write).
        let late = self.world.late_reply[self.inst].lock().unwrap().take();
        let arrives = {
            let mut floor = self.world.reply_floor[self.inst].lock().unwrap();
            *floor = (*floor).max(Instant::now() + late.unwrap_or_default());
            *floor
        };
        if arrives > Instant::now() {
            tokio::time::sleep_until(arrives).await;
        }
        abandon.armed = false;
        let answered = match &result {
            Ok(value) => reply(value),
            Err(_) => Reply::Err,
        };
        self.world.record(Ev::Delivered {
            inst: self.inst,
            op,
            key,
            token,
            reply: answered,
            took: entered.elapsed(),
            task: tokio::task::try_id(),
        });
        result
    }
}

/// The fault of one call of kind `op`, drawn and logged (a late reply is
/// left for `Injector::call` to play).
fn draw(
    world: &World,
    inst: usize,
    rng: &Mutex<StdRng>,
    (fault_rate, max_delay): (f64, Duration),
    op: BOp,
) -> Fault {
    let fault = decide(world, inst, rng, fault_rate, max_delay);
    if fault != Fault::Pass {
        world.record(Ev::Fault { inst, op, fault });
    }
    if let Fault::LateReply(late) = fault {
        *world.late_reply[inst].lock().unwrap() = Some(late);
    }
    fault
}

/// Plays a drawn fault on a call the wrapper passes without faults
/// (`watch_holder`), as the wrapper plays it on the others.
async fn play<T>(
    fault: Fault,
    call: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    let lost = || BackendError::new(BackendErrorKind::Timeout, "reply lost (injected)");
    match fault {
        Fault::Pass | Fault::LateReply(_) => call.await,
        Fault::Delay(wait) => {
            tokio::time::sleep(wait).await;
            call.await
        }
        Fault::Hang => std::future::pending().await,
        Fault::Fail(kind) => Err(BackendError::new(kind, format!("{kind} (injected)"))),
        Fault::RunThenFail => {
            let _ = call.await;
            Err(lost())
        }
        Fault::RunThenHang => {
            let _ = call.await;
            std::future::pending().await
        }
    }
}

/// The fault of one call, drawn from the instance's stream (none once the
/// run's healthy tail began; a hang if the scenario asked for one next).
fn decide(
    world: &World,
    inst: usize,
    rng: &Mutex<StdRng>,
    fault_rate: f64,
    max_delay: Duration,
) -> Fault {
    if world.healthy.load(Ordering::SeqCst) {
        return Fault::Pass;
    }
    if world.hang_next[inst].swap(false, Ordering::SeqCst) {
        return Fault::Hang;
    }
    if world.unreachable[inst].load(Ordering::SeqCst) {
        return Fault::Fail(BackendErrorKind::Connection);
    }
    let mut rng = rng.lock().unwrap();
    if !rng.random_bool(fault_rate) {
        return Fault::Pass;
    }
    let max = max_delay.as_millis() as u64;
    match rng.random_range(0..10) {
        0 | 1 => Fault::Delay(ms(rng.random_range(1..=max))),
        9 => Fault::LateReply(ms(rng.random_range(1..=max))),
        2 => Fault::Hang,
        3 => Fault::Fail(BackendErrorKind::Timeout),
        4 => Fault::Fail(BackendErrorKind::Connection),
        5 => Fault::Fail(BackendErrorKind::Busy),
        6 => Fault::Fail(BackendErrorKind::Command),
        7 => Fault::RunThenFail,
        _ => Fault::RunThenHang,
    }
}

/// A dead instance's calls (and notifications) pend forever.
pub(crate) async fn frozen_if_dead(world: &World, inst: usize) {
    if world.is_dead(inst) {
        std::future::pending::<()>().await;
    }
}

fn watch_reply(watch: &Watch) -> Reply {
    match watch {
        Watch::Alive(_) => Reply::Alive,
        Watch::Gone(gone) => Reply::Judged(*gone),
        Watch::Moved => Reply::Moved,
        _ => Reply::Unsupported,
    }
}

fn unit_reply<T>(_: &T) -> Reply {
    Reply::Done
}

fn bool_reply(ok: &bool) -> Reply {
    if *ok {
        Reply::True
    } else {
        Reply::False
    }
}

#[async_trait]
impl Backend for Injector {
    fn track_changes(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: std::sync::Weak<dyn onefill::backend::ChangeListener>,
    ) -> Result<(), BackendError> {
        // Not passed down: the memory backend's own reports would reach
        // every L1 at once (see `tracking.rs`). Only a cache with an L1
        // registers, on the fleet's namespace (covering the value keys and
        // the marks': reads then report the server's TTL); one without an
        // L1 registers nothing (it rechecks its marks).
        let values = self.world.key_names.iter().any(|k| k.starts_with(prefix));
        self.world
            .tracking
            .register(&self.world, self.inst, listener, confirm_every, values);
        Ok(())
    }

    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        let key = self.world.key_of(keys);
        self.call(BOp::Get, key, None, self.faulty.get(keys), unit_reply)
            .await
    }

    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let key = self.world.key_of(keys);
        let acquired = self.faulty.acquire(keys, token, lease_ttl, refresh_window);
        self.call(BOp::Acquire, key, Some(token), acquired, acquired_reply)
            .await
    }

    fn new_token(&self, keys: &FillKeys) -> LeaseToken {
        self.faulty.new_token(keys)
    }

    /// Through the faults drawn as for any call (the wrapper passes it
    /// without faults).
    async fn watch_holder(
        &self,
        keys: &FillKeys,
        holder: &LeaseToken,
    ) -> Result<Watch, BackendError> {
        let key = self.world.key_of(keys);
        let watched = async {
            let drawn = (self.fault_rate, self.max_delay);
            let fault = draw(&self.world, self.inst, &self.rng, drawn, BOp::Watch);
            play(fault, self.faulty.watch_holder(keys, holder)).await
        };
        self.call(BOp::Watch, key, Some(holder), watched, watch_reply)
            .await
    }

    async fn take_over(
        &self,
        keys: &FillKeys,
        gone: &LeaseToken,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let key = self.world.key_of(keys);
        let taken = self
            .faulty
            .take_over(keys, gone, token, lease_ttl, refresh_window);
        self.call(BOp::TakeOver, key, Some(token), taken, acquired_reply)
            .await
    }

    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let key = self.world.key_of(keys);
        let filled = self.faulty.fill(keys, token, bytes, ttl);
        let filled = self
            .call(BOp::Fill, key, Some(token), filled, bool_reply)
            .await;
        if let Ok(true) = filled {
            self.own_write(keys);
        }
        filled
    }

    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        let key = self.world.key_of(keys);
        let released = self.faulty.release(keys, token, entry);
        let released = self
            .call(BOp::Release, key, Some(token), released, bool_reply)
            .await;
        if let (Ok(true), Some(_)) = (&released, entry) {
            self.own_write(keys);
        }
        released
    }

    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        let key = self.world.key_of(keys);
        let extended = self.faulty.extend(keys, token, lease_ttl);
        self.call(BOp::Extend, key, Some(token), extended, bool_reply)
            .await
    }

    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        let key = self.world.key_of(keys);
        let set = self.faulty.set(keys, bytes, ttl);
        self.call(BOp::Set, key, None, set, unit_reply).await?;
        self.own_write(keys);
        Ok(())
    }

    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let key = self.world.key_of(keys);
        let invalidated = self.faulty.invalidate(keys);
        self.call(BOp::Invalidate, key, None, invalidated, unit_reply)
            .await?;
        self.own_write(keys);
        Ok(())
    }

    async fn expire(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let key = self.world.key_of(keys);
        let expired = self.faulty.expire(keys);
        self.call(BOp::Expire, key, None, expired, unit_reply)
            .await?;
        self.own_write(keys);
        Ok(())
    }

    /// Through the faults as any call; answered `Ok`, the mark's keys'
    /// changes reach the L1s of the process before it returns (the Redis
    /// backend's one registry of own-process listeners).
    async fn mark(
        &self,
        gen_key: &str,
        mark_key: &str,
        kind: MarkKind,
        retention: Option<Duration>,
    ) -> Result<u64, BackendError> {
        let marked = self.faulty.mark(gen_key, mark_key, kind, retention);
        let generation = self
            .call(BOp::Mark, MARKS_KEY, None, marked, unit_reply)
            .await?;
        self.own_change(mark_key);
        self.own_change(gen_key);
        Ok(generation)
    }

    async fn read_marks(
        &self,
        gen_key: &str,
        mark_keys: &[&str],
    ) -> Result<(u64, Vec<Mark>), BackendError> {
        let read = self.faulty.read_marks(gen_key, mark_keys);
        let reply = |read: &(u64, Vec<Mark>)| Reply::Generation(read.0);
        self.call(BOp::ReadMarks, MARKS_KEY, None, read, reply)
            .await
    }

    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        let key = self.world.key_of(keys);
        let subscribed = self.faulty.subscribe(keys);
        let inner = self
            .call(BOp::Subscribe, key, None, subscribed, unit_reply)
            .await?;
        Ok(Box::new(Subscription::new(inner, self.clone())))
    }
}
