//! Requests answered once: a claim or a manual trigger that a client
//! retries because it never heard the answer (a timeout, a broken
//! connection) is answered with what the first one did, instead of granting
//! a second lease or firing a second run.
//!
//! A request is named by its client (`request_id`, scoped by the worker or
//! the schedule) and remembered for [`REQUEST_WINDOW_MS`] of cluster time,
//! and at most [`MAX_REMEMBERED_REQUESTS`] at once (the oldest are forgotten
//! first), so the memory is bounded whatever clients send. A claim that
//! granted nothing is not remembered: its retry may claim afresh.

use imbl::OrdSet;
use serde::{Deserialize, Serialize, Serializer};

use super::State;
use crate::job::JobState;
use crate::limits::Limits;
use crate::response::{Grant, Response};

/// How long (cluster time) a request's answer is remembered.
pub const REQUEST_WINDOW_MS: u64 = 10 * 60 * 1_000;
/// Most requests remembered at once.
pub const MAX_REMEMBERED_REQUESTS: usize = 100_000;

/// What the first of a request's tries did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
    /// The leases a claim granted, as `(job id, token)`.
    Claimed(Vec<(u64, u64)>),
    /// A trigger's answer.
    Triggered(Box<Response>),
}

/// The remembered requests, by key and by age. Persistent (structurally
/// shared) collections: a snapshot's freeze copies the log in O(1) instead
/// of cloning up to [`MAX_REMEMBERED_REQUESTS`] keys under the state lock,
/// and they serialize as the B-tree collections they replaced did (a
/// length, then the entries in key order).
///
/// The keys are looked up on every claim, on every replica, so `by_key` is
/// a hash map: a lookup hashes the key once and compares it once, where an
/// ordered map of 100,000 keys that share their worker's prefix compared it
/// about seventeen times. Its hasher is keyed at random in each process, so
/// clients cannot pick ids that collide; its order never leaves memory, since
/// [`sorted`] writes the entries in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RequestLog {
    #[serde(serialize_with = "sorted")]
    by_key: ByKey,
    by_age: OrdSet<(u64, String)>,
}

/// Keyed at random (std's `RandomState`) in each process.
type ByKey = imbl::HashMap<String, (u64, Outcome)>;

/// `map` as a map in key order: the bytes an ordered map of the same
/// entries writes, whatever the hasher's order.
fn sorted<S: Serializer>(map: &ByKey, serializer: S) -> Result<S::Ok, S::Error> {
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    serializer.collect_map(entries)
}

impl RequestLog {
    fn forget_old(&mut self, now_ms: u64) {
        let horizon = now_ms.saturating_sub(REQUEST_WINDOW_MS);
        while let Some((at_ms, key)) = self.by_age.get_min().cloned() {
            if at_ms >= horizon && self.by_age.len() < MAX_REMEMBERED_REQUESTS {
                break;
            }
            self.by_age.remove_min();
            self.by_key.remove(&key);
        }
    }

    fn remember(&mut self, key: String, at_ms: u64, outcome: Outcome) {
        self.by_age.insert((at_ms, key.clone()));
        self.by_key.insert(key, (at_ms, outcome));
    }

    /// How many requests are remembered.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}

fn key(scope: &str, request_id: &str) -> String {
    format!("{}:{scope}\u{0}{request_id}", scope.len())
}

impl State {
    /// A claim named `request_id` by `worker`: the first answer again when
    /// it was already granted, else a claim as usual (see the module doc).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn claim_once(
        &mut self,
        epoch: u64,
        request_id: &str,
        worker: &str,
        queue: &str,
        max: u32,
        lease_ttl_ms: Option<u64>,
        selector: &[String],
    ) -> Response {
        let now_ms = self.cluster_time_ms;
        self.requests.forget_old(now_ms);
        let key = key(worker, request_id);
        if let Some((_, Outcome::Claimed(granted))) = self.requests.by_key.get(&key) {
            // Only what it still holds under those tokens: a lease that
            // lapsed since (or was given up) is not handed out again. And
            // only jobs of the queue this try names: the node checked the
            // caller's right to that queue, not to the first try's (a
            // worker must not replay an executor's claim on a command queue
            // by naming its worker and request id). Nothing here changes
            // the state, so replicas agree whatever their version answers.
            let grants = granted
                .iter()
                .filter_map(|(job_id, token)| {
                    let job = self
                        .jobs
                        .live(job_id)
                        .filter(|job| job.state == JobState::Claimed && *job.queue == *queue)?;
                    let lease = job.lease().filter(|lease| lease.token == *token)?;
                    Some(Grant { job: job.to_job(*job_id), lease: lease.clone() })
                })
                .collect();
            return Response::Claimed(grants);
        }
        let response = self.claim(epoch, worker, queue, max, lease_ttl_ms, selector);
        if let Response::Claimed(grants) = &response
            && !grants.is_empty()
        {
            let granted = grants.iter().map(|g| (g.lease.job_id, g.lease.token)).collect();
            self.requests.remember(key, now_ms, Outcome::Claimed(granted));
        }
        response
    }

    /// A manual trigger named `request_id`: the first answer again when it
    /// was already applied, else a trigger as usual.
    pub(super) fn trigger_once(
        &mut self,
        request_id: &str,
        schedule: &str,
        force: bool,
        targets: &[u64],
        limits: &Limits,
    ) -> Response {
        let now_ms = self.cluster_time_ms;
        self.requests.forget_old(now_ms);
        let key = key(&format!("{}{schedule}", crate::validate::TRIGGER_SCOPE_PREFIX), request_id);
        if let Some((_, Outcome::Triggered(response))) = self.requests.by_key.get(&key) {
            return (**response).clone();
        }
        let response = self.trigger(schedule, force, targets, limits);
        self.requests.remember(key, now_ms, Outcome::Triggered(Box::new(response.clone())));
        response
    }

    /// Whether a claim named `request_id` by `worker` granted leases and is
    /// still remembered: its retry is answered from the log, so it must be
    /// proposed even when the queue holds nothing claimable any more (the
    /// first try took the job).
    pub fn remembers_claim(&self, worker: &str, request_id: &str) -> bool {
        matches!(self.requests.by_key.get(&key(worker, request_id)), Some((_, Outcome::Claimed(_))))
    }

    /// How many leases the remembered claim `request_id` of `worker`
    /// granted (a retry is answered with those still held), 0 when none
    /// is remembered.
    pub fn remembered_claim_leases(&self, worker: &str, request_id: &str) -> usize {
        match self.requests.by_key.get(&key(worker, request_id)) {
            Some((_, Outcome::Claimed(granted))) => granted.len(),
            _ => 0,
        }
    }

    /// How many claims and triggers are remembered for retries.
    pub fn remembered_requests(&self) -> usize {
        self.requests.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Proposal};
    use crate::job::JobSpec;

    fn apply(state: &mut State, now_ms: u64, command: Command) -> Response {
        state.apply(1, &Proposal { now_ms, command })
    }

    fn claim(request_id: &str, worker: &str) -> Command {
        Command::ClaimOnce {
            request_id: request_id.into(),
            worker: worker.into(),
            queue: "q".into(),
            max: 1,
            lease_ttl_ms: None,
            selector: vec![],
        }
    }

    fn grants(response: &Response) -> Vec<(u64, u64)> {
        match response {
            Response::Claimed(grants) => {
                grants.iter().map(|g| (g.lease.job_id, g.lease.token)).collect()
            }
            other => panic!("not a claim answer: {other:?}"),
        }
    }

    fn enqueue(state: &mut State, count: usize) {
        let jobs =
            (0..count).map(|_| JobSpec { queue: "q".into(), ..JobSpec::default() }).collect();
        apply(state, 1_000, Command::Enqueue { jobs });
    }

    #[test]
    fn a_retried_claim_gets_the_first_lease_not_a_second() {
        let mut state = State::new();
        enqueue(&mut state, 2);
        let first = apply(&mut state, 2_000, claim("r-1", "w"));
        assert_eq!(grants(&first), vec![(1, 1)]);
        assert_eq!(state.remembered_claim_leases("w", "r-1"), 1);
        assert_eq!(state.remembered_claim_leases("w", "r-9"), 0);
        let retry = apply(&mut state, 2_500, claim("r-1", "w"));
        assert_eq!(retry, first, "the retry is answered with the first lease");
        assert_eq!(state.last_token(), 1, "no second token was issued");
        assert_eq!(state.jobs(&crate::JobFilter::default(), 0, 10).len(), 2);
        let other_worker = apply(&mut state, 2_600, claim("r-1", "v"));
        assert_eq!(grants(&other_worker), vec![(2, 2)], "ids are scoped by worker");
        let fresh = apply(&mut state, 2_700, claim("r-2", "w"));
        assert_eq!(grants(&fresh), Vec::<(u64, u64)>::new(), "nothing left for a new request");
        apply(&mut state, 2_800, Command::Ack { job_id: 1, token: 1, result: None });
        let after_ack = apply(&mut state, 2_900, claim("r-1", "w"));
        assert_eq!(
            grants(&after_ack),
            Vec::<(u64, u64)>::new(),
            "a finished lease is not handed out"
        );
    }

    #[test]
    fn a_retry_naming_another_queue_gets_none_of_the_first_tries_leases() {
        let mut state = State::new();
        let command = JobSpec { queue: "exec.story".into(), ..JobSpec::default() };
        apply(&mut state, 1_000, Command::Enqueue { jobs: vec![command] });
        enqueue(&mut state, 1);
        let on_commands = Command::ClaimOnce {
            request_id: "r-1".into(),
            worker: "executor".into(),
            queue: "exec.story".into(),
            max: 1,
            lease_ttl_ms: None,
            selector: vec![],
        };
        let first = apply(&mut state, 2_000, on_commands.clone());
        assert_eq!(grants(&first), vec![(1, 1)]);
        // The node let this try through for queue "q" only.
        let elsewhere = apply(&mut state, 2_100, claim("r-1", "executor"));
        assert_eq!(grants(&elsewhere), Vec::<(u64, u64)>::new(), "the command's lease leaked");
        assert_eq!(state.last_token(), 1, "no lease was granted on q either");
        let same = apply(&mut state, 2_200, on_commands);
        assert_eq!(same, first, "a true retry is still answered with the first lease");
    }

    #[test]
    fn a_granted_claim_is_remembered_for_its_worker_only_and_an_empty_one_not_at_all() {
        let mut state = State::new();
        apply(&mut state, 1_000, claim("r-0", "w"));
        assert!(!state.remembers_claim("w", "r-0"), "an empty claim is not remembered");
        enqueue(&mut state, 1);
        apply(&mut state, 2_000, claim("r-1", "w"));
        // The job is taken: a server that asked only `has_claimable` would
        // never propose the retry, and the worker would get nothing back.
        assert!(!state.has_claimable("q", &[], 2_000));
        assert!(state.remembers_claim("w", "r-1"));
        assert!(!state.remembers_claim("v", "r-1"), "ids are scoped by worker");
        assert!(!state.remembers_claim("w", "r-2"));
    }

    #[test]
    fn an_empty_claim_is_not_remembered_and_the_window_is_bounded() {
        let mut state = State::new();
        let empty = apply(&mut state, 1_000, claim("r-1", "w"));
        assert_eq!(grants(&empty), Vec::<(u64, u64)>::new());
        assert_eq!(state.remembered_requests(), 0);
        enqueue(&mut state, 1);
        assert_eq!(grants(&apply(&mut state, 2_000, claim("r-1", "w"))), vec![(1, 1)]);
        assert_eq!(state.remembered_requests(), 1);
        // Past the window the request is forgotten (the next request's
        // apply forgets it).
        apply(&mut state, 2_000 + REQUEST_WINDOW_MS + 1, claim("r-9", "w"));
        assert_eq!(state.remembered_requests(), 0);
    }

    #[test]
    fn a_retried_forced_trigger_runs_once() {
        use crate::schedule::{JobTemplate, Overlap, ScheduleSpec};
        let mut state = State::new();
        let spec = ScheduleSpec {
            name: "s".into(),
            cron: "@hourly".into(),
            template: JobTemplate { queue: Some("q".into()), ..JobTemplate::default() },
            overlap: Overlap::Allow,
            ..ScheduleSpec::default()
        };
        apply(&mut state, 1_000, Command::PutSchedule { spec });
        let trigger = |id: &str| Command::TriggerOnce {
            request_id: id.into(),
            schedule: "s".into(),
            force: true,
            targets: vec![],
        };
        let first = apply(&mut state, 2_000, trigger("t-1"));
        assert!(!matches!(first, Response::Refused(_)), "{first:?}");
        assert_eq!(apply(&mut state, 2_100, trigger("t-1")), first);
        assert_eq!(state.last_job_id(), 1, "the retry enqueued nothing");
        apply(&mut state, 2_200, trigger("t-2"));
        assert_eq!(state.last_job_id(), 2, "a new request runs again");
    }

    #[test]
    fn memory_stays_bounded_whatever_clients_send() {
        let mut log = RequestLog::default();
        for n in 0..(MAX_REMEMBERED_REQUESTS + 10) {
            log.forget_old(1_000);
            log.remember(format!("k{n}"), 1_000, Outcome::Claimed(vec![]));
        }
        log.forget_old(1_000);
        assert!(log.len() < MAX_REMEMBERED_REQUESTS);
        assert_eq!(log.by_key.len(), log.by_age.len());
    }

    #[test]
    fn the_log_encodes_as_the_b_tree_collections_it_replaced() {
        // Snapshots, digests and older builds read the log as a B-tree map
        // and set: the persistent maps must write the same bytes.
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Before {
            by_key: std::collections::BTreeMap<String, (u64, Outcome)>,
            by_age: std::collections::BTreeSet<(u64, String)>,
        }
        let mut log = RequestLog::default();
        // Enough keys that the hash map's own order is never the sorted one.
        for n in (0..40u64).rev() {
            log.remember(format!("k{n}"), 1_000 + n % 7, Outcome::Claimed(vec![(n, n * 10)]));
        }
        log.remember("t".into(), 900, Outcome::Triggered(Box::new(Response::Empty)));
        let before = Before {
            by_key: log.by_key.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            by_age: log.by_age.iter().cloned().collect(),
        };
        let bytes = bincode::serialize(&before).expect("encodes");
        assert_eq!(bincode::serialize(&log).expect("encodes"), bytes);
        let read: RequestLog = bincode::deserialize(&bytes).expect("decodes");
        assert_eq!(read, log);
        assert_eq!(read.by_age.get_min().map(|(at, _)| *at), Some(900));
    }
}
