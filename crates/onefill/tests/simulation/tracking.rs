//! Change reports as Redis makes them (`CLIENT TRACKING ... BCAST`, decision
//! 0009), for the L1s of the simulated processes.
//!
//! The memory backend reports every change to every listener before the
//! write returns, and is always in sync: nothing an L1 does wrong with late
//! reports could show. So no L1 here listens to the memory backend (the
//! injector's `track_changes` never passes the registration down); they
//! hear of changes two ways, as on Redis:
//!
//! - **The tracking connection** of each backend object ([`Link`]): every
//!   change of a value key on the store, whoever made it (the fleet, the
//!   other application, the foreign writer), reaches the L1 after a drawn
//!   delay of at most [`PUSH_DELAY_MAX`], in order (FIFO per connection).
//!   Every `confirm_every` the connection confirms the sync like the
//!   `PING` on Redis's: `synced(Some(sent))` is delivered behind every
//!   report queued before it. An expiry is not reported (Redis deletes
//!   expired keys lazily or by sampling). The connection may be lost for a
//!   while: the reports queued or made meanwhile are lost, the backend
//!   either says so at once (`synced(None)`) or falls silent (the L1 stops
//!   serving within its sync bound), and when it is back the L1 is `reset`
//!   and in sync again.
//! - **The process's own writes** ([`Tracking::own_write`]): a fill, an
//!   entry, a `set` or an `invalidate` answered `Ok` by any backend object
//!   of a process tells every L1 of that process before the write returns
//!   (the Redis backend's one registry of own-process listeners). The
//!   `PerBackendListeners` variant tells only the L1s registered through
//!   the same backend object.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use onefill::backend::ChangeListener;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::events::World;
use crate::scenario::PUSH_DELAY_MAX;

type Listener = Weak<dyn ChangeListener>;

/// Every process's listeners and every backend object's tracking connection.
pub(crate) struct Tracking {
    process_of: Vec<usize>,
    /// Per process: (instance, listener) of every L1 registered there.
    listeners: Vec<Mutex<Vec<(usize, Listener)>>>,
    links: Vec<Arc<Link>>,
}

impl Tracking {
    pub(crate) fn new(process_of: &[usize], seed: u64) -> Self {
        let processes = process_of.iter().max().map_or(0, |p| p + 1);
        Tracking {
            process_of: process_of.to_vec(),
            listeners: (0..processes).map(|_| Mutex::default()).collect(),
            links: (0..process_of.len())
                .map(|i| {
                    let stream = seed ^ (i as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
                    Arc::new(Link::new(StdRng::seed_from_u64(stream)))
                })
                .collect(),
        }
    }

    /// Instance `inst`'s backend object starts reporting to `listener`.
    pub(crate) fn register(
        &self,
        world: &Arc<World>,
        inst: usize,
        listener: Listener,
        confirm_every: Duration,
    ) {
        self.listeners[self.process_of[inst]]
            .lock()
            .unwrap()
            .push((inst, listener.clone()));
        self.links[inst].start(world.clone(), inst, listener, confirm_every);
    }

    /// Whether instance `inst`'s backend object tracks the fleet's prefix
    /// (its reads then report the server's TTL, decision 0014).
    pub(crate) fn tracks(&self, inst: usize) -> bool {
        self.links[inst].listener.lock().unwrap().is_some()
    }

    /// The store changed `value_key`: a report on every connection.
    pub(crate) fn report(&self, value_key: &str) {
        for link in &self.links {
            link.push(Item::Changed(value_key.to_owned()));
        }
    }

    /// Instance `inst` wrote `value_key` and is answered `Ok`: every L1 of
    /// its process hears of it now (with `only_own`, only those registered
    /// through `inst`'s backend object).
    pub(crate) fn own_write(&self, inst: usize, value_key: &str, only_own: bool) {
        let listeners = self.listeners[self.process_of[inst]]
            .lock()
            .unwrap()
            .clone();
        for (i, listener) in listeners {
            if only_own && i != inst {
                continue;
            }
            if let Some(listener) = listener.upgrade() {
                listener.changed(value_key.as_bytes());
            }
        }
    }

    pub(crate) fn lose(&self, inst: usize, noticed: bool) {
        self.links[inst].lose(noticed);
    }

    pub(crate) fn restore(&self, inst: usize) {
        self.links[inst].restore();
    }
}

#[derive(Debug)]
enum Item {
    Changed(String),
    Synced(Instant),
}

/// One backend object's tracking connection.
struct Link {
    listener: Mutex<Option<Listener>>,
    state: Mutex<LinkState>,
    wake: Notify,
}

struct LinkState {
    /// What is on its way, with when it arrives (in order).
    queue: VecDeque<(Instant, Item)>,
    up: bool,
    rng: StdRng,
    /// When the last item queued arrives: the next one arrives no earlier.
    last: Instant,
}

impl LinkState {
    fn queue(&mut self, item: Item) {
        let delay =
            Duration::from_millis(self.rng.random_range(1..=PUSH_DELAY_MAX.as_millis() as u64));
        let at = (Instant::now() + delay).max(self.last);
        self.last = at;
        self.queue.push_back((at, item));
    }
}

impl Link {
    fn new(rng: StdRng) -> Self {
        Link {
            listener: Mutex::new(None),
            state: Mutex::new(LinkState {
                queue: VecDeque::new(),
                up: true,
                rng,
                last: Instant::now(),
            }),
            wake: Notify::new(),
        }
    }

    fn listening(&self) -> Option<Arc<dyn ChangeListener>> {
        self.listener.lock().unwrap().as_ref()?.upgrade()
    }

    fn push(&self, item: Item) {
        if self.listener.lock().unwrap().is_none() {
            return;
        }
        let mut state = self.state.lock().unwrap();
        if state.up {
            state.queue(item);
            drop(state);
            self.wake.notify_one();
        }
    }

    fn lose(&self, noticed: bool) {
        {
            let mut state = self.state.lock().unwrap();
            state.up = false;
            state.queue.clear();
        }
        if let (true, Some(listener)) = (noticed, self.listening()) {
            listener.synced(None);
        }
    }

    fn restore(&self) {
        self.state.lock().unwrap().up = true;
        if let Some(listener) = self.listening() {
            listener.reset();
            listener.synced(Some(Instant::now()));
        }
    }

    /// Delivers the reports as they arrive and confirms the sync every
    /// `confirm_every`, until the run settles (then the L1 stops serving
    /// within its bound; no call is made any more). A dead instance's
    /// connection falls silent.
    fn start(
        self: &Arc<Self>,
        world: Arc<World>,
        inst: usize,
        listener: Listener,
        every: Duration,
    ) {
        *self.listener.lock().unwrap() = Some(listener);
        let link = self.clone();
        tokio::spawn(async move {
            let mut next_confirm = Instant::now() + every;
            loop {
                if world.settling.load(Ordering::SeqCst) || world.closed.load(Ordering::SeqCst) {
                    return;
                }
                if world.is_dead(inst) {
                    std::future::pending::<()>().await;
                }
                let due = link.state.lock().unwrap().queue.front().map(|(at, _)| *at);
                let until = due.map_or(next_confirm, |due| due.min(next_confirm));
                tokio::select! {
                    () = tokio::time::sleep_until(until) => {}
                    () = link.wake.notified() => {}
                }
                let now = Instant::now();
                let arrived = {
                    let mut state = link.state.lock().unwrap();
                    if now >= next_confirm {
                        next_confirm = now + every;
                        if state.up {
                            state.queue(Item::Synced(now));
                        }
                    }
                    let mut arrived = Vec::new();
                    while state.queue.front().is_some_and(|(at, _)| *at <= now) {
                        arrived.extend(state.queue.pop_front().map(|(_, item)| item));
                    }
                    arrived
                };
                let Some(listener) = link.listening() else {
                    return;
                };
                if world.is_dead(inst) {
                    continue;
                }
                for item in arrived {
                    match item {
                        Item::Changed(key) => listener.changed(key.as_bytes()),
                        Item::Synced(at) => listener.synced(Some(at)),
                    }
                }
            }
        });
    }
}
