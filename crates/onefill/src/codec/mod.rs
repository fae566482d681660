//! Value codecs: how a `V` becomes the payload bytes of the envelope.
//!
//! The trait and the two serde codecs live here; the wrappers that add a
//! layer around any codec have a file each: `Compressed` (feature
//! `compression`), `Encrypted` and its `KeyRing` (feature `encryption`).

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::CodecError;

#[cfg(feature = "compression")]
mod compressed;
#[cfg(feature = "encryption")]
mod encrypted;
#[cfg(feature = "encryption")]
mod key_ring;

#[cfg(feature = "compression")]
pub use compressed::Compressed;
#[cfg(feature = "encryption")]
pub use encrypted::Encrypted;
#[cfg(feature = "encryption")]
pub use key_ring::{KeyRing, KeyRingError, KEY_LEN};

/// Turns values into bytes and back. Implemented for every serde type by
/// [`JsonCodec`] (the default) and, with the `postcard` feature, by
/// `PostcardCodec`; `Compressed` and `Encrypted` (features `compression`
/// and `encryption`) wrap any codec.
///
/// Every method is given `key`, the full name the bytes are stored under in
/// the backend (namespace included, the same in every process). A codec
/// that only shapes bytes ignores it; one that binds a value to its place
/// (an authenticated cipher's associated data) uses it, so bytes copied
/// under another key do not decode there.
///
/// A decode failure of a stored value is never an error to the caller: the
/// stored value is treated as a miss, counted, and overwritten by the next
/// fill. So that a value which cannot be read back is not stored (and
/// reloaded at every read), every value is checked once before it is
/// written ([`check_round_trip`](Codec::check_round_trip)).
pub trait Codec<V>: Send + Sync + 'static {
    /// Encodes a value.
    ///
    /// # Errors
    ///
    /// The codec's own error, wrapped (the caller gets
    /// [`Error::Encode`](crate::Error::Encode); nothing is written).
    fn encode(&self, key: &str, value: &V) -> Result<Vec<u8>, CodecError>;
    /// Decodes a value.
    ///
    /// # Errors
    ///
    /// The codec's own error, wrapped (the stored value counts as a miss).
    fn decode(&self, key: &str, bytes: &[u8]) -> Result<V, CodecError>;
    /// Checks that `bytes`, just encoded from a value, decode back, before
    /// they are stored (a fill, a `set`). The default decodes them; a codec
    /// whose encodings always decode (raw bytes, say) may skip it. Only
    /// a failure to decode is caught, not a value that decodes to another
    /// (`Option<f64>`'s NaN reads back as `None` in JSON).
    ///
    /// # Errors
    ///
    /// The decoder's error: the caller gets
    /// [`Error::Encode`](crate::Error::Encode) (with
    /// [`CodecError::is_round_trip`]) and nothing is written.
    fn check_round_trip(&self, key: &str, bytes: &[u8]) -> Result<(), CodecError> {
        self.decode(key, bytes).map(drop)
    }
    /// The payload of an entry that is not a value, as it is to be stored:
    /// a cached absence (`payload` empty) or a cached failure (its
    /// message). The default stores it as it is. A codec that protects
    /// values protects these too (`Encrypted`, feature `encryption`, seals
    /// them, bound to their marker and key, so none can be planted, read or
    /// passed off as another); a wrapper hands them to the codec it wraps.
    ///
    /// # Errors
    ///
    /// The codec's own error: the entry is not stored (an absence written
    /// by `set`-like calls fails with [`Error::Encode`](crate::Error::Encode);
    /// a failure is then simply not cached).
    fn seal(&self, key: &str, marker: Marker, payload: &[u8]) -> Result<Vec<u8>, CodecError> {
        let _ = (key, marker);
        Ok(payload.to_vec())
    }
    /// The payload of a stored entry that is not a value, as
    /// [`seal`](Codec::seal) was given it. The default takes it as it is.
    ///
    /// # Errors
    ///
    /// The codec's own error: the entry counts as unreadable (a miss).
    fn open<'a>(
        &self,
        key: &str,
        marker: Marker,
        stored: &'a [u8],
    ) -> Result<Cow<'a, [u8]>, CodecError> {
        let _ = (key, marker);
        Ok(Cow::Borrowed(stored))
    }
}

/// What a stored entry holds when it is not a value (see
/// [`Codec::seal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Marker {
    /// A cached absence (an optional loader found nothing).
    Absent,
    /// A cached failure (negative caching), its payload the failure's
    /// message.
    Failure,
}

/// JSON through `serde_json`: readable in `redis-cli`, the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonCodec;

impl<V: Serialize + DeserializeOwned> Codec<V> for JsonCodec {
    fn encode(&self, _key: &str, value: &V) -> Result<Vec<u8>, CodecError> {
        serde_json::to_vec(value).map_err(CodecError::new)
    }
    fn decode(&self, _key: &str, bytes: &[u8]) -> Result<V, CodecError> {
        serde_json::from_slice(bytes).map_err(CodecError::new)
    }
}

/// Compact binary through `postcard` (feature `postcard`).
#[cfg(feature = "postcard")]
#[cfg_attr(docsrs, doc(cfg(feature = "postcard")))]
#[derive(Debug, Clone, Copy, Default)]
pub struct PostcardCodec;

#[cfg(feature = "postcard")]
impl<V: Serialize + DeserializeOwned> Codec<V> for PostcardCodec {
    fn encode(&self, _key: &str, value: &V) -> Result<Vec<u8>, CodecError> {
        postcard::to_stdvec(value).map_err(CodecError::new)
    }
    fn decode(&self, _key: &str, bytes: &[u8]) -> Result<V, CodecError> {
        postcard::from_bytes(bytes).map_err(CodecError::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_and_bad_bytes() {
        let bytes = Codec::<Vec<u32>>::encode(&JsonCodec, "k", &vec![1, 2]).unwrap();
        assert_eq!(
            Codec::<Vec<u32>>::decode(&JsonCodec, "k", &bytes).unwrap(),
            vec![1, 2]
        );
        let err = Codec::<Vec<u32>>::decode(&JsonCodec, "k", b"\xff").unwrap_err();
        assert!(
            err.get_ref().downcast_ref::<serde_json::Error>().is_some(),
            "the codec's own error is kept: {err:?}"
        );
    }

    #[cfg(feature = "postcard")]
    #[test]
    fn postcard_round_trip() {
        let bytes = Codec::<(u8, String)>::encode(&PostcardCodec, "k", &(1, "x".into())).unwrap();
        let back: (u8, String) = Codec::decode(&PostcardCodec, "k", &bytes).unwrap();
        assert_eq!(back, (1, "x".into()));
    }
}
