//! Holder liveness, as a store that watches lease holders reports it (the
//! Redis backend's beats and subscriber counts, decision 0015): in the
//! seeds whose store does, a lease token names its instance (`i0`, `i1`,
//! …), and a waiter's watch of a holder judges it dead a drawn 0–100 ms
//! after the instance died. Now and then (rates drawn per seed) a watch
//! loses its signal, or judges a live holder frozen: a wrong verdict, whose
//! cost (a takeover, a second load, a fenced fill) the checker bounds.
//! Neither happens once the run's healthy tail began.
//!
//! The watch is made by `Store::watch_holder` (after its re-check of the
//! lease), through the faults of the injector; `Ev::Verdict` logs how it
//! ended.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use onefill::backend::{Gone, HolderWatch};
use onefill::LeaseToken;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::events::{Ev, World};
use crate::injector::frozen_if_dead;
use crate::scenario::ms;

/// How often a watch goes wrong, per watch: it loses its signal (`lost`),
/// or judges its live holder frozen (`frozen`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchRates {
    pub(crate) lost: f64,
    pub(crate) frozen: f64,
}

/// Whether the store watches lease holders, and what its watches go by.
pub(crate) struct Liveness {
    /// The rates of wrong watches, if the store watches holders at all.
    rates: Option<WatchRates>,
    /// Per waiting instance: the stream its watches are drawn from.
    rngs: Vec<Mutex<StdRng>>,
    /// Per instance: when it died, as its watchers hear of it.
    deaths: Vec<watch::Sender<Option<Instant>>>,
}

impl Liveness {
    pub(crate) fn new(rates: Option<WatchRates>, instances: usize, seed: u64) -> Liveness {
        Liveness {
            rates,
            rngs: (0..instances)
                .map(|i| {
                    let stream = seed ^ 0x4C49_5645 ^ (i as u64 + 1).wrapping_mul(0xC2B2_AE3D);
                    Mutex::new(StdRng::seed_from_u64(stream))
                })
                .collect(),
            deaths: (0..instances).map(|_| watch::channel(None).0).collect(),
        }
    }

    /// Whether the store watches lease holders.
    pub(crate) fn on(&self) -> bool {
        self.rates.is_some()
    }

    /// Instance `inst` died now.
    pub(crate) fn died(&self, inst: usize) {
        self.deaths[inst].send_replace(Some(Instant::now()));
    }
}

/// The name a lease token of instance `inst` carries.
pub(crate) fn holder_name(inst: usize) -> String {
    format!("i{inst}")
}

/// The instance a lease token names, if it names one.
pub(crate) fn holder_of(token: &LeaseToken) -> Option<usize> {
    token.holder()?.strip_prefix('i')?.parse().ok()
}

/// A watch, made by instance `waiter` for the holder `holder` (instance
/// `of`) of `key`'s lease, alive now.
pub(crate) fn watch_holder(
    world: &Arc<World>,
    waiter: usize,
    key: usize,
    holder: &LeaseToken,
    of: usize,
) -> Box<dyn HolderWatch> {
    let live = &world.liveness;
    let now = Instant::now();
    let (notice, fate) = {
        let mut rng = live.rngs[waiter].lock().unwrap();
        let notice = ms(rng.random_range(0..=100));
        let rates = live.rates.unwrap_or(WatchRates {
            lost: 0.0,
            frozen: 0.0,
        });
        let verdict = if rng.random_bool(rates.lost) {
            Some(None)
        } else if rng.random_bool(rates.frozen) {
            Some(Some(Gone::Frozen))
        } else {
            None
        };
        let fate = verdict.map(|verdict| (now + ms(rng.random_range(0..=500)), verdict));
        (notice, fate)
    };
    Box::new(Watching {
        world: world.clone(),
        waiter,
        key,
        holder: holder.as_str().to_owned(),
        died: live.deaths[of].subscribe(),
        notice,
        fate,
    })
}

/// One waiter's watch of one holder.
struct Watching {
    world: Arc<World>,
    waiter: usize,
    key: usize,
    holder: String,
    /// When the holder's instance died.
    died: watch::Receiver<Option<Instant>>,
    /// How long after its death the watch judges it dead.
    notice: Duration,
    /// A lost signal (`None`) or a wrong verdict drawn for this watch, and
    /// when it comes (unless the holder is judged dead first, or the run's
    /// healthy tail began).
    fate: Option<(Instant, Option<Gone>)>,
}

#[async_trait]
impl HolderWatch for Watching {
    /// Cancel-safe: every instant it waits for is kept in the watch.
    async fn gone(&mut self) -> Option<Gone> {
        let verdict = loop {
            let death = self.died.borrow().map(|at| at + self.notice);
            let (at, fated) = match (death, self.fate) {
                (Some(dead), Some((at, _))) if at < dead => (at, true),
                (Some(dead), _) => (dead, false),
                (None, Some((at, _))) => (at, true),
                (None, None) => {
                    if self.died.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    continue;
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                changed = self.died.changed(), if death.is_none() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                    continue;
                }
            }
            if !fated {
                break Some(Gone::Dead);
            }
            let fate = self.fate.take().and_then(|(_, verdict)| verdict);
            if self.world.healthy.load(Ordering::SeqCst) {
                continue;
            }
            break fate;
        };
        // A dead waiter hears nothing more.
        frozen_if_dead(&self.world, self.waiter).await;
        self.world.record(Ev::Verdict {
            inst: self.waiter,
            key: self.key,
            holder: self.holder.clone(),
            gone: verdict,
        });
        verdict
    }
}
