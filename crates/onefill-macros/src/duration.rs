//! Durations written as string literals (`"250ms"`, `"30s"`, `"5m"`,
//! `"1h"`, `"1d"`), read when the function is compiled: a typo is a compile
//! error at the literal, not a cache that fails at its first call.

/// The literal's length in milliseconds, or why it is not a duration.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let digits_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: String = number.chars().filter(|c| *c != '_').collect();
    if number.is_empty() {
        return Err(format!("`{text}` does not start with a number"));
    }
    let per_unit: u64 = match unit.trim_start() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => return Err(format!("`{text}` has no unit")),
        other => return Err(format!("`{other}` is not a unit")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(per_unit))
        .ok_or_else(|| format!("`{text}` is too long a duration"))
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn every_unit_and_separators() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("2d"), Ok(172_800_000));
        assert_eq!(parse_millis("1_500ms"), Ok(1_500));
        assert_eq!(parse_millis("10 s"), Ok(10_000));
        assert_eq!(parse_millis("0s"), Ok(0));
    }

    #[test]
    fn what_is_not_a_duration() {
        for bad in [
            "",
            "s",
            "5",
            "5 min",
            "1.5s",
            "5sec",
            "-1s",
            "99999999999999999999d",
        ] {
            assert!(parse_millis(bad).is_err(), "{bad:?}");
        }
    }
}
