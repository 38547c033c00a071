//! The `leasehold.v1.Cluster` service: membership and per-node status.

use leasehold_proto::v1;
use leasehold_proto::v1::cluster_server::Cluster;
use openraft::ServerState;
use tonic::{Request, Response, Status};

use crate::journal::Journal;

/// Serves `leasehold.v1.Cluster`.
#[derive(Clone)]
pub struct ClusterService {
    journal: Journal,
}

impl ClusterService {
    /// A service reporting on `journal`'s node.
    pub fn new(journal: Journal) -> Self {
        ClusterService { journal }
    }
}

/// The role name `cluster status` prints.
pub fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        let metrics = self.journal.raft().metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let me = self.journal.node_id();
        let digest = self.journal.state_machine().digest();
        let nodes = membership
            .nodes()
            .map(|(id, node)| {
                let mine = *id == me;
                v1::NodeStatus {
                    id: *id,
                    addr: node.addr.clone(),
                    role: if mine {
                        role_name(metrics.state).to_string()
                    } else if metrics.current_leader == Some(*id) {
                        "leader".to_string()
                    } else if voters.contains(id) {
                        "follower".to_string()
                    } else {
                        "learner".to_string()
                    },
                    term: if mine { metrics.current_term } else { 0 },
                    commit_index: if mine {
                        metrics.last_log_index.unwrap_or(0)
                    } else {
                        metrics
                            .replication
                            .as_ref()
                            .and_then(|r| r.get(id).cloned().flatten())
                            .map(|log_id| log_id.index)
                            .unwrap_or(0)
                    },
                    applied_index: if mine {
                        metrics.last_applied.map(|l| l.index).unwrap_or(0)
                    } else {
                        0
                    },
                    digest: if mine { digest } else { 0 },
                    voter: voters.contains(id),
                }
            })
            .collect();
        Ok(Response::new(v1::StatusResponse {
            leader: metrics.current_leader.unwrap_or(0),
            node_id: me,
            nodes,
        }))
    }
}
