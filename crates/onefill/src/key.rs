//! How a user key maps to backend keys.
//!
//! For namespace `ns` and key `k` the value lives at `ns:{k}`, the lease at
//! `ns:{k}:lock` and fill notifications go to `ns:{k}:filled`. The braces are
//! a Redis Cluster hash tag, so all three always share one slot and one Lua
//! script may touch them together.
//!
//! Redis takes the tag from the first `{` to the first `}` after it, so a key
//! with braces of its own (`}x`, `a{b}c`) would make a different or empty
//! tag and split its keys across slots. Inside the tag the key is therefore
//! escaped: `%` becomes `%25`, `{` becomes `%7B` and `}` becomes `%7D`. The
//! escape is injective (two keys never share backend keys), and keys
//! without those three bytes are stored exactly as they are.

use crate::error::{ConfigError, InputError};

/// The three backend keys that belong to one cache key.
///
/// One allocation holds all three (`ns:{k}:lockns:{k}:filled`): they are
/// built for every flight, hits included.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FillKeys {
    buf: String,
    /// The value key is `buf[..value]`.
    value: usize,
    /// The lock key is `buf[..lock]`; the channel is `buf[lock..]`.
    lock: usize,
}

const LOCK_SUFFIX: &str = ":lock";
const CHANNEL_SUFFIX: &str = ":filled";

impl FillKeys {
    /// The keys for `key` in `namespace` (not validated: the cache checks
    /// namespaces and keys before building these).
    pub fn new(namespace: &str, key: &str) -> Self {
        let escaped_len = key.len()
            + 2 * key
                .bytes()
                .filter(|b| matches!(b, b'%' | b'{' | b'}'))
                .count();
        let value_len = namespace.len() + escaped_len + 3;
        let mut buf =
            String::with_capacity(2 * value_len + LOCK_SUFFIX.len() + CHANNEL_SUFFIX.len());
        buf.push_str(namespace);
        buf.push_str(":{");
        // Copied in runs between the bytes to escape (ASCII, so every run
        // ends on a character boundary): a key with none is one copy.
        let mut run = 0;
        for (at, byte) in key.bytes().enumerate() {
            let escaped = match byte {
                b'%' => "%25",
                b'{' => "%7B",
                b'}' => "%7D",
                _ => continue,
            };
            buf.push_str(&key[run..at]);
            buf.push_str(escaped);
            run = at + 1;
        }
        buf.push_str(&key[run..]);
        buf.push('}');
        let value = buf.len();
        buf.push_str(LOCK_SUFFIX);
        let lock = buf.len();
        buf.extend_from_within(..value);
        buf.push_str(CHANNEL_SUFFIX);
        FillKeys { buf, value, lock }
    }
    /// The keys whose value key is `value` (as [`value`](Self::value)
    /// gives it: a namespace, `:{`, the escaped key, `}`), or `None` for a
    /// string of another shape: what a backend reads back from a message
    /// that names a key.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn from_value_key(value: &str) -> Option<FillKeys> {
        let open = value.find('{')?;
        let inner = value.get(open + 1..value.len().checked_sub(1)?)?;
        let well_formed = open > 1
            && value[..open].ends_with(':')
            && value.ends_with('}')
            && !inner.contains(['{', '}']);
        if !well_formed {
            return None;
        }
        let mut buf =
            String::with_capacity(2 * value.len() + LOCK_SUFFIX.len() + CHANNEL_SUFFIX.len());
        buf.push_str(value);
        buf.push_str(LOCK_SUFFIX);
        let lock = buf.len();
        buf.push_str(value);
        buf.push_str(CHANNEL_SUFFIX);
        Some(FillKeys {
            buf,
            value: value.len(),
            lock,
        })
    }

    /// The key holding the stored envelope.
    pub fn value(&self) -> &str {
        &self.buf[..self.value]
    }
    /// The key holding the lease token.
    pub fn lock(&self) -> &str {
        &self.buf[..self.lock]
    }
    /// The pub/sub channel on which fills are announced.
    pub fn channel(&self) -> &str {
        &self.buf[self.lock..]
    }
}

/// The backend keys of a namespace's marks (decision 0018): its
/// generation `ns:{#}:gen`, its clear mark `ns:{#}:clear` and each tag's
/// mark `ns:{#}:tag:<tag>`. They share the slot of user key `#` (so one
/// script writes the generation and a mark together), and no key of a
/// value, lease or channel is one of them: those end in `}`, `}:lock` or
/// `}:filled`. They are under the prefix an L1 tracks (`ns:{`), so one
/// tracking connection reports both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MarkKeys {
    /// `ns:{#}:`
    prefix: String,
}

/// What a key under a namespace's marks prefix names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MarkName<'a> {
    Generation,
    /// The whole namespace's mark.
    Clear,
    Tag(&'a [u8]),
}

impl MarkKeys {
    pub(crate) fn new(namespace: &str) -> Self {
        MarkKeys {
            prefix: format!("{namespace}:{{#}}:"),
        }
    }
    /// The prefix every mark key has.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }
    pub(crate) fn generation(&self) -> String {
        format!("{}gen", self.prefix)
    }
    pub(crate) fn clear(&self) -> String {
        format!("{}clear", self.prefix)
    }
    pub(crate) fn tag(&self, tag: &[u8]) -> String {
        format!("{}tag:{}", self.prefix, String::from_utf8_lossy(tag))
    }
    /// Keys in the marks' slot, for the backend's shard and breaker.
    pub(crate) fn slot(namespace: &str) -> FillKeys {
        FillKeys::new(namespace, "#")
    }
    /// What `key` names, if it is one of these keys.
    pub(crate) fn name<'k>(&self, key: &'k [u8]) -> Option<MarkName<'k>> {
        match key.strip_prefix(self.prefix.as_bytes())? {
            b"gen" => Some(MarkName::Generation),
            b"clear" => Some(MarkName::Clear),
            rest => rest.strip_prefix(b"tag:").map(MarkName::Tag),
        }
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

/// A user key's string form, formatted without a heap allocation when it
/// is short (the L1 hit path looks keys up without allocating).
pub(crate) struct KeyBuf {
    inline: [u8; INLINE],
    len: usize,
    /// Set once the key outgrew the inline buffer.
    heap: Option<String>,
    /// The key's `Display` returned an error: what it wrote is not the key.
    failed: bool,
}

/// A user key's string form, or [`InputError::KeyDisplay`] if its `Display`
/// fails (`to_string` would panic; a truncated form could name another key).
pub(crate) fn display<D: std::fmt::Display + ?Sized>(key: &D) -> Result<String, InputError> {
    use std::fmt::Write;
    let mut string = String::new();
    write!(string, "{key}").map_err(|_| InputError::KeyDisplay)?;
    Ok(string)
}

const INLINE: usize = 128;

impl KeyBuf {
    pub(crate) fn new<D: std::fmt::Display + ?Sized>(key: &D) -> KeyBuf {
        use std::fmt::Write;
        let mut buf = KeyBuf {
            inline: [0; INLINE],
            len: 0,
            heap: None,
            failed: false,
        };
        // Writing to a `KeyBuf` cannot fail: an error is the key's own
        // `Display` failing, and what it wrote is not the key.
        buf.failed = write!(buf, "{key}").is_err();
        buf
    }

    /// The key's string form, unless its `Display` failed: a truncated
    /// form could be another key's, so two keys would share an entry.
    pub(crate) fn checked(&self) -> Result<&str, InputError> {
        if self.failed {
            return Err(InputError::KeyDisplay);
        }
        Ok(self.as_str())
    }

    fn as_str(&self) -> &str {
        match &self.heap {
            Some(s) => s,
            // Only whole `&str`s are ever copied in, so this is valid UTF-8.
            None => std::str::from_utf8(&self.inline[..self.len]).unwrap_or_default(),
        }
    }
}

impl std::fmt::Write for KeyBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if let Some(heap) = &mut self.heap {
            heap.push_str(s);
        } else if self.len + s.len() <= INLINE {
            self.inline[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
            self.len += s.len();
        } else {
            let mut heap = String::with_capacity(2 * (self.len + s.len()));
            heap.push_str(self.as_str());
            heap.push_str(s);
            self.heap = Some(heap);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_buffers_hold_short_and_long_keys() {
        assert_eq!(KeyBuf::new(&42).as_str(), "42");
        let long = "é".repeat(200);
        let buf = KeyBuf::new(&format_args!("{long}{}", 7));
        assert_eq!(buf.as_str(), format!("{long}7"));
        assert_eq!(KeyBuf::new(&"").as_str(), "");
    }

    #[test]
    fn keys_are_rebuilt_from_their_value_key_alone() {
        for (namespace, key) in [("users", "42"), ("a:b", "x{y}%z"), ("n", ""), ("n", "é ü")] {
            let keys = FillKeys::new(namespace, key);
            assert_eq!(FillKeys::from_value_key(keys.value()), Some(keys));
        }
        for foreign in [
            "",
            "{",
            "}",
            "users",
            "users:{42",
            "users{42}",
            ":{42}",
            "users:{4{2}",
            "u:{a}}",
        ] {
            assert_eq!(FillKeys::from_value_key(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn keys_share_the_hash_tag() {
        let keys = FillKeys::new("users", "42");
        assert_eq!(keys.value(), "users:{42}");
        assert_eq!(keys.lock(), "users:{42}:lock");
        assert_eq!(keys.channel(), "users:{42}:filled");
    }

    /// The hash tag Redis Cluster hashes: from the first `{` to the first
    /// `}` after it, if that is not empty; else the whole key.
    fn hash_tag(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    /// Regression: a key beginning with `}` made an empty
    /// tag, so its value and lease landed in different slots.
    #[test]
    fn hostile_keys_keep_one_tag_for_all_their_keys() {
        let long = "}{".repeat(512);
        for key in [
            "}x", "{", "}", "}{", "{}", "a{b}c", "%7D", "\n", "\0", &long,
        ] {
            let keys = FillKeys::new("ns", key);
            let tag = hash_tag(keys.value());
            assert!(!tag.is_empty(), "{key:?}");
            assert!(!tag.contains(['{', '}']), "{key:?}: {tag}");
            for k in [keys.lock(), keys.channel()] {
                assert_eq!(hash_tag(k), tag, "{key:?}: {k}");
            }
        }
        assert_eq!(FillKeys::new("ns", "plain:42").value(), "ns:{plain:42}");
    }

    /// Every key of up to three characters over the escape's own alphabet
    /// gets backend keys of its own: a broken escape (say, `%` left as is,
    /// so `}` and `%7D` meet) collides here.
    #[test]
    fn the_escape_is_injective() {
        const ALPHABET: [char; 8] = ['%', '{', '}', '7', 'B', 'D', '2', '5'];
        let mut keys = vec![String::new()];
        let mut all = Vec::new();
        for _ in 0..3 {
            keys = keys
                .iter()
                .flat_map(|k| ALPHABET.iter().map(move |c| format!("{k}{c}")))
                .collect();
            all.extend(keys.iter().cloned());
        }
        let encoded: std::collections::HashSet<String> = all
            .iter()
            .map(|k| FillKeys::new("ns", k).value().to_owned())
            .collect();
        assert_eq!(encoded.len(), all.len());
    }

    /// Mark keys share the slot of user key `#` and are never a value,
    /// lease or channel key, whatever the user keys are.
    #[test]
    fn mark_keys_share_a_slot_and_name_no_value() {
        let marks = MarkKeys::new("ns");
        let slot = hash_tag(FillKeys::new("ns", "#").value()).to_owned();
        for key in [marks.generation(), marks.clear(), marks.tag(b"a}{b")] {
            assert_eq!(hash_tag(&key), slot, "{key}");
            assert!(!key.ends_with('}') && !key.ends_with(":lock") && !key.ends_with(":filled"));
            assert!(key.starts_with("ns:{"), "under the L1's tracked prefix");
        }
        assert_eq!(
            marks.name(marks.tag(b"seller:7").as_bytes()),
            Some(MarkName::Tag(b"seller:7"))
        );
        assert_eq!(marks.name(marks.clear().as_bytes()), Some(MarkName::Clear));
        assert_eq!(
            marks.name(marks.generation().as_bytes()),
            Some(MarkName::Generation)
        );
        let hash = FillKeys::new("ns", "#");
        for key in [hash.value(), hash.lock(), hash.channel(), "ns:{#}:other"] {
            assert_eq!(marks.name(key.as_bytes()), None, "{key}");
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
