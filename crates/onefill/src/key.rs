//! How a user key maps to backend keys.
//!
//! For namespace `ns` and key `k` the value lives at `ns:{k}`, the lease at
//! `ns:{k}:lock` and fill notifications go to `ns:{k}:filled`. The braces are
//! a Redis Cluster hash tag, so all three always share one slot and one Lua
//! script may touch them together.

use crate::error::{ConfigError, InputError};

/// The three backend keys that belong to one cache key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FillKeys {
    value: String,
    lock: String,
    channel: String,
}

impl FillKeys {
    /// The keys for `key` in `namespace` (not validated: the cache checks
    /// namespaces and keys before building these).
    pub fn new(namespace: &str, key: &str) -> Self {
        let value = format!("{namespace}:{{{key}}}");
        FillKeys {
            lock: format!("{value}:lock"),
            channel: format!("{value}:filled"),
            value,
        }
    }
    /// The key holding the stored envelope.
    pub fn value(&self) -> &str {
        &self.value
    }
    /// The key holding the lease token.
    pub fn lock(&self) -> &str {
        &self.lock
    }
    /// The pub/sub channel on which fills are announced.
    pub fn channel(&self) -> &str {
        &self.channel
    }
}

/// Checks a namespace: non-empty and free of hash-tag braces.
pub(crate) fn validate_namespace(namespace: &str) -> Result<(), ConfigError> {
    let reason = if namespace.is_empty() {
        "it is empty"
    } else if namespace.contains(['{', '}']) {
        "it contains `{` or `}`, which are reserved for the Redis Cluster hash tag"
    } else if namespace.len() > 256 {
        "it is longer than 256 bytes"
    } else {
        return Ok(());
    };
    Err(ConfigError::Namespace {
        namespace: namespace.to_owned(),
        reason,
    })
}

/// Checks a user key: non-empty and within `max_len` bytes.
pub(crate) fn validate_key(key: &str, max_len: usize) -> Result<(), InputError> {
    if key.is_empty() {
        return Err(InputError::EmptyKey);
    }
    if key.len() > max_len {
        return Err(InputError::KeyTooLong {
            len: key.len(),
            max: max_len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_hash_tag() {
        let keys = FillKeys::new("users", "42");
        assert_eq!(keys.value(), "users:{42}");
        assert_eq!(keys.lock(), "users:{42}:lock");
        assert_eq!(keys.channel(), "users:{42}:filled");
    }

    #[test]
    fn key_with_braces_still_shares_one_tag() {
        // Redis hashes the first `{...}`: `a{b` is the tag of all three.
        let keys = FillKeys::new("ns", "a{b}c");
        for k in [keys.value(), keys.lock(), keys.channel()] {
            assert!(k.starts_with("ns:{a{b}"), "{k}");
        }
    }

    #[test]
    fn bad_namespaces_and_keys_are_rejected() {
        assert!(validate_namespace("").is_err());
        assert!(validate_namespace("a{b").is_err());
        assert!(validate_namespace("a}b").is_err());
        assert!(validate_namespace("users").is_ok());
        assert_eq!(validate_key("", 10), Err(InputError::EmptyKey));
        assert_eq!(
            validate_key("0123456789a", 10),
            Err(InputError::KeyTooLong { len: 11, max: 10 })
        );
        assert!(validate_key("k", 10).is_ok());
    }
}
