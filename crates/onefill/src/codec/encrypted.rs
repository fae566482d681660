//! A codec that encrypts what another codec encodes: XChaCha20-Poly1305,
//! a random nonce per write, the stored key's name bound as associated
//! data, keys by id from a `KeyRing`.

use chacha20poly1305::aead::Generate;
use chacha20poly1305::{AeadInOut, Tag, XNonce};

use std::borrow::Cow;

use super::key_ring::KeyRing;
use super::{Codec, Marker};
use crate::error::CodecError;

/// The format version, byte 0 of every encrypted value.
const VERSION: u8 = 1;
/// The first byte of a sealed cached absence and of a sealed cached
/// failure: the version with the high bit set and the marker. Authenticated
/// with the rest, it keeps a value, an absence and a failure from passing
/// for one another.
const ABSENT: u8 = 0x80 | VERSION;
const FAILURE: u8 = 0x80 | (VERSION + 1);
/// Version and key id: the part of the header that is also associated data.
const ID_END: usize = 1 + 4;
/// Version, key id and nonce.
const HEADER_LEN: usize = ID_END + 24;
/// Poly1305's tag.
const TAG_LEN: usize = 16;

/// Encrypts the bytes of another codec `C` (feature `encryption`), so the
/// store holds ciphertext only.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use onefill::{Compressed, Encrypted, JsonCodec, KeyRing};
///
/// // In a service: `KeyRing::from_env("ONEFILL_ENCRYPTION_KEYS")?`.
/// let keys = KeyRing::new(1, &[42; 32]);
/// let cache: onefill::Cache<u64, String> = onefill::Cache::builder()
///     .namespace("users")
///     // Compressed, then encrypted: ciphertext does not compress.
///     .codec(Encrypted::new(Compressed::new(JsonCodec), keys))
///     .build()?;
/// let name = cache.get_or_load(&7, |id| async move { Ok::<_, std::io::Error>(format!("user {id}")) }).await?;
/// assert_eq!(name, "user 7");
/// # Ok(()) }
/// ```
///
/// # The cipher
///
/// XChaCha20-Poly1305 (RustCrypto's `chacha20poly1305`), an authenticated
/// cipher: a value changed by a single bit does not decrypt. Its 192-bit
/// nonce makes a **fresh random nonce per write** safe at any volume: with
/// AES-GCM's 96-bit nonces, random nonces reach the birthday bound (a
/// repeated nonce, which leaks the authentication key) after about 2^32
/// writes under one key, which a busy fleet refilling its caches reaches
/// in weeks; 2^192 leaves no such horizon, and no counter has to be shared
/// across processes. ChaCha20 is also constant-time in software on every
/// CPU, where AES is only with hardware support. Each nonce comes from the
/// operating system's generator (`getrandom`).
///
/// # Wire format
///
/// ```text
/// offset  size  field
/// 0       1     format version (1)
/// 1       4     key id, big-endian
/// 5       24    nonce
/// 29      ..    ciphertext of C's bytes, then the 16-byte Poly1305 tag
/// ```
///
/// 45 bytes more than `C`'s encoding. The associated data is bytes 0..5
/// followed by the stored key's full name (namespace included), so bytes
/// copied under another key, or given another version or key id, do not
/// decrypt.
///
/// # Threat model
///
/// Protects the values in Redis, in its replicas, in RDB and AOF files and
/// in their backups (anyone who reads them sees ciphertext), and binds each
/// value to its key (bytes moved or copied to another key do not decrypt;
/// changed bytes do not decrypt). It does not protect against a compromised
/// application host, which holds the keys; it does not hide the key names,
/// nor the values' sizes or TTLs. The binding is to the name, not to the
/// server: the same name in another Redis (a staging copy) reads with the
/// same keys, so give each environment keys of its own.
///
/// An attacker who can write to Redis can still delete a value, or put
/// back an older value of the same key, for as long as the ring holds the
/// key it was written with: what is authenticated is the codec's payload,
/// not the envelope around it, so the expiry and TTLs are the attacker's
/// to set — a cache serves what its store holds, encrypted or not.
///
/// A cached absence (the `_optional` calls) and a cached loader failure
/// (`negative_ttl`) are sealed too ([`Codec::seal`]), each behind a first
/// byte of its own that is authenticated with the rest: a failure's
/// message is not in the store in clear, and neither can be forged, or
/// passed off as the other or as a value, without a key of the ring.
///
/// With compression underneath, the ciphertext's length follows how well
/// the value compresses: where a value mixes a secret with text an attacker
/// chooses, and the attacker can see stored sizes, leave compression out.
///
/// # Keys and rotation
///
/// The [`KeyRing`] holds the keys by id: writes use its writer (the
/// highest id unless another is named), reads use the key whose id the
/// value's header carries. [`KeyRing`] describes a rotation step by step.
///
/// # Values that do not decrypt
///
/// A value under a key id the ring does not hold (rotated out, or not yet
/// deployed here), a changed or truncated value, or one copied from another
/// key, is a decode error: never an error to the caller, it is counted
/// (`decode_errors`, `onefill_decode_errors_total`, with a warning naming
/// the reason), treated as a miss and reloaded, once fleet-wide, like any
/// unreadable value. So is one that decrypts but that `C` does not decode
/// (written for another type): the warning does not quote `C`'s error,
/// which may quote the decrypted value; the error's
/// [`source`](std::error::Error::source) is `C`'s.
#[derive(Debug, Clone)]
pub struct Encrypted<C> {
    inner: C,
    keys: KeyRing,
}

impl<C> Encrypted<C> {
    /// Encrypts what `inner` encodes, with `keys`.
    pub fn new(inner: C, keys: KeyRing) -> Self {
        Encrypted { inner, keys }
    }

    /// The key ring.
    pub fn key_ring(&self) -> &KeyRing {
        &self.keys
    }

    /// `bytes` decrypted, if they are an entry this ring can read under
    /// `key` whose first byte is `first` (a value's version, or a marker's).
    fn decrypt(&self, key: &str, first: u8, bytes: &[u8]) -> Result<Vec<u8>, CodecError> {
        if bytes.len() < HEADER_LEN + TAG_LEN {
            return Err(CodecError::new(Unreadable::Truncated(bytes.len())));
        }
        let (header, sealed) = bytes.split_at(HEADER_LEN);
        if header[0] != first {
            return Err(CodecError::new(Unreadable::Version(header[0])));
        }
        let id = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        let cipher = self
            .keys
            .cipher(id)
            .ok_or_else(|| CodecError::new(Unreadable::UnknownKey(id)))?;
        let nonce = XNonce::try_from(&header[ID_END..])
            .map_err(|_| CodecError::new(Unreadable::Truncated(bytes.len())))?;
        let (ciphertext, tag) = sealed.split_at(sealed.len() - TAG_LEN);
        let tag =
            Tag::try_from(tag).map_err(|_| CodecError::new(Unreadable::Truncated(bytes.len())))?;
        let mut plain = ciphertext.to_vec();
        cipher
            .decrypt_inout_detached(
                &nonce,
                &associated_data(&header[..ID_END], key),
                plain.as_mut_slice().into(),
                &tag,
            )
            .map_err(|_| CodecError::new(Unreadable::Inauthentic(id)))?;
        Ok(plain)
    }
}

/// What authenticates a value besides its ciphertext: its version and key
/// id, then the full name it is stored under.
fn associated_data(version_and_id: &[u8], key: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(version_and_id.len() + key.len());
    data.extend_from_slice(version_and_id);
    data.extend_from_slice(key.as_bytes());
    data
}

impl<C> Encrypted<C> {
    /// `plain` encrypted with the writing key, under `key`, behind the first
    /// byte `first`.
    fn encrypt(&self, key: &str, first: u8, plain: &[u8]) -> Result<Vec<u8>, CodecError> {
        let (id, cipher) = self.keys.writer();
        let nonce = XNonce::try_generate().map_err(|e| {
            CodecError::msg(format!(
                "no nonce from the operating system's random generator: {e}"
            ))
        })?;
        let mut out = Vec::with_capacity(HEADER_LEN + plain.len() + TAG_LEN);
        out.push(first);
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let (header, body) = out.split_at_mut(HEADER_LEN);
        let tag = cipher
            .encrypt_inout_detached(
                &nonce,
                &associated_data(&header[..ID_END], key),
                body.into(),
            )
            .map_err(|_| CodecError::msg("the value is too long to encrypt"))?;
        out.extend_from_slice(&tag);
        Ok(out)
    }
}

impl<V, C: Codec<V>> Codec<V> for Encrypted<C> {
    fn encode(&self, key: &str, value: &V) -> Result<Vec<u8>, CodecError> {
        self.encrypt(key, VERSION, &self.inner.encode(key, value)?)
    }

    fn decode(&self, key: &str, bytes: &[u8]) -> Result<V, CodecError> {
        self.inner
            .decode(key, &self.decrypt(key, VERSION, bytes)?)
            .map_err(|e| CodecError::new(Plaintext(e)))
    }

    /// Decrypts, then leaves the check of the plaintext to `C` (which may
    /// skip decoding it).
    fn check_round_trip(&self, key: &str, bytes: &[u8]) -> Result<(), CodecError> {
        self.inner
            .check_round_trip(key, &self.decrypt(key, VERSION, bytes)?)
            .map_err(|e| CodecError::new(Plaintext(e)))
    }

    /// Sealed as a value is, behind its marker's first byte: stored
    /// absences and failures are neither readable nor forgeable without a
    /// key of the ring. (Not handed to `C`: there is nothing to encode.)
    fn seal(&self, key: &str, marker: Marker, payload: &[u8]) -> Result<Vec<u8>, CodecError> {
        self.encrypt(key, marker_byte(marker), payload)
    }

    fn open<'a>(
        &self,
        key: &str,
        marker: Marker,
        stored: &'a [u8],
    ) -> Result<Cow<'a, [u8]>, CodecError> {
        self.decrypt(key, marker_byte(marker), stored)
            .map(Cow::Owned)
    }
}

/// The first byte of a sealed entry that is not a value.
fn marker_byte(marker: Marker) -> u8 {
    match marker {
        Marker::Absent => ABSENT,
        Marker::Failure => FAILURE,
    }
}

/// `C` could not decode what decrypted (a value written by another type,
/// say). `C`'s error is the source only, out of the message and of
/// `Debug`: a text codec's error quotes the value (serde_json's `invalid
/// type: string "…"`), and the message goes to the logs with every
/// unreadable value, where decrypted values have no business.
#[derive(thiserror::Error)]
#[error("decrypted, but the inner codec does not decode the plaintext (its error, which may quote it, is the source)")]
struct Plaintext(#[source] CodecError);

impl std::fmt::Debug for Plaintext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Plaintext(..)")
    }
}

/// Why stored bytes do not decrypt (a decode error: a miss, counted).
#[derive(Debug, thiserror::Error)]
enum Unreadable {
    #[error("{0} bytes are too few for an encrypted value")]
    Truncated(usize),
    #[error("unknown encrypted format version {0}")]
    Version(u8),
    #[error("encrypted with key id {0}, which the key ring does not hold (rotated out, or not yet deployed here)")]
    UnknownKey(u32),
    #[error("does not decrypt with key {0}: changed since it was written, copied from another key, or encrypted with another key of that id")]
    Inauthentic(u32),
}
