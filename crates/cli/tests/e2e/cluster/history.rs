//! The record of every client operation of the load stories (the leader
//! SIGKILL, the rolling restart; the load is `load.rs`), and the checks of
//! SPEC §7 guarantees 1 to 3 over it and over the jobs as the cluster
//! finally holds them.
//!
//! The load clients only enqueue, claim and ack: they never refresh,
//! release or nack (and a drain releases only what its own node's executor
//! holds). So a lease ends in one of two ways only: its ack (after which
//! the job is never claimed again) or its lapse at
//! `expires_at_ms`, after which the leader's sweep returns the job to ready
//! (the sweep takes back leases with `expires_at_ms <= cluster time`). Hence
//! the rule checked for "no two leases valid at the same cluster time": for
//! successive grants `a`, `b` of one job in grant order,
//! `b.granted_at_ms >= a.expires_at_ms` (a lease is valid on the half-open
//! interval `[granted_at_ms, expires_at_ms)`), and `b.token > a.token`.
//! Were releases or nacks in the mix, `a` would end at the earlier of its
//! expiry and its release instead; the load leaves them out so the rule
//! needs no server-side timestamps the clients cannot see. Grants a client
//! never saw (a claim that committed while its answer was lost) are missing
//! from the record; the rule still holds for every pair of grants it has,
//! because it holds for all of them.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, bail, ensure};
use leasehold_client::ClientError;
use leasehold_proto::v1;

/// One enqueue and what it answered.
#[derive(Debug)]
pub struct Enqueue {
    /// The job's idempotency key (unique per enqueue).
    pub key: String,
    /// The job id, or why no answer came.
    pub outcome: Result<u64, String>,
}

/// One lease a client was granted.
#[derive(Clone, Debug)]
pub struct Grant {
    /// The claiming client's worker id.
    pub worker: String,
    /// The lease as granted.
    pub lease: v1::Lease,
}

/// How an ack was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AckAnswer {
    /// The server accepted the ack.
    Accepted,
    /// FAILED_PRECONDITION: the token was superseded.
    Refused(String),
    /// No answer (UNAVAILABLE, a broken connection, a deadline): the ack may
    /// or may not have committed.
    Unknown(String),
    /// Any other answer; a failure of the story.
    Unexpected(String),
}

/// One ack and its answer.
#[derive(Clone, Debug)]
pub struct Ack {
    /// The job.
    pub job_id: u64,
    /// The token it was acked with.
    pub token: u64,
    /// What came back.
    pub answer: AckAnswer,
}

/// Everything the clients did.
#[derive(Debug, Default)]
pub struct History {
    /// Every enqueue.
    pub enqueues: Vec<Enqueue>,
    /// Every grant received.
    pub grants: Vec<Grant>,
    /// Every ack sent.
    pub acks: Vec<Ack>,
    /// Claims that got no answer.
    pub failed_claims: Vec<String>,
    /// Anything malformed a client received.
    pub problems: Vec<String>,
}

/// Counts worth printing after the checks.
#[derive(Debug)]
pub struct Summary {
    /// Enqueues answered with an id.
    pub enqueued: usize,
    /// Enqueues without an answer.
    pub enqueues_unanswered: usize,
    /// Grants received.
    pub grants: usize,
    /// Jobs granted more than once (redelivered after a lapse).
    pub redelivered_jobs: usize,
    /// Acks accepted.
    pub acks_accepted: usize,
    /// Acks refused as superseded.
    pub acks_refused: usize,
    /// Acks without an answer.
    pub acks_unanswered: usize,
    /// Claims without an answer.
    pub claims_unanswered: usize,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "enqueues: {} answered, {} unanswered; grants: {} ({} jobs redelivered); acks: {} \
             accepted, {} refused as stale, {} unanswered; claims unanswered: {}",
            self.enqueued,
            self.enqueues_unanswered,
            self.grants,
            self.redelivered_jobs,
            self.acks_accepted,
            self.acks_refused,
            self.acks_unanswered,
            self.claims_unanswered
        )
    }
}

/// Whether a failed call's outcome is unknown: it got no answer from a
/// node that decided it (UNAVAILABLE, a broken connection, a deadline).
pub fn no_answer(error: &ClientError) -> bool {
    matches!(
        error.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::DeadlineExceeded
    )
}

impl History {
    /// Adds another client's history.
    pub fn merge(&mut self, other: History) {
        self.enqueues.extend(other.enqueues);
        self.grants.extend(other.grants);
        self.acks.extend(other.acks);
        self.failed_claims.extend(other.failed_claims);
        self.problems.extend(other.problems);
    }

    /// Records a grant to `worker`; answers its job id and token, or
    /// `None` (recorded as a problem) when the grant carries no lease.
    pub fn record_grant(&mut self, worker: &str, grant: v1::Grant) -> Option<(u64, u64)> {
        match grant.lease {
            Some(lease) => {
                let held = (lease.job_id, lease.token);
                if grant.job.as_ref().is_none_or(|job| job.id != lease.job_id) {
                    self.problems.push(format!("grant's job is not its lease's: {:?}", grant.job));
                }
                self.grants.push(Grant { worker: worker.to_string(), lease });
                Some(held)
            }
            None => {
                self.problems.push(format!("grant without a lease: {:?}", grant.job));
                None
            }
        }
    }

    /// Records the answer of acking `job_id` with `token`; answers whether
    /// it was accepted.
    pub fn record_ack(
        &mut self,
        job_id: u64,
        token: u64,
        outcome: Result<(), ClientError>,
    ) -> bool {
        let answer = match outcome {
            Ok(()) => AckAnswer::Accepted,
            Err(error) if error.code() == tonic::Code::FailedPrecondition => {
                AckAnswer::Refused(error.to_string())
            }
            Err(error) if no_answer(&error) => AckAnswer::Unknown(error.to_string()),
            Err(error) => AckAnswer::Unexpected(error.to_string()),
        };
        let accepted = answer == AckAnswer::Accepted;
        self.acks.push(Ack { job_id, token, answer });
        accepted
    }

    /// Checks the guarantees against `jobs`, every job of the story's queue
    /// as the cluster holds it once the load has stopped and the queue has
    /// been worked off, and `lease_ttl_ms`, the lease length every claim
    /// asked for.
    pub fn check(&self, jobs: &BTreeMap<u64, v1::Job>, lease_ttl_ms: u64) -> Result<Summary> {
        ensure!(self.problems.is_empty(), "malformed answers: {:?}", self.problems);
        self.check_enqueues(jobs)?;
        let redelivered_jobs = self.check_leases(lease_ttl_ms)?;
        self.check_acks(jobs)?;
        let count = |f: fn(&AckAnswer) -> bool| self.acks.iter().filter(|a| f(&a.answer)).count();
        Ok(Summary {
            enqueued: self.enqueues.iter().filter(|e| e.outcome.is_ok()).count(),
            enqueues_unanswered: self.enqueues.iter().filter(|e| e.outcome.is_err()).count(),
            grants: self.grants.len(),
            redelivered_jobs,
            acks_accepted: count(|a| *a == AckAnswer::Accepted),
            acks_refused: count(|a| matches!(a, AckAnswer::Refused(_))),
            acks_unanswered: count(|a| matches!(a, AckAnswer::Unknown(_))),
            claims_unanswered: self.failed_claims.len(),
        })
    }

    /// No acked enqueue lost (guarantee 3): every enqueue answered with an
    /// id names a job that exists under that key and ended acked; every job
    /// in the queue comes from some enqueue (answered or not — one whose
    /// answer was lost may have committed); and every job ended acked.
    fn check_enqueues(&self, jobs: &BTreeMap<u64, v1::Job>) -> Result<()> {
        let mut id_of_key: BTreeMap<&str, u64> = BTreeMap::new();
        for enqueue in &self.enqueues {
            let Ok(job_id) = enqueue.outcome else { continue };
            if let Some(earlier) = id_of_key.insert(&enqueue.key, job_id) {
                ensure!(
                    earlier == job_id,
                    "key {} answered ids {earlier} and {job_id}",
                    enqueue.key
                );
            }
            let Some(job) = jobs.get(&job_id) else {
                bail!("enqueue of {} answered job {job_id}, which the cluster lost", enqueue.key);
            };
            ensure!(
                job.idempotency_key.as_deref() == Some(enqueue.key.as_str()),
                "job {job_id} carries key {:?}, enqueued as {}",
                job.idempotency_key,
                enqueue.key
            );
        }
        let keys: BTreeSet<&str> = self.enqueues.iter().map(|e| e.key.as_str()).collect();
        for job in jobs.values() {
            let key = job.idempotency_key.as_deref().unwrap_or_default();
            ensure!(keys.contains(key), "job {} with key {key:?} was never enqueued", job.id);
            ensure!(
                job.state == v1::JobState::Acked as i32,
                "job {} ended in state {} rather than acked: {job:?}",
                job.id,
                job.state
            );
        }
        Ok(())
    }

    /// No overlapping leases, tokens increasing (guarantee 1): tokens are
    /// unique across all grants; per job, in grant order, each grant starts
    /// no earlier than the previous one expired and has a larger token and
    /// no smaller epoch; every lease lasts the TTL asked for and names the
    /// worker that claimed it. Answers how many jobs were granted more than
    /// once.
    fn check_leases(&self, lease_ttl_ms: u64) -> Result<usize> {
        let mut tokens = BTreeSet::new();
        let mut by_job: BTreeMap<u64, Vec<&v1::Lease>> = BTreeMap::new();
        for grant in &self.grants {
            let lease = &grant.lease;
            ensure!(tokens.insert(lease.token), "token {} granted twice", lease.token);
            ensure!(
                lease.holder == grant.worker,
                "{} was granted a lease held by {lease:?}",
                grant.worker
            );
            ensure!(
                lease.expires_at_ms == lease.granted_at_ms + lease_ttl_ms,
                "lease of {lease_ttl_ms} ms asked for, granted {lease:?}"
            );
            by_job.entry(lease.job_id).or_default().push(lease);
        }
        for (job_id, leases) in &mut by_job {
            leases.sort_by_key(|lease| (lease.granted_at_ms, lease.token));
            for pair in leases.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                ensure!(
                    b.granted_at_ms >= a.expires_at_ms,
                    "job {job_id}: two leases valid at once: {a:?} and {b:?}"
                );
                ensure!(b.token > a.token, "job {job_id}: tokens went down: {a:?} then {b:?}");
                ensure!(b.epoch >= a.epoch, "job {job_id}: epochs went down: {a:?} then {b:?}");
            }
        }
        Ok(by_job.values().filter(|leases| leases.len() > 1).count())
    }

    /// No ack accepted with a superseded token (guarantee 2): an accepted
    /// ack's token is the job's final lease token, on a job that ended
    /// acked, and no later grant of the job was seen; a refused ack's token
    /// is not the final one; the final lease is the one granted under its
    /// token; no ack got an answer other than accepted, refused or none.
    fn check_acks(&self, jobs: &BTreeMap<u64, v1::Job>) -> Result<()> {
        let granted: BTreeMap<u64, &Grant> =
            self.grants.iter().map(|grant| (grant.lease.token, grant)).collect();
        for ack in &self.acks {
            let Some(job) = jobs.get(&ack.job_id) else {
                bail!("ack of job {} that the cluster does not hold: {ack:?}", ack.job_id);
            };
            let final_token = job.lease.as_ref().map(|lease| lease.token);
            match &ack.answer {
                AckAnswer::Accepted => {
                    ensure!(
                        job.state == v1::JobState::Acked as i32 && final_token == Some(ack.token),
                        "ack of job {} with token {} was accepted, but the job ended {job:?}",
                        ack.job_id,
                        ack.token
                    );
                    ensure!(
                        granted.contains_key(&ack.token),
                        "accepted ack of a token never granted: {ack:?}"
                    );
                    let later = self
                        .grants
                        .iter()
                        .find(|g| g.lease.job_id == ack.job_id && g.lease.token > ack.token);
                    ensure!(
                        later.is_none(),
                        "job {} claimed again after its ack: {later:?}",
                        ack.job_id
                    );
                }
                AckAnswer::Refused(message) => {
                    ensure!(message.contains("stale"), "refusal does not say stale: {ack:?}");
                    ensure!(
                        final_token != Some(ack.token),
                        "ack of job {} with its final token {} was refused",
                        ack.job_id,
                        ack.token
                    );
                }
                AckAnswer::Unknown(_) => {}
                AckAnswer::Unexpected(message) => bail!("ack answered {message}: {ack:?}"),
            }
        }
        for job in jobs.values() {
            let Some(lease) = &job.lease else { bail!("acked job without a lease: {job:?}") };
            if let Some(grant) = granted.get(&lease.token) {
                ensure!(
                    grant.lease == *lease,
                    "job {}: final lease {lease:?}, granted as {:?}",
                    job.id,
                    grant.lease
                );
            }
        }
        Ok(())
    }
}
