//! leasehold through its own typed client: enqueue one job, claim one
//! (`max = 1`, 30 s lease, long-poll up to a second), ack with the fencing
//! token. One `Client` (one HTTP/2 connection) per benchmark client.

use leasehold_client::Client;
use leasehold_proto::v1;

use crate::measure::{Claimed, Connection, Target};

/// The queue every benchmark job goes to.
const QUEUE: &str = "bench";
/// Lease length asked for, the same as the etcd and PostgreSQL leases.
const LEASE_TTL_MS: u64 = 30_000;
/// Long-poll of one claim try.
const CLAIM_WAIT_MS: u64 = 1_000;

/// A leasehold node at one gRPC address.
pub struct Leasehold {
    addr: String,
}

impl Leasehold {
    /// The node at `addr` (`host:port`).
    pub fn new(addr: &str) -> Leasehold {
        Leasehold { addr: addr.to_string() }
    }

    /// Succeeds once the node has a leader and serves a linearizable read.
    pub async fn probe(&self) -> anyhow::Result<()> {
        let client = Client::connect(&self.addr)?;
        client.stats(None, false).await?;
        Ok(())
    }
}

/// One benchmark client's leasehold connection.
pub struct LeaseholdConn {
    client: Client,
    worker: String,
}

impl Target for Leasehold {
    type Conn = LeaseholdConn;

    async fn connect(&self, index: usize) -> anyhow::Result<LeaseholdConn> {
        let client = Client::connect(&self.addr)?;
        // Connect now rather than lazily inside the measured window.
        client.stats(Some(QUEUE.to_string()), true).await?;
        Ok(LeaseholdConn { client, worker: format!("bench-{index}") })
    }
}

impl Connection for LeaseholdConn {
    async fn enqueue(&mut self, payload: &[u8]) -> anyhow::Result<()> {
        let spec = v1::JobSpec {
            queue: QUEUE.to_string(),
            payload: payload.to_vec(),
            lease_ttl_ms: Some(LEASE_TTL_MS),
            ..Default::default()
        };
        let results = self.client.enqueue(vec![spec]).await?;
        anyhow::ensure!(results.len() == 1, "enqueue answered {} results for 1 job", results.len());
        Ok(())
    }

    async fn claim(&mut self) -> anyhow::Result<Claimed> {
        let mut retries = 0;
        loop {
            let request = v1::ClaimRequest {
                worker: self.worker.clone(),
                queue: QUEUE.to_string(),
                max: 1,
                lease_ttl_ms: Some(LEASE_TTL_MS),
                selector: Vec::new(),
                wait_ms: CLAIM_WAIT_MS,
            };
            let grants = self.client.claim(request).await?;
            let lease = grants.first().and_then(|grant| grant.lease.as_ref());
            if let Some(lease) = lease {
                return Ok(Claimed { job_id: lease.job_id, token: lease.token, retries });
            }
            // Nothing ready within the long-poll: the overall call deadline
            // bounds these retries.
            retries += 1;
        }
    }

    async fn ack(&mut self, claimed: Claimed) -> anyhow::Result<()> {
        self.client.ack(claimed.job_id, claimed.token).await?;
        Ok(())
    }
}
