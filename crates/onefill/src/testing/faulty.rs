//! A fault-injecting wrapper around any [`Backend`]: the one tests use to
//! play a server that hangs, refuses, fails a command, loses a reply or
//! answers late, instead of each test writing a wrapper of its own. (Just
//! over 600 lines: it wraps every `Backend` method, each through its
//! faults, and splitting the wrapper would split one `impl`.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use crate::backend::{
    Acquired, Backend, ChangeListener, FillKeys, FillSubscription, LeaseRequest, Mark, MarkKind,
    Stored, Watch,
};
use crate::{BackendError, BackendErrorKind, LeaseToken};

/// A kind of backend call, as faults are set per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// [`Backend::get`].
    Get,
    /// [`Backend::get_many`].
    GetMany,
    /// [`Backend::acquire`].
    Acquire,
    /// [`Backend::acquire_many`].
    AcquireMany,
    /// [`Backend::fill`].
    Fill,
    /// [`Backend::release`].
    Release,
    /// [`Backend::extend`].
    Extend,
    /// [`Backend::set`].
    Set,
    /// [`Backend::invalidate`].
    Invalidate,
    /// [`Backend::expire`].
    Expire,
    /// [`Backend::subscribe`].
    Subscribe,
    /// [`Backend::mark`].
    Mark,
    /// [`Backend::read_marks`].
    ReadMarks,
}

impl Op {
    /// Every kind of call.
    pub const ALL: [Op; 13] = [
        Op::Get,
        Op::GetMany,
        Op::Acquire,
        Op::AcquireMany,
        Op::Fill,
        Op::Release,
        Op::Extend,
        Op::Set,
        Op::Invalidate,
        Op::Expire,
        Op::Subscribe,
        Op::Mark,
        Op::ReadMarks,
    ];
    /// The unconditional writes: `set`, `invalidate` and `expire`.
    pub const WRITES: [Op; 3] = [Op::Set, Op::Invalidate, Op::Expire];
}

/// What happens to a call that a fault applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Nothing runs and the call never answers (a SIGSTOPped server): the
    /// cache's own timeout must end it.
    Hang,
    /// Nothing runs; a `Connection` error at once (a dead server).
    Refuse,
    /// Nothing runs; a `Command` error at once (as OOM, NOAUTH, CROSSSLOT).
    CommandError,
    /// The command runs on the store, then its reply is lost: a `Timeout`
    /// error.
    LoseReply,
    /// The command runs on the store, then its reply never comes.
    RunThenHang,
    /// The request is lost: nothing runs, and the call answers a `Timeout`
    /// error after this long.
    LoseRequest(Duration),
    /// The command runs on the store, then its answer waits at the gate
    /// until [`Faults::open_gate`] lets it through: a read that saw the
    /// store as it was while a write goes on.
    Gated,
    /// The call panics.
    Panic,
    /// For `subscribe`: the subscription is made but never fires (every
    /// notification lost). Other calls pass.
    Deaf,
    /// Nothing runs; an error of this kind at once.
    Fail(BackendErrorKind),
    /// The call waits this long, then runs and answers as usual.
    Delay(Duration),
    /// The command runs on the store; if it succeeds, the call answers a
    /// [`NotReplicated`](BackendErrorKind::NotReplicated) error instead (a
    /// write its replicas did not confirm).
    Unreplicated,
}

/// A test's own choice of each call's fault (see [`Faults::decide_with`]).
type Decide = Arc<dyn Fn(Op, Option<&FillKeys>) -> Option<Fault> + Send + Sync>;

/// The decision hook, if a test set one.
#[derive(Default)]
struct Decider(Mutex<Option<Decide>>);

impl std::fmt::Debug for Decider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Decider")
            .field(&self.0.lock().is_some())
            .finish()
    }
}

/// When a fault applies.
#[derive(Debug, Clone)]
struct Rule {
    ops: Vec<Op>,
    /// Only keys whose value key contains this.
    keys: Option<String>,
    /// Only from this call on (1-based, counted over every kind).
    from_call: usize,
    fault: Fault,
}

#[derive(Debug, Default)]
struct State {
    /// Newest first: the first rule that applies wins.
    rules: Mutex<Vec<Rule>>,
    latency: Mutex<Duration>,
    calls: Mutex<HashMap<Op, usize>>,
    total: AtomicUsize,
    gate: GateSemaphore,
    decide: Decider,
}

#[derive(Debug)]
struct GateSemaphore(Semaphore);
impl Default for GateSemaphore {
    fn default() -> Self {
        GateSemaphore(Semaphore::new(0))
    }
}

/// The switches of a [`FaultyBackend`], shared by its clones: faults,
/// latency, and the count of calls. Changeable at any time, also while
/// calls are under way (a call decides its fault when it starts).
#[derive(Debug, Clone, Default)]
pub struct Faults(Arc<State>);

impl Faults {
    /// From now on, every call of the kinds `ops` meets `fault` (over any
    /// fault set before for them).
    pub fn set(&self, ops: impl IntoIterator<Item = Op>, fault: Fault) {
        self.push(Rule {
            ops: ops.into_iter().collect(),
            keys: None,
            from_call: 0,
            fault,
        });
    }

    /// Like [`set`](Self::set), for every kind of call.
    pub fn set_all(&self, fault: Fault) {
        self.set(Op::ALL, fault);
    }

    /// Like [`set`](Self::set), only for keys whose value key contains
    /// `part` (as the keys on one master of a cluster).
    pub fn set_for_keys(&self, part: &str, ops: impl IntoIterator<Item = Op>, fault: Fault) {
        self.push(Rule {
            ops: ops.into_iter().collect(),
            keys: Some(part.to_owned()),
            from_call: 0,
            fault,
        });
    }

    /// Like [`set_all`](Self::set_all), but only from the `n`-th call on
    /// (counted from 1 over every kind, since the wrapper was made): the
    /// calls before it pass.
    pub fn set_all_from_call(&self, n: usize, fault: Fault) {
        self.push(Rule {
            ops: Op::ALL.to_vec(),
            keys: None,
            from_call: n,
            fault,
        });
    }

    /// Removes every fault: calls reach the store again (the latency
    /// stays).
    pub fn clear(&self) {
        self.0.rules.lock().clear();
    }

    /// Removes the faults set for any of the kinds `ops` (with
    /// [`set`](Self::set) and its kin), leaving the others.
    pub fn clear_for(&self, ops: impl IntoIterator<Item = Op>) {
        let ops: Vec<Op> = ops.into_iter().collect();
        self.0
            .rules
            .lock()
            .retain(|r| !r.ops.iter().any(|op| ops.contains(op)));
    }

    /// The fault a call of kind `op` on any key would meet now, if one is
    /// set for every key and already in force.
    pub fn fault_of(&self, op: Op) -> Option<Fault> {
        let next = self.total_calls() + 1;
        self.0
            .rules
            .lock()
            .iter()
            .find(|r| r.ops.contains(&op) && r.keys.is_none() && next >= r.from_call)
            .map(|r| r.fault.clone())
    }

    /// Every call waits `latency` before it reaches the store (or meets its
    /// fault): a server further away. Zero turns it off.
    pub fn set_latency(&self, latency: Duration) {
        *self.0.latency.lock() = latency;
    }

    /// Lets `n` calls waiting at the gate ([`Fault::Gated`]) answer.
    pub fn open_gate(&self, n: usize) {
        self.0.gate.0.add_permits(n);
    }

    /// Takes back the permits [`open_gate`](Self::open_gate) gave that no
    /// call used yet.
    pub fn close_gate(&self) {
        while let Ok(permit) = self.0.gate.0.try_acquire() {
            permit.forget();
        }
    }

    /// How many calls of kind `op` were made so far.
    pub fn calls(&self, op: Op) -> usize {
        self.0.calls.lock().get(&op).copied().unwrap_or(0)
    }

    /// How many calls of any kind were made so far.
    pub fn total_calls(&self) -> usize {
        self.0.total.load(Ordering::SeqCst)
    }

    /// Sets the per-kind counts back to zero ([`total_calls`](Self::total_calls),
    /// which [`set_all_from_call`](Self::set_all_from_call) counts with,
    /// goes on).
    pub fn reset_calls(&self) {
        self.0.calls.lock().clear();
    }

    /// Whether some fault picks keys.
    /// From now on, each call's fault is what `decide` says for its kind
    /// and keys (`None`: it passes), ahead of the faults set per kind: for
    /// a test that draws faults from a seeded stream, or logs each one.
    pub fn decide_with(
        &self,
        decide: impl Fn(Op, Option<&FillKeys>) -> Option<Fault> + Send + Sync + 'static,
    ) {
        *self.0.decide.0.lock() = Some(Arc::new(decide));
    }

    fn per_key(&self) -> bool {
        self.0.rules.lock().iter().any(|r| r.keys.is_some())
    }

    fn push(&self, rule: Rule) {
        self.0.rules.lock().insert(0, rule);
    }

    /// Counts a call and picks its fault.
    fn start(&self, op: Op, keys: Option<&FillKeys>) -> (Duration, Option<Fault>) {
        *self.0.calls.lock().entry(op).or_default() += 1;
        let n = self.0.total.fetch_add(1, Ordering::SeqCst) + 1;
        let latency = *self.0.latency.lock();
        let decide = self.0.decide.0.lock().clone();
        if let Some(fault) = decide.and_then(|decide| decide(op, keys)) {
            return (latency, Some(fault));
        }
        let fault = self
            .0
            .rules
            .lock()
            .iter()
            .find(|r| {
                r.ops.contains(&op)
                    && n >= r.from_call
                    && r.keys
                        .as_deref()
                        .is_none_or(|part| keys.is_some_and(|k| k.value().contains(part)))
            })
            .map(|r| r.fault.clone());
        (latency, fault)
    }

    /// Runs `call` (on the store) as the fault says.
    async fn pass<T>(
        &self,
        op: Op,
        keys: Option<&FillKeys>,
        call: impl std::future::Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let (latency, fault) = self.start(op, keys);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match fault {
            None | Some(Fault::Deaf) => call.await,
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::Refuse) => Err(BackendError::new(
                BackendErrorKind::Connection,
                "connection refused (injected)",
            )),
            Some(Fault::CommandError) => Err(BackendError::new(
                BackendErrorKind::Command,
                "OOM command not allowed (injected)",
            )),
            Some(Fault::LoseReply) => {
                let _ = call.await;
                Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    "reply lost (injected)",
                ))
            }
            Some(Fault::Unreplicated) => {
                call.await?;
                Err(BackendError::new(
                    BackendErrorKind::NotReplicated,
                    "not confirmed by enough replicas (injected)",
                ))
            }
            Some(Fault::RunThenHang) => {
                let _ = call.await;
                std::future::pending().await
            }
            Some(Fault::LoseRequest(after)) => {
                tokio::time::sleep(after).await;
                Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    "request lost (injected)",
                ))
            }
            Some(Fault::Gated) => {
                let answer = call.await;
                if let Ok(permit) = self.0.gate.0.acquire().await {
                    permit.forget();
                }
                answer
            }
            Some(Fault::Panic) => panic!("backend {op:?} panicked (injected)"),
            Some(Fault::Fail(kind)) => Err(BackendError::new(kind, format!("{kind} (injected)"))),
            Some(Fault::Delay(wait)) => {
                tokio::time::sleep(wait).await;
                call.await
            }
        }
    }
}

/// Wraps a [`Backend`] and injects faults into its calls, per kind of call
/// (and optionally per key), as its [`Faults`] say; counts every call.
///
/// ```
/// # tokio_test_block_on(async {
/// use onefill::testing::{Fault, FaultyBackend, Op};
/// use onefill::MemoryBackend;
///
/// let backend = FaultyBackend::new(MemoryBackend::new());
/// backend.faults().set([Op::Get], Fault::Refuse);
/// // ... a cache on `backend.clone()` now degrades on every read ...
/// backend.faults().clear();
/// # });
/// # fn tokio_test_block_on(f: impl std::future::Future) {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f);
/// # }
/// ```
///
/// Clones share the store and the switches; [`peer`](Self::peer) gives
/// another process's view of the same store, with switches of its own. It
/// does not claim to be in-process (so a cache on it has no L1 unless
/// given one), as it stands for a store across a network, faults and all;
/// [`in_process_as_inner`](Self::in_process_as_inner) says otherwise.
#[derive(Debug)]
pub struct FaultyBackend<B: ?Sized> {
    inner: Arc<B>,
    faults: Faults,
    shard: Option<fn(&FillKeys) -> u64>,
    in_process: bool,
}

impl<B: ?Sized> Clone for FaultyBackend<B> {
    fn clone(&self) -> Self {
        FaultyBackend {
            inner: self.inner.clone(),
            faults: self.faults.clone(),
            shard: self.shard,
            in_process: self.in_process,
        }
    }
}

impl<B: Backend> FaultyBackend<B> {
    /// `inner` with no fault set: every call reaches it.
    pub fn new(inner: B) -> Self {
        Self::shared(Arc::new(inner))
    }
}

impl<B: Backend + ?Sized> FaultyBackend<B> {
    /// Like [`new`](Self::new), on a shared backend (such as an
    /// `Arc<dyn Backend>`).
    pub fn shared(inner: Arc<B>) -> Self {
        FaultyBackend {
            inner,
            faults: Faults::default(),
            shard: None,
            in_process: false,
        }
    }

    /// Reports `shard(keys)` as each key's shard (the failure domains of
    /// [`Backend::shard`]), e.g. to play two masters of a cluster.
    pub fn with_shards(mut self, shard: fn(&FillKeys) -> u64) -> Self {
        self.shard = Some(shard);
        self
    }

    /// Says it is in-process if the wrapped store is (see
    /// [`Backend::in_process`]): for a wrapper that only counts calls, so a
    /// cache on it is built as on the store itself if that is the embedded
    /// store. (A cache on this wrapper has the default L1 only then, see
    /// [`Backend::default_l1`]: not over Redis, whatever this says.)
    pub fn in_process_as_inner(mut self) -> Self {
        self.in_process = self.inner.in_process();
        self
    }

    /// The switches (shared by every clone).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The wrapped store, past every fault.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Another process's view of the same store: its own switches and
    /// counts, no fault set.
    pub fn peer(&self) -> Self {
        FaultyBackend {
            inner: self.inner.clone(),
            faults: Faults::default(),
            shard: self.shard,
            in_process: self.in_process,
        }
    }
}

/// A subscription that never fires.
struct Deaf;

#[async_trait]
impl FillSubscription for Deaf {
    async fn notified(&mut self) {
        std::future::pending::<()>().await
    }
}

#[async_trait]
impl<B: Backend + ?Sized> Backend for FaultyBackend<B> {
    async fn get(&self, keys: &FillKeys) -> Result<Option<Stored>, BackendError> {
        self.faults
            .pass(Op::Get, Some(keys), self.inner.get(keys))
            .await
    }
    async fn acquire(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let call = self.inner.acquire(keys, token, lease_ttl, refresh_window);
        self.faults.pass(Op::Acquire, Some(keys), call).await
    }
    async fn get_many(&self, keys: &[FillKeys]) -> Vec<Result<Option<Stored>, BackendError>> {
        if self.faults.per_key() {
            // Faults that pick keys apply to each key of a batch, as on
            // the masters of a cluster.
            return join_all(keys.iter().map(|k| self.get(k))).await;
        }
        let n = keys.len();
        let answers = self
            .faults
            .pass(Op::GetMany, keys.first(), async {
                Ok(self.inner.get_many(keys).await)
            })
            .await;
        answers.unwrap_or_else(|e| (0..n).map(|_| Err(e.clone())).collect())
    }
    async fn acquire_many(
        &self,
        requests: &[LeaseRequest],
        lease_ttl: Duration,
    ) -> Vec<Result<Acquired, BackendError>> {
        if self.faults.per_key() {
            let each = requests
                .iter()
                .map(|r| self.acquire(&r.keys, &r.token, lease_ttl, r.refresh_window));
            return join_all(each).await;
        }
        let n = requests.len();
        let first = requests.first().map(|r| &r.keys);
        let answers = self
            .faults
            .pass(Op::AcquireMany, first, async {
                Ok(self.inner.acquire_many(requests, lease_ttl).await)
            })
            .await;
        answers.unwrap_or_else(|e| (0..n).map(|_| Err(e.clone())).collect())
    }
    async fn fill(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        bytes: &[u8],
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let call = self.inner.fill(keys, token, bytes, ttl);
        self.faults.pass(Op::Fill, Some(keys), call).await
    }
    async fn release(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        entry: Option<(&[u8], Duration)>,
    ) -> Result<bool, BackendError> {
        let call = self.inner.release(keys, token, entry);
        self.faults.pass(Op::Release, Some(keys), call).await
    }
    async fn extend(
        &self,
        keys: &FillKeys,
        token: &LeaseToken,
        lease_ttl: Duration,
    ) -> Result<bool, BackendError> {
        let call = self.inner.extend(keys, token, lease_ttl);
        self.faults.pass(Op::Extend, Some(keys), call).await
    }
    async fn set(&self, keys: &FillKeys, bytes: &[u8], ttl: Duration) -> Result<(), BackendError> {
        let call = self.inner.set(keys, bytes, ttl);
        self.faults.pass(Op::Set, Some(keys), call).await
    }
    async fn invalidate(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let call = self.inner.invalidate(keys);
        self.faults.pass(Op::Invalidate, Some(keys), call).await
    }
    /// Under the faults of `Op::Invalidate`, as the write it stands for.
    async fn invalidate_older_than(
        &self,
        keys: &FillKeys,
        age: Duration,
    ) -> Result<bool, BackendError> {
        let call = self.inner.invalidate_older_than(keys, age);
        self.faults.pass(Op::Invalidate, Some(keys), call).await
    }
    async fn expire(&self, keys: &FillKeys) -> Result<(), BackendError> {
        let call = self.inner.expire(keys);
        self.faults.pass(Op::Expire, Some(keys), call).await
    }
    async fn mark(
        &self,
        gen_key: &str,
        mark_key: &str,
        kind: MarkKind,
        retention: Option<Duration>,
    ) -> Result<u64, BackendError> {
        let call = self.inner.mark(gen_key, mark_key, kind, retention);
        self.faults.pass(Op::Mark, None, call).await
    }
    async fn read_marks(
        &self,
        gen_key: &str,
        mark_keys: &[&str],
    ) -> Result<(u64, Vec<Mark>), BackendError> {
        let call = self.inner.read_marks(gen_key, mark_keys);
        self.faults.pass(Op::ReadMarks, None, call).await
    }
    // The liveness calls are the inner backend's: `take_over` under the
    // faults of `Op::Acquire`, the others without faults.
    fn new_token(&self, keys: &FillKeys) -> LeaseToken {
        self.inner.new_token(keys)
    }
    async fn watch_holder(
        &self,
        keys: &FillKeys,
        holder: &LeaseToken,
    ) -> Result<Watch, BackendError> {
        self.inner.watch_holder(keys, holder).await
    }
    async fn take_over(
        &self,
        keys: &FillKeys,
        gone: &LeaseToken,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let call = self
            .inner
            .take_over(keys, gone, token, lease_ttl, refresh_window);
        self.faults.pass(Op::Acquire, Some(keys), call).await
    }
    async fn subscribe(&self, keys: &FillKeys) -> Result<Box<dyn FillSubscription>, BackendError> {
        let deaf = self.faults.fault_of(Op::Subscribe) == Some(Fault::Deaf);
        let sub = self
            .faults
            .pass(Op::Subscribe, Some(keys), self.inner.subscribe(keys))
            .await?;
        if deaf {
            return Ok(Box::new(Deaf));
        }
        Ok(sub)
    }
    fn shard(&self, keys: &FillKeys) -> u64 {
        match self.shard {
            Some(shard) => shard(keys),
            None => self.inner.shard(keys),
        }
    }
    fn shard_serves_keys(&self, shard: u64) -> bool {
        self.inner.shard_serves_keys(shard)
    }
    fn in_process(&self) -> bool {
        self.in_process
    }
    fn track_changes(
        &self,
        prefix: &str,
        confirm_every: Duration,
        listener: Weak<dyn ChangeListener>,
    ) -> Result<(), BackendError> {
        self.inner.track_changes(prefix, confirm_every, listener)
    }
}
