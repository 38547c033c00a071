//! A three-node leasehold cluster as the script started it: node ids are
//! 1..=n in the order of `--addrs`, and `--pids` (when given) lists their
//! process ids in the same order. This module waits for the cluster to be
//! whole, and finds its leader, over plaintext or TLS as [`Access`] says.

use std::time::Duration;

use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use tonic::transport::Channel;

use crate::access::Access;

/// Deadline of one status call.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// Splits a comma-separated address list.
pub fn split_addrs(addrs: &str) -> Vec<String> {
    addrs.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_string).collect()
}

/// What node `addr` itself knows (its own status, and the leader it follows).
pub async fn local_status(
    stub: &mut ClusterClient<Channel>,
    access: &Access,
    timeout: Duration,
) -> anyhow::Result<v1::StatusResponse> {
    let mut request = access.request(v1::StatusRequest { local_only: true });
    request.set_timeout(timeout);
    match tokio::time::timeout(timeout, stub.status(request)).await {
        Ok(reply) => Ok(reply?.into_inner()),
        Err(_) => anyhow::bail!("status: no answer within {timeout:?}"),
    }
}

/// The largest Raft term any node of `addrs` reports (each asked for its
/// own status); an error when a node does not answer.
pub async fn max_term(addrs: &[String], access: &Access) -> anyhow::Result<u64> {
    let mut term = 0;
    for addr in addrs {
        let mut stub = ClusterClient::new(access.channel(addr)?);
        let status = local_status(&mut stub, access, STATUS_TIMEOUT).await?;
        term = status.nodes.iter().map(|node| node.term).fold(term, u64::max);
    }
    Ok(term)
}

/// The leader's id, as every node in `addrs` agrees; an error when a node
/// does not answer or they disagree.
pub async fn agreed_leader(addrs: &[String], access: &Access) -> anyhow::Result<u64> {
    let mut answers = Vec::new();
    for addr in addrs {
        let mut stub = ClusterClient::new(access.channel(addr)?);
        answers.push(local_status(&mut stub, access, STATUS_TIMEOUT).await?);
    }
    let leader = leasehold_testkit::agreed_leader(&answers).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        usize::try_from(leader).is_ok_and(|id| (1..=addrs.len()).contains(&id)),
        "leader id {leader} is not one of nodes 1..={}",
        addrs.len()
    );
    Ok(leader)
}

/// Whether the cluster at `addrs` is whole: one leader all nodes agree on,
/// every node a reachable voter, applied indexes within `max_lag` entries of
/// each other, and every node serving a linearizable read.
pub async fn whole(addrs: &[String], access: &Access, max_lag: u64) -> anyhow::Result<()> {
    let leader = agreed_leader(addrs, access).await?;
    let leader_addr = &addrs[usize::try_from(leader)? - 1];
    let status = tokio::time::timeout(
        Duration::from_secs(5),
        access.client(leader_addr)?.with_retry(no_retry()).status(),
    )
    .await
    .map_err(|_| anyhow::anyhow!("cluster status: no answer within 5 s"))??;
    anyhow::ensure!(
        status.nodes.len() == addrs.len(),
        "{} members, expected {}",
        status.nodes.len(),
        addrs.len()
    );
    for node in &status.nodes {
        anyhow::ensure!(node.voter && node.reachable, "node {} is not a reachable voter", node.id);
        let expected = usize::try_from(node.id).ok().and_then(|id| addrs.get(id.wrapping_sub(1)));
        anyhow::ensure!(
            expected == Some(&node.addr),
            "node {} is at {}, not where the script started it",
            node.id,
            node.addr
        );
    }
    let applied = status.nodes.iter().map(|n| n.applied_index);
    let (low, high) = applied.fold((u64::MAX, 0), |(lo, hi), a| (lo.min(a), hi.max(a)));
    anyhow::ensure!(high - low <= max_lag, "applied indexes {low}..{high} still apart");
    for addr in addrs {
        access.client(addr)?.with_retry(no_retry()).stats(None, false).await?;
    }
    Ok(())
}

/// A retry policy of one try: the bench measures, it does not paper over.
pub fn no_retry() -> leasehold_client::RetryPolicy {
    leasehold_client::RetryPolicy {
        attempts: 1,
        first_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(1),
    }
}

/// Waits (bounded) until [`whole`] holds.
pub async fn wait_whole(
    addrs: &[String],
    access: &Access,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::from("never asked");
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(10), whole(addrs, access, 2)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(error)) => last = format!("{error:#}"),
            Err(_) => last = "status round timed out".to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("cluster {addrs:?} not whole after {timeout:?}: {last}")
}
