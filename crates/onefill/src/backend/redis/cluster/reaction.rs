//! What the router does about a driver error: follow a redirection
//! (`MOVED`, `ASK`), retry a busy cluster, count a node that did not
//! answer, or hand the error to the caller.

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// What the router does about an error.
pub(super) enum Reaction {
    /// `MOVED` (`ask: false`: the slot lives there now) or `ASK` (this
    /// command only) to the node at `addr`.
    Redirect { addr: String, ask: bool },
    /// Send it again after a pause (and refresh the slot map?).
    Retry { refresh: bool },
    /// The node did not answer (`dropped`: its connection is gone).
    Unreachable { dropped: bool },
    /// An answer: the caller's.
    Fail,
}

/// The error a reply stands for: a pipeline's first server error (they come
/// apart from its `detail`), else the error itself.
fn first_of(error: &RedisError) -> Option<RedisError> {
    error
        .clone()
        .into_server_errors()
        .and_then(|errors| errors.first().map(|(_, e)| RedisError::from(e.clone())))
}

/// Whether `error` is (or a pipeline's first error is) a `TRYAGAIN`.
pub(in super::super) fn is_try_again(error: &RedisError) -> bool {
    let first = first_of(error);
    first.as_ref().unwrap_or(error).kind() == ErrorKind::Server(ServerErrorKind::TryAgain)
}

impl Reaction {
    pub(super) fn to(error: &RedisError) -> Reaction {
        let first = first_of(error);
        let error = first.as_ref().unwrap_or(error);
        match error.kind() {
            ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask)) => error
                .redirect_node()
                .map_or(Reaction::Fail, |(addr, _)| Reaction::Redirect {
                    addr: addr.to_owned(),
                    ask: kind == ServerErrorKind::Ask,
                }),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::BusyLoading) => {
                Reaction::Retry { refresh: false }
            }
            ErrorKind::Server(
                ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly,
            ) => Reaction::Retry { refresh: true },
            _ if error.is_timeout() => Reaction::Unreachable { dropped: false },
            _ if error.is_connection_dropped()
                || error.is_connection_refusal()
                || error.kind() == ErrorKind::Io =>
            {
                Reaction::Unreachable { dropped: true }
            }
            _ => Reaction::Fail,
        }
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;

    #[test]
    fn routing_errors_are_told_apart() {
        let server = |reply: &str| match redis::parse_redis_value(reply.as_bytes()) {
            Ok(Value::ServerError(e)) => RedisError::from(e),
            other => panic!("not a server error: {other:?}"),
        };
        assert!(matches!(
            Reaction::to(&server("-MOVED 3999 127.0.0.1:6381\r\n")),
            Reaction::Redirect { addr, ask: false } if addr == "127.0.0.1:6381"
        ));
        assert!(matches!(
            Reaction::to(&server("-ASK 3999 127.0.0.1:6381\r\n")),
            Reaction::Redirect { addr, ask: true } if addr == "127.0.0.1:6381"
        ));
        assert!(matches!(
            Reaction::to(&server("-CLUSTERDOWN The cluster is down\r\n")),
            Reaction::Retry { refresh: true }
        ));
        assert!(matches!(
            Reaction::to(&server("-TRYAGAIN Multiple keys\r\n")),
            Reaction::Retry { refresh: false }
        ));
        assert!(matches!(
            Reaction::to(&server("-WRONGTYPE no\r\n")),
            Reaction::Fail
        ));
        let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
        assert!(matches!(
            Reaction::to(&io(std::io::ErrorKind::TimedOut)),
            Reaction::Unreachable { dropped: false }
        ));
        assert!(matches!(
            Reaction::to(&io(std::io::ErrorKind::ConnectionRefused)),
            Reaction::Unreachable { dropped: true }
        ));
    }
}
