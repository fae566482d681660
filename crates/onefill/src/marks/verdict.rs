//! What the marks make of a stored value: valid, stale (older than a soft
//! mark it is subject to) or gone (older than a hard one), and what a read
//! answers of it then.

use std::time::Duration;

use crate::backend::{Mark, Stored};
use crate::envelope;

use super::Marks;

/// What the marks make of a value, from the mildest to the gravest (the
/// order a value's marks are combined in: the gravest wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Verdict {
    /// Untouched by any mark.
    Valid,
    /// Older than a soft mark: stale (within its grace window), or gone
    /// without one.
    Stale,
    /// Older than a hard mark: gone.
    Invalid,
}

/// The marks that judge a value: the namespace's and its tags'.
pub(super) fn verdict<'m>(as_of: u64, marks: impl IntoIterator<Item = &'m Mark>) -> Verdict {
    let mut verdict = Verdict::Valid;
    for mark in marks {
        if mark.hard > as_of {
            return Verdict::Invalid;
        }
        if mark.soft > as_of {
            verdict = Verdict::Stale;
        }
    }
    verdict
}

impl Marks {
    /// What a read answers of `stored` under `verdict`: as it is, stale
    /// (the server's TTL cut to the value's grace, so it reads as stale
    /// for at most that long), or nothing.
    pub(crate) fn apply(stored: Stored, verdict: Verdict) -> Option<Stored> {
        match verdict {
            Verdict::Valid => Some(stored),
            Verdict::Invalid => None,
            Verdict::Stale => {
                let grace = envelope::grace_of(&stored.bytes).unwrap_or(Duration::ZERO);
                if grace.is_zero() {
                    return None;
                }
                Some(Stored {
                    ttl: stored.ttl.min(grace),
                    bytes: stored.bytes,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_value_loses_and_a_hard_mark_wins_over_a_soft_one() {
        let soft = Mark { hard: 0, soft: 10 };
        let hard = Mark { hard: 20, soft: 20 };
        assert_eq!(verdict(5, [&Mark::default()]), Verdict::Valid);
        assert_eq!(verdict(5, [&soft]), Verdict::Stale);
        assert_eq!(
            verdict(10, [&soft]),
            Verdict::Valid,
            "as of the mark: loaded after it"
        );
        assert_eq!(verdict(5, [&soft, &hard]), Verdict::Invalid);
        assert_eq!(verdict(15, [&hard, &soft]), Verdict::Invalid);
        assert_eq!(verdict(25, [&hard, &soft]), Verdict::Valid);
    }
}
