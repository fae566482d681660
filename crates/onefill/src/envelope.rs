//! The stored value: a small versioned binary header, then the codec's bytes.
//!
//! ```text
//! offset  size  field
//! 0       1     magic 0xF1
//! 1       1     format version (1)
//! 2       1     kind: 0 value, 1 cached failure (payload = UTF-8 message), 2 absent
//! 3       1     fresh TTL written, log scale (0: not recorded; see below)
//! 4       8     grace in milliseconds, big-endian
//! 12      4     delta: how long the load took, in milliseconds (rounded up), big-endian
//! 16      ..    payload
//! ```
//!
//! Version 2 (decision 0011) is version 1's header with version byte 2,
//! then the hard expiry, then the payload:
//!
//! ```text
//! 16      8     expires at: unix milliseconds of the SERVER's clock, big-endian
//! 24      ..    payload
//! ```
//!
//! Versions 3 and 4 are versions 1 and 2 with the marks block (decision
//! 0018) between the header (and expiry) and the payload:
//!
//! ```text
//! +0      8     as of: the namespace's mark generation when the load began, big-endian
//! +8      1     number of tags (at most 32)
//! +9      ..    each tag: its length in bytes (1..=200), then its bytes
//! ```
//!
//! Version 6 is version 4 with, after the expiry, the instant the value
//! was written:
//!
//! ```text
//! 24      8     written at: unix milliseconds of the SERVER's clock, big-endian
//! 32      ..    the marks block, then the payload
//! ```
//!
//! onefill encodes version 3; the Redis scripts that write a value turn it
//! into version 6 (a version 1 into 2), stamping the expiry and the write
//! from the server's own clock (`TIME`) and writing the key with `PXAT`
//! that same expiry, so the field is exactly the key's expiry. A Redis hit
//! can then be a plain `GET`; a replayed invalidation keeps a value written
//! after the write it replays (`invalidate.lua`). Versions 1, 2 and 4 stay
//! readable (1 and 2: as of generation 0, untagged).
//!
//! The backend key's TTL is the hard TTL (`fresh + grace`): the value is
//! fresh while the server reports `PTTL > grace`. The Redis scripts read the
//! grace from bytes 4..12 with the same layout in both versions (see
//! `backend/redis`), so a change here is a new version number, never a
//! silent reshuffle.
//!
//! Byte 3 was reserved (always 0) in the first release of version 1, and
//! readers ignored it; it now records the fresh TTL the value was written
//! with (after jitter, without grace), so readers size the early-refresh
//! window from the value's own TTL (which a loader may choose with `Loaded`)
//! rather than their cache's. Code `b` in 1..=255 stands for at least
//! `2^((b-1)/8)` ms (a lower bound within 9 %, up to about 40 days); 0 is
//! "not recorded" (bytes from before, a `set`), and readers then use their
//! policy's TTL, as they always did. Older readers ignore the byte, so this
//! stays version 1.

use std::time::Duration;

pub(crate) const MAGIC: u8 = 0xF1;
/// Version 1: the header alone.
pub(crate) const VERSION_1: u8 = 1;
pub(crate) const HEADER_LEN: usize = 16;
/// Version 2: [`HEADER_LEN`], then the server's expiry (8 bytes).
pub(crate) const VERSION_2: u8 = 2;
pub(crate) const HEADER_2_LEN: usize = HEADER_LEN + 8;
/// Version 3: version 1 and the marks block (what onefill encodes).
pub(crate) const VERSION_3: u8 = 3;
/// Version 4: version 2 and the marks block (what the Redis scripts store
/// of a version 3).
pub(crate) const VERSION_4: u8 = 4;
/// Version 6: version 4 with the server's instant of the write (8 bytes)
/// after the expiry (what the Redis scripts store of a version 3).
pub(crate) const VERSION_6: u8 = 6;
pub(crate) const HEADER_6_LEN: usize = HEADER_2_LEN + 8;
/// The version onefill encodes (the Redis scripts store version 6).
pub(crate) const VERSION: u8 = VERSION_3;
/// The most tags one value may carry, and the longest tag (bytes): the
/// marks block records each tag's length in one byte.
pub const MAX_TAGS: usize = 32;
/// See [`MAX_TAGS`].
pub const MAX_TAG_BYTES: usize = 200;
/// The marks block's fixed part: `as_of` (8 bytes) and the tag count.
const MARKS_FIXED: usize = 9;

/// What an envelope holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Value = 0,
    Failure = 1,
    Absent = 2,
}

/// A decoded header plus a borrowed payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Envelope<'a> {
    pub kind: Kind,
    pub grace: Duration,
    pub delta: Duration,
    /// At most the fresh TTL the value was written with, if recorded.
    pub written_ttl: Option<Duration>,
    /// The namespace's generation its load began at, and its tags (none
    /// recorded: versions 1 and 2).
    pub marks: ValueMarks<'a>,
    pub payload: &'a [u8],
}

/// What a stored value records for the namespace's marks (see
/// `marks/`): the generation of the namespace's marks when its load began
/// (0: not recorded, older than any mark) and its tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ValueMarks<'a> {
    pub as_of: u64,
    /// The tags, each a length byte then its bytes (checked by `decode`).
    tags: &'a [u8],
    count: u8,
}

impl<'a> ValueMarks<'a> {
    /// The value's tags, as stored.
    pub(crate) fn tags(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let mut rest = self.tags;
        (0..self.count).filter_map(move |_| {
            let (&len, after) = rest.split_first()?;
            let (tag, after) = after.split_at_checked(usize::from(len))?;
            rest = after;
            Some(tag)
        })
    }
}

/// Why stored bytes could not be read; each is a miss for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeError {
    Truncated,
    BadMagic,
    UnknownVersion(u8),
    UnknownKind(u8),
    /// A marks block that runs past the bytes, or an empty tag.
    BadMarks,
}

/// The envelope of `payload`; `written_ttl` is the fresh TTL the value is
/// written with (`None`: not recorded); `as_of` and `tags` its marks (the
/// cache checked the tags: at most [`MAX_TAGS`], each 1 to
/// [`MAX_TAG_BYTES`] bytes; any beyond are left out rather than stored
/// wrong).
pub(crate) fn encode(
    kind: Kind,
    grace: Duration,
    delta: Duration,
    written_ttl: Option<Duration>,
    as_of: u64,
    tags: &[String],
    payload: &[u8],
) -> Vec<u8> {
    let tags: Vec<&String> = tags
        .iter()
        .filter(|t| (1..=MAX_TAG_BYTES).contains(&t.len()))
        .take(MAX_TAGS)
        .collect();
    let tag_bytes: usize = tags.iter().map(|t| 1 + t.len()).sum();
    let mut out = Vec::with_capacity(HEADER_LEN + MARKS_FIXED + tag_bytes + payload.len());
    let ttl_code = written_ttl.map_or(0, ttl_code);
    out.extend_from_slice(&[MAGIC, VERSION, kind as u8, ttl_code]);
    out.extend_from_slice(&millis_u64(grace).to_be_bytes());
    // Rounded up: a load under a millisecond is still a measured load (0
    // means "not measured": a `set`, a fail-safe re-store), and early
    // refresh needs its delta.
    let delta_ms = millis_u64(delta) + u64::from(!delta.subsec_nanos().is_multiple_of(1_000_000));
    out.extend_from_slice(&(delta_ms.min(u32::MAX as u64) as u32).to_be_bytes());
    out.extend_from_slice(&as_of.to_be_bytes());
    out.push(tags.len() as u8);
    for tag in tags {
        out.push(tag.len() as u8);
        out.extend_from_slice(tag.as_bytes());
    }
    out.extend_from_slice(payload);
    out
}

/// How long the envelope of a `payload_len`-byte payload with `tags` is.
pub(crate) fn encoded_len(payload_len: usize, tags: &[String]) -> usize {
    let tags: usize = tags.iter().take(MAX_TAGS).map(|t| 1 + t.len()).sum();
    HEADER_LEN + MARKS_FIXED + tags + payload_len
}

/// The checks every reader of stored bytes makes (an envelope of a known
/// version and kind, long enough for its header): its kind and where what
/// follows the header starts ([`HEADER_LEN`] for versions 1 and 3,
/// [`HEADER_2_LEN`] for 2 and 4, which record the server's expiry,
/// [`HEADER_6_LEN`] for 6, which records the write's instant too).
fn check(bytes: &[u8]) -> Result<(Kind, usize), DecodeError> {
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    if bytes[0] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let body_at = match bytes[1] {
        VERSION_1 | VERSION_3 => HEADER_LEN,
        VERSION_2 | VERSION_4 if bytes.len() >= HEADER_2_LEN => HEADER_2_LEN,
        VERSION_2 | VERSION_4 => return Err(DecodeError::Truncated),
        VERSION_6 if bytes.len() >= HEADER_6_LEN => HEADER_6_LEN,
        VERSION_6 => return Err(DecodeError::Truncated),
        other => return Err(DecodeError::UnknownVersion(other)),
    };
    let kind = match bytes[2] {
        0 => Kind::Value,
        1 => Kind::Failure,
        2 => Kind::Absent,
        other => return Err(DecodeError::UnknownKind(other)),
    };
    Ok((kind, body_at))
}

/// The marks block of checked bytes whose body starts at `body_at`, and
/// where the payload starts.
fn marks_block(bytes: &[u8], body_at: usize) -> Result<(ValueMarks<'_>, usize), DecodeError> {
    if !matches!(bytes[1], VERSION_3 | VERSION_4 | VERSION_6) {
        return Ok((ValueMarks::default(), body_at));
    }
    let fixed = bytes
        .get(body_at..body_at + MARKS_FIXED)
        .ok_or(DecodeError::Truncated)?;
    let mut as_of = [0u8; 8];
    as_of.copy_from_slice(&fixed[..8]);
    let count = fixed[8];
    let tags_at = body_at + MARKS_FIXED;
    let mut at = tags_at;
    for _ in 0..count {
        let len = usize::from(*bytes.get(at).ok_or(DecodeError::Truncated)?);
        if len == 0 {
            return Err(DecodeError::BadMarks);
        }
        at += 1 + len;
        if at > bytes.len() {
            return Err(DecodeError::Truncated);
        }
    }
    let marks = ValueMarks {
        as_of: u64::from_be_bytes(as_of),
        tags: &bytes[tags_at..at],
        count,
    };
    Ok((marks, at))
}

/// The marks a stored value records, if it is an envelope this release
/// reads (default marks for versions 1 and 2).
pub(crate) fn marks_of(bytes: &[u8]) -> Option<ValueMarks<'_>> {
    let (_, body_at) = check(bytes).ok()?;
    marks_block(bytes, body_at).ok().map(|(marks, _)| marks)
}

/// The grace field of a checked header.
fn grace_field(bytes: &[u8]) -> Duration {
    let mut grace = [0u8; 8];
    grace.copy_from_slice(&bytes[4..12]);
    Duration::from_millis(u64::from_be_bytes(grace))
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Envelope<'_>, DecodeError> {
    let (kind, body_at) = check(bytes)?;
    let (marks, payload_at) = marks_block(bytes, body_at)?;
    // The length was checked: these copies cannot fail.
    let mut delta = [0u8; 4];
    delta.copy_from_slice(&bytes[12..16]);
    Ok(Envelope {
        kind,
        grace: grace_field(bytes),
        delta: Duration::from_millis(u64::from(u32::from_be_bytes(delta))),
        written_ttl: ttl_of_code(bytes[3]),
        marks,
        payload: &bytes[payload_at..],
    })
}

/// Turns a stamped envelope (version 2, 4 or 6) back into the bytes that
/// were written (version 1 or 3: the Redis backend answers what it was
/// given); anything else is left as it is.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn strip_expiry(bytes: &mut Vec<u8>) {
    let Ok((_, body_at)) = check(bytes) else {
        return;
    };
    if body_at > HEADER_LEN {
        // 2 → 1, 4 → 3, 6 → 3: the same layout without the stamps.
        bytes[1] = if bytes[1] == VERSION_2 {
            VERSION_1
        } else {
            VERSION_3
        };
        bytes.drain(HEADER_LEN..body_at);
    }
}

/// The server's expiry (unix ms) a stamped envelope (version 2, 4 or 6)
/// records, or `None` for anything else (versions 1 and 3, bytes of
/// another writer, truncated).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn expires_at_ms(bytes: &[u8]) -> Option<u64> {
    match check(bytes) {
        Ok((_, body_at)) if body_at > HEADER_LEN => {}
        _ => return None,
    }
    let mut at = [0u8; 8];
    at.copy_from_slice(&bytes[HEADER_LEN..HEADER_2_LEN]);
    Some(u64::from_be_bytes(at))
}

/// The server's instant (unix ms) a version-6 envelope was written at, or
/// `None` for anything else.
#[cfg(test)]
pub(crate) fn written_at_ms(bytes: &[u8]) -> Option<u64> {
    match check(bytes) {
        Ok((_, HEADER_6_LEN)) => {}
        _ => return None,
    }
    let mut at = [0u8; 8];
    at.copy_from_slice(&bytes[HEADER_2_LEN..HEADER_6_LEN]);
    Some(u64::from_be_bytes(at))
}

/// The grace period recorded in stored bytes, or `None` if they are not an
/// envelope we can read (the backends then treat the value as not fresh).
pub(crate) fn grace_of(bytes: &[u8]) -> Option<Duration> {
    // The header alone (a Redis hit asks this of every fresh value).
    check(bytes).ok().map(|_| grace_field(bytes))
}

/// Steps per doubling of the TTL code: 2^(1/8) ≈ 1.09.
const TTL_STEPS: f64 = 8.0;

/// The code of a fresh TTL: the largest `b` with `2^((b-1)/8)` ms at most
/// `ttl` (1 for anything under 1 ms, 255 at most).
fn ttl_code(ttl: Duration) -> u8 {
    let ms = ttl.as_secs_f64() * 1000.0;
    if ms < 1.0 {
        return 1;
    }
    // A float's `as` saturates: never out of range.
    let steps = (ms.log2() * TTL_STEPS + 1e-9).floor() + 1.0;
    steps.min(255.0) as u8
}

/// The TTL a code stands for, at most the TTL written.
fn ttl_of_code(code: u8) -> Option<Duration> {
    if code == 0 {
        return None;
    }
    let ms = (f64::from(code - 1) / TTL_STEPS).exp2();
    Some(Duration::from_secs_f64(ms / 1000.0))
}

pub(crate) fn millis_u64(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An untagged envelope, as of generation 0.
    fn enc(
        kind: Kind,
        grace: Duration,
        delta: Duration,
        ttl: Option<Duration>,
        payload: &[u8],
    ) -> Vec<u8> {
        encode(kind, grace, delta, ttl, 0, &[], payload)
    }

    /// What onefill writes now: version 3, the marks block between the
    /// header and the payload; the Redis scripts' version 4 inserts the
    /// expiry before it, and the backend hands version 3 back.
    #[test]
    fn version_3_carries_the_marks_and_version_4_the_expiry_too() {
        let tags = ["seller:7".to_owned(), "c".to_owned()];
        let bytes = encode(
            Kind::Value,
            Duration::from_secs(1),
            Duration::ZERO,
            None,
            0x0102_0304_0506_0708,
            &tags,
            b"pay",
        );
        assert_eq!(bytes[1], 3);
        let env = decode(&bytes).unwrap();
        assert_eq!(env.marks.as_of, 0x0102_0304_0506_0708);
        let read: Vec<&[u8]> = env.marks.tags().collect();
        assert_eq!(read, [b"seller:7".as_slice(), b"c"]);
        assert_eq!(env.payload, b"pay");
        assert_eq!(expires_at_ms(&bytes), None);
        // As stamp.lua stores it.
        let mut v4 = bytes[..16].to_vec();
        v4[1] = 4;
        v4.extend_from_slice(&1_700_000_000_000u64.to_be_bytes());
        v4.extend_from_slice(&bytes[16..]);
        assert_eq!(expires_at_ms(&v4), Some(1_700_000_000_000));
        assert_eq!(decode(&v4).unwrap().marks, env.marks);
        assert_eq!(decode(&v4).unwrap().payload, b"pay");
        strip_expiry(&mut v4);
        assert_eq!(v4, bytes);
        // Version 6: the write's instant after the expiry.
        let mut v6 = bytes[..16].to_vec();
        v6[1] = 6;
        v6.extend_from_slice(&1_700_000_000_000u64.to_be_bytes());
        v6.extend_from_slice(&1_699_999_999_000u64.to_be_bytes());
        v6.extend_from_slice(&bytes[16..]);
        assert_eq!(expires_at_ms(&v6), Some(1_700_000_000_000));
        assert_eq!(written_at_ms(&v6), Some(1_699_999_999_000));
        assert_eq!(written_at_ms(&bytes), None);
        assert_eq!(decode(&v6).unwrap().marks, env.marks);
        assert_eq!(decode(&v6).unwrap().payload, b"pay");
        assert_eq!(decode(&v6[..31]), Err(DecodeError::Truncated));
        strip_expiry(&mut v6);
        assert_eq!(v6, bytes);
        // A block cut short or with an empty tag is not read as a value.
        assert_eq!(decode(&bytes[..30]), Err(DecodeError::Truncated));
        let mut empty_tag = bytes.clone();
        empty_tag[16 + 9] = 0;
        assert_eq!(decode(&empty_tag), Err(DecodeError::BadMarks));
        // Versions 1 and 2 record no marks: as of generation 0, untagged.
        let mut v1 = bytes[..16].to_vec();
        v1[1] = 1;
        v1.extend_from_slice(b"pay");
        assert_eq!(decode(&v1).unwrap().marks, ValueMarks::default());
    }

    /// Tags past the limits are left out, never stored wrong (the cache
    /// refuses them before; this is the last line).
    #[test]
    fn tags_past_the_limits_are_left_out() {
        let mut tags: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
        tags.insert(0, String::new());
        tags.insert(1, "x".repeat(MAX_TAG_BYTES + 1));
        let bytes = encode(
            Kind::Value,
            Duration::ZERO,
            Duration::ZERO,
            None,
            1,
            &tags,
            b"",
        );
        let env = decode(&bytes).unwrap();
        assert_eq!(env.marks.tags().count(), MAX_TAGS);
        assert_eq!(env.marks.tags().next(), Some(b"t0".as_slice()));
    }

    /// Regression: a load under a millisecond was stored as
    /// delta 0 ("not measured"), which turned early refresh off.
    #[test]
    fn a_sub_millisecond_load_is_a_measured_load() {
        let bytes = enc(
            Kind::Value,
            Duration::ZERO,
            Duration::from_micros(300),
            None,
            b"x",
        );
        assert_eq!(decode(&bytes).unwrap().delta, Duration::from_millis(1));
        let bytes = enc(Kind::Value, Duration::ZERO, Duration::ZERO, None, b"x");
        assert_eq!(
            decode(&bytes).unwrap().delta,
            Duration::ZERO,
            "a set: not measured"
        );
        let bytes = enc(
            Kind::Value,
            Duration::ZERO,
            Duration::from_millis(42),
            None,
            b"x",
        );
        assert_eq!(decode(&bytes).unwrap().delta, Duration::from_millis(42));
    }

    #[test]
    fn round_trip() {
        let bytes = enc(
            Kind::Value,
            Duration::from_secs(5),
            Duration::from_millis(200),
            None,
            b"{\"a\":1}",
        );
        let env = decode(&bytes).unwrap();
        assert_eq!(env.kind, Kind::Value);
        assert_eq!(env.grace, Duration::from_secs(5));
        assert_eq!(env.delta, Duration::from_millis(200));
        assert_eq!(env.payload, b"{\"a\":1}");
    }

    /// Bytes written by format version 1 must stay readable by every later
    /// release: this literal is what v1 wrote.
    #[test]
    fn reads_version_1_bytes() {
        let v1: &[u8] = &[
            0xF1, 1, 0, 0, // magic, version, kind=value, reserved
            0, 0, 0, 0, 0, 0, 0x13, 0x88, // grace = 5000 ms
            0, 0, 0, 0x2A, // delta = 42 ms
            b'7',
        ];
        let env = decode(v1).unwrap();
        assert_eq!(env.kind, Kind::Value);
        assert_eq!(env.grace, Duration::from_millis(5000));
        assert_eq!(env.delta, Duration::from_millis(42));
        assert_eq!(env.written_ttl, None, "byte 3 was reserved (0)");
        assert_eq!(env.payload, b"7");
    }

    /// The recorded TTL is a lower bound of the one written, within 9 %,
    /// from 1 ms to the longest TTL accepted.
    #[test]
    fn the_written_ttl_is_a_close_lower_bound() {
        let mut ms = 1u64;
        while ms <= crate::options::MAX_TTL.as_millis() as u64 {
            let ttl = Duration::from_millis(ms);
            let bytes = enc(Kind::Value, Duration::ZERO, Duration::ZERO, Some(ttl), b"");
            let read = decode(&bytes).unwrap().written_ttl.unwrap();
            assert!(read <= ttl, "{ms} ms read as {read:?}");
            if ms <= 1 << 31 {
                assert!(
                    read.as_secs_f64() >= ttl.as_secs_f64() / 1.091,
                    "{ms}: {read:?}"
                );
            }
            ms = ms * 3 / 2 + 1;
        }
        let bytes = enc(
            Kind::Value,
            Duration::ZERO,
            Duration::ZERO,
            Some(Duration::ZERO),
            b"",
        );
        assert_eq!(
            decode(&bytes).unwrap().written_ttl,
            Some(Duration::from_millis(1))
        );
    }

    /// Version 2, as the Redis scripts write it (decision 0011): pinned like
    /// version 1.
    #[test]
    fn reads_version_2_bytes() {
        let v2: &[u8] = &[
            0xF1, 2, 1, 0, // magic, version, kind=failure, reserved
            0, 0, 0, 0, 0, 0, 0x13, 0x88, // grace = 5000 ms
            0, 0, 0, 0x2A, // delta = 42 ms
            0, 0, 0x01, 0x8B, 0xCF, 0xE5, 0x68, 0x00, // expires at 1_700_000_000_000 ms
            b'n', b'o',
        ];
        let env = decode(v2).unwrap();
        assert_eq!(env.kind, Kind::Failure);
        assert_eq!(env.grace, Duration::from_millis(5000));
        assert_eq!(env.delta, Duration::from_millis(42));
        assert_eq!(env.payload, b"no");
        assert_eq!(expires_at_ms(v2), Some(1_700_000_000_000));
        // Version 1 has no expiry; a version 2 cut short is truncated.
        assert_eq!(
            expires_at_ms(&enc(Kind::Value, Duration::ZERO, Duration::ZERO, None, b"")),
            None
        );
        assert_eq!(decode(&v2[..20]), Err(DecodeError::Truncated));
        // What the Redis backend answers: the version-1 bytes written.
        let mut read = v2.to_vec();
        strip_expiry(&mut read);
        let mut v1 = v2[..16].to_vec();
        v1[1] = 1;
        v1.extend_from_slice(b"no");
        assert_eq!(read, v1);
        let mut other = b"not an envelope, 24 bytes or more".to_vec();
        strip_expiry(&mut other);
        assert_eq!(other, b"not an envelope, 24 bytes or more");
        assert_eq!(expires_at_ms(&v2[..20]), None);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert_eq!(decode(b""), Err(DecodeError::Truncated));
        assert_eq!(decode(&[0u8; 32]), Err(DecodeError::BadMagic));
        let mut future = enc(Kind::Value, Duration::ZERO, Duration::ZERO, None, b"");
        future[1] = 9;
        assert_eq!(decode(&future), Err(DecodeError::UnknownVersion(9)));
        future[1] = VERSION;
        future[2] = 7;
        assert_eq!(decode(&future), Err(DecodeError::UnknownKind(7)));
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = decode(&bytes);
            let _ = expires_at_ms(&bytes);
        }
    }
}
