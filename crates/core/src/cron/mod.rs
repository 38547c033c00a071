//! Cron math: which instants a schedule ticks at, in its own timezone.
//!
//! The leader's ticker asks a [`CronSchedule`] for the ticks due since it
//! last looked ([`CronSchedule::ticks_between`]) and proposes `Fire` or
//! `Skip` for each tick's *bucket*, the tick's instant in Unix seconds
//! ([`bucket_of`], [`tick_ms`]). The state machine only enforces
//! `bucket > last_fired_bucket`; this module decides what the buckets are,
//! so every leader, before and after a failover, derives the same ones.
//! Everything here is pure: instants come in as arguments, and the timezone
//! database is compiled in (chrono-tz, tzdb 2025b).
//!
//! ```
//! use leasehold_core::cron;
//!
//! // Europe/Berlin springs forward on 2025-03-30: 02:00 CET becomes 03:00
//! // CEST at 01:00 UTC, so 02:30 never shows on the wall.
//! let schedule = cron::parse("30 2 * * *", "Europe/Berlin")?;
//! let midnight_utc_ms = 1_743_292_800_000; // 2025-03-30T00:00:00Z
//! let tick_ms = schedule.next_after(midnight_utc_ms);
//! assert_eq!(tick_ms, Some(1_743_296_400_000)); // 01:00Z = 03:00 CEST
//! assert_eq!(cron::bucket_of(1_743_296_400_000), 1_743_296_400);
//! # Ok::<(), cron::CronError>(())
//! ```
//!
//! # Expressions
//!
//! - 5 fields `min hour dom month dow` (second 0), or 6 fields
//!   `sec min hour dom month dow`.
//! - Each field is a comma list of `*`, `N`, `A-B`, each optionally with a
//!   step: `*/5`, `1-10/2`, `5/15` (= `5-59/15`). Ranges do not wrap.
//! - Month names `JAN`..`DEC` and day names `SUN`..`SAT`, any case. Day of
//!   week is 0-7 with both 0 and 7 meaning Sunday. `?` means `*` in the two
//!   day fields.
//! - Day of month and day of week follow Vixie cron: a day field written
//!   starting with `*` or `?` is unrestricted; when both are restricted a
//!   day matches if *either* matches, otherwise both must.
//! - Macros: `@yearly`/`@annually` = `0 0 1 1 *`, `@monthly` = `0 0 1 * *`,
//!   `@weekly` = `0 0 * * 0`, `@daily`/`@midnight` = `0 0 * * *`, `@hourly` =
//!   `0 * * * *`.
//! - `@every DURATION` (`30s`, `5m`, `1h30m`, `2d`; at least 1 s, at most 31
//!   days): ticks at every multiple of the duration since the Unix epoch,
//!   whatever the timezone. It has no wall-clock meaning, so DST does not
//!   touch it.
//! - The timezone is an IANA name, `""` meaning `UTC`.
//!
//! # Ticks and the DST rule
//!
//! A schedule denotes a set of *ticks*: whole-second instants. Write
//! `wall(t)` for the local date and time in the schedule's zone at instant
//! `t`; the fields are matched against wall times. Which instants tick
//! depends on whether the hour field allows all 24 hours.
//!
//! **Floating schedules** — the hour field allows every hour (`*`, `*/1`,
//! `0-23`; e.g. `0 * * * *`, `*/15 * * * *`, `@hourly`, `* * * * * *`):
//! `t` is a tick exactly when `wall(t)` matches. They follow real time. A
//! wall time skipped by spring-forward never shows, so it does not fire; a
//! wall time repeated by fall-back shows at two instants, and both fire
//! (02:00 CEST and 02:00 CET are different real hours). An every-second
//! schedule fires once for every second of real time, none missing and
//! none twice.
//!
//! **Fixed-hour schedules** — the hour field names particular hours (e.g.
//! `0 2 * * *`, `30 1,13 * * *`, `0 */6 * * *`, `@daily`, `@weekly`,
//! `@monthly`, `@yearly`): `t` is a tick when either
//!
//! 1. `wall(t)` matches and `t` is the *first* instant showing that wall
//!    time: the instants of a fall-back's second pass, whose wall times
//!    repeat those of the offset period just before, never tick; or
//! 2. `t` is the instant a spring-forward change takes effect, and some wall
//!    time in the skipped stretch `[wall(t - 1s) + 1s, wall(t))` matches.
//!    The skipped times fire once, at the first valid instant after the gap
//!    (`30 2 * * *` in Europe/Berlin on 2025-03-30 ticks at 03:00 CEST =
//!    01:00 UTC). Ticks are a set, so however many skipped wall times match
//!    (`*/15 2 * * *`), and even if `wall(t)` matches too (`0 2,3 * * *`),
//!    that instant ticks once.
//!
//! So for a fixed-hour schedule every matching wall time is covered by
//! exactly one tick — its own instant, the first of its two instants, or the
//! end of the gap that swallowed it — and no wall time fires twice, while a
//! floating schedule fires at every real instant that matches.
//!
//! # Limits
//!
//! - Ticks lie in 1970..=9999 ([`MAX_TICK_S`]); searches look at most 401
//!   years ahead (the Gregorian calendar repeats every 400), so an
//!   impossible date such as `0 0 30 2 *` yields None.
//! - The compiled-in tz database lists offset changes up to 2099; after its
//!   last change a zone keeps its last offset.
//! - Offset changes are located by sampling the offset once a day; the
//!   database has no two changes in one zone closer than 7 days since 1970
//!   (see `zone.rs`).

mod calendar;
mod error;
mod every;
mod expression;
mod zone;

#[cfg(test)]
mod tests;

pub use error::{CronError, EveryProblem, FieldName, FieldProblem};
pub use every::{MAX_PERIOD_S, MIN_PERIOD_S};
pub use expression::{CronSchedule, MAX_TICK_S, parse};

/// The bucket of a tick: its instant in whole Unix seconds. `Fire` and
/// `Skip` carry buckets, and idempotency keys are `cron:{name}:{bucket}`.
pub fn bucket_of(tick_ms: u64) -> u64 {
    tick_ms / 1000
}

/// The tick instant of a bucket, in Unix milliseconds (the inverse of
/// [`bucket_of`] for whole-second ticks; saturates far beyond any tick).
pub fn tick_ms(bucket: u64) -> u64 {
    bucket.saturating_mul(1000)
}
