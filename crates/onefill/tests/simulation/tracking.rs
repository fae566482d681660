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
//!   other application, the foreign writer), and of a mark's keys (the
//!   generation's and the mark's), reaches the L1 after a drawn
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
//!   entry, a `set`, an `invalidate` or a mark answered `Ok` by any backend
//!   object of a process tells every L1 of that process before it returns
//!   (the Redis backend's one registry of own-process listeners). The
//!   `PerBackendListeners` variant tells only the L1s registered through
//!   the same backend object.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use onefill::backend::ChangeListener;
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
    links: Vec<Link>,
    /// Wakes the driver when a report is queued that arrives before the
    /// driver's next wake-up (`next_wake`).
    wake: Notify,
    next_wake: Mutex<Option<Instant>>,
    driving: AtomicBool,
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
                    Link::new(stream)
                })
                .collect(),
            wake: Notify::new(),
            next_wake: Mutex::new(None),
            driving: AtomicBool::new(false),
        }
    }

    /// Instance `inst`'s backend object starts reporting to `listener`
    /// (`values`: on a prefix that covers the value keys).
    pub(crate) fn register(
        &self,
        world: &Arc<World>,
        inst: usize,
        listener: Listener,
        confirm_every: Duration,
        values: bool,
    ) {
        self.listeners[self.process_of[inst]]
            .lock()
            .unwrap()
            .push((inst, listener.clone()));
        {
            let link = &self.links[inst];
            *link.listener.lock().unwrap() = Some(listener);
            link.values.fetch_or(values, Ordering::SeqCst);
            let mut state = link.state.lock().unwrap();
            state.every = confirm_every;
            state.next_confirm = Instant::now() + confirm_every;
        }
        if !self.driving.swap(true, Ordering::SeqCst) {
            tokio::spawn(drive(world.clone()));
        }
    }

    /// Whether instance `inst`'s backend object tracks the fleet's prefix
    /// (its reads then report the server's TTL, decision 0014).
    pub(crate) fn tracks(&self, inst: usize) -> bool {
        self.links[inst].values.load(Ordering::SeqCst)
    }

    /// The store changed `value_key`: a report on every connection.
    pub(crate) fn report(&self, value_key: &str) {
        let first = self
            .links
            .iter()
            .filter_map(|link| link.push(Item::Changed(value_key.to_owned())))
            .min();
        let next_wake = *self.next_wake.lock().unwrap();
        if first.is_some_and(|first| next_wake.is_none_or(|wake| first < wake)) {
            self.wake.notify_one();
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

/// Delivers every connection's reports as they arrive and confirms each
/// connection's sync every `confirm_every`, until the run settles (then
/// the L1s stop serving within their bound; no call is made any more). A
/// dead instance's connection falls silent. One task for all connections:
/// their confirmations fall due together (their caches are built at once).
async fn drive(world: Arc<World>) {
    let tracking = &world.tracking;
    loop {
        if world.settling.load(Ordering::SeqCst) || world.closed.load(Ordering::SeqCst) {
            return;
        }
        let live = |i: &usize| !world.is_dead(*i);
        let until = (0..tracking.links.len())
            .filter(live)
            .filter_map(|i| tracking.links[i].next_event())
            .min();
        let Some(until) = until else {
            return;
        };
        *tracking.next_wake.lock().unwrap() = Some(until);
        tokio::select! {
            () = tokio::time::sleep_until(until) => {}
            () = tracking.wake.notified() => {}
        }
        let now = Instant::now();
        for i in (0..tracking.links.len()).filter(live) {
            tracking.links[i].deliver(now);
        }
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
    /// The prefix registered covers the value keys (an L1's, the only
    /// kind registered: a cache without an L1 tracks nothing).
    values: std::sync::atomic::AtomicBool,
    state: Mutex<LinkState>,
}

struct LinkState {
    /// What is on its way, with when it arrives (in order).
    queue: VecDeque<(Instant, Item)>,
    up: bool,
    /// The delays' stream (splitmix64: a `StdRng` per connection cost more
    /// than the rest of the connection in a debug build).
    rng: u64,
    /// When the last item queued arrives: the next one arrives no earlier.
    last: Instant,
    every: Duration,
    /// When the next confirmation is sent, and how long its answer takes
    /// (drawn ahead, so the driver wakes once per confirmation, when it
    /// may arrive: it is queued, behind every report queued before it,
    /// either then or when a report comes after it was sent).
    next_confirm: Instant,
    confirm_delay: Duration,
}

impl LinkState {
    fn delay(&mut self) -> Duration {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Duration::from_millis(1 + z % PUSH_DELAY_MAX.as_millis() as u64)
    }

    /// Queues `item`, sent at `sent` and taking `delay`, behind everything
    /// queued before it.
    fn queue_at(&mut self, sent: Instant, delay: Duration, item: Item) {
        let at = (sent + delay).max(self.last);
        self.last = at;
        self.queue.push_back((at, item));
    }

    fn queue(&mut self, now: Instant, item: Item) {
        let delay = self.delay();
        self.queue_at(now, delay, item);
    }

    /// Queues the confirmations sent by `now`.
    fn confirm_due(&mut self, now: Instant) {
        while self.next_confirm <= now {
            let sent = self.next_confirm;
            if self.up {
                self.queue_at(sent, self.confirm_delay, Item::Synced(sent));
            }
            self.next_confirm = sent + self.every;
            self.confirm_delay = self.delay();
        }
    }
}

impl Link {
    fn new(rng: u64) -> Self {
        Link {
            listener: Mutex::new(None),
            values: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(LinkState {
                queue: VecDeque::new(),
                up: true,
                rng,
                last: Instant::now(),
                every: Duration::MAX,
                next_confirm: Instant::now(),
                confirm_delay: PUSH_DELAY_MAX,
            }),
        }
    }

    fn listening(&self) -> Option<Arc<dyn ChangeListener>> {
        self.listener.lock().unwrap().as_ref()?.upgrade()
    }

    /// Queues `item` if the connection is registered and up: when it
    /// arrives.
    fn push(&self, item: Item) -> Option<Instant> {
        self.listener.lock().unwrap().as_ref()?;
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        state.confirm_due(now);
        if !state.up {
            return None;
        }
        state.queue(now, item);
        Some(state.last)
    }

    /// When this connection next has something to do.
    fn next_event(&self) -> Option<Instant> {
        self.listener.lock().unwrap().as_ref()?;
        let state = self.state.lock().unwrap();
        let confirmed = state.next_confirm + state.confirm_delay;
        let due = state.queue.front().map(|(at, _)| *at);
        Some(due.map_or(confirmed, |due| due.min(confirmed)))
    }

    /// Sends the confirmation due (behind every report queued before it)
    /// and delivers what has arrived, in order.
    fn deliver(&self, now: Instant) {
        let Some(listener) = self.listening() else {
            return;
        };
        let arrived = {
            let mut state = self.state.lock().unwrap();
            state.confirm_due(now);
            let mut arrived = Vec::new();
            while state.queue.front().is_some_and(|(at, _)| *at <= now) {
                arrived.extend(state.queue.pop_front().map(|(_, item)| item));
            }
            arrived
        };
        for item in arrived {
            match item {
                Item::Changed(key) => listener.changed(key.as_bytes()),
                Item::Synced(at) => listener.synced(Some(at)),
            }
        }
    }

    fn lose(&self, noticed: bool) {
        {
            let mut state = self.state.lock().unwrap();
            state.confirm_due(Instant::now());
            state.up = false;
            state.queue.clear();
        }
        if let (true, Some(listener)) = (noticed, self.listening()) {
            listener.synced(None);
        }
    }

    fn restore(&self) {
        {
            let mut state = self.state.lock().unwrap();
            state.confirm_due(Instant::now());
            state.up = true;
        }
        if let Some(listener) = self.listening() {
            listener.reset();
            listener.synced(Some(Instant::now()));
        }
    }
}
