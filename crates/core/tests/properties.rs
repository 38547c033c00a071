//! Property tests of `State::apply`, the only place scheduler state changes.
//!
//! Goal: show that the guarantees of SPEC §7 that core alone is responsible
//! for hold for *any* sequence of commands, not just the stories the unit
//! tests tell — fencing tokens strictly increase, a job holds at most one
//! live lease, an acked job is never claimed again, stale tokens are
//! refused, refusals change nothing, and replicas (and snapshots) agree byte
//! for byte.
//!
//! Method: proptest generates a sequence of abstract steps (enqueue, claim,
//! refresh, ack, nack, release, sweep, redrive, purge, and invalid batches),
//! each with a clock jump that is sometimes *backwards*, as a new leader with
//! a slower clock would propose. Steps name jobs and tokens by picks that
//! are resolved against the state when the step runs, so a sequence hits
//! real jobs with current tokens, superseded tokens and made-up ones.
//! `replay` applies the sequence to three fresh states — two plain replicas
//! and one that is serialized and reloaded every few steps — and records
//! every step. Each property below is one checker over that record; they
//! share the generator so a failure names the property that broke.
//! Proptest prints the failing case and its seed on failure.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_core::{
    Command, JobFilter, JobSpec, JobState, Proposal, RedriveTarget, Refusal, Response, State,
};
use proptest::prelude::*;

const QUEUES: [&str; 2] = ["alpha", "beta"];
const TAGS: [&str; 2] = ["gpu", "eu"];
const KEYS: [&str; 3] = ["k1", "k2", "k3"];
const HOUR_MS: i64 = 60 * 60 * 1_000;

/// How a step names a job.
#[derive(Clone, Debug)]
enum JobPick {
    /// One of the jobs claimed right now (any job if none is), so acks,
    /// nacks and releases mostly meet a live lease.
    Held(usize),
    /// Any id from 0 to one past the last assigned: known jobs in any state,
    /// and ids that name nothing.
    Any(usize),
}

/// How a step names a fencing token.
#[derive(Clone, Debug)]
enum TokenPick {
    /// The job's current lease token (its last one, for an acked tombstone).
    Current,
    /// Some token granted earlier, to any job: usually stale.
    Granted(usize),
    /// A small made-up token.
    Arbitrary(u64),
}

/// A job spec with its fields chosen from small sets, so keys collide and
/// priorities tie.
#[derive(Clone, Debug)]
struct SpecSeed {
    queue: usize,
    priority: i32,
    delay_ms: Option<u64>,
    max_attempts: u32,
    lease_ttl_ms: Option<u64>,
    key: Option<usize>,
    tags: Vec<usize>,
}

/// One abstract command; jobs are named by `pick`, resolved at run time.
#[derive(Clone, Debug)]
enum Op {
    Enqueue(Vec<SpecSeed>),
    /// A batch whose last job has a bad queue name: must change nothing.
    EnqueueInvalid(Vec<SpecSeed>),
    Claim {
        queue: usize,
        max: u32,
        lease_ttl_ms: Option<u64>,
        selector: Vec<usize>,
    },
    Refresh {
        leases: Vec<(JobPick, TokenPick)>,
        lease_ttl_ms: Option<u64>,
    },
    Ack(JobPick, TokenPick),
    Nack(JobPick, TokenPick, Option<u64>),
    Release(JobPick, TokenPick),
    Sweep,
    SweepKeepingTokens,
    RedriveQueue(usize),
    RedriveIds(Vec<usize>),
    Purge,
}

#[derive(Clone, Debug)]
struct Step {
    /// Change of the proposer's clock; negative runs it backwards.
    clock_delta_ms: i64,
    /// Whether a new leader (next epoch) proposes this step.
    new_epoch: bool,
    op: Op,
}

fn token_pick() -> impl Strategy<Value = TokenPick> {
    prop_oneof![
        4 => Just(TokenPick::Current),
        2 => any::<usize>().prop_map(TokenPick::Granted),
        1 => (0..4u64).prop_map(TokenPick::Arbitrary),
    ]
}

fn job_pick() -> impl Strategy<Value = JobPick> {
    prop_oneof![
        3 => any::<usize>().prop_map(JobPick::Held),
        1 => any::<usize>().prop_map(JobPick::Any),
    ]
}

fn spec_seed() -> impl Strategy<Value = SpecSeed> {
    (
        0..QUEUES.len(),
        -2..=2i32,
        prop::option::weighted(0.3, 0..60_000u64),
        1..=4u32,
        prop::option::of(prop::sample::select(vec![1_000u64, 5_000, 30_000])),
        prop::option::weighted(0.5, 0..KEYS.len()),
        prop::collection::vec(0..TAGS.len(), 0..=2),
    )
        .prop_map(|(queue, priority, delay_ms, max_attempts, lease_ttl_ms, key, tags)| {
            SpecSeed { queue, priority, delay_ms, max_attempts, lease_ttl_ms, key, tags }
        })
}

fn op() -> impl Strategy<Value = Op> {
    let ttl = || prop::option::of(prop::sample::select(vec![1_000u64, 5_000]));
    prop_oneof![
        4 => prop::collection::vec(spec_seed(), 1..=4).prop_map(Op::Enqueue),
        1 => prop::collection::vec(spec_seed(), 0..=2).prop_map(Op::EnqueueInvalid),
        4 => (0..QUEUES.len(), 1..=3u32, ttl(), prop::collection::vec(0..TAGS.len(), 0..=2))
            .prop_map(|(queue, max, lease_ttl_ms, selector)| Op::Claim {
                queue,
                max,
                lease_ttl_ms,
                selector,
            }),
        2 => (prop::collection::vec((job_pick(), token_pick()), 1..=3), ttl())
            .prop_map(|(leases, lease_ttl_ms)| Op::Refresh { leases, lease_ttl_ms }),
        3 => (job_pick(), token_pick()).prop_map(|(pick, token)| Op::Ack(pick, token)),
        2 => (job_pick(), token_pick(), prop::option::of(0..10_000u64))
            .prop_map(|(pick, token, retry)| Op::Nack(pick, token, retry)),
        1 => (job_pick(), token_pick()).prop_map(|(pick, token)| Op::Release(pick, token)),
        1 => Just(Op::Sweep),
        1 => Just(Op::SweepKeepingTokens),
        1 => (0..QUEUES.len()).prop_map(Op::RedriveQueue),
        1 => prop::collection::vec(any::<usize>(), 1..=3).prop_map(Op::RedriveIds),
        1 => Just(Op::Purge),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    // Exact lease lengths make `expires_at == cluster time` reachable, the
    // boundary where a lease counts as lapsed.
    let clock_delta_ms = prop_oneof![
        5 => 0..5_000i64,
        3 => prop::sample::select(vec![0i64, 1_000, 5_000, 30_000]),
        2 => -30_000..0i64,
        2 => 5_000..60_000i64,
        1 => Just(25 * HOUR_MS),
    ];
    (clock_delta_ms, prop::bool::weighted(0.1), op())
        .prop_map(|(clock_delta_ms, new_epoch, op)| Step { clock_delta_ms, new_epoch, op })
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 1..60)
}

/// What `replay` saw at one step.
#[derive(Debug)]
struct Record {
    before: State,
    epoch: u64,
    proposal: Proposal,
    response: Response,
    after: State,
    /// The response of the second plain replica.
    replica_response: Response,
    /// The response of the replica that is reloaded from snapshots.
    reloaded_response: Response,
}

/// The three replicas at the end of a replay.
struct Replay {
    records: Vec<Record>,
    replica: State,
    reloaded: State,
}

/// Resolves an index to an id in `0 ..= last_job_id + 1`, so both ends
/// name jobs that do not exist.
fn any_job(pick: usize, state: &State) -> u64 {
    let span = state.last_job_id().saturating_add(2);
    u64::try_from(pick).unwrap_or(u64::MAX) % span
}

fn pick_job(pick: &JobPick, state: &State) -> u64 {
    match pick {
        JobPick::Held(index) => {
            let held = JobFilter { queue: None, state: Some(JobState::Claimed) };
            let claimed = state.jobs(&held, 0, usize::MAX);
            if claimed.is_empty() {
                any_job(*index, state)
            } else {
                claimed[index % claimed.len()].id
            }
        }
        JobPick::Any(index) => any_job(*index, state),
    }
}

fn pick_token(pick: &TokenPick, job_id: u64, state: &State, granted: &[u64]) -> u64 {
    match pick {
        TokenPick::Current => {
            state.job(job_id).and_then(|job| job.lease).map_or(0, |lease| lease.token)
        }
        TokenPick::Granted(index) => {
            if granted.is_empty() {
                0
            } else {
                granted[index % granted.len()]
            }
        }
        TokenPick::Arbitrary(token) => *token,
    }
}

fn job_spec(seed: &SpecSeed, clock_ms: u64) -> JobSpec {
    JobSpec {
        queue: QUEUES[seed.queue].to_owned(),
        payload: vec![u8::try_from(seed.queue).unwrap_or(0); 3],
        priority: seed.priority,
        not_before_ms: seed.delay_ms.map(|delay| clock_ms.saturating_add(delay)),
        max_attempts: Some(seed.max_attempts),
        backoff: None,
        lease_ttl_ms: seed.lease_ttl_ms,
        idempotency_key: seed.key.map(|key| KEYS[key].to_owned()),
        tags: seed.tags.iter().map(|&tag| TAGS[tag].to_owned()).collect(),
    }
}

fn resolve(op: &Op, state: &State, clock_ms: u64, granted: &[u64]) -> Command {
    let job_and_token = |pick: &JobPick, token: &TokenPick| {
        let job_id = pick_job(pick, state);
        (job_id, pick_token(token, job_id, state, granted))
    };
    match op {
        Op::Enqueue(seeds) => {
            Command::Enqueue { jobs: seeds.iter().map(|seed| job_spec(seed, clock_ms)).collect() }
        }
        Op::EnqueueInvalid(seeds) => {
            let mut jobs: Vec<JobSpec> =
                seeds.iter().map(|seed| job_spec(seed, clock_ms)).collect();
            jobs.push(JobSpec { queue: "Not A Queue".to_owned(), ..JobSpec::default() });
            Command::Enqueue { jobs }
        }
        Op::Claim { queue, max, lease_ttl_ms, selector } => Command::Claim {
            worker: format!("worker-{queue}"),
            queue: QUEUES[*queue].to_owned(),
            max: *max,
            lease_ttl_ms: *lease_ttl_ms,
            selector: selector.iter().map(|&tag| TAGS[tag].to_owned()).collect(),
        },
        Op::Refresh { leases, lease_ttl_ms } => {
            // Validation refuses a job listed twice; keep the first.
            let mut seen = BTreeSet::new();
            let leases = leases
                .iter()
                .map(|(pick, token)| job_and_token(pick, token))
                .filter(|(job_id, _)| seen.insert(*job_id))
                .collect();
            Command::Refresh { worker: "worker-0".to_owned(), leases, lease_ttl_ms: *lease_ttl_ms }
        }
        Op::Ack(pick, token) => {
            let (job_id, token) = job_and_token(pick, token);
            // Some acks carry a result, so replicas and snapshots carry it too.
            let result = (token % 2 == 0).then(|| token.to_le_bytes().to_vec());
            // Some are lean (log format 3): their tombstones drop the payload.
            if token.is_multiple_of(3) {
                Command::AckLean { job_id, token, result }
            } else {
                Command::Ack { job_id, token, result }
            }
        }
        Op::Nack(pick, token, retry_after_ms) => {
            let (job_id, token) = job_and_token(pick, token);
            Command::Nack {
                job_id,
                token,
                error: "failed".to_owned(),
                retry_after_ms: *retry_after_ms,
            }
        }
        Op::Release(pick, token) => {
            let (job_id, token) = job_and_token(pick, token);
            Command::Release { job_id, token }
        }
        Op::Sweep => Command::Sweep,
        Op::SweepKeepingTokens => Command::SweepKeepingTokens { max_clock_offset_ms: 0 },
        Op::RedriveQueue(queue) => {
            Command::Redrive { target: RedriveTarget::Queue(QUEUES[*queue].to_owned()) }
        }
        Op::RedriveIds(picks) => Command::Redrive {
            target: RedriveTarget::Ids(picks.iter().map(|&pick| any_job(pick, state)).collect()),
        },
        Op::Purge => Command::Purge,
    }
}

/// Serializes and reloads a state, as a snapshot install would.
fn reload(state: &State) -> State {
    let bytes = bincode::serialize(state).expect("a state serializes");
    bincode::deserialize(&bytes).expect("a serialized state deserializes")
}

/// Applies the steps to three fresh states and records every step. The
/// third replica is reloaded from its own snapshot every fifth step, so a
/// snapshot that loses or changes anything shows up as a diverging response.
fn replay(steps: &[Step]) -> Replay {
    let mut state = State::new();
    let mut replica = State::new();
    let mut reloaded = State::new();
    let mut clock_ms: u64 = 1_000_000;
    let mut epoch: u64 = 1;
    let mut granted: Vec<u64> = Vec::new();
    let mut records = Vec::with_capacity(steps.len());
    for (index, step) in steps.iter().enumerate() {
        clock_ms = clock_ms.saturating_add_signed(step.clock_delta_ms);
        if step.new_epoch {
            epoch += 1;
        }
        let proposal =
            Proposal { now_ms: clock_ms, command: resolve(&step.op, &state, clock_ms, &granted) };
        let before = state.clone();
        let response = state.apply(epoch, &proposal);
        let replica_response = replica.apply(epoch, &proposal);
        if index % 5 == 4 {
            reloaded = reload(&reloaded);
        }
        let reloaded_response = reloaded.apply(epoch, &proposal);
        if let Response::Claimed(grants) = &response {
            granted.extend(grants.iter().map(|grant| grant.lease.token));
        }
        records.push(Record {
            before,
            epoch,
            proposal,
            response,
            after: state.clone(),
            replica_response,
            reloaded_response,
        });
    }
    Replay { records, replica, reloaded }
}

fn all_jobs(state: &State) -> Vec<leasehold_core::Job> {
    state.jobs(&JobFilter::default(), 0, usize::MAX)
}

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]

    /// (a) Every granted token is strictly greater than every earlier one,
    /// and the state's counter names the last one issued.
    #[test]
    fn tokens_strictly_increase(steps in steps()) {
        let replay = replay(&steps);
        let mut highest = 0u64;
        for (index, record) in replay.records.iter().enumerate() {
            if let Response::Claimed(grants) = &record.response {
                for grant in grants {
                    prop_assert!(
                        grant.lease.token > highest,
                        "step {index}: token {} granted after token {highest}",
                        grant.lease.token
                    );
                    highest = grant.lease.token;
                    prop_assert_eq!(grant.lease.epoch, record.epoch);
                }
            }
            prop_assert_eq!(record.after.last_token(), highest, "step {}", index);
        }
    }

    /// (b) Each job is in exactly one state, its fields agree with that
    /// state, and every index equals a rebuild from the job table; the
    /// public hints read from the indexes agree with the jobs.
    #[test]
    fn state_and_indexes_agree(steps in steps()) {
        for (index, record) in replay(&steps).records.iter().enumerate() {
            let state = &record.after;
            if let Err(violation) = state.check_invariants() {
                return Err(TestCaseError::fail(format!(
                    "step {index} {:?} -> {:?}: {violation}",
                    record.proposal, record.response
                )));
            }
            let jobs = all_jobs(state);
            let stats = state.stats(0);
            let mut counted = 0u64;
            for queue_stats in stats.values() {
                counted += queue_stats.ready
                    + queue_stats.delayed
                    + queue_stats.claimed
                    + queue_stats.acked
                    + queue_stats.dead;
            }
            prop_assert_eq!(counted, jobs.len() as u64, "step {}: stats miss jobs", index);
            for job_state in [JobState::Ready, JobState::Claimed, JobState::Acked, JobState::Dead] {
                let filter = JobFilter { queue: None, state: Some(job_state) };
                let listed: Vec<u64> = state.jobs(&filter, 0, usize::MAX).iter().map(|j| j.id).collect();
                let expected: Vec<u64> = jobs.iter().filter(|j| j.state == job_state).map(|j| j.id).collect();
                prop_assert_eq!(listed, expected, "step {}: listing by state", index);
            }
        }
    }

    /// Cluster time is the largest `now_ms` applied so far, whatever the
    /// proposer clocks do, and every time stamped by apply is cluster time.
    #[test]
    fn cluster_time_never_runs_backwards(steps in steps()) {
        let mut highest = 0u64;
        for (index, record) in replay(&steps).records.iter().enumerate() {
            highest = highest.max(record.proposal.now_ms);
            prop_assert_eq!(record.after.cluster_time_ms(), highest, "step {}", index);
            if let Response::Claimed(grants) = &record.response {
                for grant in grants {
                    prop_assert_eq!(grant.lease.granted_at_ms, highest);
                    prop_assert!(grant.job.not_before_ms <= highest, "granted before due");
                }
            }
        }
    }

    /// (c) A job holds at most one live lease: a grant never lands on a job
    /// whose lease has not ended (by ack, nack, release or sweep); only the
    /// current token renews, acks, nacks or releases; a stale token is always
    /// refused; exactly the claimed jobs hold a current lease, and the
    /// earliest expiry the index reports is theirs.
    #[test]
    fn one_live_lease_per_job(steps in steps()) {
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        let mut acked_with: BTreeMap<u64, u64> = BTreeMap::new();
        // Tokens a sweep that keeps them took back, until the job's next grant.
        let mut swept: BTreeMap<u64, u64> = BTreeMap::new();
        for (index, record) in replay(&steps).records.iter().enumerate() {
            let context = format!("step {index}: {:?} -> {:?}", record.proposal.command, record.response);
            match (&record.proposal.command, &record.response) {
                (_, Response::Claimed(grants)) => {
                    for grant in grants {
                        swept.remove(&grant.job.id);
                        let previous = live.insert(grant.job.id, grant.lease.token);
                        prop_assert!(previous.is_none(), "{}: job still held under {:?}", context, previous);
                    }
                }
                (Command::Refresh { leases, .. }, Response::Refreshed { renewed, lost }) => {
                    for lease in renewed {
                        prop_assert_eq!(live.get(&lease.job_id), Some(&lease.token), "{}", context);
                        prop_assert!(lease.expires_at_ms >= record.after.cluster_time_ms(), "{}", context);
                    }
                    for (job_id, token) in leases {
                        if lost.contains(job_id) {
                            prop_assert_ne!(live.get(job_id), Some(token), "{}: current token lost", context);
                        }
                    }
                    prop_assert_eq!(renewed.len() + lost.len(), leases.len(), "{}", context);
                }
                (
                    Command::Ack { job_id, token, .. } | Command::AckLean { job_id, token, .. },
                    Response::Acked,
                ) => {
                    let current = live.get(job_id) == Some(token);
                    let retry = acked_with.get(job_id) == Some(token);
                    let late = swept.get(job_id) == Some(token);
                    prop_assert!(current || retry || late, "{}: ack with a token that is not current", context);
                    live.remove(job_id);
                    swept.remove(job_id);
                    acked_with.insert(*job_id, *token);
                }
                (Command::Nack { job_id, token, .. }, Response::Nacked { .. })
                | (Command::Release { job_id, token }, Response::Released) => {
                    prop_assert_eq!(live.remove(job_id), Some(*token), "{}", context);
                }
                (command, Response::Swept { requeued, dead }) => {
                    let keeps = matches!(command, Command::SweepKeepingTokens { .. });
                    for job_id in requeued.iter().chain(dead) {
                        let token = live.remove(job_id);
                        prop_assert!(token.is_some(), "{}: swept a job not held", context);
                        if let (Some(token), true) = (token, keeps) {
                            swept.insert(*job_id, token);
                        }
                        let lease = record.before.job(*job_id).and_then(|job| job.lease.clone());
                        let lapsed = lease.is_some_and(|l| l.expires_at_ms <= record.after.cluster_time_ms());
                        prop_assert!(lapsed, "{}: swept a lease still valid", context);
                    }
                }
                (
                    Command::Ack { token, .. }
                    | Command::AckLean { token, .. }
                    | Command::Nack { token, .. }
                    | Command::Release { token, .. },
                    Response::Refused(Refusal::StaleToken { job_id, presented }),
                ) => {
                    prop_assert_eq!(token, presented);
                    prop_assert_ne!(live.get(job_id), Some(presented), "{}: current token refused", context);
                    if matches!(record.proposal.command, Command::Ack { .. } | Command::AckLean { .. }) {
                        prop_assert_ne!(swept.get(job_id), Some(presented), "{}: swept token refused before a re-grant", context);
                    }
                }
                _ => {}
            }
            // A redrive (the only way back to no attempts) drops a kept lease.
            swept.retain(|job_id, _| {
                record.after.job(*job_id).is_none_or(|job| job.attempts > 0 || job.state != JobState::Ready)
            });
            // The model and the state agree on who holds what.
            let state = &record.after;
            let mut earliest_expiry: Option<u64> = None;
            for job in all_jobs(state) {
                let held = live.get(&job.id);
                if job.state == JobState::Claimed {
                    let lease = job.lease.as_ref();
                    prop_assert_eq!(held, lease.map(|l| &l.token), "{}: job {}", context, job.id);
                    let expires = lease.map_or(u64::MAX, |l| l.expires_at_ms);
                    earliest_expiry = Some(earliest_expiry.map_or(expires, |e| e.min(expires)));
                } else {
                    prop_assert!(held.is_none(), "{}: {} job {} still held", context, job.state.as_str(), job.id);
                }
            }
            // No sweep is due before the term's grace ends.
            let sweep_due = earliest_expiry.map(|e| e.max(state.grace_end_ms()));
            prop_assert_eq!(state.next_expiry_ms(0), sweep_due, "{}", context);
            if matches!(record.proposal.command, Command::Sweep | Command::SweepKeepingTokens { .. }) {
                prop_assert!(
                    sweep_due.is_none_or(|e| e > state.cluster_time_ms()),
                    "{}: a lapsed lease survived the sweep", context
                );
            }
        }
    }

    /// (d) An acked job is never claimed again, stays acked until purged,
    /// and a stale token never acks it.
    #[test]
    fn acked_jobs_are_never_claimed_again(steps in steps()) {
        let mut acked: BTreeSet<u64> = BTreeSet::new();
        for (index, record) in replay(&steps).records.iter().enumerate() {
            if let Response::Claimed(grants) = &record.response {
                for grant in grants {
                    prop_assert!(
                        !acked.contains(&grant.job.id),
                        "step {}: acked job {} granted again", index, grant.job.id
                    );
                }
            }
            if let (
                Command::Ack { job_id, .. } | Command::AckLean { job_id, .. },
                Response::Acked,
            ) = (&record.proposal.command, &record.response)
            {
                acked.insert(*job_id);
            }
            for job_id in &acked {
                if let Some(job) = record.after.job(*job_id) {
                    prop_assert_eq!(job.state, JobState::Acked, "step {}: job {}", index, job_id);
                }
            }
        }
    }

    /// Refusals are values that change nothing: after a refused command
    /// only cluster time may have moved.
    #[test]
    fn refusals_change_nothing(steps in steps()) {
        for (index, record) in replay(&steps).records.iter().enumerate() {
            if let Response::Refused(_) = record.response {
                prop_assert_eq!(all_jobs(&record.before), all_jobs(&record.after), "step {}", index);
                prop_assert_eq!(record.before.last_token(), record.after.last_token());
                prop_assert_eq!(record.before.last_job_id(), record.after.last_job_id());
            }
            if matches!(&record.proposal.command, Command::Enqueue { jobs } if jobs.iter().any(|j| j.queue == "Not A Queue")) {
                prop_assert!(matches!(record.response, Response::Refused(Refusal::Invalid(_))));
            }
        }
    }

    /// (e) Replicas agree: two fresh states fed the same proposals answer
    /// identically and serialize to identical bytes, and a replica reloaded
    /// from snapshots along the way answers identically and ends equal.
    #[test]
    fn replicas_and_snapshots_agree(steps in steps()) {
        let replay = replay(&steps);
        for (index, record) in replay.records.iter().enumerate() {
            prop_assert_eq!(&record.response, &record.replica_response, "step {}: replicas differ", index);
            prop_assert_eq!(&record.response, &record.reloaded_response, "step {}: reloaded replica differs", index);
        }
        let last = &replay.records.last().expect("at least one step").after;
        let bytes = bincode::serialize(last).expect("a state serializes");
        prop_assert_eq!(&bytes, &bincode::serialize(&replay.replica).expect("serializes"));
        prop_assert_eq!(&bytes, &bincode::serialize(&replay.reloaded).expect("serializes"));
        prop_assert_eq!(&replay.reloaded, last);
        let round_tripped: State = bincode::deserialize(&bytes).expect("deserializes");
        prop_assert_eq!(&round_tripped, last);
        prop_assert_eq!(round_tripped.check_invariants(), Ok(()));
    }
}
