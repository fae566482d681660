//! The metrics every cache emits through the [`metrics`](https://docs.rs/metrics)
//! facade, for whatever exporter the application installed (Prometheus,
//! StatsD, OpenTelemetry…).
//!
//! Names follow the Prometheus conventions: the `onefill_` prefix, the unit
//! in the name (`_seconds`), `_total` on counters. Every series carries the
//! label `namespace` (the cache's); some carry one more, from a short fixed
//! list of values (`layer`, `outcome`, `reason`, `trigger`). No label ever
//! holds a key, so the number of series is bounded by the number of
//! namespaces. Each name is described (with its unit) once per cache build,
//! and by [`describe()`].
//!
//! A cache registers its handles when it is built, so counting looks
//! nothing up and allocates nothing: install the exporter **before**
//! building caches (a cache built earlier reports to the recorder of that
//! moment, the no-op one if none was, for the rest of its life). Every
//! series exists, at 0, from the moment its cache is built. The same counts
//! are in [`Cache::stats`](crate::Cache::stats) (the [`Stats`](crate::Stats)
//! field is named in the last column).
//!
//! | metric | type | labels | what it counts | `Stats` field |
//! | --- | --- | --- | --- | --- |
//! | `onefill_hits_total` | counter | `layer="backend"` | calls answered by a fresh value read from the backend (flights) | `hits` |
//! | `onefill_hits_total` | counter | `layer="l1"` | calls answered by the in-process L1, without a flight | `l1_hits` |
//! | `onefill_misses_total` | counter | | flights that found no usable value (cold, expired or unreadable) | `misses` |
//! | `onefill_stale_served_total` | counter | | calls answered by a stale value (grace window, fail-safe, outage) | `stale_served` |
//! | `onefill_negative_hits_total` | counter | | calls answered by a cached failure (negative caching) | `negative_hits` |
//! | `onefill_coalesced_total` | counter | | calls that joined a flight already under way in this process | `coalesced` |
//! | `onefill_loads_total` | counter | `outcome="ok"` | loader runs that returned a value | `loads_ok` |
//! | `onefill_loads_total` | counter | `outcome="error"` | loader runs that failed (an error, a panic, the maximum load time) | `loads_error` |
//! | `onefill_loads_not_stored_total` | counter | | loaded values their loader said must not be stored (`Loaded::no_store`): answered, never written | `loads_not_stored` |
//! | `onefill_degraded_loads_total` | counter | | loads without a lease (wait deadline passed, backend failing) | `degraded_loads` |
//! | `onefill_duplicate_loads_total` | counter | | leased loads started while this process still ran another load of the key (whose lease was lost) | `duplicate_loads` |
//! | `onefill_refreshes_total` | counter | `reason="early"` | refreshes started before expiry (early refresh) | `early_refreshes` |
//! | `onefill_refreshes_total` | counter | `reason="stale"` | background refreshes started while a stale value was served | `background_refreshes` |
//! | `onefill_leases_acquired_total` | counter | | leases this process won | `lease_acquired` |
//! | `onefill_lease_contentions_total` | counter | | acquire attempts that found another holder's lease | `lease_contended` |
//! | `onefill_lease_takeovers_total` | counter | | leases won by a waiter from a holder that died or stalled: judged gone, or its lease run out with no notice that it ended | `lease_takeovers` |
//! | `onefill_holders_gone_total` | counter | `verdict="dead"` | holders a waiter judged dead (their connections closed) and took over from before their lease expired | `holders_dead` |
//! | `onefill_holders_gone_total` | counter | `verdict="frozen"` | holders a waiter judged frozen (alive but silent for about a second) and took over from | `holders_frozen` |
//! | `onefill_leases_lost_total` | counter | | leases lost before their fill or release (expired or invalidated mid-load): each is a possible duplicate load; should stay near 0 | `lease_lost` |
//! | `onefill_fills_fenced_total` | counter | | fills refused because the lease was no longer this process's: nothing was written | `fills_fenced` |
//! | `onefill_lease_renewals_total` | counter | `outcome="ok"` | watchdog renewals that extended the lease | `lease_extended` |
//! | `onefill_lease_renewals_total` | counter | `outcome="error"` | watchdog renewals that failed or timed out (retried at the next period) | `lease_renewal_failures` |
//! | `onefill_waits_total` | counter | | flights that waited for another process's load | `waits` |
//! | `onefill_wait_timeouts_total` | counter | | waits that reached their deadline | `wait_timeouts` |
//! | `onefill_wait_rechecks_total` | counter | `trigger="notified"` | re-checks of waiters woken by a fill notification | `wait_notified` |
//! | `onefill_wait_rechecks_total` | counter | `trigger="poll"` | re-checks with no notification: the holder's lease expiry, a safety or backoff poll | `wait_polls` |
//! | `onefill_decode_errors_total` | counter | | stored values that could not be decoded (treated as misses) | `decode_errors` |
//! | `onefill_backend_errors_total` | counter | | backend calls that failed or timed out | `backend_errors` |
//! | `onefill_circuit_rejections_total` | counter | | calls for which the circuit breaker skipped the backend | `circuit_rejected` |
//! | `onefill_circuit_opens_total` | counter | | times the circuit breaker opened | `circuit_opened` |
//! | `onefill_l1_invalidations_total` | counter | | L1 entries dropped because the backend reported a change of their key | `l1_invalidations` |
//! | `onefill_l1_resets_total` | counter | | times the L1 was emptied because the backend lost track of changes | `l1_resets` |
//! | `onefill_contention_warnings_total` | counter | | 10 s windows in which at least half of the flights (and 20) waited for another process's lease | `contention_warnings` |
//! | `onefill_writes_queued_total` | counter | | writes (`set`, `invalidate`) that failed for want of the backend (unreachable, circuit open, timed out, future dropped mid-way), queued to be replayed as invalidations once it answers | `writes_queued` |
//! | `onefill_writes_replayed_total` | counter | | queued writes the backend ran once it answered again | `writes_replayed` |
//! | `onefill_writes_dropped_total` | counter | `reason="full"` | queued writes dropped unreplayed, the queue being full (`replay_queue_capacity`; the oldest goes, logged in summary): other processes may answer what they replaced until it expires | `writes_dropped` |
//! | `onefill_writes_dropped_total` | counter | `reason="refused"` | replays the backend refused (a command error, not an outage): dropped, not retried | `writes_refused` |
//! | `onefill_writes_unreplicated_total` | counter | | writes of a value or a mark that ran but that fewer replicas confirmed in time than asked (`RedisOptions::durability`): a failover may lose them | `writes_unreplicated` |
//! | `onefill_load_duration_seconds` | histogram | | how long each loader run took, failed ones included | |
//! | `onefill_lease_wait_duration_seconds` | histogram | | how long each flight waited for another process's lease, until a fill, a takeover or the deadline | |
//! | `onefill_lease_hold_duration_seconds` | histogram | | how long this process held each lease it won, from the acquire to its fill or release | |
//! | `onefill_flight_callers` | histogram | | callers that shared each flight in this process (1: nobody joined) | |
//! | `onefill_lease_waiters` | gauge | | flights of this process waiting for another process's lease right now | |
//! | `onefill_writes_pending` | gauge | | failed writes of this process waiting to be replayed right now (`Cache::pending_writes`) | |
//!
//! A duplicate load across processes shows on both sides: as a takeover
//! where the lease was taken over, and as a lost lease (and, if its load
//! finished, a fenced fill) on the holder that stalled.
//!
//! Earlier versions named them `onefill_<Stats field>` (`onefill_hits`,
//! `onefill_loads_ok`…) with histograms `onefill_load_seconds` and
//! `onefill_wait_seconds`.

use ::metrics::Unit;

/// What kind of series a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Histogram,
    Gauge,
}

/// One metric name, described once (a name with several label values is
/// one entry).
#[derive(Debug)]
pub(crate) struct Described {
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Unit,
    pub help: &'static str,
}

macro_rules! described {
    ($( $name:literal $kind:ident $unit:ident $help:literal ),* $(,)?) => {
        /// Every name a cache emits, with its type, unit and description.
        pub(crate) const ALL: &[Described] = &[
            $( Described { name: $name, kind: Kind::$kind, unit: Unit::$unit, help: $help }, )*
        ];
    };
}

described! {
    "onefill_hits_total" Counter Count "Calls answered by a fresh value, from the backend (layer=backend) or the in-process L1 (layer=l1).",
    "onefill_misses_total" Counter Count "Flights that found no usable value (cold, expired or unreadable).",
    "onefill_stale_served_total" Counter Count "Calls answered by a stale value (grace window, fail-safe, or backend outage).",
    "onefill_negative_hits_total" Counter Count "Calls answered by a cached failure (negative caching).",
    "onefill_coalesced_total" Counter Count "Calls that joined a flight already under way in this process.",
    "onefill_loads_total" Counter Count "Loader runs, by outcome (ok, error: an error, a panic or the maximum load time).",
    "onefill_loads_not_stored_total" Counter Count "Loaded values their loader said must not be stored (Loaded::no_store); answered, never written.",
    "onefill_degraded_loads_total" Counter Count "Loads run without a lease (wait deadline passed, or backend failing); not stored.",
    "onefill_duplicate_loads_total" Counter Count "Leased loads started while this process still ran another load of the same key.",
    "onefill_refreshes_total" Counter Count "Refreshes started, by reason (early: before expiry; stale: while a stale value was served).",
    "onefill_leases_acquired_total" Counter Count "Leases this process won.",
    "onefill_lease_contentions_total" Counter Count "Acquire attempts that found another process's lease.",
    "onefill_lease_takeovers_total" Counter Count "Leases won by a waiter after the previous holder's lease ran out with no notice that it ended (holder died or stalled).",
    "onefill_holders_gone_total" Counter Count "Lease holders a waiter judged gone and took over from, by verdict (dead: connections closed; frozen: silent for about a second).",
    "onefill_leases_lost_total" Counter Count "Leases lost before their fill or release (expired or invalidated mid-load): possible duplicate loads.",
    "onefill_fills_fenced_total" Counter Count "Fills refused because the lease was no longer this process's; nothing was written.",
    "onefill_lease_renewals_total" Counter Count "Watchdog lease renewals, by outcome (ok, error: failed or timed out).",
    "onefill_waits_total" Counter Count "Flights that waited for another process's load.",
    "onefill_wait_timeouts_total" Counter Count "Waits that reached their deadline.",
    "onefill_wait_rechecks_total" Counter Count "Re-checks made by waiters, by trigger (notified: a fill notification; poll: lease expiry or a poll).",
    "onefill_decode_errors_total" Counter Count "Stored values that could not be decoded (treated as misses).",
    "onefill_backend_errors_total" Counter Count "Backend calls that failed or timed out.",
    "onefill_circuit_rejections_total" Counter Count "Calls for which the circuit breaker skipped the backend.",
    "onefill_circuit_opens_total" Counter Count "Times the circuit breaker opened.",
    "onefill_l1_invalidations_total" Counter Count "L1 entries dropped because the backend reported a change of their key.",
    "onefill_l1_resets_total" Counter Count "Times the L1 was emptied because the backend lost track of changes.",
    "onefill_contention_warnings_total" Counter Count "10 s windows in which at least half of the flights waited for another process's lease.",
    "onefill_writes_queued_total" Counter Count "Writes that failed for want of the backend, queued to be replayed as invalidations once it answers.",
    "onefill_writes_replayed_total" Counter Count "Queued writes the backend ran once it answered again.",
    "onefill_writes_dropped_total" Counter Count "Queued writes dropped unreplayed, by reason (full: the replay queue was full; refused: the backend refused the replay).",
    "onefill_writes_unreplicated_total" Counter Count "Writes of a value or a mark that ran but that fewer replicas confirmed in time than asked (a failover may lose them).",
    "onefill_load_duration_seconds" Histogram Seconds "How long each loader run took (failed runs included).",
    "onefill_lease_wait_duration_seconds" Histogram Seconds "How long each flight waited for another process's lease.",
    "onefill_lease_hold_duration_seconds" Histogram Seconds "How long this process held each lease it won, from acquire to fill or release.",
    "onefill_flight_callers" Histogram Count "Callers that shared each flight in this process (1: nobody joined).",
    "onefill_lease_waiters" Gauge Count "Flights of this process waiting for another process's lease now.",
    "onefill_writes_pending" Gauge Count "Failed writes of this process waiting to be replayed now.",
}

/// Describes every onefill metric (type, unit, help text) to the `metrics`
/// recorder installed now. Idempotent; every cache build also does it, so
/// calling it is only needed to describe the metrics before any cache
/// exists (or to a recorder installed after the caches were built).
///
/// ```
/// // Install the exporter first (e.g. `metrics_exporter_prometheus`), then:
/// onefill::metrics::describe();
/// ```
pub fn describe() {
    for m in ALL {
        match m.kind {
            Kind::Counter => ::metrics::describe_counter!(m.name, m.unit, m.help),
            Kind::Histogram => ::metrics::describe_histogram!(m.name, m.unit, m.help),
            Kind::Gauge => ::metrics::describe_gauge!(m.name, m.unit, m.help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table in this module's docs lists every name described, and
    /// nothing else (the docs are the operators' reference).
    #[test]
    fn the_docs_table_lists_every_metric() {
        let source = include_str!("metrics.rs");
        let documented: std::collections::BTreeSet<&str> = source
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `onefill_"))
            .filter_map(|l| l.split('`').next())
            .collect();
        let described: std::collections::BTreeSet<&str> = ALL
            .iter()
            .map(|m| m.name.strip_prefix("onefill_").unwrap())
            .collect();
        assert_eq!(documented, described);
        assert_eq!(described.len(), ALL.len(), "each name described once");
    }

    #[test]
    fn names_follow_the_prometheus_conventions() {
        for m in ALL {
            assert!(m.name.starts_with("onefill_"), "{}", m.name);
            assert!(
                m.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                m.name
            );
            match m.kind {
                Kind::Counter => assert!(m.name.ends_with("_total"), "{}", m.name),
                _ => assert!(!m.name.ends_with("_total"), "{}", m.name),
            }
            if m.unit == Unit::Seconds {
                assert!(m.name.ends_with("_seconds"), "{}", m.name);
            }
        }
    }
}
