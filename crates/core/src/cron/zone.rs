//! Offsets of an IANA zone at instants, and the instants where they change.
//!
//! chrono-tz answers "what is the offset at instant t" but does not list its
//! transitions, so they are found by probing: the offset is sampled every
//! [`PROBE_STEP_S`] and a change is pinned to the second by bisection. That
//! finds every transition as long as no two transitions lie within one probe
//! step of each other. In the compiled-in database (tzdb 2025b) the closest
//! pair of offset changes after 1970 in any zone is 7 days apart (Brazil in
//! 2000, Gaza and Hebron in later years), so a one-day step leaves a margin of
//! seven. (Measured by reading the transition tables that chrono-tz compiles
//! in; a test pins the database version so an upgrade prompts a re-check.)

use chrono::{LocalResult, Offset, TimeZone};
use chrono_tz::Tz;

use super::calendar::wall_from_s;

/// How far apart offset probes are; see the module docs.
pub(super) const PROBE_STEP_S: i64 = 86_400;

/// The zone's offset from UTC at `instant_s`, in seconds (wall = instant +
/// offset).
pub(super) fn offset_s(zone: Tz, instant_s: i64) -> i64 {
    let utc = chrono::DateTime::from_timestamp(instant_s, 0)
        .expect("instants are kept within years 1969..=10000, inside chrono's range");
    i64::from(zone.offset_from_utc_datetime(&utc.naive_utc()).fix().local_minus_utc())
}

/// The first instant in `(from_s, to_s]` whose offset differs from the
/// offset at `from_s`, or None when the offset holds through `to_s`.
///
/// Work: one probe per [`PROBE_STEP_S`] of the range plus a bisection.
pub(super) fn first_offset_change(zone: Tz, from_s: i64, to_s: i64) -> Option<i64> {
    let offset = offset_s(zone, from_s);
    let mut low_s = from_s;
    while low_s < to_s {
        let high_s = to_s.min(low_s.saturating_add(PROBE_STEP_S));
        if offset_s(zone, high_s) != offset {
            // Invariant: offset at low_s is `offset`, at high_s it is not.
            let mut high_s = high_s;
            while high_s - low_s > 1 {
                let middle_s = low_s + (high_s - low_s) / 2;
                if offset_s(zone, middle_s) == offset {
                    low_s = middle_s;
                } else {
                    high_s = middle_s;
                }
            }
            return Some(high_s);
        }
        low_s = high_s;
    }
    None
}

/// If `instant_s` lies in the second pass of a fall-back fold (its wall time
/// was already shown at an earlier instant, in the preceding offset period),
/// the first instant after that second pass; otherwise None.
pub(super) fn repeat_end(zone: Tz, instant_s: i64) -> Option<i64> {
    let wall = wall_from_s(instant_s + offset_s(zone, instant_s))?;
    let LocalResult::Ambiguous(one, other) = zone.from_local_datetime(&wall) else {
        return None;
    };
    let first_s = one.timestamp().min(other.timestamp());
    let second_s = one.timestamp().max(other.timestamp());
    if second_s != instant_s {
        return None;
    }
    // The fold repeats `second_s - first_s` seconds of wall time, starting at
    // the fall-back transition, which lies in (first_s, second_s].
    let transition_s = first_offset_change(zone, first_s, second_s)?;
    Some(transition_s + (second_s - first_s))
}
