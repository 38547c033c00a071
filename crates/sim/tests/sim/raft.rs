//! Goal: real openraft runs on the simulated disk — three nodes elect a
//! leader, commit leasehold commands, a follower crashes (losing what it had
//! not synced) and restarts on its disk, catches up, and every replica ends
//! with the same state. Method: an in-process network that calls the
//! target node's Raft handle directly; each node's election window is one
//! millisecond wide (the way the simulation makes openraft's timeouts
//! independent of its OS-seeded generator); bounded waits on metrics.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{Command, JobSpec, Proposal};
use leasehold_raft::{NodeId, Raft, TypeConfig};
use leasehold_sim::{Crash, SimDisk, SimStateMachine};
use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

/// The nodes reachable now, by id (the journal test shares it).
#[derive(Clone, Default)]
pub(crate) struct Router {
    nodes: Arc<Mutex<BTreeMap<NodeId, Raft>>>,
}

impl Router {
    fn get(&self, id: NodeId) -> Option<Raft> {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner).get(&id).cloned()
    }

    pub(crate) fn set(&self, id: NodeId, raft: Option<Raft>) {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        match raft {
            Some(raft) => nodes.insert(id, raft),
            None => nodes.remove(&id),
        };
    }
}

/// A connection to one node of the [`Router`].
pub(crate) struct Client {
    router: Router,
    target: NodeId,
}

fn unreachable<E: std::error::Error>(target: NodeId) -> RPCError<NodeId, BasicNode, E> {
    let error = std::io::Error::other(format!("node {target} is down"));
    RPCError::Network(NetworkError::new(&error))
}

impl RaftNetwork<TypeConfig> for Client {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let raft = self.router.get(self.target).ok_or_else(|| unreachable(self.target))?;
        raft.append_entries(rpc)
            .await
            .map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let raft = self.router.get(self.target).ok_or_else(|| unreachable(self.target))?;
        raft.install_snapshot(rpc)
            .await
            .map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let raft = self.router.get(self.target).ok_or_else(|| unreachable(self.target))?;
        raft.vote(rpc)
            .await
            .map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }
}

impl RaftNetworkFactory<TypeConfig> for Router {
    type Network = Client;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Client {
        Client { router: self.clone(), target }
    }
}

/// Starts node `id` on `disk`: a new life of the node.
async fn start(
    id: NodeId,
    disk: &SimDisk,
    router: &Router,
) -> anyhow::Result<(Raft, SimStateMachine)> {
    // A window one millisecond wide: `gen_range(min..min + 1)` has one value,
    // whatever the generator. Distinct minimums break election ties.
    let min = 300 + 100 * id;
    let config = leasehold_sim::raft_config(min).validate()?;
    let (log_store, state_machine) = disk.open();
    let raft =
        Raft::new(id, Arc::new(config), router.clone(), log_store, state_machine.clone()).await?;
    router.set(id, Some(raft.clone()));
    Ok((raft, state_machine))
}

fn enqueue(n: u64) -> Proposal {
    let spec = JobSpec {
        queue: "q".into(),
        payload: format!("job {n}").into_bytes(),
        ..Default::default()
    };
    Proposal { now_ms: 1_000 + n, command: Command::Enqueue { jobs: vec![spec] } }
}

#[tokio::test]
async fn a_follower_that_crashes_recovers_from_its_synced_disk_and_catches_up() -> anyhow::Result<()>
{
    const WAIT: Option<Duration> = Some(Duration::from_secs(20));
    let router = Router::default();
    let disks: BTreeMap<NodeId, SimDisk> =
        (1..=3).map(|id| (id, SimDisk::with_sync_delay(Duration::from_millis(1)))).collect();
    let mut nodes = BTreeMap::new();
    for (id, disk) in &disks {
        nodes.insert(*id, start(*id, disk, &router).await?);
    }

    // --- node 1 forms the group and leads (its window is the shortest)
    let members: BTreeMap<NodeId, BasicNode> =
        (1..=3).map(|id| (id, BasicNode::default())).collect();
    nodes[&1].0.initialize(members).await?;
    nodes[&1].0.wait(WAIT).metrics(|m| m.current_leader == Some(1), "node 1 leads").await?;
    for n in 0..5 {
        nodes[&1].0.client_write(enqueue(n)).await?;
    }

    // --- node 3 crashes; the other two keep committing
    let (raft3, _) = nodes.remove(&3).ok_or_else(|| anyhow::anyhow!("node 3"))?;
    router.set(3, None);
    raft3.shutdown().await?;
    disks[&3].crash(Crash::LoseUnsynced);
    let mut last = 0;
    for n in 5..10 {
        last = nodes[&1].0.client_write(enqueue(n)).await?.log_id.index;
    }

    // --- node 3 restarts on what it synced and catches up
    nodes.insert(3, start(3, &disks[&3], &router).await?);
    for (id, (raft, _)) in &nodes {
        raft.wait(WAIT)
            .applied_index_at_least(Some(last), &format!("node {id} applied {last}"))
            .await?;
    }
    let states: BTreeSet<String> =
        nodes.values().map(|(_, sm)| sm.read(|state| format!("{state:?}"))).collect();
    assert_eq!(states.len(), 1, "replicas diverged");
    assert_eq!(nodes[&3].1.read(|state| state.last_job_id()), 10);
    for (_, (raft, _)) in nodes {
        raft.shutdown().await?;
    }
    Ok(())
}
