//! The scenarios: each is an `async fn(&dyn Harness)` that panics when the
//! backend breaks the contract. Run them all with
//! [`conformance_suite!`](crate::conformance_suite), or call one from a test
//! of your own.
//!
//! By theme: coalescing (one load per herd, in one process and across
//! pods; the counters), leases (the watchdog, a dead holder's takeover,
//! token checks, the adaptive TTL), waiting (the fill notification, the
//! deadline's outcomes), loader failures (errors, panics, cancellation, a
//! hung loader), freshness (stale-while-refresh, early refresh, negative
//! caching, fail-safe, jitter, a value not stored), writes (undecodable
//! values, fenced fills, the size limit), expiry (`expire`: stale in place
//! with one refresh, removed without grace, fenced fills, the backends
//! without it), marks (tags, `expire_tag`, `clear`, or a clear
//! `Unsupported`) and regressions (the faults found
//! by hostile tests that any backend could bring back: unreadable values, read-your-writes, unfenced no-lease
//! fills, hostile keys, two loads in one process, a lease lost twice).

// How the suite is declared: each theme's file declares its scenarios once,
// inside `scenarios!`, which emits the functions and the list the suite
// instantiates; the themes are listed once, in `themes!`, which emits
// `conformance_suite!`. A scenario therefore cannot exist without running
// in the suite: a theme missing from `themes!` leaves its `NAMES` unused,
// which does not compile (`deny(dead_code)`), and a theme whose macro is
// misnamed does not either.

use std::time::Duration;

use super::{eventually, CacheUnderTest, Origin};
use crate::{CacheBuilder, Error, Fetched};

/// Declares a theme's scenarios: emits each as a public function, their
/// names as `NAMES`, and a hidden exported macro, `$suite!($make, $attr)`,
/// that instantiates each as a test. Called with a literal `$` first (for
/// the inner macro's own metavariables), then the macro's name:
/// `scenarios! { $ __onefill_conformance_theme; /// doc  pub async fn name(h: &dyn Harness) { … } … }`.
macro_rules! scenarios {
    (
        $d:tt $suite:ident;
        $(
            $(#[$meta:meta])*
            pub async fn $name:ident($h:ident: &dyn Harness) $body:block
        )*
    ) => {
        $(
            $(#[$meta])*
            pub async fn $name($h: &dyn Harness) $body
        )*

        /// This theme's scenarios, by name. Read by `themes!`: unread, the
        /// theme would be missing from the suite.
        #[deny(dead_code)]
        pub(super) const NAMES: &[&str] = &[$(stringify!($name)),*];

        #[doc(hidden)]
        #[macro_export]
        macro_rules! $suite {
            ($d make:expr, $d attr:meta) => {
                $(
                    #[$d attr]
                    async fn $name() {
                        let harness = $d make.await;
                        $crate::testing::conformance::$name(&harness).await;
                    }
                )*
            };
        }
    };
}

/// Lists the themes (modules declared with `#[macro_use]` above it, each
/// holding one `scenarios!`) and emits, from that one list, [`THEMES`] and
/// the exported `conformance_suite!` that runs every theme's scenarios.
macro_rules! themes {
    ($d:tt $($theme:ident => $suite:ident),* $(,)?) => {
        $(
            pub use $theme::*;
            // Checks here that the theme defines this macro and that it
            // expands; the tests it generates are configured out.
            $suite!((), cfg(any()));
        )*

        /// Every scenario of the suite, by theme and name.
        pub const THEMES: &[(&str, &[&str])] = &[$((stringify!($theme), $theme::NAMES)),*];

        /// Instantiates the whole [conformance suite](crate::testing) on a
        /// backend: one test per scenario, named after it.
        ///
        /// `$make` is an `async` expression of a type that implements
        /// [`Harness`](crate::testing::Harness), awaited at the start of
        /// every test; `$attr` is the test attribute (inside `#[…]`), for
        /// example `tokio::test(start_paused = true)` for a store on
        /// tokio's clock, or
        /// `tokio::test(flavor = "multi_thread", worker_threads = 2)` for a
        /// server in real time. Needs the `test-support` feature; see the
        /// [`testing`](crate::testing) module for a complete example.
        ///
        /// ```
        /// use onefill::{testing::CloneHarness, MemoryBackend};
        ///
        /// async fn memory() -> CloneHarness<MemoryBackend> {
        ///     CloneHarness { backend: MemoryBackend::new(), paused: true }
        /// }
        ///
        /// onefill::conformance_suite!(memory(), tokio::test(start_paused = true));
        /// # fn main() {}
        /// ```
        #[macro_export]
        macro_rules! conformance_suite {
            ($d make:expr, $d attr:meta $d(,)?) => {
                $( $crate::$suite!($d make, $d attr); )*
            };
        }
    };
}

#[macro_use]
mod batch;
#[macro_use]
mod coalescing;
#[macro_use]
mod expiry;
#[macro_use]
mod freshness;
#[macro_use]
mod leases;
#[macro_use]
mod loader_failures;
#[macro_use]
mod marks;
#[macro_use]
mod regressions;
#[macro_use]
mod waiting;
#[macro_use]
mod writes;

themes! { $
    coalescing => __onefill_conformance_coalescing,
    leases => __onefill_conformance_leases,
    waiting => __onefill_conformance_waiting,
    loader_failures => __onefill_conformance_loader_failures,
    freshness => __onefill_conformance_freshness,
    writes => __onefill_conformance_writes,
    expiry => __onefill_conformance_expiry,
    regressions => __onefill_conformance_regressions,
    batch => __onefill_conformance_batch,
    marks => __onefill_conformance_marks,
}

// ------------------------------------------- helpers of the scenarios only

fn all_ok_with(results: &[Result<Fetched<String>, Error>], value: &str) {
    for r in results {
        match r {
            Ok(f) => assert_eq!(f.value, value),
            Err(e) => panic!("caller failed: {e}"),
        }
    }
}

/// Starts a call for key `k` in the background and returns once its loader
/// runs (so the lease is taken).
async fn start_slow_load(
    c: &CacheUnderTest,
    origin: &Origin,
    took: Duration,
) -> tokio::task::JoinHandle<Result<Fetched<String>, Error>> {
    let before = origin.count();
    let task = {
        let c = c.clone();
        let loader = origin.loader(took);
        tokio::spawn(async move { c.fetch("k", loader).await })
    };
    eventually(Duration::from_secs(5), || origin.count() > before).await;
    task
}

/// One call for `key` with the default options and an instant loader of
/// `origin`, which must answer.
async fn fetch_now(c: &CacheUnderTest, key: &str, origin: &Origin) -> Fetched<String> {
    c.fetch(key, origin.loader(Duration::ZERO))
        .await
        .expect("an answer")
}

async fn pods_with(
    h: &dyn super::Harness,
    ns: &str,
    n: usize,
    f: impl Fn(CacheBuilder<String, String>) -> CacheBuilder<String, String>,
) -> Vec<CacheUnderTest> {
    let mut pods = Vec::new();
    for _ in 0..n {
        pods.push(super::cache_with(h, ns, &f).await);
    }
    pods
}
