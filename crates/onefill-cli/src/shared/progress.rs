//! Progress messages on stderr, so stdout carries only the results.

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

    /// One line of progress.
    pub fn say(self, message: impl AsRef<str>) {
        if self.enabled {
            eprintln!("{}", message.as_ref());
        }
    }
}
