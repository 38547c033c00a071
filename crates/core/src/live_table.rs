//! The live jobs (ready, claimed, dead) by id, packed in pages of
//! [`PAGE_IDS`] consecutive ids.
//!
//! Ids are handed out in order and jobs mostly leave in order (acked, then
//! purged by finish time), so a `BTreeMap<u64, StoredJob>` fed in id order
//! keeps its nodes a little over half full: a ready job cost about 150
//! bytes of B-tree for a 72-byte value. Here a page is one sorted vector
//! of the jobs whose ids share all but the last five bits, and the B-tree
//! holds pages: a full page is its jobs back to back (80 bytes each, id
//! included) and one B-tree entry for 32 jobs. A page that empties is
//! dropped, and one that falls to a quarter of its room gives half of it
//! back, so sparse tables (a few long-lived jobs among purged ones) cost at
//! most about twice their jobs, never a whole page each.
//!
//! Only memory changes: the table iterates in id order like the map it
//! replaced, so everything written from it (snapshots, digests, listings)
//! is byte for byte what it was.

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};

use crate::job::StoredJob;

/// Ids per page: the ids `p * PAGE_IDS .. (p + 1) * PAGE_IDS` share page `p`.
const PAGE_IDS: u64 = 32;

/// One page: its jobs sorted by id, with their ids.
type Page = Vec<(u64, StoredJob)>;

/// Every live job by id (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LiveTable {
    pages: BTreeMap<u64, Page>,
    len: usize,
}

/// The page an id belongs to.
fn page_of(id: u64) -> u64 {
    id / PAGE_IDS
}

impl LiveTable {
    /// Jobs in the table.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The job `id`, if retained.
    pub(crate) fn get(&self, id: &u64) -> Option<&StoredJob> {
        let page = self.pages.get(&page_of(*id))?;
        let at = page.binary_search_by_key(id, |(job_id, _)| *job_id).ok()?;
        page.get(at).map(|(_, job)| job)
    }

    /// Stores `job` as `id`, returning the job it replaces.
    pub(crate) fn insert(&mut self, id: u64, job: StoredJob) -> Option<StoredJob> {
        let page = self.pages.entry(page_of(id)).or_default();
        match page.binary_search_by_key(&id, |(job_id, _)| *job_id) {
            Ok(at) => page.get_mut(at).map(|(_, old)| std::mem::replace(old, job)),
            Err(at) => {
                page.insert(at, (id, job));
                self.len = self.len.saturating_add(1);
                None
            }
        }
    }

    /// Takes the job `id` out of the table.
    pub(crate) fn remove(&mut self, id: &u64) -> Option<StoredJob> {
        let key = page_of(*id);
        let page = self.pages.get_mut(&key)?;
        let at = page.binary_search_by_key(id, |(job_id, _)| *job_id).ok()?;
        let (_, job) = page.remove(at);
        self.len = self.len.saturating_sub(1);
        if page.is_empty() {
            self.pages.remove(&key);
        } else if page.len().saturating_mul(4) <= page.capacity() {
            // Half of the room, not all of it: a job changed in place is
            // taken out and put back, and must not reallocate each time.
            page.shrink_to(page.capacity() / 2);
        }
        Some(job)
    }

    /// Every job in id order (and back, with `rev`).
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (&u64, &StoredJob)> {
        self.pages.values().flat_map(|page| page.iter().map(|(id, job)| (id, job)))
    }

    /// The jobs whose ids are in `range`, in id order.
    pub(crate) fn range(
        &self,
        range: impl RangeBounds<u64>,
    ) -> impl DoubleEndedIterator<Item = (&u64, &StoredJob)> {
        let start = range.start_bound().cloned();
        let end = range.end_bound().cloned();
        let first_page = match start {
            Bound::Included(id) => page_of(id),
            Bound::Excluded(id) => page_of(id.saturating_add(1)),
            Bound::Unbounded => 0,
        };
        let last_page = match end {
            Bound::Included(id) => Some(page_of(id)),
            Bound::Excluded(0) => None,
            Bound::Excluded(id) => Some(page_of(id - 1)),
            Bound::Unbounded => Some(u64::MAX),
        };
        // An empty range of ids (an end before the start) reads no page.
        let pages = match last_page {
            Some(last_page) if first_page <= last_page => {
                Some(self.pages.range(first_page..=last_page))
            }
            _ => None,
        };
        pages.into_iter().flatten().flat_map(move |(_, page)| {
            let from = page.partition_point(|(id, _)| match start {
                Bound::Included(first) => *id < first,
                Bound::Excluded(after) => *id <= after,
                Bound::Unbounded => false,
            });
            let to = page.partition_point(|(id, _)| match end {
                Bound::Included(last) => *id <= last,
                Bound::Excluded(before) => *id < before,
                Bound::Unbounded => true,
            });
            page.get(from..to.max(from)).unwrap_or_default().iter().map(|(id, job)| (id, job))
        })
    }
}

impl FromIterator<(u64, StoredJob)> for LiveTable {
    fn from_iter<I: IntoIterator<Item = (u64, StoredJob)>>(jobs: I) -> Self {
        let mut table = LiveTable::default();
        for (id, job) in jobs {
            table.insert(id, job);
        }
        table
    }
}

impl<'a> IntoIterator for &'a LiveTable {
    type Item = (&'a u64, &'a StoredJob);
    type IntoIter = Box<dyn DoubleEndedIterator<Item = (&'a u64, &'a StoredJob)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::job::{Backoff, Job, JobState};

    fn job(marker: u8) -> StoredJob {
        let job = Job {
            id: 0,
            queue: "q".into(),
            payload: vec![marker],
            priority: 0,
            not_before_ms: 0,
            max_attempts: 5,
            backoff: Backoff::default(),
            lease_ttl_ms: 30_000,
            idempotency_key: None,
            tags: Vec::new(),
            attempts: 0,
            last_error: None,
            state: JobState::Ready,
            lease: None,
            enqueued_at_ms: 0,
            finished_at_ms: None,
            result: None,
        };
        StoredJob::from_job(job, Arc::from("q"))
    }

    /// The table and a plain map fed the same inserts and removes agree on
    /// every read, ranges of every shape included.
    #[test]
    fn the_table_reads_like_an_ordered_map() {
        let mut table = LiveTable::default();
        let mut map = BTreeMap::new();
        // Ids in order, out of order, across page edges, then removals that
        // empty some pages and thin others.
        let ids: Vec<u64> = (1..200).chain([1_000, 999, 31, 32, 33, 64, 63, 5_000]).collect();
        for (n, &id) in ids.iter().enumerate() {
            let marker = (n % 251) as u8;
            assert_eq!(table.insert(id, job(marker)), map.insert(id, job(marker)));
        }
        for id in (1..200).filter(|id| id % 3 != 0).chain([1_000, 64, 7_777]) {
            assert_eq!(table.remove(&id), map.remove(&id), "remove {id}");
        }
        assert_eq!(table.len(), map.len());
        let listed: Vec<(u64, StoredJob)> =
            table.iter().map(|(id, job)| (*id, job.clone())).collect();
        let expected: Vec<(u64, StoredJob)> =
            map.iter().map(|(id, job)| (*id, job.clone())).collect();
        assert_eq!(listed, expected);
        let backwards: Vec<u64> = table.iter().rev().map(|(id, _)| *id).collect();
        let expected_backwards: Vec<u64> = map.keys().rev().copied().collect();
        assert_eq!(backwards, expected_backwards);
        for id in [0, 1, 3, 31, 32, 33, 63, 64, 65, 198, 999, 1_000, 5_000, 6_000] {
            assert_eq!(table.get(&id), map.get(&id), "get {id}");
        }
        let bounds = [0, 1, 2, 30, 31, 32, 33, 63, 64, 96, 150, 999, 1_000, 5_000, u64::MAX];
        for &low in &bounds {
            // An end before the start: the table reads nothing, where a
            // map's range would panic.
            for &high in bounds.iter().filter(|&&high| high < low) {
                assert_eq!(table.range(low..=high).count(), 0, "{low}..={high}");
            }
            for &high in bounds.iter().filter(|&&high| high >= low) {
                let ids = |found: Vec<(&u64, &StoredJob)>| -> Vec<u64> {
                    found.into_iter().map(|(id, _)| *id).collect()
                };
                assert_eq!(
                    ids(table.range(low..=high).collect()),
                    ids(map.range(low..=high).collect()),
                    "{low}..={high}"
                );
                assert_eq!(
                    ids(table.range(low..high).collect()),
                    ids(map.range(low..high).collect()),
                    "{low}..{high}"
                );
                assert_eq!(
                    ids(table.range((Bound::Excluded(low), Bound::Included(high))).collect()),
                    ids(map
                        .range((Bound::Excluded(low), Bound::Included(high)))
                        .collect::<Vec<_>>()),
                    "({low}..={high}]"
                );
            }
            assert_eq!(
                table.range(low..).map(|(id, _)| *id).collect::<Vec<_>>(),
                map.range(low..).map(|(id, _)| *id).collect::<Vec<_>>(),
                "{low}.."
            );
            assert_eq!(
                table.range(low..).rev().take(5).map(|(id, _)| *id).collect::<Vec<_>>(),
                map.range(low..).rev().take(5).map(|(id, _)| *id).collect::<Vec<_>>(),
                "{low}.. backwards"
            );
        }
    }

    /// A page thinned to a few jobs gives its room back, and an emptied one
    /// is dropped.
    #[test]
    fn thinned_pages_give_memory_back() {
        let mut table: LiveTable = (0..PAGE_IDS).map(|id| (id, job(0))).collect();
        assert_eq!(table.pages.len(), 1);
        let full = table.pages.get(&0).map_or(0, Vec::capacity);
        assert!(full >= PAGE_IDS as usize);
        for id in 1..PAGE_IDS {
            table.remove(&id);
        }
        let thinned = table.pages.get(&0).map_or(0, Vec::capacity);
        assert!(thinned <= 2, "one job left in a page keeping room for {thinned}");
        table.remove(&0);
        assert!(table.pages.is_empty());
        assert_eq!(table.len(), 0);
    }
}
