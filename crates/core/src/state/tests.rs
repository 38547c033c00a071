//! Unit tests of `State::apply`, one group per command: the happy path,
//! each refusal, and the edges (lapsed-but-unswept leases, retention
//! boundaries, time running backwards). Every test ends by checking the
//! structural invariants, so an index that drifts fails here too.

use super::*;
use crate::command::MAX_CLOCK_OFFSET_MS;
use crate::job::Backoff;
use crate::node_info::NodeInfo;
use crate::schedule::Schedule;
use crate::validate::ValidationKind;

const EPOCH: u64 = 7;

/// Applies `command` at `now_ms` and checks the invariants afterwards.
fn apply(state: &mut State, now_ms: u64, command: Command) -> Response {
    let response = state.apply(EPOCH, &Proposal { now_ms, command });
    if let Err(violation) = state.check_invariants() {
        panic!("invariant broken after {response:?}: {violation}");
    }
    response
}

fn spec(queue: &str) -> JobSpec {
    JobSpec { queue: queue.to_owned(), ..JobSpec::default() }
}

fn keyed(queue: &str, key: &str) -> JobSpec {
    JobSpec { idempotency_key: Some(key.to_owned()), ..spec(queue) }
}

/// Enqueues and returns the ids, panicking on anything but `Enqueued`.
fn enqueue(state: &mut State, now_ms: u64, specs: Vec<JobSpec>) -> Vec<EnqueueOutcome> {
    match apply(state, now_ms, Command::Enqueue { jobs: specs }) {
        Response::Enqueued(outcomes) => outcomes,
        other => panic!("expected Enqueued, got {other:?}"),
    }
}

fn enqueue_one(state: &mut State, now_ms: u64, spec: JobSpec) -> u64 {
    enqueue(state, now_ms, vec![spec])[0].job_id
}

fn claim_command(queue: &str, max: u32, selector: &[&str]) -> Command {
    Command::Claim {
        worker: "worker-1".to_owned(),
        queue: queue.to_owned(),
        max,
        lease_ttl_ms: None,
        selector: selector.iter().map(|tag| (*tag).to_owned()).collect(),
    }
}

fn claim(state: &mut State, now_ms: u64, queue: &str, max: u32) -> Vec<Grant> {
    match apply(state, now_ms, claim_command(queue, max, &[])) {
        Response::Claimed(grants) => grants,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

fn claim_one(state: &mut State, now_ms: u64, queue: &str) -> Lease {
    let grants = claim(state, now_ms, queue, 1);
    assert_eq!(grants.len(), 1, "expected one grant");
    grants[0].lease.clone()
}

fn claimed_ids(grants: &[Grant]) -> Vec<u64> {
    grants.iter().map(|grant| grant.job.id).collect()
}

fn job(state: &State, job_id: u64) -> Job {
    state.job(job_id).expect("job is retained")
}

fn ack(job_id: u64, token: u64) -> Command {
    Command::Ack { job_id, token, result: None }
}

fn nack(job_id: u64, token: u64, retry_after_ms: Option<u64>) -> Command {
    Command::Nack { job_id, token, error: "boom".to_owned(), retry_after_ms }
}

fn release(job_id: u64, token: u64) -> Command {
    Command::Release { job_id, token }
}

fn refresh(leases: Vec<(u64, u64)>, lease_ttl_ms: Option<u64>) -> Command {
    Command::Refresh { worker: "worker-1".to_owned(), leases, lease_ttl_ms }
}

fn stale_refusal(job_id: u64, presented: u64) -> Response {
    Response::Refused(Refusal::StaleToken { job_id, presented })
}

const TTL_MS: u64 = 30_000;
const DAY_MS: u64 = 24 * 60 * 60 * 1_000;

mod cluster_time {
    use super::*;

    #[test]
    fn never_runs_backwards() {
        let mut state = State::new();
        apply(&mut state, 5_000, Command::Sweep);
        assert_eq!(state.cluster_time_ms(), 5_000);
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        assert_eq!(state.cluster_time_ms(), 5_000);
        // The job is stamped with cluster time, not the stale proposer clock.
        assert_eq!(job(&state, id).enqueued_at_ms, 5_000);
        assert_eq!(job(&state, id).not_before_ms, 5_000);
        let lease = claim_one(&mut state, 2_000, "q");
        assert_eq!(lease.granted_at_ms, 5_000);
        assert_eq!(lease.expires_at_ms, 5_000 + TTL_MS);
    }

    #[test]
    fn an_invalid_command_advances_time_and_changes_nothing_else() {
        let mut state = State::new();
        enqueue_one(&mut state, 1_000, spec("q"));
        let before = state.clone();
        let response = apply(&mut state, 9_000, claim_command("q", 0, &[]));
        let Response::Refused(Refusal::Invalid(error)) = response else {
            panic!("expected an invalid refusal, got {response:?}")
        };
        assert_eq!(error.field, "max");
        assert_eq!(state.cluster_time_ms(), 9_000);
        let mut expected = before;
        expected.cluster_time_ms = 9_000;
        assert_eq!(state, expected);
    }
}

mod enqueue {
    use super::*;

    #[test]
    fn assigns_increasing_ids_and_fills_defaults() {
        let mut state = State::new();
        let outcomes = enqueue(&mut state, 1_000, vec![spec("a"), spec("b")]);
        let ids: Vec<u64> = outcomes.iter().map(|o| o.job_id).collect();
        assert_eq!(ids, vec![1, 2]);
        assert!(outcomes.iter().all(|o| !o.duplicate));
        assert_eq!(enqueue_one(&mut state, 1_000, spec("a")), 3);
        assert_eq!(state.last_job_id(), 3);

        let first = job(&state, 1);
        assert_eq!(first.queue, "a");
        assert_eq!(first.state, JobState::Ready);
        assert_eq!(first.not_before_ms, 1_000);
        assert_eq!(first.enqueued_at_ms, 1_000);
        assert_eq!(first.max_attempts, 5);
        assert_eq!(first.lease_ttl_ms, TTL_MS);
        assert_eq!(first.backoff, Backoff::default());
        assert_eq!(first.attempts, 0);
        assert_eq!(first.lease, None);
        assert_eq!(first.finished_at_ms, None);
    }

    #[test]
    fn keeps_what_the_spec_names() {
        let mut state = State::new();
        let full = JobSpec {
            queue: "q".into(),
            payload: b"hello".to_vec(),
            priority: -3,
            not_before_ms: Some(50_000),
            max_attempts: Some(2),
            backoff: Some(Backoff { base_ms: 10, cap_ms: 20 }),
            lease_ttl_ms: Some(5_000),
            idempotency_key: Some("k".into()),
            tags: vec!["zeta".into(), "gpu".into(), "zeta".into()],
        };
        let id = enqueue_one(&mut state, 1_000, full);
        let job = job(&state, id);
        assert_eq!(job.payload, b"hello");
        assert_eq!(job.priority, -3);
        assert_eq!(job.not_before_ms, 50_000);
        assert_eq!(job.max_attempts, 2);
        assert_eq!(job.backoff.base_ms, 10);
        assert_eq!(job.lease_ttl_ms, 5_000);
        assert_eq!(job.idempotency_key.as_deref(), Some("k"));
        // Sorted and deduplicated.
        assert_eq!(job.tags, vec!["gpu".to_owned(), "zeta".to_owned()]);
    }

    #[test]
    fn an_invalid_job_refuses_the_whole_batch() {
        let mut state = State::new();
        enqueue_one(&mut state, 1_000, spec("q"));
        let before = state.clone();
        let response = apply(
            &mut state,
            1_000,
            Command::Enqueue { jobs: vec![spec("q"), spec("q"), spec("NOPE")] },
        );
        let Response::Refused(Refusal::Invalid(error)) = response else {
            panic!("expected an invalid refusal, got {response:?}")
        };
        assert_eq!(error.field, "jobs[2].queue");
        assert_eq!(state, before);
        assert_eq!(state.last_job_id(), 1);
    }

    #[test]
    fn an_oversized_payload_is_refused_as_too_large() {
        let mut state = State::new();
        let big = JobSpec { payload: vec![0; 256 * 1024 + 1], ..spec("q") };
        let response = apply(&mut state, 1, Command::Enqueue { jobs: vec![big] });
        let Response::Refused(Refusal::Invalid(error)) = response else {
            panic!("expected an invalid refusal, got {response:?}")
        };
        assert_eq!(error.kind, ValidationKind::TooLarge);
        assert_eq!(state.last_job_id(), 0);
    }

    #[test]
    fn a_repeated_key_returns_the_first_job() {
        let mut state = State::new();
        let first = enqueue_one(&mut state, 1_000, keyed("q", "k"));
        let again = enqueue(&mut state, 2_000, vec![keyed("q", "k")]);
        assert_eq!(again, vec![EnqueueOutcome { job_id: first, duplicate: true }]);
        assert_eq!(state.last_job_id(), first);
        assert_eq!(state.jobs(&JobFilter::default(), 0, 10).len(), 1);
    }

    #[test]
    fn keys_are_scoped_by_queue() {
        let mut state = State::new();
        let in_a = enqueue_one(&mut state, 1_000, keyed("a", "k"));
        let in_b = enqueue_one(&mut state, 1_000, keyed("b", "k"));
        assert_ne!(in_a, in_b);
    }

    #[test]
    fn duplicates_inside_one_batch_dedupe_to_the_first() {
        let mut state = State::new();
        let outcomes = enqueue(
            &mut state,
            1_000,
            vec![keyed("q", "k"), spec("q"), keyed("q", "k"), keyed("q", "other")],
        );
        let pairs: Vec<(u64, bool)> = outcomes.iter().map(|o| (o.job_id, o.duplicate)).collect();
        assert_eq!(pairs, vec![(1, false), (2, false), (1, true), (3, false)]);
    }

    #[test]
    fn acked_and_dead_jobs_still_hold_their_key() {
        let mut state = State::new();
        let acked = enqueue_one(&mut state, 1_000, keyed("q", "acked"));
        let lease = claim_one(&mut state, 1_000, "q");
        apply(&mut state, 1_000, ack(acked, lease.token));
        let dead =
            enqueue_one(&mut state, 1_000, JobSpec { max_attempts: Some(1), ..keyed("q", "dead") });
        let lease = claim_one(&mut state, 1_000, "q");
        apply(&mut state, 1_000, nack(dead, lease.token, None));
        assert_eq!(job(&state, dead).state, JobState::Dead);

        let outcomes = enqueue(&mut state, 2_000, vec![keyed("q", "acked"), keyed("q", "dead")]);
        assert_eq!(
            outcomes,
            vec![
                EnqueueOutcome { job_id: acked, duplicate: true },
                EnqueueOutcome { job_id: dead, duplicate: true }
            ]
        );
    }

    #[test]
    fn a_purged_tombstone_frees_its_key() {
        let mut state = State::new();
        let first = enqueue_one(&mut state, 1_000, keyed("q", "k"));
        let lease = claim_one(&mut state, 1_000, "q");
        apply(&mut state, 1_000, ack(first, lease.token));
        assert_eq!(apply(&mut state, 1_000 + DAY_MS, Command::Purge), Response::Purged(1));
        let second = enqueue(&mut state, 1_000 + DAY_MS, vec![keyed("q", "k")]);
        assert!(!second[0].duplicate);
        assert!(second[0].job_id > first);
    }
}

mod claim {
    use super::*;

    #[test]
    fn grants_in_priority_then_due_time_then_id_order() {
        let mut state = State::new();
        let with = |priority: i32, not_before_ms: u64| JobSpec {
            priority,
            not_before_ms: Some(not_before_ms),
            ..spec("q")
        };
        // ids 1..=6
        enqueue(
            &mut state,
            100,
            vec![with(0, 50), with(5, 90), with(5, 10), with(-1, 0), with(5, 10), with(0, 20)],
        );
        let grants = claim(&mut state, 100, "q", 10);
        assert_eq!(claimed_ids(&grants), vec![3, 5, 2, 6, 1, 4]);
    }

    #[test]
    fn a_delayed_job_does_not_block_lower_priorities() {
        let mut state = State::new();
        let delayed = JobSpec { priority: 9, not_before_ms: Some(10_000), ..spec("q") };
        enqueue(&mut state, 1_000, vec![delayed, spec("q")]);
        assert_eq!(claimed_ids(&claim(&mut state, 1_000, "q", 10)), vec![2]);
        assert!(claim(&mut state, 9_999, "q", 10).is_empty());
        assert_eq!(claimed_ids(&claim(&mut state, 10_000, "q", 10)), vec![1]);
    }

    #[test]
    fn grants_at_most_max() {
        let mut state = State::new();
        enqueue(&mut state, 1_000, vec![spec("q"); 5]);
        assert_eq!(claimed_ids(&claim(&mut state, 1_000, "q", 2)), vec![1, 2]);
        assert_eq!(claimed_ids(&claim(&mut state, 1_000, "q", 2)), vec![3, 4]);
        assert_eq!(claimed_ids(&claim(&mut state, 1_000, "q", 2)), vec![5]);
        assert!(claim(&mut state, 1_000, "q", 2).is_empty());
    }

    #[test]
    fn an_unknown_or_empty_queue_grants_nothing() {
        let mut state = State::new();
        assert_eq!(
            apply(&mut state, 1_000, claim_command("nothing", 5, &[])),
            Response::Claimed(vec![])
        );
        assert_eq!(state.last_token(), 0);
    }

    #[test]
    fn fills_the_lease_from_the_command_and_the_job() {
        let mut state = State::new();
        enqueue(
            &mut state,
            1_000,
            vec![spec("q"), JobSpec { lease_ttl_ms: Some(5_000), ..spec("q") }],
        );
        let grants = claim(&mut state, 2_000, "q", 2);
        let leases: Vec<&Lease> = grants.iter().map(|grant| &grant.lease).collect();
        assert_eq!(leases[0].token, 1);
        assert_eq!(leases[1].token, 2);
        for (grant, ttl_ms) in grants.iter().zip([TTL_MS, 5_000]) {
            assert_eq!(grant.lease.job_id, grant.job.id);
            assert_eq!(grant.lease.holder, "worker-1");
            assert_eq!(grant.lease.epoch, EPOCH);
            assert_eq!(grant.lease.granted_at_ms, 2_000);
            assert_eq!(grant.lease.expires_at_ms, 2_000 + ttl_ms);
            assert_eq!(grant.job.state, JobState::Claimed);
            assert_eq!(grant.job.lease.as_ref(), Some(&grant.lease));
            assert_eq!(job(&state, grant.job.id), grant.job);
        }
        assert_eq!(state.last_token(), 2);
        assert_eq!(state.next_expiry_ms(0), Some(2_000 + 5_000));
    }

    #[test]
    fn a_claim_ttl_overrides_the_job_ttl() {
        let mut state = State::new();
        enqueue_one(&mut state, 1_000, spec("q"));
        let command = Command::Claim {
            worker: "w".into(),
            queue: "q".into(),
            max: 1,
            lease_ttl_ms: Some(2_000),
            selector: vec![],
        };
        let Response::Claimed(grants) = apply(&mut state, 1_000, command) else {
            panic!("expected grants")
        };
        assert_eq!(grants[0].lease.expires_at_ms, 3_000);
    }

    #[test]
    fn tokens_are_global_and_never_reused() {
        let mut state = State::new();
        let a = enqueue_one(&mut state, 1_000, spec("a"));
        enqueue_one(&mut state, 1_000, spec("b"));
        let first = claim_one(&mut state, 1_000, "a");
        let second = claim_one(&mut state, 1_000, "b");
        apply(&mut state, 1_000, release(a, first.token));
        let third = claim_one(&mut state, 1_000, "a");
        assert_eq!((first.token, second.token, third.token), (1, 2, 3));
    }

    #[test]
    fn stamps_the_epoch_argument() {
        let mut state = State::new();
        enqueue_one(&mut state, 1_000, spec("q"));
        let response =
            state.apply(42, &Proposal { now_ms: 1_000, command: claim_command("q", 1, &[]) });
        let Response::Claimed(grants) = response else { panic!("expected grants") };
        assert_eq!(grants[0].lease.epoch, 42);
    }

    #[test]
    fn a_job_is_claimable_only_by_a_selector_holding_all_its_tags() {
        let mut state = State::new();
        let tagged = |tags: &[&str]| JobSpec {
            tags: tags.iter().map(|tag| (*tag).to_owned()).collect(),
            ..spec("q")
        };
        enqueue(&mut state, 1_000, vec![tagged(&["gpu", "eu"]), tagged(&["gpu"]), tagged(&[])]);
        let claim_with = |state: &mut State, selector: &[&str]| match apply(
            state,
            1_000,
            claim_command("q", 10, selector),
        ) {
            Response::Claimed(grants) => claimed_ids(&grants),
            other => panic!("expected grants, got {other:?}"),
        };
        assert!(state.has_claimable("q", &["eu".into()], 0));
        assert_eq!(claim_with(&mut state, &["eu"]), vec![3]);
        assert_eq!(claim_with(&mut state, &["gpu"]), vec![2]);
        assert_eq!(claim_with(&mut state, &["x", "eu", "gpu"]), vec![1]);
    }

    #[test]
    fn a_claim_across_tag_sets_keeps_one_claim_order_and_skips_what_it_cannot_take() {
        let mut state = State::new();
        let job = |tags: &[&str], priority: i32, not_before_ms: Option<u64>| JobSpec {
            tags: tags.iter().map(|tag| (*tag).to_owned()).collect(),
            priority,
            not_before_ms,
            ..spec("q")
        };
        let mut specs = vec![
            job(&["eu"], 1, None),               // 1
            job(&["gpu", "eu", "gpu"], 5, None), // 2: the same set as 6
            job(&[], 1, None),                   // 3
            job(&["us"], 9, None),               // 4: never for this selector
            job(&["eu"], 5, Some(5_000)),        // 5: not due until 5 s
            job(&["eu", "gpu"], 0, None),        // 6
        ];
        // A backlog no eu/gpu worker can take: one group, whatever its size.
        specs.extend((0..500).map(|_| job(&["us"], 9, None)));
        enqueue(&mut state, 1_000, specs);
        let claim_with = |state: &mut State, now_ms: u64, max: u32| match apply(
            state,
            now_ms,
            claim_command("q", max, &["gpu", "eu"]),
        ) {
            Response::Claimed(grants) => claimed_ids(&grants),
            other => panic!("expected grants, got {other:?}"),
        };
        // Priority first across every group, then due time, then id.
        assert_eq!(claim_with(&mut state, 1_000, 3), vec![2, 1, 3]);
        assert_eq!(claim_with(&mut state, 1_000, 10), vec![6]);
        assert_eq!(claim_with(&mut state, 5_000, 10), vec![5]);
        assert!(!state.has_claimable("q", &["gpu".into(), "eu".into()], 5_000));
        assert!(state.has_claimable("q", &["us".into()], 5_000));
        state.check_invariants().expect("the grouped index matches a rebuild");
    }

    #[test]
    fn a_claimed_job_is_not_granted_again() {
        let mut state = State::new();
        enqueue_one(&mut state, 1_000, spec("q"));
        claim_one(&mut state, 1_000, "q");
        // Even after its lease lapses: only a sweep makes it ready again.
        assert!(claim(&mut state, 1_000 + 10 * TTL_MS, "q", 10).is_empty());
        apply(&mut state, 1_000 + 10 * TTL_MS, Command::Sweep);
        assert_eq!(claim(&mut state, 1_000 + 10 * TTL_MS, "q", 10).len(), 1);
    }
}

mod refresh {
    use super::*;

    #[test]
    fn extends_a_current_lease_and_keeps_its_token() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        let response = apply(&mut state, 20_000, refresh(vec![(id, lease.token)], None));
        let expected =
            Lease { granted_at_ms: 20_000, expires_at_ms: 20_000 + TTL_MS, ..lease.clone() };
        assert_eq!(response, Response::Refreshed { renewed: vec![expected.clone()], lost: vec![] });
        assert_eq!(job(&state, id).lease.as_ref(), Some(&expected));
        assert_eq!(state.next_expiry_ms(0), Some(20_000 + TTL_MS));
        assert_eq!(state.last_token(), lease.token);
    }

    #[test]
    fn uses_the_command_ttl_when_given() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        let Response::Refreshed { renewed, .. } =
            apply(&mut state, 2_000, refresh(vec![(id, lease.token)], Some(1_000)))
        else {
            panic!("expected Refreshed")
        };
        assert_eq!(renewed[0].expires_at_ms, 3_000);
    }

    #[test]
    fn reports_stale_unknown_and_unclaimed_as_lost() {
        let mut state = State::new();
        let held = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        let ready = enqueue_one(&mut state, 1_000, spec("q"));
        let response = apply(
            &mut state,
            2_000,
            refresh(vec![(held, lease.token + 1), (999, 1), (ready, lease.token)], None),
        );
        assert_eq!(response, Response::Refreshed { renewed: vec![], lost: vec![held, 999, ready] });
        // The lost report changed nothing.
        assert_eq!(job(&state, held).lease.as_ref(), Some(&lease));
    }

    #[test]
    fn renews_a_lapsed_lease_that_no_sweep_took_back() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        let late_ms = lease.expires_at_ms + 5_000;
        let Response::Refreshed { renewed, lost } =
            apply(&mut state, late_ms, refresh(vec![(id, lease.token)], None))
        else {
            panic!("expected Refreshed")
        };
        assert!(lost.is_empty());
        assert_eq!(renewed[0].expires_at_ms, late_ms + TTL_MS);
        // Now valid again, a sweep leaves it alone.
        assert_eq!(
            apply(&mut state, late_ms, Command::Sweep),
            Response::Swept { requeued: vec![], dead: vec![] }
        );
    }

    #[test]
    fn a_swept_lease_is_lost() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        apply(&mut state, lease.expires_at_ms, Command::Sweep);
        assert_eq!(
            apply(&mut state, lease.expires_at_ms, refresh(vec![(id, lease.token)], None)),
            Response::Refreshed { renewed: vec![], lost: vec![id] }
        );
    }
}

mod ack {
    use super::*;

    #[test]
    fn keeps_the_result_of_the_ack_that_finished_the_job() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 0, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        let first = Command::Ack { job_id: id, token: lease.token, result: Some(b"out".to_vec()) };
        assert_eq!(apply(&mut state, 2_000, first), Response::Acked);
        assert_eq!(job(&state, id).result.as_deref(), Some(&b"out"[..]));
        // A retried ack is answered the same and does not replace it.
        let retry = Command::Ack { job_id: id, token: lease.token, result: Some(b"x".to_vec()) };
        assert_eq!(apply(&mut state, 3_000, retry), Response::Acked);
        assert_eq!(job(&state, id).result.as_deref(), Some(&b"out"[..]));
    }

    /// A lean ack (log format 3) leaves a tombstone with everything but
    /// the payload: the result, the lease that finished it, the key that
    /// still dedups; a retry is answered `Acked`, a stale token refused,
    /// and a snapshot carries it unchanged. A plain ack keeps the payload.
    #[test]
    fn a_lean_ack_keeps_everything_but_the_payload() {
        let mut state = State::new();
        let lean =
            enqueue_one(&mut state, 0, JobSpec { payload: b"in".to_vec(), ..keyed("q", "k") });
        let plain = enqueue_one(&mut state, 0, JobSpec { payload: b"in".to_vec(), ..spec("q") });
        let lease = claim_one(&mut state, 1_000, "q");
        let other = claim_one(&mut state, 1_000, "q");
        let before = job(&state, lean);
        let ack = |token, result: &[u8]| Command::AckLean {
            job_id: lean,
            token,
            result: Some(result.to_vec()),
        };
        assert_eq!(apply(&mut state, 2_000, ack(lease.token, b"out")), Response::Acked);
        let tomb = job(&state, lean);
        assert_eq!(
            tomb,
            Job {
                payload: Vec::new(),
                state: JobState::Acked,
                finished_at_ms: Some(2_000),
                result: Some(b"out".to_vec()),
                ..before
            }
        );
        assert_eq!(apply(&mut state, 3_000, ack(lease.token, b"x")), Response::Acked);
        assert_eq!(
            apply(&mut state, 3_000, ack(other.token, b"x")),
            stale_refusal(lean, other.token)
        );
        assert_eq!(job(&state, lean), tomb, "a retry changes nothing");
        let again = enqueue(&mut state, 3_000, vec![keyed("q", "k")]);
        assert_eq!((again[0].job_id, again[0].duplicate), (lean, true), "the key still dedups");
        let plain_ack = Command::Ack { job_id: plain, token: other.token, result: None };
        assert_eq!(apply(&mut state, 4_000, plain_ack), Response::Acked);
        assert_eq!(job(&state, plain).payload, b"in".to_vec(), "a plain ack keeps the payload");
        let loaded: State =
            bincode::deserialize(&bincode::serialize(&state).expect("encodes")).expect("decodes");
        assert_eq!(loaded, state);
        assert_eq!(loaded.job(lean), Some(tomb));
        state.check_invariants().expect("invariants");
    }

    #[test]
    fn an_oversized_result_is_refused_and_changes_nothing() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 0, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        let before = state.clone();
        let big = vec![b'x'; Limits::default().max_result_bytes + 1];
        let response = apply(
            &mut state,
            1_000,
            Command::Ack { job_id: id, token: lease.token, result: Some(big) },
        );
        match response {
            Response::Refused(Refusal::Invalid(error)) => {
                assert_eq!(error.kind, ValidationKind::TooLarge);
                assert_eq!(error.field, "result");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(job(&state, id), before.job(id).expect("job"));
        assert_eq!(job(&state, id).state, JobState::Claimed);
    }

    #[test]
    fn the_current_token_finishes_the_job() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        assert_eq!(apply(&mut state, 3_000, ack(id, lease.token)), Response::Acked);
        let acked = job(&state, id);
        assert_eq!(acked.state, JobState::Acked);
        assert_eq!(acked.finished_at_ms, Some(3_000));
        // The last lease stays as the audit record.
        assert_eq!(acked.lease.as_ref(), Some(&lease));
        assert_eq!(state.next_expiry_ms(0), None);
    }

    #[test]
    fn a_repeated_ack_is_answered_again_and_changes_nothing() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        apply(&mut state, 3_000, ack(id, lease.token));
        let before = state.clone();
        assert_eq!(apply(&mut state, 3_000, ack(id, lease.token)), Response::Acked);
        assert_eq!(state, before);
        // Another token on the tombstone is still stale.
        assert_eq!(
            apply(&mut state, 3_000, ack(id, lease.token + 1)),
            stale_refusal(id, lease.token + 1)
        );
    }

    #[test]
    fn an_unknown_job_is_not_found() {
        let mut state = State::new();
        assert_eq!(
            apply(&mut state, 1_000, ack(5, 1)),
            Response::Refused(Refusal::NotFound { job_id: 5 })
        );
    }

    #[test]
    fn a_wrong_token_or_unclaimed_job_is_stale() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        assert_eq!(apply(&mut state, 1_000, ack(id, 0)), stale_refusal(id, 0));
        let lease = claim_one(&mut state, 1_000, "q");
        let before = state.clone();
        assert_eq!(
            apply(&mut state, 1_000, ack(id, lease.token + 1)),
            stale_refusal(id, lease.token + 1)
        );
        assert_eq!(state, before);
    }

    #[test]
    fn a_lapsed_lease_not_yet_swept_still_acks() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        assert_eq!(
            apply(&mut state, lease.expires_at_ms + 60_000, ack(id, lease.token)),
            Response::Acked
        );
    }

    #[test]
    fn a_superseded_token_is_stale() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let old = claim_one(&mut state, 1_000, "q");
        apply(&mut state, old.expires_at_ms, Command::Sweep);
        assert_eq!(
            apply(&mut state, old.expires_at_ms, ack(id, old.token)),
            stale_refusal(id, old.token)
        );
        let new = claim_one(&mut state, old.expires_at_ms, "q");
        assert_eq!(
            apply(&mut state, old.expires_at_ms, ack(id, old.token)),
            stale_refusal(id, old.token)
        );
        assert_eq!(apply(&mut state, old.expires_at_ms, ack(id, new.token)), Response::Acked);
    }

    /// SPEC §3: an expired lease not yet re-granted still counts. A sweep
    /// that keeps tokens takes the job back (attempt charged, ready for
    /// anyone) but an ack under the swept token lands until the next grant;
    /// the other token commands are refused, and reads show no lease.
    #[test]
    fn a_swept_token_acks_until_the_job_is_granted_again() {
        let keeping = Command::SweepKeepingTokens { max_clock_offset_ms: 0 };
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let old = claim_one(&mut state, 1_000, "q");
        let at = old.expires_at_ms;
        assert_eq!(
            apply(&mut state, at, keeping.clone()),
            Response::Swept { requeued: vec![id], dead: vec![] }
        );
        let swept = job(&state, id);
        assert_eq!((swept.state, swept.attempts, swept.lease), (JobState::Ready, 1, None));
        for command in [
            refresh(vec![(id, old.token)], None),
            nack(id, old.token, None),
            release(id, old.token),
        ] {
            let before = state.clone();
            let answer = apply(&mut state, at, command);
            assert_ne!(answer, Response::Acked);
            assert_eq!(state, before, "{answer:?} changed the state");
        }
        assert_eq!(apply(&mut state, at, ack(id, old.token + 1)), stale_refusal(id, old.token + 1));
        assert_eq!(apply(&mut state, at + 1, ack(id, old.token)), Response::Acked);
        let acked = job(&state, id);
        assert_eq!(acked.state, JobState::Acked);
        assert_eq!(acked.finished_at_ms, Some(at + 1));
        assert_eq!(acked.lease.map(|lease| lease.token), Some(old.token));
        assert!(claim(&mut state, at + 2, "q", 1).is_empty(), "an acked job is not granted");
        // Retried, the ack is answered alike.
        assert_eq!(apply(&mut state, at + 2, ack(id, old.token)), Response::Acked);

        // Once the job is granted again the swept token is stale.
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let old = claim_one(&mut state, 1_000, "q");
        apply(&mut state, old.expires_at_ms, keeping.clone());
        let new = claim_one(&mut state, old.expires_at_ms, "q");
        assert_eq!(
            apply(&mut state, old.expires_at_ms, ack(id, old.token)),
            stale_refusal(id, old.token)
        );
        assert_eq!(apply(&mut state, old.expires_at_ms, ack(id, new.token)), Response::Acked);

        // A sweep that spent the last attempt keeps the token too: the run
        // finished, so its ack counts.
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, JobSpec { max_attempts: Some(1), ..spec("q") });
        let old = claim_one(&mut state, 1_000, "q");
        assert_eq!(
            apply(&mut state, old.expires_at_ms, keeping.clone()),
            Response::Swept { requeued: vec![], dead: vec![id] }
        );
        assert_eq!(job(&state, id).lease, None);
        assert_eq!(apply(&mut state, old.expires_at_ms, ack(id, old.token)), Response::Acked);
        assert_eq!(job(&state, id).state, JobState::Acked);

        // A redrive starts the dead job's life anew: the ack of the run
        // that let it die no longer counts.
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, JobSpec { max_attempts: Some(1), ..spec("q") });
        let old = claim_one(&mut state, 1_000, "q");
        apply(&mut state, old.expires_at_ms, keeping);
        let redrive = Command::Redrive { target: RedriveTarget::Ids(vec![id]) };
        assert_eq!(apply(&mut state, old.expires_at_ms, redrive), Response::Redriven(1));
        assert_eq!(
            apply(&mut state, old.expires_at_ms, ack(id, old.token)),
            stale_refusal(id, old.token)
        );
    }

    #[test]
    fn an_acked_job_is_never_claimed_again() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        apply(&mut state, 1_000, ack(id, lease.token));
        for command in [
            Command::Sweep,
            Command::Redrive { target: RedriveTarget::Ids(vec![id]) },
            Command::Redrive { target: RedriveTarget::Queue("q".into()) },
            release(id, lease.token),
            nack(id, lease.token, None),
        ] {
            apply(&mut state, 10 * TTL_MS, command);
        }
        assert!(claim(&mut state, 10 * TTL_MS, "q", 10).is_empty());
        assert_eq!(job(&state, id).state, JobState::Acked);
    }
}

mod nack {
    use super::*;

    #[test]
    fn charges_an_attempt_and_waits_the_backoff() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        assert_eq!(
            apply(&mut state, 2_000, nack(id, lease.token, None)),
            Response::Nacked { state: JobState::Ready, not_before_ms: 2_000 + 1_000 }
        );
        let failed = job(&state, id);
        assert_eq!(failed.state, JobState::Ready);
        assert_eq!(failed.attempts, 1);
        assert_eq!(failed.last_error.as_deref(), Some("boom"));
        assert_eq!(failed.lease, None);
        assert!(claim(&mut state, 2_999, "q", 1).is_empty());
        let lease = claim_one(&mut state, 3_000, "q");
        // Second failure doubles the wait.
        assert_eq!(
            apply(&mut state, 4_000, nack(id, lease.token, None)),
            Response::Nacked { state: JobState::Ready, not_before_ms: 4_000 + 2_000 }
        );
    }

    #[test]
    fn retry_after_overrides_the_backoff() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        assert_eq!(
            apply(&mut state, 1_000, nack(id, lease.token, Some(0))),
            Response::Nacked { state: JobState::Ready, not_before_ms: 1_000 }
        );
        let lease = claim_one(&mut state, 1_000, "q");
        assert_eq!(
            apply(&mut state, 1_000, nack(id, lease.token, Some(u64::MAX))),
            Response::Nacked { state: JobState::Ready, not_before_ms: u64::MAX }
        );
    }

    #[test]
    fn the_last_attempt_kills_the_job() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, JobSpec { max_attempts: Some(2), ..spec("q") });
        let lease = claim_one(&mut state, 1_000, "q");
        apply(&mut state, 1_000, nack(id, lease.token, Some(0)));
        let lease = claim_one(&mut state, 1_000, "q");
        assert_eq!(
            apply(&mut state, 5_000, nack(id, lease.token, None)),
            Response::Nacked { state: JobState::Dead, not_before_ms: 0 }
        );
        let dead = job(&state, id);
        assert_eq!(dead.state, JobState::Dead);
        assert_eq!(dead.attempts, 2);
        assert_eq!(dead.finished_at_ms, Some(5_000));
        assert_eq!(dead.lease, None);
        assert!(claim(&mut state, 1_000_000, "q", 1).is_empty());
    }

    #[test]
    fn long_error_text_is_truncated_at_a_char_boundary() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        // 4095 ASCII bytes, then a two-byte character straddling the limit.
        let error = format!("{}é and more", "x".repeat(4_095));
        apply(
            &mut state,
            1_000,
            Command::Nack { job_id: id, token: lease.token, error, retry_after_ms: None },
        );
        let kept = job(&state, id).last_error.clone().expect("error kept");
        assert_eq!(kept, "x".repeat(4_095));
    }

    #[test]
    fn needs_the_current_token() {
        let mut state = State::new();
        assert_eq!(
            apply(&mut state, 1_000, nack(3, 1, None)),
            Response::Refused(Refusal::NotFound { job_id: 3 })
        );
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        // A refused nack must not even record its error text.
        let refused_unchanged = |state: &mut State, token: u64| {
            let before = state.clone();
            assert_eq!(apply(state, 1_000, nack(id, token, None)), stale_refusal(id, token));
            assert_eq!(*state, before);
        };
        refused_unchanged(&mut state, 1);
        let lease = claim_one(&mut state, 1_000, "q");
        refused_unchanged(&mut state, lease.token + 1);
        apply(&mut state, 1_000, ack(id, lease.token));
        refused_unchanged(&mut state, lease.token);
    }
}

mod backoff {
    use super::*;

    #[test]
    fn doubles_from_the_base_up_to_the_cap() {
        let backoff = Backoff::default();
        let delays: Vec<u64> = (1..=10).map(|attempt| backoff.delay_ms(attempt)).collect();
        assert_eq!(
            delays,
            vec![1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000]
        );
        assert_eq!(backoff.delay_ms(0), 1_000);
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let backoff = Backoff { base_ms: 3, cap_ms: u64::MAX };
        assert_eq!(backoff.delay_ms(64), 3u64.saturating_mul(1 << 63));
        assert_eq!(backoff.delay_ms(65), u64::MAX);
        assert_eq!(backoff.delay_ms(u32::MAX), u64::MAX);
        let capped = Backoff { base_ms: 1, cap_ms: 7 };
        assert_eq!(capped.delay_ms(1_000), 7);
    }
}

mod release {
    use super::*;

    #[test]
    fn returns_the_job_now_without_charging_an_attempt() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        assert_eq!(apply(&mut state, 2_000, release(id, lease.token)), Response::Released);
        let released = job(&state, id);
        assert_eq!(released.state, JobState::Ready);
        assert_eq!(released.attempts, 0);
        assert_eq!(released.lease, None);
        assert_eq!(released.not_before_ms, 2_000);
        assert_eq!(state.next_expiry_ms(0), None);
        let again = claim_one(&mut state, 2_000, "q");
        assert!(again.token > lease.token);
    }

    #[test]
    fn needs_the_current_token() {
        let mut state = State::new();
        assert_eq!(
            apply(&mut state, 1_000, release(1, 1)),
            Response::Refused(Refusal::NotFound { job_id: 1 })
        );
        let id = enqueue_one(&mut state, 1_000, spec("q"));
        let lease = claim_one(&mut state, 1_000, "q");
        assert_eq!(
            apply(&mut state, 1_000, release(id, lease.token - 1)),
            stale_refusal(id, lease.token - 1)
        );
        apply(&mut state, 1_000, release(id, lease.token));
        assert_eq!(
            apply(&mut state, 1_000, release(id, lease.token)),
            stale_refusal(id, lease.token)
        );
    }
}

mod sweep {
    use super::*;

    /// Where the tests below claim; the first term has no grace anyway.
    const AFTER_GRACE: u64 = 1_000;

    #[test]
    fn takes_back_lapsed_leases_only() {
        let mut state = State::new();
        enqueue(
            &mut state,
            0,
            vec![
                JobSpec { lease_ttl_ms: Some(1_000), ..spec("q") },
                JobSpec { lease_ttl_ms: Some(2_000), ..spec("q") },
                spec("q"),
            ],
        );
        claim(&mut state, AFTER_GRACE, "q", 3);
        // The first term starts no grace; expires_at == cluster time counts
        // as lapsed.
        assert_eq!(
            apply(&mut state, AFTER_GRACE + 2_000, Command::Sweep),
            Response::Swept { requeued: vec![1, 2], dead: vec![] }
        );
        for id in [1, 2] {
            let swept = job(&state, id);
            assert_eq!(swept.state, JobState::Ready);
            assert_eq!(swept.attempts, 1);
            assert_eq!(swept.last_error.as_deref(), Some(LEASE_EXPIRED_ERROR));
            assert_eq!(swept.not_before_ms, AFTER_GRACE + 2_000);
            assert_eq!(swept.lease, None);
        }
        assert_eq!(job(&state, 3).state, JobState::Claimed);
        assert_eq!(state.next_expiry_ms(0), Some(AFTER_GRACE + TTL_MS));
    }

    /// A lease granted under an earlier term is honoured the clock bound
    /// past its expiry: the leader that stamped its expiry may have run
    /// that far from this one's clock. A lease of the current term is not.
    #[test]
    fn a_bounded_sweep_honours_earlier_terms_leases_past_their_expiry() {
        const TTL: u64 = 30_000;
        const BOUND: u64 = 500;
        let mut state = State::new();
        enqueue_one(&mut state, 0, JobSpec { lease_ttl_ms: Some(TTL), ..spec("q") });
        // Shorter, so the current term's lease lapses first.
        enqueue_one(&mut state, 0, JobSpec { lease_ttl_ms: Some(TTL - 10_000), ..spec("q") });
        let old = claim_one(&mut state, AFTER_GRACE, "q");
        // A new term starts 1 s later; its grace ends long before the expiry.
        let start = AFTER_GRACE + 1_000;
        state.apply(EPOCH + 1, &Proposal { now_ms: start, command: Command::Purge });
        let fresh = state
            .apply(EPOCH + 1, &Proposal { now_ms: start, command: claim_command("q", 1, &[]) });
        let Response::Claimed(grants) = fresh else { panic!("claimed: {fresh:?}") };
        let new = grants[0].lease.clone();
        assert!(new.epoch > old.epoch);
        let sweep = Command::SweepBounded { max_clock_offset_ms: BOUND };
        assert_eq!(
            state.next_expiry_ms(BOUND),
            Some(new.expires_at_ms.min(old.expires_at_ms + BOUND))
        );
        let at = |now_ms| Proposal { now_ms, command: sweep.clone() };
        assert!(new.expires_at_ms <= old.expires_at_ms);
        let swept = state.apply(EPOCH + 1, &at(old.expires_at_ms));
        assert_eq!(
            swept,
            Response::Swept { requeued: vec![new.job_id], dead: vec![] },
            "at its expiry only the current term's lease lapses"
        );
        let swept = state.apply(EPOCH + 1, &at(old.expires_at_ms + BOUND - 1));
        assert_eq!(swept, Response::Swept { requeued: vec![], dead: vec![] });
        assert_eq!(state.next_expiry_ms(BOUND), Some(old.expires_at_ms + BOUND));
        let swept = state.apply(EPOCH + 1, &at(old.expires_at_ms + BOUND));
        assert_eq!(swept, Response::Swept { requeued: vec![old.job_id], dead: vec![] });
        let too_far = Command::SweepBounded { max_clock_offset_ms: MAX_CLOCK_OFFSET_MS + 1 };
        assert!(matches!(
            state.apply(EPOCH + 1, &Proposal { now_ms: u64::MAX / 2, command: too_far }),
            Response::Refused(Refusal::Invalid(_))
        ));
    }

    /// A lease that lapsed while no leader lived (its holder could neither
    /// renew nor ack) is not taken back by the new term's first sweep: the
    /// holder gets the grace to ack, and the job does not run twice.
    #[test]
    fn spares_leases_for_the_grace_after_a_new_term_starts() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 0, JobSpec { lease_ttl_ms: Some(1_000), ..spec("q") });
        let lease = claim_one(&mut state, AFTER_GRACE, "q");
        // Term EPOCH+1 begins long after the lease lapsed.
        let new_term_ms = AFTER_GRACE + 10_000;
        let sweep = Proposal { now_ms: new_term_ms, command: Command::Sweep };
        assert_eq!(
            state.apply(EPOCH + 1, &sweep),
            Response::Swept { requeued: vec![], dead: vec![] }
        );
        assert_eq!(state.next_expiry_ms(0), Some(new_term_ms + TERM_START_GRACE_MS));
        let late_sweep =
            Proposal { now_ms: new_term_ms + TERM_START_GRACE_MS - 1, command: Command::Sweep };
        assert_eq!(
            state.apply(EPOCH + 1, &late_sweep),
            Response::Swept { requeued: vec![], dead: vec![] }
        );
        let ack = Proposal { now_ms: new_term_ms + 2_000, command: ack(id, lease.token) };
        assert_eq!(state.apply(EPOCH + 1, &ack), Response::Acked);
        assert_eq!(job(&state, id).state, JobState::Acked);
    }

    /// Once the grace is over, a lease nobody renewed is taken back as usual.
    #[test]
    fn takes_back_unrenewed_leases_once_the_grace_ends() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 0, JobSpec { lease_ttl_ms: Some(1_000), ..spec("q") });
        claim_one(&mut state, AFTER_GRACE, "q");
        let new_term_ms = AFTER_GRACE + 10_000;
        let first = Proposal { now_ms: new_term_ms, command: Command::Sweep };
        state.apply(EPOCH + 1, &first);
        let at_grace_end =
            Proposal { now_ms: new_term_ms + TERM_START_GRACE_MS, command: Command::Sweep };
        assert_eq!(
            state.apply(EPOCH + 1, &at_grace_end),
            Response::Swept { requeued: vec![id], dead: vec![] }
        );
        // A command of an older term (a deposed leader's, committed late)
        // starts no new grace.
        let old_term = Proposal { now_ms: new_term_ms + 20_000, command: Command::Sweep };
        state.apply(EPOCH, &old_term);
        assert_eq!(state.grace_end_ms(), new_term_ms + TERM_START_GRACE_MS);
    }

    #[test]
    fn is_idempotent() {
        let mut state = State::new();
        enqueue_one(&mut state, 0, spec("q"));
        claim_one(&mut state, 0, "q");
        apply(&mut state, TTL_MS, Command::Sweep);
        let before = state.clone();
        assert_eq!(
            apply(&mut state, TTL_MS, Command::Sweep),
            Response::Swept { requeued: vec![], dead: vec![] }
        );
        assert_eq!(state, before);
    }

    #[test]
    fn kills_a_job_on_its_last_attempt_and_lists_ids_ascending() {
        let mut state = State::new();
        let once = JobSpec { max_attempts: Some(1), ..spec("q") };
        enqueue(&mut state, 0, vec![once.clone(), spec("q"), once]);
        // Claim in two steps so expiry order differs from id order.
        claim(&mut state, 0, "q", 1);
        claim(&mut state, 0, "q", 1);
        let Response::Claimed(grants) = apply(
            &mut state,
            0,
            Command::Claim {
                worker: "w".into(),
                queue: "q".into(),
                max: 1,
                lease_ttl_ms: Some(1_000),
                selector: vec![],
            },
        ) else {
            panic!("expected grants")
        };
        assert_eq!(claimed_ids(&grants), vec![3]);
        assert_eq!(
            apply(&mut state, TTL_MS, Command::Sweep),
            Response::Swept { requeued: vec![2], dead: vec![1, 3] }
        );
        assert_eq!(job(&state, 1).finished_at_ms, Some(TTL_MS));
        assert_eq!(job(&state, 3).state, JobState::Dead);
    }
}

mod redrive {
    use super::*;

    /// Enqueues `count` single-attempt jobs in `queue` and kills them all.
    fn dead_jobs(state: &mut State, queue: &str, count: usize) -> Vec<u64> {
        let once = JobSpec { max_attempts: Some(1), ..spec(queue) };
        let ids: Vec<u64> =
            enqueue(state, 0, vec![once; count]).iter().map(|outcome| outcome.job_id).collect();
        for grant in claim(state, 0, queue, 100) {
            apply(state, 0, nack(grant.job.id, grant.lease.token, None));
        }
        ids
    }

    #[test]
    fn a_queue_redrive_revives_every_dead_job_of_the_queue() {
        let mut state = State::new();
        let ids = dead_jobs(&mut state, "q", 3);
        let elsewhere = dead_jobs(&mut state, "other", 1);
        assert_eq!(
            apply(&mut state, 5_000, Command::Redrive { target: RedriveTarget::Queue("q".into()) }),
            Response::Redriven(3)
        );
        for id in ids {
            let revived = job(&state, id);
            assert_eq!(revived.state, JobState::Ready);
            assert_eq!(revived.attempts, 0);
            assert_eq!(revived.not_before_ms, 5_000);
            assert_eq!(revived.finished_at_ms, None);
            assert_eq!(revived.last_error.as_deref(), Some("boom"));
        }
        assert_eq!(job(&state, elsewhere[0]).state, JobState::Dead);
        assert_eq!(claim(&mut state, 5_000, "q", 10).len(), 3);
        assert_eq!(
            apply(
                &mut state,
                5_000,
                Command::Redrive { target: RedriveTarget::Queue("empty".into()) }
            ),
            Response::Redriven(0)
        );
    }

    #[test]
    fn an_id_redrive_ignores_jobs_that_are_not_dead() {
        let mut state = State::new();
        let dead = dead_jobs(&mut state, "q", 1)[0];
        let ready = enqueue_one(&mut state, 0, spec("q"));
        assert_eq!(
            apply(
                &mut state,
                0,
                Command::Redrive { target: RedriveTarget::Ids(vec![ready, dead, 999, dead]) }
            ),
            Response::Redriven(1)
        );
        assert_eq!(job(&state, dead).state, JobState::Ready);
    }

    #[test]
    fn an_invalid_target_is_refused() {
        let mut state = State::new();
        let response =
            apply(&mut state, 0, Command::Redrive { target: RedriveTarget::Ids(vec![]) });
        assert!(matches!(response, Response::Refused(Refusal::Invalid(_))));
    }
}

mod purge {
    use super::*;

    #[test]
    fn drops_tombstones_once_retention_has_passed() {
        let mut state = State::new();
        let acked = enqueue_one(&mut state, 1_000, keyed("q", "k"));
        let lease = claim_one(&mut state, 1_000, "q");
        apply(&mut state, 2_000, ack(acked, lease.token));
        let pending = enqueue_one(&mut state, 2_000, spec("q"));

        assert!(!state.has_purgeable(2_000 + DAY_MS - 1));
        assert_eq!(apply(&mut state, 2_000 + DAY_MS - 1, Command::Purge), Response::Purged(0));
        assert!(state.has_purgeable(2_000 + DAY_MS));
        assert_eq!(apply(&mut state, 2_000 + DAY_MS, Command::Purge), Response::Purged(1));
        assert_eq!(state.job(acked), None);
        assert!(state.job(pending).is_some());
        assert!(!state.has_purgeable(u64::MAX));
        assert_eq!(
            apply(&mut state, 3 * DAY_MS, ack(acked, lease.token)),
            Response::Refused(Refusal::NotFound { job_id: acked })
        );
    }

    #[test]
    fn keeps_dead_jobs() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, 0, JobSpec { max_attempts: Some(1), ..spec("q") });
        let lease = claim_one(&mut state, 0, "q");
        apply(&mut state, 0, nack(id, lease.token, None));
        assert_eq!(apply(&mut state, 10 * DAY_MS, Command::Purge), Response::Purged(0));
        assert_eq!(job(&state, id).state, JobState::Dead);
    }
}

mod queries {
    use super::*;

    /// Queue "a": job 1 acked, 2 claimed, 3 ready, 4 delayed; queue "b": 5 ready.
    fn mixed_state() -> State {
        let mut state = State::new();
        enqueue(&mut state, 1_000, vec![spec("a"), spec("a"), spec("a")]);
        let grants = claim(&mut state, 1_000, "a", 2);
        apply(&mut state, 1_000, ack(1, grants[0].lease.token));
        enqueue(
            &mut state,
            1_000,
            vec![JobSpec { not_before_ms: Some(60_000), ..spec("a") }, spec("b")],
        );
        state
    }

    fn ids(jobs: Vec<Job>) -> Vec<u64> {
        jobs.iter().map(|job| job.id).collect()
    }

    #[test]
    fn jobs_filters_and_pages_by_id() {
        let state = mixed_state();
        let all = JobFilter::default();
        assert_eq!(ids(state.jobs(&all, 0, 100)), vec![1, 2, 3, 4, 5]);
        assert_eq!(ids(state.jobs(&all, 2, 2)), vec![3, 4]);
        assert_eq!(ids(state.jobs(&all, u64::MAX, 2)), Vec::<u64>::new());
        assert_eq!(ids(state.jobs(&all, 0, 0)), Vec::<u64>::new());
        let queue_a = JobFilter { queue: Some("a".into()), state: None };
        assert_eq!(ids(state.jobs(&queue_a, 0, 100)), vec![1, 2, 3, 4]);
        assert_eq!(ids(state.jobs(&queue_a, 1, 2)), vec![2, 3]);
        let ready = JobFilter { queue: None, state: Some(JobState::Ready) };
        assert_eq!(ids(state.jobs(&ready, 0, 100)), vec![3, 4, 5]);
        assert_eq!(ids(state.jobs(&ready, 3, 1)), vec![4]);
        let ready_b = JobFilter { queue: Some("b".into()), state: Some(JobState::Ready) };
        assert_eq!(ids(state.jobs(&ready_b, 0, 100)), vec![5]);
        let unknown = JobFilter { queue: Some("zzz".into()), state: None };
        assert!(state.jobs(&unknown, 0, 100).is_empty());
        for filter in [all, queue_a, ready, ready_b] {
            for job in state.jobs(&filter, 0, 100) {
                assert!(filter.matches(&job));
            }
        }
    }

    #[test]
    fn stats_count_per_queue_and_judge_due_at_the_later_clock() {
        let state = mixed_state();
        let stats = state.stats(0);
        assert_eq!(
            stats.get("a"),
            Some(&QueueStats { ready: 1, delayed: 1, claimed: 1, acked: 1, dead: 0 })
        );
        assert_eq!(stats.get("b").map(|s| s.ready), Some(1));
        assert_eq!(state.stats(60_000).get("a").map(|s| (s.ready, s.delayed)), Some((2, 0)));
        for now_ms in [0, 60_000] {
            for queue in ["a", "b"] {
                let all = state.stats(now_ms);
                assert_eq!(state.stats_of(queue, now_ms).as_ref(), all.get(queue), "{queue}");
            }
        }
        assert_eq!(state.stats_of("none", 0), None);
    }

    #[test]
    fn the_largest_queues_are_chosen_by_jobs_then_name() {
        let mut state = mixed_state();
        // "a" holds 4 jobs and "b" 1 (mixed_state); "c" and "d" 2 each.
        for queue in ["c", "c", "d", "d"] {
            enqueue_one(&mut state, 0, spec(queue));
        }
        let all = state.stats(0);
        let pick = |limit| {
            let (stats, queues) = state.largest_queue_stats(0, limit);
            assert_eq!(queues, all.len(), "every queue holding a job is counted");
            for (queue, counts) in &stats {
                assert_eq!(all.get(queue), Some(counts), "{queue} counted as stats() does");
            }
            stats.into_keys().collect::<Vec<_>>()
        };
        assert_eq!(pick(1), ["a"]);
        // Of "c" and "d" (two jobs each), "c" comes first by name.
        assert_eq!(pick(2), ["a", "c"]);
        assert_eq!(pick(3), ["a", "c", "d"]);
        assert_eq!(pick(10), ["a", "b", "c", "d"]);
        assert!(pick(0).is_empty());
    }

    #[test]
    fn due_and_expiry_hints() {
        let state = mixed_state();
        assert_eq!(state.next_due_ms("a"), Some(60_000));
        assert_eq!(state.next_due_ms("b"), None);
        assert_eq!(state.next_due_ms("none"), None);
        assert_eq!(state.next_expiry_ms(0), Some(1_000 + TTL_MS));
        assert!(state.has_claimable("a", &[], 0));
        assert!(!state.has_claimable("none", &[], 0));

        let mut drained = state.clone();
        claim(&mut drained, 1_000, "a", 10);
        assert!(!drained.has_claimable("a", &[], 59_999));
        assert!(drained.has_claimable("a", &[], 60_000));
    }
}

mod snapshot {
    use super::*;

    #[test]
    fn a_round_trip_preserves_equality_and_behaviour() {
        let mut state = State::new();
        enqueue(&mut state, 1_000, vec![keyed("q", "k"), spec("q"), spec("r"), spec("q")]);
        let grants = claim(&mut state, 1_000, "q", 2);
        apply(&mut state, 1_000, ack(grants[0].job.id, grants[0].lease.token));

        let bytes = bincode::serialize(&state).expect("a state serializes");
        let mut restored: State = bincode::deserialize(&bytes).expect("and deserializes");
        assert_eq!(restored, state);
        assert_eq!(restored.check_invariants(), Ok(()));
        assert_eq!(bincode::serialize(&restored).expect("serializes"), bytes);

        for command in [
            Command::Enqueue { jobs: vec![keyed("q", "k")] },
            claim_command("q", 5, &[]),
            Command::Sweep,
        ] {
            let proposal = Proposal { now_ms: 100_000, command };
            assert_eq!(restored.apply(3, &proposal), state.apply(3, &proposal));
            assert_eq!(restored, state);
        }
    }

    /// The state as versions before the compact job form wrote it: derived
    /// serde over a table of whole [`Job`]s.
    #[derive(Serialize, Deserialize)]
    struct WrittenBefore {
        cluster_time_ms: u64,
        last_token: u64,
        last_job_id: u64,
        jobs: BTreeMap<u64, Job>,
        schedules: BTreeMap<String, Schedule>,
        nodes: BTreeMap<u64, NodeInfo>,
        epoch: u64,
        grace_end_ms: u64,
        requests: requests::RequestLog,
    }

    /// A state whose jobs use every field the compact form keeps apart:
    /// tags, keys, a result, a last error, leases, odd settings.
    fn varied_state() -> State {
        let mut state = State::new();
        let odd = JobSpec {
            payload: b"payload".to_vec(),
            priority: -3,
            max_attempts: Some(2),
            backoff: Some(Backoff { base_ms: 10, cap_ms: 20 }),
            lease_ttl_ms: Some(5_000),
            tags: vec!["gpu".into(), "eu".into()],
            ..keyed("q", "k")
        };
        enqueue(&mut state, 1_000, vec![odd, spec("q"), spec("r"), keyed("q", "k2"), spec("q")]);
        let grants = claim(&mut state, 1_000, "q", 3);
        let result = Some(b"out".to_vec());
        let (first, second) = (&grants[0], &grants[1]);
        apply(
            &mut state,
            1_100,
            Command::Ack { job_id: first.job.id, token: first.lease.token, result },
        );
        let nack = Command::Nack {
            job_id: second.job.id,
            token: second.lease.token,
            error: "boom".into(),
            retry_after_ms: None,
        };
        apply(&mut state, 1_200, nack);
        state
    }

    #[test]
    fn the_compact_form_writes_the_bytes_the_whole_jobs_wrote_and_reads_them() {
        let state = varied_state();
        let bytes = bincode::serialize(&state).expect("serializes");
        let before: WrittenBefore = bincode::deserialize(&bytes).expect("the old layout reads it");
        assert_eq!(before.jobs.len(), 5);
        for (id, job) in &before.jobs {
            assert_eq!(Some(job), state.job(*id).as_ref(), "job {id} as written");
        }
        let old_bytes = bincode::serialize(&before).expect("serializes");
        assert_eq!(old_bytes, bytes, "byte for byte the old layout");
        let loaded: State = bincode::deserialize(&old_bytes).expect("an old snapshot loads");
        assert_eq!(loaded, state);
        assert_eq!(loaded.check_invariants(), Ok(()));
    }

    #[test]
    fn jobs_read_as_a_map_in_any_order_the_last_of_a_repeated_id_winning() {
        // Jobs are turned into their compact form as they are read; what a
        // map of them read (any order, a repeated key replacing the one
        // before) must not change. The table's length is written as a
        // map's: a count, then the entries.
        let state = varied_state();
        let bytes = bincode::serialize(&state).expect("serializes");
        let mut before: WrittenBefore = bincode::deserialize(&bytes).expect("reads");
        let jobs: Vec<(u64, Job)> = std::mem::take(&mut before.jobs).into_iter().collect();
        let (first, last) = (jobs[0].clone(), jobs[jobs.len() - 1].clone());
        let mut shuffled: Vec<(u64, Job)> = jobs.into_iter().rev().collect();
        // The first job again, under the last one's id: it must replace it.
        shuffled.push((last.0, Job { id: last.0, ..first.1.clone() }));
        let written = bincode::serialize(&(
            (before.cluster_time_ms, before.last_token, before.last_job_id),
            &shuffled,
            (&before.schedules, &before.nodes, before.epoch, before.grace_end_ms),
            &before.requests,
        ))
        .expect("serializes");
        let loaded: State = bincode::deserialize(&written).expect("deserializes");
        let expected: BTreeMap<u64, Job> = shuffled.into_iter().collect();
        assert_eq!(loaded.jobs.len(), expected.len());
        for (id, job) in &expected {
            assert_eq!(loaded.job(*id).as_ref(), Some(job), "job {id}");
        }
    }

    #[test]
    fn jobs_of_one_queue_share_the_name_and_common_settings_take_no_side_part() {
        let state = varied_state();
        let bytes = bincode::serialize(&state).expect("serializes");
        let loaded: State = bincode::deserialize(&bytes).expect("deserializes");
        for state in [&state, &loaded] {
            // The live jobs of queue q (job 2, acked, is a record that
            // names its queue in its own bytes).
            let names: Vec<_> = [1, 5]
                .iter()
                .map(|id| Arc::clone(&state.jobs.live(id).expect("retained").queue))
                .collect();
            assert!(
                names.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])),
                "one allocation per queue"
            );
            assert!(
                state.jobs.get(&3).expect("retained").is_plain(),
                "a ready job with defaults is stored plain"
            );
            assert!(
                !state.jobs.get(&2).expect("retained").is_plain(),
                "a tombstone keeps its lease apart"
            );
            assert!(
                state.jobs.live(&2).is_none() && state.jobs.tombs().get(2).is_some(),
                "a tombstone is kept as a record, not as a live job"
            );
        }
    }
}

/// Item by item, every sum `apply` computes, fed the largest values a
/// command or a clock can carry: each must saturate (or be refused as a
/// value), never panic in a debug build or wrap in a release one.
mod extremes {
    use super::*;
    use crate::schedule::{JobTemplate, Overlap, ScheduleSpec, SkipReason, TickOutcome};

    const MAX_TTL_MS: u64 = 12 * 60 * 60 * 1_000;

    fn schedule(state: &mut State, now_ms: u64) {
        let spec = ScheduleSpec {
            name: "s".into(),
            cron: "* * * * * *".into(),
            template: JobTemplate { command: Some("true".into()), ..JobTemplate::default() },
            overlap: Overlap::Allow,
            ..ScheduleSpec::default()
        };
        assert_eq!(apply(state, now_ms, Command::PutSchedule { spec }), Response::ScheduleChanged);
    }

    fn skip(bucket: u64, ticks: u64) -> Command {
        Command::Skip { schedule: "s".into(), bucket, reason: SkipReason::Catchup, ticks }
    }

    /// The sum the issue names: `Skip.ticks` added to `skipped_count`.
    /// Two skips of `u64::MAX` ticks each leave the counter at `u64::MAX`.
    #[test]
    fn skipped_ticks_saturate_the_counter() {
        let mut state = State::new();
        schedule(&mut state, 1_000);
        for bucket in [1, 2, 3] {
            let answer = apply(&mut state, 1_000, skip(bucket, u64::MAX));
            let expected = TickOutcome::Skipped { reason: SkipReason::Catchup, ticks: u64::MAX };
            assert_eq!(answer, Response::Tick(Some(expected)));
        }
        let counted = state.schedule("s").map(|s| s.skipped_count);
        assert_eq!(counted, Some(u64::MAX));
    }

    /// Fires saturate their counter too; no run of fires reaches 2^64, so
    /// the counter starts at the edge.
    #[test]
    fn fired_ticks_saturate_the_counter() {
        let mut state = State::new();
        schedule(&mut state, 1_000);
        if let Some(schedule) = state.schedules.get_mut("s") {
            schedule.fired_count = u64::MAX;
        }
        let fire = Command::Fire { schedule: "s".into(), bucket: 5, targets: vec![] };
        let answer = apply(&mut state, 10_000, fire);
        assert!(matches!(answer, Response::Tick(Some(TickOutcome::Fired { .. }))), "{answer:?}");
        assert_eq!(state.schedule("s").map(|s| s.fired_count), Some(u64::MAX));
    }

    /// A bucket of `u64::MAX` seconds is far past any clock: its instant
    /// (`bucket * 1000`) saturates, the lag is 0, and the bucket still
    /// fires once. A trigger at the end of time names its manual run
    /// without overflowing either.
    #[test]
    fn the_largest_bucket_fires_once_and_triggers_still_work_at_the_end_of_time() {
        let mut state = State::new();
        schedule(&mut state, 1_000);
        let fire = Command::Fire { schedule: "s".into(), bucket: u64::MAX, targets: vec![] };
        let answer = apply(&mut state, u64::MAX, fire.clone());
        let Response::Tick(Some(TickOutcome::Fired { lag_ms, .. })) = answer else {
            panic!("expected a fire, got {answer:?}")
        };
        assert_eq!(lag_ms, 0);
        assert_eq!(apply(&mut state, u64::MAX, fire), Response::Tick(None));
        assert_eq!(apply(&mut state, u64::MAX, skip(u64::MAX, u64::MAX)), Response::Tick(None));
        let trigger = Command::Trigger { schedule: "s".into(), force: true, targets: vec![] };
        let answer = apply(&mut state, u64::MAX, trigger);
        assert!(matches!(answer, Response::Tick(Some(TickOutcome::Fired { .. }))), "{answer:?}");
    }

    /// Leases granted or renewed at the end of time, with the longest ttl,
    /// expire at `u64::MAX` (not before they were granted); a sweep there
    /// takes them back.
    #[test]
    fn leases_at_the_end_of_time_saturate_their_expiry() {
        let mut state = State::new();
        let id = enqueue_one(
            &mut state,
            u64::MAX,
            JobSpec { lease_ttl_ms: Some(MAX_TTL_MS), ..spec("q") },
        );
        let lease = claim_one(&mut state, u64::MAX, "q");
        assert_eq!((lease.granted_at_ms, lease.expires_at_ms), (u64::MAX, u64::MAX));
        let answer =
            apply(&mut state, u64::MAX, refresh(vec![(id, lease.token)], Some(MAX_TTL_MS)));
        let Response::Refreshed { renewed, lost } = answer else {
            panic!("expected a refresh, got {answer:?}")
        };
        assert_eq!((renewed.len(), lost.len()), (1, 0));
        assert_eq!(renewed[0].expires_at_ms, u64::MAX);
        let swept = apply(&mut state, u64::MAX, Command::Sweep);
        assert_eq!(swept, Response::Swept { requeued: vec![id], dead: vec![] });
    }

    /// A new term that starts at the end of time ends its grace there too.
    #[test]
    fn a_term_starting_at_the_end_of_time_saturates_its_grace() {
        let mut state = State::new();
        state.apply(1, &Proposal { now_ms: 1_000, command: Command::Sweep });
        state.apply(u64::MAX, &Proposal { now_ms: u64::MAX, command: Command::Sweep });
        assert_eq!(state.grace_end_ms(), u64::MAX);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    /// The largest retry delays, from the command or from a backoff whose
    /// base and cap are `u64::MAX`, push `not_before_ms` to `u64::MAX`;
    /// the largest priorities of both signs still order claims.
    #[test]
    fn huge_delays_and_priorities_saturate() {
        let mut state = State::new();
        let huge = Backoff { base_ms: u64::MAX, cap_ms: u64::MAX };
        let slow = JobSpec {
            backoff: Some(huge),
            max_attempts: Some(1_000),
            priority: i32::MAX,
            not_before_ms: Some(u64::MAX - 1),
            ..spec("q")
        };
        let low = JobSpec { priority: i32::MIN, ..spec("q") };
        let ids: Vec<u64> =
            enqueue(&mut state, 0, vec![slow, low]).iter().map(|o| o.job_id).collect();
        // Not due yet: the low-priority job is granted first.
        assert_eq!(claim_one(&mut state, u64::MAX - 2, "q").job_id, ids[1]);
        let lease = claim_one(&mut state, u64::MAX - 1, "q");
        assert_eq!(lease.job_id, ids[0]);
        let answer = apply(&mut state, u64::MAX - 1, nack(ids[0], lease.token, None));
        assert_eq!(answer, Response::Nacked { state: JobState::Ready, not_before_ms: u64::MAX });
        let lease = claim_one(&mut state, u64::MAX, "q");
        let answer = apply(&mut state, u64::MAX, nack(ids[0], lease.token, Some(u64::MAX)));
        assert_eq!(answer, Response::Nacked { state: JobState::Ready, not_before_ms: u64::MAX });
    }

    /// A tombstone finished near the end of time keeps its key until the
    /// end of time: its retention saturates to `u64::MAX` instead of
    /// wrapping to "long ago" and being purged at once.
    #[test]
    fn retention_at_the_end_of_time_saturates() {
        let mut state = State::new();
        let id = enqueue_one(&mut state, u64::MAX - 2, spec("q"));
        let lease = claim_one(&mut state, u64::MAX - 2, "q");
        assert_eq!(apply(&mut state, u64::MAX - 2, ack(id, lease.token)), Response::Acked);
        assert_eq!(apply(&mut state, u64::MAX - 1, Command::Purge), Response::Purged(0));
        assert!(!state.has_purgeable(u64::MAX - 1));
        assert!(state.has_purgeable(u64::MAX));
        assert_eq!(apply(&mut state, u64::MAX, Command::Purge), Response::Purged(1));
    }

    /// When the token counter is spent a claim grants nothing rather than
    /// wrap to a reused token; when the id counter is spent an enqueue is
    /// refused as a value.
    #[test]
    fn spent_counters_refuse_instead_of_wrapping() {
        let mut state = State::new();
        enqueue(&mut state, 1_000, vec![spec("q"), spec("q")]);
        state.last_token = u64::MAX - 1;
        let grants = claim(&mut state, 1_000, "q", 2);
        assert_eq!(grants.iter().map(|g| g.lease.token).collect::<Vec<_>>(), vec![u64::MAX]);
        assert!(claim(&mut state, 1_000, "q", 2).is_empty());

        state.last_job_id = u64::MAX - 1;
        let before = state.clone();
        let answer =
            apply(&mut state, 1_000, Command::Enqueue { jobs: vec![spec("q"), spec("q")] });
        let Response::Refused(Refusal::Invalid(error)) = answer else {
            panic!("expected a refusal, got {answer:?}")
        };
        assert_eq!(error.problem, "job id space exhausted");
        assert_eq!(state, before);
        let last = enqueue_one(&mut state, 1_000, spec("q"));
        assert_eq!(last, u64::MAX);
    }
}

mod ruled {
    //! Entries the leader wrapped in the limits of its build: replicas of
    //! builds whose `Limits::default()` differ still apply them alike.
    use super::*;

    /// A newer build that raised some limits and changed some defaults.
    fn newer_build() -> Limits {
        Limits {
            max_payload_bytes: 512 * 1024,
            max_error_bytes: 8 * 1024,
            default_max_attempts: 9,
            default_lease_ttl_ms: 45_000,
            ..Limits::default()
        }
    }

    /// A log as a leader of the newer build writes it (unwrapped: as a
    /// leader from before `Ruled` would have).
    fn log(ruled: bool) -> Vec<Proposal> {
        let commands = vec![
            Command::Enqueue {
                jobs: vec![JobSpec { payload: vec![7; 300 * 1024], ..spec("q") }, spec("q")],
            },
            claim_command("q", 2, &[]),
            Command::Nack {
                job_id: 2,
                token: 2,
                error: "e".repeat(6 * 1024),
                retry_after_ms: None,
            },
            Command::PutSchedule {
                spec: crate::schedule::ScheduleSpec {
                    name: "nightly".to_owned(),
                    cron: "0 0 3 * * *".to_owned(),
                    // A zone some other build's database may lack: judged by
                    // the proposer, never at apply.
                    timezone: "Nowhere/Utopia".to_owned(),
                    ..crate::schedule::ScheduleSpec::default()
                },
            },
        ];
        commands
            .into_iter()
            .enumerate()
            .map(|(index, command)| Proposal {
                now_ms: 1_000 * (index as u64 + 1),
                command: if ruled {
                    Command::Ruled { limits: newer_build(), command: Box::new(command) }
                } else {
                    command
                },
            })
            .collect()
    }

    fn replay(log: &[Proposal], build: &Limits) -> State {
        let mut state = State::new();
        for proposal in log {
            state.apply_as_built_with(EPOCH, proposal, build);
            state.check_invariants().expect("invariants hold");
        }
        state
    }

    #[test]
    fn replicas_of_builds_with_different_limits_agree_on_ruled_entries() {
        let newer = replay(&log(true), &newer_build());
        let older = replay(&log(true), &Limits::default());
        assert_eq!(newer, older, "one log, one state, whatever the build");
        // The newer build's limits and defaults are the ones in force.
        assert_eq!(older.job(1).map(|job| job.payload.len()), Some(300 * 1024));
        assert_eq!(older.job(2).map(|job| job.max_attempts), Some(9));
        let error = older.job(2).and_then(|job| job.last_error.clone()).unwrap_or_default();
        assert_eq!(error.len(), 6 * 1024, "not cut to the older build's 4 KiB");
        assert!(older.schedules().contains_key("nightly"));
    }

    #[test]
    fn the_same_log_unruled_splits_replicas_of_the_two_builds() {
        // What the wrapper prevents: each build judges by its own defaults.
        let newer = replay(&log(false), &newer_build());
        let older = replay(&log(false), &Limits::default());
        assert_ne!(newer, older);
        assert_eq!(newer.job(1).map(|job| job.payload.len()), Some(300 * 1024));
        assert!(older.job(1).is_none(), "the older build refused the 300 KiB payload");
    }

    #[test]
    fn only_the_outermost_command_is_ruled() {
        let ruled = |command: Command| Command::Ruled {
            limits: Limits::default(),
            command: Box::new(command),
        };
        let mut state = State::new();
        let nested = ruled(ruled(Command::Enqueue { jobs: vec![spec("q")] }));
        assert!(matches!(apply(&mut state, 1_000, nested), Response::Refused(Refusal::Invalid(_))));
        let in_batch = ruled(Command::Batch {
            commands: vec![ruled(Command::Enqueue { jobs: vec![spec("q")] })],
        });
        assert!(matches!(
            apply(&mut state, 1_000, in_batch),
            Response::Refused(Refusal::Invalid(_))
        ));
        let bare_in_batch =
            Command::Batch { commands: vec![ruled(Command::Enqueue { jobs: vec![spec("q")] })] };
        assert!(matches!(
            apply(&mut state, 1_000, bare_in_batch),
            Response::Refused(Refusal::Invalid(_))
        ));
        assert_eq!(state.last_job_id(), 0, "nothing was enqueued");
        let fine =
            ruled(Command::Batch { commands: vec![Command::Enqueue { jobs: vec![spec("q")] }] });
        assert!(matches!(apply(&mut state, 1_000, fine), Response::Batch(_)));
        assert_eq!(state.last_job_id(), 1);
    }
}

proptest::proptest! {
    /// The two-sided count agrees with counting the range, whichever side
    /// is the smaller and wherever the pivot falls (members, gaps, ends).
    #[test]
    fn counting_up_to_a_pivot_agrees_with_the_range(
        members in proptest::collection::btree_set((0u64..50, 0u64..4), 0..200),
        pivot in (0u64..52, 0u64..5),
    ) {
        let expected = members.range(..=pivot).count();
        proptest::prop_assert_eq!(count_up_to(&members, &pivot), expected);
    }
}

/// `apply` decides by these constants, and they travel in no entry
/// (unlike the limits a `Ruled` entry carries): replicas of two
/// builds that differ in one would apply the same entry differently.
/// Changing one needs a new log format, written only once every member
/// reads it (see `LOG_FORMAT`); this pins them so that it cannot
/// happen by accident.
#[test]
fn the_constants_apply_decides_by_are_pinned() {
    use crate::command::{MAX_BATCH_COMMANDS, MAX_CLOCK_OFFSET_MS};
    use crate::{schedule, state, validate};
    assert_eq!(MAX_BATCH_COMMANDS, 256);
    assert_eq!(MAX_CLOCK_OFFSET_MS, 60_000);
    assert_eq!(validate::MAX_COMMAND_BYTES, 64 * 1024);
    assert_eq!(validate::MAX_CATCHUP, 1_000);
    assert_eq!(validate::QUEUE_NAME_PATTERN, "[a-z0-9][a-z0-9._-]{0,63}");
    assert_eq!(schedule::HISTORY_LEN, 100);
    assert_eq!(state::TERM_START_GRACE_MS, 5_000);
    assert_eq!(super::requests::REQUEST_WINDOW_MS, 10 * 60 * 1_000);
    assert_eq!(super::requests::MAX_REMEMBERED_REQUESTS, 100_000);
}

/// A resume records the ticks a paused schedule had without a record (the
/// pool on the broadcast path, or no leader planning), so the leader does
/// not plan them as missed and run them by the catch-up policy.
mod resume {
    use super::*;
    use crate::cron;
    use crate::schedule::{
        Catchup, Schedule, ScheduleSpec, SkipReason, TickOutcome, TickPlan, plan_ticks,
        resume_command,
    };

    /// 2026-01-01 00:00 UTC.
    const T0_MS: u64 = 1_767_225_600_000;
    const MINUTE_MS: u64 = 60_000;

    /// Every minute, a missed tick of the last ten minutes run once.
    fn put(state: &mut State) {
        let spec = ScheduleSpec {
            name: "s".into(),
            cron: "* * * * *".into(),
            catchup: Catchup::Coalesce,
            catchup_window_ms: 10 * MINUTE_MS,
            ..ScheduleSpec::default()
        };
        assert_eq!(apply(state, T0_MS, Command::PutSchedule { spec }), Response::ScheduleChanged);
    }

    fn pause(state: &mut State, now_ms: u64) {
        let command = Command::SetPaused { name: "s".into(), paused: true };
        assert_eq!(apply(state, now_ms, command), Response::ScheduleChanged);
    }

    fn read(state: &State) -> Schedule {
        state.schedule("s").cloned().unwrap_or_else(|| panic!("no schedule"))
    }

    fn plan(state: &State, now_ms: u64) -> Vec<TickPlan> {
        let cron = cron::parse("* * * * *", "").unwrap_or_else(|e| panic!("{e}"));
        plan_ticks(&read(state), &cron, now_ms, 2_000)
    }

    fn resume(counted_after_ms: u64, through_ms: u64, ticks: u64) -> Command {
        Command::ResumeSchedule {
            name: "s".into(),
            counted_after_ms,
            paused_through: through_ms / 1_000,
            paused_ticks: ticks,
        }
    }

    /// Paused for five ticks that nobody recorded, then resumed 30 s past
    /// the last: a plain resume leaves them to the leader's plan, whose
    /// catch-up runs the newest at once; the resume records them as
    /// paused, and nothing runs before the next tick.
    #[test]
    fn the_ticks_due_while_paused_are_recorded_and_not_caught_up() {
        let resumed_ms = T0_MS + 5 * MINUTE_MS + 30_000;
        let mut plain = State::new();
        put(&mut plain);
        pause(&mut plain, T0_MS + 10_000);
        let command = Command::SetPaused { name: "s".into(), paused: false };
        assert_eq!(apply(&mut plain, resumed_ms, command), Response::ScheduleChanged);
        let caught_up = plan(&plain, resumed_ms + 25);
        assert!(
            caught_up.contains(&TickPlan::Fire((T0_MS + 5 * MINUTE_MS) / 1_000)),
            "{caught_up:?}"
        );

        let mut state = State::new();
        put(&mut state);
        pause(&mut state, T0_MS + 10_000);
        let command = resume_command("s", state.schedule("s"), resumed_ms);
        let through_ms = T0_MS + 5 * MINUTE_MS;
        assert_eq!(command, resume(T0_MS, through_ms, 5));
        assert_eq!(apply(&mut state, resumed_ms, command), Response::ScheduleChanged);
        let schedule = read(&state);
        assert!(!schedule.spec.paused);
        assert_eq!(schedule.last_fired_bucket, through_ms / 1_000);
        let last = schedule.history.back().map(|record| (record.bucket, record.outcome.clone()));
        let paused = TickOutcome::Skipped { reason: SkipReason::Paused, ticks: 5 };
        assert_eq!(last, Some((through_ms / 1_000, paused)));
        assert_eq!(plan(&state, resumed_ms + 25), Vec::new(), "nothing is due until the next tick");
        let next = T0_MS + 6 * MINUTE_MS;
        assert_eq!(plan(&state, next + 25), vec![TickPlan::Fire(next / 1_000)]);
    }

    /// A resume that finds the schedule running (resumed by another call
    /// since the proposer read it) records nothing: its due ticks are its
    /// own to run.
    #[test]
    fn a_running_schedule_keeps_its_due_ticks() {
        let mut state = State::new();
        put(&mut state);
        let now_ms = T0_MS + MINUTE_MS + 500;
        let command = resume(T0_MS, T0_MS + MINUTE_MS, 1);
        assert_eq!(apply(&mut state, now_ms, command), Response::ScheduleChanged);
        assert_eq!(read(&state).last_fired_bucket, 0);
        assert!(read(&state).history.is_empty());
        assert_eq!(plan(&state, now_ms), vec![TickPlan::Fire((T0_MS + MINUTE_MS) / 1_000)]);
    }

    /// Ticks counted from a plan the schedule has left (the leader recorded
    /// some since the proposer read it) are not recorded: the count would
    /// be stale, and the mark could go back. The schedule is resumed all
    /// the same.
    #[test]
    fn a_stale_count_records_nothing() {
        let mut state = State::new();
        put(&mut state);
        pause(&mut state, T0_MS + 100);
        let now_ms = T0_MS + 3 * MINUTE_MS + 500;
        let counted = resume_command("s", state.schedule("s"), now_ms);
        assert_eq!(counted, resume(T0_MS, T0_MS + 3 * MINUTE_MS, 3));
        // Meanwhile the leader records the first two paused ticks.
        let skip = Command::Skip {
            schedule: "s".into(),
            bucket: (T0_MS + 2 * MINUTE_MS) / 1_000,
            reason: SkipReason::Paused,
            ticks: 2,
        };
        assert!(matches!(apply(&mut state, now_ms, skip), Response::Tick(Some(_))));
        assert_eq!(apply(&mut state, now_ms, counted), Response::ScheduleChanged);
        let schedule = read(&state);
        assert!(!schedule.spec.paused);
        assert_eq!(schedule.last_fired_bucket, (T0_MS + 2 * MINUTE_MS) / 1_000);
        assert_eq!(schedule.skipped_count, 2, "no tick counted twice");
    }

    /// Nothing after the entry's own time (a proposer whose clock runs
    /// ahead) and nothing from before the instant counted after (the put)
    /// is recorded; the schedule is resumed all the same. An unknown name
    /// is refused.
    #[test]
    fn no_tick_after_the_entry_or_before_the_put_is_recorded() {
        for (through_ms, now_ms) in [(T0_MS + MINUTE_MS, T0_MS + 59_000), (T0_MS, T0_MS + 500)] {
            let mut state = State::new();
            put(&mut state);
            pause(&mut state, T0_MS + 100);
            let command = resume(T0_MS, through_ms, 1);
            assert_eq!(apply(&mut state, now_ms, command), Response::ScheduleChanged);
            assert!(!read(&state).spec.paused);
            assert_eq!(read(&state).last_fired_bucket, 0, "through {through_ms}");
        }
        let mut state = State::new();
        let command = resume_command("gone", None, T0_MS);
        assert_eq!(
            command,
            Command::ResumeSchedule {
                name: "gone".into(),
                counted_after_ms: 0,
                paused_through: 0,
                paused_ticks: 0
            }
        );
        assert!(matches!(apply(&mut state, T0_MS, command), Response::Refused(_)));
    }
}
