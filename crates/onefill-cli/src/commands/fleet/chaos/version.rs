//! How a chaos run's values name their version, and how it is read back
//! from an answer or from the raw bytes the server holds.
//!
//! A value is `chaos|<id>|`: `w<pid>.<n>` for a worker's `n`-th load,
//! `f<n>` for the parent's `n`-th foreign write. The cache stores it JSON
//! encoded after its envelope header, and JSON leaves these characters as
//! they are, so the id is found in the stored bytes too.

use serde::{Deserialize, Serialize};

const MARK: &[u8] = b"chaos|";

/// What a key held at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Held {
    /// No key.
    Absent,
    /// Bytes that carry no version: the foreign client's unreadable
    /// values (or anything else not written by the run).
    Unreadable,
    /// A value of the run, by its id.
    Version(String),
}

/// The value of version `id`.
pub fn value_of(id: &str) -> String {
    format!("chaos|{id}|")
}

/// The version id in `bytes` (an answer, or the stored envelope).
pub fn version_in(bytes: &[u8]) -> Option<String> {
    let start = bytes.windows(MARK.len()).position(|w| w == MARK)? + MARK.len();
    let rest = &bytes[start..];
    let end = rest.iter().position(|&b| b == b'|')?;
    let id = std::str::from_utf8(&rest[..end]).ok()?;
    (!id.is_empty()).then(|| id.to_owned())
}

/// What a key held, from `GET`'s reply (`None`: no key).
pub fn held(bytes: Option<&[u8]>) -> Held {
    match bytes {
        None => Held::Absent,
        Some(b) => version_in(b).map_or(Held::Unreadable, Held::Version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_found_in_the_value_and_in_stored_bytes() {
        let value = value_of("w42.7");
        assert_eq!(version_in(value.as_bytes()).as_deref(), Some("w42.7"));
        let mut stored = vec![0xF1, 2, 0, 0];
        stored.extend_from_slice(serde_json::to_string(&value).unwrap().as_bytes());
        assert_eq!(held(Some(&stored)), Held::Version("w42.7".to_owned()));
        assert_eq!(held(None), Held::Absent);
        assert_eq!(held(Some(b"garbage")), Held::Unreadable);
        assert_eq!(held(Some(b"chaos||")), Held::Unreadable);
        assert_eq!(held(Some(b"chaos|f1")), Held::Unreadable, "unterminated");
    }
}
