//! The outcome codes of a worker's call log: a call is logged as a number,
//! its index in [`OUTCOME_NAMES`], so a long log stays small; the worker
//! writes them and the fault analysis reads them.

/// Outcome codes of the call log (the index is the code).
pub const OUTCOME_NAMES: [&str; 9] = [
    "error",
    "hit",
    "stale",
    "loaded",
    "waited",
    "degraded",
    "naive_hit",
    "naive_load",
    "other",
];
/// Code of a failed call.
pub const ERROR: u64 = 0;
/// Code of a stale answer.
pub const STALE: u64 = 2;
/// Code of a degraded answer.
pub const DEGRADED: u64 = 5;

/// The name of a onefill outcome (`other` for one added later).
pub fn outcome_name(outcome: onefill::Outcome) -> &'static str {
    match outcome {
        onefill::Outcome::Hit => "hit",
        onefill::Outcome::Stale => "stale",
        onefill::Outcome::Loaded => "loaded",
        onefill::Outcome::Waited => "waited",
        onefill::Outcome::Degraded => "degraded",
        _ => "other",
    }
}

/// The call log's code of an answer's outcome name (`other` if unknown).
pub fn outcome_code(name: &str) -> u64 {
    OUTCOME_NAMES
        .iter()
        .position(|n| *n == name)
        .unwrap_or(OUTCOME_NAMES.len() - 1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_codes_round_trip() {
        for (code, name) in OUTCOME_NAMES.iter().enumerate() {
            assert_eq!(outcome_code(name), code as u64);
        }
        assert_eq!(outcome_code("nonsense"), 8);
    }
}
