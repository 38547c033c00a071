//! A consistent view of the state at one log position, read a chunk at a
//! time while `apply` goes on: how a snapshot of a million jobs is written
//! without holding the state for the whole write and without a second copy
//! of it.
//!
//! [`State::freeze`] records the small parts (counters, schedules, nodes,
//! the request log) and where the job table stands: the last job id and the
//! number of jobs. From then on, the first change to a job the view has not
//! yet been read past keeps the job's frozen form aside (copy on write, once
//! per job); jobs enqueued after the freeze have larger ids and are not in
//! the view. [`State::read_frozen_jobs`] hands out the view's jobs in id
//! order, the kept form where there is one, and forgets what it handed out.
//! So memory grows by the jobs changed during a snapshot, never by the
//! table, and each call holds the state only for one chunk.
//!
//! The view is bookkeeping beside the replicated state: it is not
//! serialized, not compared and not cloned, and it changes nothing `apply`
//! decides.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;

use super::State;
use super::requests::RequestLog;
use crate::job::{JobRef, StoredJob};
use crate::node_info::NodeInfo;
use crate::schedule::Schedule;

/// The frozen view's bookkeeping, kept inside the [`State`] it belongs to.
#[derive(Default)]
pub(crate) struct FrozenView(Option<Box<Frozen>>);

struct Frozen {
    /// Which freeze this is, so a reader of an older one is refused.
    ticket: u64,
    /// The last job id at the freeze: larger ids are not in the view.
    last_id: u64,
    /// Jobs with smaller ids were handed out already.
    next_id: u64,
    /// The frozen form of every job of the view, not yet handed out, that
    /// changed or was purged since the freeze.
    kept: BTreeMap<u64, StoredJob>,
}

impl Clone for FrozenView {
    /// A clone of a state is no part of a snapshot in progress.
    fn clone(&self) -> Self {
        FrozenView(None)
    }
}

impl PartialEq for FrozenView {
    /// Bookkeeping, not state: two states are equal whatever they are being
    /// read for.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for FrozenView {}

impl std::fmt::Debug for FrozenView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(frozen) => {
                write!(f, "FrozenView(ticket {}, kept {})", frozen.ticket, frozen.kept.len())
            }
            None => write!(f, "FrozenView(none)"),
        }
    }
}

impl FrozenView {
    /// Keeps `job`'s frozen form, before the first change to it, if the
    /// view holds it and has not handed it out yet.
    pub(crate) fn before_change(&mut self, id: u64, job: &StoredJob) {
        if let Some(frozen) = self.0.as_deref_mut()
            && id >= frozen.next_id
            && id <= frozen.last_id
        {
            frozen.kept.entry(id).or_insert_with(|| job.clone());
        }
    }
}

/// What a frozen view starts with: the counters, and how many jobs follow.
/// Serialized, the counters are the state's first three fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrozenHead {
    /// Names this freeze to [`State::read_frozen_jobs`].
    pub ticket: u64,
    /// Cluster time, last token and last job id, in the state's order.
    pub counters: (u64, u64, u64),
    /// How many jobs the view holds (the length of the job table as
    /// written).
    pub job_count: u64,
}

/// What a frozen view ends with: the state's fields after the job table,
/// in their order (copies of the schedules and nodes, which are few; the
/// request log, up to 100,000 requests, shares its maps with the state).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FrozenTail {
    schedules: BTreeMap<String, Schedule>,
    nodes: BTreeMap<u64, NodeInfo>,
    epoch: u64,
    grace_end_ms: u64,
    requests: RequestLog,
}

/// One job of a frozen view: serializes as a `(id, Job)` entry of the job
/// table.
pub struct FrozenJob<'a>(u64, JobRef<'a>);

impl FrozenJob<'_> {
    /// The job's id.
    pub fn id(&self) -> u64 {
        self.0
    }
}

impl Serialize for FrozenJob<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (self.0, &self.1).serialize(serializer)
    }
}

/// Why [`State::read_frozen_jobs`] could not go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the frozen view {ticket} is gone (the state was replaced or frozen again)")]
pub struct FrozenViewLost {
    /// The freeze that was asked for.
    pub ticket: u64,
}

impl State {
    /// Freezes the current state for reading in chunks: the head and tail
    /// of its serialized form, and a ticket for [`State::read_frozen_jobs`].
    /// A freeze in progress is dropped (its reader gets [`FrozenViewLost`]).
    /// Costs a copy of the schedules and nodes (a few); the request log is
    /// shared (a persistent map, copied in O(1)), the jobs are not copied.
    pub fn freeze(&mut self) -> (FrozenHead, FrozenTail) {
        let ticket = self.frozen.0.as_ref().map_or(1, |frozen| frozen.ticket.wrapping_add(1));
        self.frozen.0 = Some(Box::new(Frozen {
            ticket,
            last_id: self.last_job_id,
            next_id: 0,
            kept: BTreeMap::new(),
        }));
        let head = FrozenHead {
            ticket,
            counters: (self.cluster_time_ms, self.last_token, self.last_job_id),
            job_count: u64::try_from(self.jobs.len()).unwrap_or(u64::MAX),
        };
        let tail = FrozenTail {
            schedules: self.schedules.clone(),
            nodes: self.nodes.clone(),
            epoch: self.epoch,
            grace_end_ms: self.grace_end_ms,
            requests: self.requests.clone(),
        };
        (head, tail)
    }

    /// Hands the next (up to) `max` jobs of the frozen view `ticket` to
    /// `write`, in id order, as they were at the freeze; `write` answers
    /// whether it wants more in this call (so a caller can bound a chunk by
    /// bytes as well). Returns whether the view is exhausted (then it is
    /// dropped) or `write`'s first error (the view stays, the jobs of this
    /// call are handed out again next time).
    pub fn read_frozen_jobs<E>(
        &mut self,
        ticket: u64,
        max: usize,
        mut write: impl FnMut(FrozenJob<'_>) -> Result<bool, E>,
    ) -> Result<Result<bool, E>, FrozenViewLost> {
        let Some(frozen) = self.frozen.0.as_deref_mut().filter(|frozen| frozen.ticket == ticket)
        else {
            return Err(FrozenViewLost { ticket });
        };
        let range = frozen.next_id..=frozen.last_id;
        let mut live = self.jobs.range(range.clone()).peekable();
        let mut kept = frozen.kept.range(range).peekable();
        let mut handed = 0usize;
        let mut next_id = frozen.next_id;
        let exhausted = loop {
            let (id, job) = match (live.peek(), kept.peek()) {
                (None, None) => break true,
                _ if handed >= max => break false,
                (Some(&(live_id, _)), Some(&(&kept_id, _))) if kept_id <= live_id => {
                    if kept_id == live_id {
                        live.next();
                    }
                    match kept.next() {
                        Some((_, kept_job)) => (kept_id, Cow::Borrowed(kept_job)),
                        None => break true,
                    }
                }
                (Some(_), _) => match live.next() {
                    Some(next) => next,
                    None => break true,
                },
                (None, Some(_)) => match kept.next() {
                    Some((&kept_id, kept_job)) => (kept_id, Cow::Borrowed(kept_job)),
                    None => break true,
                },
            };
            let more = match write(FrozenJob(id, job.as_written(id))) {
                Ok(more) => more,
                Err(error) => return Ok(Err(error)),
            };
            handed += 1;
            next_id = id.saturating_add(1);
            if !more {
                // The view is exhausted only when nothing is left.
                break live.peek().is_none() && kept.peek().is_none();
            }
        };
        if exhausted {
            self.frozen.0 = None;
        } else {
            frozen.next_id = next_id;
            frozen.kept = frozen.kept.split_off(&next_id);
        }
        Ok(Ok(exhausted))
    }

    /// Drops the frozen view `ticket`, if it is still the current one (a
    /// snapshot given up half way).
    pub fn thaw(&mut self, ticket: u64) {
        if self.frozen.0.as_ref().is_some_and(|frozen| frozen.ticket == ticket) {
            self.frozen.0 = None;
        }
    }

    /// How many jobs the frozen view keeps aside (0 without one).
    pub fn frozen_kept(&self) -> usize {
        self.frozen.0.as_ref().map_or(0, |frozen| frozen.kept.len())
    }
}

#[cfg(test)]
mod tests {
    use crate::command::{Command, Proposal};
    use crate::job::JobSpec;
    use crate::response::Response;
    use crate::state::State;

    const DAY_MS: u64 = 24 * 60 * 60 * 1_000;

    fn apply(state: &mut State, now_ms: u64, command: Command) -> Response {
        state.apply(1, &Proposal { now_ms, command })
    }

    fn enqueue(state: &mut State, now_ms: u64, n: usize) {
        let jobs = (0..n)
            .map(|i| JobSpec {
                queue: if i % 3 == 0 { "a" } else { "b" }.into(),
                payload: vec![u8::try_from(i % 256).unwrap_or(0); 8],
                ..JobSpec::default()
            })
            .collect();
        apply(state, now_ms, Command::Enqueue { jobs });
    }

    /// Claims up to `max` of queue `b` and acks every other one.
    fn churn(state: &mut State, now_ms: u64, max: u32) {
        let claim = Command::Claim {
            worker: "w".into(),
            queue: "b".into(),
            max,
            lease_ttl_ms: None,
            selector: vec![],
        };
        let Response::Claimed(grants) = apply(state, now_ms, claim) else {
            panic!("a claim answers with grants");
        };
        for (i, grant) in grants.iter().enumerate() {
            let (job_id, token) = (grant.job.id, grant.lease.token);
            let command = if i % 2 == 0 {
                Command::Ack { job_id, token, result: Some(b"done".to_vec()) }
            } else {
                Command::Nack { job_id, token, error: "no".into(), retry_after_ms: None }
            };
            apply(state, now_ms, command);
        }
    }

    /// The bytes of a frozen view read `chunk` jobs at a time, with
    /// `between` applied to the state after every chunk.
    fn read_while(
        state: &mut State,
        chunk: usize,
        mut between: impl FnMut(&mut State, usize),
    ) -> Vec<u8> {
        let (head, tail) = state.freeze();
        let mut bytes = bincode::serialize(&head.counters).expect("encodes");
        bytes.extend(bincode::serialize(&head.job_count).expect("encodes"));
        let mut round = 0;
        let mut count = 0u64;
        loop {
            let done = state
                .read_frozen_jobs(head.ticket, chunk, |job| {
                    count += 1;
                    bincode::serialize_into(&mut bytes, &job)
                        .map(|()| true)
                        .map_err(|e| e.to_string())
                })
                .expect("the view is there")
                .expect("writes");
            if done {
                break;
            }
            between(state, round);
            round += 1;
        }
        assert_eq!(count, head.job_count, "as many jobs as the head says");
        bytes.extend(bincode::serialize(&tail).expect("encodes"));
        bytes
    }

    #[test]
    fn a_view_read_while_writes_go_on_is_the_state_at_the_freeze() {
        let mut state = State::new();
        enqueue(&mut state, 1_000, 300);
        churn(&mut state, 2_000, 100);
        let at_freeze = state.clone();
        let bytes = read_while(&mut state, 7, |state, round| {
            // Changes jobs before and after the read position, purges the
            // tombstones, enqueues new jobs.
            churn(state, 3_000 + round as u64, 5);
            enqueue(state, 3_000, 2);
            if round == 3 {
                apply(state, 2_000 + DAY_MS, Command::Purge);
            }
        });
        assert_ne!(state, at_freeze, "the writes changed the state");
        assert_eq!(bytes, bincode::serialize(&at_freeze).expect("encodes"));
        let read: State = bincode::deserialize(&bytes).expect("decodes");
        assert_eq!(read, at_freeze);
        assert_eq!(state.frozen_kept(), 0, "nothing kept once the view is read");
        assert!(
            state.read_frozen_jobs(1, 1, |_| Ok::<bool, ()>(true)).is_err(),
            "the view is gone"
        );
    }

    #[test]
    fn a_second_freeze_or_a_thaw_ends_the_first_view() {
        let mut state = State::new();
        enqueue(&mut state, 1_000, 10);
        let (first, _) = state.freeze();
        let (second, _) = state.freeze();
        assert!(state.read_frozen_jobs(first.ticket, 1, |_| Ok::<bool, ()>(true)).is_err());
        assert_eq!(
            state.read_frozen_jobs(second.ticket, 1, |_| Ok::<bool, ()>(true)),
            Ok(Ok(false))
        );
        churn(&mut state, 2_000, 10);
        assert!(state.frozen_kept() > 0, "changed jobs are kept for the view");
        state.thaw(second.ticket);
        assert_eq!(state.frozen_kept(), 0);
        assert!(state.read_frozen_jobs(second.ticket, 1, |_| Ok::<bool, ()>(true)).is_err());
        let unfrozen = state.clone();
        churn(&mut state, 3_000, 10);
        assert_ne!(state, unfrozen);
    }

    #[test]
    fn a_failed_write_hands_the_same_jobs_out_again() {
        let mut state = State::new();
        enqueue(&mut state, 1_000, 5);
        let (head, _) = state.freeze();
        let failed = state.read_frozen_jobs(head.ticket, 3, |job| {
            if job.id() == 2 { Err("disk full") } else { Ok(true) }
        });
        assert_eq!(failed, Ok(Err("disk full")));
        let mut ids = Vec::new();
        let mut read = |state: &mut State| {
            state.read_frozen_jobs(head.ticket, 10, |job| {
                ids.push(job.id());
                // A chunk the writer ends after job 3.
                Ok::<bool, ()>(job.id() != 3)
            })
        };
        assert_eq!(read(&mut state), Ok(Ok(false)), "ended early by the writer");
        assert_eq!(read(&mut state), Ok(Ok(true)));
        assert_eq!(ids, vec![1, 2, 3, 4, 5]);
    }
}
