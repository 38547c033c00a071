//! Why a cron expression or timezone was refused.
//!
//! Every message is lower case and names the part of the input at fault, so
//! the server can hand it to the caller unchanged as an `INVALID_ARGUMENT`
//! message.

use std::fmt;

/// A refused schedule: the expression or the timezone is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    /// The expression was empty or only whitespace.
    #[error("empty cron expression")]
    Empty,
    /// The expression had neither 5 nor 6 whitespace-separated fields.
    #[error(
        "expected 5 fields (min hour dom month dow) or 6 (sec min hour dom month dow), found {found}"
    )]
    FieldCount {
        /// How many fields the expression had.
        found: usize,
    },
    /// One field of the expression could not be read.
    #[error("{field} field \"{text}\": {problem}")]
    Field {
        /// Which field.
        field: FieldName,
        /// The field as written.
        text: String,
        /// What is wrong with it.
        problem: FieldProblem,
    },
    /// An `@name` macro that does not exist.
    #[error(
        "unknown macro \"{name}\" (expected @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly or @every)"
    )]
    UnknownMacro {
        /// The macro as written.
        name: String,
    },
    /// A macro other than `@every` followed by more text.
    #[error("macro \"{name}\" takes no arguments")]
    MacroArguments {
        /// The macro as written.
        name: String,
    },
    /// The duration of an `@every` macro could not be accepted.
    #[error("@every duration \"{text}\": {problem}")]
    Every {
        /// The duration as written (empty when missing).
        text: String,
        /// What is wrong with it.
        problem: EveryProblem,
    },
    /// The timezone is not an IANA name known to the compiled-in database.
    #[error("unknown timezone \"{name}\"")]
    UnknownTimezone {
        /// The timezone as given.
        name: String,
    },
}

/// The fields of a cron expression, named as they appear in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldName {
    /// Seconds, only in 6-field expressions.
    Second,
    /// Minutes.
    Minute,
    /// Hours.
    Hour,
    /// Day of month.
    DayOfMonth,
    /// Month.
    Month,
    /// Day of week.
    DayOfWeek,
}

impl fmt::Display for FieldName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FieldName::Second => "second",
            FieldName::Minute => "minute",
            FieldName::Hour => "hour",
            FieldName::DayOfMonth => "day-of-month",
            FieldName::Month => "month",
            FieldName::DayOfWeek => "day-of-week",
        })
    }
}

/// What is wrong with one field of a cron expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldProblem {
    /// A list item between commas was empty (`1,,2`).
    #[error("empty list item")]
    EmptyItem,
    /// A value that is neither a number nor a known name.
    #[error("\"{value}\" is not a number or a known name")]
    NotAValue {
        /// The value as written.
        value: String,
    },
    /// A number outside the field's range.
    #[error("value {value} is out of range {min}-{max}")]
    OutOfRange {
        /// The value as written, as a number.
        value: u64,
        /// Smallest value the field accepts.
        min: u32,
        /// Largest value the field accepts.
        max: u32,
    },
    /// A range whose start lies after its end (`10-5`); ranges do not wrap.
    #[error("range {start}-{end} runs backwards")]
    BackwardsRange {
        /// Start of the range.
        start: u32,
        /// End of the range.
        end: u32,
    },
    /// A step that is not a positive number (`*/0`, `*/x`).
    #[error("step \"{step}\" is not a positive number")]
    BadStep {
        /// The step as written.
        step: String,
    },
    /// More than one `/` in one item.
    #[error("more than one \"/\" in \"{item}\"")]
    DoubleStep {
        /// The list item as written.
        item: String,
    },
    /// `?` outside the two day fields.
    #[error("\"?\" is only allowed in the day-of-month and day-of-week fields")]
    QuestionMark,
}

/// What is wrong with the duration of an `@every` macro.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EveryProblem {
    /// `@every` with nothing after it.
    #[error("missing duration")]
    Missing,
    /// Not a sequence of number-unit pairs.
    #[error("expected number-unit pairs such as 30s, 5m or 1h30m (units d, h, m, s)")]
    Malformed,
    /// Shorter than one second.
    #[error("shorter than the 1s minimum")]
    TooShort,
    /// Longer than 31 days.
    #[error("longer than the 31d maximum")]
    TooLong,
}
