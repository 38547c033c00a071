//! What an operator asks of the recent past, read from the job table (no
//! log of its own, so nothing new replicates and snapshots keep their
//! layout): how long each queue's oldest ready job has waited, which jobs
//! lost a lease lately, and which are held again after a failed attempt.
//! The Stats call answers these, and the status page reads them there.

use super::{LEASE_EXPIRED_ERROR, State};
use crate::job::JobState;
use crate::jobs::JobRead;

/// At most this many entries in each recent list.
pub const RECENT_LIMIT: usize = 20;
/// At most this many of the newest jobs are looked at for the recent lists,
/// so a reply costs the same on a table of a million jobs.
pub const RECENT_SCAN: usize = 10_000;

/// A job whose last attempt ended in a lease expiry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredLease {
    /// The job.
    pub job_id: u64,
    /// Its queue.
    pub queue: String,
    /// Failed attempts so far, this expiry included.
    pub attempts: u32,
    /// Where the job is now.
    pub state: JobState,
    /// Cluster time of the sweep that took the lease back, while the job
    /// has not been delivered again (a lapsed lease is due at once, so the
    /// job's due time is the sweep's; dead jobs keep it as their finish).
    pub expired_at_ms: Option<u64>,
}

/// A job held again after a failed attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redelivery {
    /// The job.
    pub job_id: u64,
    /// Its queue.
    pub queue: String,
    /// Which delivery this is: failed attempts + 1.
    pub delivery: u32,
    /// Worker id of the holder.
    pub holder: String,
    /// Cluster time of the grant or its last refresh.
    pub granted_at_ms: u64,
    /// Why the previous attempt failed.
    pub last_error: String,
}

impl State {
    /// When `queue`'s longest-waiting ready job became due, if it has one
    /// due at `max(cluster time, now_ms)`.
    pub fn oldest_ready_in(&self, queue: &str, now_ms: u64) -> Option<u64> {
        let at_ms = self.cluster_time_ms.max(now_ms);
        let &(due_ms, _) = self.indexes.queues.get(queue)?.due_order.first()?;
        (due_ms <= at_ms).then_some(due_ms)
    }

    /// The newest jobs (by id, at most [`RECENT_LIMIT`] among the newest
    /// [`RECENT_SCAN`]) whose last failed attempt was a lease expiry.
    pub fn recent_expiries(&self) -> Vec<ExpiredLease> {
        self.newest_jobs()
            .filter(|(_, job)| job.last_error() == Some(LEASE_EXPIRED_ERROR))
            .take(RECENT_LIMIT)
            .map(|(job_id, job)| ExpiredLease {
                job_id,
                queue: job.queue.to_string(),
                attempts: job.attempts,
                state: job.state,
                expired_at_ms: match job.state {
                    JobState::Ready => Some(job.not_before_ms),
                    JobState::Dead => job.finished_at_ms(),
                    JobState::Claimed | JobState::Acked => None,
                },
            })
            .collect()
    }

    /// The newest claimed jobs (by id, at most [`RECENT_LIMIT`] among the
    /// newest [`RECENT_SCAN`]) that had failed an attempt before this
    /// delivery.
    pub fn recent_redeliveries(&self) -> Vec<Redelivery> {
        self.newest_jobs()
            .filter(|(_, job)| job.state == JobState::Claimed && job.attempts > 0)
            .filter_map(|(job_id, job)| {
                let lease = job.lease()?;
                Some(Redelivery {
                    job_id,
                    queue: job.queue.to_string(),
                    delivery: job.attempts.saturating_add(1),
                    holder: lease.holder.clone(),
                    granted_at_ms: lease.granted_at_ms,
                    last_error: job.last_error().unwrap_or_default().to_owned(),
                })
            })
            .take(RECENT_LIMIT)
            .collect()
    }

    fn newest_jobs(&self) -> impl Iterator<Item = (u64, JobRead<'_>)> {
        self.jobs.newest(RECENT_SCAN).into_iter()
    }
}

#[cfg(test)]
mod tests {
    use crate::command::{Command, Proposal};
    use crate::job::{JobSpec, JobState};
    use crate::state::State;

    fn apply(state: &mut State, now_ms: u64, command: Command) {
        state.apply(1, &Proposal { now_ms, command });
    }

    fn claim(state: &mut State, now_ms: u64, worker: &str) {
        let command = Command::Claim {
            worker: worker.into(),
            queue: "q".into(),
            max: 1,
            lease_ttl_ms: Some(1_000),
            selector: vec![],
        };
        apply(state, now_ms, command);
    }

    #[test]
    fn a_lapsed_lease_is_an_expiry_then_a_redelivery() {
        let mut state = State::new();
        let spec = JobSpec { queue: "q".into(), ..JobSpec::default() };
        apply(&mut state, 1_000, Command::Enqueue { jobs: vec![spec] });
        assert_eq!(state.oldest_ready_in("q", 1_500), Some(1_000));
        assert_eq!(state.oldest_ready_in("other", 1_500), None);
        claim(&mut state, 2_000, "w1");
        assert!(state.recent_expiries().is_empty(), "nothing lapsed yet");
        assert!(state.recent_redeliveries().is_empty(), "a first delivery is no redelivery");

        // Past the term's grace, so the sweep takes the lease back.
        apply(&mut state, 60_000, Command::Sweep);
        let expired = state.recent_expiries();
        assert_eq!(expired.len(), 1, "{expired:?}");
        assert_eq!((expired[0].job_id, expired[0].attempts), (1, 1));
        assert_eq!(expired[0].state, JobState::Ready);
        assert_eq!(expired[0].expired_at_ms, Some(60_000));

        claim(&mut state, 61_000, "w2");
        let expired = state.recent_expiries();
        assert_eq!((expired[0].state, expired[0].expired_at_ms), (JobState::Claimed, None));
        let again = state.recent_redeliveries();
        assert_eq!(again.len(), 1, "{again:?}");
        assert_eq!((again[0].job_id, again[0].delivery), (1, 2));
        assert_eq!((again[0].holder.as_str(), again[0].granted_at_ms), ("w2", 61_000));
        assert_eq!(again[0].last_error, "lease expired");
        assert_eq!(state.oldest_ready_in("q", 61_000), None, "nothing waits: the job is held");
    }

    #[test]
    fn a_delayed_job_is_not_the_oldest_ready() {
        let mut state = State::new();
        let spec = JobSpec { queue: "q".into(), not_before_ms: Some(9_000), ..JobSpec::default() };
        apply(&mut state, 1_000, Command::Enqueue { jobs: vec![spec] });
        assert_eq!(state.oldest_ready_in("q", 5_000), None);
        assert_eq!(state.oldest_ready_in("q", 9_500), Some(9_000));
    }
}
