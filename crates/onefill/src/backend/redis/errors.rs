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
    let code = e.code().map(str::to_owned).or_else(|| {
        e.clone()
            .into_server_errors()
            .and_then(|errors| errors.first().map(|(_, error)| error.code().to_owned()))
    });
    let kind = if e.is_timeout() {
        BackendErrorKind::Timeout
    } else if let Some(code) = code {
        match code.as_str() {
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
        ] {
            assert_eq!(classify("t", server_error(reply)).kind(), kind, "{reply}");
        }
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
