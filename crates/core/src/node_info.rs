//! What the journal knows of each node, by id: registered by the node
//! itself (`RegisterNode`) and marked while it drains (`SetDraining`).

use serde::{Deserialize, Serialize};

/// What the journal knows of a node: its tags and whether it drains.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Tags from the node's configuration (sorted).
    pub tags: Vec<String>,
    /// Draining nodes get no new `target = each` jobs.
    pub draining: bool,
}
