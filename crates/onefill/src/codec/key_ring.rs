//! The keys of an `Encrypted` codec: their ids, which one writes, where
//! they come from (bytes, or base64 in an environment variable), and the
//! erasure of their material.

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use chacha20poly1305::{KeyInit, XChaCha20Poly1305};
use zeroize::Zeroizing;

/// The length of a key in bytes: XChaCha20-Poly1305 takes 256-bit keys.
pub const KEY_LEN: usize = 32;

/// The keys an [`Encrypted`](crate::Encrypted) codec uses, each under an
/// id that is written in the header of every value it encrypts.
///
/// - **Writes** use one key, the *writer*: the key with the **highest id**,
///   unless [`with_writer`](KeyRing::with_writer) (or a `*` in the
///   [list](KeyRing::parse)) names another.
/// - **Reads** use whichever key the value's header names, if the ring
///   holds it; a value under an id the ring does not hold is unreadable
///   (a miss, reloaded once fleet-wide).
///
/// # Rotation
///
/// Processes are updated one at a time, so a new key is first added as a
/// reader everywhere, then made the writer, then the old key goes:
///
/// 1. `*1:<old>,2:<new>`: every process can read key 2, all still write
///    with key 1;
/// 2. `1:<old>,2:<new>`: key 2 writes (the highest id); values written with
///    key 1 still read;
/// 3. `2:<new>`, once every value written with key 1 has expired (the
///    longest TTL plus grace after step 2). A value still under key 1 then
///    reads as a miss and is reloaded, once, and rewritten with key 2.
///
/// Skipping step 1 costs reloads, not errors: a process not yet given
/// key 2 reads its values as misses while the rollout lasts.
///
/// # Key material
///
/// Each key lives in its cipher's state, on the heap once (clones of the
/// ring share it), and is overwritten with zeros when the last clone of
/// the ring is dropped; the intermediate copies this type makes while
/// parsing (the environment variable's text, the decoded base64, also when
/// it turns out invalid) are erased as well. What is not this type's to
/// erase: the caller's own copy of a key (the array given to
/// [`new`](KeyRing::new), the text given to [`parse`](KeyRing::parse)),
/// the process's environment, which keeps the variable that
/// [`from_env`](KeyRing::from_env) read, and stack copies made in passing.
/// `Debug` shows the ids and the writer, never a key:
///
/// ```
/// use onefill::KeyRing;
///
/// let ring = KeyRing::new(1, &[7; 32]).with_key(2, &[9; 32])?;
/// assert_eq!(format!("{ring:?}"), "KeyRing { ids: [1, 2], writer: 2 }");
/// assert_eq!(ring.with_writer(1)?.writer_id(), 1);
/// # Ok::<(), onefill::KeyRingError>(())
/// ```
#[derive(Clone)]
pub struct KeyRing {
    /// By increasing id, never empty. Each key in a block of its own, which
    /// never moves: a `Vec` that outgrows its block frees the old one as it
    /// is, and a key held inline would stay there, unerased. Clones of the
    /// ring share the blocks (one copy of each key, erased with the last).
    keys: Vec<Arc<RingKey>>,
    /// The id named to write, if one was (otherwise the highest writes).
    named_writer: Option<u32>,
}

struct RingKey {
    id: u32,
    /// Holds the key; erased on drop (`chacha20poly1305`'s `zeroize`).
    cipher: XChaCha20Poly1305,
}

/// A key ring could not be made: a key of the wrong length, a bad key list,
/// or a missing environment variable.
///
/// No variant carries key material or the text of a key list (which holds
/// keys): entries are named by their position and id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyRingError {
    /// A key is not [`KEY_LEN`] bytes long.
    #[error("key {id} is {len} bytes; a key is {KEY_LEN} bytes")]
    KeyLength {
        /// The key's id.
        id: u32,
        /// Its length in bytes.
        len: usize,
    },
    /// Two keys have the same id.
    #[error("key id {0} is given twice")]
    DuplicateId(u32),
    /// The id named as the writer is not in the ring.
    #[error("key id {0} is named as the writer but is not in the key ring")]
    UnknownWriter(u32),
    /// The key list has no entries.
    #[error("the key list is empty")]
    Empty,
    /// An entry of the key list is malformed.
    #[error("entry {entry} of the key list: {reason}")]
    Entry {
        /// Its position in the list, from 1.
        entry: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The environment variable is not set, or not UTF-8.
    #[error("environment variable {var} {reason}")]
    Env {
        /// The variable's name.
        var: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl KeyRing {
    /// A ring of one key, `id`, which writes.
    pub fn new(id: u32, key: &[u8; KEY_LEN]) -> KeyRing {
        KeyRing {
            keys: vec![RingKey::new(id, key)],
            named_writer: None,
        }
    }

    /// A ring of one key given as a slice, `id`, which writes.
    ///
    /// # Errors
    ///
    /// [`KeyRingError::KeyLength`] unless `key` is [`KEY_LEN`] bytes.
    pub fn from_slice(id: u32, key: &[u8]) -> Result<KeyRing, KeyRingError> {
        Ok(KeyRing::new(id, exact(id, key)?))
    }

    /// The ring with one more key. It writes if its id is the highest and
    /// no writer was named.
    ///
    /// # Errors
    ///
    /// [`KeyRingError::KeyLength`] unless `key` is [`KEY_LEN`] bytes;
    /// [`KeyRingError::DuplicateId`] if the ring has a key `id`.
    pub fn with_key(mut self, id: u32, key: &[u8]) -> Result<KeyRing, KeyRingError> {
        let key = exact(id, key)?;
        match self.keys.binary_search_by_key(&id, |k| k.id) {
            Ok(_) => Err(KeyRingError::DuplicateId(id)),
            Err(at) => {
                self.keys.insert(at, RingKey::new(id, key));
                Ok(self)
            }
        }
    }

    /// The ring with key `id` as the writer, whatever the other ids (step 1
    /// of a [rotation](KeyRing#rotation)).
    ///
    /// # Errors
    ///
    /// [`KeyRingError::UnknownWriter`] if the ring has no key `id`.
    pub fn with_writer(mut self, id: u32) -> Result<KeyRing, KeyRingError> {
        if self.cipher(id).is_none() {
            return Err(KeyRingError::UnknownWriter(id));
        }
        self.named_writer = Some(id);
        Ok(self)
    }

    /// A ring from a key list: entries `id:base64`, separated by commas or
    /// whitespace, where `id` is a number from 0 to 4294967295 and `base64`
    /// a [`KEY_LEN`]-byte key in standard base64 with padding (as
    /// `openssl rand -base64 32` prints one). One entry may be marked `*`
    /// (`*1:…`) to write; otherwise the highest id writes.
    ///
    /// ```
    /// use onefill::{KeyRing, KeyRingError};
    ///
    /// let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="; // bytes 0..32
    /// let ring = KeyRing::parse(&format!("*1:{key}, 2:{key}"))?;
    /// assert_eq!((ring.ids().collect::<Vec<_>>(), ring.writer_id()), (vec![1, 2], 1));
    /// assert_eq!(
    ///     KeyRing::parse("1:c2hvcnQ=").unwrap_err(),
    ///     KeyRingError::KeyLength { id: 1, len: 5 }
    /// );
    /// # Ok::<(), KeyRingError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`KeyRingError::Empty`] for a list with no entries;
    /// [`KeyRingError::Entry`] for an entry that is not `id:base64` (or a
    /// second entry marked `*`); [`KeyRingError::KeyLength`] and
    /// [`KeyRingError::DuplicateId`] as [`with_key`](KeyRing::with_key).
    pub fn parse(list: &str) -> Result<KeyRing, KeyRingError> {
        let mut ring: Option<KeyRing> = None;
        let mut writer = None;
        let entries = list
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|entry| !entry.is_empty());
        for (at, entry) in entries.enumerate() {
            let bad = |reason| KeyRingError::Entry {
                entry: at + 1,
                reason,
            };
            let (marked, entry) = match entry.strip_prefix('*') {
                Some(rest) => (true, rest),
                None => (false, entry),
            };
            let (id, text) = entry
                .split_once(':')
                .ok_or_else(|| bad("not `id:base64`"))?;
            let id: u32 = id
                .parse()
                .map_err(|_| bad("the id is not a number from 0 to 4294967295"))?;
            // Decoded into a buffer of ours, erased however the decoding
            // ends: `decode`'s own buffer is dropped as it is when the
            // text turns out invalid partway. Not the decoder's error
            // either: it would quote a character of the key.
            let mut key = Zeroizing::new(Vec::new());
            base64::engine::general_purpose::STANDARD
                .decode_vec(text, &mut key)
                .map_err(|_| bad("the key is not valid base64"))?;
            if marked {
                if writer.is_some() {
                    return Err(bad("a second entry is marked `*` (the writer)"));
                }
                writer = Some(id);
            }
            ring = Some(match ring {
                None => KeyRing::from_slice(id, &key)?,
                Some(ring) => ring.with_key(id, &key)?,
            });
        }
        let ring = ring.ok_or(KeyRingError::Empty)?;
        match writer {
            Some(id) => ring.with_writer(id),
            None => Ok(ring),
        }
    }

    /// A ring from the key list in the environment variable `var` (the
    /// format of [`parse`](KeyRing::parse)), e.g.
    /// `ONEFILL_ENCRYPTION_KEYS="1:AAEC…="`.
    ///
    /// # Errors
    ///
    /// [`KeyRingError::Env`] if `var` is not set or not UTF-8; otherwise as
    /// [`parse`](KeyRing::parse).
    pub fn from_env(var: &str) -> Result<KeyRing, KeyRingError> {
        let env = |reason| KeyRingError::Env {
            var: var.to_owned(),
            reason,
        };
        let text = std::env::var_os(var).ok_or_else(|| env("is not set"))?;
        // Text that is not UTF-8 holds the keys all the same: erased too.
        let list = Zeroizing::new(text.into_string().map_err(|text| {
            drop(Zeroizing::new(text.into_encoded_bytes()));
            env("is not valid UTF-8")
        })?);
        KeyRing::parse(&list)
    }

    /// The id of the key that writes.
    pub fn writer_id(&self) -> u32 {
        self.writer().0
    }

    /// The ids of the ring's keys, increasing.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.keys.iter().map(|k| k.id)
    }

    /// The writer's id and cipher.
    pub(super) fn writer(&self) -> (u32, &XChaCha20Poly1305) {
        let named = self
            .named_writer
            .and_then(|id| self.keys.iter().find(|k| k.id == id));
        // The ring is never empty: `new` makes it with one key, and keys
        // are only ever added.
        let key = named.unwrap_or_else(|| &self.keys[self.keys.len() - 1]);
        (key.id, &key.cipher)
    }

    /// The cipher of key `id`, if the ring holds it.
    pub(super) fn cipher(&self, id: u32) -> Option<&XChaCha20Poly1305> {
        self.keys
            .binary_search_by_key(&id, |k| k.id)
            .ok()
            .map(|at| &self.keys[at].cipher)
    }
}

impl RingKey {
    fn new(id: u32, key: &[u8; KEY_LEN]) -> Arc<RingKey> {
        Arc::new(RingKey {
            id,
            cipher: XChaCha20Poly1305::new(key.into()),
        })
    }
}

/// `key` as a key of the right length.
fn exact(id: u32, key: &[u8]) -> Result<&[u8; KEY_LEN], KeyRingError> {
    key.try_into()
        .map_err(|_| KeyRingError::KeyLength { id, len: key.len() })
}

impl fmt::Debug for KeyRing {
    /// The ids and the writer's; never a key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("ids", &self.ids().collect::<Vec<_>>())
            .field("writer", &self.writer_id())
            .finish()
    }
}
