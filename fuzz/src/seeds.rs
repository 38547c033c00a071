//! The committed corpus seeds, generated from typed values so they follow
//! the encodings: `cargo run --bin seeds` writes them to `corpus/`, and the
//! replay test fails when a committed seed differs from what this module
//! generates (after an encoding change, say), naming the command to run.
//!
//! Seeds for `envelope` and `proto` are real messages of every kind; seeds
//! for `apply` and `cron`, whose inputs are read with `arbitrary`, are
//! pseudo-random bytes of several lengths (every byte string is a valid
//! input there), from a fixed generator so they never change.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_core::schedule::{Catchup, JobTemplate, ScheduleSpec, SkipReason, Target};
use leasehold_core::{
    Backoff, Command, EnqueueOutcome, JobSpec, Proposal, RedriveTarget, Refusal, Response,
    ValidationError,
};
use leasehold_proto::v1;
use leasehold_raft::{NodeId, TypeConfig, envelope};
use openraft::error::{Fatal, InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{
    BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, SnapshotMeta,
    SnapshotSegmentId, StoredMembership, Vote,
};
use prost::Message;

/// One seed: its target, its file name and its bytes.
pub struct Seed {
    /// The target's name (its corpus directory).
    pub target: &'static str,
    /// The file name inside that directory.
    pub name: String,
    /// The input.
    pub bytes: Vec<u8>,
}

/// Every seed of every target.
pub fn all() -> Vec<Seed> {
    let mut seeds = Vec::new();
    seeds.extend(random("apply", &[24, 64, 160, 400, 1_000, 2_500, 6_000]));
    seeds.extend(random("cron", &[8, 16, 32, 64, 128, 256]));
    seeds.extend(envelope_seeds());
    seeds.extend(proto_seeds());
    seeds
}

/// splitmix64: a fixed, dependency-free byte source.
fn random(target: &'static str, lengths: &[usize]) -> Vec<Seed> {
    let mut state: u64 = 0x6c65_6173_6568_6f6c;
    lengths
        .iter()
        .map(|&length| {
            let mut bytes = Vec::with_capacity(length);
            while bytes.len() < length {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                bytes.extend_from_slice(&z.to_le_bytes());
            }
            bytes.truncate(length);
            Seed { target, name: format!("seed-random-{length}"), bytes }
        })
        .collect()
}

/// A seed: the kind byte of `kind` in `kinds`, then `body`.
fn framed(target: &'static str, kinds: &[&str], kind: &str, tag: &str, body: Vec<u8>) -> Seed {
    let index = kinds.iter().position(|k| *k == kind).expect("a kind of the target");
    let mut bytes = vec![u8::try_from(index).expect("fewer than 256 kinds")];
    bytes.extend(body);
    let name = if tag.is_empty() { format!("seed-{kind}") } else { format!("seed-{kind}-{tag}") };
    Seed { target, name, bytes }
}

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn membership() -> Membership<NodeId, BasicNode> {
    let voters: BTreeSet<NodeId> = [1, 2, 3].into_iter().collect();
    let nodes: BTreeMap<NodeId, BasicNode> = [1, 2, 3]
        .into_iter()
        .map(|id| (id, BasicNode::new(format!("127.0.0.1:{}", 7070 + id))))
        .collect();
    Membership::new(vec![voters], nodes)
}

fn job(queue: &str) -> JobSpec {
    JobSpec {
        queue: queue.into(),
        payload: b"hello".to_vec(),
        priority: 3,
        not_before_ms: Some(1_767_225_601_000),
        max_attempts: Some(3),
        backoff: Some(Backoff { base_ms: 100, cap_ms: 1_000 }),
        lease_ttl_ms: Some(5_000),
        idempotency_key: Some("k1".into()),
        tags: vec!["gpu".into()],
    }
}

fn schedule_spec() -> ScheduleSpec {
    ScheduleSpec {
        name: "backup".into(),
        cron: "*/5 * * * *".into(),
        timezone: "Europe/Berlin".into(),
        template: JobTemplate { command: Some("backup.sh".into()), ..JobTemplate::default() },
        catchup: Catchup::All,
        target: Target::Each,
        ..ScheduleSpec::default()
    }
}

/// Proposals of every command, as the journal logs them.
fn proposals() -> Vec<Proposal> {
    let now_ms = 1_767_225_600_000;
    let commands = vec![
        Command::Enqueue {
            jobs: vec![job("alpha"), JobSpec { queue: "beta".into(), ..JobSpec::default() }],
        },
        Command::Claim {
            worker: "worker-1".into(),
            queue: "alpha".into(),
            max: 2,
            lease_ttl_ms: Some(1_000),
            selector: vec!["gpu".into()],
        },
        Command::Refresh { worker: "worker-1".into(), leases: vec![(1, 1)], lease_ttl_ms: None },
        Command::Nack { job_id: 1, token: 1, error: "boom".into(), retry_after_ms: Some(10) },
        Command::Claim {
            worker: "worker-2".into(),
            queue: "alpha".into(),
            max: 1,
            lease_ttl_ms: None,
            selector: vec!["gpu".into(), "eu".into()],
        },
        Command::Ack { job_id: 1, token: 2, result: Some(b"done".to_vec()) },
        Command::Release { job_id: 2, token: 3 },
        Command::Sweep,
        Command::Redrive { target: RedriveTarget::Queue("alpha".into()) },
        Command::Redrive { target: RedriveTarget::Ids(vec![1, 2]) },
        Command::Purge,
        Command::PutSchedule { spec: schedule_spec() },
        Command::RegisterNode { node: 2, tags: vec!["eu".into()] },
        Command::Fire { schedule: "backup".into(), bucket: 1_767_225_900, targets: vec![2] },
        Command::Skip {
            schedule: "backup".into(),
            bucket: 1_767_226_200,
            reason: SkipReason::Catchup,
            ticks: 2,
        },
        Command::Trigger { schedule: "backup".into(), force: true, targets: vec![2] },
        Command::SetPaused { name: "backup".into(), paused: true },
        Command::ResumeSchedule {
            name: "backup".into(),
            counted_after_ms: 1_767_226_200_000,
            paused_through: 1_767_226_500,
            paused_ticks: 1,
        },
        Command::Planned {
            created_at_ms: 1_767_225_600_000,
            command: Box::new(Command::Fire {
                schedule: "backup".into(),
                bucket: 1_767_226_800,
                targets: vec![],
            }),
        },
        Command::SetDraining { node: 2, draining: true },
        Command::DeleteSchedule { name: "backup".into() },
        Command::Batch { commands: vec![Command::Sweep, Command::Purge] },
        Command::Ruled {
            limits: leasehold_core::Limits::default(),
            command: Box::new(Command::Batch { commands: vec![Command::Sweep, Command::Purge] }),
        },
    ];
    commands
        .into_iter()
        .zip(0u64..)
        .map(|(command, step)| Proposal { now_ms: now_ms + step * 1_000, command })
        .collect()
}

fn envelope_seeds() -> Vec<Seed> {
    use crate::envelope::{AppendEntriesReply, InstallSnapshotReply, KINDS, VoteReply};
    let encode = |value: &dyn erased::Encode| value.encode();
    let seed = |kind: &str, tag: &str, body: Vec<u8>| framed("envelope", &KINDS, kind, tag, body);
    let vote = Vote::new_committed(3, 1);
    let entries: Vec<Entry<TypeConfig>> = std::iter::once(EntryPayload::Blank)
        .chain(std::iter::once(EntryPayload::Membership(membership())))
        .chain(proposals().into_iter().map(EntryPayload::Normal))
        .zip(1u64..)
        .map(|(payload, index)| Entry { log_id: log_id(3, index), payload })
        .collect();
    let append = AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: Some(log_id(2, 0)),
        entries,
        leader_commit: Some(log_id(3, 2)),
    };
    let heartbeat = AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let snapshot = InstallSnapshotRequest::<TypeConfig> {
        vote,
        meta: SnapshotMeta {
            last_log_id: Some(log_id(3, 20)),
            last_membership: StoredMembership::new(Some(log_id(3, 2)), membership()),
            snapshot_id: "3-20-1".into(),
        },
        offset: 0,
        data: b"{\"cluster_time_ms\":0}".to_vec(),
        done: true,
    };
    let replies: [(&str, AppendEntriesReply); 4] = [
        ("success", Ok(AppendEntriesResponse::Success)),
        ("conflict", Ok(AppendEntriesResponse::Conflict)),
        ("higher-vote", Ok(AppendEntriesResponse::HigherVote(Vote::new(4, 2)))),
        ("stopped", Err(RaftError::Fatal(Fatal::Stopped))),
    ];
    let vote_reply: VoteReply = Ok(VoteResponse::new(vote, Some(log_id(3, 20)), true));
    let snapshot_replies: [(&str, InstallSnapshotReply); 2] = [
        ("ok", Ok(InstallSnapshotResponse { vote })),
        (
            "mismatch",
            Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
                expect: SnapshotSegmentId { id: "3-20-1".into(), offset: 0 },
                got: SnapshotSegmentId { id: "3-20-1".into(), offset: 10 },
            }))),
        ),
    ];
    let mut seeds = vec![
        seed("append-entries-request", "", encode(&append)),
        seed("append-entries-request", "heartbeat", encode(&heartbeat)),
        seed("vote-request", "", encode(&VoteRequest::new(vote, Some(log_id(3, 20))))),
        seed("install-snapshot-request", "", encode(&snapshot)),
        seed("vote-reply", "", encode(&vote_reply)),
    ];
    for (tag, reply) in &replies {
        seeds.push(seed("append-entries-reply", tag, encode(reply)));
    }
    for (tag, reply) in &snapshot_replies {
        seeds.push(seed("install-snapshot-reply", tag, encode(reply)));
    }
    for (index, proposal) in proposals().iter().enumerate() {
        seeds.push(seed("forwarded-proposal", &index.to_string(), encode(proposal)));
    }
    let responses = [
        Response::Enqueued(vec![EnqueueOutcome { job_id: 1, duplicate: false }]),
        Response::Refreshed { renewed: Vec::new(), lost: vec![3] },
        Response::Refused(Refusal::StaleToken { job_id: 1, presented: 2 }),
        Response::Refused(Refusal::Invalid(ValidationError::invalid("max", "must be at least 1"))),
        Response::Batch(vec![Response::Acked, Response::Purged(2)]),
    ];
    for (index, response) in responses.iter().enumerate() {
        seeds.push(seed("forwarded-response", &index.to_string(), encode(response)));
    }
    seeds
}

/// Encoding through `envelope::encode` behind a trait object, so the seed
/// list above can mix message types.
mod erased {
    use super::envelope;

    pub trait Encode {
        fn encode(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            envelope::encode(self).expect("a seed encodes")
        }
    }
}

fn proto_seeds() -> Vec<Seed> {
    use crate::proto::KINDS;
    let seed = |kind: &str, tag: &str, message: &dyn ProtoEncode| {
        framed("proto", &KINDS, kind, tag, message.bytes())
    };
    let wire_job = v1::JobSpec {
        queue: "alpha".into(),
        payload: b"hello".to_vec(),
        priority: -2,
        not_before_ms: None,
        delay_ms: Some(500),
        max_attempts: Some(3),
        backoff: Some(v1::Backoff { base_ms: 100, cap_ms: 1_000 }),
        lease_ttl_ms: Some(5_000),
        idempotency_key: Some("k2".into()),
        tags: vec!["gpu".into()],
    };
    let wire_schedule = v1::ScheduleSpec {
        name: "nightly".into(),
        cron: "0 2 * * *".into(),
        timezone: "America/New_York".into(),
        template: Some(v1::JobTemplate {
            queue: Some("alpha".into()),
            command: Some("report.sh".into()),
            lease_ttl_ms: Some(60_000),
            max_attempts: Some(2),
            tags: vec!["eu".into()],
            ..v1::JobTemplate::default()
        }),
        overlap: v1::Overlap::Allow as i32,
        catchup: v1::Catchup::All as i32,
        catchup_window_ms: 0,
        catchup_max: 3,
        target: v1::Target::Each as i32,
        paused: false,
    };
    let advert = v1::Advert {
        node_id: 2,
        version: "0.1.0".into(),
        journal_lease: Some(true),
        role: "follower".into(),
        sent_at_ms: 1_767_225_600_000,
        ..v1::Advert::default()
    };
    let bus_claim = v1::BusMessage {
        kind: Some(v1::bus_message::Kind::Claim(v1::BusClaim {
            key: "cron:backup:1767225900".into(),
            node: 2,
            at_ms: 1_767_225_900_000,
        })),
    };
    let bus_release = v1::BusMessage {
        kind: Some(v1::bus_message::Kind::Release(v1::BusRelease {
            key: "cron:backup:1767225900".into(),
            node: 2,
            at_ms: 1_767_225_901_000,
        })),
    };
    vec![
        seed(
            "enqueue",
            "",
            &v1::EnqueueRequest {
                jobs: vec![
                    wire_job.clone(),
                    v1::JobSpec { queue: "beta".into(), ..v1::JobSpec::default() },
                ],
            },
        ),
        seed(
            "claim",
            "",
            &v1::ClaimRequest {
                worker: "worker-1".into(),
                queue: "alpha".into(),
                max: 5,
                lease_ttl_ms: Some(2_000),
                selector: vec!["gpu".into()],
                wait_ms: 100,
                ..Default::default()
            },
        ),
        seed(
            "refresh",
            "",
            &v1::RefreshRequest {
                worker: "worker-1".into(),
                leases: vec![
                    v1::LeaseRef { job_id: 1, token: 1 },
                    v1::LeaseRef { job_id: 2, token: 9 },
                ],
                lease_ttl_ms: None,
            },
        ),
        seed("ack", "", &v1::AckRequest { job_id: 1, token: 1, result: b"ok".to_vec() }),
        seed(
            "nack",
            "",
            &v1::NackRequest {
                job_id: 1,
                token: 1,
                error: "boom".into(),
                retry_after_ms: Some(50),
            },
        ),
        seed("release", "", &v1::ReleaseRequest { job_id: 1, token: 1 }),
        seed("get-job", "", &v1::GetJobRequest { job_id: 1, stale: true }),
        seed(
            "list-jobs",
            "",
            &v1::ListJobsRequest {
                queue: Some("alpha".into()),
                state: v1::JobState::Ready as i32,
                page_size: 10,
                page_token: "3".into(),
                stale: false,
            },
        ),
        seed("stats", "", &v1::StatsRequest { queue: Some("alpha".into()), stale: true }),
        seed(
            "redrive",
            "queue",
            &v1::RedriveRequest { queue: Some("alpha".into()), job_ids: vec![] },
        ),
        seed("redrive", "ids", &v1::RedriveRequest { queue: None, job_ids: vec![1, 2] }),
        seed("put-schedule", "", &v1::PutScheduleRequest { spec: Some(wire_schedule) }),
        seed("delete-schedule", "", &v1::DeleteScheduleRequest { name: "s1".into() }),
        seed("get-schedule", "", &v1::GetScheduleRequest { name: "s1".into(), stale: false }),
        seed("pause-schedule", "", &v1::PauseScheduleRequest { name: "s1".into() }),
        seed("resume-schedule", "", &v1::ResumeScheduleRequest { name: "s1".into() }),
        seed(
            "trigger-schedule",
            "",
            &v1::TriggerScheduleRequest { name: "s1".into(), force: true, ..Default::default() },
        ),
        seed("signed", "", &v1::Signed { body: advert.encode_to_vec(), mac: vec![7; 32] }),
        seed("advert", "", &advert),
        seed("bus-message", "claim", &bus_claim),
        seed("bus-message", "release", &bus_release),
    ]
}

/// A prost message behind a trait object.
trait ProtoEncode {
    fn bytes(&self) -> Vec<u8>;
}

impl<M: Message> ProtoEncode for M {
    fn bytes(&self) -> Vec<u8> {
        self.encode_to_vec()
    }
}
