//! The lease token: 128 random bits, fresh for every acquisition, and the
//! name of the holder that took it where its backend watches holders.

use std::fmt;

/// A lease token: 128 random bits, fresh for every acquisition, and
/// optionally the name of the holder that took it.
///
/// A backend that can tell whether a lease's holder is alive (see
/// [`Backend::watch_holder`](crate::backend::Backend::watch_holder)) makes
/// its tokens with [`for_holder`](LeaseToken::for_holder), so that a waiter
/// who finds the lease held can tell whom to watch from the lease alone.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken(Box<str>);

/// The most bytes a holder's name may have in a token.
const MAX_HOLDER: usize = 64;

/// Between a holder's name and the random part: `.`, or `/` in a token
/// taken over from a holder judged frozen.
const SEPARATORS: [char; 2] = ['.', '/'];

impl LeaseToken {
    /// A new token from the thread-local CSPRNG: 32 lowercase hex digits.
    pub fn random() -> Self {
        LeaseToken(random_hex().into())
    }

    /// A new token naming `holder`: `holder`, a `.`, then 32 random
    /// lowercase hex digits. A name that is empty, longer than 64 bytes or
    /// not made of ASCII letters, digits, `-` and `_` is left out (the
    /// token is then as [`random`](LeaseToken::random)'s).
    pub fn for_holder(holder: &str) -> Self {
        if !valid_holder(holder) {
            return LeaseToken::random();
        }
        LeaseToken(format!("{holder}.{}", random_hex()).into())
    }

    /// The token a backend read back from a lease (the bytes another
    /// process stored), if they are a token of this shape: `None` for
    /// foreign bytes.
    pub fn from_stored(bytes: &[u8]) -> Option<LeaseToken> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (holder, random) = match text.split_once(SEPARATORS) {
            Some((holder, random)) => (Some(holder), random),
            None => (None, text),
        };
        let random_ok = random.len() == 32
            && random
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let holder_ok = holder.is_none_or(valid_holder);
        (random_ok && holder_ok).then(|| LeaseToken(text.into()))
    }

    /// The holder the token names, if it names one.
    pub fn holder(&self) -> Option<&str> {
        self.0.split_once(SEPARATORS).map(|(holder, _)| holder)
    }

    /// This token, marked as taken over from a holder judged frozen (its
    /// holder's name then ends with `/`, not `.`). A waiter never judges
    /// the holder of such a lease frozen in turn: a loader that blocks its
    /// executor looks frozen from outside, and every process that took
    /// over would run it and look frozen too. That holder is judged dead
    /// (its connections closed) or waited for to its lease's expiry, so a
    /// wrong frozen verdict costs one more load, not one per process. An
    /// anonymous token is kept as it is.
    pub fn taken_from_frozen(self) -> LeaseToken {
        match self.0.split_once('.') {
            Some((holder, random)) => LeaseToken(format!("{holder}/{random}").into()),
            None => self,
        }
    }

    /// Whether the token was taken over from a holder judged frozen (see
    /// [`taken_from_frozen`](Self::taken_from_frozen)).
    pub fn is_taken_from_frozen(&self) -> bool {
        self.0.contains('/')
    }

    /// The token as stored in the lease key.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
    /// The token as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn valid_holder(holder: &str) -> bool {
    !holder.is_empty()
        && holder.len() <= MAX_HOLDER
        && holder
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// 128 bits from the thread-local CSPRNG, as 32 lowercase hex digits.
fn random_hex() -> String {
    let raw: u128 = rand::random();
    format!("{raw:032x}")
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({})", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_and_hex() {
        let a = LeaseToken::random();
        let b = LeaseToken::random();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn tokens_name_their_holder_and_read_back() {
        let named = LeaseToken::for_holder("00ff00ff00ff00ff");
        assert_eq!(named.holder(), Some("00ff00ff00ff00ff"));
        assert_eq!(
            LeaseToken::from_stored(named.as_bytes()),
            Some(named.clone())
        );
        let anonymous = LeaseToken::random();
        assert_eq!(anonymous.holder(), None);
        assert_eq!(
            LeaseToken::from_stored(anonymous.as_bytes()),
            Some(anonymous)
        );
        // A bad name is left out; foreign bytes are no token.
        assert_eq!(LeaseToken::for_holder("a.b").holder(), None);
        assert_eq!(LeaseToken::for_holder("").holder(), None);
        assert_eq!(LeaseToken::from_stored(b"not a token"), None);
        assert_eq!(LeaseToken::from_stored(b"x.0123"), None);
        // Taken over from a frozen holder: the same holder, marked.
        let marked = named.clone().taken_from_frozen();
        assert!(marked.is_taken_from_frozen() && !named.is_taken_from_frozen());
        assert_eq!(marked.holder(), Some("00ff00ff00ff00ff"));
        assert_eq!(LeaseToken::from_stored(marked.as_bytes()), Some(marked));
        assert!(!LeaseToken::random()
            .taken_from_frozen()
            .is_taken_from_frozen());
        assert_eq!(LeaseToken::from_stored(&[0xff; 32]), None);
    }
}
