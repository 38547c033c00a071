//! The `proto` target: bytes a client sends, through prost decoding of each
//! public request, the wire → core conversion, validation and `apply`.
//!
//! Goal: decoding never panics and a decoded request re-encodes to an
//! equal one; the conversions in `leasehold_proto::convert` never panic;
//! a command the server's validation accepts is never refused as invalid
//! by `apply` (both use the default limits), and applying it keeps the
//! state's invariants.
//!
//! Method: the first byte picks the request type ([`KINDS`]), the rest is
//! the protobuf message. The request → command step mirrors what the Queue
//! and Schedules services do with each request before they propose it;
//! the command is applied to a small state that already holds jobs, a
//! lease and a schedule, so acks, refreshes and fires can meet real ones.
//! Peer messages (signed adverts and bus messages) are decoded and
//! round-tripped too: they arrive from the network before any check.

use std::fmt::Debug;
use std::sync::OnceLock;

use leasehold_core::schedule::{JobTemplate, Overlap, ScheduleSpec};
use leasehold_core::{
    Command, JobSpec, Limits, Proposal, RedriveTarget, Refusal, Response, State, ValidationError,
    validate,
};
use leasehold_proto::convert;
use leasehold_proto::v1;
use prost::Message;

/// The messages the target decodes, by the kind byte that selects them.
pub const KINDS: [&str; 19] = [
    "enqueue",
    "claim",
    "refresh",
    "ack",
    "nack",
    "release",
    "get-job",
    "list-jobs",
    "stats",
    "redrive",
    "put-schedule",
    "delete-schedule",
    "get-schedule",
    "pause-schedule",
    "resume-schedule",
    "trigger-schedule",
    "signed",
    "advert",
    "bus-message",
];

/// The proposer's clock the conversions and `apply` use.
const NOW_MS: u64 = 1_767_225_600_000;

/// Runs one input; panics on a violation.
pub fn check(data: &[u8]) {
    check_decoded(data);
}

/// Runs one input and answers whether it decoded as the message its kind
/// byte selects; panics on a violation.
pub fn check_decoded(data: &[u8]) -> bool {
    let Some((&kind, bytes)) = data.split_first() else {
        return false;
    };
    // None: did not decode; Some(None): decoded, no command follows from it.
    let converted: Option<Option<Converted>> = match usize::from(kind) % KINDS.len() {
        0 => decode::<v1::EnqueueRequest>(bytes).map(|request| Some(enqueue(request))),
        1 => decode::<v1::ClaimRequest>(bytes).map(|request| {
            Some(Ok(Command::Claim {
                worker: request.worker,
                queue: request.queue,
                max: request.max,
                lease_ttl_ms: request.lease_ttl_ms,
                selector: request.selector,
            }))
        }),
        2 => decode::<v1::RefreshRequest>(bytes).map(|request| {
            Some(Ok(Command::Refresh {
                worker: request.worker,
                leases: request.leases.iter().map(|lease| (lease.job_id, lease.token)).collect(),
                lease_ttl_ms: request.lease_ttl_ms,
            }))
        }),
        3 => decode::<v1::AckRequest>(bytes).map(|request| {
            let result = (!request.result.is_empty()).then_some(request.result);
            Some(Ok(Command::Ack { job_id: request.job_id, token: request.token, result }))
        }),
        4 => decode::<v1::NackRequest>(bytes).map(|request| {
            Some(Ok(Command::Nack {
                job_id: request.job_id,
                token: request.token,
                error: request.error,
                retry_after_ms: request.retry_after_ms,
            }))
        }),
        5 => decode::<v1::ReleaseRequest>(bytes).map(|request| {
            Some(Ok(Command::Release { job_id: request.job_id, token: request.token }))
        }),
        6 => decode::<v1::GetJobRequest>(bytes).map(|_| None),
        7 => decode::<v1::ListJobsRequest>(bytes).map(|request| {
            // The filter conversion either names a state or refuses.
            let _ = convert::job_state_filter_from_wire("state", request.state);
            if let Some(queue) = &request.queue {
                let _ = validate::queue_name("queue", queue);
            }
            None
        }),
        8 => decode::<v1::StatsRequest>(bytes).map(|_| None),
        9 => decode::<v1::RedriveRequest>(bytes).map(redrive),
        10 => decode::<v1::PutScheduleRequest>(bytes).map(|request| Some(put_schedule(request))),
        11 => decode::<v1::DeleteScheduleRequest>(bytes)
            .map(|request| Some(Ok(Command::DeleteSchedule { name: request.name }))),
        12 => decode::<v1::GetScheduleRequest>(bytes).map(|_| None),
        13 => decode::<v1::PauseScheduleRequest>(bytes)
            .map(|request| Some(Ok(Command::SetPaused { name: request.name, paused: true }))),
        14 => decode::<v1::ResumeScheduleRequest>(bytes).map(|request| {
            let (name, counted_after_ms, paused_through, paused_ticks) = (request.name, 0, 0, 0);
            Some(Ok(Command::ResumeSchedule {
                name,
                counted_after_ms,
                paused_through,
                paused_ticks,
            }))
        }),
        15 => decode::<v1::TriggerScheduleRequest>(bytes).map(|request| {
            let targets = vec![2];
            Some(Ok(Command::Trigger { schedule: request.name, force: request.force, targets }))
        }),
        16 => decode::<v1::Signed>(bytes).map(|_| None),
        17 => decode::<v1::Advert>(bytes).map(|_| None),
        _ => decode::<v1::BusMessage>(bytes).map(|_| None),
    };
    let decoded = converted.is_some();
    if let Some(Some(Ok(command))) = converted {
        propose(command);
    }
    decoded
}

/// A request converted to the command the server would propose, or the
/// error the server would answer instead.
type Converted = Result<Command, ValidationError>;

/// Decodes `bytes` as `M`; when that succeeds, checks that the message
/// re-encodes to bytes that decode to an equal message, and returns it.
pub fn decode<M: Message + Default + PartialEq + Debug>(bytes: &[u8]) -> Option<M> {
    let message = M::decode(bytes).ok()?;
    let again = M::decode(message.encode_to_vec().as_slice()).expect("an encoded message decodes");
    assert_eq!(again, message, "a message changed over a round trip");
    Some(message)
}

/// What the Queue service does with an enqueue: each wire spec becomes a
/// core spec, `delay_ms` measured from the receiving node's clock.
fn enqueue(request: v1::EnqueueRequest) -> Converted {
    let jobs = request
        .jobs
        .into_iter()
        .enumerate()
        .map(|(index, spec)| convert::job_spec_from_wire(spec, index, NOW_MS))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Command::Enqueue { jobs })
}

/// What the Queue service does with a redrive: a queue or ids, not both,
/// not neither (those are refused before any command exists).
fn redrive(request: v1::RedriveRequest) -> Option<Converted> {
    let target = match (request.queue, request.job_ids.is_empty()) {
        (Some(queue), true) => RedriveTarget::Queue(queue),
        (None, false) => RedriveTarget::Ids(request.job_ids),
        _ => return None,
    };
    Some(Ok(Command::Redrive { target }))
}

/// What the Schedules service does with a put: a spec is required, and is
/// converted and then validated on its own.
fn put_schedule(request: v1::PutScheduleRequest) -> Converted {
    let spec = request.spec.ok_or_else(|| ValidationError::invalid("spec", "is required"))?;
    let spec = convert::schedule_spec_from_wire(spec)?;
    // Converting back gives the wire form the API reports for it.
    let _ = convert::schedule_spec_to_wire(&spec);
    Ok(Command::PutSchedule { spec })
}

/// Validates a converted command as the server does and, when it passes,
/// applies it: `apply` must then not refuse it as invalid, and the state's
/// invariants must hold.
fn propose(command: Command) {
    if validate::validate_command(&command, &Limits::default()).is_err() {
        return;
    }
    let mut state = base_state().clone();
    let proposal = Proposal { now_ms: NOW_MS + 1_000, command };
    let response = state.apply(2, &proposal);
    if let Response::Refused(Refusal::Invalid(error)) = &response {
        panic!("{proposal:?} passed validation but apply refused it: {error}");
    }
    if let Err(violation) = state.check_invariants() {
        panic!("{proposal:?} -> {response:?}: {violation}");
    }
    // Whatever the answer, the wire forms of its jobs and leases exist.
    if let Response::Claimed(grants) = &response {
        for grant in grants {
            let _ = convert::grant_to_wire(grant);
        }
    }
}

/// A state to apply requests to: jobs 1-3 in queue `alpha` (job 1 claimed
/// under token 1), and schedule `s1` every second.
fn base_state() -> &'static State {
    static BASE: OnceLock<State> = OnceLock::new();
    BASE.get_or_init(|| {
        let mut state = State::new();
        let spec = |key: Option<&str>| JobSpec {
            queue: "alpha".into(),
            idempotency_key: key.map(str::to_owned),
            ..JobSpec::default()
        };
        let schedule = ScheduleSpec {
            name: "s1".into(),
            cron: "* * * * * *".into(),
            template: JobTemplate { queue: Some("alpha".into()), ..JobTemplate::default() },
            overlap: Overlap::Allow,
            ..ScheduleSpec::default()
        };
        for command in [
            Command::Enqueue { jobs: vec![spec(Some("k1")), spec(None), spec(None)] },
            Command::Claim {
                worker: "worker-1".into(),
                queue: "alpha".into(),
                max: 1,
                lease_ttl_ms: None,
                selector: vec![],
            },
            Command::PutSchedule { spec: schedule },
            Command::RegisterNode { node: 2, tags: vec![] },
        ] {
            state.apply(1, &Proposal { now_ms: NOW_MS, command });
        }
        state
    })
}
