//! The lease request: the acquire script, with or without a gone holder
//! to take the lease over from, and what its reply means.

use std::time::Duration;

use super::liveness::Acquiring;
use super::read::stored;
use super::scripts::ScriptCall;
use super::ttl::{ms_ceil, px, ttl_from_ms};
use super::{RedisBackend, NO_EXPIRY_TTL};
use crate::backend::{Acquired, BackendError, FillKeys, LeaseToken};
use crate::error::BackendErrorKind;

/// The acquire script's reply: status, value, value PTTL, lease PTTL, the
/// holder's token.
pub(super) type AcquireAnswer = (i64, Option<Vec<u8>>, i64, i64, Option<Vec<u8>>);

/// The acquire script's reply (see `scripts/acquire.lua`) as an [`Acquired`].
pub(super) fn acquired_from(
    (status, bytes, value_ttl, lease_ms, holder): AcquireAnswer,
) -> Result<Acquired, BackendError> {
    let value = stored(bytes, value_ttl);
    match status {
        0 => value.map(Acquired::Fresh).ok_or_else(|| {
            BackendError::new(
                BackendErrorKind::Protocol,
                "acquire: the script answered fresh without a value",
            )
        }),
        1 => Ok(Acquired::Won { stale: value }),
        2 => Ok(Acquired::Held {
            stale: value,
            // The lease vanished between the `SET NX` and the `PTTL`
            // only if it had expired: report it as expiring now.
            lease_ttl: ttl_from_ms(lease_ms).unwrap_or(Duration::ZERO),
            holder: holder.as_deref().and_then(LeaseToken::from_stored),
        }),
        other => Err(BackendError::new(
            BackendErrorKind::Protocol,
            format!("acquire: unknown status {other} from the script"),
        )),
    }
}

impl RedisBackend {
    /// The acquire script; a lease still holding `gone` counts as free.
    pub(super) async fn acquire_replacing(
        &self,
        keys: &FillKeys,
        gone: Option<&LeaseToken>,
        token: &LeaseToken,
        lease_ttl: Duration,
        refresh_window: Duration,
    ) -> Result<Acquired, BackendError> {
        let mut invocation = ScriptCall::new(&self.inner.scripts.acquire);
        invocation
            .key(keys.value())
            .key(keys.lock())
            .arg(token.as_bytes())
            .arg(px(lease_ttl))
            .arg(ms_ceil(refresh_window))
            .arg(NO_EXPIRY_TTL.as_millis() as u64)
            .arg(gone.map_or(&b""[..], LeaseToken::as_bytes));
        let acquiring = self.acquiring(token);
        let answer: AcquireAnswer = self.eval("acquire", keys, &invocation).await?;
        let acquired = acquired_from(answer)?;
        if let (Acquired::Won { .. }, Some(acquiring)) = (&acquired, acquiring) {
            acquiring.won();
        }
        Ok(acquired)
    }

    /// While a request for the lease with `token` is under way, and after
    /// it if it won: a flight of this backend holds `token` (see
    /// `liveness.rs`). `None` where holders are not watched.
    pub(super) fn acquiring(&self, token: &LeaseToken) -> Option<Acquiring> {
        self.inner.liveness.get().map(|l| l.acquiring(token))
    }
}
