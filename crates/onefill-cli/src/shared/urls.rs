//! Redis URLs fit to print: no user name, no password.

/// `url` without its user name and password (and a `password`/`pass`
/// query parameter masked); a URL that does not parse is not echoed at all,
/// since its password could not be told apart from the rest.
pub fn redact(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "<a URL that does not parse>".to_owned();
    };
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    let query: Vec<(String, String)> = parsed
        .query_pairs()
        .map(|(k, v)| {
            let v = if matches!(k.as_ref(), "pass" | "password") {
                "***".to_owned()
            } else {
                v.into_owned()
            };
            (k.into_owned(), v)
        })
        .collect();
    if !query.is_empty() {
        parsed.query_pairs_mut().clear().extend_pairs(query);
    }
    parsed.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_never_printed() {
        assert_eq!(redact("redis://user:pw@host:6379/0"), "redis://host:6379/0");
        assert_eq!(
            redact("redis://:pw@127.0.0.1:7000"),
            "redis://127.0.0.1:7000"
        );
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert!(!redact("redis+unix:///tmp/r.sock?pass=secret").contains("secret"));
        assert!(!redact("redis://user:secret-host:6379").contains("secret"));
    }
}
