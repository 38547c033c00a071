//! The calendar part of a cron expression: which local wall-clock times match.
//!
//! A [`Calendar`] knows nothing about timezones or instants. It answers two
//! questions about *wall times* (a local date and time of day, encoded as
//! seconds since 1970-01-01T00:00:00 of the local calendar): does this wall
//! time match, and which is the first matching wall time in a range. The
//! timezone walk in `schedule.rs` turns those answers into instants.

use chrono::{Datelike, NaiveDate, NaiveDateTime, Timelike};

use super::error::{CronError, FieldName, FieldProblem};

/// Seconds in a day.
const DAY_S: i64 = 86_400;

/// The parsed fields of a 5- or 6-field expression, one bit per allowed value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Calendar {
    /// Bits 0..=59.
    seconds: u64,
    /// Bits 0..=59.
    minutes: u64,
    /// Bits 0..=23.
    hours: u64,
    /// Bits 1..=31.
    days_of_month: u64,
    /// Bits 1..=12.
    months: u64,
    /// Bits 0..=6, Sunday is 0.
    days_of_week: u64,
    /// Vixie cron's test: a day field is restricted unless it starts with
    /// `*` or `?`; when both are restricted a day matches if either does.
    day_of_month_restricted: bool,
    /// See `day_of_month_restricted`.
    day_of_week_restricted: bool,
}

/// How one field is read: its range and the names it accepts.
struct FieldSpec {
    field: FieldName,
    min: u32,
    max: u32,
    names: &'static [&'static str],
    /// The value of the first name.
    first_name_value: u32,
    question_mark: bool,
}

const SECOND: FieldSpec = FieldSpec {
    field: FieldName::Second,
    min: 0,
    max: 59,
    names: &[],
    first_name_value: 0,
    question_mark: false,
};
const MINUTE: FieldSpec = FieldSpec { field: FieldName::Minute, ..SECOND };
const HOUR: FieldSpec = FieldSpec { field: FieldName::Hour, max: 23, ..SECOND };
const DAY_OF_MONTH: FieldSpec = FieldSpec {
    field: FieldName::DayOfMonth,
    min: 1,
    max: 31,
    names: &[],
    first_name_value: 0,
    question_mark: true,
};
const MONTH: FieldSpec = FieldSpec {
    field: FieldName::Month,
    min: 1,
    max: 12,
    names: &["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
    first_name_value: 1,
    question_mark: false,
};
/// Day of week accepts 0..=7; both 0 and 7 are Sunday.
const DAY_OF_WEEK: FieldSpec = FieldSpec {
    field: FieldName::DayOfWeek,
    min: 0,
    max: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
    first_name_value: 0,
    question_mark: true,
};

impl Calendar {
    /// Reads 5 fields (`min hour dom month dow`, second 0) or 6 fields
    /// (`sec min hour dom month dow`).
    pub(super) fn parse(fields: &[&str]) -> Result<Calendar, CronError> {
        let (second, rest) = match fields.len() {
            5 => ("0", fields),
            6 => (fields[0], &fields[1..]),
            found => return Err(CronError::FieldCount { found }),
        };
        let [minute, hour, day_of_month, month, day_of_week] = rest else {
            return Err(CronError::FieldCount { found: fields.len() });
        };
        let mut days_of_week = parse_field(day_of_week, &DAY_OF_WEEK)?;
        // 7 is another name for Sunday.
        if days_of_week & (1 << 7) != 0 {
            days_of_week = (days_of_week & !(1 << 7)) | 1;
        }
        Ok(Calendar {
            seconds: parse_field(second, &SECOND)?,
            minutes: parse_field(minute, &MINUTE)?,
            hours: parse_field(hour, &HOUR)?,
            days_of_month: parse_field(day_of_month, &DAY_OF_MONTH)?,
            months: parse_field(month, &MONTH)?,
            days_of_week,
            day_of_month_restricted: is_restricted(day_of_month),
            day_of_week_restricted: is_restricted(day_of_week),
        })
    }

    /// True when the hour field allows all 24 hours (`*`, `*/1`, `0-23`).
    /// Such a schedule *floats* with real time across DST transitions; any
    /// other names fixed hours of the day (see the module docs).
    pub(super) fn allows_every_hour(&self) -> bool {
        self.hours == (1 << 24) - 1
    }

    /// Whether some date ever matches. The Gregorian calendar repeats every
    /// 400 years and every valid month/day pair falls on every weekday within
    /// that cycle, so only an impossible month/day pair (`30 2`, `31 4`)
    /// combined with AND semantics can never match.
    pub(super) fn can_match(&self) -> bool {
        if self.day_of_month_restricted && self.day_of_week_restricted {
            // OR semantics: every month contains every weekday.
            return true;
        }
        (1..=12u32).any(|month| {
            self.months & (1 << month) != 0
                && (1..=longest_month_days(month)).any(|day| self.days_of_month & (1 << day) != 0)
        })
    }

    /// Whether the date matches the month and day fields.
    pub(super) fn matches_date(&self, date: NaiveDate) -> bool {
        if self.months & (1 << date.month()) == 0 {
            return false;
        }
        let day_of_month = self.days_of_month & (1 << date.day()) != 0;
        let day_of_week = self.days_of_week & (1 << date.weekday().num_days_from_sunday()) != 0;
        if self.day_of_month_restricted && self.day_of_week_restricted {
            day_of_month || day_of_week
        } else {
            day_of_month && day_of_week
        }
    }

    /// Whether a wall time matches every field.
    #[cfg(test)]
    pub(super) fn matches_wall(&self, wall_s: i64) -> bool {
        let Some(wall) = wall_from_s(wall_s) else {
            return false;
        };
        self.matches_date(wall.date())
            && self.hours & (1 << wall.hour()) != 0
            && self.minutes & (1 << wall.minute()) != 0
            && self.seconds & (1 << wall.second()) != 0
    }

    /// The first matching wall time in `[from_s, until_s)`, if any.
    ///
    /// Work is bounded by the number of days in the range (months that do
    /// not match are skipped whole); callers bound the range.
    pub(super) fn next_wall_match(&self, from_s: i64, until_s: i64) -> Option<i64> {
        if from_s >= until_s {
            return None;
        }
        let start = wall_from_s(from_s)?;
        let mut date = start.date();
        let mut second_of_day = start.num_seconds_from_midnight();
        loop {
            let day_start_s = wall_s_of(date);
            if day_start_s >= until_s {
                return None;
            }
            if self.months & (1 << date.month()) == 0 {
                date = self.first_day_of_next_month(date)?;
                second_of_day = 0;
                continue;
            }
            if self.matches_date(date)
                && let Some(time_s) = self.first_time_at_or_after(second_of_day)
            {
                let wall_s = day_start_s + i64::from(time_s);
                return (wall_s < until_s).then_some(wall_s);
            }
            date = date.succ_opt()?;
            second_of_day = 0;
        }
    }

    /// The first day of the next month in the month field after `date`'s.
    fn first_day_of_next_month(&self, date: NaiveDate) -> Option<NaiveDate> {
        let (mut year, mut month) = (date.year(), date.month());
        // At most 12 steps reach a month in the (non-empty) month field.
        for _ in 0..12 {
            if month == 12 {
                year += 1;
                month = 1;
            } else {
                month += 1;
            }
            if self.months & (1 << month) != 0 {
                return NaiveDate::from_ymd_opt(year, month, 1);
            }
        }
        None
    }

    /// The first matching time of day at or after `from_s` seconds past
    /// midnight, in seconds past midnight.
    fn first_time_at_or_after(&self, from_s: u32) -> Option<u32> {
        let (from_hour, from_minute, from_second) = (from_s / 3600, from_s / 60 % 60, from_s % 60);
        let mut hour = next_bit(self.hours, from_hour)?;
        loop {
            let mut minute =
                next_bit(self.minutes, if hour == from_hour { from_minute } else { 0 });
            while let Some(found_minute) = minute {
                let second_floor =
                    if hour == from_hour && found_minute == from_minute { from_second } else { 0 };
                if let Some(second) = next_bit(self.seconds, second_floor) {
                    return Some(hour * 3600 + found_minute * 60 + second);
                }
                minute = next_bit(self.minutes, found_minute + 1);
            }
            hour = next_bit(self.hours, hour + 1)?;
        }
    }
}

/// The longest a month can be: February counts its leap day.
fn longest_month_days(month: u32) -> u32 {
    match month {
        2 => 29,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The lowest set bit of `mask` at or above `from`.
fn next_bit(mask: u64, from: u32) -> Option<u32> {
    let above = mask.checked_shr(from)?;
    (above != 0).then(|| from + above.trailing_zeros())
}

/// A wall time in seconds since the local 1970-01-01T00:00:00, as a calendar
/// date and time. None only beyond chrono's range (hundreds of millennia).
pub(super) fn wall_from_s(wall_s: i64) -> Option<NaiveDateTime> {
    chrono::DateTime::from_timestamp(wall_s, 0).map(|wall| wall.naive_utc())
}

/// Local midnight of `date` as wall seconds.
fn wall_s_of(date: NaiveDate) -> i64 {
    i64::from(date.num_days_from_ce() - EPOCH_DAYS_FROM_CE) * DAY_S
}

/// `NaiveDate::num_days_from_ce` of 1970-01-01.
const EPOCH_DAYS_FROM_CE: i32 = 719_163;

/// Vixie cron's rule for the day fields: written as `*` or `?` (with or
/// without a step) means unrestricted.
fn is_restricted(text: &str) -> bool {
    !(text.starts_with('*') || text.starts_with('?'))
}

/// Reads one field into a bit set of the values it allows.
fn parse_field(text: &str, spec: &FieldSpec) -> Result<u64, CronError> {
    let refuse = |problem| CronError::Field { field: spec.field, text: text.to_owned(), problem };
    let mut bits = 0u64;
    for item in text.split(',') {
        if item.is_empty() {
            return Err(refuse(FieldProblem::EmptyItem));
        }
        let mut parts = item.split('/');
        let range = parts.next().unwrap_or_default();
        let step = match parts.next() {
            None => 1,
            Some(step) => match step.parse::<u32>() {
                Ok(step) if step > 0 => step,
                _ => {
                    return Err(refuse(FieldProblem::BadStep { step: step.to_owned() }));
                }
            },
        };
        if parts.next().is_some() {
            return Err(refuse(FieldProblem::DoubleStep { item: item.to_owned() }));
        }
        let (start, end) = if range == "*" {
            (spec.min, spec.max)
        } else if range == "?" {
            if !spec.question_mark {
                return Err(refuse(FieldProblem::QuestionMark));
            }
            (spec.min, spec.max)
        } else if let Some((start, end)) = range.split_once('-') {
            if start.is_empty() || end.is_empty() {
                return Err(refuse(FieldProblem::NotAValue { value: range.to_owned() }));
            }
            let start = parse_value(start, spec).map_err(refuse)?;
            let end = parse_value(end, spec).map_err(refuse)?;
            if start > end {
                return Err(refuse(FieldProblem::BackwardsRange { start, end }));
            }
            (start, end)
        } else {
            let value = parse_value(range, spec).map_err(refuse)?;
            // `5/15` means from 5 to the end of the range in steps of 15.
            (value, if item.contains('/') { spec.max } else { value })
        };
        let mut value = start;
        while value <= end {
            bits |= 1 << value;
            let Some(next) = value.checked_add(step) else {
                break;
            };
            value = next;
        }
    }
    Ok(bits)
}

/// Reads a number or a name (case-insensitive) and checks the field's range.
fn parse_value(text: &str, spec: &FieldSpec) -> Result<u32, FieldProblem> {
    if let Some((_, value)) = spec
        .names
        .iter()
        .zip(spec.first_name_value..)
        .find(|(name, _)| name.eq_ignore_ascii_case(text))
    {
        return Ok(value);
    }
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(FieldProblem::NotAValue { value: text.to_owned() });
    }
    // All digits: the only way to fail is overflow, which is out of range.
    let value: u64 = text.parse().unwrap_or(u64::MAX);
    if value < u64::from(spec.min) || value > u64::from(spec.max) {
        return Err(FieldProblem::OutOfRange { value, min: spec.min, max: spec.max });
    }
    u32::try_from(value).map_err(|_| FieldProblem::OutOfRange {
        value,
        min: spec.min,
        max: spec.max,
    })
}
