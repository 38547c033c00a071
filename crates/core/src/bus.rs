//! The broadcast ("bus") path's record of one key, in pure form: every
//! claim heard, and whether the winner released it. The lowest `(at, node)`
//! wins. The table of these records is local to each node (never
//! replicated); the node runtime keeps it, this decides what it says.

use serde::{Deserialize, Serialize};

/// What a node's bus table holds for one key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BusRecord {
    /// Every claim heard, as `(at_ms, node)`, sorted: the first one wins.
    pub claims: Vec<(u64, u64)>,
    /// The winner ran and released the key.
    pub released: bool,
    /// When this node last changed the record (its clock, Unix ms).
    pub touched_ms: u64,
}

impl BusRecord {
    /// The winning node, if any claim was heard.
    pub fn winner(&self) -> Option<u64> {
        self.claims.first().map(|(_, node)| *node)
    }

    /// Adds `node`'s claim made at `at_ms`. One claim per node: a node that
    /// claims again keeps its first.
    pub fn add(&mut self, at_ms: u64, node: u64) {
        if self.claims.iter().all(|(_, held)| *held != node) {
            self.claims.push((at_ms, node));
            self.claims.sort_unstable();
        }
    }

    /// Marks the key released when `node` won it; a release from a node
    /// that did not win changes nothing.
    pub fn release_by(&mut self, node: u64) {
        if self.winner() == Some(node) {
            self.released = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_at_then_node_wins_and_only_the_winner_releases() {
        let mut record = BusRecord::default();
        record.add(500, 2);
        record.add(500, 1);
        record.add(400, 2);
        assert_eq!(record.claims, vec![(500, 1), (500, 2)], "a node keeps its first claim");
        assert_eq!(record.winner(), Some(1));
        record.release_by(2);
        assert!(!record.released, "a loser cannot release");
        record.release_by(1);
        assert!(record.released);
    }
}
