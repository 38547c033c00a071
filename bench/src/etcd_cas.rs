//! etcd v3 as a job queue the way a competent etcd user writes it when
//! claims must be fast: the job key itself carries its state, and every
//! change of it is a compare-and-swap on its `mod_revision`.
//!
//! - enqueue: `put /q/jobs/<id>` = `r` + payload (ready);
//! - claim: a **serializable** range over `/q/jobs/` with a limit, served by
//!   the member the client is connected to from its own copy (no ReadIndex
//!   round, possibly a little stale); among the jobs it returns that are
//!   ready, or claimed with a deadline already past, take the first with
//!   `txn if mod_revision(/q/jobs/<id>) == <revision read> then put
//!   /q/jobs/<id> = c + deadline + worker + payload`. The lease deadline
//!   lives in the value (the leader-independent wall clock of the claimer),
//!   so no `LeaseGrant` per claim; the txn's revision is the fencing token.
//!   A lost race (the read was stale, or another client won) reads the
//!   first jobs again in the txn's else branch, where the compare ran, and
//!   the next try picks from that fresh list; an empty list reads again;
//! - ack: `txn if mod_revision(/q/jobs/<id>) == token then delete
//!   /q/jobs/<id>`.
//!
//! Correctness stays with the compare-and-swap: a stale read can only make
//! a txn fail, never let two claims of one revision both succeed. Each
//! client picks a different candidate (its index modulo the list), and client
//! `i` of a cluster connects to member `i mod n` only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};

use crate::measure::{Claimed, Connection, Target};

const JOBS: &str = "/q/jobs/";
/// Lease length, the same as the other systems' 30 s leases.
const LEASE: Duration = Duration::from_secs(30);
/// First byte of a ready job's value.
const READY: u8 = b'r';
/// First byte of a claimed job's value; 8 bytes of deadline (Unix ms, big
/// endian) follow, then the worker's name, a newline and the payload.
const CLAIMED: u8 = b'c';

/// An etcd server, or a cluster, at one or more client URLs.
pub struct EtcdCas {
    endpoints: Vec<String>,
    /// Jobs read per claim try: enough that every client finds one of its own
    /// beside the at most one per client that are claimed.
    candidates: i64,
    /// Job ids shared by every client of this run.
    next_job: Arc<AtomicU64>,
}

impl EtcdCas {
    /// The member(s) at `addr` (`host:port`, or several separated by
    /// commas), for `clients` clients.
    pub fn new(addr: &str, clients: usize) -> EtcdCas {
        let clients = i64::try_from(clients).unwrap_or(1024);
        let addrs = addr.split(',').map(str::trim).filter(|a| !a.is_empty());
        EtcdCas {
            endpoints: addrs.map(|a| format!("http://{a}")).collect(),
            candidates: (2 * clients).max(16),
            next_job: Arc::new(AtomicU64::new(1)),
        }
    }
}

/// One benchmark client's etcd connection.
pub struct EtcdCasConn {
    client: Client,
    index: usize,
    candidates: i64,
    next_job: Arc<AtomicU64>,
    worker: String,
}

impl Target for EtcdCas {
    type Conn = EtcdCasConn;

    async fn connect(&self, index: usize) -> anyhow::Result<EtcdCasConn> {
        let endpoint = &self.endpoints[index % self.endpoints.len().max(1)];
        let client = Client::connect([endpoint.as_str()], None).await?;
        Ok(EtcdCasConn {
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

fn id_of(key: &[u8]) -> Option<u64> {
    std::str::from_utf8(key).ok()?.strip_prefix(JOBS)?.parse().ok()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The payload of a job value, ready or claimed; `None` when the value is
/// not one this module wrote.
fn payload_of(value: &[u8]) -> Option<&[u8]> {
    match value.split_first()? {
        (&READY, payload) => Some(payload),
        (&CLAIMED, rest) => {
            let rest = rest.get(8..)?;
            let newline = rest.iter().position(|b| *b == b'\n')?;
            rest.get(newline + 1..)
        }
        _ => None,
    }
}

/// Whether a job value may be claimed at `now_ms`: ready, or claimed under
/// a deadline already past.
fn claimable(value: &[u8], now_ms: u64) -> bool {
    match value.split_first() {
        Some((&READY, _)) => true,
        Some((&CLAIMED, rest)) => match rest.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
            Some(deadline) => u64::from_be_bytes(deadline) <= now_ms,
            None => false,
        },
        _ => false,
    }
}

/// The value of a job claimed by `worker` until `deadline_ms`.
fn claimed_value(deadline_ms: u64, worker: &str, payload: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(1 + 8 + worker.len() + 1 + payload.len());
    value.push(CLAIMED);
    value.extend_from_slice(&deadline_ms.to_be_bytes());
    value.extend_from_slice(worker.as_bytes());
    value.push(b'\n');
    value.extend_from_slice(payload);
    value
}

/// A job a claim may try: its id, the revision it was read at and its payload.
struct Candidate {
    id: u64,
    mod_revision: i64,
    payload: Vec<u8>,
}

impl EtcdCasConn {
    /// The claimable jobs among the first ones, read from the connected
    /// member's own copy (serializable).
    async fn candidates(&mut self) -> anyhow::Result<Vec<Candidate>> {
        let options =
            GetOptions::new().with_prefix().with_limit(self.candidates).with_serializable();
        let response = self.client.get(JOBS, Some(options)).await?;
        Ok(claimable_of(response.kvs()))
    }
}

/// The claimable jobs among `kvs`, in key order.
fn claimable_of(kvs: &[KeyValue]) -> Vec<Candidate> {
    let now = now_ms();
    kvs.iter()
        .filter(|kv| claimable(kv.value(), now))
        .filter_map(|kv| {
            Some(Candidate {
                id: id_of(kv.key())?,
                mod_revision: kv.mod_revision(),
                payload: payload_of(kv.value())?.to_vec(),
            })
        })
        .collect()
}

impl Connection for EtcdCasConn {
    async fn enqueue(&mut self, payload: &[u8]) -> anyhow::Result<()> {
        let id = self.next_job.fetch_add(1, Ordering::Relaxed);
        let mut value = Vec::with_capacity(1 + payload.len());
        value.push(READY);
        value.extend_from_slice(payload);
        self.client.put(job_key(id), value, None).await?;
        Ok(())
    }

    async fn claim(&mut self) -> anyhow::Result<Claimed> {
        let mut retries = 0;
        let mut candidates = self.candidates().await?;
        loop {
            if candidates.is_empty() {
                retries += 1;
                tokio::task::yield_now().await;
                candidates = self.candidates().await?;
                continue;
            }
            let candidate = &candidates[self.index % candidates.len()];
            let key = job_key(candidate.id);
            let deadline = now_ms().saturating_add(LEASE.as_millis() as u64);
            // A lost race reads the first jobs again inside the same txn:
            // its range runs where the compare did, after every claim
            // ordered before it, so the next try picks from a fresh list at
            // no extra round trip.
            let fresh = GetOptions::new().with_prefix().with_limit(self.candidates);
            let take = Txn::new()
                .when([Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    candidate.mod_revision,
                )])
                .and_then([TxnOp::put(
                    key.as_str(),
                    claimed_value(deadline, &self.worker, &candidate.payload),
                    None,
                )])
                .or_else([TxnOp::get(JOBS, Some(fresh))]);
            let response = self.client.txn(take).await?;
            if response.succeeded() {
                let revision = response
                    .header()
                    .map(|header| header.revision())
                    .ok_or_else(|| anyhow::anyhow!("claim txn answered no header"))?;
                let token = u64::try_from(revision)?;
                return Ok(Claimed { job_id: candidate.id, token, retries });
            }
            retries += 1;
            candidates = match response.op_responses().into_iter().next() {
                Some(TxnOpResponse::Get(range)) => claimable_of(range.kvs()),
                _ => anyhow::bail!("a lost claim txn answered other than its range"),
            };
        }
    }

    async fn ack(&mut self, claimed: Claimed) -> anyhow::Result<()> {
        let key = job_key(claimed.job_id);
        let finish = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                i64::try_from(claimed.token)?,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let response = self.client.txn(finish).await?;
        anyhow::ensure!(response.succeeded(), "ack of job {} refused: stale token", claimed.job_id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The job value's encoding, read back the way a claim reads it: a
    //! ready job is claimable, a claimed one only once its deadline passed,
    //! and the payload survives the claim's rewrite.

    use super::*;

    #[test]
    fn a_claimed_value_keeps_its_payload_and_expires_at_its_deadline() {
        let value = claimed_value(1_000, "bench-3", b"payload\nwith newline");
        assert_eq!(payload_of(&value), Some(&b"payload\nwith newline"[..]));
        assert!(!claimable(&value, 999));
        assert!(claimable(&value, 1_000));
        let ready = [&[READY][..], b"x"].concat();
        assert!(claimable(&ready, 0));
        assert_eq!(payload_of(&ready), Some(&b"x"[..]));
        assert!(!claimable(b"", 0));
        assert!(!claimable(&[CLAIMED, 0, 0], u64::MAX));
        assert_eq!(payload_of(b"zzz"), None);
    }
}
