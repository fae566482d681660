//! What a backend stores for the namespace's marks (decision 0018): a
//! generation per namespace, and per tag (and for the whole namespace) the
//! generations of its last invalidation and expiry. The backend only
//! stores and reads them; what they make of a value is the cache's
//! business (`marks/`).

use crate::error::{BackendError, BackendErrorKind};

/// The largest generation a backend writes or a reader believes: 2^52,
/// about the year 2112 in microseconds, and within a Lua number's exact
/// range (the Redis script adds one). Anything above is another client's
/// bytes, not a generation: believed, it would make every value a reader
/// loads look newer than every mark made after, or a tag's values misses
/// for ever.
pub(crate) const MAX_GENERATION: u64 = 1 << 52;

/// A stored generation; anything else (or past [`MAX_GENERATION`]) reads
/// as none.
pub(crate) fn generation_from_stored(bytes: &[u8]) -> u64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|g| *g <= MAX_GENERATION)
        .unwrap_or(0)
}

/// A tag's (or the whole namespace's) mark: the generation of its last
/// invalidation and of its last expiry (0: never). A value written as of
/// an earlier generation than `hard` is gone; than `soft`, stale. A hard
/// mark is an expiry too, so `soft >= hard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mark {
    /// The generation of the last invalidation.
    pub hard: u64,
    /// The generation of the last invalidation or expiry.
    pub soft: u64,
}

impl Mark {
    /// The mark after one more of `kind` at generation `gen`.
    pub fn after(self, kind: MarkKind, gen: u64) -> Mark {
        match kind {
            MarkKind::Hard => Mark {
                hard: gen,
                soft: gen,
            },
            MarkKind::Soft => Mark {
                hard: self.hard,
                soft: gen,
            },
        }
    }

    /// The mark as stored: `"<hard> <soft>"`, readable with `redis-cli`.
    pub fn to_stored(self) -> String {
        format!("{} {}", self.hard, self.soft)
    }

    /// A stored mark; anything else reads as no mark at all (a key another
    /// client wrote over is no evidence of an invalidation).
    pub fn from_stored(bytes: &[u8]) -> Mark {
        let parsed = std::str::from_utf8(bytes).ok().and_then(|s| {
            let (hard, soft) = s.split_once(' ')?;
            Some(Mark {
                hard: hard.parse().ok().filter(|g| *g <= MAX_GENERATION)?,
                soft: soft.parse().ok().filter(|g| *g <= MAX_GENERATION)?,
            })
        });
        parsed.unwrap_or_default()
    }
}

/// What [`Backend::mark`](super::Backend::mark) records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    /// Values written before are gone: a miss.
    Hard,
    /// Values written before are stale: served within their grace window
    /// while one refresh runs.
    Soft,
}

pub(super) fn unsupported(op: &str) -> BackendError {
    BackendError::new(
        BackendErrorKind::Unsupported,
        format!("{op}: this backend does not store tags' and namespaces' marks"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip_and_garbage_is_no_mark() {
        let mark = Mark::default()
            .after(MarkKind::Soft, 5)
            .after(MarkKind::Hard, 9);
        assert_eq!(mark, Mark { hard: 9, soft: 9 });
        let mark = mark.after(MarkKind::Soft, 12);
        assert_eq!(Mark::from_stored(mark.to_stored().as_bytes()), mark);
        for garbage in [
            &b""[..],
            b"12",
            b"a b",
            b"1 2 3",
            b"\xff",
            b"18446744073709551615 18446744073709551615",
        ] {
            assert_eq!(Mark::from_stored(garbage), Mark::default());
        }
    }
}
