//! leasehold through its own typed client: enqueue one job, claim one
//! (`max = 1`, 30 s lease, long-poll up to a second), ack with the fencing
//! token. One `Client` (one HTTP/2 connection) per benchmark client; by
//! default ([`Api::Session`]) each client's calls are frames on one worker
//! session (`Queue.Session`), as a worker that makes many small calls
//! would use it, and `--leasehold-api unary` makes each a unary call.
//!
//! Against a cluster (`--addr a,b,c`) client number `i` gets the list rotated
//! to start at node `i mod n`: the client talks to its first address until
//! that node fails, so the clients spread evenly over the nodes, and the
//! followers forward writes to the leader as they would for any user.
//!
//! With TLS ([`Access`]) each client is a secured one: mutual TLS with the
//! client certificate, and a token whose roles cover the whole cycle
//! (producer and worker).
//!
//! A backlog ([`Leasehold::fill_backlog`]) is jobs in the same queue tagged
//! [`BACKLOG_TAG`]: the workload claims with an empty selector, which only
//! takes untagged jobs, so none of them is ever claimed, and every one of
//! them is ahead of the workload's jobs in the claim order (same priority,
//! lower ids).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use leasehold_client::{Client, Session};
use leasehold_proto::v1;

use crate::access::Access;
use crate::measure::{Claimed, Connection, Target};

/// The queue every benchmark job goes to.
const QUEUE: &str = "bench";
/// Lease length asked for, the same as the etcd and PostgreSQL leases.
const LEASE_TTL_MS: u64 = 30_000;
/// Long-poll of one claim try.
const CLAIM_WAIT_MS: u64 = 1_000;
/// The one tag of every backlog job; no benchmark claim selects it.
pub const BACKLOG_TAG: &str = "absent";
/// Jobs per backlog enqueue: the enqueue batch limit (`Limits::max_batch`).
const BACKLOG_BATCH_JOBS: usize = 1_000;
/// Backlog enqueues in flight at once, each on its own connection.
const BACKLOG_IN_FLIGHT: usize = 4;

/// How a benchmark client calls leasehold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// One worker session per client: each call is a frame on its stream.
    #[default]
    Session,
    /// Each call a unary gRPC call, with its own HTTP/2 stream.
    Unary,
}

/// A leasehold node, or a cluster, at one or more gRPC addresses.
pub struct Leasehold {
    addrs: Vec<String>,
    access: Access,
    api: Api,
}

impl Leasehold {
    /// The node(s) at `addr`: `host:port`, or several separated by commas,
    /// reached as `access` says.
    pub fn new(addr: &str, access: Access) -> Leasehold {
        let addrs = addr.split(',').map(str::trim).filter(|a| !a.is_empty());
        Leasehold { addrs: addrs.map(str::to_string).collect(), access, api: Api::default() }
    }

    /// The same target, its clients calling through `api`.
    pub fn with_api(mut self, api: Api) -> Leasehold {
        self.api = api;
        self
    }

    /// The address list for client `index`: every address, starting at
    /// node `index mod n`.
    fn addrs_from(&self, index: usize) -> String {
        let n = self.addrs.len().max(1);
        let mut rotated = self.addrs.clone();
        rotated.rotate_left(index % n);
        rotated.join(",")
    }

    /// Enqueues `jobs` jobs tagged [`BACKLOG_TAG`] (payload `payload_bytes`
    /// bytes) in batches of [`BACKLOG_BATCH_JOBS`], at most
    /// [`BACKLOG_IN_FLIGHT`] batches at a time, then reads the queue's ready
    /// count back (a linearizable read): every enqueue is answered once its
    /// entry is committed and applied, so on return the backlog is in place.
    /// The enqueues carry no idempotency key, so a failed batch is not
    /// retried (it may have landed) and the fill fails instead.
    pub async fn fill_backlog(&self, jobs: usize, payload_bytes: usize) -> anyhow::Result<()> {
        let batches = jobs.div_ceil(BACKLOG_BATCH_JOBS);
        let next = Arc::new(AtomicUsize::new(0));
        let mut senders = tokio::task::JoinSet::new();
        for index in 0..BACKLOG_IN_FLIGHT.min(batches) {
            let client = self.access.client(&self.addrs_from(index))?;
            let next = Arc::clone(&next);
            senders.spawn(async move {
                loop {
                    let batch = next.fetch_add(1, Ordering::Relaxed);
                    if batch >= batches {
                        return anyhow::Ok(());
                    }
                    let first = batch * BACKLOG_BATCH_JOBS;
                    let count = BACKLOG_BATCH_JOBS.min(jobs - first);
                    let specs = (0..count).map(|_| backlog_job(payload_bytes)).collect();
                    let results = client
                        .enqueue(specs)
                        .await
                        .with_context(|| format!("backlog batch {batch} of {batches}"))?;
                    anyhow::ensure!(
                        results.len() == count,
                        "backlog batch {batch}: {} results for {count} jobs",
                        results.len()
                    );
                }
            });
        }
        while let Some(joined) = senders.join_next().await {
            joined??;
        }
        let client = self.access.client(&self.addrs_from(0))?;
        let stats = client.stats(Some(QUEUE.to_string()), false).await?;
        let ready: u64 = stats.queues.iter().filter(|q| q.queue == QUEUE).map(|q| q.ready).sum();
        anyhow::ensure!(
            ready == u64::try_from(jobs)?,
            "after enqueuing a backlog of {jobs} jobs, queue {QUEUE} has {ready} ready"
        );
        Ok(())
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

/// One backlog job: the workload's queue, payload size and lease, and a tag
/// its claims never select.
fn backlog_job(payload_bytes: usize) -> v1::JobSpec {
    v1::JobSpec {
        queue: QUEUE.to_string(),
        payload: vec![0x5a_u8; payload_bytes],
        lease_ttl_ms: Some(LEASE_TTL_MS),
        tags: vec![BACKLOG_TAG.to_string()],
        ..Default::default()
    }
}

/// One benchmark client's leasehold connection.
pub struct LeaseholdConn {
    client: Client,
    /// The client's session, with [`Api::Session`].
    session: Option<Session>,
    worker: String,
}

impl Target for Leasehold {
    type Conn = LeaseholdConn;

    async fn connect(&self, index: usize) -> anyhow::Result<LeaseholdConn> {
        let client = self.access.client(&self.addrs_from(index))?;
        // Connect now rather than lazily inside the measured window.
        client.stats(Some(QUEUE.to_string()), true).await?;
        let session = match self.api {
            Api::Session => Some(client.session().await?),
            Api::Unary => None,
        };
        Ok(LeaseholdConn { client, session, worker: format!("bench-{index}") })
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
        let results = match &self.session {
            Some(session) => session.enqueue(vec![spec]).await?,
            None => self.client.enqueue(vec![spec]).await?,
        };
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
            let grants = match &self.session {
                Some(session) => session.claim(request).await?.grants,
                None => self.client.claim(request).await?,
            };
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
        match &self.session {
            Some(session) => session.ack(claimed.job_id, claimed.token).await?,
            None => self.client.ack(claimed.job_id, claimed.token).await?,
        }
        Ok(())
    }
}
