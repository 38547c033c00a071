//! The `leasehold.v1.Cluster` service: membership changes (run on the
//! leader; other members forward them) and per-node status, gathered from
//! every member.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use leasehold_proto::v1::cluster_server::Cluster;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::error::Error;
use crate::raft_service::meant_for;
use leasehold_replica::Gate;
use leasehold_replica::Journal;
use leasehold_replica::Readiness;
use leasehold_replica::Unavailable;
use leasehold_security::secret::TARGET_NODE_HEADER;

/// How long a member's local status may take before it counts as unreachable.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a learner may take to catch up before it is promoted.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);
/// Status calls gathering every member's answer at once (the status page's
/// included); more wait their turn. Each asks every member, so many callers
/// must not multiply that.
const MAX_STATUS_FAN_OUTS: usize = 4;
/// How long a status call waits for its turn before it is refused
/// UNAVAILABLE (a client retries that).
const STATUS_TURN_WAIT: Duration = Duration::from_secs(2);

/// Serves `leasehold.v1.Cluster`.
#[derive(Clone)]
pub struct ClusterService {
    journal: Journal,
    gate: Gate,
    readiness: Readiness,
    /// Turns at asking every member for its status.
    fan_outs: Arc<Semaphore>,
}

impl ClusterService {
    /// A service reporting on and changing `journal`'s cluster, and the
    /// flags of `gate`; it reports this node's `readiness` as `/readyz` does.
    pub fn new(journal: Journal, gate: Gate, readiness: Readiness) -> Self {
        ClusterService {
            journal,
            gate,
            readiness,
            fan_outs: Arc::new(Semaphore::new(MAX_STATUS_FAN_OUTS)),
        }
    }

    /// This node's own view of itself.
    async fn local_status(&self) -> v1::NodeStatus {
        let metrics = self.journal.raft().metrics().borrow().clone();
        let me = self.journal.node_id();
        let membership = metrics.membership_config.membership();
        let voter = membership.voter_ids().any(|id| id == me);
        let addr = membership.get_node(&me).map(|n| n.addr.clone()).unwrap_or_default();
        let (gate, adverts) = self.gate.status();
        let watch = self.journal.clock_watch();
        let verdict = self.journal.clock_verdict();
        let ages = watch.ages();
        let readiness = self.readiness.report().await;
        // Not on every call, and never with the state held for the whole
        // hash (a million jobs take under half a second): see
        // `ReplicaStateMachine::recent_digest`.
        let digest = match self.journal.state_machine().recent_digest().await {
            Ok(digest) => digest,
            Err(error) => {
                tracing::warn!(event = "status.digest_failed", %error, "could not take the state digest");
                None
            }
        };
        let not_ready = readiness
            .checks
            .iter()
            .filter_map(|(name, outcome)| {
                outcome.as_ref().err().map(|why| format!("{name}: {why}"))
            })
            .collect();
        v1::NodeStatus {
            id: me,
            addr,
            role: role_name(metrics.state).to_string(),
            term: metrics.current_term,
            commit_index: self.journal.committed_index().await,
            applied_index: metrics.last_applied.map(|l| l.index).unwrap_or(0),
            digest: digest.map_or(0, |taken| taken.digest),
            digest_index: digest.map_or(0, |taken| taken.index),
            voter,
            reachable: true,
            gate: Some(gate),
            adverts,
            adverts_rejected: self.gate.rejected_total(),
            clock: leasehold_replica::clock_watch::describe(&verdict, watch.bound_ms()),
            clock_skewed: verdict.is_skewed(),
            clock_offsets: watch
                .offsets(self.journal.clock())
                .into_iter()
                .map(|offset| v1::ClockOffset {
                    node_id: offset.node,
                    offset_ms: offset.offset_ms,
                    uncertainty_ms: offset.uncertainty_ms,
                    age_ms: ages
                        .get(&offset.node)
                        .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
                        .unwrap_or(0),
                })
                .collect(),
            ready: readiness.ready,
            not_ready,
        }
    }

    /// A client for the leader's Cluster service, or `None` when this node leads.
    fn leader_client(&self) -> Result<Option<ClusterClient<leasehold_raft::PeerChannel>>, Error> {
        let metrics = self.journal.raft().metrics().borrow().clone();
        let Some(leader) = metrics.current_leader else {
            return Err(Error::Unavailable(Unavailable::NoLeader));
        };
        if leader == self.journal.node_id() {
            return Ok(None);
        }
        let addr = metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.addr.clone())
            .ok_or_else(|| {
                Error::Unavailable(Unavailable::Peer(format!(
                    "leader {leader} has no known address"
                )))
            })?;
        let channel = self.journal.peers().channel(&addr).map_err(|e| {
            Error::Unavailable(Unavailable::Peer(format!("leader {leader} at {addr}: {e}")))
        })?;
        Ok(Some(ClusterClient::new(channel)))
    }

    /// A client of member `id` (for calls addressed to that node), or
    /// NOT_FOUND naming `id` when it is not a member.
    fn member_client(&self, id: u64) -> Result<ClusterClient<leasehold_raft::PeerChannel>, Status> {
        let metrics = self.journal.raft().metrics().borrow().clone();
        let Some(addr) =
            metrics.membership_config.membership().get_node(&id).map(|n| n.addr.clone())
        else {
            return Err(Status::not_found(format!("id: node {id} is not a member")));
        };
        let channel = self.journal.peers().channel(&addr).map_err(|e| {
            Error::Unavailable(Unavailable::Peer(format!("node {id} at {addr}: {e}")))
        })?;
        Ok(ClusterClient::new(channel))
    }

    fn voters(&self) -> Vec<u64> {
        let metrics = self.journal.raft().metrics().borrow().clone();
        metrics.membership_config.membership().voter_ids().collect()
    }

    fn is_member(&self, id: u64) -> bool {
        self.journal
            .raft()
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .is_some()
    }

    /// Whether this node hears a quorum of `voters` now (itself, the
    /// peers whose adverts are fresh, and `also`): a membership change to
    /// them commits only with one. Answers which are not heard.
    fn quorum_heard(&self, voters: &BTreeSet<u64>, also: Option<u64>) -> Result<(), String> {
        let mut online = self.gate.online_members();
        online.extend(also);
        let (heard, unheard): (Vec<u64>, Vec<u64>) =
            voters.iter().copied().partition(|id| online.contains(id));
        let needed = voters.len() / 2 + 1;
        if heard.len() >= needed {
            return Ok(());
        }
        Err(format!(
            "a quorum of voters {voters:?} is {needed}, and this leader hears {} (nothing \
             heard from {unheard:?} within three advert intervals)",
            heard.len()
        ))
    }
}

/// Whether learner `id` is within `threshold` entries of this leader's log,
/// as openraft judges a learner added with `blocking`; true when this node
/// no longer leads (the promotion that follows then says so).
fn learner_caught_up(
    metrics: &openraft::RaftMetrics<u64, BasicNode>,
    id: u64,
    threshold: u64,
) -> bool {
    let Some(replication) = &metrics.replication else {
        return true;
    };
    replication.get(&id).is_some_and(|matched| {
        let matched = matched.as_ref().map_or(0, |log_id| log_id.index);
        metrics.last_log_index.unwrap_or(0).saturating_sub(matched) <= threshold
    })
}

/// `request` for member `id`, naming it as the node it is meant for, so a
/// member whose recorded address reaches another node refuses it rather
/// than passing it on again.
fn addressed_to<T>(id: u64, request: T) -> Request<T> {
    let mut request = Request::new(request);
    request
        .metadata_mut()
        .insert(TARGET_NODE_HEADER, tonic::metadata::AsciiMetadataValue::from(id));
    request
}

/// Whether two member addresses name the same endpoint, as
/// `leasehold_raft::network::endpoint` dials them: the scheme, a trailing
/// `/` and the host's case do not count.
fn same_addr(a: &str, b: &str) -> bool {
    fn canonical(addr: &str) -> String {
        let host_port = addr.split_once("://").map_or(addr, |(_, rest)| rest);
        host_port.strip_suffix('/').unwrap_or(host_port).to_ascii_lowercase()
    }
    canonical(a) == canonical(b)
}

/// Node ids start at 1: 0 names no node, so it is malformed input rather
/// than an unknown member.
fn check_id(id: u64) -> Result<(), Status> {
    if id == 0 {
        return Err(Status::invalid_argument("id: must be at least 1"));
    }
    Ok(())
}

/// Longest address a node may join with (bytes): a DNS name is at most
/// 253, plus a scheme and a port.
pub const MAX_ADDR_BYTES: usize = 300;

/// Checks a joining node's address, which every member will dial:
/// `HOST:PORT`, or an `http://` or `https://` URL of one with nothing
/// after the port but an optional `/` (as `leasehold_raft::network::endpoint`
/// reads it). Answers the problem, for the message.
pub fn check_addr(addr: &str) -> Result<(), String> {
    if addr.trim().is_empty() {
        return Err("must not be empty".into());
    }
    if addr.len() > MAX_ADDR_BYTES {
        return Err(format!("is {} bytes, limit {MAX_ADDR_BYTES}", addr.len()));
    }
    let host_port = match addr.split_once("://") {
        Some(("http" | "https", rest)) => rest,
        Some((scheme, _)) => return Err(format!("scheme {scheme:?} is not http or https")),
        None => addr,
    };
    let host_port = host_port.strip_suffix('/').unwrap_or(host_port);
    let malformed = || "must be HOST:PORT, or an http:// or https:// URL of one".to_string();
    let authority: http::uri::Authority = host_port.parse().map_err(|_| malformed())?;
    if authority.as_str() != host_port || host_port.contains('@') || authority.host().is_empty() {
        return Err(malformed());
    }
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    if host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified()) {
        return Err(format!(
            "{host} is every interface, not an address peers can dial (set the node's --advertise)"
        ));
    }
    match authority.port_u16() {
        Some(port) if port > 0 => Ok(()),
        Some(_) => Err("port 0 cannot be dialled".into()),
        None => Err(format!("has no port; {}", malformed())),
    }
}

/// The start of a long value, for a message.
fn short(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
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

fn membership_error(error: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> Error {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => {
            Error::Unavailable(Unavailable::LeadershipChanging)
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            Error::Unavailable(Unavailable::Membership(e.to_string()))
        }
        RaftError::Fatal(e) => Error::Unavailable(Unavailable::RaftStopped(e.to_string())),
    }
}

impl ClusterService {
    /// The cluster's status as this node sees it, with every member's own
    /// answer unless `local_only`. Takes no turn: `Cluster.Status` takes
    /// one first; the status page has turns of its own.
    pub async fn gather_status(&self, local_only: bool) -> v1::StatusResponse {
        let metrics = self.journal.raft().metrics().borrow().clone();
        let me = self.journal.node_id();
        let mine = self.local_status().await;
        let membership = metrics.membership_config.membership().clone();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let mut nodes = BTreeMap::new();
        nodes.insert(me, mine);
        if !local_only {
            let asks = membership.nodes().filter(|(id, _)| **id != me).map(|(id, node)| {
                let id = *id;
                let addr = node.addr.clone();
                let channel = self.journal.peers().channel(&addr);
                async move {
                    let answer = async {
                        let mut client = ClusterClient::new(channel.ok()?);
                        let mut request = Request::new(v1::StatusRequest { local_only: true });
                        request.set_timeout(STATUS_TIMEOUT);
                        let reply = tokio::time::timeout(STATUS_TIMEOUT, client.status(request))
                            .await
                            .ok()?
                            .ok()?;
                        reply.into_inner().nodes.into_iter().find(|n| n.id == id)
                    }
                    .await;
                    (id, addr, answer)
                }
            });
            for (id, addr, answer) in futures::future::join_all(asks).await {
                let status = answer.unwrap_or_else(|| v1::NodeStatus {
                    id,
                    addr,
                    role: "unknown".to_string(),
                    voter: voters.contains(&id),
                    reachable: false,
                    ..Default::default()
                });
                nodes.insert(id, status);
            }
        }
        v1::StatusResponse {
            leader: metrics.current_leader.unwrap_or(0),
            node_id: me,
            nodes: nodes.into_values().collect(),
        }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn status(
        &self,
        request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        let local_only = request.into_inner().local_only;
        let me = self.journal.node_id();
        let alone = {
            let metrics = self.journal.raft().metrics().borrow().clone();
            metrics.membership_config.membership().nodes().all(|(id, _)| *id == me)
        };
        // Taken before the answer's own view is, so that and the members'
        // answers are of one moment.
        let _turn = if local_only || alone {
            None
        } else {
            match tokio::time::timeout(STATUS_TURN_WAIT, self.fan_outs.acquire()).await {
                Ok(Ok(turn)) => Some(turn),
                _ => {
                    return Err(Status::unavailable(format!(
                        "busy: more than {MAX_STATUS_FAN_OUTS} status calls asking every \
                         member at once; try again (local_only answers at once)"
                    )));
                }
            }
        };
        Ok(Response::new(self.gather_status(local_only).await))
    }

    async fn join(
        &self,
        request: Request<v1::JoinRequest>,
    ) -> Result<Response<v1::JoinResponse>, Status> {
        let (caller, _) = Caller::node_of(&request)?;
        let request = request.into_inner();
        check_id(request.id)?;
        // A node joins as itself; only a member passes a join on for
        // another (forwarding to the leader; a learner that knows the
        // leader forwards too).
        if caller != request.id && !self.is_member(caller) {
            return Err(Status::permission_denied(format!(
                "id: node {caller} may only join as itself, not as node {}",
                request.id
            )));
        }
        check_addr(&request.addr).map_err(|problem| {
            Status::invalid_argument(format!("addr: {problem}, got {:?}", short(&request.addr)))
        })?;
        if let Some(mut leader) = self.leader_client()? {
            return leader.join(Request::new(request)).await;
        }
        let metrics = self.journal.raft().metrics().borrow().clone();
        let membership = metrics.membership_config.membership().clone();
        if let Some(existing) = membership.get_node(&request.id)
            && !same_addr(&existing.addr, &request.addr)
        {
            return Err(Status::already_exists(format!(
                "id: node id {} is already a member at {}; remove it first or pick another id",
                request.id, existing.addr
            )));
        }
        if let Some((other, _)) = membership
            .nodes()
            .find(|(id, n)| **id != request.id && same_addr(&n.addr, &request.addr))
        {
            return Err(Status::already_exists(format!(
                "addr: {} is already member {other}'s address",
                request.addr
            )));
        }
        // A build that cannot decode what the cluster writes would stop at
        // the first such entry; it must be upgraded before it joins.
        let agreed = self.journal.log_format();
        let joiner = request.log_format.max(1);
        if joiner < agreed {
            return Err(Status::failed_precondition(format!(
                "log_format: node {} decodes log format {joiner}, and the cluster writes format {agreed}; upgrade it before it joins",
                request.id
            )));
        }
        let raft = self.journal.raft();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        // Catching up is waited for on every call, a repeated one too: a
        // learner promoted while it lags would be needed by the new
        // quorum before it could answer, and every write would stall.
        if !voters.contains(&request.id) {
            let timed_out = || {
                Status::from(Error::Unavailable(Unavailable::Peer(format!(
                    "node {} did not catch up within {} s",
                    request.id,
                    CATCH_UP_TIMEOUT.as_secs()
                ))))
            };
            if membership.get_node(&request.id).is_none() {
                tracing::info!(node = request.id, addr = %request.addr, "adding learner");
                let node = BasicNode { addr: request.addr.clone() };
                match tokio::time::timeout(
                    CATCH_UP_TIMEOUT,
                    raft.add_learner(request.id, node, true),
                )
                .await
                {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(membership_error(e).into()),
                    Err(_) => return Err(timed_out()),
                }
            } else {
                // Already a learner (a repeated join): wait for it to catch
                // up without adding it again, which would write a new
                // membership and restart every replication stream, a
                // snapshot under way included.
                let threshold = raft.config().replication_lag_threshold;
                raft.wait(Some(CATCH_UP_TIMEOUT))
                    .metrics(
                        |metrics| learner_caught_up(metrics, request.id, threshold),
                        "the learner to catch up",
                    )
                    .await
                    .map_err(|_| timed_out())?;
            }
        }
        if !voters.contains(&request.id) {
            // The joiner has just caught up, so it counts as heard.
            let mut after = voters.clone();
            after.insert(request.id);
            self.quorum_heard(&after, Some(request.id)).map_err(|why| {
                Status::unavailable(format!("id: node {} is not promoted yet: {why}", request.id))
            })?;
            tracing::info!(node = request.id, "promoting learner to voter");
            let change = ChangeMembers::AddVoterIds(BTreeSet::from([request.id]));
            raft.change_membership(change, false).await.map_err(membership_error)?;
        }
        Ok(Response::new(v1::JoinResponse {
            leader: self.journal.node_id(),
            voters: self.voters(),
            dev_cluster_secret: Vec::new(),
        }))
    }

    async fn remove(
        &self,
        request: Request<v1::RemoveRequest>,
    ) -> Result<Response<v1::RemoveResponse>, Status> {
        let request = request.into_inner();
        check_id(request.id)?;
        if let Some(mut leader) = self.leader_client()? {
            return leader.remove(Request::new(request)).await;
        }
        let metrics = self.journal.raft().metrics().borrow().clone();
        let membership = metrics.membership_config.membership().clone();
        if membership.get_node(&request.id).is_none() {
            return Err(Status::not_found(format!("id: node {} is not a member", request.id)));
        }
        let is_voter = membership.voter_ids().any(|id| id == request.id);
        if is_voter && membership.voter_ids().count() == 1 {
            return Err(Status::failed_precondition(format!(
                "id: node {} is the only voter; a cluster cannot remove its last voter",
                request.id
            )));
        }
        if is_voter {
            // The change needs a quorum of the voters left as well as of
            // today's: without one it never commits, and until it does no
            // write and no other change can.
            let after: BTreeSet<u64> =
                membership.voter_ids().filter(|id| *id != request.id).collect();
            self.quorum_heard(&after, None).map_err(|why| {
                Status::failed_precondition(format!(
                    "id: removing node {} would leave voters that cannot commit: {why}; bring \
                     them back first",
                    request.id
                ))
            })?;
        }
        let change = if is_voter {
            ChangeMembers::RemoveVoters(BTreeSet::from([request.id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([request.id]))
        };
        tracing::info!(node = request.id, "removing member");
        self.journal.raft().change_membership(change, false).await.map_err(membership_error)?;
        Ok(Response::new(v1::RemoveResponse { voters: self.voters() }))
    }

    async fn drain(
        &self,
        request: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        meant_for(self.journal.node_id(), &request)?;
        let request = request.into_inner();
        check_id(request.id)?;
        if request.id == self.journal.node_id() {
            tracing::info!(event = "drain.step", step = "requested", "drain requested over gRPC");
            self.journal.request_drain();
            return Ok(Response::new(v1::DrainResponse {}));
        }
        self.member_client(request.id)?.drain(addressed_to(request.id, request)).await
    }

    async fn set_flags(
        &self,
        request: Request<v1::SetFlagsRequest>,
    ) -> Result<Response<v1::SetFlagsResponse>, Status> {
        meant_for(self.journal.node_id(), &request)?;
        let request = request.into_inner();
        check_id(request.id)?;
        if request.id == self.journal.node_id() {
            let flags = self.gate.set_flags(request.journal_lease, request.dry_run);
            return Ok(Response::new(v1::SetFlagsResponse {
                journal_lease: flags.journal_lease,
                dry_run: flags.journal_lease_dry_run,
            }));
        }
        self.member_client(request.id)?.set_flags(addressed_to(request.id, request)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_peers_can_dial_are_accepted() {
        for addr in [
            "127.0.0.1:7070",
            "http://127.0.0.1:7070",
            "https://node-2.example:7070",
            "http://node-2.example:7070/",
            "[::1]:7070",
            "localhost:1",
        ] {
            assert_eq!(check_addr(addr), Ok(()), "{addr}");
        }
    }

    #[test]
    fn one_endpoint_written_two_ways_is_one_address() {
        for (a, b) in [
            ("10.0.0.2:7070", "http://10.0.0.2:7070"),
            ("10.0.0.2:7070", "https://10.0.0.2:7070/"),
            ("Node-2.Example:7070", "node-2.example:7070"),
        ] {
            assert!(same_addr(a, b), "{a} and {b}");
        }
        assert!(!same_addr("10.0.0.2:7070", "10.0.0.2:7071"));
        assert!(!same_addr("10.0.0.2:7070", "10.0.0.3:7070"));
    }

    #[test]
    fn anything_else_is_refused_with_its_problem() {
        let long = format!("{}:7070", "h".repeat(MAX_ADDR_BYTES));
        for (addr, problem) in [
            ("", "must not be empty"),
            ("   ", "must not be empty"),
            ("not an address", "must be HOST:PORT"),
            ("127.0.0.1", "has no port"),
            ("127.0.0.1:0", "port 0"),
            ("127.0.0.1:99999", "must be HOST:PORT"),
            ("http://127.0.0.1:7070/path", "must be HOST:PORT"),
            ("ftp://127.0.0.1:7070", "scheme \"ftp\""),
            ("user@127.0.0.1:7070", "must be HOST:PORT"),
            (":7070", "must be HOST:PORT"),
            (long.as_str(), "limit 300"),
            ("0.0.0.0:7070", "every interface"),
            ("http://[::]:7070", "every interface"),
        ] {
            match check_addr(addr) {
                Ok(()) => panic!("{addr:?} was accepted"),
                Err(message) => assert!(message.contains(problem), "{addr:?}: {message}"),
            }
        }
    }
}
