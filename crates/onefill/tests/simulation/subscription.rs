//! Fill notifications through the fault injector: dropped, delayed or
//! duplicated, as the instance's seeded stream decides.

use std::sync::atomic::Ordering;

use async_trait::async_trait;
use onefill::backend::FillSubscription;
use rand::RngExt;
use tokio::time::Instant;

use crate::events::{Ev, NotifyFault};
use crate::injector::{frozen_if_dead, Injector};
use crate::scenario::ms;

impl Injector {
    pub(crate) fn decide_notify(&self) -> Option<NotifyFault> {
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
}

/// A fill subscription whose notifications are dropped, delayed or
/// duplicated. A delayed one survives its caller's `select!` dropping the
/// future: the next call finishes the delay.
pub(crate) struct Subscription {
    inner: Box<dyn FillSubscription>,
    injector: Injector,
    duplicate: bool,
    delayed_until: Option<Instant>,
}

impl Subscription {
    pub(crate) fn new(inner: Box<dyn FillSubscription>, injector: Injector) -> Self {
        Subscription {
            inner,
            injector,
            duplicate: false,
            delayed_until: None,
        }
    }
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
