//! Connection URLs: checked before the driver sees them, and redacted
//! wherever they are shown.
//!
//! The driver reports any URL it cannot parse as "Redis URL did not parse",
//! which does not say what is wrong. Parsing it first with the `url` crate
//! (the driver's own parser) names the problem ("invalid port number",
//! "empty host", an unknown scheme). Neither message quotes the URL, so a
//! password in it is never echoed: a URL that does not parse cannot be
//! reliably redacted (`redis://user:secret-host:6379`, with the `@`
//! forgotten, has no user-info part to hide).

use crate::error::{BackendError, BackendErrorKind};

/// The schemes the driver accepts.
const SCHEMES: [&str; 7] = [
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis+unix",
    "valkey+unix",
    "unix",
];

/// Fails with what is wrong with `url` if it is not a URL, or not one the
/// driver knows. The rest (a missing host, a bad database number) is left to
/// the driver, whose messages name the problem and do not quote the URL.
pub(super) fn check_url(url: &str) -> Result<(), BackendError> {
    let parsed = url::Url::parse(url).map_err(|e| {
        BackendError::with_source(
            BackendErrorKind::Command,
            format!("invalid Redis URL: {e}"),
            e,
        )
    })?;
    let scheme = parsed.scheme();
    if !SCHEMES.contains(&scheme) {
        return Err(BackendError::new(
            BackendErrorKind::Command,
            format!(
                "invalid Redis URL: unknown scheme `{scheme}` (expected one of {})",
                SCHEMES.join(", ")
            ),
        ));
    }
    Ok(())
}

/// The URL without its user name and password.
pub(super) fn redact(url: &str) -> String {
    let url = match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    };
    // `redis+unix:///path?pass=secret` carries its password in the query.
    match url.split_once('?') {
        Some((base, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name @ ("pass" | "password"), _)) => format!("{name}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{base}?{}", query.join("&"))
        }
        None => url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact("redis://user:pw@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(
            redact("redis+unix:///run/redis.sock?db=1&pass=secret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
    }

    #[test]
    fn good_urls_pass() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://user:pw@host:6379/2?protocol=resp3",
            "rediss://host",
            "valkey://host",
            "redis+unix:///tmp/redis.sock?db=1",
            "unix:///tmp/redis.sock",
        ] {
            assert!(check_url(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        for (url, problem) in [
            ("redis://user:hunter2@host:notaport", "invalid port number"),
            ("redis://user:hunter2host:6379", "invalid port number"),
            ("http://user:hunter2@host:6379", "unknown scheme `http`"),
            ("user:hunter2@host:6379", "unknown scheme `user`"),
            (":hunter2@host", "relative URL without a base"),
            ("redis://:hunter2@:6379", "empty host"),
        ] {
            let err = check_url(url).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(err.message().contains(problem), "{url}: {err}");
            assert!(!shown.contains("hunter2"), "{url}: {shown}");
            assert_eq!(err.kind(), BackendErrorKind::Command);
            assert!(!err.is_transient());
        }
    }
}
