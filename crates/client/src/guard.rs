//! The lease guard a worker hands each job's handler: the job, its lease
//! (fencing token, epoch), the worker's own deadline for the lease, and a
//! cancellation token that fires when the lease is lost or the worker
//! drains.
//!
//! The guard is cheap to clone, so a handler can move a copy into a
//! blocking task or a thread of its own; that copy still sees the
//! cancellation, which is the point of the token: the worker drops the
//! handler's future when the lease is lost, but it cannot stop a thread
//! the handler started, nor a side effect already on its way. Those check
//! [`LeaseGuard::is_cancelled`] (or await [`LeaseGuard::cancelled`]) and
//! pass [`LeaseGuard::fencing_token`] to whatever they write, so a store
//! that has seen a larger token refuses them.

use std::sync::{Arc, Mutex};

use leasehold_proto::v1;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a guard's cancellation token fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelReason {
    /// The lease is gone: the node refused a renewal (another worker may
    /// hold the job now), or the worker's own deadline passed without one.
    /// Stop; do not write with this token.
    LeaseLost,
    /// The worker is draining: no new claims, and running jobs have the
    /// grace period to finish. The lease is still held and renewed; a
    /// handler may finish, or return [`crate::Outcome::Release`] to give the
    /// job back at once.
    Draining,
}

/// One job's lease, as its handler holds it. See the module docs.
#[derive(Clone)]
pub struct LeaseGuard {
    inner: Arc<Inner>,
}

struct Inner {
    job: v1::Job,
    lease: v1::Lease,
    /// The worker's local deadline of the lease (its monotonic clock),
    /// moved on by each renewal.
    deadline: Mutex<Instant>,
    /// Fires only when the lease is lost.
    lost: CancellationToken,
    /// The handler's token: a child of the worker's drain token, also
    /// cancelled when the lease is lost.
    cancel: CancellationToken,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("job_id", &self.job_id())
            .field("token", &self.fencing_token())
            .field("epoch", &self.epoch())
            .field("cancel_reason", &self.cancel_reason())
            .finish_non_exhaustive()
    }
}

impl LeaseGuard {
    /// A guard for `job` under `lease`, whose local deadline is `deadline`,
    /// cancelled with `drain` (the worker's drain token) or when lost.
    pub(crate) fn new(
        job: v1::Job,
        lease: v1::Lease,
        deadline: Instant,
        drain: &CancellationToken,
    ) -> LeaseGuard {
        LeaseGuard {
            inner: Arc::new(Inner {
                job,
                lease,
                deadline: Mutex::new(deadline),
                lost: CancellationToken::new(),
                cancel: drain.child_token(),
            }),
        }
    }

    /// The job as it was claimed (payload, attempts so far, tags, …).
    pub fn job(&self) -> &v1::Job {
        &self.inner.job
    }

    /// The job's id.
    pub fn job_id(&self) -> u64 {
        self.inner.job.id
    }

    /// The job's payload.
    pub fn payload(&self) -> &[u8] {
        &self.inner.job.payload
    }

    /// Failed attempts before this one (this run is attempt `attempts + 1`).
    pub fn attempts(&self) -> u32 {
        self.inner.job.attempts
    }

    /// The lease as granted (holder, token, epoch, cluster times).
    pub fn lease(&self) -> &v1::Lease {
        &self.inner.lease
    }

    /// The fencing token: pass it to every side effect, so a store that
    /// has seen a larger one for the same resource refuses this writer.
    /// Tokens are strictly increasing across the cluster and never reused.
    pub fn fencing_token(&self) -> u64 {
        self.inner.lease.token
    }

    /// The Raft term of the leader that granted the lease.
    pub fn epoch(&self) -> u64 {
        self.inner.lease.epoch
    }

    /// When the worker treats the lease as lost unless it is renewed, on
    /// the worker's monotonic clock: the claim's (or last renewal's) send
    /// time plus the TTL minus a margin. It moves on with each renewal.
    pub fn deadline(&self) -> Instant {
        match self.inner.deadline.lock() {
            Ok(deadline) => *deadline,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    /// The cancellation token: fires when the lease is lost or the worker
    /// drains ([`LeaseGuard::cancel_reason`] says which). Clone it into
    /// anything that should stop with the job.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.inner.cancel
    }

    /// Resolves when the cancellation token fires.
    pub async fn cancelled(&self) {
        self.inner.cancel.cancelled().await
    }

    /// Whether the cancellation token has fired.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// Whether the lease is lost (a cancellation for drain is not).
    pub fn is_lost(&self) -> bool {
        self.inner.lost.is_cancelled()
    }

    /// Why the token fired, or `None` while it has not.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        if self.inner.lost.is_cancelled() {
            Some(CancelReason::LeaseLost)
        } else if self.inner.cancel.is_cancelled() {
            Some(CancelReason::Draining)
        } else {
            None
        }
    }

    /// The job and lease as the claim answered them.
    pub fn grant(&self) -> v1::Grant {
        v1::Grant { job: Some(self.inner.job.clone()), lease: Some(self.inner.lease.clone()) }
    }

    /// Moves the local deadline on after a renewal.
    pub(crate) fn renewed_until(&self, deadline: Instant) {
        match self.inner.deadline.lock() {
            Ok(mut held) => *held = deadline,
            Err(poisoned) => *poisoned.into_inner() = deadline,
        }
    }

    /// Marks the lease lost: both tokens fire.
    pub(crate) fn mark_lost(&self) {
        self.inner.lost.cancel();
        self.inner.cancel.cancel();
    }

    /// Resolves when the lease is lost.
    pub(crate) async fn lost(&self) {
        self.inner.lost.cancelled().await
    }
}

/// Handlers that need only the job take the bare grant; the worker then
/// still drops their future when the lease is lost.
impl From<LeaseGuard> for v1::Grant {
    fn from(guard: LeaseGuard) -> v1::Grant {
        guard.grant()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(drain: &CancellationToken) -> LeaseGuard {
        let job = v1::Job { id: 7, attempts: 2, payload: b"p".to_vec(), ..Default::default() };
        let lease = v1::Lease { job_id: 7, token: 41, epoch: 3, ..Default::default() };
        LeaseGuard::new(job, lease, Instant::now(), drain)
    }

    #[tokio::test]
    async fn drain_cancels_without_losing_and_loss_says_lost() {
        let drain = CancellationToken::new();
        let (draining, losing) = (guard(&drain), guard(&drain));
        assert_eq!((draining.job_id(), draining.fencing_token(), draining.epoch()), (7, 41, 3));
        assert_eq!(draining.cancel_reason(), None);
        losing.mark_lost();
        assert_eq!(losing.cancel_reason(), Some(CancelReason::LeaseLost));
        assert!(!draining.is_cancelled(), "one lease lost cancels no other");
        drain.cancel();
        draining.cancelled().await;
        assert_eq!(draining.cancel_reason(), Some(CancelReason::Draining));
        assert!(!draining.is_lost());
    }
}
