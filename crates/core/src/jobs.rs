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
use std::collections::BTreeMap;
use std::iter::Peekable;
use std::ops::{Bound, RangeBounds};

use crate::job::{JobState, StoredJob, tomb_names, tomb_queue};
use crate::live_table::LiveTable;
use crate::tomb_table::TombTable;

/// Every retained job by id (see the module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct JobTable {
    live: LiveTable,
    tombs: TombTable,
    /// The queue and holder names the tombstone records refer to.
    names: Names,
}

/// Names by number, counted: a tombstone record names its queue and its
/// lease's holder by number (a byte or two) instead of spelling them out,
/// and a name is forgotten with the last record that uses it. Which
/// number a name gets depends on the order records came in, so two
/// tables are compared by what their records say, never by the numbers.
#[derive(Clone, Debug, Default)]
struct Names {
    /// Number → name and how many record fields use it (`None`: free).
    slots: Vec<Option<(Box<str>, u64)>>,
    /// Name → number.
    numbers: BTreeMap<Box<str>, u32>,
    /// Numbers free for reuse.
    free: Vec<u32>,
}

impl Names {
    /// The number of `name`, counting one more use of it.
    fn take(&mut self, name: &str) -> u32 {
        if let Some(&number) = self.numbers.get(name) {
            if let Some(Some((_, uses))) = self.slots.get_mut(number as usize) {
                *uses = uses.saturating_add(1);
            }
            return number;
        }
        let slot = Some((Box::from(name), 1));
        let number = match self.free.pop() {
            Some(number) => {
                if let Some(free) = self.slots.get_mut(number as usize) {
                    *free = slot;
                }
                number
            }
            None => {
                self.slots.push(slot);
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.numbers.insert(Box::from(name), number);
        number
    }

    /// Counts one use of `number` less, forgetting the name at none.
    fn give_back(&mut self, number: u32) {
        let Some(slot) = self.slots.get_mut(number as usize) else { return };
        let Some((name, uses)) = slot else { return };
        *uses = uses.saturating_sub(1);
        if *uses == 0 {
            self.numbers.remove(&**name);
            *slot = None;
            self.free.push(number);
        }
    }

    /// The name of `number` (empty if none: records only use numbers they
    /// took).
    fn name(&self, number: u32) -> &str {
        match self.slots.get(number as usize) {
            Some(Some((name, _))) => name,
            _ => "",
        }
    }
}

impl PartialEq for JobTable {
    /// Equal when they hold the same jobs: the tombstones are compared as
    /// the jobs they decode to, whatever numbers their names got.
    fn eq(&self, other: &Self) -> bool {
        self.live == other.live
            && self.tombs.len() == other.tombs.len()
            && self.tomb_jobs(0, u64::MAX).eq(other.tomb_jobs(0, u64::MAX))
    }
}

impl Eq for JobTable {}

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
            None => self.tombs.get(*id).map(|record| Cow::Owned(self.decode(*id, record))),
        }
    }

    /// The job `id` if it is retained and live (not acked): what the
    /// paths that only ever look at held or ready jobs read, without
    /// decoding a tombstone.
    pub(crate) fn live(&self, id: &u64) -> Option<&StoredJob> {
        self.live.get(id)
    }

    /// No acked job among the live ones (where [`JobTable::insert`] never
    /// puts one), the tombstone pages in step with their records, and each
    /// name counted exactly as often as records use it. For
    /// `State::check_invariants`.
    pub(crate) fn check(&self) -> Result<(), String> {
        if let Some((id, _)) = self.live.iter().find(|(_, job)| job.state == JobState::Acked) {
            return Err(format!("job {id}: acked but kept as a live job"));
        }
        self.tombs.check()?;
        let mut uses: BTreeMap<u32, u64> = BTreeMap::new();
        for (_, record) in self.tombs.range(0, u64::MAX) {
            let (queue, holder) = tomb_names(record);
            for number in std::iter::once(queue).chain(holder) {
                let count = uses.entry(number).or_default();
                *count = count.saturating_add(1);
            }
        }
        let counted: BTreeMap<u32, u64> = self
            .names
            .slots
            .iter()
            .enumerate()
            .filter_map(|(number, slot)| {
                slot.as_ref().map(|(_, n)| (u32::try_from(number).unwrap_or(u32::MAX), *n))
            })
            .collect();
        let numbered = self.names.numbers.len() == counted.len()
            && self.names.numbers.iter().all(|(name, number)| self.names.name(*number) == &**name);
        if counted != uses || !numbered {
            return Err("the tombstones' names are not counted as their records use them".into());
        }
        Ok(())
    }

    /// The queue of job `id`, if retained (no copy, no decoding).
    pub(crate) fn queue_of(&self, id: u64) -> Option<&str> {
        match self.live.get(&id) {
            Some(job) => Some(&job.queue),
            None => self.tombs.get(id).and_then(tomb_queue).map(|number| self.names.name(number)),
        }
    }

    /// Stores `job` as `id`: acked, as a tombstone record; otherwise live.
    pub(crate) fn insert(&mut self, id: u64, job: StoredJob) {
        if job.state == JobState::Acked {
            self.live.remove(&id);
            let names = &mut self.names;
            let record = job.to_record(id, |name| names.take(name));
            if let Some(old) = self.tombs.insert(id, &record) {
                self.forget(&old);
            }
        } else {
            if let Some(old) = self.tombs.remove(id) {
                self.forget(&old);
            }
            self.live.insert(id, job);
        }
    }

    /// Takes the job `id` out of the table.
    pub(crate) fn remove(&mut self, id: &u64) -> Option<StoredJob> {
        match self.live.remove(id) {
            Some(job) => Some(job),
            None => {
                let record = self.tombs.remove(*id)?;
                let job = self.decode(*id, &record);
                self.forget(&record);
                Some(job)
            }
        }
    }

    /// Gives back the names a record that left the table used.
    fn forget(&mut self, record: &[u8]) {
        let (queue, holder) = tomb_names(record);
        self.names.give_back(queue);
        if let Some(holder) = holder {
            self.names.give_back(holder);
        }
    }

    /// A tombstone record back in its stored form.
    fn decode(&self, id: u64, record: &[u8]) -> StoredJob {
        StoredJob::from_record(id, record, |number| self.names.name(number))
    }

    /// The tombstones with ids in `low..=high`, decoded, in id order (and
    /// back).
    fn tomb_jobs(
        &self,
        low: u64,
        high: u64,
    ) -> impl DoubleEndedIterator<Item = (u64, StoredJob)> + '_ {
        self.tombs.range(low, high).map(|(id, record)| (id, self.decode(id, record)))
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
        let tombs = self.tomb_jobs(low, high).map(|(id, job)| (id, Cow::Owned(job)));
        Merge { a: live.peekable(), b: tombs.peekable() }
    }

    /// The `n` jobs with the largest ids, largest first.
    pub(crate) fn newest(&self, n: usize) -> Vec<(u64, JobRead<'_>)> {
        let live = self.live.iter().rev().take(n).map(|(&id, job)| (id, Cow::Borrowed(job)));
        let tombs = self.tomb_jobs(0, u64::MAX).rev().take(n);
        let tombs = tombs.map(|(id, job)| (id, Cow::Owned(job)));
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
            // Built in another order its names get other numbers; it is
            // still the same table.
            let rebuilt: JobTable = map.iter().rev().map(|(id, job)| (*id, job.clone())).collect();
            prop_assert_eq!(&rebuilt, &table);
            // A name is kept exactly while a record uses it.
            let used: std::collections::BTreeSet<String> = map
                .values()
                .filter(|job| job.state == JobState::Acked)
                .flat_map(|job| {
                    std::iter::once(job.queue.to_string())
                        .chain(job.lease().map(|lease| lease.holder.clone()))
                })
                .collect();
            let kept: std::collections::BTreeSet<String> =
                table.names.numbers.keys().map(|name| name.to_string()).collect();
            prop_assert_eq!(kept, used);
            for id in map.keys().copied().collect::<Vec<_>>() {
                table.remove(&id);
            }
            prop_assert!(table.names.numbers.is_empty(), "names outlived their records");
        }
    }

    #[test]
    fn a_default_tombstone_record_is_small() {
        let tomb = job(1_000_000, 2);
        let mut table = JobTable::default();
        table.insert(1_000_000, tomb.clone());
        assert_eq!(table.get(&1_000_000).map(Cow::into_owned), Some(tomb));
        // Without a payload, a default tombstone is its finish time, its
        // queue's and holder's numbers, the lease's token, epoch and two
        // times as differences, and a few small numbers.
        let bare = job(1_000_000, 12);
        assert!(bare.payload.is_empty() && bare.state == JobState::Acked);
        let size = bare.to_record(1_000_000, |_| 0).len();
        assert!(size <= 30, "a default tombstone's record is {size} bytes");
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
