//! Limits and parsers that the flags of more than one command share, so a
//! command's flags never reach up to the command line that holds them all.

/// Largest `--callers`: every caller is a tokio task, and the naive strategy
/// runs one origin load per caller.
pub const MAX_CALLERS: u32 = 100_000;
/// Most callers of a process that may be OS threads at once (`fleet
/// --callers-kind blocking|mixed`): a thread costs far more than a task,
/// and the machine's threads are shared by every process on it.
pub const MAX_CALLER_THREADS: u32 = 4_096;
/// Largest `--load-ms`: one minute.
pub const MAX_LOAD_MS: u64 = 60_000;
/// Longest `--key`, in bytes (the library's default key limit).
pub const MAX_KEY_BYTES: usize = 1_024;

/// A cache key from the command line: not empty, at most
/// [`MAX_KEY_BYTES`].
pub fn parse_key(key: &str) -> Result<String, String> {
    if key.is_empty() {
        return Err("the key must not be empty".to_owned());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "the key is {} bytes long; at most {MAX_KEY_BYTES} bytes are allowed",
            key.len()
        ));
    }
    Ok(key.to_owned())
}

/// Parses `argv` (without a program name) as the flags `A` alone: how a
/// command's unit tests read its flags without the whole command line.
#[cfg(test)]
pub fn parse_flags<A: clap::Args>(argv: &[&str]) -> Result<A, clap::Error> {
    let command = A::augment_args(clap::Command::new("onefill"));
    let matches =
        command.try_get_matches_from(std::iter::once("onefill").chain(argv.iter().copied()))?;
    A::from_arg_matches(&matches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bounded() {
        assert!(parse_key("").is_err());
        assert_eq!(parse_key("user:42"), Ok("user:42".to_owned()));
        assert!(parse_key(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(parse_key(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());
    }
}
