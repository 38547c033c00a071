//! A set of job ids as bitmap words: the ids `64 w .. 64 (w + 1)` share
//! word `w`, and only words with a member are kept.
//!
//! The per-queue, per-state id sets of the indexes hold runs of nearby ids
//! (ids are handed out in order, and jobs move between states roughly in
//! that order), where a `BTreeSet<u64>` costs 16–20 bytes an id (its nodes
//! half full when fed in order). A word holds up to 64 of them in 8
//! bytes, plus its key: a dense run costs well under a byte an id, and a
//! lone id no more than its B-tree entry did. Iteration is ascending, as
//! the set's was, so listings and everything read from them are unchanged.

use std::collections::BTreeMap;

/// Ids per word.
const WORD_IDS: u64 = 64;

/// A set of ids (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct IdSet {
    /// Word number → its members as bits (never 0).
    words: BTreeMap<u64, u64>,
    len: usize,
}

/// The word `id` belongs to and its bit there.
fn place(id: u64) -> (u64, u64) {
    (id / WORD_IDS, 1u64 << (id % WORD_IDS))
}

/// The ids of `word`'s set bits, ascending.
fn members(word: u64, mut bits: u64) -> impl Iterator<Item = u64> {
    std::iter::from_fn(move || {
        if bits == 0 {
            return None;
        }
        let bit = u64::from(bits.trailing_zeros());
        bits &= bits - 1;
        Some(word * WORD_IDS + bit)
    })
}

impl IdSet {
    /// Adds `id`; false if it was there.
    pub(crate) fn insert(&mut self, id: u64) -> bool {
        let (word, bit) = place(id);
        let bits = self.words.entry(word).or_insert(0);
        let added = *bits & bit == 0;
        *bits |= bit;
        if added {
            self.len = self.len.saturating_add(1);
        }
        added
    }

    /// Takes `id` out; false if it was not there.
    pub(crate) fn remove(&mut self, id: u64) -> bool {
        let (word, bit) = place(id);
        let Some(bits) = self.words.get_mut(&word) else {
            return false;
        };
        let removed = *bits & bit != 0;
        *bits &= !bit;
        if *bits == 0 {
            self.words.remove(&word);
        }
        if removed {
            self.len = self.len.saturating_sub(1);
        }
        removed
    }

    /// How many ids.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// True when no id is in the set.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ids at or above `first`, ascending.
    pub(crate) fn from(&self, first: u64) -> impl Iterator<Item = u64> + '_ {
        let (start, _) = place(first);
        self.words
            .range(start..)
            .flat_map(|(&word, &bits)| members(word, bits))
            .skip_while(move |&id| id < first)
    }

    /// Every id, ascending.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.from(0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The set and a `BTreeSet` fed the same inserts and removes agree
        /// on every answer and every read.
        #[test]
        fn reads_like_a_btree_set(
            ops in proptest::collection::vec((any::<bool>(), 0u64..400), 0..300),
            tail in proptest::sample::select(vec![0, 63, 64, 65, u64::MAX - 1, u64::MAX]),
            from in 0u64..420,
        ) {
            let mut set = IdSet::default();
            let mut model = BTreeSet::new();
            for (add, id) in ops.into_iter().chain([(true, tail)]) {
                if add {
                    prop_assert_eq!(set.insert(id), model.insert(id));
                } else {
                    prop_assert_eq!(set.remove(id), model.remove(&id));
                }
                prop_assert_eq!(set.len(), model.len());
                prop_assert_eq!(set.is_empty(), model.is_empty());
            }
            prop_assert_eq!(set.iter().collect::<Vec<_>>(), model.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(
                set.from(from).collect::<Vec<_>>(),
                model.range(from..).copied().collect::<Vec<_>>()
            );
            // Equal sets are equal structures: an emptied word is dropped.
            let rebuilt: IdSet = {
                let mut rebuilt = IdSet::default();
                for &id in &model {
                    rebuilt.insert(id);
                }
                rebuilt
            };
            prop_assert_eq!(set, rebuilt);
        }
    }
}
