//! The replicated scheduler state and its deterministic [`State::apply`], the
//! only place scheduler state changes.
//!
//! The state is the job table plus three counters (cluster time, last job id,
//! last fencing token). Replicas reach identical states because `apply` reads
//! nothing but its arguments, iterates only ordered maps, and takes time from
//! the proposal rather than a clock. Secondary indexes (see the private
//! `index` module) keep claims, sweeps and purges from scanning every job;
//! snapshots leave them out and rebuild them on load.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::command::{Command, Proposal, RedriveTarget};
use crate::index::Indexes;
use crate::job::{Job, JobSpec, JobState, StoredJob};
use crate::jobs::JobTable;
use crate::lease::Lease;
use crate::limits::Limits;
use crate::node_info::NodeInfo;
use crate::response::{EnqueueOutcome, Grant, QueueStats, Refusal, Response};
use crate::schedule::Schedule;
use crate::validate::{ValidationError, truncate_text, validate_command};

pub use frozen::{FrozenHead, FrozenJob, FrozenTail, FrozenViewLost};
pub use recent::{ExpiredLease, RECENT_LIMIT, RECENT_SCAN, Redelivery};

/// Error text recorded on a job whose lease lapsed before it was acked.
pub const LEASE_EXPIRED_ERROR: &str = "lease expired";

/// How long after a new term's first command no lease is taken back
/// (cluster time, milliseconds). The first term of a cluster has none.
///
/// While no leader lives, no holder can renew or ack, so a lease may lapse
/// through no fault of its holder: a worker that finished its job during a
/// failover has its ack waiting in a retry loop. Without this grace the new
/// leader's first sweep would take such a job back and run it a second
/// time. A lease's effective expiry is therefore
/// `max(expires_at_ms, term start + grace)`: holders get this long, under a
/// live leader, to renew or ack. It only ever delays a redelivery, never
/// brings one forward, so lease exclusivity is untouched. Five seconds
/// covers a client's retry backoff (at most 2 s between attempts) with
/// room for finding the new leader; a dead worker's job is redelivered at
/// most this much later after a leader change.
pub const TERM_START_GRACE_MS: u64 = 5_000;

/// Which jobs [`State::jobs`] lists. Every field left `None` matches all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobFilter {
    /// Only jobs of this queue.
    pub queue: Option<String>,
    /// Only jobs in this state.
    pub state: Option<JobState>,
}

impl JobFilter {
    /// Whether `job` passes the filter.
    pub fn matches(&self, job: &Job) -> bool {
        self.queue.as_ref().is_none_or(|queue| *queue == job.queue)
            && self.state.is_none_or(|state| state == job.state)
    }
}

/// The replicated scheduler state: every job (ready, claimed, dead, and acked
/// tombstones until purged), cluster time, and the id and token counters.
///
/// Build one with [`State::new`] and feed it committed proposals in log
/// order; every replica that does so holds an equal state and returns equal
/// responses:
///
/// ```
/// use leasehold_core::{Command, JobSpec, Proposal, Response, State};
///
/// let mut state = State::new();
/// let enqueue = Command::Enqueue {
///     jobs: vec![JobSpec { queue: "emails".into(), ..JobSpec::default() }],
/// };
/// state.apply(1, &Proposal { now_ms: 1_000, command: enqueue });
///
/// let claim = Command::Claim {
///     worker: "worker-1".into(),
///     queue: "emails".into(),
///     max: 1,
///     lease_ttl_ms: None,
///     selector: vec![],
/// };
/// let Response::Claimed(grants) = state.apply(1, &Proposal { now_ms: 2_000, command: claim })
/// else { panic!("a claim answers with grants") };
/// assert_eq!(grants[0].lease.token, 1);
/// assert_eq!(grants[0].lease.expires_at_ms, 2_000 + 30_000);
///
/// let ack = Command::Ack { job_id: grants[0].job.id, token: 1, result: None };
/// assert_eq!(state.apply(1, &Proposal { now_ms: 3_000, command: ack }), Response::Acked);
/// ```
///
/// Serialization carries the job table and counters only; deserializing
/// rebuilds the indexes, so a round trip yields an equal state that behaves
/// identically.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "Snapshot")]
pub struct State {
    /// Largest `now_ms` seen; never decreases.
    cluster_time_ms: u64,
    /// Last fencing token issued (0 = none yet).
    last_token: u64,
    /// Last job id assigned (0 = none yet).
    last_job_id: u64,
    /// Every retained job by id, in its compact in-memory form; written
    /// as [`Job`]s.
    jobs: JobTable,
    /// Every schedule by name.
    schedules: BTreeMap<String, Schedule>,
    /// Registered nodes by id.
    nodes: BTreeMap<u64, NodeInfo>,
    /// The largest epoch (Raft term) of any applied proposal.
    epoch: u64,
    /// No sweep takes a lease back before this cluster time: the end of
    /// the current term's [`TERM_START_GRACE_MS`] (0 = no grace).
    grace_end_ms: u64,
    /// Claims and triggers answered once, for their retries.
    requests: requests::RequestLog,
    /// Derived from `jobs`; rebuilt on deserialize.
    #[serde(skip)]
    indexes: Indexes,
    /// A snapshot being read in chunks, if any (see [`State::freeze`]):
    /// bookkeeping, never serialized or compared.
    #[serde(skip)]
    frozen: frozen::FrozenView,
}

impl Serialize for State {
    /// The fields in declaration order, jobs in their [`Job`] form: the
    /// bytes a derived implementation over a table of [`Job`]s wrote.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = serializer.serialize_struct("State", 9)?;
        out.serialize_field("cluster_time_ms", &self.cluster_time_ms)?;
        out.serialize_field("last_token", &self.last_token)?;
        out.serialize_field("last_job_id", &self.last_job_id)?;
        out.serialize_field("jobs", &JobsAsWritten(&self.jobs))?;
        out.serialize_field("schedules", &self.schedules)?;
        out.serialize_field("nodes", &self.nodes)?;
        out.serialize_field("epoch", &self.epoch)?;
        out.serialize_field("grace_end_ms", &self.grace_end_ms)?;
        out.serialize_field("requests", &self.requests)?;
        out.end()
    }
}

/// The job table as written: a map of id to [`Job`].
struct JobsAsWritten<'a>(&'a JobTable);

impl Serialize for JobsAsWritten<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // The length up front, as the map wrote it: bincode needs it, and
        // the table's iterator cannot promise an exact size hint.
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (id, job) in self.0.iter() {
            map.serialize_entry(&id, &job.as_written(id))?;
        }
        map.end()
    }
}

/// The serialized form of [`State`]: its fields in the same order, without
/// the derived indexes.
#[derive(Deserialize)]
struct Snapshot {
    cluster_time_ms: u64,
    last_token: u64,
    last_job_id: u64,
    jobs: JobsAsRead,
    schedules: BTreeMap<String, Schedule>,
    nodes: BTreeMap<u64, NodeInfo>,
    #[serde(default)]
    epoch: u64,
    #[serde(default)]
    grace_end_ms: u64,
    #[serde(default)]
    requests: requests::RequestLog,
}

/// The serialized form of [`State`] as versions before the request log
/// wrote it (no `requests`): bincode has no defaults for missing fields, so
/// a snapshot of that layout is read with this and converted (storage
/// tries it when the current layout does not decode).
#[derive(Deserialize)]
pub struct StateBeforeRequests {
    cluster_time_ms: u64,
    last_token: u64,
    last_job_id: u64,
    jobs: JobsAsRead,
    schedules: BTreeMap<String, Schedule>,
    nodes: BTreeMap<u64, NodeInfo>,
    epoch: u64,
    grace_end_ms: u64,
}

impl From<StateBeforeRequests> for State {
    fn from(old: StateBeforeRequests) -> State {
        State::from(Snapshot {
            cluster_time_ms: old.cluster_time_ms,
            last_token: old.last_token,
            last_job_id: old.last_job_id,
            jobs: old.jobs,
            schedules: old.schedules,
            nodes: old.nodes,
            epoch: old.epoch,
            grace_end_ms: old.grace_end_ms,
            requests: requests::RequestLog::default(),
        })
    }
}

/// The job table as read: a map of id to [`Job`] (what [`JobsAsWritten`]
/// writes), each entry turned into its compact form as it is read. A
/// snapshot's jobs are never all held in their full form, which is several
/// times the compact one: decoding a million jobs costs the table, not the
/// table and a map of full jobs beside it. Entries in any order, and a
/// repeated id replacing the one before, as a map read them.
struct JobsAsRead(JobTable);

impl<'de> Deserialize<'de> for JobsAsRead {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;

        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = JobsAsRead;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of job ids to jobs")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut entries: A,
            ) -> Result<JobsAsRead, A::Error> {
                // One shared name per queue, as the state keeps them.
                let mut names: std::collections::BTreeSet<Arc<str>> = Default::default();
                let mut table = JobTable::default();
                while let Some((id, job)) = entries.next_entry::<u64, Job>()? {
                    let queue = match names.get(job.queue.as_str()) {
                        Some(name) => Arc::clone(name),
                        None => {
                            let name: Arc<str> = Arc::from(job.queue.as_str());
                            names.insert(Arc::clone(&name));
                            name
                        }
                    };
                    table.insert(id, StoredJob::from_job(job, queue));
                }
                Ok(JobsAsRead(table))
            }
        }

        deserializer.deserialize_map(Entries)
    }
}

impl From<Snapshot> for State {
    fn from(snapshot: Snapshot) -> State {
        let jobs = snapshot.jobs.0;
        let indexes = Indexes::rebuild(&jobs);
        State {
            cluster_time_ms: snapshot.cluster_time_ms,
            last_token: snapshot.last_token,
            last_job_id: snapshot.last_job_id,
            jobs,
            schedules: snapshot.schedules,
            nodes: snapshot.nodes,
            epoch: snapshot.epoch,
            grace_end_ms: snapshot.grace_end_ms,
            requests: snapshot.requests,
            indexes,
            frozen: frozen::FrozenView::default(),
        }
    }
}

impl State {
    /// An empty state: no jobs, cluster time 0, no ids or tokens issued.
    pub fn new() -> State {
        State::default()
    }

    /// Applies one committed proposal and answers it. `epoch` is the Raft
    /// term of the log entry carrying the proposal; it is stamped on every
    /// lease the proposal grants.
    ///
    /// Cluster time first advances to `max(cluster time, proposal.now_ms)`,
    /// even for a command that is then refused: the entry was committed, and
    /// time only moves forward. The command is then validated against the
    /// limits the leader recorded with it ([`Command::Ruled`]; entries from
    /// before that are judged by [`Limits::default`]) — never the
    /// proposer's configuration, which a replica cannot see, nor this
    /// binary's defaults, which another replica's binary may not share —
    /// and an invalid command changes nothing else. Refusals are
    /// [`Response::Refused`] values; `apply` never panics.
    ///
    /// The first proposal of a newer epoch (after the first) starts that
    /// term's lease grace (see [`TERM_START_GRACE_MS`]).
    pub fn apply(&mut self, epoch: u64, proposal: &Proposal) -> Response {
        self.apply_as_built_with(epoch, proposal, &Limits::default())
    }

    /// [`State::apply`] in a build whose [`Limits::default`] were `build`:
    /// the tests' model of another version's binary. `build` judges only
    /// entries the leader did not wrap in [`Command::Ruled`].
    pub(crate) fn apply_as_built_with(
        &mut self,
        epoch: u64,
        proposal: &Proposal,
        build: &Limits,
    ) -> Response {
        self.cluster_time_ms = self.cluster_time_ms.max(proposal.now_ms);
        if epoch > self.epoch {
            // The very first term takes over from nobody: no lease can
            // predate it, so it starts no grace.
            if self.epoch > 0 {
                self.grace_end_ms = self.cluster_time_ms.saturating_add(TERM_START_GRACE_MS);
            }
            self.epoch = epoch;
        }
        match &proposal.command {
            Command::Ruled { limits, command } => self.apply_command(epoch, command, limits),
            // Written before the leader recorded its limits: judged by this
            // build's, as it always was.
            command => self.apply_command(epoch, command, build),
        }
    }

    /// Validates and applies one command at the current cluster time.
    fn apply_command(&mut self, epoch: u64, command: &Command, limits: &Limits) -> Response {
        if let Err(error) = validate_command(command, limits) {
            return Response::Refused(Refusal::Invalid(error));
        }
        match command {
            Command::Batch { commands } => Response::Batch(
                commands.iter().map(|command| self.apply_command(epoch, command, limits)).collect(),
            ),
            // Refused by validation: only the outermost command is ruled.
            Command::Ruled { .. } => Response::Refused(Refusal::Invalid(
                crate::validate::ValidationError::invalid("command", "Ruled does not nest"),
            )),
            Command::Enqueue { jobs } => self.enqueue(jobs, limits),
            Command::Claim { worker, queue, max, lease_ttl_ms, selector } => {
                self.claim(epoch, worker, queue, *max, *lease_ttl_ms, selector)
            }
            Command::Refresh { worker: _, leases, lease_ttl_ms } => {
                self.refresh(leases, *lease_ttl_ms)
            }
            Command::Ack { job_id, token, result } => self.ack(*job_id, *token, result, true),
            Command::AckLean { job_id, token, result } => self.ack(*job_id, *token, result, false),
            Command::Nack { job_id, token, error, retry_after_ms } => {
                self.nack(*job_id, *token, error, *retry_after_ms, limits)
            }
            Command::Release { job_id, token } => self.release(*job_id, *token),
            Command::Sweep => self.sweep(0, false),
            Command::SweepBounded { max_clock_offset_ms } => {
                self.sweep(*max_clock_offset_ms, false)
            }
            Command::SweepKeepingTokens { max_clock_offset_ms } => {
                self.sweep(*max_clock_offset_ms, true)
            }
            Command::ClaimOnce { request_id, worker, queue, max, lease_ttl_ms, selector } => {
                self.claim_once(epoch, request_id, worker, queue, *max, *lease_ttl_ms, selector)
            }
            Command::TriggerOnce { request_id, schedule, force, targets } => {
                self.trigger_once(request_id, schedule, *force, targets, limits)
            }
            Command::Redrive { target } => self.redrive(target),
            Command::Purge => self.purge(limits),
            Command::PutSchedule { spec } => self.put_schedule(spec, false),
            Command::PutScheduleRetimed { spec } => self.put_schedule(spec, true),
            Command::DeleteSchedule { name } => self.delete_schedule(name),
            Command::SetPaused { name, paused } => self.set_paused(name, *paused),
            Command::ResumeSchedule { name, counted_after_ms, paused_through, paused_ticks } => {
                self.resume_schedule(name, *counted_after_ms, *paused_through, *paused_ticks)
            }
            Command::Fire { schedule, bucket, targets } => {
                self.fire(schedule, *bucket, targets, limits)
            }
            Command::FireEach { schedule, bucket, targets, offline } => {
                self.fire_each(schedule, *bucket, targets, offline, Watch::Targets, limits)
            }
            Command::FireEachTracked { schedule, bucket, targets, offline } => {
                self.fire_each(schedule, *bucket, targets, offline, Watch::Away, limits)
            }
            Command::Skip { schedule, bucket, reason, ticks } => {
                self.skip(schedule, *bucket, *reason, *ticks)
            }
            Command::Planned { created_at_ms, command } => {
                // A stale tick changes nothing; a bad one is refused as
                // bad, stale or not (the tick's own apply validates it).
                if self.planned_from_another(*created_at_ms, command)
                    && validate_command(command, limits).is_ok()
                {
                    Response::Tick(None)
                } else {
                    self.apply_command(epoch, command, limits)
                }
            }
            Command::Trigger { schedule, force, targets } => {
                self.trigger(schedule, *force, targets, limits)
            }
            Command::RegisterNode { node, tags } => self.register_node(*node, tags),
            Command::SetDraining { node, draining } => self.set_draining(*node, *draining),
        }
    }

    /// Cluster time: the largest `now_ms` of any applied proposal.
    pub fn cluster_time_ms(&self) -> u64 {
        self.cluster_time_ms
    }

    /// The last fencing token issued (0 = none yet).
    pub fn last_token(&self) -> u64 {
        self.last_token
    }

    /// The last job id assigned (0 = none yet).
    pub fn last_job_id(&self) -> u64 {
        self.last_job_id
    }

    /// The job with this id, while retained (a copy: the state keeps jobs
    /// in a compact form of its own).
    pub fn job(&self, job_id: u64) -> Option<Job> {
        self.jobs.get(&job_id).map(|job| view(&job, job_id))
    }

    /// The queue of the job with this id, while retained (no copy).
    pub fn job_queue(&self, job_id: u64) -> Option<&str> {
        self.jobs.queue_of(job_id)
    }

    /// How many jobs are retained, tombstones included.
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }

    /// Jobs with id greater than `after_id` that match `filter`, ascending by
    /// id, at most `limit`: one page of a listing, resumed from the last id
    /// of the previous page.
    pub fn jobs(&self, filter: &JobFilter, after_id: u64, limit: usize) -> Vec<Job> {
        let Some(first_id) = after_id.checked_add(1) else {
            return Vec::new();
        };
        let ids: Vec<u64> = match (&filter.queue, filter.state) {
            (None, None) => {
                return self
                    .jobs
                    .range(first_id..)
                    .take(limit)
                    .map(|(id, job)| view(&job, id))
                    .collect();
            }
            (Some(queue), Some(state)) => match self.indexes.queues.get(queue.as_str()) {
                Some(index) => index.ids(state).from(first_id).take(limit).collect(),
                None => Vec::new(),
            },
            (Some(queue), None) => match self.indexes.queues.get(queue.as_str()) {
                Some(index) => {
                    first_page(ALL_STATES.iter().map(|&s| index.ids(s)), first_id, limit)
                }
                None => Vec::new(),
            },
            (None, Some(state)) => first_page(
                self.indexes.queues.values().map(|index| index.ids(state)),
                first_id,
                limit,
            ),
        };
        ids.iter().filter_map(|&id| self.jobs.get(&id).map(|job| view(&job, id))).collect()
    }

    /// Counts per queue, for every queue that holds a job. Whether a ready
    /// job is due is judged at `max(cluster time, now_ms)`, so a reader's
    /// fresher clock shows delayed jobs becoming ready between proposals.
    pub fn stats(&self, now_ms: u64) -> BTreeMap<String, QueueStats> {
        let at_ms = self.cluster_time_ms.max(now_ms);
        self.indexes
            .queues
            .iter()
            .map(|(queue, index)| (queue.to_string(), queue_stats(index, at_ms)))
            .collect()
    }

    /// [`State::stats`] of one queue, `None` when it holds no job.
    pub fn stats_of(&self, queue: &str, now_ms: u64) -> Option<QueueStats> {
        let at_ms = self.cluster_time_ms.max(now_ms);
        self.indexes.queues.get(queue).map(|index| queue_stats(index, at_ms))
    }

    /// [`State::stats`] of the `limit` queues holding the most jobs (of
    /// equal counts, the first by name), and how many queues hold a job.
    /// What a metrics scrape publishes: producers name queues, so their
    /// number has no bound, and a scrape must not cost in proportion to
    /// it. Ranking reads only the sizes of each queue's sets, so only the
    /// chosen queues are counted in full.
    pub fn largest_queue_stats(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> (BTreeMap<String, QueueStats>, usize) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let at_ms = self.cluster_time_ms.max(now_ms);
        let queues = &self.indexes.queues;
        // The kept queues, the least of them on top: fewest jobs, then the
        // last by name.
        if limit == 0 {
            return (BTreeMap::new(), queues.len());
        }
        let mut kept: BinaryHeap<Reverse<(usize, Reverse<&str>)>> = BinaryHeap::new();
        for (queue, index) in queues {
            let jobs =
                index.due_order.len() + index.claimed.len() + index.acked.len() + index.dead.len();
            let rank = Reverse((jobs, Reverse(queue.as_ref())));
            if kept.len() < limit {
                kept.push(rank);
            } else if kept.peek().is_some_and(|least| rank < *least) {
                kept.pop();
                kept.push(rank);
            }
        }
        let stats = kept
            .into_iter()
            .filter_map(|Reverse((_, Reverse(queue)))| {
                queues.get(queue).map(|index| (queue.to_string(), queue_stats(index, at_ms)))
            })
            .collect();
        (stats, queues.len())
    }

    /// Whether a claim on `queue` with `selector`, applied at `now_ms`, would
    /// grant anything. Lets a long-poll wait instead of proposing empty
    /// claims. Judged at `max(cluster time, now_ms)`, as `apply` would.
    pub fn has_claimable(&self, queue: &str, selector: &[String], now_ms: u64) -> bool {
        let at_ms = self.cluster_time_ms.max(now_ms);
        self.indexes
            .queues
            .get(queue)
            .is_some_and(|index| !index.claimable(selector, at_ms, 1).is_empty())
    }

    /// The earliest `not_before_ms` of a ready job in `queue` that is not yet
    /// due at cluster time: when a long-poll should look again.
    pub fn next_due_ms(&self, queue: &str) -> Option<u64> {
        let index = self.indexes.queues.get(queue)?;
        let after_now = (self.cluster_time_ms, u64::MAX);
        index
            .due_order
            .range((std::ops::Bound::Excluded(after_now), std::ops::Bound::Unbounded))
            .next()
            .map(|&(not_before_ms, _)| not_before_ms)
    }

    /// When the leader should next propose a sweep that honours earlier
    /// terms' leases `prior_term_margin_ms` past their expiry (see
    /// [`Command::SweepBounded`]): the earliest such deadline of any current
    /// lease, but not before the current term's grace ends (see
    /// [`TERM_START_GRACE_MS`]).
    pub fn next_expiry_ms(&self, prior_term_margin_ms: u64) -> Option<u64> {
        let grace_end_ms = self.grace_end_ms();
        let mut earliest: Option<u64> = None;
        // In expiry order: once an expiry passes the earliest deadline
        // seen, no later lease can have an earlier one.
        for &(expires_at_ms, job_id) in &self.indexes.expiries {
            if earliest.is_some_and(|best| expires_at_ms >= best) {
                break;
            }
            let prior = self
                .jobs
                .live(&job_id)
                .and_then(StoredJob::lease)
                .is_some_and(|lease| lease.epoch < self.epoch);
            let deadline = if prior {
                expires_at_ms.saturating_add(prior_term_margin_ms)
            } else {
                expires_at_ms
            };
            earliest = Some(earliest.map_or(deadline, |best| best.min(deadline)));
        }
        earliest.map(|deadline| deadline.max(grace_end_ms))
    }

    /// The end of the current term's lease grace, cluster time: no sweep
    /// takes a lease back before it (see [`TERM_START_GRACE_MS`]).
    pub fn grace_end_ms(&self) -> u64 {
        self.grace_end_ms
    }

    /// Whether a `Purge` applied at `now_ms` would drop any tombstone.
    pub fn has_purgeable(&self, now_ms: u64) -> bool {
        let at_ms = self.cluster_time_ms.max(now_ms);
        let retention_ms = Limits::default().retention_ms;
        self.jobs
            .tombs()
            .earliest_finish_ms()
            .is_some_and(|finished_at_ms| finished_at_ms.saturating_add(retention_ms) <= at_ms)
    }

    /// Checks every structural invariant and returns the first violation:
    /// each job's fields agree with its state, ids and tokens never exceed
    /// their counters, no two jobs share a lease token or an idempotency key,
    /// and the indexes equal a rebuild from the job table. For tests, and for
    /// a storage layer that wants to verify a snapshot it loaded.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut tokens = BTreeMap::new();
        let mut keys = BTreeMap::new();
        self.jobs.check()?;
        for (job_id, stored) in self.jobs.iter() {
            let job = &stored.to_job(job_id);
            check_job(job_id, job, self.last_job_id, self.last_token, self.cluster_time_ms)?;
            if StoredJob::from_job(job.clone(), stored.queue.clone()) != *stored {
                return Err(format!("job {job_id}: not stored in its canonical compact form"));
            }
            if let Some(lease) = &job.lease
                && let Some(other) = tokens.insert(lease.token, job_id)
            {
                return Err(format!("jobs {other} and {job_id} both hold token {}", lease.token));
            }
            if let Some(key) = &job.idempotency_key
                && let Some(other) = keys.insert((job.queue.clone(), key.clone()), job_id)
            {
                return Err(format!(
                    "jobs {other} and {job_id} share idempotency key {key:?} in queue {}",
                    job.queue
                ));
            }
        }
        let rebuilt = Indexes::rebuild(&self.jobs);
        if self.indexes != rebuilt {
            return Err(format!(
                "indexes drifted from the job table:\n kept:    {:?}\n rebuilt: {:?}",
                self.indexes, rebuilt
            ));
        }
        Ok(())
    }

    /// Inserts the specs as ready jobs, in order, or answers each duplicate
    /// with the id of the job that first used its idempotency key. Validation
    /// already passed, so nothing below can fail half way: the batch is
    /// atomic.
    fn enqueue(&mut self, specs: &[JobSpec], limits: &Limits) -> Response {
        let batch = u64::try_from(specs.len()).unwrap_or(u64::MAX);
        if self.last_job_id.checked_add(batch).is_none() {
            // Unreachable in practice (2^64 jobs), but a refusal is the only
            // answer that keeps ids strictly increasing.
            return Response::Refused(Refusal::Invalid(ValidationError::too_large(
                "jobs",
                "job id space exhausted",
            )));
        }
        let now_ms = self.cluster_time_ms;
        let mut outcomes = Vec::with_capacity(specs.len());
        for spec in specs {
            if let Some(key) = &spec.idempotency_key
                && let Some(first_id) = self.indexes.key_owner(&spec.queue, key)
            {
                outcomes.push(EnqueueOutcome { job_id: first_id, duplicate: true });
                continue;
            }
            self.last_job_id = self.last_job_id.saturating_add(1);
            let job_id = self.last_job_id;
            let queue = self.indexes.queue_name(&spec.queue);
            let job = StoredJob::from_job(new_job(job_id, spec, now_ms, limits), queue);
            self.indexes.insert(job_id, &job);
            self.indexes.insert_key(job_id, &job);
            outcomes.push(EnqueueOutcome { job_id, duplicate: false });
            self.jobs.insert(job_id, job);
        }
        Response::Enqueued(outcomes)
    }

    /// Grants a lease, with a fresh token, on each of up to `max` claimable
    /// jobs of `queue`.
    fn claim(
        &mut self,
        epoch: u64,
        worker: &str,
        queue: &str,
        max: u32,
        lease_ttl_ms: Option<u64>,
        selector: &[String],
    ) -> Response {
        let now_ms = self.cluster_time_ms;
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let candidates = match self.indexes.queues.get(queue) {
            Some(index) => index.claimable(selector, now_ms, max),
            None => Vec::new(),
        };
        let mut grants = Vec::with_capacity(candidates.len());
        for job_id in candidates {
            // A token is never reused: when the counter is exhausted the
            // claim grants nothing more rather than wrap.
            let Some(token) = self.last_token.checked_add(1) else {
                break;
            };
            let grant = self.change_job(job_id, |job| {
                let ttl_ms = lease_ttl_ms.unwrap_or(job.lease_ttl_ms);
                let lease = Lease {
                    job_id,
                    holder: worker.to_owned(),
                    token,
                    epoch,
                    granted_at_ms: now_ms,
                    expires_at_ms: now_ms.saturating_add(ttl_ms),
                };
                job.state = JobState::Claimed;
                job.lease = Some(lease.clone());
                Grant { job: job.clone(), lease }
            });
            if let Some(grant) = grant {
                self.last_token = token;
                grants.push(grant);
            }
        }
        Response::Claimed(grants)
    }

    /// Extends each lease whose token is exactly the job's current one. The
    /// token alone identifies a lease (tokens are never reused), so the
    /// worker id is not compared. A lapsed lease that no sweep has taken
    /// back is still current: nobody else can hold the job, so renewing it
    /// is safe.
    fn refresh(&mut self, leases: &[(u64, u64)], lease_ttl_ms: Option<u64>) -> Response {
        let now_ms = self.cluster_time_ms;
        let mut renewed = Vec::new();
        let mut lost = Vec::new();
        for &(job_id, token) in leases {
            let current =
                self.jobs.get(&job_id).is_some_and(|job| holds_current_lease(&job, token));
            let lease = if current {
                self.change_job(job_id, |job| {
                    let ttl_ms = lease_ttl_ms.unwrap_or(job.lease_ttl_ms);
                    job.lease.as_mut().map(|lease| {
                        lease.granted_at_ms = now_ms;
                        lease.expires_at_ms = now_ms.saturating_add(ttl_ms);
                        lease.clone()
                    })
                })
                .flatten()
            } else {
                None
            };
            match lease {
                Some(lease) => renewed.push(lease),
                None => lost.push(job_id),
            }
        }
        Response::Refreshed { renewed, lost }
    }

    /// Finishes a job held under `token`, or whose lease under `token` a
    /// sweep took back and nobody has been granted since (SPEC §3: an
    /// expired lease not yet re-granted still counts; only a
    /// [`Command::SweepKeepingTokens`] keeps the token to check). Acking
    /// again with the same token is answered `Acked` again, so a worker
    /// whose first ack response was lost can retry safely; the retry's
    /// result does not replace the first one.
    /// The tombstone keeps the payload only when `keep_payload` (a plain
    /// `Ack`; an `AckLean` drops it).
    fn ack(
        &mut self,
        job_id: u64,
        token: u64,
        result: &Option<Vec<u8>>,
        keep_payload: bool,
    ) -> Response {
        let Some(job) = self.jobs.get(&job_id) else {
            return Response::Refused(Refusal::NotFound { job_id });
        };
        if holds_current_lease(&job, token) || holds_swept_lease(&job, token) {
            let now_ms = self.cluster_time_ms;
            self.change_job(job_id, |job| {
                // The lease stays on the tombstone: it is the audit record of
                // who finished the job, and what makes a retried ack idempotent.
                job.state = JobState::Acked;
                job.finished_at_ms = Some(now_ms);
                job.result = result.clone();
                if !keep_payload {
                    job.payload = Vec::new();
                }
            });
            return Response::Acked;
        }
        let acked_with_token =
            job.state == JobState::Acked && job.lease().is_some_and(|lease| lease.token == token);
        if acked_with_token {
            return Response::Acked;
        }
        stale(job_id, token)
    }

    /// Fails the attempt held under `token`: back to ready after the backoff
    /// (or `retry_after_ms`), or dead once attempts reach `max_attempts`.
    fn nack(
        &mut self,
        job_id: u64,
        token: u64,
        error: &str,
        retry_after_ms: Option<u64>,
        limits: &Limits,
    ) -> Response {
        let Some(job) = self.jobs.get(&job_id) else {
            return Response::Refused(Refusal::NotFound { job_id });
        };
        if !holds_current_lease(&job, token) {
            return stale(job_id, token);
        }
        let now_ms = self.cluster_time_ms;
        let error = truncate_text(error, limits.max_error_bytes);
        let outcome = self.change_job(job_id, |job| {
            let backoff = job.backoff;
            fail_attempt(job, error, now_ms, |attempt| {
                retry_after_ms.unwrap_or_else(|| backoff.delay_ms(attempt))
            })
        });
        match outcome {
            Some((state, not_before_ms)) => Response::Nacked { state, not_before_ms },
            None => Response::Refused(Refusal::NotFound { job_id }),
        }
    }

    /// Returns the job held under `token` to ready now, charging no attempt:
    /// the worker gave it up (drain), it did not fail.
    fn release(&mut self, job_id: u64, token: u64) -> Response {
        let Some(job) = self.jobs.get(&job_id) else {
            return Response::Refused(Refusal::NotFound { job_id });
        };
        if !holds_current_lease(&job, token) {
            return stale(job_id, token);
        }
        let now_ms = self.cluster_time_ms;
        self.change_job(job_id, |job| {
            job.state = JobState::Ready;
            job.lease = None;
            job.not_before_ms = now_ms;
        });
        Response::Released
    }

    /// Takes back every lease that lapsed at or before cluster time, charging
    /// the attempt — once the current term's grace has passed; within it a
    /// sweep takes nothing. Leases still valid are untouched, so a repeated
    /// sweep finds nothing. With `keep_tokens` each job keeps the lease it
    /// lost, so an ack under it still counts until the job is granted again.
    fn sweep(&mut self, prior_term_margin_ms: u64, keep_tokens: bool) -> Response {
        let now_ms = self.cluster_time_ms;
        if now_ms < self.grace_end_ms() {
            return Response::Swept { requeued: Vec::new(), dead: Vec::new() };
        }
        // A lease of an earlier term lapses `prior_term_margin_ms` later:
        // its expiry was stamped by another leader's clock.
        let lapsed: Vec<u64> = self
            .indexes
            .expiries
            .range(..=(now_ms, u64::MAX))
            .filter(|&&(expires_at_ms, job_id)| {
                let prior = self
                    .jobs
                    .live(&job_id)
                    .and_then(StoredJob::lease)
                    .is_some_and(|lease| lease.epoch < self.epoch);
                !prior || expires_at_ms.saturating_add(prior_term_margin_ms) <= now_ms
            })
            .map(|&(_, job_id)| job_id)
            .collect();
        let mut requeued = Vec::new();
        let mut dead = Vec::new();
        for job_id in lapsed {
            let outcome = self.change_job(job_id, |job| {
                // A lapsed lease is retried at once: the worker may simply
                // have died, which says nothing about the job.
                let lease = job.lease.take();
                let outcome = fail_attempt(job, LEASE_EXPIRED_ERROR.to_owned(), now_ms, |_| 0);
                if keep_tokens {
                    job.lease = lease;
                }
                outcome
            });
            match outcome {
                Some((JobState::Dead, _)) => dead.push(job_id),
                Some(_) => requeued.push(job_id),
                None => {}
            }
        }
        requeued.sort_unstable();
        dead.sort_unstable();
        Response::Swept { requeued, dead }
    }

    /// Returns dead jobs to ready now with a fresh set of attempts. Jobs
    /// that are not dead (or not known) are left alone and not counted.
    fn redrive(&mut self, target: &RedriveTarget) -> Response {
        let candidates: Vec<u64> = match target {
            RedriveTarget::Queue(queue) => self
                .indexes
                .queues
                .get(queue.as_str())
                .map(|index| index.dead.from(0).collect())
                .unwrap_or_default(),
            RedriveTarget::Ids(ids) => ids.clone(),
        };
        let now_ms = self.cluster_time_ms;
        let mut redriven = 0u64;
        for job_id in candidates {
            let is_dead = self.jobs.get(&job_id).is_some_and(|job| job.state == JobState::Dead);
            if !is_dead {
                continue;
            }
            self.change_job(job_id, |job| {
                // last_error stays: it tells the operator why the job died.
                // A lease a sweep kept goes: the job starts a new life, and
                // an ack from the run that let it die no longer counts.
                job.lease = None;
                job.state = JobState::Ready;
                job.attempts = 0;
                job.not_before_ms = now_ms;
                job.finished_at_ms = None;
            });
            redriven = redriven.saturating_add(1);
        }
        Response::Redriven(redriven)
    }

    /// Drops acked tombstones whose retention has passed, and with them
    /// their idempotency keys: after that a producer may reuse the key.
    fn purge(&mut self, limits: &Limits) -> Response {
        let now_ms = self.cluster_time_ms;
        // Finished at least `retention` ago: `finished + retention <= now`,
        // the sum saturating, so at the end of time every tombstone is old
        // enough and none before `retention` has passed since time began.
        let cutoff_ms = match now_ms {
            u64::MAX => Some(u64::MAX),
            _ => now_ms.checked_sub(limits.retention_ms),
        };
        let expired =
            cutoff_ms.map_or_else(Vec::new, |cutoff| self.jobs.tombs().finished_by(cutoff));
        let mut purged = 0u64;
        for job_id in expired {
            if let Some(job) = self.jobs.remove(&job_id) {
                self.frozen.before_change(job_id, &job);
                self.indexes.remove(job_id, &job);
                self.indexes.remove_key(job_id, &job);
                purged = purged.saturating_add(1);
            }
        }
        Response::Purged(purged)
    }

    /// Changes one job and keeps the indexes in step: the job's entries are
    /// removed, `change` runs, and the entries for its new state are added.
    /// Every transition goes through here, so no index can miss one.
    ///
    /// The job is changed in its [`Job`] form, moved out of the compact one
    /// (the payload moves, it is not copied) and stored back compact.
    fn change_job<R>(&mut self, job_id: u64, change: impl FnOnce(&mut Job) -> R) -> Option<R> {
        let stored = self.jobs.remove(&job_id)?;
        self.frozen.before_change(job_id, &stored);
        self.indexes.remove(job_id, &stored);
        let queue = Arc::clone(&stored.queue);
        let mut job = stored.into_job(job_id);
        let result = change(&mut job);
        let stored = StoredJob::from_job(job, queue);
        self.indexes.insert(job_id, &stored);
        self.jobs.insert(job_id, stored);
        Some(result)
    }
}

/// The four states, in the order listings merge them.
const ALL_STATES: [JobState; 4] =
    [JobState::Ready, JobState::Claimed, JobState::Acked, JobState::Dead];

/// The first `limit` ids at or above `first_id` across several ascending id
/// sets. Each set contributes at most `limit`, so the work is bounded by
/// `sets × limit`, not by the number of jobs.
fn first_page<'a>(
    sets: impl Iterator<Item = &'a crate::id_set::IdSet>,
    first_id: u64,
    limit: usize,
) -> Vec<u64> {
    let mut ids: Vec<u64> = sets.flat_map(|set| set.from(first_id).take(limit)).collect();
    ids.sort_unstable();
    ids.truncate(limit);
    ids
}

/// A length as a count on the wire.
/// One queue's counts, a ready job judged due at `at_ms`.
fn queue_stats(index: &crate::index::QueueIndex, at_ms: u64) -> QueueStats {
    let due = count_up_to(&index.due_order, &(at_ms, u64::MAX));
    let ready = index.due_order.len();
    QueueStats {
        ready: count(due),
        delayed: count(ready.saturating_sub(due)),
        claimed: count(index.claimed.len()),
        acked: count(index.acked.len()),
        dead: count(index.dead.len()),
    }
}

fn count(length: usize) -> u64 {
    u64::try_from(length).unwrap_or(u64::MAX)
}

/// How many members of `set` are at most `pivot`, in time linear in the
/// smaller of the two sides: both sides are walked in step and the first
/// to end is counted, so a queue of a million due jobs and a few delayed
/// ones is counted in a few steps, not a million (stats run under the
/// state's read lock, once a second for an open status page).
fn count_up_to<T: Ord>(set: &BTreeSet<T>, pivot: &T) -> usize {
    use std::ops::Bound::{Excluded, Unbounded};
    let mut below = set.range(..=pivot);
    let mut above = set.range((Excluded(pivot), Unbounded));
    let mut steps = 0usize;
    loop {
        match (below.next(), above.next()) {
            (Some(_), Some(_)) => steps += 1,
            (None, _) => return steps,
            (Some(_), None) => return set.len() - steps,
        }
    }
}

/// Builds the job for a validated spec, filling defaults from `limits`.
fn new_job(job_id: u64, spec: &JobSpec, now_ms: u64, limits: &Limits) -> Job {
    // Sorted and deduplicated so the subset test at claim time is cheap and
    // two specs that differ only in tag order produce equal jobs.
    let mut tags = spec.tags.clone();
    tags.sort();
    tags.dedup();
    Job {
        id: job_id,
        queue: spec.queue.clone(),
        payload: spec.payload.clone(),
        priority: spec.priority,
        not_before_ms: spec.not_before_ms.unwrap_or(now_ms),
        max_attempts: spec.max_attempts.unwrap_or(limits.default_max_attempts),
        backoff: spec.backoff.unwrap_or_default(),
        lease_ttl_ms: spec.lease_ttl_ms.unwrap_or(limits.default_lease_ttl_ms),
        idempotency_key: spec.idempotency_key.clone(),
        tags,
        attempts: 0,
        last_error: None,
        state: JobState::Ready,
        lease: None,
        enqueued_at_ms: now_ms,
        finished_at_ms: None,
        result: None,
    }
}

/// Whether `token` is the current lease of a claimed job. A lapsed lease
/// counts until a sweep takes it back or it is re-granted (after a sweep
/// that keeps tokens, an ack under it still counts: [`holds_swept_lease`]).
fn holds_current_lease(job: &StoredJob, token: u64) -> bool {
    job.state == JobState::Claimed && job.lease().is_some_and(|lease| lease.token == token)
}

/// Whether `token` is the lease a sweep took back from a job that nobody
/// has been granted since: the job is ready (or dead, its attempts spent)
/// and still carries the lease ([`Command::SweepKeepingTokens`]). A nack or
/// release drops the lease, a claim replaces it and a redrive drops it, so
/// only a swept one is left on a ready or dead job.
fn holds_swept_lease(job: &StoredJob, token: u64) -> bool {
    matches!(job.state, JobState::Ready | JobState::Dead)
        && job.lease().is_some_and(|lease| lease.token == token)
}

/// The job as reads show it: a ready or dead job's swept lease is kept only
/// to judge a late ack, and nobody holds it, so it is not shown.
fn view(stored: &StoredJob, job_id: u64) -> Job {
    let mut job = stored.to_job(job_id);
    if matches!(job.state, JobState::Ready | JobState::Dead) {
        job.lease = None;
    }
    job
}

/// The refusal for a token that is not the job's current one.
fn stale(job_id: u64, presented: u64) -> Response {
    Response::Refused(Refusal::StaleToken { job_id, presented })
}

/// Charges one failed attempt to a claimed job and drops its lease: dead
/// once attempts reach `max_attempts`, otherwise ready after
/// `delay_ms(attempt)`. Returns the new state and, for `Ready`, when the job
/// is due (0 for `Dead`).
fn fail_attempt(
    job: &mut Job,
    error: String,
    now_ms: u64,
    delay_ms: impl FnOnce(u32) -> u64,
) -> (JobState, u64) {
    job.attempts = job.attempts.saturating_add(1);
    job.last_error = Some(error);
    job.lease = None;
    if job.attempts >= job.max_attempts {
        job.state = JobState::Dead;
        job.finished_at_ms = Some(now_ms);
        (JobState::Dead, 0)
    } else {
        job.state = JobState::Ready;
        job.not_before_ms = now_ms.saturating_add(delay_ms(job.attempts));
        (JobState::Ready, job.not_before_ms)
    }
}

/// Checks the fields of one job against its state and the counters.
fn check_job(
    job_id: u64,
    job: &Job,
    last_job_id: u64,
    last_token: u64,
    cluster_time_ms: u64,
) -> Result<(), String> {
    let fail = |what: &str| Err(format!("job {job_id} ({}): {what}", job.state.as_str()));
    if job.id != job_id {
        return fail(&format!("stored under id {job_id} but names id {}", job.id));
    }
    if job_id == 0 || job_id > last_job_id {
        return fail(&format!("id outside 1..={last_job_id}"));
    }
    if job.tags.windows(2).any(|pair| pair[0] >= pair[1]) {
        return fail("tags not sorted and deduplicated");
    }
    if let Some(lease) = &job.lease {
        if lease.job_id != job_id {
            return fail(&format!("lease names job {}", lease.job_id));
        }
        if lease.token == 0 || lease.token > last_token {
            return fail(&format!("lease token {} outside 1..={last_token}", lease.token));
        }
        if lease.expires_at_ms < lease.granted_at_ms {
            return fail("lease expires before it was granted");
        }
    }
    let live = job.attempts < job.max_attempts;
    // A ready or dead job keeps only a lease a sweep took back: one that
    // had lapsed, and whose lapse is the job's last failure.
    let swept = job.lease.as_ref().is_none_or(|lease| {
        lease.expires_at_ms <= cluster_time_ms
            && job.last_error.as_deref() == Some(LEASE_EXPIRED_ERROR)
    });
    match job.state {
        JobState::Ready | JobState::Dead if !swept => fail("holds a lease no sweep took back"),
        JobState::Ready if job.finished_at_ms.is_some() => fail("ready job has finished"),
        JobState::Ready if !live => fail("ready job has used all attempts"),
        JobState::Claimed if job.lease.is_none() => fail("claimed job has no lease"),
        JobState::Claimed if job.finished_at_ms.is_some() => fail("claimed job has finished"),
        JobState::Claimed if !live => fail("claimed job has used all attempts"),
        JobState::Acked if job.lease.is_none() => fail("acked job lost its last lease"),
        JobState::Acked if job.finished_at_ms.is_none() => fail("acked job has no finish time"),
        JobState::Dead if job.finished_at_ms.is_none() => fail("dead job has no finish time"),
        JobState::Dead if live => fail("dead job has attempts left"),
        _ => Ok(()),
    }
}

mod frozen;
mod queries;
mod recent;
mod requests;
mod schedule_commands;
use schedule_commands::Watch;
#[cfg(test)]
mod tests;
