//! Policies: cache-wide defaults, overridable per call with [`CallOptions`].
//!
//! Every knob of the protocol is declared **once**, in the `options!` table
//! below: its type, its default, how it is checked and its setters. The
//! table generates the resolved [`Policy`], the per-call [`CallOptions`],
//! the [`CacheBuilder`](crate::CacheBuilder) setters and the merge of a
//! call's overrides, so
//! adding an option is one edit and nothing a user may tune is a hidden
//! constant.

use std::fmt;
use std::time::Duration;

use crate::circuit::CircuitBreaker;
use crate::error::InvalidOption;
use crate::lease::LeaseTtl;
use crate::wait::WaitPolicy;

/// The longest TTL, grace or negative TTL accepted: one year. Anything
/// longer is almost certainly a unit mistake.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

const MS: Duration = Duration::from_millis(1);

/// Declares the options. Each entry is
///
/// ```text
/// field: Type = default, check(checker) {
///     /// setter docs
///     fn setter(args) = value_of_the_field;
///     …
/// }
/// ```
///
/// in the `per_call` group (on the builder and on [`CallOptions`]) or the
/// `cache_wide` group (on the builder only). A checker is called as
/// `checker("field", &value)` and returns `Result<(), InvalidOption>`; the
/// field is named after its main setter, so errors name what the user typed.
macro_rules! options {
    (
        per_call { $( $pf:ident : $pty:ty = $pdefault:expr, check($pcheck:expr) {
            $( $(#[$pdoc:meta])* fn $psetter:ident ( $( $parg:ident : $parg_ty:ty ),* ) = $pvalue:expr ; )+
        } )* }
        cache_wide { $( $cf:ident : $cty:ty = $cdefault:expr, check($ccheck:expr) {
            $( $(#[$cdoc:meta])* fn $csetter:ident ( $( $carg:ident : $carg_ty:ty ),* ) = $cvalue:expr ; )+
        } )* }
    ) => {
        /// The resolved policy of one call: the cache's defaults with the
        /// call's overrides applied.
        #[derive(Debug, Clone)]
        pub(crate) struct Policy {
            $( pub $pf: $pty, )*
            $( pub $cf: $cty, )*
        }

        impl Default for Policy {
            fn default() -> Self {
                Policy {
                    $( $pf: $pdefault, )*
                    $( $cf: $cdefault, )*
                }
            }
        }

        impl Policy {
            /// Checks every option.
            pub(crate) fn validate(&self) -> Result<(), InvalidOption> {
                $( ($pcheck)(stringify!($pf), &self.$pf)?; )*
                $( ($ccheck)(stringify!($cf), &self.$cf)?; )*
                self.check_together()
            }

            /// The cache's policy with a call's overrides applied, validated.
            pub(crate) fn with(&self, call: &CallOptions) -> Result<Policy, InvalidOption> {
                if *call == CallOptions::default() {
                    return Ok(self.clone());
                }
                let mut policy = self.clone();
                $( if let Some(v) = &call.$pf { policy.$pf = v.clone(); } )*
                policy.validate()?;
                Ok(policy)
            }
        }

        /// Per-call overrides of the cache's policy. Unset fields keep the
        /// cache's default.
        ///
        /// A call that joins a load already under way in this process shares
        /// that load's outcome, which was decided with the first caller's
        /// options.
        ///
        /// ```
        /// use std::time::Duration;
        /// let cheap = onefill::CallOptions::new()
        ///     .ttl(Duration::from_secs(5))
        ///     .no_lease(); // no waiting for other processes' loads
        /// # drop(cheap);
        /// ```
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct CallOptions {
            $( $pf: Option<$pty>, )*
        }

        impl CallOptions {
            /// No overrides.
            pub fn new() -> Self {
                Self::default()
            }

            /// No overrides, as a constant.
            pub(crate) const NONE: Self = Self { $( $pf: None, )* };
            $( $(
                $(#[$pdoc])*
                pub fn $psetter(mut self, $( $parg: $parg_ty ),* ) -> Self {
                    self.$pf = Some($pvalue);
                    self
                }
            )+ )*
        }

    };
}

/// The table of options, handed to `$callback` (a macro of the same
/// grammar as `options!`): `options!` makes the policy and the call options
/// of it here, and the builder makes its setters of it (see `builder.rs`),
/// so each option is still declared once.
macro_rules! with_options {
    ($callback:ident) => {
        $callback! {
            per_call {
                ttl: Duration = Duration::from_secs(60), check(within(MS, MAX_TTL)) {
                    /// How long a value stays fresh (1 ms to 1 year).
                    fn ttl(ttl: Duration) = ttl;
                }
                grace: Duration = Duration::ZERO, check(within(Duration::ZERO, MAX_TTL)) {
                    /// How long after `ttl` a value is still served (stale) while one
                    /// background refresh runs fleet-wide; also the window in which
                    /// fail-safe can serve it when the loader fails.
                    fn grace(grace: Duration) = grace;
                }
                jitter: f64 = 0.1, check(within(0.0, 0.5)) {
                    /// The fraction by which every TTL written may be shortened, at
                    /// random (0 to 0.5): keys filled together do not expire
                    /// together, and no hit is older than `ttl`.
                    fn jitter(fraction: f64) = fraction;
                }
                early_refresh_beta: f64 = 1.0, check(within(0.0, 100.0)) {
                    /// How far ahead of its expiry a value is refreshed, in units of
                    /// its last load time: with `beta` 1.0 (the default) the first
                    /// call that finds a value with at most 1.2 load times (+ 5 ms
                    /// for the round trips; at most half the TTL) of freshness left
                    /// refreshes it in the background, once fleet-wide, so it is
                    /// stored again shortly before it would have expired; larger
                    /// refreshes earlier, 0 turns it off (0 to 100). Applies to
                    /// values stored without a grace window (the cache's, or the one
                    /// a loader chose with [`Loaded::grace`](crate::Loaded::grace)):
                    /// with one, the first stale read already refreshes in the
                    /// background without making anyone wait.
                    fn early_refresh_beta(beta: f64) = beta;
                }
                lease_ttl: Option<LeaseTtl> = Some(LeaseTtl::default()), check(optional(|_, lease: &LeaseTtl| lease.validate())) {
                    /// The lease TTL policy (and the lease on, if it was off).
                    fn lease_ttl(lease: LeaseTtl) = Some(lease);
                    /// No waiting for another process's load (in-process coalescing
                    /// stays): for loaders cheap enough that a few duplicate loads
                    /// across processes are fine. The result is stored only if the
                    /// key's lease was free, taken on the way so that the write is
                    /// fenced on its token like every fill (a `set`, an `invalidate`
                    /// or a newer holder keeps an older load out); while another
                    /// process holds it, the result answers this process's callers
                    /// ([`Outcome::Degraded`](crate::Outcome::Degraded)) and that
                    /// holder fills.
                    fn no_lease() = None;
                }
                max_load_time: Duration = Duration::from_secs(30), check(within(MS, Duration::from_secs(24 * 3600))) {
                    /// The longest a loader may run; then it is aborted and its lease
                    /// released.
                    fn max_load_time(max: Duration) = max;
                }
                soft_timeout: Option<Duration> = None, check(optional(within(MS, Duration::from_secs(24 * 3600)))) {
                    /// How long callers wait for a load when a stale value exists (a
                    /// value in its grace window): past it, they get the stale value
                    /// ([`Outcome::Stale`](crate::Outcome::Stale)) and the load
                    /// finishes in the background, still under the lease (the
                    /// watchdog keeps extending it), then fills and notifies as
                    /// usual; `max_load_time` stays its hard bound. With it set, a
                    /// stale read no longer answers at once: it takes the lease and
                    /// loads, so a fast origin gives a fresh value (another
                    /// process's load still answers stale at once). A load that
                    /// fails before the soft timeout still answers the stale value,
                    /// and stores what a failed background refresh would (a
                    /// fail-safe re-store, a cached failure, or nothing). With no
                    /// stale value, callers wait for the load as always. Off by
                    /// default (1 ms to 24 h). A stale value that expires on the
                    /// server (past `ttl + grace`) before the soft timeout is not
                    /// served: the callers wait for the load, as with none.
                    fn soft_timeout(timeout: Duration) = Some(timeout);
                    /// Stale values in the grace window answer at once while one
                    /// refresh runs (the default).
                    fn no_soft_timeout() = None;
                }
                wait: WaitPolicy = WaitPolicy::default(), check(|_, wait: &WaitPolicy| wait.validate()) {
                    /// How losers of the lease race wait for another process's load.
                    fn wait(wait: WaitPolicy) = wait;
                }
                negative_ttl: Option<Duration> = None, check(optional(within(MS, MAX_TTL))) {
                    /// Remember loader failures for this long, so a failing origin is
                    /// not called by every successive winner.
                    fn negative_ttl(ttl: Duration) = Some(ttl);
                    /// Do not remember loader failures (the default).
                    fn no_negative_caching() = None;
                }
                fail_safe: bool = true, check(any) {
                    /// Serve the stale value when the loader fails (default on).
                    fn fail_safe(on: bool) = on;
                }
                strict: bool = false, check(any) {
                    /// Surface backend errors to callers instead of degrading.
                    fn strict(on: bool) = on;
                }
            }
            cache_wide {
                backend_timeout: Duration = Duration::from_millis(250), check(within(MS, Duration::from_secs(60))) {
                    /// The backend time one flight may lose to failures before its
                    /// callers are answered: every call on their path (get, acquire,
                    /// subscribe, re-checks, fill) is bounded by what is left, and a
                    /// call that fails is charged what it took, so a hung backend
                    /// costs a caller this timeout plus its load, never a chain of
                    /// timeouts (calls that answer are not charged). 250 ms
                    /// by default: a few hundred times a healthy Redis round trip
                    /// (sub-millisecond on a LAN), yet short enough that a hung
                    /// server costs callers less than a typical origin load would
                    /// (see `docs/decisions/0005-backend-timeout.md`).
                    fn backend_timeout(timeout: Duration) = timeout;
                }
                fail_safe_throttle: Duration = Duration::from_secs(5), check(within(MS, MAX_TTL)) {
                    /// After a fail-safe answer, the stale value is stored as fresh
                    /// for this long, so the failing origin is not retried at once,
                    /// followed by its own grace window (the one it was stored
                    /// with, which a loader may have chosen).
                    fn fail_safe_throttle(throttle: Duration) = throttle;
                }
                max_value_bytes: usize = 8 * 1024 * 1024, check(within(1, 512 * 1024 * 1024)) {
                    /// The largest encoded value accepted (bytes).
                    fn max_value_bytes(max: usize) = max;
                }
                max_key_bytes: usize = 1024, check(within(1, 64 * 1024)) {
                    /// The longest key accepted (bytes of its string form).
                    fn max_key_bytes(max: usize) = max;
                }
                circuit_breaker: CircuitBreaker = CircuitBreaker::default(), check(|_, b: &CircuitBreaker| b.validate()) {
                    /// The circuit breaker in front of the backend.
                    fn circuit_breaker(breaker: CircuitBreaker) = breaker;
                }
                outage_fallback_capacity: usize = 10_000, check(any) {
                    /// How many keys' last values this process keeps to answer during
                    /// a backend outage (each no longer than the server would have
                    /// kept it: the TTL it reported when the value was read or
                    /// written); 0 turns it off. Healthy reads never use it.
                    fn outage_fallback_capacity(keys: usize) = keys;
                }
                replay_queue_capacity: usize = 10_000, check(any) {
                    /// How many failed writes this process keeps to replay once the
                    /// backend answers again (10,000 by default; 0 turns it off). A
                    /// `set` or `invalidate` that fails for want of the backend
                    /// (unreachable, circuit open, timed out, or its future dropped
                    /// mid-way) still returns its error, and is replayed, in order,
                    /// as an invalidation of its key, so the other processes stop
                    /// answering the value it replaced (see
                    /// `docs/decisions/0017-replayed-writes.md`). The newest write
                    /// per key is kept; when the queue is full the oldest is dropped
                    /// (counted in [`Stats::writes_dropped`](crate::Stats::writes_dropped)).
                    /// The queue lives in memory: a process that exits loses it.
                    fn replay_queue_capacity(writes: usize) = writes;
                }
            }
        }
    };
}
pub(crate) use with_options;

with_options!(options);

/// The policy of one call: the cache's own, borrowed, when the call sets no
/// options (most calls), else the call's, boxed. A `Cow` would hold a whole
/// `Policy` inline (~300 bytes), and a call's state carries it through
/// every layer of its future: each layer moves the future at least once.
pub(crate) enum PolicyRef<'a> {
    Cache(&'a Policy),
    Call(Box<Policy>),
}

impl PolicyRef<'_> {
    /// The policy itself, copied if borrowed.
    pub(crate) fn into_owned(self) -> Policy {
        match self {
            PolicyRef::Cache(policy) => policy.clone(),
            PolicyRef::Call(policy) => *policy,
        }
    }
}

impl std::ops::Deref for PolicyRef<'_> {
    type Target = Policy;

    fn deref(&self) -> &Policy {
        match self {
            PolicyRef::Cache(policy) => policy,
            PolicyRef::Call(policy) => policy,
        }
    }
}

impl Policy {
    /// Applies the freshness a loader chose for its value
    /// ([`Loaded`](crate::Loaded)): its TTL (also that of a cached absence)
    /// and grace, clamped to the ranges of the options of the same names.
    pub(crate) fn choose(&mut self, ttl: Option<Duration>, grace: Option<Duration>) {
        // Clamped, not refused: a loader computes these from its data (a
        // row's `expires_at - now` is zero once it passed), and throwing a
        // successful load away over it would fail every caller.
        if let Some(ttl) = ttl {
            let ttl = ttl.clamp(MS, MAX_TTL);
            self.ttl = ttl;
            self.negative_ttl = Some(ttl);
        }
        if let Some(grace) = grace {
            self.grace = grace.min(MAX_TTL);
        }
    }

    /// The checks between options.
    fn check_together(&self) -> Result<(), InvalidOption> {
        // A soft timeout at or past the hard bound could never fire: the
        // callers would wait for the whole `max_load_time`.
        if let Some(soft) = self.soft_timeout {
            if soft >= self.max_load_time {
                return Err(InvalidOption::new(
                    "soft_timeout",
                    format!(
                        "must be shorter than max_load_time ({:?}), got {soft:?}",
                        self.max_load_time
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The longest one flight can take: waiting, then loading, with a few
    /// backend calls around them.
    pub(crate) fn longest_flight(&self) -> Duration {
        self.wait.deadline + self.max_load_time + self.backend_timeout * 4
    }
}

/// Accepts any value.
fn any<T>(_: &'static str, _: &T) -> Result<(), InvalidOption> {
    Ok(())
}

/// A value within `[min, max]` (a NaN is never within).
fn within<T: PartialOrd + Copy + fmt::Debug>(
    min: T,
    max: T,
) -> impl Fn(&'static str, &T) -> Result<(), InvalidOption> {
    move |option, value| {
        if (min..=max).contains(value) {
            return Ok(());
        }
        Err(InvalidOption::new(
            option,
            format!("must be within [{min:?}, {max:?}], got {value:?}"),
        ))
    }
}

/// `check` for the value when there is one.
fn optional<T>(
    check: impl Fn(&'static str, &T) -> Result<(), InvalidOption>,
) -> impl Fn(&'static str, &Option<T>) -> Result<(), InvalidOption> {
    move |option, value| value.as_ref().map_or(Ok(()), |v| check(option, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_overrides_apply() {
        let policy = Policy::default();
        assert!(policy.validate().is_ok());
        let call = CallOptions::new()
            .ttl(Duration::from_secs(5))
            .no_lease()
            .negative_ttl(Duration::from_secs(1));
        let merged = policy.with(&call).unwrap();
        assert_eq!(merged.ttl, Duration::from_secs(5));
        assert_eq!(merged.lease_ttl, None);
        assert_eq!(merged.negative_ttl, Some(Duration::from_secs(1)));
        assert_eq!(merged.backend_timeout, policy.backend_timeout);
    }

    #[test]
    fn errors_name_the_setter() {
        let call = CallOptions::new().early_refresh_beta(f64::NAN);
        let err = Policy::default().with(&call).unwrap_err();
        assert_eq!(err.option, "early_refresh_beta");
        let err = Policy::default()
            .with(&CallOptions::new().lease_ttl(LeaseTtl::Fixed(Duration::ZERO)))
            .unwrap_err();
        assert_eq!(err.option, "lease_ttl");
    }
}
