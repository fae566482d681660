//! Results on stdout, and what to do when nobody reads them any more.
//!
//! `println!` panics when stdout is a closed pipe (`onefill demo --json |
//! head -1` once `head` has exited): Rust ignores `SIGPIPE`, so the write
//! fails with `BrokenPipe`. Results go through [`print`] instead, which
//! returns that error, and `main` ends the command quietly on it
//! ([`is_broken_pipe`]): the reader had what it wanted.

use std::io::{self, Write};

/// Writes `text` to stdout and flushes it.
pub fn print(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Writes `text` and a newline to stdout and flushes it.
pub fn print_line(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}

/// Whether the error (or any error in its chain) is a write to a closed
/// pipe.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// The error and its causes on one line, `: `-separated, each cause said
/// once: a redis-rs error's message already ends with its I/O cause, which
/// `{:#}` would print a second time.
pub fn describe(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_its_message_is_said_once() {
        #[derive(Debug)]
        struct Wrapping(io::Error);
        impl std::fmt::Display for Wrapping {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "Connection refused- {}", self.0)
            }
        }
        impl std::error::Error for Wrapping {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = io::Error::new(io::ErrorKind::ConnectionRefused, "refused (os error 111)");
        let error = anyhow::Error::new(Wrapping(io)).context("connecting to Redis at redis://h:1");
        assert_eq!(
            describe(&error),
            "connecting to Redis at redis://h:1: Connection refused- refused (os error 111)"
        );
    }

    #[test]
    fn a_broken_pipe_is_recognised_through_context() {
        let error = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe))
            .context("printing the report");
        assert!(is_broken_pipe(&error));
        let other = anyhow::Error::new(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert!(!is_broken_pipe(&other));
    }
}
