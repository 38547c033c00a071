//! Readiness: is this node safe to schedule on? A store write+read probe, a
//! known leader (acknowledged by a quorum lately, when it is this node; or
//! known until lately, while an election runs), applied index caught up
//! with the log, not draining. The answer is cached for about a second,
//! and callers that find no fresh answer share the one being made, so
//! probes cannot load the store however many arrive at once.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::journal::Journal;

/// How long a readiness answer is reused.
const CACHE_FOR: Duration = Duration::from_secs(1);
/// How long the store probe may take before the `store` check fails: a
/// disk that hangs (a failing device stuck in a sync) must read not
/// ready, not leave `/readyz` and the health watch waiting with it.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How far the applied index may trail the last log index and still be ready.
const MAX_APPLY_LAG: u64 = 1_000;
/// How often [`track_leader`] looks whether this node knows a leader.
pub const LEADER_LOOK_EVERY: Duration = Duration::from_millis(100);

/// The outcome of the readiness checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadinessReport {
    /// Whether every check passed.
    pub ready: bool,
    /// One line per check: `name: ok` or `name: why not`.
    pub checks: Vec<(String, Result<(), String>)>,
}

impl ReadinessReport {
    /// The body `/readyz` answers.
    pub fn body(&self) -> String {
        let mut body = String::new();
        for (name, outcome) in &self.checks {
            match outcome {
                Ok(()) => body.push_str(&format!("{name}: ok\n")),
                Err(why) => body.push_str(&format!("{name}: failed: {why}\n")),
            }
        }
        body
    }

    /// Whether the `draining` check failed when this report was made.
    fn says_draining(&self) -> bool {
        self.checks.iter().any(|(name, outcome)| name == "draining" && outcome.is_err())
    }
}

/// A value made at most once at a time, and reused while fresh: a caller
/// that finds no fresh value waits for the one being made, if any, then
/// looks again before making its own.
struct Cached<T> {
    slot: Mutex<Option<(Instant, T)>>,
    making: tokio::sync::Mutex<()>,
}

impl<T: Clone> Cached<T> {
    fn new() -> Self {
        Cached { slot: Mutex::new(None), making: tokio::sync::Mutex::new(()) }
    }

    /// The value made less than `fresh_for` ago that `still_good` accepts.
    fn fresh(&self, fresh_for: Duration, still_good: &impl Fn(&T) -> bool) -> Option<T> {
        let slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        let (at, value) = slot.as_ref()?;
        (at.elapsed() < fresh_for && still_good(value)).then(|| value.clone())
    }

    /// A fresh value, made by `make` when there is none.
    async fn get<F: Future<Output = T>>(
        &self,
        fresh_for: Duration,
        still_good: impl Fn(&T) -> bool,
        make: impl FnOnce() -> F,
    ) -> T {
        if let Some(value) = self.fresh(fresh_for, &still_good) {
            return value;
        }
        let _turn = self.making.lock().await;
        // Made by the caller this one waited for.
        if let Some(value) = self.fresh(fresh_for, &still_good) {
            return value;
        }
        let value = make().await;
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Instant::now(), value.clone()));
        value
    }
}

/// Computes and caches readiness for one node.
#[derive(Clone)]
pub struct Readiness {
    journal: Journal,
    cached: Arc<Cached<ReadinessReport>>,
    /// When [`track_leader`] last found a leader known (see [`leader_check`]).
    leader_seen: Arc<Mutex<Option<Instant>>>,
    /// The store probe last started: one that has not answered is not
    /// joined by another (each would hold a thread in the hung sync).
    probing: Arc<Mutex<Option<tokio::task::AbortHandle>>>,
}

impl Readiness {
    /// Readiness of `journal`'s node.
    pub fn new(journal: Journal) -> Self {
        Readiness {
            journal,
            cached: Arc::new(Cached::new()),
            leader_seen: Arc::new(Mutex::new(None)),
            probing: Arc::new(Mutex::new(None)),
        }
    }

    /// The journal whose node this describes.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The current report, at most about a second old — except that a drain
    /// is seen at once: it is the drain's first step, and claims are refused
    /// right after it, so a report from before the drain must not outlive it.
    pub async fn report(&self) -> ReadinessReport {
        let draining = self.journal.is_draining();
        let still_good = |report: &ReadinessReport| report.says_draining() == draining;
        self.cached.get(CACHE_FOR, still_good, || self.report_now()).await
    }

    /// The store probe, bounded by [`PROBE_TIMEOUT`]; while one that timed
    /// out has still not answered, no other is started.
    async fn probe_store(&self) -> Result<(), String> {
        let mut probe = {
            let mut probing = self.probing.lock().unwrap_or_else(PoisonError::into_inner);
            if probing.as_ref().is_some_and(|probe| !probe.is_finished()) {
                return Err(format!(
                    "the store probe has not answered for more than {} s",
                    PROBE_TIMEOUT.as_secs()
                ));
            }
            let journal = self.journal.clone();
            let probe = tokio::spawn(async move {
                journal.log_store().probe().await.map_err(|e| e.to_string())
            });
            *probing = Some(probe.abort_handle());
            probe
        };
        match tokio::time::timeout(PROBE_TIMEOUT, &mut probe).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(stopped)) => Err(format!("the store probe stopped: {stopped}")),
            Err(_) => {
                Err(format!("the store probe did not answer within {} s", PROBE_TIMEOUT.as_secs()))
            }
        }
    }

    /// The report made now, whatever is cached (and not cached).
    pub async fn report_now(&self) -> ReadinessReport {
        let mut checks = Vec::new();
        let probe = if self.journal.probe_fault() {
            Err("injected probe fault".to_string())
        } else {
            self.probe_store().await
        };
        if let Err(why) = &probe {
            tracing::warn!(event = "probe.fail", error = %why, "store probe failed");
        }
        checks.push(("store".to_string(), probe));
        let metrics = self.journal.raft().metrics().borrow().clone();
        let view = self.leader_view(metrics.current_leader, metrics.millis_since_quorum_ack);
        let since_seen = match self.leader_seen.lock() {
            Ok(seen) => seen.map(|at| millis(at.elapsed())),
            Err(_) => None,
        };
        checks.push(("leader".to_string(), leader_check(&view, since_seen)));
        let last_log = metrics.last_log_index.unwrap_or(0);
        let applied = metrics.last_applied.map(|l| l.index).unwrap_or(0);
        let voter = metrics.membership_config.membership().voter_ids().any(|id| id == view.me);
        checks.push((
            "applied".to_string(),
            applied_check(voter, applied, last_log, self.journal.leader_commit_seen()),
        ));
        // Judged against the other voters' clocks, never against cluster
        // time: a wrong clock elsewhere (which may have pushed cluster time
        // ahead) must not take this node out of service, and this node's
        // own wrong clock shows against the majority (see docs/safety.md).
        let verdict = self.journal.clock_verdict();
        let bound_ms = self.journal.clock_watch().bound_ms();
        checks.push((
            "clock".to_string(),
            if verdict.is_skewed() {
                Err(crate::clock_watch::describe(&verdict, bound_ms))
            } else {
                Ok(())
            },
        ));
        checks.push((
            "draining".to_string(),
            if self.journal.is_draining() { Err("node is draining".to_string()) } else { Ok(()) },
        ));
        let ready = checks.iter().all(|(_, outcome)| outcome.is_ok());
        ReadinessReport { ready, checks }
    }

    /// This node's view of its leader, from its Raft metrics.
    fn leader_view(&self, leader: Option<u64>, millis_since_quorum_ack: Option<u64>) -> LeaderView {
        LeaderView {
            me: self.journal.node_id(),
            leader,
            millis_since_quorum_ack,
            // A leader cut off from its quorum still names itself leader
            // (openraft does not step down on its own), so a leader must also
            // have heard from a quorum lately: past two election timeouts its
            // followers have elected, or are electing, someone else, and it
            // can commit nothing.
            bound_ms: 2 * self.journal.raft().config().election_timeout_max,
            // An election normally ends within one round trip, and a split
            // vote within one more timeout. The grace is counted from the
            // last moment a leader was named, which openraft's metrics keep
            // until a follower's timer fires (leader lease plus timeout
            // after the last heartbeat), so a cut-off follower turns unready
            // at most about three election timeouts after it last heard
            // from its leader.
            election_grace_ms: self.journal.raft().config().election_timeout_max,
        }
    }

    /// Notes now as a moment this node knew a leader, when it does.
    fn look_for_leader(&self) {
        let view = {
            let metrics = self.journal.raft().metrics();
            let metrics = metrics.borrow();
            self.leader_view(metrics.current_leader, metrics.millis_since_quorum_ack)
        };
        if leader_check(&view, None).is_ok()
            && let Ok(mut seen) = self.leader_seen.lock()
        {
            *seen = Some(Instant::now());
        }
    }
}

/// What a node knows of its leader, for the `leader` check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderView {
    /// This node.
    pub me: u64,
    /// The leader its Raft metrics name, if any.
    pub leader: Option<u64>,
    /// When it leads: how long ago a quorum last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
    /// How long a leader may go without a quorum's acknowledgement before
    /// it is unready: two election timeouts.
    pub bound_ms: u64,
    /// How long after it last knew a leader a node in an election (naming
    /// none, or just elected with no answer yet) stays ready: one election
    /// timeout.
    pub election_grace_ms: u64,
}

/// The `leader` check: a follower that names a leader passes; a leader
/// passes while a quorum acknowledged it within the bound. A node that names
/// none (an election is running), or leads but has had no answer yet (just
/// elected), passes while it last knew a leader within the election grace
/// (`millis_since_seen`, from [`track_leader`]), so a routine change of
/// leader does not take every node out of service at once, and fails once
/// the election has run longer than that.
pub fn leader_check(view: &LeaderView, millis_since_seen: Option<u64>) -> Result<(), String> {
    match view.leader {
        None => match millis_since_seen {
            Some(ms) if ms <= view.election_grace_ms => Ok(()),
            Some(ms) => Err(format!("no leader known for {ms} ms")),
            None => Err("no leader known".to_string()),
        },
        Some(leader) if leader == view.me => {
            match (view.millis_since_quorum_ack, millis_since_seen) {
                (Some(ms), _) if ms <= view.bound_ms => Ok(()),
                (Some(ms), _) => {
                    Err(format!("this node leads but no quorum has acknowledged it for {ms} ms"))
                }
                // Just elected: no heartbeat answered yet. Its election is
                // the same change of leader as above.
                (None, Some(seen)) if seen <= view.election_grace_ms => Ok(()),
                (None, _) => Err("this node leads but no quorum has acknowledged it".to_string()),
            }
        }
        Some(_) => Ok(()),
    }
}

/// Whether a node has applied enough to serve: it is a voter (a learner is
/// still catching up as it joins, or was removed), and its applied index
/// is within [`MAX_APPLY_LAG`] of its own log and of the commit index its
/// leader last named (a follower back from a restart or a partition holds
/// a short log until the leader's appends reach it, and its own log alone
/// would call it caught up).
fn applied_check(
    voter: bool,
    applied: u64,
    last_log: u64,
    leader_commit: u64,
) -> Result<(), String> {
    if !voter {
        return Err("not a voter: a learner still catching up as it joins, or removed".into());
    }
    if last_log.saturating_sub(applied) > MAX_APPLY_LAG {
        return Err(format!("applied {applied} trails log {last_log}"));
    }
    if leader_commit.saturating_sub(applied) > MAX_APPLY_LAG {
        return Err(format!("applied {applied} trails the leader's commit {leader_commit}"));
    }
    Ok(())
}

/// Looks every [`LEADER_LOOK_EVERY`] whether `readiness`'s node knows a
/// leader, and notes when it last did, for [`leader_check`]; until
/// `shutdown`. (On a timer, not on openraft's metrics channel: that one is
/// republished many times per write.)
pub async fn track_leader(readiness: Readiness, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(LEADER_LOOK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        readiness.look_for_leader();
    }
}

fn millis(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(leader: Option<u64>, quorum_ack: Option<u64>) -> LeaderView {
        LeaderView {
            me: 1,
            leader,
            millis_since_quorum_ack: quorum_ack,
            bound_ms: 1_200,
            election_grace_ms: 600,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_at_once_share_one_making_of_the_value() {
        let cached = Arc::new(Cached::new());
        let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let callers: Vec<_> = (0..50)
            .map(|_| {
                let (cached, made) = (cached.clone(), made.clone());
                tokio::spawn(async move {
                    let make = || async {
                        let n = made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        n
                    };
                    cached.get(Duration::from_secs(60), |_: &usize| true, make).await
                })
            })
            .collect();
        for caller in callers {
            assert_eq!(caller.await.ok(), Some(0), "every caller got the one value made");
        }
        assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 1, "made more than once");
    }

    #[tokio::test]
    async fn a_stale_or_refused_value_is_made_again() {
        let cached = Cached::new();
        let first = cached.get(Duration::ZERO, |_: &u32| true, || async { 1 }).await;
        let stale = cached.get(Duration::ZERO, |_: &u32| true, || async { 2 }).await;
        assert_eq!((first, stale), (1, 2), "a value past its freshness is made again");
        let kept = cached.get(Duration::from_secs(60), |_: &u32| true, || async { 3 }).await;
        assert_eq!(kept, 2, "a fresh value is reused");
        let refused = cached.get(Duration::from_secs(60), |v: &u32| *v != 2, || async { 4 }).await;
        assert_eq!(refused, 4, "a value the caller refuses is made again");
    }

    #[test]
    fn a_node_is_caught_up_against_its_leaders_commit_not_only_its_own_log() {
        assert_eq!(applied_check(true, 5_000, 5_000, 5_000), Ok(()));
        // Back from a restart: its own log is short, the leader named more.
        let behind = applied_check(true, 100, 100, 20_000);
        assert!(behind.as_ref().is_err_and(|e| e.contains("leader's commit 20000")), "{behind:?}");
        // Within the lag allowed, either way.
        assert_eq!(applied_check(true, 19_500, 19_600, 20_000), Ok(()));
        let own = applied_check(true, 100, 5_000, 0);
        assert!(own.as_ref().is_err_and(|e| e.contains("trails log 5000")), "{own:?}");
        // A learner (joining) or a removed node serves nothing yet.
        let learner = applied_check(false, 5_000, 5_000, 5_000);
        assert!(learner.as_ref().is_err_and(|e| e.contains("not a voter")), "{learner:?}");
    }

    #[test]
    fn a_follower_naming_a_leader_is_ready() {
        assert_eq!(leader_check(&view(Some(2), None), None), Ok(()));
    }

    #[test]
    fn a_leader_is_ready_only_while_a_quorum_acknowledged_it_lately() {
        assert_eq!(leader_check(&view(Some(1), Some(1_200)), None), Ok(()));
        let stale = leader_check(&view(Some(1), Some(1_201)), Some(0));
        assert!(stale.as_ref().is_err_and(|why| why.contains("1201 ms")), "{stale:?}");
        assert!(leader_check(&view(Some(1), None), None).is_err());
    }

    #[test]
    fn a_leader_just_elected_is_ready_while_a_leader_was_known_within_the_grace() {
        assert_eq!(leader_check(&view(Some(1), None), Some(600)), Ok(()));
        assert!(leader_check(&view(Some(1), None), Some(601)).is_err());
        // An answer past the bound is not excused by an earlier leader.
        assert!(leader_check(&view(Some(1), Some(1_201)), Some(0)).is_err());
    }

    #[test]
    fn an_election_is_ready_while_a_leader_was_known_within_the_grace() {
        assert_eq!(leader_check(&view(None, None), Some(0)), Ok(()));
        assert_eq!(leader_check(&view(None, None), Some(600)), Ok(()));
        let long = leader_check(&view(None, None), Some(601));
        assert!(long.as_ref().is_err_and(|why| why.contains("for 601 ms")), "{long:?}");
        let never = leader_check(&view(None, None), None);
        assert_eq!(never, Err("no leader known".to_string()));
    }
}
