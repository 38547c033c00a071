//! The `@every DURATION` macro: a fixed period, aligned to the Unix epoch.
//!
//! Ticks fall on whole multiples of the period since 1970-01-01T00:00:00Z, so
//! every replica and every leader computes the same ticks without knowing
//! when the schedule was created, and the timezone plays no part.

use super::error::{CronError, EveryProblem};

/// The shortest accepted period: ticks are whole seconds.
pub const MIN_PERIOD_S: u64 = 1;
/// The longest accepted period, 31 days: longer periods belong in a calendar
/// expression, where the reader can see when they fire.
pub const MAX_PERIOD_S: u64 = 31 * 86_400;

/// Reads a duration such as `30s`, `5m`, `1h30m` or `2d` into whole seconds.
///
/// Units are `d`, `h`, `m` and `s`; each pair is a decimal number followed by
/// a unit, and pairs add up. Sub-second units are refused because ticks are
/// whole seconds.
pub(super) fn parse_period_s(text: &str) -> Result<u64, CronError> {
    let refuse = |problem| CronError::Every { text: text.to_owned(), problem };
    if text.is_empty() {
        return Err(refuse(EveryProblem::Missing));
    }
    let mut total_s: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(refuse(EveryProblem::Malformed));
        }
        let (number, after_number) = rest.split_at(digits);
        let unit_len = after_number.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after_unit) = after_number.split_at(unit_len);
        let unit_s: u64 = match unit {
            "d" => 86_400,
            "h" => 3_600,
            "m" => 60,
            "s" => 1,
            _ => return Err(refuse(EveryProblem::Malformed)),
        };
        // A number too large for u64 is certainly longer than the maximum.
        let value: u64 = number.parse().map_err(|_| refuse(EveryProblem::TooLong))?;
        total_s = value
            .checked_mul(unit_s)
            .and_then(|part_s| total_s.checked_add(part_s))
            .ok_or_else(|| refuse(EveryProblem::TooLong))?;
        rest = after_unit;
    }
    if total_s < MIN_PERIOD_S {
        return Err(refuse(EveryProblem::TooShort));
    }
    if total_s > MAX_PERIOD_S {
        return Err(refuse(EveryProblem::TooLong));
    }
    Ok(total_s)
}

/// The first multiple of `period_s` at or after `from_s`.
pub(super) fn next_multiple_s(from_s: i64, period_s: u64) -> Option<i64> {
    let period_s = i64::try_from(period_s).ok()?;
    let whole_periods = from_s.checked_add(period_s - 1)?.div_euclid(period_s);
    whole_periods.checked_mul(period_s)
}
