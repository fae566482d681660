//! A codec that compresses what another codec encodes (lz4), above a size
//! threshold, with a bound on what a stored value may decompress to.

use std::borrow::Cow;

use super::{Codec, Marker};
use crate::error::CodecError;

/// Byte 0 of a value stored as `C` encoded it.
const RAW: u8 = 0;
/// Byte 0 of a value stored as an lz4 block.
const LZ4: u8 = 1;
/// Tag, then the decompressed length (u32, little-endian).
const LZ4_HEADER_LEN: usize = 1 + 4;

/// Compresses the bytes of another codec `C` with lz4 (feature
/// `compression`), when they are at least a threshold long.
///
/// ```
/// use onefill::{Codec, Compressed, JsonCodec};
///
/// let codec = Compressed::new(JsonCodec).threshold(512);
/// let records = vec!["the same record, again and again".to_string(); 100];
/// let bytes = codec.encode("users:{7}", &records)?;
/// assert!(bytes.len() < 200, "{} bytes", bytes.len()); // JSON: 3,501 bytes
/// let back: Vec<String> = codec.decode("users:{7}", &bytes)?;
/// assert_eq!(back, records);
/// # Ok::<(), onefill::CodecError>(())
/// ```
///
/// # Why lz4 (`lz4_flex`)
///
/// A cache decompresses on every hit of its store, so decompression speed
/// is what counts: lz4 decompresses at gigabytes per second, and
/// `lz4_flex` is pure Rust (no C toolchain, nothing built at compile time;
/// its safe, bounds-checked decoder is the one used here, since stored
/// bytes are input). zstd compresses smaller but builds C code and decodes
/// several times slower.
///
/// # Threshold
///
/// Encodings shorter than the [threshold](Compressed::threshold) (default
/// [`DEFAULT_THRESHOLD`](Compressed::DEFAULT_THRESHOLD), 1 KiB) are stored
/// as they are behind a one-byte header: below that, lz4 saves little and
/// its block overhead can make a value larger. So can an encoding that
/// does not compress (already compressed, or encrypted): one that lz4 does
/// not make smaller is stored as it is too. The cost for those is one byte.
///
/// # Wire format
///
/// ```text
/// offset  size  field
/// 0       1     0: as C encoded it; 1: an lz4 block
/// 1       ..    (0) C's bytes
/// 1       4     (1) C's length, little-endian u32
/// 5       ..    (1) the lz4 block
/// ```
///
/// # Decompression bound
///
/// A stored value says what it decompresses to; one that claims more than
/// [`max_decompressed_bytes`](Compressed::max_decompressed_bytes) (default
/// 8 MiB, the cache's default `max_value_bytes`) is a decode error (a miss,
/// counted) without any allocation, and so is a block that does not
/// decompress to exactly its stated length: bytes in the store cannot make
/// a reader allocate more than the bound, or panic. A value larger than the
/// bound is refused when written (the caller gets
/// [`Error::Encode`](crate::Error::Encode)), since it could not be read.
///
/// # With encryption
///
/// Compress first, then encrypt: `Encrypted<Compressed<C>>` (feature
/// `encryption`). Ciphertext is indistinguishable from random bytes and
/// does not compress, so `Compressed<Encrypted<C>>` would spend the
/// compression's time on every write and store every value as it is.
/// Under encryption, a value's stored length still follows how well it
/// compresses (see `Encrypted`'s threat model).
#[derive(Debug, Clone)]
pub struct Compressed<C> {
    inner: C,
    threshold: usize,
    max_decompressed: usize,
}

impl<C> Compressed<C> {
    /// Encodings at least this long are compressed, unless set otherwise:
    /// 1 KiB.
    pub const DEFAULT_THRESHOLD: usize = 1024;
    /// What a stored value may decompress to, unless set otherwise: 8 MiB,
    /// the cache's default `max_value_bytes`.
    pub const DEFAULT_MAX_DECOMPRESSED_BYTES: usize = 8 * 1024 * 1024;

    /// Compresses what `inner` encodes, with the default threshold and
    /// bound.
    pub fn new(inner: C) -> Self {
        Compressed {
            inner,
            threshold: Self::DEFAULT_THRESHOLD,
            max_decompressed: Self::DEFAULT_MAX_DECOMPRESSED_BYTES,
        }
    }

    /// Compresses encodings of at least `bytes` bytes (0: all of them).
    #[must_use]
    pub fn threshold(mut self, bytes: usize) -> Self {
        self.threshold = bytes;
        self
    }

    /// The most a stored value may decompress to (also the largest
    /// encoding this codec writes); at most `u32::MAX`. Raise it with the
    /// cache's `max_value_bytes` if values are compressed below that limit
    /// from sizes above it.
    #[must_use]
    pub fn max_decompressed_bytes(mut self, bytes: usize) -> Self {
        self.max_decompressed = bytes.min(u32::MAX as usize);
        self
    }

    /// `bytes` decompressed (or borrowed, if stored as they were).
    fn expand<'a>(&self, bytes: &'a [u8]) -> Result<Expanded<'a>, CodecError> {
        match bytes.split_first() {
            Some((&RAW, rest)) => Ok(Expanded::Raw(rest)),
            Some((&LZ4, rest)) if rest.len() >= 4 => {
                let (len, block) = rest.split_at(4);
                let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
                if len > self.max_decompressed {
                    return Err(CodecError::msg(format!(
                        "the value claims to decompress to {len} bytes, over the limit of {}",
                        self.max_decompressed
                    )));
                }
                let plain = lz4_flex::block::decompress(block, len).map_err(CodecError::new)?;
                if plain.len() != len {
                    return Err(CodecError::msg(format!(
                        "the value decompresses to {} bytes, not the {len} it claims",
                        plain.len()
                    )));
                }
                Ok(Expanded::Decompressed(plain))
            }
            Some((&LZ4, _)) => Err(CodecError::msg("a compressed value without its length")),
            Some((tag, _)) => Err(CodecError::msg(format!("unknown compression tag {tag}"))),
            None => Err(CodecError::msg("an empty value")),
        }
    }
}

/// A stored value's encoding by `C`.
enum Expanded<'a> {
    Raw(&'a [u8]),
    Decompressed(Vec<u8>),
}

impl Expanded<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Expanded::Raw(bytes) => bytes,
            Expanded::Decompressed(bytes) => bytes,
        }
    }
}

impl<V, C: Codec<V>> Codec<V> for Compressed<C> {
    fn encode(&self, key: &str, value: &V) -> Result<Vec<u8>, CodecError> {
        let plain = self.inner.encode(key, value)?;
        if plain.len() > self.max_decompressed {
            return Err(CodecError::msg(format!(
                "the encoding is {} bytes, over the compressed codec's limit of {} \
                 (`max_decompressed_bytes`): it could not be read back",
                plain.len(),
                self.max_decompressed
            )));
        }
        if plain.len() >= self.threshold {
            let mut out =
                vec![0; LZ4_HEADER_LEN + lz4_flex::block::get_maximum_output_size(plain.len())];
            let written = lz4_flex::block::compress_into(&plain, &mut out[LZ4_HEADER_LEN..])
                .map_err(CodecError::new)?;
            // Smaller than storing it as it is (one header byte), or not at all.
            if LZ4_HEADER_LEN + written < 1 + plain.len() {
                out[0] = LZ4;
                // Within u32: `max_decompressed` is.
                out[1..LZ4_HEADER_LEN].copy_from_slice(&(plain.len() as u32).to_le_bytes());
                out.truncate(LZ4_HEADER_LEN + written);
                return Ok(out);
            }
        }
        let mut out = Vec::with_capacity(1 + plain.len());
        out.push(RAW);
        out.extend_from_slice(&plain);
        Ok(out)
    }

    fn decode(&self, key: &str, bytes: &[u8]) -> Result<V, CodecError> {
        self.inner.decode(key, self.expand(bytes)?.bytes())
    }

    /// Decompresses, then leaves the check to `C` (which may skip decoding).
    fn check_round_trip(&self, key: &str, bytes: &[u8]) -> Result<(), CodecError> {
        self.inner
            .check_round_trip(key, self.expand(bytes)?.bytes())
    }

    /// `C`'s: markers are too short to compress, and a codec inside
    /// (`Encrypted`, in the wrong order) must still protect them.
    fn seal(&self, key: &str, marker: Marker, payload: &[u8]) -> Result<Vec<u8>, CodecError> {
        self.inner.seal(key, marker, payload)
    }

    fn open<'a>(
        &self,
        key: &str,
        marker: Marker,
        stored: &'a [u8],
    ) -> Result<Cow<'a, [u8]>, CodecError> {
        self.inner.open(key, marker, stored)
    }
}
