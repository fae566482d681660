//! Progress messages on stderr, so stdout carries only the results.

use std::io::Write;

/// Writes progress lines to stderr unless quiet.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    enabled: bool,
}

impl Progress {
    /// Progress on stderr if `enabled`.
    pub fn new(enabled: bool) -> Self {
        Progress { enabled }
    }

    /// One line of progress. A closed stderr loses the line; it never
    /// stops the run (`eprintln!` would panic).
    pub fn say(self, message: impl AsRef<str>) {
        if self.enabled {
            let _ = writeln!(std::io::stderr().lock(), "{}", message.as_ref());
        }
    }
}
