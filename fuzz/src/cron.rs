//! The `cron` target: cron expressions, timezones and instants through
//! `cron::parse`, `CronSchedule::next_after`, `ticks_between` and the
//! leader's `plan_ticks`.
//!
//! Goal: parsing any text never panics and agrees with schedule
//! validation; a parsed schedule's ticks are whole seconds inside their
//! range (and before year 10000), strictly ascending, at most the limit,
//! and each is the `next_after` of the one before; a tick plan never names
//! a bucket at or below the fire mark or past now, and lists its buckets
//! in ascending order.
//!
//! Method: expressions are either arbitrary text or assembled field by
//! field from cron's own vocabulary (`*`, numbers, ranges, steps, names,
//! macros), so most inputs parse and the tick walk, not the parser, gets
//! the fuzzer's attention. Timezones are any IANA name of the compiled-in
//! database, or arbitrary text.

use arbitrary::{Arbitrary, Unstructured};
use leasehold_core::Limits;
use leasehold_core::cron::{self, MAX_TICK_S};
use leasehold_core::schedule::{self, Catchup, Schedule, ScheduleSpec, TickPlan};
use leasehold_core::validate::schedule_spec;

use crate::pick::Number;

/// Most ticks one input asks `ticks_between` for.
const MAX_LIMIT: usize = 24;

/// Runs one input; panics on a violation.
pub fn check(data: &[u8]) {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let expression = input.expression.text();
    let timezone = input.zone.text();
    let parsed = cron::parse(&expression, &timezone);
    let spec = ScheduleSpec {
        name: "s".into(),
        cron: expression.clone(),
        timezone: timezone.clone(),
        ..ScheduleSpec::default()
    };
    let validated = schedule_spec(&spec, &Limits::default());
    match (&parsed, &validated) {
        (Ok(_), Ok(())) => {}
        (Err(error), Err(refusal)) => {
            assert!(matches!(refusal.field.as_str(), "cron" | "timezone"), "{refusal}");
            assert_eq!(refusal.problem, error.to_string());
        }
        _ => panic!("parse and validation disagree on {expression:?} in {timezone:?}"),
    }
    let Ok(schedule) = parsed else {
        return;
    };
    let context = format!("{expression:?} in {timezone:?}");
    let after_ms = input.after.value();
    let until_ms = after_ms.saturating_add(u64::from(input.span_s).saturating_mul(1_000));
    let limit = usize::from(input.limit) % (MAX_LIMIT + 1);
    let next = schedule.next_after(after_ms);
    if let Some(tick_ms) = next {
        assert!(tick_ms > after_ms, "{context}: next tick {tick_ms} not after {after_ms}");
        assert_whole_tick(tick_ms, &context);
    }
    let ticks = schedule.ticks_between(after_ms, until_ms, limit);
    assert!(ticks.len() <= limit, "{context}: {} ticks, limit {limit}", ticks.len());
    let mut previous_ms = after_ms;
    for (index, &tick_ms) in ticks.iter().enumerate() {
        assert!(tick_ms > previous_ms, "{context}: tick {index} not ascending");
        assert!(tick_ms <= until_ms, "{context}: tick {tick_ms} after {until_ms}");
        assert_whole_tick(tick_ms, &context);
        let expected = if index == 0 { next } else { schedule.next_after(previous_ms) };
        assert_eq!(Some(tick_ms), expected, "{context}: tick {index} is not the next one");
        previous_ms = tick_ms;
    }
    // Fewer ticks than asked: none is left in the range.
    if ticks.len() < limit
        && let Some(after_last) = schedule.next_after(previous_ms)
    {
        assert!(after_last > until_ms, "{context}: tick {after_last} missed before {until_ms}");
    }
    if let Some(plan) = &input.plan {
        check_plan(plan, &spec, &schedule, &context);
    }
}

/// Checks a tick plan for a schedule with the input's mark and clock.
fn check_plan(input: &PlanInput, spec: &ScheduleSpec, cron: &cron::CronSchedule, context: &str) {
    let spec = ScheduleSpec {
        catchup: match input.catchup % 3 {
            0 => Catchup::Coalesce,
            1 => Catchup::Skip,
            _ => Catchup::All,
        },
        catchup_window_ms: input.catchup_window_ms.value(),
        catchup_max: input.catchup_max.value32(),
        paused: input.paused,
        ..spec.clone()
    };
    let mut schedule = Schedule::new(spec, input.created_at_ms.value());
    schedule.last_fired_bucket = input.mark.value();
    let now_ms = input.now_ms.value();
    let plan = schedule::plan_ticks(&schedule, cron, now_ms, input.tolerance_ms.value());
    let mark = schedule.last_fired_bucket;
    let mut previous = mark;
    for step in &plan {
        let bucket = match *step {
            TickPlan::Fire(bucket) => bucket,
            TickPlan::Skip { bucket, ticks, .. } => {
                assert!(ticks >= 1, "{context}: {step:?} skips no tick");
                bucket
            }
        };
        assert!(
            bucket > previous || (previous == 0 && bucket == 0 && mark == 0),
            "{context}: {step:?} not after {previous} (mark {mark}) in {plan:?}"
        );
        assert!(bucket <= cron::bucket_of(now_ms), "{context}: {step:?} after now {now_ms}");
        previous = bucket;
    }
}

/// A tick is a whole second no later than the last one allowed.
fn assert_whole_tick(tick_ms: u64, context: &str) {
    assert_eq!(tick_ms % 1_000, 0, "{context}: tick {tick_ms} is not a whole second");
    let last_ms = MAX_TICK_S.unsigned_abs() * 1_000;
    assert!(tick_ms <= last_ms, "{context}: tick {tick_ms} past year 9999");
}

/// One input: an expression, a zone, a range and perhaps a plan.
#[derive(Arbitrary, Debug)]
struct Input {
    expression: Expression,
    zone: Zone,
    after: Instant,
    span_s: u32,
    limit: u8,
    plan: Option<PlanInput>,
}

/// The schedule and clock a plan is made for.
#[derive(Arbitrary, Debug)]
struct PlanInput {
    mark: Number,
    created_at_ms: Number,
    now_ms: Number,
    tolerance_ms: Number,
    catchup: u8,
    catchup_window_ms: Number,
    catchup_max: Number,
    paused: bool,
}

/// An instant, usually in the years cron schedules live in.
#[derive(Arbitrary, Debug)]
enum Instant {
    /// Seconds after 2026-01-01 (about 136 years' worth).
    Recent(u32),
    /// Anything, up to `u64::MAX` milliseconds.
    Any(Number),
}

impl Instant {
    fn value(&self) -> u64 {
        match self {
            Instant::Recent(s) => 1_767_225_600_000 + u64::from(*s) * 1_000,
            Instant::Any(number) => number.value(),
        }
    }
}

/// A timezone: a name from the database, or any text.
#[derive(Arbitrary, Debug)]
enum Zone {
    /// UTC, written as nothing.
    Empty,
    /// The database's zone at this index (modulo its size).
    Known(u16),
    /// Any text.
    Raw(String),
}

impl Zone {
    fn text(&self) -> String {
        match self {
            Zone::Empty => String::new(),
            Zone::Known(index) => {
                let zones = chrono_tz::TZ_VARIANTS;
                zones[usize::from(*index) % zones.len()].name().to_owned()
            }
            Zone::Raw(raw) => raw.clone(),
        }
    }
}

/// An expression: assembled from cron's vocabulary, a macro, or any text.
#[derive(Arbitrary, Debug)]
enum Expression {
    /// Fields joined by spaces (5 or 6 make a calendar expression).
    Fields(Vec<Field>),
    /// A macro, with optional trailing text.
    Macro(u8, Option<String>),
    /// `@every` and a duration built from parts.
    Every(Vec<(u16, u8)>),
    /// Any text.
    Raw(String),
}

const MACROS: [&str; 9] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
    "@every",
    "@HOURLY",
];
const UNITS: [&str; 5] = ["s", "m", "h", "d", "ms"];

impl Expression {
    fn text(&self) -> String {
        match self {
            Expression::Fields(fields) => {
                fields.iter().map(Field::text).collect::<Vec<_>>().join(" ")
            }
            Expression::Macro(index, tail) => {
                let name = MACROS[usize::from(*index) % MACROS.len()];
                match tail {
                    Some(tail) => format!("{name} {tail}"),
                    None => name.to_owned(),
                }
            }
            Expression::Every(parts) => {
                let duration: String = parts
                    .iter()
                    .map(|(value, unit)| format!("{value}{}", UNITS[usize::from(*unit) % 5]))
                    .collect();
                format!("@every {duration}")
            }
            Expression::Raw(raw) => raw.clone(),
        }
    }
}

/// One field: a comma list of items.
#[derive(Arbitrary, Debug)]
struct Field(Vec<Item>);

impl Field {
    fn text(&self) -> String {
        self.0.iter().map(Item::text).collect::<Vec<_>>().join(",")
    }
}

/// One item of a field, with an optional step.
#[derive(Arbitrary, Debug)]
struct Item {
    range: Range,
    step: Option<u8>,
}

/// The range part of an item.
#[derive(Arbitrary, Debug)]
enum Range {
    Star,
    Question,
    Value(Value),
    Span(Value, Value),
}

/// A value: a number or a month or day name.
#[derive(Arbitrary, Debug)]
enum Value {
    Number(u8),
    Name(u8),
}

const NAMES: [&str; 19] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC", "SUN",
    "MON", "TUE", "WED", "THU", "FRI", "sat",
];

impl Value {
    fn text(&self) -> String {
        match self {
            Value::Number(number) => number.to_string(),
            Value::Name(index) => NAMES[usize::from(*index) % NAMES.len()].to_owned(),
        }
    }
}

impl Item {
    fn text(&self) -> String {
        let range = match &self.range {
            Range::Star => "*".to_owned(),
            Range::Question => "?".to_owned(),
            Range::Value(value) => value.text(),
            Range::Span(start, end) => format!("{}-{}", start.text(), end.text()),
        };
        match self.step {
            Some(step) => format!("{range}/{step}"),
            None => range,
        }
    }
}
