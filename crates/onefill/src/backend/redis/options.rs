//! [`RedisOptions`] (timeouts, reconnection, TLS) and opening a client with
//! them.
//!
//! TLS (`rediss://`) is behind onefill's `tls` cargo feature: rustls with
//! the ring provider, trusting the system store or the certificates given
//! here. Without the feature a `rediss://` URL is a clear error rather than
//! the driver's generic one.

use std::time::Duration;

use redis::Client;

use super::durability::Durability;
use super::errors::classify;
use super::urls::check_url;
use crate::error::BackendError;
#[cfg(not(feature = "tls"))]
use crate::error::BackendErrorKind;

/// First delay before the standalone subscriber reconnects, and the
/// smallest [`RedisOptions::max_backoff`].
pub(super) const MIN_BACKOFF: Duration = Duration::from_millis(50);

/// Timeouts and reconnection settings of a [`RedisBackend`](super::RedisBackend).
///
/// The cache above bounds every backend call with its own timeout
/// ([`CacheBuilder::backend_timeout`](crate::CacheBuilder::backend_timeout),
/// 250 ms by default, shared by all the calls of one flight), which fires
/// first with the defaults: these are a second line of defence, for the
/// driver's own connections and reconnections, and for the
/// [`Backend`](crate::Backend) methods of a `RedisBackend` called directly
/// (each bounded by the response timeout). A cache's hit on a standalone
/// server is bounded by the shorter of the two with a single timer
/// (decision 0013).
///
/// ```
/// use std::time::Duration;
/// let options = onefill::redis::RedisOptions::new()
///     .connection_timeout(Duration::from_millis(500))
///     .response_timeout(Duration::from_millis(300));
/// # drop(options);
/// ```
#[derive(Debug, Clone)]
pub struct RedisOptions {
    pub(super) connection_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) reconnect_retries: usize,
    pub(super) max_backoff: Duration,
    pub(super) ping_interval: Duration,
    /// Extra trust roots and a client certificate for `rediss://` (its
    /// `Debug` redacts them).
    #[cfg(feature = "tls")]
    pub(super) tls: Option<redis::TlsCertificates>,
    /// Replicas a write of a value or a mark waits for (`durability.rs`).
    pub(super) durability: Durability,
}

impl Default for RedisOptions {
    /// 1 s connection timeout, 1 s response timeout, 2 reconnection retries
    /// per failed command, backoff capped at 2 s, subscriber `PING` every 5 s.
    fn default() -> Self {
        RedisOptions {
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            reconnect_retries: 2,
            max_backoff: Duration::from_secs(2),
            ping_interval: Duration::from_secs(5),
            #[cfg(feature = "tls")]
            tls: None,
            durability: Durability::Primary,
        }
    }
}

impl RedisOptions {
    /// The defaults (see [`Default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// How long one attempt to open a connection may take.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a command may wait for its reply before it fails with a
    /// timeout: every [`Backend`](crate::Backend) method's commands (all
    /// of its round trips), the fill-notification and L1-tracking
    /// connections' commands, and on a cluster each node's commands. A
    /// cache's hit on a standalone server waits for the shorter of this and
    /// the cache's `backend_timeout`.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How many times a reconnection is retried (with backoff) before the
    /// commands waiting for it fail; the next command starts a new one.
    /// Standalone: the connection manager's retries. Cluster: the retries of
    /// the fill-notification connection's requests (at most 16); commands
    /// go through onefill's own routing, which follows redirections and
    /// retries `TRYAGAIN`/`CLUSTERDOWN` within the response timeout.
    pub fn reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// The longest delay between two reconnection attempts.
    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max.max(MIN_BACKOFF);
        self
    }

    /// How often the standalone subscriber connection is checked with `PING`
    /// (a connection that silently died is replaced).
    pub fn ping_interval(mut self, interval: Duration) -> Self {
        // Clamped: an interval of days would overflow the subscriber's timer.
        self.ping_interval = interval.clamp(Duration::from_millis(10), Duration::from_secs(3600));
        self
    }

    /// Trusts this CA certificate (PEM) for `rediss://` URLs instead of the
    /// system's trust store (feature `tls`).
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        let certs = self.tls.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        });
        certs.root_cert = Some(pem.into());
        self
    }

    /// Presents this client certificate and key (PEM) for mutual TLS
    /// (feature `tls`).
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        let certs = self.tls.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        });
        certs.client_tls = Some(redis::ClientTlsConfig {
            client_cert: cert_pem.into(),
            client_key: key_pem.into(),
        });
        self
    }
}

impl RedisOptions {
    /// How many replicas must confirm a write of a value or a mark before
    /// it is done: [`Durability::Primary`] (the default: none, Redis's own
    /// asynchronous replication) or [`Durability::Replicas`], which sends
    /// `WAIT` behind each such write and reports a shortfall as
    /// [`BackendErrorKind::NotReplicated`](crate::BackendErrorKind::NotReplicated).
    /// See [`Durability`] for what is covered, how a shortfall is answered,
    /// and how its timeout must relate to the cache's backend timeout.
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }
}

/// Checks `url` (what is wrong with it, TLS support) before the driver sees
/// it.
pub(super) fn check_url_and_tls(url: &str) -> Result<(), BackendError> {
    check_url(url)?;
    check_tls_support(url)
}

/// Opens a client for `url`, with the TLS settings of `options`.
pub(super) fn open_client(url: &str, options: &RedisOptions) -> Result<Client, BackendError> {
    check_url_and_tls(url)?;
    #[cfg(feature = "tls")]
    if let Some(certs) = &options.tls {
        return Client::build_with_tls(url, certs.clone()).map_err(|e| classify("connect", e));
    }
    let _ = options;
    Client::open(url).map_err(|e| classify("connect", e))
}

/// `rediss://` needs the `tls` feature; say so instead of the driver's
/// generic error. With the feature, make sure rustls has its crypto
/// provider (ring) installed, once per process.
fn check_tls_support(url: &str) -> Result<(), BackendError> {
    if !url.starts_with("rediss://") {
        return Ok(());
    }
    #[cfg(feature = "tls")]
    {
        // Fails only if a provider is already installed: fine either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(())
    }
    #[cfg(not(feature = "tls"))]
    Err(BackendError::new(
        BackendErrorKind::Command,
        "rediss:// URLs need onefill's `tls` cargo feature",
    ))
}

/// How long a whole connect may take, retries included: each attempt gets
/// twice the connection timeout plus a response timeout.
pub(super) fn connect_deadline(options: &RedisOptions) -> Duration {
    options
        .connection_timeout
        .saturating_mul(2)
        .saturating_add(options.response_timeout)
        .saturating_mul(
            u32::try_from(options.reconnect_retries.saturating_add(1)).unwrap_or(u32::MAX),
        )
}
