//! Facts about a running cluster that every harness asks: how long a node
//! may take to serve, and which node leads by the nodes' own answers.

use std::time::Duration;

use leasehold_proto::v1;

/// How long a freshly started (or restarted) node may take to serve: the
/// one ready timeout of every harness.
pub const NODE_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The leader every answer names (each node's own `Cluster.Status`), or why
/// there is none: no answer, one naming no leader, or answers that
/// disagree.
pub fn agreed_leader(answers: &[v1::StatusResponse]) -> Result<u64, String> {
    let leaders: Vec<u64> = answers.iter().map(|a| a.leader).collect();
    match leaders.first() {
        None => Err("no node answered".to_string()),
        Some(0) => Err("no leader known".to_string()),
        Some(first) if leaders.iter().all(|l| l == first) => Ok(*first),
        Some(_) => Err(format!("nodes disagree on the leader: {leaders:?}")),
    }
}

/// Among nodes that say they lead, the one with the highest term (a
/// deposed leader may not know yet).
pub fn highest_term_leader<'a>(
    statuses: impl IntoIterator<Item = &'a v1::NodeStatus>,
) -> Option<u64> {
    statuses.into_iter().filter(|s| s.role == "leader").max_by_key(|s| s.term).map(|s| s.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(leader: u64) -> v1::StatusResponse {
        v1::StatusResponse { leader, ..Default::default() }
    }

    #[test]
    fn the_leader_is_the_one_every_answer_names() {
        assert_eq!(agreed_leader(&[answer(2), answer(2)]), Ok(2));
        assert!(agreed_leader(&[answer(2), answer(3)]).is_err());
        assert!(agreed_leader(&[answer(0)]).is_err());
        assert!(agreed_leader(&[]).is_err());
        let node = |id, role: &str, term| v1::NodeStatus {
            id,
            role: role.into(),
            term,
            ..Default::default()
        };
        let statuses = [node(1, "leader", 3), node(2, "leader", 4), node(3, "follower", 4)];
        assert_eq!(highest_term_leader(&statuses), Some(2));
        assert_eq!(highest_term_leader(&[node(1, "follower", 1)]), None);
    }
}
