//! Value codecs: how a `V` becomes the payload bytes of the envelope.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Turns values into bytes and back. Implemented for every serde type by
/// [`JsonCodec`] (the default) and, with the `postcard` feature, by
/// [`PostcardCodec`].
///
/// A decode failure is never an error to the caller: the stored value is
/// treated as a miss, counted, and overwritten by the next fill.
pub trait Codec<V>: Send + Sync + 'static {
    /// Encodes a value; the error is a human-readable reason.
    fn encode(&self, value: &V) -> Result<Vec<u8>, String>;
    /// Decodes a value; the error is a human-readable reason.
    fn decode(&self, bytes: &[u8]) -> Result<V, String>;
}

/// JSON through `serde_json`: readable in `redis-cli`, the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonCodec;

impl<V: Serialize + DeserializeOwned> Codec<V> for JsonCodec {
    fn encode(&self, value: &V) -> Result<Vec<u8>, String> {
        serde_json::to_vec(value).map_err(|e| e.to_string())
    }
    fn decode(&self, bytes: &[u8]) -> Result<V, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// Compact binary through `postcard` (feature `postcard`).
#[cfg(feature = "postcard")]
#[derive(Debug, Clone, Copy, Default)]
pub struct PostcardCodec;

#[cfg(feature = "postcard")]
impl<V: Serialize + DeserializeOwned> Codec<V> for PostcardCodec {
    fn encode(&self, value: &V) -> Result<Vec<u8>, String> {
        postcard::to_stdvec(value).map_err(|e| e.to_string())
    }
    fn decode(&self, bytes: &[u8]) -> Result<V, String> {
        postcard::from_bytes(bytes).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_and_bad_bytes() {
        let bytes = Codec::<Vec<u32>>::encode(&JsonCodec, &vec![1, 2]).unwrap();
        assert_eq!(
            Codec::<Vec<u32>>::decode(&JsonCodec, &bytes).unwrap(),
            vec![1, 2]
        );
        assert!(Codec::<Vec<u32>>::decode(&JsonCodec, b"\xff").is_err());
    }

    #[cfg(feature = "postcard")]
    #[test]
    fn postcard_round_trip() {
        let bytes = Codec::<(u8, String)>::encode(&PostcardCodec, &(1, "x".into())).unwrap();
        let back: (u8, String) = Codec::decode(&PostcardCodec, &bytes).unwrap();
        assert_eq!(back, (1, "x".into()));
    }
}
