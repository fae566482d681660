//! Policies: cache-wide defaults, overridable per call with [`CallOptions`].
//!
//! Every knob of the protocol lives here with its default; nothing a user
//! may need to tune is a hidden constant.

use std::time::Duration;

use crate::circuit::CircuitBreaker;
use crate::error::InputError;
use crate::lease::LeaseTtl;
use crate::wait::WaitPolicy;

/// The longest TTL, grace or negative TTL accepted: one year. Anything
/// longer is almost certainly a unit mistake.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// The resolved policy of one call: the cache's defaults with the call's
/// overrides applied.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub ttl: Duration,
    pub grace: Duration,
    pub jitter: f64,
    pub beta: f64,
    pub lease: Option<LeaseTtl>,
    pub max_load_time: Duration,
    pub wait: WaitPolicy,
    pub backend_timeout: Duration,
    pub negative_ttl: Option<Duration>,
    pub fail_safe: bool,
    pub fail_safe_throttle: Duration,
    pub strict: bool,
    pub max_value_bytes: usize,
    pub max_key_bytes: usize,
    pub circuit: CircuitBreaker,
    pub fallback_capacity: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            ttl: Duration::from_secs(60),
            grace: Duration::ZERO,
            jitter: 0.1,
            beta: 1.0,
            lease: Some(LeaseTtl::default()),
            max_load_time: Duration::from_secs(30),
            wait: WaitPolicy::default(),
            backend_timeout: Duration::from_secs(1),
            negative_ttl: None,
            fail_safe: true,
            fail_safe_throttle: Duration::from_secs(5),
            strict: false,
            max_value_bytes: 8 * 1024 * 1024,
            max_key_bytes: 1024,
            circuit: CircuitBreaker::default(),
            fallback_capacity: 10_000,
        }
    }
}

fn check_range(
    option: &'static str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), InputError> {
    if value < min || value > max {
        return Err(InputError::option(
            option,
            format!("must be within [{min:?}, {max:?}], got {value:?}"),
        ));
    }
    Ok(())
}

impl Policy {
    pub(crate) fn validate(&self) -> Result<(), InputError> {
        let ms = Duration::from_millis(1);
        check_range("ttl", self.ttl, ms, MAX_TTL)?;
        check_range("grace", self.grace, Duration::ZERO, MAX_TTL)?;
        if !(0.0..=0.5).contains(&self.jitter) {
            return Err(InputError::option(
                "jitter",
                format!("must be a fraction within [0, 0.5], got {}", self.jitter),
            ));
        }
        if !(0.0..=100.0).contains(&self.beta) {
            return Err(InputError::option(
                "early_refresh_beta",
                format!("must be within [0, 100], got {}", self.beta),
            ));
        }
        if let Some(lease) = &self.lease {
            lease.validate()?;
        }
        check_range(
            "max_load_time",
            self.max_load_time,
            ms,
            Duration::from_secs(24 * 3600),
        )?;
        self.wait.validate()?;
        check_range(
            "backend_timeout",
            self.backend_timeout,
            ms,
            Duration::from_secs(60),
        )?;
        if let Some(neg) = self.negative_ttl {
            check_range("negative_ttl", neg, ms, MAX_TTL)?;
        }
        check_range("fail_safe_throttle", self.fail_safe_throttle, ms, MAX_TTL)?;
        if self.max_value_bytes == 0 || self.max_value_bytes > 512 * 1024 * 1024 {
            return Err(InputError::option(
                "max_value_bytes",
                format!("must be within [1, 512 MiB], got {}", self.max_value_bytes),
            ));
        }
        if self.max_key_bytes == 0 || self.max_key_bytes > 64 * 1024 {
            return Err(InputError::option(
                "max_key_bytes",
                format!("must be within [1, 64 KiB], got {}", self.max_key_bytes),
            ));
        }
        self.circuit.validate()
    }

    /// The cache's policy with a call's overrides applied, validated.
    pub(crate) fn with(&self, call: &CallOptions) -> Result<Policy, InputError> {
        if call.is_empty() {
            return Ok(self.clone());
        }
        let mut p = self.clone();
        if let Some(v) = call.ttl {
            p.ttl = v;
        }
        if let Some(v) = call.grace {
            p.grace = v;
        }
        if let Some(v) = call.jitter {
            p.jitter = v;
        }
        if let Some(v) = call.beta {
            p.beta = v;
        }
        if let Some(v) = call.lease {
            p.lease = v;
        }
        if let Some(v) = call.max_load_time {
            p.max_load_time = v;
        }
        if let Some(v) = call.wait {
            p.wait = v;
        }
        if let Some(v) = call.negative_ttl {
            p.negative_ttl = v;
        }
        if let Some(v) = call.fail_safe {
            p.fail_safe = v;
        }
        if let Some(v) = call.strict {
            p.strict = v;
        }
        p.validate()?;
        Ok(p)
    }
}

/// Per-call overrides of the cache's policy. Unset fields keep the cache's
/// default.
///
/// A call that joins a load already under way in this process shares that
/// load's outcome, which was decided with the first caller's options.
///
/// ```
/// use std::time::Duration;
/// let cheap = onefill::CallOptions::new()
///     .ttl(Duration::from_secs(5))
///     .no_lease(); // in-process coalescing only
/// # drop(cheap);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallOptions {
    ttl: Option<Duration>,
    grace: Option<Duration>,
    jitter: Option<f64>,
    beta: Option<f64>,
    lease: Option<Option<LeaseTtl>>,
    max_load_time: Option<Duration>,
    wait: Option<WaitPolicy>,
    negative_ttl: Option<Option<Duration>>,
    fail_safe: Option<bool>,
    strict: Option<bool>,
}

impl CallOptions {
    /// No overrides.
    pub fn new() -> Self {
        Self::default()
    }
    fn is_empty(&self) -> bool {
        *self == CallOptions::default()
    }
    /// How long a written value stays fresh.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// How long after `ttl` a value may still be served stale.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = Some(grace);
        self
    }
    /// The ± fraction applied to every TTL written.
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = Some(fraction);
        self
    }
    /// XFetch's `beta` (0 turns early refresh off).
    pub fn early_refresh_beta(mut self, beta: f64) -> Self {
        self.beta = Some(beta);
        self
    }
    /// Uses this lease TTL policy.
    pub fn lease_ttl(mut self, lease: LeaseTtl) -> Self {
        self.lease = Some(Some(lease));
        self
    }
    /// No distributed lease for this call (in-process coalescing stays): for
    /// loaders cheap enough that a few duplicate loads across processes are
    /// fine.
    pub fn no_lease(mut self) -> Self {
        self.lease = Some(None);
        self
    }
    /// The longest a loader may run before it is aborted.
    pub fn max_load_time(mut self, max: Duration) -> Self {
        self.max_load_time = Some(max);
        self
    }
    /// How to wait for another process's load.
    pub fn wait(mut self, wait: WaitPolicy) -> Self {
        self.wait = Some(wait);
        self
    }
    /// Remember loader failures for this long (`None`: do not).
    pub fn negative_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.negative_ttl = Some(ttl);
        self
    }
    /// Serve a stale value when the loader fails.
    pub fn fail_safe(mut self, on: bool) -> Self {
        self.fail_safe = Some(on);
        self
    }
    /// Surface backend errors instead of degrading.
    pub fn strict(mut self, on: bool) -> Self {
        self.strict = Some(on);
        self
    }
}
