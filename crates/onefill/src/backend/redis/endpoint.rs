//! A standalone server reached through a plain URL
//! ([`connect`](RedisBackend::connect)), and
//! following that URL when its server changes behind it: a managed
//! service's primary endpoint, whose name moves to the promoted replica at
//! a failover, or a proxy that sends new connections to another server.
//!
//! New connections through the URL reach the new primary; connections made
//! before go on talking to the old one, which is now a replica that
//! refuses every write with `READONLY` and answers reads with what it
//! replicates. The driver reconnects only a connection that fails, and
//! these do not fail. So a call refused with `READONLY` makes the backend
//! look again (at most every [`COOLDOWN`]): if its command connection's
//! server answers `ROLE` as anything but a master, it opens new
//! connections through the URL, and once their server answers as a master
//! they replace the old ones, as a Sentinel follower's switch does (the
//! push connections follow at once, so the fill notifications, the
//! holders' presence and the L1's tracking move too; the L1 empties; the
//! new connections are a shard, and a circuit breaker, of their own). A
//! URL that still leads to a replica (the name has not moved yet) is tried
//! again with a backoff while the calls keep meeting `READONLY`.
//!
//! A server that fails or hangs is no sign of a failover here: its
//! connections fail, and the driver reconnects them through the same URL.
//!
//! `ROLE` needs the ACL's `+role`; without it a `READONLY` is taken at its
//! word (the new connections are used unverified, and a URL that still
//! leads to a replica meets the next `READONLY` and is looked at again).

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::Client;
use tokio::time::Instant;

use super::connect::command_connection;
use super::errors::classify;
use super::options::{open_client, RedisOptions};
use super::primary::{answers_as_master, closed, Commands, Followed, Following, Primary};
use super::push;
use super::server_clock::ServerClock;
use super::urls::redact;
use super::RedisBackend;
use crate::backoff::Backoff;
use crate::error::{BackendError, BackendErrorKind};

impl RedisBackend {
    /// Connects to a standalone Redis with the default [`RedisOptions`].
    ///
    /// `url` is a redis-rs connection URL: `redis://[user:password@]host[:port][/db]`
    /// (or `redis+unix:///path`). Fails if the server cannot be reached, or
    /// if the URL is malformed (the error says what is wrong with it,
    /// without quoting it).
    pub async fn connect(url: &str) -> Result<RedisBackend, BackendError> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to a standalone Redis with the given options.
    pub async fn connect_with(
        url: &str,
        options: RedisOptions,
    ) -> Result<RedisBackend, BackendError> {
        let client = open_client(url, &options)?;
        let commands = command_connection(&client, &options).await?;
        let resp3 = push::resp3(&client).map_err(|e| classify("connect", e))?;
        let followed = Followed::new(Following::Endpoint, commands, resp3, redact(url));
        let clock = Arc::new(ServerClock::default());
        let backend = Self::standalone(
            Primary::new(followed.clone()),
            options.clone(),
            redact(url),
            clock.clone(),
        )
        .await?;
        tokio::spawn(follow_endpoint(
            client,
            options,
            Arc::downgrade(&followed),
            Arc::downgrade(&clock),
        ));
        Ok(backend)
    }
}

/// The least time between two looks.
const COOLDOWN: Duration = Duration::from_millis(50);
/// The longest pause between two tries while the URL still leads to a
/// replica.
const RETRY_MAX: Duration = Duration::from_secs(1);

/// What a look found.
enum Look {
    /// The current connection's server is a master (or did not answer:
    /// the driver's to reconnect): nothing to do.
    Primary,
    /// Moved to the URL's new server (`verified`: it answered `ROLE` as
    /// a master).
    Moved { verified: bool },
    /// The current server is not a master, and the URL does not lead to
    /// one yet.
    NotYet,
}

/// The follower of a plain URL (see the module docs); ends with its
/// backend.
async fn follow_endpoint(
    client: Client,
    options: RedisOptions,
    followed: Weak<Followed>,
    clock: Weak<ServerClock>,
) {
    // No strong reference while waiting: the backend's drop closes
    // `epochs` and ends the follower at once.
    let Some((suspicion, mut epochs)) = followed
        .upgrade()
        .map(|strong| (strong.suspicion(), strong.epochs()))
    else {
        return;
    };
    let mut again = Backoff::new(COOLDOWN, RETRY_MAX);
    let mut retry_at: Option<Instant> = None;
    // The next look comes no sooner than this: the cooldown after a look,
    // longer (the backoff's) after a move made without `ROLE` to confirm
    // it, so a URL that still leads to a replica is not moved to again
    // and again.
    let mut not_before = Instant::now();
    loop {
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = suspicion.notified() => {}
            () = retry => {}
            () = closed(&mut epochs) => return,
        }
        tokio::time::sleep_until(not_before).await;
        let Some(strong) = followed.upgrade() else {
            return;
        };
        let look = look(&client, &options, &strong).await;
        if !matches!(look, Look::Moved { .. }) {
            strong.stayed();
        }
        drop(strong);
        not_before = Instant::now() + COOLDOWN;
        match look {
            Look::Primary | Look::Moved { verified: true } => {
                retry_at = None;
                again.reset();
            }
            Look::Moved { verified: false } => {
                retry_at = None;
                not_before = Instant::now() + again.next_interval();
            }
            Look::NotYet => retry_at = Some(Instant::now() + again.next_interval()),
        }
        if matches!(look, Look::Moved { .. }) {
            if let Some(clock) = clock.upgrade() {
                clock.start_over();
            }
        }
    }
}

/// One look: is the current server still the primary; if not, does the
/// URL lead to one now (then move there).
async fn look(client: &Client, options: &RedisOptions, followed: &Followed) -> Look {
    let current = followed.current();
    // Every connection of the primary: the writes that wait for replicas
    // have one of their own, which can be left on the old server while the
    // other reconnected to the new one.
    let connections = std::iter::once(&current.commands.manager).chain(&current.commands.durable);
    let mut demoted = false;
    for conn in connections {
        let mut conn = conn.clone();
        let role = answers_as_master(&mut conn, "endpoint: role", options.response_timeout).await;
        match role {
            Ok(false) => demoted = true,
            // An ACL without `ROLE`: the `READONLY` that asked for this
            // look is taken at its word.
            Err(e) if e.kind() == BackendErrorKind::NotPermitted => demoted = true,
            // A master, or a server that does not answer (the driver's to
            // reconnect).
            _ => {}
        }
    }
    if !demoted {
        return Look::Primary;
    }
    match open(client, options).await {
        Ok(Some((commands, verified))) => {
            let resp3 = match push::resp3(client) {
                Ok(resp3) => resp3,
                Err(_) => return Look::NotYet,
            };
            let epoch = followed.switch(commands, resp3, current.addr.clone());
            tracing::warn!(
                endpoint = %current.addr,
                epoch,
                verified,
                "the server behind the URL is no longer the primary: connections moved to \
                 the one it leads to now, the L1 emptied"
            );
            Look::Moved { verified }
        }
        Ok(None) => Look::NotYet,
        Err(e) => {
            tracing::debug!(error = %e, "endpoint: new connections could not be opened");
            Look::NotYet
        }
    }
}

/// New command connections through the URL (each bounded by the connect
/// deadline, the scripts loaded), if their server answers as a master,
/// and whether it said so (`false`: `ROLE` refused by the ACL).
async fn open(
    client: &Client,
    options: &RedisOptions,
) -> Result<Option<(Commands, bool)>, BackendError> {
    let commands = command_connection(client, options).await?;
    let mut conn = commands.manager.clone();
    match answers_as_master(&mut conn, "endpoint: role", options.response_timeout).await {
        Ok(master) => Ok(master.then_some((commands, true))),
        // Unverified without `ROLE`: if the URL still leads to a replica,
        // the next `READONLY` asks for another look.
        Err(e) if e.kind() == BackendErrorKind::NotPermitted => Ok(Some((commands, false))),
        Err(e) => Err(e),
    }
}
