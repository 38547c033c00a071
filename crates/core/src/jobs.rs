//! The job table: every retained job by id, the live ones (ready,
//! claimed, dead) in their compact form ([`LiveTable`]) and the acked
//! tombstones as encoded records ([`TombTable`]), read as one table in id
//! order.
//!
//! A job moves to the tombstone side when it is stored acked, and a
//! tombstone read out of it is decoded into the same [`StoredJob`] it was
//! stored as, so everything read from the table (snapshots, digests,
//! listings, answers) is what one table of [`StoredJob`]s gave.

use std::borrow::Cow;
use std::iter::Peekable;
use std::ops::{Bound, RangeBounds};

use crate::job::{JobState, StoredJob, tomb_queue};
use crate::live_table::LiveTable;
use crate::tomb_table::TombTable;

/// Every retained job by id (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct JobTable {
    live: LiveTable,
    tombs: TombTable,
}

/// A job read from the table: borrowed when live, decoded when a tombstone.
pub(crate) type JobRead<'a> = Cow<'a, StoredJob>;

impl JobTable {
    /// Jobs in the table, tombstones included.
    pub(crate) fn len(&self) -> usize {
        self.live.len().saturating_add(self.tombs.len())
    }

    /// The job `id`, if retained.
    pub(crate) fn get(&self, id: &u64) -> Option<JobRead<'_>> {
        match self.live.get(id) {
            Some(job) => Some(Cow::Borrowed(job)),
            None => self.tombs.get(*id).map(|record| Cow::Owned(decode(*id, record))),
        }
    }

    /// The job `id` if it is retained and live (not acked): what the
    /// paths that only ever look at held or ready jobs read, without
    /// decoding a tombstone.
    pub(crate) fn live(&self, id: &u64) -> Option<&StoredJob> {
        self.live.get(id)
    }

    /// No acked job among the live ones (where [`JobTable::insert`] never
    /// puts one), for `State::check_invariants`.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self.live.iter().find(|(_, job)| job.state == JobState::Acked) {
            Some((id, _)) => Err(format!("job {id}: acked but kept as a live job")),
            None => Ok(()),
        }
    }

    /// The queue of job `id`, if retained (no copy, no decoding).
    pub(crate) fn queue_of(&self, id: u64) -> Option<&str> {
        match self.live.get(&id) {
            Some(job) => Some(&job.queue),
            None => self.tombs.get(id).map(tomb_queue),
        }
    }

    /// Stores `job` as `id`: acked, as a tombstone record; otherwise live.
    pub(crate) fn insert(&mut self, id: u64, job: StoredJob) {
        if job.state == JobState::Acked {
            self.live.remove(&id);
            self.tombs.insert(id, &job.to_record(id));
        } else {
            self.tombs.remove(id);
            self.live.insert(id, job);
        }
    }

    /// Takes the job `id` out of the table.
    pub(crate) fn remove(&mut self, id: &u64) -> Option<StoredJob> {
        match self.live.remove(id) {
            Some(job) => Some(job),
            None => self.tombs.remove(*id).map(|record| decode(*id, &record)),
        }
    }

    /// Every job in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, JobRead<'_>)> {
        self.range(..)
    }

    /// The jobs whose ids are in `range`, in id order.
    pub(crate) fn range(
        &self,
        range: impl RangeBounds<u64>,
    ) -> impl Iterator<Item = (u64, JobRead<'_>)> {
        let low = match range.start_bound() {
            Bound::Included(&id) => Some(id),
            Bound::Excluded(&id) => id.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let high = match range.end_bound() {
            Bound::Included(&id) => Some(id),
            Bound::Excluded(&id) => id.checked_sub(1),
            Bound::Unbounded => Some(u64::MAX),
        };
        let (low, high) = match (low, high) {
            (Some(low), Some(high)) => (low, high),
            // An empty range: nothing below 0 or above the largest id.
            _ => (1, 0),
        };
        let live = self.live.range(low..=high).map(|(&id, job)| (id, Cow::Borrowed(job)));
        let tombs =
            self.tombs.range(low, high).map(|(id, record)| (id, Cow::Owned(decode(id, record))));
        Merge { a: live.peekable(), b: tombs.peekable() }
    }

    /// The `n` jobs with the largest ids, largest first.
    pub(crate) fn newest(&self, n: usize) -> Vec<(u64, JobRead<'_>)> {
        let live = self.live.iter().rev().take(n).map(|(&id, job)| (id, Cow::Borrowed(job)));
        let tombs = self.tombs.range(0, u64::MAX).rev().take(n);
        let tombs = tombs.map(|(id, record)| (id, Cow::Owned(decode(id, record))));
        let mut newest: Vec<(u64, JobRead<'_>)> = live.chain(tombs).collect();
        newest.sort_unstable_by(|(a, _), (b, _)| b.cmp(a));
        newest.truncate(n);
        newest
    }

    /// The tombstones: for a purge, which reads their finish times.
    pub(crate) fn tombs(&self) -> &TombTable {
        &self.tombs
    }
}

/// A tombstone record back in its stored form.
fn decode(id: u64, record: &[u8]) -> StoredJob {
    StoredJob::from_record(id, record, None)
}

/// Two iterators ascending by id, with no id in both, read as one.
struct Merge<A: Iterator, B: Iterator> {
    a: Peekable<A>,
    b: Peekable<B>,
}

impl<'t, A, B> Iterator for Merge<A, B>
where
    A: Iterator<Item = (u64, JobRead<'t>)>,
    B: Iterator<Item = (u64, JobRead<'t>)>,
{
    type Item = (u64, JobRead<'t>);

    fn next(&mut self) -> Option<Self::Item> {
        match (self.a.peek(), self.b.peek()) {
            (Some((a, _)), Some((b, _))) if b < a => self.b.next(),
            (Some(_), _) => self.a.next(),
            (None, _) => self.b.next(),
        }
    }
}

impl FromIterator<(u64, StoredJob)> for JobTable {
    fn from_iter<I: IntoIterator<Item = (u64, StoredJob)>>(jobs: I) -> Self {
        let mut table = JobTable::default();
        for (id, job) in jobs {
            table.insert(id, job);
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::job::{Backoff, Job};
    use crate::lease::Lease;

    /// A job in one of a few shapes: ready, claimed, acked with or without
    /// a payload, result or settings of its own.
    fn job(id: u64, shape: u8) -> StoredJob {
        let lease = Lease {
            job_id: id,
            holder: format!("worker-{shape}"),
            token: id * 3,
            epoch: 2,
            granted_at_ms: 1_700_000_000_000,
            expires_at_ms: 1_700_000_030_000,
        };
        let mut job = Job {
            id,
            queue: if shape.is_multiple_of(2) { "a" } else { "bb" }.into(),
            payload: vec![shape; usize::from(shape % 4) * 20],
            priority: i32::from(shape) - 3,
            not_before_ms: 1_699_999_999_000,
            max_attempts: 5,
            backoff: Backoff::default(),
            lease_ttl_ms: 30_000,
            idempotency_key: None,
            tags: Vec::new(),
            attempts: u32::from(shape % 3),
            last_error: None,
            state: JobState::Ready,
            lease: None,
            enqueued_at_ms: 1_699_999_999_000,
            finished_at_ms: None,
            result: None,
        };
        match shape % 5 {
            0 => {}
            1 => {
                job.state = JobState::Claimed;
                job.lease = Some(lease);
            }
            2 => {
                job.state = JobState::Acked;
                job.lease = Some(lease);
                job.finished_at_ms = Some(1_700_000_010_000);
            }
            3 => {
                job.state = JobState::Acked;
                job.lease = Some(lease);
                job.finished_at_ms = Some(1_700_000_010_000);
                job.result = Some(b"output".to_vec());
                job.idempotency_key = Some("key".into());
                job.tags = vec!["eu".into(), "gpu".into()];
                job.max_attempts = 9;
                job.last_error = Some("lease expired".into());
            }
            _ => {
                // Acked with times far apart and no finish time at all.
                job.state = JobState::Acked;
                job.not_before_ms = u64::MAX;
                job.enqueued_at_ms = 0;
            }
        }
        StoredJob::from_job(job, Arc::from(if shape.is_multiple_of(2) { "a" } else { "bb" }))
    }

    proptest! {
        /// The table and a plain map of stored jobs fed the same inserts
        /// and removes give the same jobs back, in the same order, from
        /// every read.
        #[test]
        fn reads_like_one_map_of_stored_jobs(
            ops in proptest::collection::vec((any::<bool>(), 0u64..200, 0u8..10), 0..200),
            low in 0u64..210,
            span in 0u64..210,
        ) {
            let mut table = JobTable::default();
            let mut map = BTreeMap::new();
            for (add, id, shape) in ops {
                if add {
                    table.insert(id, job(id, shape));
                    map.insert(id, job(id, shape));
                } else {
                    prop_assert_eq!(table.remove(&id), map.remove(&id));
                }
                prop_assert_eq!(table.len(), map.len());
            }
            for id in 0..200 {
                prop_assert_eq!(table.get(&id).map(Cow::into_owned), map.get(&id).cloned());
                prop_assert_eq!(table.queue_of(id), map.get(&id).map(|job| &*job.queue));
            }
            let all: Vec<(u64, StoredJob)> =
                table.iter().map(|(id, job)| (id, job.into_owned())).collect();
            let expected: Vec<(u64, StoredJob)> =
                map.iter().map(|(id, job)| (*id, job.clone())).collect();
            prop_assert_eq!(all, expected);
            let high = low.saturating_add(span);
            let ids = |read: Vec<u64>| read;
            prop_assert_eq!(
                ids(table.range(low..=high).map(|(id, _)| id).collect()),
                ids(map.range(low..=high).map(|(id, _)| *id).collect())
            );
            prop_assert_eq!(
                ids(table.range(low..high.max(low)).map(|(id, _)| id).collect()),
                ids(map.range(low..high.max(low)).map(|(id, _)| *id).collect())
            );
            prop_assert_eq!(
                ids(table.newest(7).into_iter().map(|(id, _)| id).collect()),
                ids(map.keys().rev().take(7).copied().collect())
            );
        }
    }

    #[test]
    fn a_default_tombstone_record_is_small() {
        let tomb = job(1_000_000, 2);
        let record = tomb.to_record(1_000_000);
        assert_eq!(StoredJob::from_record(1_000_000, &record, None), tomb);
        // Without a payload, a default tombstone is its finish time,
        // queue, lease (holder, token, epoch, two times) and a few small
        // numbers.
        let bare = job(1_000_000, 12);
        assert!(bare.payload.is_empty() && bare.state == JobState::Acked);
        let size = bare.to_record(1_000_000).len();
        assert!(size <= 40, "a default tombstone's record is {size} bytes");
    }

    #[test]
    fn empty_and_extreme_ranges_read_nothing_or_everything() {
        let table: JobTable = (0..10).map(|id| (id, job(id, (id % 10) as u8))).collect();
        assert_eq!(table.range(5..5).count(), 0);
        assert_eq!(table.range(..0).count(), 0);
        assert_eq!(table.range((Bound::Excluded(u64::MAX), Bound::Unbounded)).count(), 0);
        assert_eq!(table.range(..).count(), 10);
        assert_eq!(table.range(9..=u64::MAX).count(), 1);
    }
}
