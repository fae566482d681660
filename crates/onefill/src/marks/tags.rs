//! What a tag may be: checked before any I/O (a mark) and before a tagged
//! value is encoded, so the envelope's one-byte lengths always fit.

use crate::envelope::{MAX_TAGS, MAX_TAG_BYTES};
use crate::error::InputError;

/// Checks a value's tags: at most [`MAX_TAGS`], each 1 to
/// [`MAX_TAG_BYTES`] bytes.
pub(crate) fn check_tags(tags: &[String]) -> Result<(), InputError> {
    if tags.len() > MAX_TAGS {
        return Err(InputError::Tag {
            tag: format!("{} tags", tags.len()),
            reason: "more tags than a value may carry",
        });
    }
    tags.iter().try_for_each(|tag| check_tag(tag))
}

/// Checks one tag: 1 to [`MAX_TAG_BYTES`] bytes.
pub(crate) fn check_tag(tag: &str) -> Result<(), InputError> {
    let reason = if tag.is_empty() {
        "a tag is never empty"
    } else if tag.len() > MAX_TAG_BYTES {
        "longer than a tag may be"
    } else {
        return Ok(());
    };
    let mut cut = tag.len().min(64);
    while !tag.is_char_boundary(cut) {
        cut -= 1;
    }
    Err(InputError::Tag {
        tag: tag[..cut].to_owned(),
        reason,
    })
}
