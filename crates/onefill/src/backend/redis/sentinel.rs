//! A standalone backend under Redis Sentinel: the primary is found by
//! asking the sentinels, and followed across failovers (decision 0019).
//!
//! - **Finding the primary.** Every sentinel is asked `SENTINEL MASTER
//!   <name>` at once, each within the response timeout; the answer with the
//!   highest config epoch names the primary (the epoch of the latest
//!   failover is what the sentinels themselves go by, so a sentinel cut off
//!   from the others cannot name an old primary over it), and that server
//!   must answer `ROLE` with `master` before it is used.
//! - **Following it.** A task per sentinel keeps a RESP3 connection
//!   subscribed to `+switch-master`; the follower looks again when one
//!   arrives for our primary's name, when a call meets a sign of a dead or
//!   demoted primary (a connection failure, a timeout, `READONLY`: see
//!   [`Primary::saw`]), at most every [`COOLDOWN`], when a sentinel's
//!   subscription is (re)made (it may have missed the message), and every
//!   [`RECHECK_EVERY`] anyway.
//! - **Moving.** A new primary gets a new command connection (scripts
//!   loaded); the push connections move to it at once (the subscriber
//!   subscribes its channels again and wakes their waiters; the L1's
//!   tracking reconnects, which empties the L1 and forgets the marks it
//!   held: writes the old primary acknowledged may be lost); the estimate
//!   of the server's clock starts over; and calls go to a new shard, so the
//!   circuit breaker the old primary opened stays behind with it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, PushKind, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tokio::sync::watch;
use tokio::time::Instant;

use super::connect::command_connection;
use super::errors::with_deadline;
use super::options::{check_url_and_tls, connect_deadline, open_client, RedisOptions};
use super::primary::{answers_as_master, closed, Commands, Followed, Following, Primary};
use super::push::{self, Due, Names, PushConnection};
use super::server_clock::ServerClock;
use super::urls::redact;
use super::RedisBackend;
use crate::backoff::Backoff;
use crate::error::{BackendError, BackendErrorKind};

/// The least time between two looks at the sentinels that calls asked for.
const COOLDOWN: Duration = Duration::from_millis(250);

/// The first pause before looking again when a look made on a
/// `+switch-master` did not find the announced primary ready (it answers
/// `ROLE` as a master a moment after the announcement): a call made
/// meanwhile may be waiting on a primary that is gone.
const ANNOUNCED_RETRY: Duration = Duration::from_millis(25);

/// A look at the sentinels even when nothing asked for one: a
/// `+switch-master` lost while every subscription was down is found by
/// then.
const RECHECK_EVERY: Duration = Duration::from_secs(5);

/// How to reach the servers the sentinels name, and the timeouts of both
/// (for [`RedisBackend::connect_sentinel_with`]).
///
/// The sentinels' own credentials and TLS are in their URLs
/// (`redis://user:password@host:26379`, `rediss://…`); the data nodes' are
/// set here, since the sentinels name only their address. The
/// [`RedisOptions`] apply to every connection, to sentinels and data nodes
/// alike (their TLS certificates too).
///
/// ```
/// use std::time::Duration;
/// use onefill::redis::{RedisOptions, SentinelOptions};
///
/// let options = SentinelOptions::new()
///     .password("data-node-secret")
///     .db(2)
///     .redis_options(RedisOptions::new().response_timeout(Duration::from_millis(300)));
/// # drop(options);
/// ```
#[derive(Clone, Default)]
pub struct SentinelOptions {
    redis: RedisOptions,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    tls: bool,
}

impl std::fmt::Debug for SentinelOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelOptions")
            .field("redis", &self.redis)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .field("tls", &self.tls)
            .finish()
    }
}

impl SentinelOptions {
    /// The defaults: [`RedisOptions::default`], no credentials, database
    /// 0, no TLS to the data nodes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Timeouts, reconnection and TLS certificates, for every connection.
    pub fn redis_options(mut self, options: RedisOptions) -> Self {
        self.redis = options;
        self
    }

    /// The data nodes' ACL user name (with [`password`](Self::password)).
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// The data nodes' password (`requirepass`, or the ACL user's).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// The database on the data nodes.
    pub fn db(mut self, db: i64) -> Self {
        self.db = db;
        self
    }

    /// TLS to the data nodes (`rediss://`; needs the `tls` feature). The
    /// sentinels' TLS is their URLs' scheme.
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// The URL of the data node at `host:port`, with these credentials.
    fn node_url(&self, host: &str, port: u16) -> Result<String, BackendError> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let bad = |what: &str| {
            BackendError::new(
                BackendErrorKind::Protocol,
                format!("sentinel: the primary's address is not usable ({what})"),
            )
        };
        let mut url =
            url::Url::parse(&format!("{scheme}://localhost")).map_err(|_| bad("scheme"))?;
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        url.set_host(Some(&host)).map_err(|_| bad("host"))?;
        url.set_port(Some(port)).map_err(|_| bad("port"))?;
        if let Some(username) = &self.username {
            url.set_username(username).map_err(|_| bad("user name"))?;
        }
        if let Some(password) = &self.password {
            url.set_password(Some(password))
                .map_err(|_| bad("password"))?;
        }
        url.set_path(&self.db.to_string());
        Ok(url.into())
    }
}

impl RedisBackend {
    /// Connects to the primary that the Redis Sentinel deployment at
    /// `sentinels` names `master_name`, and follows it across failovers
    /// (see [`SentinelOptions`] for credentials and the module docs'
    /// [Sentinel](crate::redis#sentinel) section for what a failover costs).
    ///
    /// `sentinels` are some or all of the sentinels
    /// (`redis://[user:password@]host:port`). Fails if no sentinel answers,
    /// none knows `master_name`, or the primary they name cannot be
    /// reached.
    pub async fn connect_sentinel(
        sentinels: &[&str],
        master_name: &str,
    ) -> Result<RedisBackend, BackendError> {
        Self::connect_sentinel_with(sentinels, master_name, SentinelOptions::default()).await
    }

    /// [`connect_sentinel`](Self::connect_sentinel) with the given options.
    pub async fn connect_sentinel_with(
        sentinels: &[&str],
        master_name: &str,
        options: SentinelOptions,
    ) -> Result<RedisBackend, BackendError> {
        if sentinels.is_empty() {
            return Err(BackendError::new(
                BackendErrorKind::Command,
                "connect_sentinel: no sentinel given",
            ));
        }
        let clients = sentinels
            .iter()
            .map(|url| {
                check_url_and_tls(url)?;
                open_client(url, &options.redis)
            })
            .collect::<Result<Vec<Client>, BackendError>>()?;
        let mut finder = Finder {
            name: master_name.to_owned(),
            sentinels: clients.iter().cloned().map(|c| (c, None)).collect(),
            options: options.clone(),
        };
        let found = with_deadline_error(
            connect_deadline(&options.redis),
            finder.find(),
            "connect_sentinel: no primary found in time",
        )
        .await?;
        let opened = finder.open(&found).await?;
        let followed = Followed::new(
            Following::Sentinel,
            opened.commands,
            opened.resp3,
            found.addr(),
        );
        let clock = Arc::new(ServerClock::default());
        let target = format!(
            "sentinel {master_name} at {}",
            sentinels
                .iter()
                .map(|u| redact(u))
                .collect::<Vec<_>>()
                .join(",")
        );
        let backend = RedisBackend::standalone(
            Primary::new(followed.clone()),
            options.redis.clone(),
            target,
            clock.clone(),
        )
        .await?;
        let (heard_tx, heard) = unbounded_channel();
        for client in clients {
            let resp3 = push::resp3(&client).map_err(|e| super::errors::classify("connect", e))?;
            tokio::spawn(listen(
                resp3,
                options.redis.clone(),
                master_name.to_owned(),
                heard_tx.clone(),
                followed.epochs(),
            ));
        }
        tokio::spawn(follow(
            finder,
            Arc::downgrade(&followed),
            Arc::downgrade(&clock),
            heard,
        ));
        Ok(backend)
    }
}

/// `fut` within `limit`, else a timeout saying `message`.
async fn with_deadline_error<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, BackendError>>,
    message: &'static str,
) -> Result<T, BackendError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(answer) => answer,
        Err(_) => Err(BackendError::new(BackendErrorKind::Timeout, message)),
    }
}

/// A primary as the sentinels name it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Found {
    host: String,
    port: u16,
    /// The config epoch it was named in.
    epoch: u64,
    /// The sentinel deems it down (`s_down`/`o_down`): not to be used.
    down: bool,
}

impl Found {
    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// A new primary's connections.
struct Opened {
    commands: Commands,
    resp3: Client,
}

/// Asks the sentinels which server is the primary.
struct Finder {
    name: String,
    /// Each sentinel, and its connection once opened.
    sentinels: Vec<(Client, Option<MultiplexedConnection>)>,
    options: SentinelOptions,
}

impl Finder {
    /// Asks every sentinel at once; the answer of the highest config epoch
    /// wins, once its server says it is a master.
    async fn find(&mut self) -> Result<Found, BackendError> {
        let options = &self.options.redis;
        let name = self.name.as_str();
        let answers = futures_util::future::join_all(
            self.sentinels
                .iter_mut()
                .map(|(client, conn)| ask_sentinel(client, conn, name, options)),
        )
        .await;
        let mut named: Vec<Found> = Vec::new();
        let mut last_error = None;
        let mut seen_down = false;
        for answer in answers {
            match answer {
                Ok(Some(found)) if found.down => seen_down = true,
                Ok(Some(found)) => named.push(found),
                Ok(None) => {}
                Err(e) => last_error = Some(e),
            }
        }
        // The highest epoch; among equals, the address most named.
        let best = named
            .iter()
            .max_by_key(|f| (f.epoch, named.iter().filter(|g| *g == *f).count()))
            .cloned();
        let Some(best) = best else {
            // A primary the sentinels see down is a failover to wait for
            // (transient), not a name they do not know.
            if seen_down {
                return Err(BackendError::new(
                    BackendErrorKind::Connection,
                    format!(
                        "sentinel: the primary of `{name}` is down (a failover may be under way)"
                    ),
                ));
            }
            return Err(last_error.unwrap_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Command,
                    format!("sentinel: no sentinel names a primary of `{name}` that is up"),
                )
            }));
        };
        if self.is_master(&best).await? {
            Ok(best)
        } else {
            Err(BackendError::new(
                BackendErrorKind::Busy,
                format!(
                    "sentinel: {} is named the primary of `{name}` but is not a master (yet)",
                    best.addr()
                ),
            ))
        }
    }

    /// Whether the server at `found` answers `ROLE` as a master.
    async fn is_master(&self, found: &Found) -> Result<bool, BackendError> {
        let client = self.client_of(found)?;
        let options = &self.options.redis;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connection_timeout))
            .set_response_timeout(Some(options.response_timeout));
        let limit = options
            .connection_timeout
            .saturating_add(options.response_timeout);
        let mut conn = with_deadline(
            "sentinel: primary's role",
            limit,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await?;
        answers_as_master(
            &mut conn,
            "sentinel: primary's role",
            options.response_timeout,
        )
        .await
    }

    fn client_of(&self, found: &Found) -> Result<Client, BackendError> {
        let url = self.options.node_url(&found.host, found.port)?;
        open_client(&url, &self.options.redis)
    }

    /// The connections of the primary at `found`.
    async fn open(&self, found: &Found) -> Result<Opened, BackendError> {
        let client = self.client_of(found)?;
        let commands = command_connection(&client, &self.options.redis).await?;
        let resp3 = push::resp3(&client).map_err(|e| super::errors::classify("connect", e))?;
        Ok(Opened { commands, resp3 })
    }
}

/// One sentinel's `SENTINEL MASTER <name>`: the primary it names and the
/// config epoch; `None` if it does not know the name (or its answer is
/// unusable).
async fn ask_sentinel(
    client: &Client,
    conn: &mut Option<MultiplexedConnection>,
    name: &str,
    options: &RedisOptions,
) -> Result<Option<Found>, BackendError> {
    if conn.is_none() {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connection_timeout))
            .set_response_timeout(Some(options.response_timeout));
        let limit = options
            .connection_timeout
            .saturating_add(options.response_timeout);
        *conn = Some(
            with_deadline(
                "sentinel connect",
                limit,
                client.get_multiplexed_async_connection_with_config(&config),
            )
            .await?,
        );
    }
    let Some(c) = conn.as_mut() else {
        return Ok(None);
    };
    let asked = with_deadline(
        "sentinel master",
        options.response_timeout,
        redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query_async::<Value>(c),
    )
    .await;
    let answer = match asked {
        Ok(answer) => answer,
        Err(e) => {
            // A server error (an unknown name) leaves the connection good;
            // anything else drops it, to be opened again next time.
            if e.is_transient() {
                *conn = None;
            }
            return match e.kind() {
                BackendErrorKind::Command => Ok(None),
                _ => Err(e),
            };
        }
    };
    Ok(parse_master(answer))
}

/// The fields of a `SENTINEL MASTER` answer (a flat array in RESP2, a map
/// in RESP3) that name the primary.
fn parse_master(answer: Value) -> Option<Found> {
    let pairs: Vec<(String, String)> = match answer {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((text(k)?, text(v)?)),
                _ => None,
            })
            .collect(),
        Value::Map(items) => items
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => return None,
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    // A primary the sentinel itself deems down is not to be used.
    let down = field("flags").is_some_and(|f| f.split(',').any(|f| f == "o_down" || f == "s_down"));
    Some(Found {
        down,
        host: field("ip")?.to_owned(),
        port: field("port")?.parse().ok()?,
        epoch: field("config-epoch")
            .and_then(|e| e.parse().ok())
            .unwrap_or(0),
    })
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// What a sentinel's listener heard.
enum Heard {
    /// `+switch-master` for our primary's name, to this address.
    Switched(String),
    /// Subscribed (again): a switch may have been missed meanwhile.
    Subscribed,
}

/// One sentinel's `+switch-master` subscription, for as long as the
/// backend lives.
async fn listen(
    client: Client,
    options: RedisOptions,
    name: String,
    heard: UnboundedSender<Heard>,
    mut epochs: watch::Receiver<u64>,
) {
    const CHANNEL: &str = "+switch-master";
    let names = Names {
        connect: "sentinel subscriber connect",
        ping: "sentinel subscriber ping",
    };
    let (every, timeout) = (options.ping_interval, options.response_timeout);
    let mut conn = PushConnection::new(client, options, names, every, timeout).ping_when_quiet();
    loop {
        // Ends as soon as the backend is dropped (its epochs close).
        let due = tokio::select! {
            due = conn.due() => due,
            () = closed(&mut epochs) => return,
        };
        match due {
            Due::Connect => {
                if conn.connect().await.is_err() {
                    continue;
                }
                let subscribed = match conn.conn() {
                    Some(c) => with_deadline("sentinel subscribe", timeout, c.subscribe(CHANNEL))
                        .await
                        .is_ok(),
                    None => false,
                };
                if !subscribed {
                    conn.lost();
                } else if heard.send(Heard::Subscribed).is_err() {
                    return;
                }
            }
            Due::Push(push) => {
                if push.kind == PushKind::Message {
                    if let Some(to) = switched(&push.data, &name) {
                        if heard.send(Heard::Switched(to)).is_err() {
                            return;
                        }
                    }
                }
            }
            Due::Ping => {
                // A switch announced while the `PING` is out is told too.
                let mut told = Vec::new();
                let _ = conn
                    .ping(|push| {
                        if push.kind == PushKind::Message {
                            told.extend(switched(&push.data, &name));
                        }
                    })
                    .await;
                for to in told {
                    if heard.send(Heard::Switched(to)).is_err() {
                        return;
                    }
                }
            }
            Due::Lost => {}
        }
    }
}

/// The new primary's `host:port`, if a `+switch-master` message
/// (`[channel, "<name> <old ip> <old port> <new ip> <new port>"]`) is
/// about `name`.
fn switched(data: &[Value], name: &str) -> Option<String> {
    let message = data.get(1).and_then(text)?;
    let mut words = message.split(' ');
    if words.next() != Some(name) {
        return None;
    }
    let (host, port) = (words.nth(2)?, words.next()?);
    Some(format!("{host}:{port}"))
}

/// What came first: the work, or a switch announced meanwhile.
enum Announced<T> {
    /// The work's answer; no other switch was announced meanwhile.
    Not(T),
    /// `+switch-master` to this address came first: the work was dropped.
    Switched(String),
    /// Every sentinel listener ended (the backend is gone).
    Gone,
}

/// `work` (a look, or opening the primary found), given up for a switch
/// announced while it runs. A look can wait on a hung primary: the
/// sentinels go on naming it until they agree it is down, and its `ROLE`
/// is asked on a new connection, which a stopped server accepts and then
/// never answers (up to the connection timeout). The announcement that
/// ends the outage must not wait behind that look. A switch to
/// `heading_to` (the address the work already goes for) does not stop it:
/// every sentinel announces the same switch, and each repeat would
/// otherwise start the move over. A sentinel's subscription made again
/// meanwhile sets `missed`: it may have missed a switch the work did not
/// see, so the next look is due at once.
async fn unless_announced<T>(
    heard: &mut tokio::sync::mpsc::UnboundedReceiver<Heard>,
    heading_to: Option<&str>,
    missed: &mut bool,
    work: impl std::future::Future<Output = T>,
) -> Announced<T> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return Announced::Not(done),
            h = heard.recv() => match h {
                Some(Heard::Switched(to)) if heading_to == Some(to.as_str()) => {}
                Some(Heard::Switched(to)) => return Announced::Switched(to),
                Some(Heard::Subscribed) => *missed = true,
                None => return Announced::Gone,
            },
        }
    }
}

/// The follower's next look after a `+switch-master` to `to` that stopped
/// the work under way: at once, and its looks after it start over from a
/// short pause (see the announcement's branch in [`follow`]).
fn look_at_announced(to: String) -> (Option<String>, Option<Instant>, Backoff) {
    let again = Backoff::new(ANNOUNCED_RETRY, RECHECK_EVERY);
    (Some(to), Some(Instant::now()), again)
}

/// The follower: looks at the sentinels when told to (see the module
/// docs) and moves the backend to a new primary.
async fn follow(
    mut finder: Finder,
    followed: Weak<Followed>,
    clock: Weak<ServerClock>,
    mut heard: tokio::sync::mpsc::UnboundedReceiver<Heard>,
) {
    let mut last_look = Instant::now();
    // A look that must be made again: it failed, or a switch was announced
    // that the sentinels asked did not show yet (the promoted replica may
    // not answer as a master at once, and the old primary can go on
    // answering as one for seconds: nothing else would tell this process
    // to look again). Retried with a backoff from the cooldown up to the
    // periodic look.
    let mut again = Backoff::new(COOLDOWN, RECHECK_EVERY);
    let mut retry_at: Option<Instant> = None;
    let mut announced: Option<String> = None;
    // No strong reference while waiting: the backend's drop closes
    // `epochs` and ends the follower at once.
    let Some((suspicion, mut epochs)) = followed
        .upgrade()
        .map(|strong| (strong.suspicion(), strong.epochs()))
    else {
        return;
    };
    // A sentinel's subscription was made again during a look: a switch
    // announced before it may have been missed, so the next look is now.
    let mut missed = false;
    loop {
        // A look when a sentinel tells, when a call suspects the primary
        // (not within the cooldown of the last look), or after a while.
        if !std::mem::take(&mut missed) {
            let suspected = async {
                suspicion.notified().await;
                tokio::time::sleep_until(last_look + COOLDOWN).await;
            };
            let retry = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                h = heard.recv() => match h {
                    None => return,
                    Some(Heard::Switched(to)) => {
                        announced = Some(to);
                        // News, not a failure: the looks that failed
                        // during the outage say nothing of how soon the
                        // announced primary answers as one (within
                        // milliseconds, normally), so its looks start
                        // over from a short pause.
                        again = Backoff::new(ANNOUNCED_RETRY, RECHECK_EVERY);
                    }
                    Some(Heard::Subscribed) => {}
                },
                () = closed(&mut epochs) => return,
                _ = suspected => {}
                _ = retry => {}
                _ = tokio::time::sleep(RECHECK_EVERY) => {}
            }
        }
        last_look = Instant::now();
        let mut look_again = |again: &mut Backoff| {
            retry_at = Some(Instant::now() + again.next_interval());
        };
        let limit = connect_deadline(&finder.options.redis);
        let looked = unless_announced(
            &mut heard,
            announced.as_deref(),
            &mut missed,
            with_deadline_error(limit, finder.find(), "no answer"),
        )
        .await;
        let found = match looked {
            Announced::Not(Ok(found)) => found,
            Announced::Switched(to) => {
                (announced, retry_at, again) = look_at_announced(to);
                continue;
            }
            Announced::Gone => return,
            Announced::Not(Err(e)) => {
                tracing::debug!(error = %e, "sentinel: no primary found; keeping the current one");
                look_again(&mut again);
                continue;
            }
        };
        let Some(strong) = followed.upgrade() else {
            return;
        };
        let current = strong.current();
        if current.addr == found.addr() {
            strong.stayed();
            if announced.as_ref().is_some_and(|to| *to != current.addr) {
                // The sentinels asked do not show the announced switch yet.
                look_again(&mut again);
            } else {
                (retry_at, announced) = (None, None);
                again = Backoff::new(COOLDOWN, RECHECK_EVERY);
            }
            continue;
        }
        let heading_to = found.addr();
        let open = finder.open(&found);
        let opened = match unless_announced(&mut heard, Some(&heading_to), &mut missed, open).await
        {
            Announced::Not(opened) => opened,
            Announced::Switched(to) => {
                (announced, retry_at, again) = look_at_announced(to);
                continue;
            }
            Announced::Gone => return,
        };
        match opened {
            Ok(opened) => {
                (retry_at, announced) = (None, None);
                again = Backoff::new(COOLDOWN, RECHECK_EVERY);
                let epoch = strong.switch(opened.commands, opened.resp3, found.addr());
                if let Some(clock) = clock.upgrade() {
                    clock.start_over();
                }
                tracing::warn!(
                    from = %current.addr,
                    to = %found.addr(),
                    epoch,
                    "sentinel: the primary changed; connections moved, the L1 emptied"
                );
            }
            Err(e) => {
                tracing::warn!(
                    to = %found.addr(),
                    error = %e,
                    "sentinel: a new primary is named but cannot be reached yet"
                );
                look_again(&mut again);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_master_answer_names_the_primary_and_its_epoch() {
        let answer = Value::Array(
            [
                "name",
                "m",
                "ip",
                "10.0.0.2",
                "port",
                "6380",
                "flags",
                "master",
                "config-epoch",
                "7",
            ]
            .iter()
            .map(|s| bulk(s))
            .collect(),
        );
        assert_eq!(
            parse_master(answer),
            Some(Found {
                host: "10.0.0.2".into(),
                port: 6380,
                epoch: 7,
                down: false,
            })
        );
    }

    #[test]
    fn a_primary_the_sentinel_deems_down_is_marked_down() {
        let answer = Value::Map(vec![
            (bulk("ip"), bulk("10.0.0.2")),
            (bulk("port"), bulk("6380")),
            (bulk("flags"), bulk("master,s_down")),
        ]);
        assert!(parse_master(answer).is_some_and(|found| found.down));
        assert_eq!(parse_master(Value::Nil), None);
        assert_eq!(parse_master(Value::Array(vec![bulk("ip")])), None);
    }

    #[test]
    fn node_urls_carry_the_data_nodes_credentials() {
        let options = SentinelOptions::new()
            .username("app")
            .password("p@ss:word")
            .db(3);
        assert_eq!(
            options.node_url("127.0.0.1", 6380).unwrap(),
            "redis://app:p%40ss%3Aword@127.0.0.1:6380/3"
        );
        assert_eq!(
            SentinelOptions::new().tls(true).node_url("::1", 1).unwrap(),
            "rediss://[::1]:1/0"
        );
        assert!(!format!("{options:?}").contains("p@ss"));
    }

    #[test]
    fn switch_messages_are_told_apart_by_name() {
        let data = [bulk("+switch-master"), bulk("m 127.0.0.1 1 127.0.0.2 2")];
        assert_eq!(switched(&data, "m").as_deref(), Some("127.0.0.2:2"));
        assert_eq!(switched(&data, "other"), None);
        assert_eq!(switched(&data[..1], "m"), None);
        let short = [bulk("+switch-master"), bulk("m 127.0.0.1 1")];
        assert_eq!(switched(&short, "m"), None);
    }
}
