//! A waiter's watch of one holder: its beats, and when they are late, a
//! question on its presence channel (see the module docs).

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::publisher::Publisher;
use super::{BEAT, BEAT_SLACK, FROZEN_AFTER};
use crate::backend::redis::subscriber::RedisSubscription;
use crate::backend::{FillSubscription, Gone, HolderWatch};

/// A waiter's watch of one holder.
pub(super) struct Watching {
    beats: RedisSubscription,
    presence: String,
    /// What it publishes there: the lease it waits on.
    ask: String,
    conn: Publisher,
    response_timeout: Duration,
    last_beat: Instant,
    /// Asked the holder's presence since its last beat (it was there).
    asked_since_beat: bool,
}

impl Watching {
    /// A watch of the holder whose `beats` this waiter hears (subscribed),
    /// who was present on `presence` when asked `ask`.
    pub(super) fn new(
        beats: RedisSubscription,
        presence: String,
        ask: String,
        conn: Publisher,
        response_timeout: Duration,
    ) -> Watching {
        Watching {
            beats,
            presence,
            ask,
            conn,
            response_timeout,
            last_beat: Instant::now(),
            asked_since_beat: false,
        }
    }

    /// Whether the holder's connection is still subscribed to its presence
    /// channel (`None`: the server did not answer).
    async fn present(&self) -> Option<bool> {
        let asked = self
            .conn
            .publish(
                "watch holder",
                &self.presence,
                &self.ask,
                self.response_timeout,
            )
            .await;
        asked.ok().map(|receivers| receivers > 0)
    }
}

#[async_trait]
impl HolderWatch for Watching {
    async fn gone(&mut self) -> Option<Gone> {
        loop {
            let due = if self.asked_since_beat {
                self.last_beat + FROZEN_AFTER
            } else {
                self.last_beat + BEAT + BEAT_SLACK
            };
            tokio::select! {
                () = self.beats.notified() => {
                    if self.beats.is_confirmed() {
                        self.last_beat = Instant::now();
                        self.asked_since_beat = false;
                    }
                    continue;
                }
                () = tokio::time::sleep_until(due) => {}
            }
            // Woken a beat or more after it was due: this process was not
            // running (a blocked executor, a stalled machine), so the beats
            // that came meanwhile may not have been read yet. Its own stall
            // is no silence of the holder's: listen afresh.
            if Instant::now() >= due + BEAT {
                self.last_beat = Instant::now();
                self.asked_since_beat = false;
                continue;
            }
            // Silence is a verdict only if the beats could have come.
            if !self.beats.is_confirmed() {
                return None;
            }
            if self.asked_since_beat {
                // The holder was there when asked, and no beat came since:
                // unless the beats were lost on the way here, a connection
                // of ours gone half-open (nothing failed, nothing arrives).
                // A `PING` on it answered comes after every beat sent
                // before it; unanswered, the connection is replaced and
                // this watch cannot tell.
                if !self.beats.delivers().await {
                    return None;
                }
                return Some(Gone::Frozen);
            }
            match self.present().await {
                Some(true) => self.asked_since_beat = true,
                Some(false) => return Some(Gone::Dead),
                None => return None,
            }
        }
    }
}
