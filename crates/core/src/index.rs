//! Secondary indexes over the job table, so `apply` never scans every job:
//! claim order per queue and tag set, due times per queue, ids per queue and state,
//! lease expiries and idempotency keys. Acked tombstones need no index of
//! their own for a purge: their table finds the old ones (`TombTable`).
//!
//! Every index is a pure function of the job table ([`Indexes::rebuild`]).
//! The state machine keeps them up to date by removing a job's entries
//! before it changes the job and inserting them again after
//! ([`Indexes::remove`], [`Indexes::insert`]); snapshots do not carry them
//! and rebuild them on load. `State::check_invariants` compares the live
//! indexes with a rebuild, which is what lets property tests catch an index
//! that drifted.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use crate::id_set::IdSet;
use crate::job::{JobState, StoredJob};
use crate::jobs::JobTable;

/// Claim order of a ready job: priority descending, then `not_before_ms`
/// ascending, then id ascending. `Reverse` turns the set's ascending order
/// into "highest priority first".
pub(crate) type ClaimKey = (Reverse<i32>, u64, u64);

/// A `(time_ms, job_id)` pair: orders jobs by a time, ties broken by id so
/// every replica iterates identically.
pub(crate) type TimedId = (u64, u64);

/// A job's tags as a set: sorted, each once. Jobs with equal tag sets are
/// claimable by exactly the same selectors.
pub(crate) type TagSet = Vec<String>;

/// The indexes of one queue. An entry exists only while the queue holds at
/// least one job, so a rebuilt index equals an incrementally kept one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct QueueIndex {
    /// Ready jobs in claim order, grouped by tag set, so a claim looks only
    /// at the jobs its selector can take: a backlog of jobs for a tag no
    /// worker has costs a claim one set comparison, not a walk over them.
    /// A group exists only while it holds a job.
    pub(crate) claim_order: BTreeMap<TagSet, BTreeSet<ClaimKey>>,
    /// Ready jobs by `(not_before_ms, id)`: what is due, and when the next
    /// one will be.
    pub(crate) due_order: BTreeSet<TimedId>,
    /// Ids of ready jobs.
    pub(crate) ready: IdSet,
    /// Ids of claimed jobs.
    pub(crate) claimed: IdSet,
    /// Ids of acked tombstones.
    pub(crate) acked: IdSet,
    /// Ids of dead jobs.
    pub(crate) dead: IdSet,
}

impl QueueIndex {
    /// Ids of this queue's jobs in `state`, ascending.
    pub(crate) fn ids(&self, state: JobState) -> &IdSet {
        match state {
            JobState::Ready => &self.ready,
            JobState::Claimed => &self.claimed,
            JobState::Acked => &self.acked,
            JobState::Dead => &self.dead,
        }
    }

    fn ids_mut(&mut self, state: JobState) -> &mut IdSet {
        match state {
            JobState::Ready => &mut self.ready,
            JobState::Claimed => &mut self.claimed,
            JobState::Acked => &mut self.acked,
            JobState::Dead => &mut self.dead,
        }
    }

    /// True when no job of the queue is left in any state. The claim and due
    /// orders mirror `ready`, so checking the id sets suffices.
    fn is_empty(&self) -> bool {
        self.ready.is_empty()
            && self.claimed.is_empty()
            && self.acked.is_empty()
            && self.dead.is_empty()
    }

    /// Up to `max` ready jobs due at `now_ms` whose tags all appear in
    /// `selector`, in claim order. Only the tag-set groups the selector
    /// covers are read; within each, the first `max` due jobs are taken
    /// (see [`due_in_claim_order`]) and the groups' picks are merged. A
    /// claim so costs O(G + M·max·log n) for G tag sets in the queue, M of
    /// them matching, whatever the number of jobs.
    pub(crate) fn claimable(&self, selector: &[String], now_ms: u64, max: usize) -> Vec<u64> {
        let selector: BTreeSet<&str> = selector.iter().map(String::as_str).collect();
        let mut picks: Vec<ClaimKey> = Vec::new();
        for (tags, order) in &self.claim_order {
            if tags.iter().all(|tag| selector.contains(tag.as_str())) {
                picks.extend(due_in_claim_order(order, now_ms, max));
            }
        }
        picks.sort_unstable();
        picks.truncate(max);
        picks.into_iter().map(|(_, _, job_id)| job_id).collect()
    }
}

/// Up to `max` jobs of `order` due at `now_ms`, in claim order. Within one
/// priority the jobs are ordered by `not_before_ms`, so the first job that
/// is not yet due ends that priority and the scan jumps to the next lower
/// one instead of walking the delayed jobs.
fn due_in_claim_order(order: &BTreeSet<ClaimKey>, now_ms: u64, max: usize) -> Vec<ClaimKey> {
    let mut found = Vec::new();
    let mut from: Bound<ClaimKey> = Bound::Unbounded;
    'priorities: while found.len() < max {
        for &key in order.range((from, Bound::Unbounded)) {
            let (Reverse(priority), not_before_ms, _) = key;
            if not_before_ms > now_ms {
                match priority.checked_sub(1) {
                    Some(lower) => {
                        from = Bound::Included((Reverse(lower), 0, 0));
                        continue 'priorities;
                    }
                    None => break 'priorities,
                }
            }
            found.push(key);
            if found.len() >= max {
                break 'priorities;
            }
        }
        // The range ran out: every ready job has been considered.
        break;
    }
    found
}

/// All secondary indexes of the job table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Indexes {
    /// Per-queue indexes, by queue name. The key is the one allocation of
    /// the name: every stored job of the queue shares it.
    pub(crate) queues: BTreeMap<Arc<str>, QueueIndex>,
    /// Current leases of claimed jobs by `(expires_at_ms, job_id)`: what
    /// `Sweep` must return, and when the next lease lapses.
    pub(crate) expiries: BTreeSet<TimedId>,
    /// Idempotency keys: queue → key → id of the job that first used it.
    /// Independent of job state: an entry lives as long as its job.
    pub(crate) idempotency: BTreeMap<Arc<str>, BTreeMap<String, u64>>,
}

impl Indexes {
    /// Builds every index from the job table alone. If two jobs share an
    /// idempotency key (which `apply` never allows) the lower id wins, as it
    /// would have at enqueue time.
    pub(crate) fn rebuild(jobs: &JobTable) -> Indexes {
        let mut indexes = Indexes::default();
        for (id, job) in jobs.iter() {
            indexes.insert(id, &job);
            indexes.insert_key(id, &job);
        }
        indexes
    }

    /// The shared name of `queue`: the index's key while the queue holds a
    /// job, a new allocation otherwise.
    pub(crate) fn queue_name(&self, queue: &str) -> Arc<str> {
        match self.queues.get_key_value(queue) {
            Some((name, _)) => Arc::clone(name),
            None => Arc::from(queue),
        }
    }

    /// Adds the state-dependent entries of `job` (everything but its
    /// idempotency key).
    pub(crate) fn insert(&mut self, id: u64, job: &StoredJob) {
        let queue = match self.queues.get_mut(&*job.queue) {
            Some(queue) => queue,
            None => self.queues.entry(Arc::clone(&job.queue)).or_default(),
        };
        queue.ids_mut(job.state).insert(id);
        match job.state {
            JobState::Ready => {
                let key = claim_key(id, job);
                match queue.claim_order.get_mut(job.tags()) {
                    Some(group) => {
                        group.insert(key);
                    }
                    None => {
                        queue.claim_order.entry(job.tags().to_vec()).or_default().insert(key);
                    }
                }
                queue.due_order.insert((job.not_before_ms, id));
            }
            JobState::Claimed => {
                if let Some(lease) = job.lease() {
                    self.expiries.insert((lease.expires_at_ms, id));
                }
            }
            JobState::Acked | JobState::Dead => {}
        }
    }

    /// Removes the state-dependent entries of `job`, exactly those
    /// [`Indexes::insert`] added for it in its current state.
    pub(crate) fn remove(&mut self, id: u64, job: &StoredJob) {
        if let Some(queue) = self.queues.get_mut(&*job.queue) {
            queue.ids_mut(job.state).remove(id);
            if job.state == JobState::Ready {
                let tags = job.tags();
                if let Some(group) = queue.claim_order.get_mut(tags) {
                    group.remove(&claim_key(id, job));
                    if group.is_empty() {
                        queue.claim_order.remove(tags);
                    }
                }
                queue.due_order.remove(&(job.not_before_ms, id));
            }
            if queue.is_empty() {
                self.queues.remove(&*job.queue);
            }
        }
        match job.state {
            JobState::Claimed => {
                if let Some(lease) = job.lease() {
                    self.expiries.remove(&(lease.expires_at_ms, id));
                }
            }
            JobState::Ready | JobState::Acked | JobState::Dead => {}
        }
    }

    /// The job that first used `key` in `queue`, while it is retained.
    pub(crate) fn key_owner(&self, queue: &str, key: &str) -> Option<u64> {
        self.idempotency.get(queue)?.get(key).copied()
    }

    /// Records `job`'s idempotency key, unless an earlier job holds it.
    pub(crate) fn insert_key(&mut self, id: u64, job: &StoredJob) {
        if let Some(key) = job.idempotency_key() {
            self.idempotency
                .entry(Arc::clone(&job.queue))
                .or_default()
                .entry(key.to_owned())
                .or_insert(id);
        }
    }

    /// Forgets `job`'s idempotency key if `job` is the one holding it.
    pub(crate) fn remove_key(&mut self, id: u64, job: &StoredJob) {
        let Some(key) = job.idempotency_key() else {
            return;
        };
        if let Some(keys) = self.idempotency.get_mut(&*job.queue) {
            if keys.get(key) == Some(&id) {
                keys.remove(key);
            }
            if keys.is_empty() {
                self.idempotency.remove(&*job.queue);
            }
        }
    }
}

/// The claim-order key of a ready job.
fn claim_key(id: u64, job: &StoredJob) -> ClaimKey {
    (Reverse(job.priority), job.not_before_ms, id)
}
