//! A cluster holder's names: one per master it holds leases on, each
//! with a presence channel in that master's first slot (see the module
//! docs), and the check that a name's channel is counted where waiters
//! ask before a token names it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;

use super::super::cluster::{slot_of, tag_in};
use super::{Liveness, Publisher};

impl Liveness {
    /// Names this backend on the masters `first` lists that it has no name
    /// on (a name per master: the id and a tag in the master's first
    /// slot), and returns the new names.
    pub(super) fn name_masters(&self, first: &[(u64, u16)]) -> Vec<String> {
        let mut names = self.names.lock();
        let mut new = Vec::new();
        for &(shard, slot) in first {
            if names.contains_key(&shard) {
                continue;
            }
            let name = format!("{}_{}", self.id, tag_in(slot));
            names.insert(shard, name.clone());
            new.push(name);
        }
        new
    }

    /// [`name_masters`](Self::name_masters), the new names' presence
    /// channels subscribed in the background.
    ///
    /// A new name is checked before a token names it: a master seen in the
    /// middle of a failover may be known to this backend before the
    /// driver that routes the subscriptions knows it, which then lands on
    /// the demoted master, now a replica, whose subscriptions the new
    /// master's publish does not count.
    pub(super) fn name_new_masters(self: &Arc<Self>, first: Vec<(u64, u16)>) {
        let new = self.name_masters(&first);
        if new.is_empty() {
            return;
        }
        self.unverified.lock().extend(new.iter().cloned());
        let liveness = Arc::downgrade(self);
        tokio::spawn(async move {
            for name in new {
                let Some(live) = liveness.upgrade() else {
                    return;
                };
                live.present_as(name).await;
            }
            let mut pause = VERIFY_AFTER;
            for _ in 0..VERIFY_TRIES {
                tokio::time::sleep(pause).await;
                let Some(live) = liveness.upgrade() else {
                    return;
                };
                if live.verify().await {
                    return;
                }
                pause = (pause * 2).min(VERIFY_MAX);
            }
        });
    }
}

/// The first pause after a change of a cluster's slot map before a
/// holder checks its presence channels: the same change makes the driver
/// refresh its own slot map, which routes the subscriptions.
const VERIFY_AFTER: Duration = Duration::from_millis(100);
/// The longest pause between two checks of a presence not counted yet.
const VERIFY_MAX: Duration = Duration::from_secs(1);
/// How many times a new name is checked before it is left anonymous (its
/// subscription refused, say); the next change of the slot map checks it
/// again.
const VERIFY_TRIES: u32 = 30;

/// Cluster: after every change of the slot map, each presence channel of
/// the holder is checked where waiters ask (a publish on its slot's master
/// counts its receivers) and subscribed again while it is not counted
/// there. A graceful failover leaves the holder's sharded subscription on
/// the demoted master, now a replica, which still hears what the new
/// master publishes but is not counted by it: every waiter asking there
/// would find the holder dead and take over live loads. Tokens on an
/// unchecked name are anonymous meanwhile.
pub(super) async fn verify_presence(
    liveness: Weak<Liveness>,
    mut changes: watch::Receiver<(u64, u16)>,
) {
    while changes.changed().await.is_ok() {
        'check: loop {
            {
                let Some(live) = liveness.upgrade() else {
                    return;
                };
                let moved = live.moved_names();
                let mut unverified = live.unverified.lock();
                unverified.extend(moved);
                if unverified.is_empty() {
                    // Slots moved, but none of a presence channel's.
                    break 'check;
                }
            }
            let mut pause = VERIFY_AFTER;
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        continue 'check;
                    }
                    () = tokio::time::sleep(pause) => {}
                }
                let Some(live) = liveness.upgrade() else {
                    return;
                };
                if live.verify().await {
                    break 'check;
                }
                pause = (pause * 2).min(VERIFY_MAX);
            }
        }
    }
}

impl Liveness {
    /// The names whose presence channel's slot is served now by another
    /// master than the one they were given for (a failover or a migration
    /// moved it): whether its subscription is counted there is to be
    /// checked. Other changes of the slot map leave a holder's names alone.
    /// The masters that serve no slot any more are forgotten (a new one
    /// is named at its first lease).
    fn moved_names(&self) -> Vec<String> {
        let Publisher::Cluster(router) = &self.conn else {
            return Vec::new();
        };
        let mut names = self.names.lock();
        let moved = names
            .iter()
            .filter(|(shard, name)| {
                let tag = name.split_once('_').map_or("", |(_, tag)| tag);
                router.shard_of(slot_of(tag.as_bytes())) != **shard
            })
            .map(|(_, name)| name.clone())
            .collect();
        names.retain(|shard, _| router.serves_keys(*shard));
        moved
    }

    /// One round of [`verify_presence`]: each unchecked name's presence
    /// published to where waiters ask; counted, it is checked; not counted,
    /// subscribed again. Whether every name is checked now.
    async fn verify(&self) -> bool {
        let unverified: Vec<String> = self.unverified.lock().iter().cloned().collect();
        for name in unverified {
            match self.self_check(&name).await {
                None | Some((_, Ok(1..))) => {
                    self.unverified.lock().remove(&name);
                }
                Some((presence, Ok(_))) => self.pubsub.resubscribe(&presence),
                // Its master does not answer: asked again later.
                Some((_, Err(_))) => {}
            }
        }
        self.unverified.lock().is_empty()
    }
}
