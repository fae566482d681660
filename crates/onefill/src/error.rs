//! Typed errors. Every public error enum is `#[non_exhaustive]` so variants can
//! be added without a breaking release. (Over 600 lines: every variant of
//! the four public error types carries the rustdoc users read to handle
//! it; split by type, each file would import the others to convert.)

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// What a call on a [`Cache`](crate::Cache) can fail with.
///
/// Classification helpers (`is_*`) let callers react without matching every
/// variant.
///
/// A walk of its [`source`](std::error::Error::source) chain (or `anyhow`'s
/// `chain()`) meets the cause as an object of its own type: for
/// [`Error::Loader`], the loader's own error (then its causes).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The loader returned an error. Every caller coalesced onto that load gets
    /// a clone of the same error (shared through an `Arc`).
    Loader(LoaderError),
    /// The loader panicked. The lease was released and every waiter got this
    /// error instead of hanging.
    LoaderPanicked(String),
    /// The loader ran longer than the maximum load time; it was aborted and
    /// its lease released.
    LoadTimedOut(Duration),
    /// Another process held the lease for longer than the wait deadline and the
    /// configured outcome at the deadline was an error.
    WaitTimedOut(Duration),
    /// A recent load of this key failed and the failure was cached
    /// (negative caching); the origin was not called again.
    CachedFailure(String),
    /// The backend failed and the cache runs in strict mode (otherwise backend
    /// failures degrade to in-process coalescing and stale values).
    Backend(BackendError),
    /// The key, value or an option given for this call is not acceptable.
    InvalidInput(InputError),
    /// The value of `key` could not be stored; nothing was written. Either
    /// the codec failed to encode it, or its encoding does not decode back
    /// ([`CodecError::is_round_trip`]: `f64::NAN` in JSON becomes `null`,
    /// say), which would make every later read a miss and a reload.
    Encode {
        /// The user key (its string form).
        key: String,
        /// The codec's error.
        source: CodecError,
    },
    /// A recent [`get_or_load_optional`](crate::Cache::get_or_load_optional)
    /// found nothing and cached the key's absence.
    NotFound,
    /// The in-process flight that was computing this key ended without an
    /// answer (its task was cancelled, e.g. by runtime shutdown).
    FlightAbandoned,
    /// A [`BlockingCache`](crate::BlockingCache) call came from an async
    /// task (of either runtime flavour), where waiting would stall the
    /// worker's other tasks, or every task of a current-thread runtime:
    /// call it inside `spawn_blocking`, or use the async
    /// [`Cache`](crate::Cache).
    BlockingInAsync,
    /// The cache of a `#[onefill::cached]` function could not be made at
    /// its first call: an option out of range (a `ttl` expression of zero,
    /// say), no default backend set at start, or its Redis URL unusable.
    Config(ConfigError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Loader(e) => write!(f, "loader failed: {e}"),
            Error::LoaderPanicked(message) => write!(f, "loader panicked: {message}"),
            Error::LoadTimedOut(max) => write!(
                f,
                "loader did not finish within the maximum load time of {max:?}"
            ),
            Error::WaitTimedOut(waited) => write!(
                f,
                "waited {waited:?} for another process's load without an answer"
            ),
            Error::CachedFailure(message) => {
                write!(f, "cached failure of a recent load: {message}")
            }
            Error::Backend(e) => write!(f, "backend error: {e}"),
            Error::InvalidInput(e) => write!(f, "invalid input: {e}"),
            Error::Encode { key, source } => {
                write!(f, "could not encode the value of key {key:?}: {source}")
            }
            Error::NotFound => f.write_str("the key's absence is cached"),
            Error::FlightAbandoned => {
                f.write_str("the load this call was waiting for was abandoned")
            }
            Error::BlockingInAsync => f.write_str(
                "a blocking cache call from an async task would stall its runtime's worker: \
                 call it inside `spawn_blocking`, or use the async `Cache`",
            ),
            Error::Config(e) => write!(f, "the cache could not be made: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // The loader's own error, not the `LoaderError` around it (which
            // displays as it): a chain walk meets it as its own type, once.
            Error::Loader(e) => Some(e.get_ref()),
            Error::Backend(e) => Some(e),
            Error::InvalidInput(e) => Some(e),
            Error::Encode { source, .. } => Some(source),
            Error::Config(e) => Some(e),
            _ => None,
        }
    }
}

impl From<BackendError> for Error {
    fn from(error: BackendError) -> Self {
        Error::Backend(error)
    }
}

impl From<InputError> for Error {
    fn from(error: InputError) -> Self {
        Error::InvalidInput(error)
    }
}

impl Error {
    /// The loader failed (including a cached failure or a panic).
    pub fn is_loader(&self) -> bool {
        matches!(
            self,
            Error::Loader(_) | Error::LoaderPanicked(_) | Error::CachedFailure(_)
        )
    }
    /// A deadline passed: the wait deadline or the maximum load time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::WaitTimedOut(_) | Error::LoadTimedOut(_))
            || matches!(self, Error::Backend(b) if b.is_timeout())
    }
    /// The backend failed (only surfaced in strict mode).
    pub fn is_backend(&self) -> bool {
        matches!(self, Error::Backend(_))
    }
    /// The input was rejected and nothing was stored: a key or call option
    /// (before anything ran), or what a load produced (a value over the size
    /// limit, a TTL or grace out of range chosen with
    /// [`Loaded`](crate::Loaded)).
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Error::InvalidInput(_))
    }
    /// The loader's own error as a `T`, if this is [`Error::Loader`] and
    /// [`LoaderError::downcast_ref`] finds one (in an `anyhow::Error`, a box,
    /// or the error's source chain).
    pub fn loader_error<T: std::error::Error + 'static>(&self) -> Option<&T> {
        match self {
            Error::Loader(e) => e.downcast_ref::<T>(),
            _ => None,
        }
    }
}

/// The error of a boxed loader error: what every error type a loader may
/// return converts into.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error types a loader may return: anything that converts into a
/// [`BoxError`], which covers every `std::error::Error + Send + Sync +
/// 'static` (`std::io::Error`, your own error enum), `Box<dyn Error + Send +
/// Sync>` itself and `anyhow::Error`, with no adapter (and a plain `String`
/// or `&'static str` message).
///
/// It is the bound on `E` in every loading entry point of
/// [`Cache`](crate::Cache) ([`get_or_load`](crate::Cache::get_or_load),
/// [`fetch`](crate::Cache::fetch), …): an entry point that takes a loader
/// names it, so they all accept the same loaders. Implemented for every
/// such type; it cannot be implemented by hand.
///
/// The caller gets the loader's error back typed through
/// [`Error::loader_error`] (or [`LoaderError::downcast_ref`]), which finds it
/// whichever of these kinds carried it: an `anyhow::Error` or a box around
/// it, or anywhere in its [`source`](std::error::Error::source) chain.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// #[derive(Debug, thiserror::Error)]
/// #[error("no such user {0}")]
/// struct NoSuchUser(u32);
///
/// let cache = onefill::Cache::<u32, String>::builder().build().unwrap();
/// // A loader returning `Box<dyn Error + Send + Sync>`, as `?` on mixed
/// // errors gives; `anyhow::Result` and `std::io::Result` work the same.
/// let err = cache
///     .get_or_load(&7, |id| async move {
///         Err::<String, onefill::BoxError>(Box::new(NoSuchUser(id)))
///     })
///     .await
///     .unwrap_err();
/// assert_eq!(err.loader_error::<NoSuchUser>().map(|e| e.0), Some(7));
/// # }
/// ```
pub trait IntoLoaderError: Send + 'static {
    /// Wraps the error for the flight, shared by every coalesced caller.
    #[doc(hidden)]
    fn into_loader_error(self) -> LoaderError;
}

impl<E: Into<BoxError> + Send + 'static> IntoLoaderError for E {
    fn into_loader_error(self) -> LoaderError {
        // anyhow's own conversion into a box hides the error's type (the
        // box holds anyhow's private wrapper, whose `source()` skips the
        // error itself): an `anyhow::Error` made by `?` from a typed error
        // could not be downcast back. Its relocating conversion boxes the
        // error itself (or its context wrapper, whose source is the error).
        let mut slot = Some(self);
        let anyhow = (&mut slot as &mut dyn std::any::Any)
            .downcast_mut::<Option<anyhow::Error>>()
            .and_then(Option::take);
        let error: BoxError = match (anyhow, slot) {
            (Some(anyhow), _) => anyhow.reallocate_into_boxed_dyn_error_without_backtrace(),
            (None, Some(error)) => error.into(),
            // Unreachable: the slot is emptied only by the anyhow branch.
            (None, None) => "the loader failed".into(),
        };
        LoaderError {
            error: Arc::from(error),
        }
    }
}

/// A loader's error, shared by every caller coalesced onto the load (cheap
/// to clone: an `Arc`).
///
/// Transparent over the loader's error: it displays as that error and its
/// [`source`](std::error::Error::source) is that error's source
/// ([`Error::Loader`]'s source is the loader's error itself, so a chain walk
/// from it meets that error once, as its own type).
/// [`LoaderError::downcast_ref`] gives back the loader's own error typed
/// (also from an `anyhow::Error`, with or without context).
#[derive(Clone)]
pub struct LoaderError {
    error: Arc<dyn std::error::Error + Send + Sync>,
}

impl LoaderError {
    /// The loader's error as a `T`: the error itself if it is one (what a
    /// loader returning `Result<V, T>` gave, or the error in the box or
    /// `anyhow::Error` it returned), else the first `T` in its
    /// [`source`](std::error::Error::source) chain (an error under an
    /// `anyhow` context, say).
    ///
    /// ```
    /// use std::io;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let cache = onefill::Cache::<u32, u32>::builder().build().unwrap();
    /// let err = cache
    ///     .get_or_load(&1, |_| async { Err::<u32, _>(io::Error::other("db down")) })
    ///     .await
    ///     .unwrap_err();
    /// let onefill::Error::Loader(loader) = &err else { panic!("{err}") };
    /// assert_eq!(loader.downcast_ref::<io::Error>().unwrap().to_string(), "db down");
    /// # }
    /// ```
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self.get_ref());
        while let Some(error) = next {
            if let Some(found) = error.downcast_ref::<T>() {
                return Some(found);
            }
            next = error.source();
        }
        None
    }
    /// Whether [`downcast_ref`](LoaderError::downcast_ref) finds a `T`.
    pub fn is<T: std::error::Error + 'static>(&self) -> bool {
        self.downcast_ref::<T>().is_some()
    }
    /// The loader's error as a trait object (for an `anyhow::Error` or a
    /// box, the error inside).
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }
}

impl fmt::Debug for LoaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.error, f)
    }
}
impl fmt::Display for LoaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.error, f)
    }
}
impl std::error::Error for LoaderError {
    // Transparent: this error *is* the loader's (it displays as it), so its
    // source is the loader's error's source. (`Error::Loader`'s source is
    // the loader's error itself, not this wrapper.)
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// Input rejected before any backend call or load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// Keys must not be empty.
    #[error("the key is empty")]
    EmptyKey,
    /// The key is longer than the configured maximum.
    #[error("the key is {len} bytes, over the limit of {max}")]
    KeyTooLong {
        /// Length of the rejected key in bytes.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The key's `Display` implementation returned an error (its string
    /// form, which names the key everywhere, is unknown).
    #[error("the key's `Display` implementation returned an error")]
    KeyDisplay,
    /// The encoded value is larger than the configured maximum.
    #[error("the encoded value is {len} bytes, over the limit of {max}")]
    ValueTooLarge {
        /// Size of the encoded value in bytes.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// A tag is empty or too long, or a value has too many
    /// ([`MAX_TAGS`](crate::MAX_TAGS), [`MAX_TAG_BYTES`](crate::MAX_TAG_BYTES)).
    #[error("tag {tag:?}: {reason}")]
    Tag {
        /// The tag (cut to its first 64 bytes), or the count.
        tag: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// An option is out of its accepted range.
    #[error("option `{option}` {reason}")]
    Option {
        /// The option's name.
        option: &'static str,
        /// Why it was rejected.
        reason: String,
    },
}

/// Building a [`Cache`](crate::Cache) failed: an option or the namespace is invalid.
///
/// Only options can be wrong at build time (keys and values are checked per
/// call, as [`InputError`]), so this type has no key or value variants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The namespace is empty, too long, or contains `{` or `}` (reserved
    /// for the Redis Cluster hash tag).
    #[error("invalid namespace {namespace:?}: {reason}")]
    Namespace {
        /// The rejected namespace.
        namespace: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A tag is empty or too long, or a value has too many
    /// ([`MAX_TAGS`](crate::MAX_TAGS), [`MAX_TAG_BYTES`](crate::MAX_TAG_BYTES)).
    #[error("tag {tag:?}: {reason}")]
    Tag {
        /// The tag (cut to its first 64 bytes), or the count.
        tag: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// An option is out of its accepted range.
    #[error("option `{option}` {reason}")]
    Option {
        /// The option's name (as its builder method is named).
        option: &'static str,
        /// Why it was rejected.
        reason: String,
    },
}

/// An option out of range, before it is known whether it was given to the
/// builder ([`ConfigError`]) or for one call ([`InputError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidOption {
    pub option: &'static str,
    pub reason: String,
}

impl InvalidOption {
    pub(crate) fn new(option: &'static str, reason: impl Into<String>) -> Self {
        InvalidOption {
            option,
            reason: reason.into(),
        }
    }
}

impl From<InvalidOption> for ConfigError {
    fn from(e: InvalidOption) -> Self {
        ConfigError::Option {
            option: e.option,
            reason: e.reason,
        }
    }
}

impl From<InvalidOption> for InputError {
    fn from(e: InvalidOption) -> Self {
        InputError::Option {
            option: e.option,
            reason: e.reason,
        }
    }
}

/// A codec could not encode or decode a value.
///
/// Transparent over the codec's own error: it displays as that error and
/// [`get_ref`](CodecError::get_ref) gives it back.
#[derive(Clone, thiserror::Error)]
#[error(transparent)]
pub struct CodecError(Arc<dyn std::error::Error + Send + Sync>);

impl CodecError {
    /// An encoding that does not decode back: `decode` is the decoder's
    /// error.
    pub(crate) fn round_trip(decode: CodecError) -> Self {
        CodecError(Arc::new(RoundTrip(decode)))
    }
    /// The value was encoded, but its encoding does not decode back (the
    /// decoder's error is the [`source`](std::error::Error::source)).
    pub fn is_round_trip(&self) -> bool {
        self.0.is::<RoundTrip>()
    }
    /// Wraps a codec's error.
    pub fn new<E: std::error::Error + Send + Sync + 'static>(error: E) -> Self {
        CodecError(Arc::new(error))
    }
    /// A codec error from a message, for codecs whose failures are text.
    pub fn msg(message: impl fmt::Display) -> Self {
        CodecError(Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(
            message.to_string(),
        )))
    }
    /// The codec's own error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

/// An encoding that does not decode back (see [`CodecError::is_round_trip`]).
#[derive(Debug, thiserror::Error)]
#[error("its encoding does not decode back: {0}")]
struct RoundTrip(#[source] CodecError);

impl fmt::Debug for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// The kind of a [`BackendError`], for failure policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// The call did not answer within the backend timeout.
    Timeout,
    /// The connection failed, was refused or dropped; usually transient.
    Connection,
    /// The server is loading, busy, a replica, or redirected us: transient.
    Busy,
    /// The server rejected the command (a script error, a wrong type): not transient.
    Command,
    /// The server answered something the protocol did not expect.
    Protocol,
    /// The circuit breaker is open: the call was not even attempted.
    CircuitOpen,
    /// The backend does not implement this operation (a third-party
    /// backend written before it existed): never transient.
    Unsupported,
    /// The write ran, but fewer replicas confirmed it in time than the
    /// backend was asked to wait for (on Redis,
    /// `onefill::redis::RedisOptions::durability`):
    /// a failover before they catch up may lose it. Not transient: the
    /// server answered (the circuit breaker counts it as an answer), and
    /// sending the write again would write it again rather than confirm
    /// it, so the cache does not replay it. Counted in
    /// [`Stats::writes_unreplicated`](crate::Stats::writes_unreplicated),
    /// not in `backend_errors`.
    NotReplicated,
    /// The server's access control refused the call (Redis `NOPERM`: an
    /// ACL user without one of the commands, keys or channels the call
    /// needs). A configuration error, not an outage: never transient, and
    /// a cache answers it to its callers even outside
    /// [`strict`](crate::CallOptions::strict) mode, since loading without
    /// the backend would put every caller on the origin in silence. The
    /// message names the refused command where the server does, and the
    /// call otherwise.
    NotPermitted,
}

impl fmt::Display for BackendErrorKind {
    /// The kind in words, e.g. "timed out".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendErrorKind::Timeout => "timed out",
            BackendErrorKind::Connection => "connection failed",
            BackendErrorKind::Busy => "server busy",
            BackendErrorKind::Command => "command rejected",
            BackendErrorKind::Protocol => "protocol error",
            BackendErrorKind::CircuitOpen => "circuit open",
            BackendErrorKind::Unsupported => "unsupported by this backend",
            BackendErrorKind::NotReplicated => "not confirmed by enough replicas",
            BackendErrorKind::NotPermitted => "not permitted by the server's ACL",
        })
    }
}

/// A backend (Redis or memory) call failed.
///
/// Cheap to clone: the underlying error, if any, is shared. It displays as
/// the kind in words and the message (`timed out: get: no answer within
/// 1s`); [`source`](std::error::Error::source) is the underlying error, for
/// the Redis backend the driver's `redis::RedisError`.
#[derive(Debug, Clone)]
pub struct BackendError {
    kind: BackendErrorKind,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl BackendError {
    /// A new error of the given kind, without an underlying error.
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        BackendError {
            kind,
            message: message.into(),
            source: None,
        }
    }
    /// A new error of the given kind, caused by `source` (returned by
    /// [`source`](std::error::Error::source)).
    pub fn with_source<E>(kind: BackendErrorKind, message: impl Into<String>, source: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        BackendError {
            kind,
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }
    /// What kind of failure this is.
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }
    /// The call timed out.
    pub fn is_timeout(&self) -> bool {
        self.kind == BackendErrorKind::Timeout
    }
    /// Retrying later may succeed (timeouts, connection problems, busy server,
    /// open circuit). A write its replicas did not confirm
    /// ([`BackendErrorKind::NotReplicated`]) is not transient: it ran.
    pub fn is_transient(&self) -> bool {
        !matches!(
            self.kind,
            BackendErrorKind::Command
                | BackendErrorKind::Protocol
                | BackendErrorKind::Unsupported
                | BackendErrorKind::NotReplicated
                | BackendErrorKind::NotPermitted
        )
    }
    /// The write ran but too few replicas confirmed it
    /// ([`BackendErrorKind::NotReplicated`]).
    pub fn is_not_replicated(&self) -> bool {
        self.kind == BackendErrorKind::NotReplicated
    }
    /// The human-readable message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}: {}", self.kind, self.message)
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // Returns the error itself, not the `Arc`, so callers can downcast
        // it to its own type.
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod backend_error_tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn backend_errors_name_their_kind_in_words() {
        for (kind, words) in [
            (BackendErrorKind::Timeout, "timed out"),
            (BackendErrorKind::Connection, "connection failed"),
            (BackendErrorKind::Busy, "server busy"),
            (BackendErrorKind::Command, "command rejected"),
            (BackendErrorKind::Protocol, "protocol error"),
            (BackendErrorKind::CircuitOpen, "circuit open"),
            (
                BackendErrorKind::NotReplicated,
                "not confirmed by enough replicas",
            ),
            (
                BackendErrorKind::NotPermitted,
                "not permitted by the server's ACL",
            ),
        ] {
            let err = BackendError::new(kind, "get: no answer");
            assert_eq!(err.to_string(), format!("{words}: get: no answer"));
            assert_eq!(BackendError::new(kind, "").to_string(), words);
        }
    }

    #[test]
    fn backend_errors_keep_their_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let err = BackendError::with_source(BackendErrorKind::Connection, "get: reset", io);
        let cloned = err.clone();
        let source = cloned.source().expect("a source");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the io error");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
        assert_eq!(err.message(), "get: reset");
        assert!(BackendError::new(BackendErrorKind::Busy, "x")
            .source()
            .is_none());
        // Through the caller-facing error too.
        let caller = Error::from(err);
        let chain = caller.source().and_then(|b| b.source());
        assert!(chain.is_some_and(|e| e.is::<std::io::Error>()));
    }
}
