//! One seed's scenario: the fleet, its options, its faults and its
//! operations, drawn from the seed; and the bounds the checker derives from
//! the options.

use std::time::Duration;

use onefill::{Cache, CircuitBreaker, LeaseTtl, MemoryBackend, OnWaitTimeout, WaitPolicy};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::events::MarkOp;
use crate::injector::Injector;
use crate::liveness::WatchRates;
use crate::variants::Variant;

pub(crate) const NS: &str = "sim";
/// Timer tolerance: tokio's timers have a 1 ms resolution and round up, and
/// a flight chains a few of them.
pub(crate) const TICK: Duration = Duration::from_millis(10);
/// The longest a change report (or a sync confirmation) takes to reach an
/// L1 over a healthy tracking connection (see `tracking.rs`).
pub(crate) const PUSH_DELAY_MAX: Duration = Duration::from_millis(5);
/// The longest a cache without an L1 judges by a mark it read: trusted
/// for one recheck period (`RECHECK` in `src/marks/`, one second) after
/// the read that found it began, then judged by for one more while it is
/// refreshed in the background (decision 0018's bound).
pub(crate) const MARKS_RECHECKED: Duration = Duration::from_secs(2);
/// How many tags the values draw theirs from (`t0`, `t1`, …).
pub(crate) const TAGS: u8 = 3;

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One seed's scenario: options shared by every instance, fault rates,
/// an optional death, and the operations.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) instances: usize,
    pub(crate) keys: usize,
    pub(crate) backend_timeout: Duration,
    pub(crate) ttl: Duration,
    pub(crate) grace: Duration,
    jitter: f64,
    beta: f64,
    lease_ttl: LeaseTtl,
    pub(crate) longest_lease: Duration,
    pub(crate) max_load_time: Duration,
    pub(crate) wait: WaitPolicy,
    negative_ttl: Option<Duration>,
    fail_safe: bool,
    pub(crate) fail_safe_throttle: Duration,
    breaker: CircuitBreaker,
    strict: bool,
    /// No waiting for another process's load (`no_lease`): a flight takes
    /// the lease only if it is free, else loads without storing.
    pub(crate) no_lease: bool,
    /// Every instance has an L1 (kept coherent by the store's change
    /// reports): one seed in three.
    pub(crate) l1: bool,
    /// The L1's sync bound (`L1::sync_bound`), with an L1.
    pub(crate) sync_bound: Duration,
    /// The process of each instance (a `Cache` on a backend object of its
    /// own). With an L1, one seed in two runs instances 0 and 1 in one
    /// process: two caches of the fleet's namespace on two backend objects,
    /// whose writes must reach each other's L1 before they return.
    pub(crate) process_of: Vec<usize>,
    /// With an L1: the losses of an instance's tracking connection
    /// (instance, from, how long, whether the backend notices at once and
    /// says it is out of sync, or falls silent). A noticed loss is an
    /// outage: the instance's calls fail meanwhile too.
    pub(crate) tracking_losses: Vec<(usize, Duration, Duration, bool)>,
    /// Per instance: probability that a backend call is faulted, and that a
    /// notification is.
    pub(crate) fault_rates: Vec<(f64, f64)>,
    pub(crate) death: Option<(usize, Duration)>,
    /// In one seed with a death in two, the instance dies this long into
    /// the first load it starts from the drawn time on (none: it dies at
    /// that time): a holder dying with its lease, the case that holder
    /// liveness is for.
    pub(crate) dies_in_load: Option<Duration>,
    /// The store watches lease holders (one seed in two), its watches
    /// going wrong at these rates.
    pub(crate) liveness: Option<WatchRates>,
    pub(crate) ops: Vec<Op>,
}

#[derive(Debug, Clone)]
pub(crate) struct Op {
    pub(crate) at: Duration,
    pub(crate) inst: usize,
    pub(crate) key: usize,
    pub(crate) kind: OpKind,
    /// The caller drops its future after this long, if not answered.
    pub(crate) drop_after: Option<Duration>,
    /// If this `get`, `set` or `invalidate` is the breaker's half-open
    /// probe, its backend call hangs.
    pub(crate) probe_hangs: bool,
    /// This fetch passes call options (this TTL, the cache's own, so that
    /// nothing changes but that), which a cache's L1 does not serve: its
    /// answer comes from the backend, or in an outage from the fallback,
    /// whose copies the L1 would otherwise mostly answer for.
    pub(crate) past_l1: Option<Duration>,
    /// The tags of this fetch's loaded value, or of this `set`'s value
    /// (then written with `set_tagged`, if any): a bit per tag `t<n>`,
    /// drawn from the marks' stream (see `Scenario::generate_marks`).
    pub(crate) tags: u8,
}

#[derive(Debug, Clone)]
pub(crate) enum OpKind {
    Fetch {
        load: LoadSpec,
    },
    Get,
    Set,
    Invalidate,
    /// `expire`: the value made stale in place (drawn from a stream of its
    /// own, see `Scenario::generate_expires`).
    Expire,
    /// `invalidate_tag`, `expire_tag` or `clear` (drawn from a stream of
    /// their own, see `Scenario::generate_marks`).
    Mark(MarkOp),
    /// A `set` by another version of the application: a value of another
    /// type (`Vec<u64>`) under the same key, unreadable to the fleet.
    SetOther,
    /// Another client acting on the store directly, not through onefill.
    Foreign(ForeignOp),
}

/// What another client of the store does to a value key (no lease is
/// touched, no fill is announced; Redis's tracking reports each change).
#[derive(Debug, Clone, Copy)]
pub(crate) enum ForeignOp {
    /// A raw `SET` of a value the fleet can read (a new version), with a TTL.
    Set { ttl: Duration },
    /// A raw `DEL`.
    Delete,
    /// `PEXPIRE`: the live key's TTL becomes `ttl` (shorter, longer, or an
    /// hour, standing for `PERSIST`).
    Expire { ttl: Duration },
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct LoadSpec {
    /// `None`: the loader never returns.
    pub(crate) took: Option<Duration>,
    pub(crate) result: LoadResult,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadResult {
    Value,
    Error,
    Panic,
}

fn pick<T: Copy>(rng: &mut StdRng, items: &[T]) -> T {
    items[rng.random_range(0..items.len())]
}

fn range_ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    ms(rng.random_range(lo..=hi))
}

impl Scenario {
    pub(crate) fn generate(seed: u64) -> Scenario {
        let mut rng = StdRng::seed_from_u64(seed);
        let rng = &mut rng;
        let instances = rng.random_range(2..=4);
        let keys = rng.random_range(1..=3);
        let backend_timeout = ms(pick(rng, &[50, 100, 200]));
        let (lease_ttl, longest_lease) = if rng.random_bool(0.6) {
            let d = range_ms(rng, 100, 600);
            (LeaseTtl::Fixed(d), d)
        } else {
            let floor = range_ms(rng, 100, 300);
            let ceiling = floor + range_ms(rng, 0, 700);
            (
                LeaseTtl::Adaptive {
                    factor: 3.0,
                    floor,
                    ceiling,
                },
                ceiling,
            )
        };
        let max_load_time = range_ms(rng, 500, 2000);
        let wait = WaitPolicy::default()
            .deadline(range_ms(rng, 200, 1500))
            .polling(range_ms(rng, 10, 50), range_ms(rng, 100, 300))
            .on_timeout(pick(
                rng,
                &[
                    OnWaitTimeout::StaleOrLoad,
                    OnWaitTimeout::StaleOrError,
                    OnWaitTimeout::Load,
                    OnWaitTimeout::Error,
                ],
            ));
        let fault_rates = (0..instances)
            .map(|_| {
                (
                    pick(rng, &[0.0, 0.02, 0.1, 0.3]),
                    pick(rng, &[0.0, 0.1, 0.5]),
                )
            })
            .collect();
        let mut s = Scenario {
            instances,
            keys,
            backend_timeout,
            ttl: range_ms(rng, 300, 3000),
            grace: if rng.random_bool(0.5) {
                Duration::ZERO
            } else {
                range_ms(rng, 100, 2000)
            },
            jitter: if rng.random_bool(0.7) { 0.0 } else { 0.1 },
            beta: if rng.random_bool(0.5) { 0.0 } else { 1.0 },
            lease_ttl,
            longest_lease,
            max_load_time,
            wait,
            negative_ttl: rng.random_bool(0.4).then(|| range_ms(rng, 100, 500)),
            fail_safe: rng.random_bool(0.7),
            fail_safe_throttle: range_ms(rng, 100, 500),
            breaker: if rng.random_bool(0.1) {
                CircuitBreaker::disabled()
            } else {
                CircuitBreaker::new(rng.random_range(1..=5), range_ms(rng, 100, 1000))
            },
            strict: rng.random_bool(0.1),
            no_lease: false,
            l1: false,
            sync_bound: ms(250),
            process_of: (0..instances).collect(),
            tracking_losses: Vec::new(),
            fault_rates,
            death: None,
            dies_in_load: None,
            liveness: None,
            ops: Vec::new(),
        };
        let n_ops = rng.random_range(10..=40);
        let mut at = Duration::ZERO;
        for _ in 0..n_ops {
            at += match rng.random_range(0..10) {
                0..=2 => Duration::ZERO,
                3..=6 => range_ms(rng, 1, 50),
                _ => range_ms(rng, 50, 400),
            };
            let kind = match rng.random_range(0..10) {
                0 => OpKind::Get,
                1 if rng.random_bool(0.25) => OpKind::SetOther,
                1 => OpKind::Set,
                2 => OpKind::Invalidate,
                _ => {
                    let took = match rng.random_range(0..20) {
                        0..=3 => Some(Duration::ZERO),
                        4..=12 => Some(range_ms(rng, 1, 100)),
                        13..=17 => {
                            let hi = max_load_time.as_millis() as u64 * 6 / 5;
                            Some(range_ms(rng, 100, hi))
                        }
                        _ => None,
                    };
                    let result = match rng.random_range(0..20) {
                        0..=14 => LoadResult::Value,
                        15..=17 => LoadResult::Error,
                        _ => LoadResult::Panic,
                    };
                    OpKind::Fetch {
                        load: LoadSpec { took, result },
                    }
                }
            };
            // A fetch's caller drops its future now and then (its flight
            // runs on, detached). A `get`, `set` or `invalidate` runs in its
            // caller's task: dropped within one backend timeout, it may drop
            // a backend call under way, the breaker's half-open probe among
            // them (which must free the probe slot).
            let drop_after = match kind {
                OpKind::Fetch { .. } => rng.random_bool(0.1).then(|| range_ms(rng, 1, 500)),
                _ => rng
                    .random_bool(0.2)
                    .then(|| range_ms(rng, 1, backend_timeout.as_millis() as u64)),
            };
            s.ops.push(Op {
                at,
                inst: rng.random_range(0..instances),
                key: rng.random_range(0..keys),
                kind,
                drop_after,
                probe_hangs: rng.random_bool(0.5),
                past_l1: None,
                tags: 0,
            });
        }
        s.no_lease = rng.random_bool(0.1);
        if rng.random_bool(0.25) {
            let when = at.mul_f64(rng.random_range(0.0..0.8));
            s.death = Some((rng.random_range(0..instances), when));
        }
        // Drawn last: the rest of a seed's scenario is what it was before
        // the L1 existed.
        s.l1 = rng.random_bool(1.0 / 3.0);
        s.generate_foreign(seed, at, n_ops);
        s.generate_liveness(seed);
        s.generate_expires(seed, at, n_ops);
        s.generate_marks(seed, at, n_ops);
        s
    }

    /// The values' tags and the fleet's marks, from a stream of their own:
    /// the rest of a seed's scenario is what it was before they existed.
    /// Each fetch's value carries 0 to 2 of the [`TAGS`] tags, and so does
    /// each `set`'s (written with `set_tagged`) in one seed in two (else
    /// a plain `set`: untagged); `invalidate_tag`, `expire_tag` and `clear`
    /// come at random times (none in one seed in four), merged in by time
    /// after the other ops of the same instant, and are dropped now and
    /// then within one backend timeout, as other writes.
    fn generate_marks(&mut self, seed: u64, end: Duration, n_ops: usize) {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7A65_3A11_0C1E_A400);
        let rng = &mut rng;
        let tagged_sets = rng.random_bool(0.5);
        let draw_tags = |rng: &mut StdRng| {
            let mut tags = 0u8;
            for _ in 0..rng.random_range(0..=2) {
                tags |= 1 << rng.random_range(0..TAGS);
            }
            tags
        };
        for op in &mut self.ops {
            match op.kind {
                OpKind::Fetch { .. } => op.tags = draw_tags(rng),
                OpKind::Set if tagged_sets => op.tags = draw_tags(rng),
                _ => {}
            }
        }
        if rng.random_bool(0.25) {
            return;
        }
        let end_ms = end.as_millis() as u64;
        let timeout_ms = self.backend_timeout.as_millis() as u64;
        for _ in 0..rng.random_range(1..=(n_ops / 6).max(1)) {
            let op = match rng.random_range(0..10) {
                0..=4 => MarkOp {
                    hard: true,
                    tag: Some(rng.random_range(0..TAGS)),
                },
                5..=7 => MarkOp {
                    hard: false,
                    tag: Some(rng.random_range(0..TAGS)),
                },
                _ => MarkOp {
                    hard: true,
                    tag: None,
                },
            };
            self.ops.push(Op {
                at: ms(rng.random_range(0..=end_ms)),
                inst: rng.random_range(0..self.instances),
                key: 0,
                kind: OpKind::Mark(op),
                drop_after: rng.random_bool(0.2).then(|| range_ms(rng, 1, timeout_ms)),
                probe_hangs: rng.random_bool(0.5),
                past_l1: None,
                tags: 0,
            });
        }
        self.ops.sort_by_key(|op| op.at);
    }

    /// The fleet's `expire` calls, from a stream of their own: the rest of
    /// a seed's scenario is what it was before they existed (they are
    /// merged in by time, after the other ops of the same instant).
    fn generate_expires(&mut self, seed: u64, end: Duration, n_ops: usize) {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5EED_E4E1_2E00_0011);
        let rng = &mut rng;
        let end_ms = end.as_millis() as u64;
        let timeout_ms = self.backend_timeout.as_millis() as u64;
        for _ in 0..rng.random_range(0..=n_ops / 5) {
            self.ops.push(Op {
                at: ms(rng.random_range(0..=end_ms)),
                inst: rng.random_range(0..self.instances),
                key: rng.random_range(0..self.keys),
                kind: OpKind::Expire,
                // As a `get`, `set` or `invalidate`: dropped now and then
                // within one backend timeout.
                drop_after: rng.random_bool(0.2).then(|| range_ms(rng, 1, timeout_ms)),
                probe_hangs: rng.random_bool(0.5),
                past_l1: None,
                tags: 0,
            });
        }
        self.ops.sort_by_key(|op| op.at);
    }

    /// Whether the store watches lease holders, how often a watch loses
    /// its signal or judges a live holder frozen, and whether a death comes
    /// in a load: from a stream of its own, so the rest of a seed's
    /// scenario is what it was before.
    fn generate_liveness(&mut self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x1F1E_D00D_5EED_B0B0);
        let rng = &mut rng;
        if self.death.is_some() && rng.random_bool(0.5) {
            self.dies_in_load = Some(range_ms(rng, 0, 100));
        }
        if rng.random_bool(0.5) {
            self.liveness = Some(WatchRates {
                lost: pick(rng, &[0.0, 0.02, 0.1]),
                frozen: pick(rng, &[0.0, 0.02, 0.1]),
            });
        }
    }

    /// What came with the L1s fed by change reports and the foreign writer,
    /// from a stream of its own: the rest of a seed's scenario is what it
    /// was before (the foreign ops are merged in by time, after the fleet's
    /// ops of the same instant).
    fn generate_foreign(&mut self, seed: u64, end: Duration, n_ops: usize) {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0F0E_1A2B_3C4D_5E6F);
        let rng = &mut rng;
        let life = (self.ttl + self.grace).as_millis() as u64;
        let end_ms = end.as_millis() as u64;
        if self.l1 {
            self.sync_bound = ms(pick(rng, &[250, 500, 1000]));
            let paired_free = self.death.is_none_or(|(i, _)| i >= 2);
            if paired_free && rng.random_bool(0.5) {
                self.process_of = (0..self.instances).map(|i| i.saturating_sub(1)).collect();
            }
            for inst in 0..self.instances {
                if rng.random_bool(0.3) {
                    let from = ms(rng.random_range(0..=end_ms));
                    let lasts = range_ms(rng, 10, 500);
                    self.tracking_losses
                        .push((inst, from, lasts, rng.random_bool(0.5)));
                }
            }
        }
        for _ in 0..rng.random_range(0..=n_ops / 4) {
            let op = match rng.random_range(0..10) {
                0..=3 => ForeignOp::Set {
                    ttl: range_ms(rng, 1, life),
                },
                4 | 5 => ForeignOp::Delete,
                6 | 7 => ForeignOp::Expire {
                    ttl: range_ms(rng, 1, 200),
                },
                8 => ForeignOp::Expire {
                    ttl: range_ms(rng, life, 2 * life),
                },
                _ => ForeignOp::Expire {
                    ttl: Duration::from_secs(3600),
                },
            };
            self.ops.push(Op {
                at: ms(rng.random_range(0..=end_ms)),
                inst: 0,
                key: rng.random_range(0..self.keys),
                kind: OpKind::Foreign(op),
                drop_after: None,
                probe_hangs: false,
                past_l1: None,
                tags: 0,
            });
        }
        // Drawn after the foreign ops, which stay what they were.
        if self.l1 {
            for op in &mut self.ops {
                if matches!(op.kind, OpKind::Fetch { .. }) {
                    op.past_l1 = rng.random_bool(0.2).then_some(self.ttl);
                }
            }
        }
        self.ops.sort_by_key(|op| op.at);
    }

    /// Whether instances `a` and `b` are caches of one process.
    pub(crate) fn same_process(&self, a: usize, b: usize) -> bool {
        self.process_of[a] == self.process_of[b]
    }

    pub(crate) fn cache(&self, backend: Injector, variant: Variant) -> Cache<String, String> {
        let wait = if variant == Variant::WaiterNoDeadline {
            self.wait.deadline(Duration::from_secs(3600))
        } else {
            self.wait
        };
        let builder = Cache::builder()
            .namespace(NS)
            .backend(backend)
            .backend_timeout(self.backend_timeout)
            .ttl(self.ttl)
            .grace(self.grace)
            .jitter(self.jitter)
            .early_refresh_beta(self.beta)
            .lease_ttl(self.lease_ttl)
            .max_load_time(self.max_load_time)
            .wait(wait)
            .fail_safe(self.fail_safe)
            .fail_safe_throttle(self.fail_safe_throttle)
            .circuit_breaker(self.breaker)
            .strict(self.strict);
        let builder = if self.l1 {
            builder.l1(onefill::L1::new(64).sync_bound(self.sync_bound))
        } else {
            builder
        };
        let builder = if self.no_lease {
            builder.no_lease()
        } else {
            builder
        };
        let builder = if variant == Variant::NoReplay {
            builder.replay_queue_capacity(0)
        } else {
            builder
        };
        let builder = match self.negative_ttl {
            Some(ttl) => builder.negative_ttl(ttl),
            None => builder.no_negative_caching(),
        };
        builder.build().expect("valid scenario options")
    }

    /// Another version of the application on the same namespace, whose
    /// values (`Vec<u64>`) the fleet cannot read. It writes to the store
    /// directly (no faults; `run.rs` logs its writes).
    pub(crate) fn other_cache(&self, store: MemoryBackend) -> Cache<String, Vec<u64>> {
        Cache::builder()
            .namespace(NS)
            .backend(store)
            .ttl(self.ttl)
            .grace(self.grace)
            .jitter(self.jitter)
            .build()
            .expect("valid scenario options")
    }

    /// The foreign writer's way to valid bytes of the fleet's type: a cache
    /// of that type on a scratch store, whose stored bytes it copies.
    pub(crate) fn foreign_cache(&self, scratch: MemoryBackend) -> Cache<String, String> {
        Cache::builder()
            .namespace(NS)
            .backend(scratch)
            .ttl(self.ttl)
            .grace(self.grace)
            .no_l1()
            .build()
            .expect("valid scenario options")
    }

    /// The documented bound of a `fetch`: one backend timeout for the
    /// flight's backend calls, the wait deadline, the max load time.
    pub(crate) fn fetch_bound(&self) -> Duration {
        self.backend_timeout + self.wait.deadline + self.max_load_time + TICK
    }

    /// How long after an injected fault the breaker may still reject calls:
    /// the fault may surface one backend timeout later, open the circuit
    /// for `open_for`, and the probe then takes up to one timeout.
    pub(crate) fn breaker_window(&self) -> Duration {
        self.breaker.open_for + self.backend_timeout * 2 + TICK
    }

    /// How long after the healthy tail began every live instance's queue
    /// of failed writes is empty (decision 0017): a write under way then
    /// fails within one backend timeout; a tracking connection lost (an
    /// outage of its instance) may last 500 ms into the tail and open its
    /// breaker then; the breaker rejects the replays for its window; then
    /// the replay task's longest pause (1 s ±25 %), and the replays
    /// themselves, a few round trips of a healthy store.
    pub(crate) fn drain_bound(&self) -> Duration {
        self.backend_timeout + ms(500) + self.breaker_window() + ms(1250) + TICK
    }

    /// How long the run waits for the queues to drain before it gives up
    /// (the checker then reports them stuck).
    pub(crate) fn drain_patience(&self) -> Duration {
        self.drain_bound() * 4
    }

    /// The longest a value lives on the store after it is written (or, for
    /// a value never stored, after its load ended): its TTL (jitter only
    /// shortens it), plus the grace window.
    pub(crate) fn value_life(&self) -> Duration {
        // A fail-safe entry (the stale value re-stored after a failed load)
        // is written for the throttle period, which may exceed the TTL
        // (seed 515751: ttl 359 ms, throttle 469 ms).
        let written_for = if self.fail_safe {
            self.ttl.max(self.fail_safe_throttle)
        } else {
            self.ttl
        };
        written_for + self.grace
    }

    /// How long before a degraded load a fault of its process can explain
    /// it.
    pub(crate) fn degrade_window(&self) -> Duration {
        self.breaker_window() + self.wait.deadline
    }
}
