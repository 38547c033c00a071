//! [`CronSchedule`]: a parsed expression bound to a timezone, and the walk
//! that turns matching wall times into tick instants under the DST rule of
//! the module docs.

use chrono_tz::Tz;

use super::calendar::Calendar;
use super::error::{CronError, EveryProblem};
use super::every::{next_multiple_s, parse_period_s};
use super::zone::{first_offset_change, offset_s, repeat_end};

/// The last instant a tick may fall on: 9999-12-31T23:59:59Z. Beyond it
/// [`CronSchedule::next_after`] answers None.
pub const MAX_TICK_S: i64 = 253_402_300_799;

/// How far [`CronSchedule::next_after`] looks: 401 years. The Gregorian
/// calendar repeats every 400 years, so a schedule with no tick in that span
/// has none at all.
const SEARCH_HORIZON_S: i64 = 146_463 * 86_400;

/// A bound on the steps of one search through offset periods. Each step
/// either returns or moves past one offset change or one repeated stretch,
/// and a zone has at most a few of those per year (none after 2099, where
/// the compiled-in database ends), so this is never reached in practice.
const MAX_WALK_STEPS: usize = 4_096;

/// A cron schedule bound to a timezone: the set of its tick instants.
///
/// Build one with [`parse`](super::parse). Two schedules are equal when they
/// denote the same ticks by the same rule (the text they were written in may
/// differ: `*/15` and `0,15,30,45` are equal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CronSchedule {
    rule: Rule,
    zone: Tz,
}

/// What decides the ticks.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    /// A 5- or 6-field expression, or a macro that stands for one.
    Calendar(Calendar),
    /// `@every`: multiples of the period since the Unix epoch.
    Every { period_s: u64 },
}

/// Parses a cron expression and an IANA timezone name (`""` means UTC).
///
/// Accepts 5 fields (`min hour dom month dow`), 6 fields with seconds first
/// (`sec min hour dom month dow`), the macros `@yearly`, `@annually`,
/// `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`, and
/// `@every DURATION` (`30s`, `5m`, `1h30m`, `2d`; 1 s to 31 days).
pub fn parse(expression: &str, timezone: &str) -> Result<CronSchedule, CronError> {
    let rule = parse_rule(expression)?;
    let zone = if timezone.is_empty() {
        Tz::UTC
    } else {
        timezone
            .parse::<Tz>()
            .map_err(|_| CronError::UnknownTimezone { name: timezone.to_owned() })?
    };
    Ok(CronSchedule { rule, zone })
}

fn parse_rule(expression: &str) -> Result<Rule, CronError> {
    let words: Vec<&str> = expression.split_whitespace().collect();
    let Some(first) = words.first() else {
        return Err(CronError::Empty);
    };
    if !first.starts_with('@') {
        return Calendar::parse(&words).map(Rule::Calendar);
    }
    let name = first.to_ascii_lowercase();
    let arguments = &words[1..];
    if name == "@every" {
        return match arguments {
            [] => Err(CronError::Every { text: String::new(), problem: EveryProblem::Missing }),
            [duration] => parse_period_s(duration).map(|period_s| Rule::Every { period_s }),
            _ => Err(CronError::Every {
                text: arguments.join(" "),
                problem: EveryProblem::Malformed,
            }),
        };
    }
    let standing_for = match name.as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => {
            return Err(CronError::UnknownMacro { name: (*first).to_owned() });
        }
    };
    if !arguments.is_empty() {
        return Err(CronError::MacroArguments { name: (*first).to_owned() });
    }
    let fields: Vec<&str> = standing_for.split_whitespace().collect();
    Calendar::parse(&fields).map(Rule::Calendar)
}

impl CronSchedule {
    /// Whether any date matches: false for a day of the month that the
    /// months named never have (`0 0 30 2 *`, `0 0 31 4,6 *`), which would
    /// never tick.
    pub fn matches_some_date(&self) -> bool {
        match &self.rule {
            Rule::Calendar(calendar) => calendar.can_match(),
            Rule::Every { .. } => true,
        }
    }

    /// The IANA name of the schedule's timezone (`"UTC"` when none was given).
    pub fn timezone(&self) -> &'static str {
        self.zone.name()
    }

    /// The first tick strictly after `after_ms` (Unix milliseconds), as Unix
    /// milliseconds (always a whole second), or None when there is none:
    /// an impossible date such as `0 0 30 2 *`, or nothing before
    /// [`MAX_TICK_S`].
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        let from_s = first_second_after(after_ms)?;
        let until_s = from_s.saturating_add(SEARCH_HORIZON_S).min(MAX_TICK_S);
        self.next_tick_s(from_s, until_s).map(ms_of_second)
    }

    /// The ticks in `(after_ms, until_ms]`, ascending, at most `limit` of
    /// them. Work is bounded by `limit` and by the length of the range.
    pub fn ticks_between(&self, after_ms: u64, until_ms: u64, limit: usize) -> Vec<u64> {
        let mut ticks = Vec::new();
        self.each_tick_between(after_ms, until_ms, limit, |tick_ms| ticks.push(tick_ms));
        ticks
    }

    /// How many ticks [`Self::ticks_between`] would give, without keeping
    /// them.
    pub fn count_ticks_between(&self, after_ms: u64, until_ms: u64, limit: usize) -> usize {
        let mut count = 0;
        self.each_tick_between(after_ms, until_ms, limit, |_| count += 1);
        count
    }

    fn each_tick_between(
        &self,
        after_ms: u64,
        until_ms: u64,
        limit: usize,
        mut tick: impl FnMut(u64),
    ) {
        if limit == 0 || until_ms <= after_ms {
            return;
        }
        let Some(mut from_s) = first_second_after(after_ms) else {
            return;
        };
        let until_s = i64::try_from(until_ms / 1000).unwrap_or(i64::MAX).min(MAX_TICK_S);
        for _ in 0..limit {
            let Some(tick_s) = self.next_tick_s(from_s, until_s) else {
                break;
            };
            tick(ms_of_second(tick_s));
            from_s = tick_s + 1;
        }
    }

    /// The calendar of a calendar schedule, for the tests' brute-force oracle.
    #[cfg(test)]
    pub(super) fn calendar(&self) -> Option<&Calendar> {
        match &self.rule {
            Rule::Calendar(calendar) => Some(calendar),
            Rule::Every { .. } => None,
        }
    }

    /// The zone, for the tests' brute-force oracle.
    #[cfg(test)]
    pub(super) fn zone(&self) -> Tz {
        self.zone
    }

    /// The first tick in `[from_s, until_s]`, in Unix seconds.
    fn next_tick_s(&self, from_s: i64, until_s: i64) -> Option<i64> {
        if from_s > until_s {
            return None;
        }
        match &self.rule {
            Rule::Every { period_s } => {
                next_multiple_s(from_s, *period_s).filter(|tick_s| *tick_s <= until_s)
            }
            Rule::Calendar(calendar) => next_calendar_tick_s(calendar, self.zone, from_s, until_s),
        }
    }
}

/// The first tick of a calendar schedule in `[from_s, until_s]`.
///
/// The walk moves through the zone's offset periods. Within one period wall
/// time is instant plus a constant offset, so the first matching wall time
/// at or after the current one gives the first matching instant — unless the
/// offset changes before it, in which case the walk restarts at the change.
/// Fixed-hour schedules (see the module docs) also check each spring-forward
/// change for matches inside the skipped wall times, and step over the
/// second pass of each fall-back fold.
fn next_calendar_tick_s(calendar: &Calendar, zone: Tz, from_s: i64, until_s: i64) -> Option<i64> {
    if !calendar.can_match() {
        return None;
    }
    let fixed_hours = !calendar.allows_every_hour();
    let mut instant_s = from_s;
    for _ in 0..MAX_WALK_STEPS {
        if instant_s > until_s {
            return None;
        }
        let offset = offset_s(zone, instant_s);
        if fixed_hours {
            let previous_offset = offset_s(zone, instant_s - 1);
            // A spring-forward change takes effect at `instant_s`: the wall
            // times [instant + previous offset, instant + offset) never show.
            if previous_offset < offset
                && calendar
                    .next_wall_match(instant_s + previous_offset, instant_s + offset)
                    .is_some()
            {
                return Some(instant_s);
            }
            if let Some(repeat_end_s) = repeat_end(zone, instant_s) {
                instant_s = repeat_end_s;
                continue;
            }
        }
        let wall_s = calendar.next_wall_match(instant_s + offset, until_s + offset + 1);
        let offset_holds_until_s = wall_s.map_or(until_s, |wall_s| wall_s - offset);
        match first_offset_change(zone, instant_s, offset_holds_until_s) {
            None => return wall_s.map(|wall_s| wall_s - offset),
            Some(change_s) => instant_s = change_s,
        }
    }
    debug_assert!(false, "cron walk exceeded {MAX_WALK_STEPS} steps");
    None
}

/// The first whole second strictly after `after_ms`, if not past
/// [`MAX_TICK_S`].
fn first_second_after(after_ms: u64) -> Option<i64> {
    let second = i64::try_from(after_ms / 1000).ok()?.checked_add(1)?;
    (second <= MAX_TICK_S).then_some(second)
}

/// Unix milliseconds of a tick second; ticks are positive and at most
/// [`MAX_TICK_S`], so this neither wraps nor truncates.
fn ms_of_second(tick_s: i64) -> u64 {
    tick_s.unsigned_abs() * 1000
}
