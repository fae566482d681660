//! Driver errors as [`BackendError`]s: sorted into a [`BackendErrorKind`],
//! with the driver's [`RedisError`] kept as the source; and driver futures
//! bounded by the library's one deadline ([`crate::deadline`]).

use std::future::Future;
use std::time::Duration;

use redis::RedisError;
use tokio::time::Instant;

use crate::deadline;
use crate::error::{BackendError, BackendErrorKind};

/// A driver future bounded by `limit` from now, its error classified for
/// the operation `op`: past the limit, the deadline's timeout of `op`.
pub(super) async fn with_deadline<T>(
    op: &'static str,
    limit: Duration,
    fut: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, BackendError> {
    deadline::within(op, Instant::now(), limit, async {
        fut.await.map_err(|e| classify(op, e))
    })
    .await
}

/// A driver future bounded by `limit` from now, whose errors stay driver
/// errors because the caller still reacts to them as such (the cluster
/// router sorts them into redirections, retries and unreachable nodes; a
/// batch tells a key sent again from a failed one): past the limit, an
/// I/O timeout that carries the deadline's timeout of `op`, so
/// [`classify`] sorts it as a timeout and its text is the deadline's.
pub(super) async fn driver_within<T>(
    op: &'static str,
    limit: Duration,
    fut: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisError> {
    deadline::timer(Instant::now(), limit, fut)
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                deadline::timed_out(op, limit),
            )))
        })
}

/// Sorts a driver error into a [`BackendErrorKind`]; the error stays
/// reachable as the [`source`](std::error::Error::source).
pub(super) fn classify(op: &str, e: RedisError) -> BackendError {
    use redis::ErrorKind as K;
    // A failed pipeline (the `get` path) carries its server errors apart.
    let server = match e.code() {
        Some(code) => Some((code.to_owned(), e.detail().map(str::to_owned))),
        None => e.clone().into_server_errors().and_then(|errors| {
            let (_, error) = errors.first()?;
            Some((error.code().to_owned(), error.details().map(str::to_owned)))
        }),
    };
    let kind = if e.is_timeout() {
        BackendErrorKind::Timeout
    } else if let Some((code, detail)) = server {
        match code.as_str() {
            _ if is_acl_refusal(&code, detail.as_deref()) => BackendErrorKind::NotPermitted,
            "LOADING" | "BUSY" | "TRYAGAIN" | "MOVED" | "ASK" | "CLUSTERDOWN" | "MASTERDOWN"
            | "READONLY" => BackendErrorKind::Busy,
            _ => BackendErrorKind::Command,
        }
    } else {
        match e.kind() {
            K::Io | K::ClusterConnectionNotFound => BackendErrorKind::Connection,
            K::AuthenticationFailed | K::InvalidClientConfig => BackendErrorKind::Command,
            _ if e.is_connection_dropped() || e.is_connection_refusal() => {
                BackendErrorKind::Connection
            }
            _ => BackendErrorKind::Protocol,
        }
    };
    // The message repeats the driver's text so that logs, which show only
    // `Display`, keep it.
    BackendError::with_source(kind, format!("{op}: {e}"), e)
}

/// Whether the server refused the command with an error reply (an unknown
/// or renamed command, a wrong argument, its ACL), rather than failing to
/// answer.
pub(super) fn is_refusal(e: &BackendError) -> bool {
    matches!(
        e.kind(),
        BackendErrorKind::Command | BackendErrorKind::NotPermitted
    )
}

/// Whether the server's error (its `code` and `detail`) is an ACL's refusal: `NOPERM`,
/// or the plain `ERR` Redis 7.0 answers when a script's own call is
/// refused (7.2 answers `NOPERM` there too). Either way the server's text
/// names the command where it can, and the operation names the script.
fn is_acl_refusal(code: &str, detail: Option<&str>) -> bool {
    code == "NOPERM"
        || (code == "ERR"
            && detail.is_some_and(|d| d.contains("can't run this command or subcommand")))
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use redis::Value;

    use super::*;

    fn server_error(reply: &str) -> RedisError {
        match redis::parse_redis_value(reply.as_bytes()) {
            Ok(Value::ServerError(e)) => RedisError::from(e),
            other => panic!("not a server error: {other:?}"),
        }
    }

    #[test]
    fn errors_are_classified() {
        let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
        assert_eq!(
            classify("t", io(std::io::ErrorKind::TimedOut)).kind(),
            BackendErrorKind::Timeout
        );
        assert_eq!(
            classify("t", io(std::io::ErrorKind::ConnectionRefused)).kind(),
            BackendErrorKind::Connection
        );
        for (reply, kind) in [
            ("-LOADING loading\r\n", BackendErrorKind::Busy),
            ("-BUSY script\r\n", BackendErrorKind::Busy),
            ("-MOVED 1 127.0.0.1:1\r\n", BackendErrorKind::Busy),
            ("-CLUSTERDOWN down\r\n", BackendErrorKind::Busy),
            ("-TRYAGAIN again\r\n", BackendErrorKind::Busy),
            ("-WRONGTYPE wrong\r\n", BackendErrorKind::Command),
            ("-ERR Error running script\r\n", BackendErrorKind::Command),
            (
                "-NOPERM this user has no permissions to run the 'get' command\r\n",
                BackendErrorKind::NotPermitted,
            ),
            (
                "-NOPERM this user has no permissions to access one of the keys used as \
                 arguments\r\n",
                BackendErrorKind::NotPermitted,
            ),
            // Redis 7.0, a script's call refused.
            (
                "-ERR The user executing the script can't run this command or subcommand \
                 script: 2b58b113dac432e64a65f3ae35a5bac7217348a6, on @user_script:1.\r\n",
                BackendErrorKind::NotPermitted,
            ),
        ] {
            assert_eq!(classify("t", server_error(reply)).kind(), kind, "{reply}");
        }
    }

    #[test]
    fn an_acl_refusal_names_the_command() {
        let err = classify(
            "get",
            server_error("-NOPERM this user has no permissions to run the 'get' command\r\n"),
        );
        assert!(!err.is_transient());
        let text = err.to_string();
        assert!(
            text.starts_with("not permitted by the server's ACL: get: ")
                && text.contains("'get' command"),
            "{text}"
        );
    }

    #[test]
    fn the_driver_error_is_the_source() {
        let err = classify("acquire", server_error("-WRONGTYPE wrong kind\r\n"));
        let source = err.source().expect("a source");
        let redis_error = source.downcast_ref::<RedisError>().expect("a RedisError");
        assert_eq!(redis_error.code(), Some("WRONGTYPE"));
        assert_eq!(
            err.to_string(),
            format!("command rejected: acquire: {redis_error}")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_reads_as_the_one_timeout() {
        let limit = Duration::from_millis(10);
        let pending = || std::future::pending::<Result<(), RedisError>>();
        let err = with_deadline("connect", limit, pending())
            .await
            .unwrap_err();
        assert!(err.is_timeout());
        assert_eq!(err.message(), "connect did not answer within 10ms");
        // Kept a driver error, it still reads as a timeout, with that text.
        let driver = driver_within("connect", limit, pending())
            .await
            .unwrap_err();
        assert!(driver.is_timeout());
        assert!(
            driver
                .to_string()
                .contains("connect did not answer within 10ms"),
            "{driver}"
        );
        let err = classify("connect", driver);
        assert!(err.is_timeout());
    }
}
