//! Acked tombstones by id, each one a compact encoded record
//! ([`StoredJob::to_record`]) in pages of [`PAGE_IDS`] consecutive ids.
//!
//! A tombstone is read rarely (GetJob, a retried ack, a listing, a
//! snapshot) and kept for a day, so it is kept as its encoding, about 30
//! bytes for a job with default settings and no payload, instead of the
//! 72-byte live form with its 128-byte side part. A page keeps a bitmap of
//! which of its ids are present, their records back to back in one buffer
//! in id order, and where each record ends (4 bytes a record): no
//! allocation and no pointer per tombstone. It also remembers the earliest
//! finish time among its records, so a purge reads only the pages that
//! hold something old enough and needs no index of its own.

use std::collections::BTreeMap;

use crate::job::tomb_finished_at;

/// Ids per page: the ids `p * PAGE_IDS .. (p + 1) * PAGE_IDS` share page `p`.
const PAGE_IDS: u64 = 64;

/// Up to this size a page's buffer grows to fit each record exactly.
const SMALL_PAGE_BYTES: usize = 4 * 1024;

/// One page of tombstones.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Page {
    /// Bit `i` set: id `page * PAGE_IDS + i` is here.
    present: u64,
    /// The earliest finish time of the page's records (`None` when none
    /// has one): no record of the page is purged before it.
    earliest_finish_ms: Option<u64>,
    /// The records of the present ids, in id order, back to back.
    bytes: Vec<u8>,
    /// Where each record ends in `bytes`, in the same order.
    ends: Vec<u32>,
}

/// Every retained tombstone by id (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TombTable {
    pages: BTreeMap<u64, Page>,
    len: usize,
}

/// The page `id` belongs to, and its bit there.
fn place(id: u64) -> (u64, u64) {
    (id / PAGE_IDS, 1u64 << (id % PAGE_IDS))
}

/// Where the record of the id at `bit` sits among the page's records: the
/// number of present ids below it.
fn rank(present: u64, bit: u64) -> usize {
    (present & (bit - 1)).count_ones() as usize
}

/// The set bits of a word as ids, from either end.
struct Bits {
    page: u64,
    bits: u64,
}

impl Iterator for Bits {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.bits == 0 {
            return None;
        }
        let bit = u64::from(self.bits.trailing_zeros());
        self.bits &= self.bits - 1;
        Some(self.page * PAGE_IDS + bit)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.bits.count_ones() as usize;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Bits {
    fn next_back(&mut self) -> Option<u64> {
        if self.bits == 0 {
            return None;
        }
        let bit = 63 - u64::from(self.bits.leading_zeros());
        self.bits &= !(1u64 << bit);
        Some(self.page * PAGE_IDS + bit)
    }
}

impl ExactSizeIterator for Bits {}

/// A length or offset within a page's buffer as stored (pages hold at most
/// 64 records of at most a few hundred KiB each, far below 4 GiB).
fn offset(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Page {
    fn empty() -> Page {
        Page { present: 0, earliest_finish_ms: None, bytes: Vec::new(), ends: Vec::new() }
    }

    /// Where record `at` lies in `bytes`.
    fn span(&self, at: usize) -> std::ops::Range<usize> {
        let start = at.checked_sub(1).and_then(|before| self.ends.get(before)).map_or(0, |&e| e);
        let end = self.ends.get(at).map_or(start, |&e| e);
        start as usize..end as usize
    }

    fn record(&self, at: usize) -> &[u8] {
        self.bytes.get(self.span(at)).unwrap_or_default()
    }

    fn records(&self) -> impl DoubleEndedIterator<Item = &[u8]> + ExactSizeIterator {
        (0..self.ends.len()).map(|at| self.record(at))
    }

    fn earliest(&self) -> Option<u64> {
        self.records().filter_map(tomb_finished_at).min()
    }

    fn entries(&self, page: u64) -> impl DoubleEndedIterator<Item = (u64, &[u8])> {
        Bits { page, bits: self.present }.zip(self.records())
    }

    /// Puts `record` in at `at`, after the `at` records before it.
    fn insert(&mut self, at: usize, record: &[u8]) {
        let start = self.span(at).start;
        // Grown to fit while the page is small (a full page of default
        // tombstones is about 2 KiB: its records and a little of the
        // allocator's rounding, not up to twice that), by an eighth at a
        // time beyond, so a page of large records (a plain ack keeps a
        // payload of up to 256 KiB) is not copied whole on every insert.
        let needed = self.bytes.len().saturating_add(record.len());
        if needed <= SMALL_PAGE_BYTES {
            self.bytes.reserve_exact(record.len());
        } else {
            self.bytes.reserve(record.len().max(self.bytes.len() / 8));
        }
        self.bytes.splice(start..start, record.iter().copied());
        let grown = offset(record.len());
        for end in self.ends.iter_mut().skip(at) {
            *end = end.saturating_add(grown);
        }
        self.ends.reserve_exact(1);
        self.ends.insert(at, offset(start.saturating_add(record.len())));
    }

    /// Takes record `at` out.
    fn remove(&mut self, at: usize) -> Box<[u8]> {
        let span = self.span(at);
        let shrunk = offset(span.len());
        let record: Box<[u8]> = self.bytes.drain(span).collect();
        if at < self.ends.len() {
            self.ends.remove(at);
        }
        for end in self.ends.iter_mut().skip(at) {
            *end = end.saturating_sub(shrunk);
        }
        if self.bytes.len().saturating_mul(2) <= self.bytes.capacity() {
            self.bytes.shrink_to_fit();
            self.ends.shrink_to_fit();
        }
        record
    }
}

impl TombTable {
    /// Tombstones in the table.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The record of tombstone `id`, if retained.
    pub(crate) fn get(&self, id: u64) -> Option<&[u8]> {
        let (page, bit) = place(id);
        let page = self.pages.get(&page)?;
        (page.present & bit != 0).then(|| page.record(rank(page.present, bit)))
    }

    /// Stores `record` as tombstone `id`, returning the record it replaces.
    pub(crate) fn insert(&mut self, id: u64, record: &[u8]) -> Option<Box<[u8]>> {
        let (number, bit) = place(id);
        let finished = tomb_finished_at(record);
        let page = self.pages.entry(number).or_insert_with(Page::empty);
        let at = rank(page.present, bit);
        if page.present & bit != 0 {
            let old = page.remove(at);
            page.insert(at, record);
            page.earliest_finish_ms = page.earliest();
            Some(old)
        } else {
            page.present |= bit;
            page.insert(at, record);
            page.earliest_finish_ms = match (page.earliest_finish_ms, finished) {
                (Some(earliest), Some(finished)) => Some(earliest.min(finished)),
                (earliest, finished) => earliest.or(finished),
            };
            self.len = self.len.saturating_add(1);
            None
        }
    }

    /// Takes tombstone `id` out of the table.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Box<[u8]>> {
        let (number, bit) = place(id);
        let page = self.pages.get_mut(&number)?;
        if page.present & bit == 0 {
            return None;
        }
        let record = page.remove(rank(page.present, bit));
        page.present &= !bit;
        self.len = self.len.saturating_sub(1);
        if page.present == 0 {
            self.pages.remove(&number);
        } else if tomb_finished_at(&record).is_some_and(|ms| Some(ms) == page.earliest_finish_ms) {
            page.earliest_finish_ms = page.earliest();
        }
        Some(record)
    }

    /// Every page's bookkeeping agrees with its records: as many ends as
    /// present ids, ends ascending up to the buffer's length, and the
    /// earliest finish time recomputed. For `State::check_invariants`.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut len = 0usize;
        for (number, page) in &self.pages {
            let count = page.present.count_ones() as usize;
            if count == 0 || count != page.ends.len() {
                return Err(format!(
                    "tombstone page {number}: {count} ids, {} ends",
                    page.ends.len()
                ));
            }
            if !page.ends.windows(2).all(|w| w[0] <= w[1])
                || page.ends.last().map(|&end| end as usize) != Some(page.bytes.len())
            {
                return Err(format!("tombstone page {number}: ends out of step with its bytes"));
            }
            if page.earliest_finish_ms != page.earliest() {
                return Err(format!("tombstone page {number}: earliest finish time out of date"));
            }
            len += count;
        }
        if len != self.len {
            return Err(format!("tombstone table counts {} but holds {len}", self.len));
        }
        Ok(())
    }

    /// The earliest finish time of any tombstone (`None` when none has
    /// one). Reads one number per page.
    pub(crate) fn earliest_finish_ms(&self) -> Option<u64> {
        self.pages.values().filter_map(|page| page.earliest_finish_ms).min()
    }

    /// The ids of the tombstones finished at or before `cutoff_ms`, in id
    /// order. Reads only the pages whose earliest finish is that old.
    pub(crate) fn finished_by(&self, cutoff_ms: u64) -> Vec<u64> {
        self.pages
            .iter()
            .filter(|(_, page)| page.earliest_finish_ms.is_some_and(|ms| ms <= cutoff_ms))
            .flat_map(|(&number, page)| page.entries(number))
            .filter(|(_, record)| tomb_finished_at(record).is_some_and(|ms| ms <= cutoff_ms))
            .map(|(id, _)| id)
            .collect()
    }

    /// The tombstones with ids in `low..=high`, in id order (and back).
    pub(crate) fn range(
        &self,
        low: u64,
        high: u64,
    ) -> impl DoubleEndedIterator<Item = (u64, &[u8])> {
        let pages = (low <= high).then(|| self.pages.range(low / PAGE_IDS..=high / PAGE_IDS));
        pages
            .into_iter()
            .flatten()
            .flat_map(|(&number, page)| page.entries(number))
            .filter(move |&(id, _)| low <= id && id <= high)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::job::{Job, JobState, StoredJob};
    use crate::lease::Lease;

    fn record(id: u64, finished_at_ms: u64) -> Box<[u8]> {
        let job = Job {
            id,
            queue: "q".into(),
            payload: Vec::new(),
            priority: 0,
            not_before_ms: 0,
            max_attempts: 5,
            backoff: crate::job::Backoff::default(),
            lease_ttl_ms: 30_000,
            idempotency_key: None,
            tags: Vec::new(),
            attempts: 0,
            last_error: None,
            state: JobState::Acked,
            lease: Some(Lease {
                job_id: id,
                holder: "w".into(),
                token: id,
                epoch: 1,
                granted_at_ms: 0,
                expires_at_ms: 30_000,
            }),
            enqueued_at_ms: 0,
            finished_at_ms: Some(finished_at_ms),
            result: None,
        };
        StoredJob::from_job(job, Arc::from("q")).to_record(id, |_| 0)
    }

    proptest! {
        /// The table and a plain map fed the same inserts and removes
        /// agree on every read; the purge scan finds exactly the records
        /// finished by the cutoff, whatever was removed before.
        #[test]
        fn reads_like_an_ordered_map(
            ops in proptest::collection::vec((any::<bool>(), 0u64..300, 0u64..50), 0..300),
            low in 0u64..320,
            span in 0u64..320,
            cutoff in 0u64..60,
        ) {
            let mut table = TombTable::default();
            let mut map = BTreeMap::new();
            for (add, id, finished) in ops {
                if add {
                    let new = record(id, finished);
                    prop_assert_eq!(table.insert(id, &new), map.insert(id, new));
                } else {
                    prop_assert_eq!(table.remove(id), map.remove(&id));
                }
                prop_assert_eq!(table.len(), map.len());
            }
            for id in 0..300 {
                prop_assert_eq!(table.get(id), map.get(&id).map(|r| &**r));
            }
            let high = low.saturating_add(span);
            let read: Vec<u64> = table.range(low, high).map(|(id, _)| id).collect();
            let expected: Vec<u64> = map.range(low..=high).map(|(id, _)| *id).collect();
            prop_assert_eq!(&read, &expected);
            let back: Vec<u64> = table.range(low, high).rev().map(|(id, _)| id).collect();
            prop_assert_eq!(back, expected.into_iter().rev().collect::<Vec<_>>());
            prop_assert_eq!(table.check(), Ok(()));
            let finished = |r: &[u8]| tomb_finished_at(r).unwrap_or(u64::MAX);
            let due: Vec<u64> = map
                .iter()
                .filter(|(_, r)| finished(r) <= cutoff)
                .map(|(id, _)| *id)
                .collect();
            prop_assert_eq!(table.finished_by(cutoff), due);
            prop_assert_eq!(
                table.earliest_finish_ms(),
                map.values().filter_map(|r| tomb_finished_at(r)).min()
            );
        }
    }

    #[test]
    fn an_emptied_page_is_dropped_and_a_thinned_one_shrinks() {
        let mut table = TombTable::default();
        for id in 0..PAGE_IDS {
            table.insert(id, &record(id, 1));
        }
        assert_eq!(table.pages.len(), 1);
        for id in 1..PAGE_IDS {
            table.remove(id);
        }
        let (room, one) = match table.pages.get(&0) {
            Some(page) => (page.bytes.capacity(), page.bytes.len()),
            None => (0, 0),
        };
        assert!(room <= 2 * one, "one record of {one} bytes left in a page keeping {room}");
        table.remove(0);
        assert!(table.pages.is_empty());
        assert_eq!(table.len(), 0);
        assert_eq!(table.range(0, u64::MAX).count(), 0);
    }
}
