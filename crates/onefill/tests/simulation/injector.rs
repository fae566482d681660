//! The fault injector: one instance's way to the shared store, in three
//! layers. Outside, [`Injector`] logs each call as the cache sees it (its
//! entry, its answer, or that it was dropped before one) and makes its
//! subscriptions' notifications late, lost or doubled. In the middle, the
//! fault-injecting wrapper every test uses ([`FaultyBackend`]), whose
//! faults this instance's seeded stream decides. Inside, [`Store`] runs
//! each command on the shared store and logs what it did there (and
//! breaks the protocol as a broken variant asks).
//! (A little over 600 lines: the three layers belong together, since the
//! log the checker reads is made by the outer and the inner one.)

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use onefill::backend::{Acquired, Backend, FillKeys, FillSubscription, Stored};
use onefill::testing::{self, FaultyBackend, Op};
use onefill::{BackendError, BackendErrorKind, LeaseToken, MemoryBackend};
use rand::rngs::StdRng;
use rand::RngExt;
use tokio::time::Instant;

use crate::events::{
    grace_of, origin_of_envelope, BOp, Ev, Exec, Fault, NotifyFault, Reply, World,
};
use crate::scenario::ms;
use crate::variants::Variant;

/// A fault-injecting [`Backend`] for one instance, on the shared store.
#[derive(Clone)]
pub(crate) struct Injector {
    inst: usize,
    world: Arc<World>,
    rng: Arc<Mutex<StdRng>>,
    notify_rate: f64,
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
        Op::Subscribe => BOp::Subscribe,
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
            let fault = decide(&log, inst, &drawn, fault_rate, max_delay);
            if fault != Fault::Pass {
                let op = bop(op);
                log.record(Ev::Fault { inst, op, fault });
            }
            played(fault)
        });
        Injector {
            inst,
            world,
            rng,
            notify_rate,
            faulty,
        }
    }

    fn decide_notify(&self) -> Option<NotifyFault> {
        if self.world.healthy.load(Ordering::SeqCst) {
            return None;
        }
        let mut rng = self.rng.lock().unwrap();
        if !rng.random_bool(self.notify_rate) {
            return None;
        }
        Some(match rng.random_range(0..3) {
            0 => NotifyFault::Drop,
            1 => NotifyFault::Delay(ms(rng.random_range(1..=300))),
            _ => NotifyFault::Duplicate,
        })
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
        let result = run.await;
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
    let mut rng = rng.lock().unwrap();
    if !rng.random_bool(fault_rate) {
        return Fault::Pass;
    }
    let max = max_delay.as_millis() as u64;
    match rng.random_range(0..9) {
        0 | 1 => Fault::Delay(ms(rng.random_range(1..=max))),
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
async fn frozen_if_dead(world: &World, inst: usize) {
    if world.is_dead(inst) {
        std::future::pending::<()>().await;
    }
}

/// The shared store as one instance's commands reach it, past the faults:
/// each command runs (unless the instance died meanwhile, as during a
/// delay) and is logged with what it did.
#[derive(Clone)]
pub(crate) struct Store {
    inst: usize,
    inner: MemoryBackend,
    world: Arc<World>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.inst)
    }
}

impl Store {
    /// Runs a step on the store and logs what it did, if it answered.
    async fn logged<T>(
        &self,
        key: usize,
        step: impl Future<Output = Result<T, BackendError>>,
        what: impl FnOnce(&T) -> Exec,
    ) -> Result<T, BackendError> {
        frozen_if_dead(&self.world, self.inst).await;
        let result = step.await;
        if let Ok(value) = &result {
            self.world.record(Ev::Exec {
                inst: self.inst,
                key,
                exec: what(value),
            });
        }
        result
    }

    /// A step fenced on the token (fill, release), logged. If `unfenced()`
    /// says so when it runs (a broken variant), the token is first made to
    /// hold the lease, whatever held it.
    async fn fenced(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        unfenced: impl Fn() -> bool,
        step: impl Future<Output = Result<bool, BackendError>>,
        what: impl FnOnce(bool) -> Exec,
    ) -> Result<bool, BackendError> {
        let key = self.world.key_of(keys);
        frozen_if_dead(&self.world, self.inst).await;
        if unfenced() {
            self.inner
                .put_raw(keys.lock(), token.as_bytes(), Duration::from_secs(60));
        }
        self.logged(key, step, |&ok| what(ok)).await
    }

    /// Whether the stored value is fresh beyond `window` (the test of the
    /// backends' `acquire`).
    fn fresh_beyond(&self, keys: &FillKeys, window: Duration) -> bool {
        self.inner
            .get_raw(keys.value())
            .is_some_and(|(bytes, ttl)| {
                grace_of(&bytes).is_some_and(|grace| ttl > grace.saturating_add(window))
            })
    }

    /// Whether the stored value is fresh and one of the fleet's own (a
    /// value or failure with an origin, not another type's).
    fn fresh_and_readable(&self, keys: &FillKeys) -> bool {
        self.inner
            .get_raw(keys.value())
            .is_some_and(|(bytes, ttl)| {
                origin_of_envelope(&bytes).is_some()
                    && grace_of(&bytes).is_some_and(|grace| ttl > grace)
            })
    }

    /// `acquire` without the re-check (the `NoRecheck` variant): a fresh
    /// value does not stop `SET NX`.
    async fn acquire_without_recheck(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<Acquired, BackendError> {
        let stale = self.inner.get(keys).await?;
        Ok(match self.inner.get_raw(keys.lock()) {
            Some((_, ttl)) => Acquired::Held {
                stale,
                lease_ttl: ttl,
            },
            None => {
                self.inner.put_raw(keys.lock(), token.as_bytes(), lease_ttl);
                Acquired::Won { stale }
            }
        })
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
impl Backend for Store {
    /// The store's own reports: they happen on the server, not on the wire
    /// (the Redis backend's tracking connection is tested on real Redis).
    fn track_changes(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: std::sync::Weak<dyn onefill::backend::ChangeListener>,
    ) -> Result<(), BackendError> {
        self.inner.track_changes(prefix, confirm_every, listener)
    }

    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        frozen_if_dead(&self.world, self.inst).await;
        self.inner.get(keys).await
    }

    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let key = self.world.key_of(keys);
        let run = async {
            // An unbounded window asks for the lease regardless of an
            // unreadable value (another type or version), in a flight's
            // first `acquire` (its `get` found one; a fill may land in
            // between) or after an `acquire` that found one. A flight that
            // asks so again after losing the lease to a holder would win
            // it from under that holder's fresh fill:
            // a duplicate of a fresh value.
            let task = tokio::task::try_id();
            let again = task.is_some_and(|task| {
                self.world.saw_unreadable.lock().unwrap().get(&task) == Some(&false)
            });
            let fresh_before = if refresh_window == Duration::MAX {
                again && self.fresh_and_readable(keys)
            } else {
                self.fresh_beyond(keys, refresh_window)
            };
            let acquired = async {
                if self.world.variant == Variant::NoRecheck && fresh_before {
                    self.acquire_without_recheck(keys, token, lease_ttl).await
                } else {
                    self.inner
                        .acquire(keys, token, lease_ttl, refresh_window)
                        .await
                }
            };
            let acquired = async {
                let acquired = acquired.await;
                if let (Some(task), Ok(a)) = (task, &acquired) {
                    let unreadable = matches!(a, Acquired::Fresh(stored) if origin_of_envelope(&stored.bytes).is_none());
                    self.world
                        .saw_unreadable
                        .lock()
                        .unwrap()
                        .insert(task, unreadable);
                }
                acquired
            };
            self.logged(key, acquired, |a| Exec::Acquire {
                token: token.as_str().to_owned(),
                ttl: lease_ttl,
                window: refresh_window,
                fresh_before,
                reply: acquired_reply(a),
            })
            .await
        };
        run.await
    }

    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        // The UnfencedFill variant: whatever held the lease.
        let unfenced = || self.world.variant == Variant::UnfencedFill;
        let filled = self.inner.fill(keys, token, bytes, ttl);
        self.fenced(keys, token, unfenced, filled, |ok| Exec::Fill {
            token: token.as_str().to_owned(),
            ok,
            origin: origin_of_envelope(bytes),
        })
        .await
    }

    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        // The BareDelRelease variant: DEL whatever holds the lease.
        let unfenced = || {
            self.world.variant == Variant::BareDelRelease
                && self.inner.get_raw(keys.lock()).is_some()
        };
        let released = self.inner.release(keys, token, entry);
        self.fenced(keys, token, unfenced, released, |ok| Exec::Release {
            token: token.as_str().to_owned(),
            ok,
            entry: entry.and_then(|(bytes, _)| origin_of_envelope(bytes)),
        })
        .await
    }

    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        let key = self.world.key_of(keys);
        let extended = self.inner.extend(keys, token, lease_ttl);
        self.logged(key, extended, |&ok| Exec::Extend {
            token: token.as_str().to_owned(),
            ttl: lease_ttl,
            ok,
        })
        .await
    }

    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        let key = self.world.key_of(keys);
        self.logged(key, self.inner.set(keys, bytes, ttl), |()| Exec::Set {
            origin: origin_of_envelope(bytes),
        })
        .await
    }

    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let key = self.world.key_of(keys);
        self.logged(key, self.inner.invalidate(keys), |()| Exec::Invalidate)
            .await
    }

    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        frozen_if_dead(&self.world, self.inst).await;
        self.inner.subscribe(keys).await
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
        self.faulty.track_changes(prefix, confirm_every, listener)
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

    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let key = self.world.key_of(keys);
        let filled = self.faulty.fill(keys, token, bytes, ttl);
        self.call(BOp::Fill, key, Some(token), filled, bool_reply)
            .await
    }

    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        let key = self.world.key_of(keys);
        let released = self.faulty.release(keys, token, entry);
        self.call(BOp::Release, key, Some(token), released, bool_reply)
            .await
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
        self.call(BOp::Set, key, None, set, unit_reply).await
    }

    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let key = self.world.key_of(keys);
        let invalidated = self.faulty.invalidate(keys);
        self.call(BOp::Invalidate, key, None, invalidated, unit_reply)
            .await
    }

    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        let key = self.world.key_of(keys);
        let subscribed = self.faulty.subscribe(keys);
        let inner = self
            .call(BOp::Subscribe, key, None, subscribed, unit_reply)
            .await?;
        Ok(Box::new(Subscription {
            inner,
            injector: self.clone(),
            duplicate: false,
            delayed_until: None,
        }))
    }
}

fn acquired_reply(a: &Acquired) -> Reply {
    match a {
        Acquired::Won { .. } => Reply::Won,
        Acquired::Held { .. } => Reply::Held,
        Acquired::Fresh(_) => Reply::Fresh,
    }
}

/// A fill subscription whose notifications are dropped, delayed or
/// duplicated. A delayed one survives its caller's `select!` dropping the
/// future: the next call finishes the delay.
struct Subscription {
    inner: Box<dyn FillSubscription>,
    injector: Injector,
    duplicate: bool,
    delayed_until: Option<Instant>,
}

#[async_trait]
impl FillSubscription for Subscription {
    async fn notified(&mut self) {
        loop {
            frozen_if_dead(&self.injector.world, self.injector.inst).await;
            if let Some(until) = self.delayed_until {
                tokio::time::sleep_until(until).await;
                self.delayed_until = None;
                return;
            }
            if std::mem::take(&mut self.duplicate) {
                return;
            }
            self.inner.notified().await;
            let Some(fault) = self.injector.decide_notify() else {
                return;
            };
            self.injector.world.record(Ev::NotifyFault {
                inst: self.injector.inst,
                fault,
            });
            match fault {
                NotifyFault::Drop => {}
                NotifyFault::Delay(d) => self.delayed_until = Some(Instant::now() + d),
                NotifyFault::Duplicate => {
                    self.duplicate = true;
                    return;
                }
            }
        }
    }
}
