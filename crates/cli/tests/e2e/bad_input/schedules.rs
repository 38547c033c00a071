//! The Schedules service's bad requests.

use leasehold_proto::v1;
use tonic::Code;

use super::wire::{Call, rpc};
use super::{Case, MAX_PAYLOAD_BYTES, SCHEDULE};

/// The schedule the node is seeded with: paused, and yearly, so it never
/// fires (nor records a skipped tick) while the table runs.
pub fn seeded_spec() -> v1::ScheduleSpec {
    v1::ScheduleSpec {
        name: SCHEDULE.to_string(),
        cron: "0 0 1 1 *".to_string(),
        template: Some(v1::JobTemplate {
            queue: Some("scheduled".to_string()),
            payload: b"x".to_vec(),
            ..Default::default()
        }),
        paused: true,
        ..Default::default()
    }
}

fn put(edit: impl FnOnce(&mut v1::ScheduleSpec)) -> Call {
    let mut spec = seeded_spec();
    spec.name = "fresh".to_string();
    edit(&mut spec);
    rpc::put_schedule(v1::PutScheduleRequest { spec: Some(spec) })
}

fn template(spec: &mut v1::ScheduleSpec) -> &mut v1::JobTemplate {
    spec.template.get_or_insert_with(Default::default)
}

/// A schedule the node does not hold.
const UNKNOWN: &str = "no-such-schedule";

/// The Schedules cases.
pub fn cases() -> Vec<Case> {
    use Code::{InvalidArgument as Invalid, NotFound, ResourceExhausted as TooLarge};
    let bad = Case::malformed;
    let big = Case::too_large;
    let long_name = "s".repeat(65);
    let mut cases = vec![
        // Put
        bad(
            "put: no spec",
            rpc::put_schedule(v1::PutScheduleRequest { spec: None }),
            Invalid,
            "spec",
        ),
        bad("put: empty name", put(|s| s.name.clear()), Invalid, "name"),
        bad("put: name with capitals", put(|s| s.name = "Bad Name".into()), Invalid, "name"),
        bad("put: 65-char name", put(|s| s.name = long_name.clone()), Invalid, "name"),
        bad("put: empty cron", put(|s| s.cron.clear()), Invalid, "cron"),
        bad("put: cron of 7 fields", put(|s| s.cron = "* * * * * * *".into()), Invalid, "cron"),
        bad(
            "put: unknown timezone",
            put(|s| s.timezone = "Mars/Olympus".into()),
            Invalid,
            "timezone",
        ),
        bad("put: unknown overlap 9", put(|s| s.overlap = 9), Invalid, "overlap"),
        bad("put: unknown catchup 9", put(|s| s.catchup = 9), Invalid, "catchup"),
        bad("put: unknown target 9", put(|s| s.target = 9), Invalid, "target"),
        big("put: catchup_max 1,001", put(|s| s.catchup_max = 1_001), Invalid, "catchup_max"),
        bad(
            "put: template queue with capitals",
            put(|s| template(s).queue = Some("Bad Name".into())),
            Invalid,
            "template.queue",
        ),
        big(
            "put: template payload 256 KiB + 1",
            put(|s| template(s).payload = vec![b'x'; MAX_PAYLOAD_BYTES + 1]),
            TooLarge,
            "template.payload",
        ),
        bad(
            "put: a payload with no queue (it would run as a command on exec)",
            put(|s| template(s).queue = None),
            Invalid,
            "template.queue",
        ),
        bad(
            "put: template lease_ttl_ms 10",
            put(|s| template(s).lease_ttl_ms = Some(10)),
            Invalid,
            "template.lease_ttl_ms",
        ),
        bad(
            "put: template max_attempts 0",
            put(|s| template(s).max_attempts = Some(0)),
            Invalid,
            "template.max_attempts",
        ),
        big(
            "put: 33 template tags",
            put(|s| template(s).tags = vec!["t".into(); 33]),
            TooLarge,
            "template.tags",
        ),
        bad(
            "put: empty command",
            put(|s| {
                let t = template(s);
                t.queue = None;
                t.command = Some("  ".into());
            }),
            Invalid,
            "template.command",
        ),
        big(
            "put: command over 64 KiB",
            put(|s| {
                let t = template(s);
                t.queue = None;
                t.command = Some("x".repeat(64 * 1024 + 1));
            }),
            TooLarge,
            "template.command",
        ),
        bad(
            "put: command on a queue that is not a command queue",
            put(|s| template(s).command = Some("true".into())),
            Invalid,
            "template.queue",
        ),
    ];
    // Delete, Get, Pause, Resume, Trigger: the name is required and must be
    // a valid one; a valid name the node does not hold is NOT_FOUND.
    type ByName = fn(String) -> Call;
    let by_name: [(&str, ByName); 5] = [
        ("delete", |name| rpc::delete_schedule(v1::DeleteScheduleRequest { name })),
        ("get", |name| rpc::get_schedule(v1::GetScheduleRequest { name, stale: false })),
        ("pause", |name| rpc::pause_schedule(v1::PauseScheduleRequest { name })),
        ("resume", |name| rpc::resume_schedule(v1::ResumeScheduleRequest { name })),
        ("trigger", |name| {
            rpc::trigger_schedule(v1::TriggerScheduleRequest {
                name,
                force: true,
                ..Default::default()
            })
        }),
    ];
    for (verb, call) in by_name {
        cases.extend([
            bad(&format!("{verb}: empty name"), call(String::new()), Invalid, "name"),
            bad(&format!("{verb}: name with capitals"), call("Bad Name".into()), Invalid, "name"),
            big(&format!("{verb}: 65-char name"), call(long_name.clone()), Invalid, "name"),
            bad(&format!("{verb}: unknown schedule"), call(UNKNOWN.into()), NotFound, UNKNOWN),
        ]);
    }
    // Every RPC: a message over the 1 MiB limit (each would otherwise be
    // served: a new schedule, the seeded one deleted, paused, triggered),
    // and bytes that are no message at all.
    let harmless = [
        put(|_| {}),
        rpc::delete_schedule(v1::DeleteScheduleRequest { name: SCHEDULE.into() }),
        rpc::get_schedule(v1::GetScheduleRequest { name: SCHEDULE.into(), stale: false }),
        rpc::list_schedules(v1::ListSchedulesRequest { stale: false }),
        rpc::pause_schedule(v1::PauseScheduleRequest { name: SCHEDULE.into() }),
        rpc::resume_schedule(v1::ResumeScheduleRequest { name: SCHEDULE.into() }),
        rpc::trigger_schedule(v1::TriggerScheduleRequest {
            name: SCHEDULE.into(),
            force: true,
            ..Default::default()
        }),
    ];
    for call in harmless {
        cases.push(Case::garbage(call.path));
        cases.push(Case::over_limit(call));
    }
    cases
}
