//! leasehold through its own typed client: enqueue one job, claim one
//! (`max = 1`, 30 s lease, long-poll up to a second), ack with the fencing
//! token. One `Client` (one HTTP/2 connection) per benchmark client.
//!
//! Against a cluster (`--addr a,b,c`) client number `i` gets the list rotated
//! to start at node `i mod n`: the client talks to its first address until
//! that node fails, so the clients spread evenly over the nodes, and the
//! followers forward writes to the leader as they would for any user.
//!
//! With TLS ([`Access`]) each client is a secured one: mutual TLS with the
//! client certificate, and a token whose roles cover the whole cycle
//! (producer and worker).

use leasehold_client::Client;
use leasehold_proto::v1;

use crate::access::Access;
use crate::measure::{Claimed, Connection, Target};

/// The queue every benchmark job goes to.
const QUEUE: &str = "bench";
/// Lease length asked for, the same as the etcd and PostgreSQL leases.
const LEASE_TTL_MS: u64 = 30_000;
/// Long-poll of one claim try.
const CLAIM_WAIT_MS: u64 = 1_000;

/// A leasehold node, or a cluster, at one or more gRPC addresses.
pub struct Leasehold {
    addrs: Vec<String>,
    access: Access,
}

impl Leasehold {
    /// The node(s) at `addr`: `host:port`, or several separated by commas,
    /// reached as `access` says.
    pub fn new(addr: &str, access: Access) -> Leasehold {
        let addrs = addr.split(',').map(str::trim).filter(|a| !a.is_empty());
        Leasehold { addrs: addrs.map(str::to_string).collect(), access }
    }

    /// The address list for client `index`: every address, starting at
    /// node `index mod n`.
    fn addrs_from(&self, index: usize) -> String {
        let n = self.addrs.len().max(1);
        let mut rotated = self.addrs.clone();
        rotated.rotate_left(index % n);
        rotated.join(",")
    }

    /// Succeeds once every node answers a linearizable read (each one with a
    /// leader to forward to).
    pub async fn probe(&self) -> anyhow::Result<()> {
        for addr in &self.addrs {
            let client = self.access.client(addr)?;
            client.stats(None, false).await?;
        }
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
        let client = self.access.client(&self.addrs_from(index))?;
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
                ..Default::default()
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
