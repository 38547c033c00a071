//! etcd v3 as a job queue, the way lease scripts commonly build one:
//!
//! - enqueue: `put /q/jobs/<id>`;
//! - claim: read the first jobs and the current claims (one read-only,
//!   linearizable txn holding two range gets with a limit), grant a lease
//!   (TTL 30 s), then `txn if create_revision(/q/claims/<id>) == 0 then put
//!   /q/claims/<id> with the lease` over the first unclaimed job; on a lost
//!   race try the next candidate, and read again when none is left;
//! - ack: `txn if mod_revision(/q/claims/<id>) == token then delete the job
//!   and the claim`, the claim's revision serving as the fencing token.
//!
//! The lease is left to expire, as such scripts do; no run outlives the 30 s
//! TTL by enough for expiry to matter. Each client starts at a different
//! candidate (its index modulo the candidates), so 32 clients do not all
//! race for the same first key; that only helps etcd.
//!
//! Against a cluster (`--addr a,b,c`) client number `i` connects to member
//! `i mod n` only, so the clients spread evenly over the members; a follower
//! forwards proposals to the leader and serves linearizable reads with a
//! ReadIndex round, as etcd does for any client.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::measure::{Claimed, Connection, Target};

const JOBS: &str = "/q/jobs/";
const CLAIMS: &str = "/q/claims/";
/// Lease TTL, the same as the other systems' 30 s leases.
const LEASE_TTL_S: i64 = 30;
/// Most claim keys read per try; claims are at most about one per client.
const MAX_CLAIMS_READ: i64 = 4_096;

/// An etcd server, or a cluster, at one or more client URLs.
pub struct Etcd {
    endpoints: Vec<String>,
    /// Jobs read per claim try: enough that every client finds one of its own.
    candidates: i64,
    /// Job ids shared by every client of this run.
    next_job: Arc<AtomicU64>,
}

impl Etcd {
    /// The member(s) at `addr` (`host:port`, or several separated by
    /// commas), for `clients` clients.
    pub fn new(addr: &str, clients: usize) -> Etcd {
        let clients = i64::try_from(clients).unwrap_or(1024);
        let addrs = addr.split(',').map(str::trim).filter(|a| !a.is_empty());
        Etcd {
            endpoints: addrs.map(|a| format!("http://{a}")).collect(),
            candidates: (2 * clients).max(16),
            next_job: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Succeeds once every member answers a linearizable read.
    pub async fn probe(&self) -> anyhow::Result<()> {
        for endpoint in &self.endpoints {
            let mut client = Client::connect([endpoint.as_str()], None).await?;
            client.get("/q/probe", None).await?;
        }
        Ok(())
    }
}

/// One benchmark client's etcd connection.
pub struct EtcdConn {
    client: Client,
    index: usize,
    candidates: i64,
    next_job: Arc<AtomicU64>,
    worker: String,
}

impl Target for Etcd {
    type Conn = EtcdConn;

    async fn connect(&self, index: usize) -> anyhow::Result<EtcdConn> {
        // `connect` dials eagerly, so the connection exists before the window.
        let endpoint = &self.endpoints[index % self.endpoints.len().max(1)];
        let client = Client::connect([endpoint.as_str()], None).await?;
        Ok(EtcdConn {
            client,
            index,
            candidates: self.candidates,
            next_job: Arc::clone(&self.next_job),
            worker: format!("bench-{index}"),
        })
    }
}

fn job_key(id: u64) -> String {
    format!("{JOBS}{id:020}")
}

fn claim_key(id: u64) -> String {
    format!("{CLAIMS}{id:020}")
}

fn id_of(key: &[u8], prefix: &str) -> Option<u64> {
    std::str::from_utf8(key).ok()?.strip_prefix(prefix)?.parse().ok()
}

impl EtcdConn {
    /// Ids of the first jobs that have no claim, from one consistent read.
    async fn unclaimed(&mut self) -> anyhow::Result<Vec<u64>> {
        let keys = |limit| Some(GetOptions::new().with_prefix().with_keys_only().with_limit(limit));
        let read = Txn::new().and_then([
            TxnOp::get(JOBS, keys(self.candidates)),
            TxnOp::get(CLAIMS, keys(MAX_CLAIMS_READ)),
        ]);
        let response = self.client.txn(read).await?;
        let mut ranges = response.op_responses().into_iter();
        let (Some(TxnOpResponse::Get(jobs)), Some(TxnOpResponse::Get(claims))) =
            (ranges.next(), ranges.next())
        else {
            anyhow::bail!("read txn answered other than two ranges");
        };
        let claimed: std::collections::BTreeSet<u64> =
            claims.kvs().iter().filter_map(|kv| id_of(kv.key(), CLAIMS)).collect();
        Ok(jobs
            .kvs()
            .iter()
            .filter_map(|kv| id_of(kv.key(), JOBS))
            .filter(|id| !claimed.contains(id))
            .collect())
    }
}

impl Connection for EtcdConn {
    async fn enqueue(&mut self, payload: &[u8]) -> anyhow::Result<()> {
        let id = self.next_job.fetch_add(1, Ordering::Relaxed);
        self.client.put(job_key(id), payload, None).await?;
        Ok(())
    }

    async fn claim(&mut self) -> anyhow::Result<Claimed> {
        let mut retries = 0;
        let mut lease = None;
        loop {
            let candidates = self.unclaimed().await?;
            if candidates.is_empty() {
                retries += 1;
                tokio::task::yield_now().await;
                continue;
            }
            let lease_id = match lease {
                Some(id) => id,
                None => {
                    let id = self.client.lease_grant(LEASE_TTL_S, None).await?.id();
                    lease = Some(id);
                    id
                }
            };
            let first = self.index % candidates.len();
            for id in candidates[first..].iter().chain(&candidates[..first]) {
                let key = claim_key(*id);
                let take = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.as_str(),
                        self.worker.as_str(),
                        Some(PutOptions::new().with_lease(lease_id)),
                    )]);
                let response = self.client.txn(take).await?;
                if response.succeeded() {
                    let revision = response
                        .header()
                        .map(|header| header.revision())
                        .ok_or_else(|| anyhow::anyhow!("claim txn answered no header"))?;
                    let token = u64::try_from(revision)?;
                    return Ok(Claimed { job_id: *id, token, retries });
                }
                retries += 1;
            }
        }
    }

    async fn ack(&mut self, claimed: Claimed) -> anyhow::Result<()> {
        let claim = claim_key(claimed.job_id);
        let finish = Txn::new()
            .when([Compare::mod_revision(
                claim.as_str(),
                CompareOp::Equal,
                i64::try_from(claimed.token)?,
            )])
            .and_then([TxnOp::delete(job_key(claimed.job_id), None), TxnOp::delete(claim, None)]);
        let response = self.client.txn(finish).await?;
        anyhow::ensure!(response.succeeded(), "ack of job {} refused: stale token", claimed.job_id);
        Ok(())
    }
}
