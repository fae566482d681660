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
//! onefill encodes version 1; the Redis scripts that write a value turn it
//! into version 2, stamping the expiry from the server's own clock (`TIME`)
//! and writing the key with `PXAT` that same instant, so the field is
//! exactly the key's expiry. A Redis hit can then be a plain `GET`.
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
/// The version onefill encodes (the Redis scripts store version 2).
pub(crate) const VERSION: u8 = 1;
pub(crate) const HEADER_LEN: usize = 16;
/// Version 2: [`HEADER_LEN`], then the server's expiry (8 bytes).
pub(crate) const VERSION_2: u8 = 2;
pub(crate) const HEADER_2_LEN: usize = HEADER_LEN + 8;

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
    pub payload: &'a [u8],
}

/// Why stored bytes could not be read; each is a miss for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeError {
    Truncated,
    BadMagic,
    UnknownVersion(u8),
    UnknownKind(u8),
}

/// The envelope of `payload`; `written_ttl` is the fresh TTL the value is
/// written with (`None`: not recorded).
pub(crate) fn encode(
    kind: Kind,
    grace: Duration,
    delta: Duration,
    written_ttl: Option<Duration>,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    let ttl_code = written_ttl.map_or(0, ttl_code);
    out.extend_from_slice(&[MAGIC, VERSION, kind as u8, ttl_code]);
    out.extend_from_slice(&millis_u64(grace).to_be_bytes());
    // Rounded up: a load under a millisecond is still a measured load (0
    // means "not measured": a `set`, a fail-safe re-store), and early
    // refresh needs its delta.
    let delta_ms = millis_u64(delta) + u64::from(!delta.subsec_nanos().is_multiple_of(1_000_000));
    out.extend_from_slice(&(delta_ms.min(u32::MAX as u64) as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The checks every reader of stored bytes makes (an envelope of a known
/// version and kind, long enough for its header): its kind and where its
/// payload starts ([`HEADER_LEN`] for version 1, [`HEADER_2_LEN`] for 2).
fn check(bytes: &[u8]) -> Result<(Kind, usize), DecodeError> {
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    if bytes[0] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let payload_at = match bytes[1] {
        VERSION => HEADER_LEN,
        VERSION_2 if bytes.len() >= HEADER_2_LEN => HEADER_2_LEN,
        VERSION_2 => return Err(DecodeError::Truncated),
        other => return Err(DecodeError::UnknownVersion(other)),
    };
    let kind = match bytes[2] {
        0 => Kind::Value,
        1 => Kind::Failure,
        2 => Kind::Absent,
        other => return Err(DecodeError::UnknownKind(other)),
    };
    Ok((kind, payload_at))
}

/// The grace field of a checked header.
fn grace_field(bytes: &[u8]) -> Duration {
    let mut grace = [0u8; 8];
    grace.copy_from_slice(&bytes[4..12]);
    Duration::from_millis(u64::from_be_bytes(grace))
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Envelope<'_>, DecodeError> {
    let (kind, payload_at) = check(bytes)?;
    // The length was checked: these copies cannot fail.
    let mut delta = [0u8; 4];
    delta.copy_from_slice(&bytes[12..16]);
    Ok(Envelope {
        kind,
        grace: grace_field(bytes),
        delta: Duration::from_millis(u64::from(u32::from_be_bytes(delta))),
        written_ttl: ttl_of_code(bytes[3]),
        payload: &bytes[payload_at..],
    })
}

/// Turns a version-2 envelope back into the version-1 bytes that were
/// written (the Redis backend answers what it was given); anything else is
/// left as it is.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn strip_expiry(bytes: &mut Vec<u8>) {
    if expires_at_ms(bytes).is_some() {
        bytes[1] = VERSION;
        bytes.drain(HEADER_LEN..HEADER_2_LEN);
    }
}

/// The server's expiry (unix ms) a version-2 envelope records, or `None`
/// for anything else (version 1, bytes of another writer, truncated).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn expires_at_ms(bytes: &[u8]) -> Option<u64> {
    match check(bytes) {
        Ok((_, HEADER_2_LEN)) => {}
        _ => return None,
    }
    let mut at = [0u8; 8];
    at.copy_from_slice(&bytes[HEADER_LEN..HEADER_2_LEN]);
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

    /// Regression: a load under a millisecond was stored as
    /// delta 0 ("not measured"), which turned early refresh off.
    #[test]
    fn a_sub_millisecond_load_is_a_measured_load() {
        let bytes = encode(
            Kind::Value,
            Duration::ZERO,
            Duration::from_micros(300),
            None,
            b"x",
        );
        assert_eq!(decode(&bytes).unwrap().delta, Duration::from_millis(1));
        let bytes = encode(Kind::Value, Duration::ZERO, Duration::ZERO, None, b"x");
        assert_eq!(
            decode(&bytes).unwrap().delta,
            Duration::ZERO,
            "a set: not measured"
        );
        let bytes = encode(
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
        let bytes = encode(
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
            let bytes = encode(Kind::Value, Duration::ZERO, Duration::ZERO, Some(ttl), b"");
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
        let bytes = encode(
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
            expires_at_ms(&encode(
                Kind::Value,
                Duration::ZERO,
                Duration::ZERO,
                None,
                b""
            )),
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
        let mut future = encode(Kind::Value, Duration::ZERO, Duration::ZERO, None, b"");
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
