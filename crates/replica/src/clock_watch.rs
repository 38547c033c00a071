//! The node's measured clock offsets to its peers, and what follows from
//! them: the verdict on this node's clock (`leasehold_core::clock_bound`),
//! and acting on it — a skewed node does not stand for election, a skewed
//! leader stops its heartbeats so the others elect, and nothing but an
//! agreed leader stamps time (the journal asks [`ClockWatch::verdict`]).
//!
//! Measurements ride on the adverts every node sends every peer each
//! second: the sender notes its wall clock and monotonic clock when it
//! sends, the peer answers with its wall clock, and the offset is the
//! peer's clock minus this node's at the midpoint of the round trip, give
//! or take half of it. An offset is corrected for how far this node's
//! wall clock has moved from its monotonic one since (a step of this
//! node's clock shows at once, before the next advert), and counts only
//! while it is fresh.
//!
//! The monotonic clock is the runtime's ([`tokio::time::Instant`]): on a
//! node it is the system's monotonic clock, and in a simulation or a test
//! whose runtime's time is paused it is the time that runtime is driven
//! by, so measurements age with the time the node lives in. A
//! measurement's instants must come from the runtime that asks for the
//! verdict (the gate's adverts and the journal share the node's runtime).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::clock_bound::{ClockVerdict, PeerOffset, judge_clock, sustain_skew};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::clock::Clock;

/// One measurement of a peer's clock.
#[derive(Clone, Copy, Debug)]
struct Measurement {
    /// The peer's clock minus this node's at `wall_ms`.
    offset_ms: i64,
    /// Half the round trip.
    uncertainty_ms: u64,
    /// This node's wall clock at the midpoint of the round trip.
    wall_ms: u64,
    /// This node's monotonic clock at the same moment.
    at: Instant,
}

/// Measured offsets to peers, shared by the gate (which measures) and the
/// journal and node (which ask).
#[derive(Clone)]
pub struct ClockWatch {
    measurements: Arc<Mutex<BTreeMap<u64, Measurement>>>,
    /// The latest skewed verdict, until an agreed one comes after it: a
    /// skewed node stays skewed until a majority agrees with it again
    /// (`leasehold_core::clock_bound::sustain_skew`).
    last_skew: Arc<Mutex<Option<ClockVerdict>>>,
    bound_ms: u64,
    fresh_for: Duration,
    /// Woken at each measurement, for a leader waiting to stamp.
    measured: Arc<Notify>,
}

impl ClockWatch {
    /// A watch enforcing `bound_ms` (`max_clock_offset_ms`), counting a
    /// measurement for `fresh_for` after it was made.
    pub fn new(bound_ms: u64, fresh_for: Duration) -> ClockWatch {
        ClockWatch {
            measurements: Arc::default(),
            last_skew: Arc::default(),
            bound_ms,
            fresh_for,
            measured: Arc::default(),
        }
    }

    /// The bound enforced.
    pub fn bound_ms(&self) -> u64 {
        self.bound_ms
    }

    /// Records one round trip to `peer`: sent when this node's clocks read
    /// `sent_wall_ms` and `sent_at`, answered at `answered_at` with the
    /// peer's clock `peer_now_ms`.
    pub fn record(
        &self,
        peer: u64,
        sent_wall_ms: u64,
        sent_at: Instant,
        answered_at: Instant,
        peer_now_ms: u64,
    ) {
        let round_trip = answered_at.saturating_duration_since(sent_at);
        let half = round_trip / 2;
        let half_ms = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
        let wall_ms = sent_wall_ms.saturating_add(half_ms);
        let offset_ms = signed(peer_now_ms).saturating_sub(signed(wall_ms));
        // A millisecond for the clocks' own resolution.
        let uncertainty_ms = half_ms.saturating_add(1);
        let measurement = Measurement { offset_ms, uncertainty_ms, wall_ms, at: sent_at + half };
        if let Ok(mut measurements) = self.measurements.lock() {
            measurements.insert(peer, measurement);
        }
        self.measured.notify_waiters();
    }

    /// Completes at the next measurement [`ClockWatch::record`] takes after
    /// this call (the future is registered at once, so a measurement made
    /// between this call and the first poll is not missed).
    pub fn next_measurement(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        let mut notified = Box::pin(self.measured.notified());
        notified.as_mut().enable();
        notified
    }

    /// The fresh offsets, corrected to now by how far `clock` has moved
    /// from the monotonic clock since each was measured.
    pub fn offsets(&self, clock: &Clock) -> Vec<PeerOffset> {
        let paired = read_paired(clock);
        let (now, now_wall_ms, slack_ms) = (paired.at, signed(paired.wall_ms), paired.slack_ms());
        let Ok(measurements) = self.measurements.lock() else { return Vec::new() };
        measurements
            .iter()
            .filter(|(_, m)| now.saturating_duration_since(m.at) < self.fresh_for)
            .map(|(peer, m)| {
                let elapsed_ms = signed_duration(now.saturating_duration_since(m.at));
                let wall_moved_ms = now_wall_ms.saturating_sub(signed(m.wall_ms));
                let drift_ms = wall_moved_ms.saturating_sub(elapsed_ms);
                PeerOffset {
                    node: *peer,
                    offset_ms: m.offset_ms.saturating_sub(drift_ms),
                    uncertainty_ms: m.uncertainty_ms.saturating_add(slack_ms),
                }
            })
            .collect()
    }

    /// The verdict on node `me`'s clock among `voters`, now; skewed while
    /// the last decisive verdict was, until a majority agrees again.
    pub fn verdict(&self, me: u64, voters: &[u64], clock: &Clock) -> ClockVerdict {
        let judged = judge_clock(me, voters, &self.offsets(clock), self.bound_ms);
        let Ok(mut last_skew) = self.last_skew.lock() else { return judged };
        let verdict = sustain_skew(judged, last_skew.as_ref());
        match &verdict {
            ClockVerdict::Agreed { .. } => *last_skew = None,
            ClockVerdict::Skewed { .. } => *last_skew = Some(verdict.clone()),
            ClockVerdict::Unknown { .. } => {}
        }
        verdict
    }

    /// How old each peer's last measurement is, for status.
    pub fn ages(&self) -> BTreeMap<u64, Duration> {
        let now = Instant::now();
        self.measurements
            .lock()
            .map(|m| {
                m.iter().map(|(peer, m)| (*peer, now.saturating_duration_since(m.at))).collect()
            })
            .unwrap_or_default()
    }
}

/// This node's monotonic and wall clocks read together: the wall reading
/// was taken between two monotonic readings `spread` apart, and `at` is
/// their midpoint. Read one after the other, a thread stalled between the
/// two reads (a loaded host) would pair a wall time with a monotonic time
/// that far apart, and every offset corrected to now by the pair
/// ([`ClockWatch::offsets`]) would be off by the stall: a correct node
/// could judge itself skewed. (A measurement's own send time needs no
/// pairing: its wall reading cancels out of the corrected offset, which
/// is the peer's clock minus this node's wall clock now, plus the
/// monotonic time since the round trip's midpoint.)
#[derive(Clone, Copy, Debug)]
struct Paired {
    /// The monotonic clock, at the midpoint of the reading.
    at: Instant,
    /// The wall clock.
    wall_ms: u64,
    /// How far apart the two monotonic readings were.
    spread: Duration,
}

impl Paired {
    /// How far the wall reading may lie from `at`: half the spread, in
    /// whole milliseconds rounded up.
    fn slack_ms(&self) -> u64 {
        u64::try_from(self.spread.as_micros().div_ceil(2_000)).unwrap_or(u64::MAX)
    }
}

/// A pairing whose two monotonic readings are at most this far apart is
/// taken at once.
const PAIRED_WITHIN: Duration = Duration::from_millis(2);

/// Readings tried before the tightest is taken.
const PAIRING_TRIES: usize = 3;

/// Reads `clock` and the monotonic clock together (see [`Paired`]): again
/// when the two monotonic readings lie more than 2 ms apart, up to three
/// times in all, keeping the tightest pairing, whose spread the caller
/// counts as uncertainty.
fn read_paired(clock: &Clock) -> Paired {
    let read = || {
        let before = Instant::now();
        let wall_ms = clock.now_ms();
        let spread = Instant::now().saturating_duration_since(before);
        Paired { at: before + spread / 2, wall_ms, spread }
    };
    let mut tightest = read();
    for _ in 1..PAIRING_TRIES {
        if tightest.spread <= PAIRED_WITHIN {
            break;
        }
        let again = read();
        if again.spread < tightest.spread {
            tightest = again;
        }
    }
    tightest
}

fn signed(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn signed_duration(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// How often [`guard_elections`] looks at the verdict.
const GUARD_EVERY: Duration = Duration::from_millis(250);

/// How long a skewed leader waits after one hand-over before the next,
/// while it still leads.
const HAND_OVER_EVERY: Duration = Duration::from_secs(1);

/// How long a leader whose clock no majority has measured (neither agreed
/// nor skewed) goes on leading before it hands over: it may not stamp, so
/// it refuses every write meanwhile. Long enough that a gap of a few
/// adverts (one is sent every second, and a measurement counts for five)
/// does not move leadership, and each hand-over costs an election.
pub const UNMEASURED_HAND_OVER_AFTER: Duration = Duration::from_secs(10);

/// Keeps a node whose clock is skewed out of leadership until `shutdown`:
/// it does not stand for election, and if it leads it stops sending
/// heartbeats and hands over. openraft 0.9 has no step-down, and left to
/// their own timers the others would elect only after their leader lease
/// and an election timeout, later still when their votes split. So the
/// skewed leader asks the most caught-up voter to campaign at once
/// (`Journal::hand_over`) and grants it its vote: the higher term deposes
/// it in a vote round. A leader refuses votes for its own lease (the
/// longest election timeout) after it was elected, so one elected less
/// than that ago asks once the lease has run out (as the guard saw it
/// elected: a tick late at most, never early). While it still leads it
/// asks again `HAND_OVER_EVERY` after the last try ended, another voter
/// if the last one failed. It stamps nothing meanwhile (the journal refuses).
/// When the clock is back within the bound, both come back on by
/// themselves (unless the node drains, which keeps it from standing).
///
/// A leader whose clock no majority has measured (an unknown verdict: its
/// adverts' round trips fail, or its offset sits at the bound within their
/// uncertainty) is not wrong, but it may not stamp either, so it refuses
/// every write. After [`UNMEASURED_HAND_OVER_AFTER`] of that it hands over
/// the same way, keeping its heartbeats and its right to stand: a voter
/// that can stamp then leads. If none can, leadership moves on each time
/// the wait runs out, which costs an election each time and no writes
/// (there were none).
pub async fn guard_elections(
    journal: crate::Journal,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(GUARD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A leader's lease is openraft's: its longest election timeout.
    let lease = Duration::from_millis(journal.raft().config().election_timeout_max);
    let mut skewed = false;
    let mut hand_overs = HandOvers::default();
    // The term this node leads in and when the guard first saw it lead.
    let mut leading_since: Option<(u64, Instant)> = None;
    // Since when this node has led with a clock it may not stamp by.
    let mut unmeasured_since: Option<Instant> = None;
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let verdict = journal.clock_verdict();
        let now_skewed = verdict.is_skewed();
        if now_skewed != skewed {
            let why = describe(&verdict, journal.clock_watch().bound_ms());
            if now_skewed {
                tracing::warn!(event = "clock.skew", %why, "standing aside from leadership");
            } else {
                tracing::info!(event = "clock.skew", %why, "clock back within the bound");
            }
            skewed = now_skewed;
        }
        let runtime = journal.raft().runtime_config();
        runtime.elect(!skewed && !journal.is_draining());
        runtime.heartbeat(!skewed);
        let (leads, term) = {
            let metrics = journal.raft().metrics();
            let metrics = metrics.borrow();
            (metrics.state == openraft::ServerState::Leader, metrics.current_term)
        };
        leading_since = match leading_since {
            Some((led, since)) if leads && led == term => Some((led, since)),
            _ if leads => Some((term, Instant::now())),
            _ => None,
        };
        let lease_over = leading_since.is_none_or(|(_, since)| since.elapsed() > lease);
        let unmeasured = leads && !skewed && !verdict.may_stamp();
        unmeasured_since = match unmeasured_since {
            Some(since) if unmeasured => Some(since),
            _ if unmeasured => Some(Instant::now()),
            _ => None,
        };
        let unmeasured_too_long =
            unmeasured_since.is_some_and(|since| since.elapsed() >= UNMEASURED_HAND_OVER_AFTER);
        if (skewed || unmeasured_too_long) && leads && lease_over {
            if !skewed && !hand_overs.is_under_way() {
                tracing::warn!(
                    event = "clock.unmeasured",
                    why = %describe(&verdict, journal.clock_watch().bound_ms()),
                    "this leader's clock has not been measured by a majority for {} s, so it \
                     stamps nothing: asking another voter to lead",
                    UNMEASURED_HAND_OVER_AFTER.as_secs()
                );
            }
            hand_overs.start_if_due(&journal);
        } else if !((skewed || unmeasured) && leads) {
            // Stood aside, or right again: the next skew starts afresh.
            hand_overs = HandOvers::default();
        }
    }
}

/// A skewed leader's hand-overs: the one under way (aborted when this is
/// dropped), and how the last one ended.
#[derive(Default)]
struct HandOvers {
    task: Option<tokio::task::JoinHandle<()>>,
    /// How the last try ended.
    last: Arc<Mutex<Option<Ended>>>,
}

/// When a hand-over ended and, if it failed, the voter it asked.
type Ended = (Instant, Option<u64>);

impl HandOvers {
    /// Whether a hand-over is under way or ended less than
    /// `HAND_OVER_EVERY` ago (so none starts now).
    fn is_under_way(&self) -> bool {
        if self.task.as_ref().is_some_and(|task| !task.is_finished()) {
            return true;
        }
        let last = self.last.lock().map(|last| *last).unwrap_or_default();
        last.is_some_and(|(ended, _)| ended.elapsed() < HAND_OVER_EVERY)
    }

    /// Starts a hand-over unless one is under way or the last ended less
    /// than `HAND_OVER_EVERY` ago.
    fn start_if_due(&mut self, journal: &crate::Journal) {
        if self.is_under_way() {
            return;
        }
        let last = self.last.lock().map(|last| *last).unwrap_or_default();
        let avoid = last.and_then(|(_, failed)| failed);
        let (journal, record) = (journal.clone(), self.last.clone());
        self.task = Some(tokio::spawn(async move {
            let failed = hand_over(&journal, avoid).await;
            if let Ok(mut last) = record.lock() {
                *last = Some((Instant::now(), failed));
            }
        }));
    }
}

impl Drop for HandOvers {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// One hand-over by a skewed leader, logged; answers the voter asked if
/// it failed.
async fn hand_over(journal: &crate::Journal, avoid: Option<u64>) -> Option<u64> {
    match journal.hand_over(crate::journal::HAND_OVER_CATCH_UP, avoid).await {
        Some((successor, Ok(()))) => {
            tracing::info!(
                event = "clock.skew",
                successor,
                "asked the most caught-up voter to take over leadership"
            );
            None
        }
        Some((successor, Err(error))) => {
            tracing::warn!(
                event = "clock.skew",
                successor,
                %error,
                "handing over failed; asking another voter next"
            );
            Some(successor)
        }
        None => None,
    }
}

/// A plain words account of a verdict, for readiness and status.
pub fn describe(verdict: &ClockVerdict, bound_ms: u64) -> String {
    match verdict {
        ClockVerdict::Agreed { agreeing, voters } => {
            format!("within {bound_ms} ms of {agreeing} of {voters} voters")
        }
        ClockVerdict::Skewed { disagreeing, voters } => {
            let peers: Vec<String> = disagreeing
                .iter()
                .map(|(peer, offset)| format!("node {peer} reads {offset:+} ms"))
                .collect();
            format!(
                "this node's clock is more than {bound_ms} ms off {} of {voters} voters ({})",
                disagreeing.len(),
                peers.join(", ")
            )
        }
        ClockVerdict::Unknown { agreeing, disagreeing, voters } => format!(
            "not measured against a majority yet ({agreeing} of {voters} voters within \
             {bound_ms} ms, {disagreeing} beyond)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_is_measured_at_the_midpoint_and_follows_a_step_of_this_clock() {
        let clock = Clock::system();
        let watch = ClockWatch::new(500, Duration::from_secs(5));
        let sent_at = Instant::now();
        let sent_wall_ms = clock.now_ms();
        // The peer answers 100 ms later with a clock two minutes ahead.
        let answered_at = sent_at + Duration::from_millis(100);
        watch.record(2, sent_wall_ms, sent_at, answered_at, sent_wall_ms + 50 + 120_000);
        watch.record(3, sent_wall_ms, sent_at, answered_at, sent_wall_ms + 50);
        let offsets = watch.offsets(&clock);
        let two = offsets.iter().find(|o| o.node == 2).map(|o| o.offset_ms).unwrap_or_default();
        assert!((119_900..=120_100).contains(&two), "{offsets:?}");
        // Half the round trip and a millisecond of resolution, plus the
        // spread of this read's clock pairing, which a busy machine (a
        // preemption between its two readings) can stretch past 0 ms.
        assert!(offsets.iter().all(|o| (51..101).contains(&o.uncertainty_ms)), "{offsets:?}");
        assert!(watch.verdict(1, &[1, 2, 3], &clock).may_stamp(), "node 3 agrees");
        // This node's clock steps two minutes ahead: node 2 now agrees and
        // node 3 reads two minutes behind, before any new measurement.
        clock.set_offset_ms(120_000);
        let offsets = watch.offsets(&clock);
        let three = offsets.iter().find(|o| o.node == 3).map(|o| o.offset_ms).unwrap_or_default();
        assert!((-120_100..=-119_900).contains(&three), "{offsets:?}");
        let two = offsets.iter().find(|o| o.node == 2).map(|o| o.offset_ms).unwrap_or_default();
        assert!(two.abs() < 200, "{offsets:?}");
    }

    #[test]
    fn a_skewed_node_stays_aside_when_a_peer_goes_quiet_until_a_majority_agrees() {
        let clock = Clock::system();
        let watch = ClockWatch::new(500, Duration::from_millis(200));
        let record = |peer: u64, offset_ms: u64| {
            let sent_at = Instant::now();
            let wall_ms = clock.now_ms();
            watch.record(peer, wall_ms, sent_at, sent_at, wall_ms.saturating_sub(offset_ms));
        };
        // This node (3) reads two minutes ahead of both peers.
        record(1, 120_000);
        record(2, 120_000);
        assert!(watch.verdict(3, &[1, 2, 3], &clock).is_skewed());
        // Node 1 goes quiet: its measurement lapses, node 2's is renewed.
        std::thread::sleep(Duration::from_millis(250));
        record(2, 120_000);
        assert_eq!(watch.offsets(&clock).len(), 1);
        assert!(watch.verdict(3, &[1, 2, 3], &clock).is_skewed(), "still the odd one out");
        // Put right, and agreed by both: no longer skewed; then both go
        // quiet, and an unknown verdict is no reason to stand aside.
        record(1, 0);
        record(2, 0);
        assert!(watch.verdict(3, &[1, 2, 3], &clock).may_stamp());
        std::thread::sleep(Duration::from_millis(250));
        let quiet = watch.verdict(3, &[1, 2, 3], &clock);
        assert!(!quiet.is_skewed() && !quiet.may_stamp(), "{quiet:?}");
    }

    #[test]
    fn a_stall_between_reading_the_two_clocks_does_not_move_the_offsets() {
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::time::{SystemTime, UNIX_EPOCH};
        // The system clock, but each of the next `stalls` reads takes
        // 400 ms first, as a thread descheduled on a loaded host would.
        let stalls = Arc::new(AtomicU32::new(0));
        let source = {
            let stalls = stalls.clone();
            Arc::new(move || {
                let stalled = stalls
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1));
                if stalled.is_ok() {
                    std::thread::sleep(Duration::from_millis(400));
                }
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                    .unwrap_or(0)
            })
        };
        let clock = Clock::from_source(source);
        let watch = ClockWatch::new(500, Duration::from_secs(5));
        for peer in [2, 3] {
            let (sent_at, sent_wall_ms) = (Instant::now(), clock.now_ms());
            watch.record(peer, sent_wall_ms, sent_at, sent_at, clock.now_ms());
        }
        assert!(watch.verdict(1, &[1, 2, 3], &clock).may_stamp());
        // One stalled read: read again, and the offsets do not move.
        stalls.store(1, Ordering::SeqCst);
        let offsets = watch.offsets(&clock);
        assert_eq!(stalls.load(Ordering::SeqCst), 0, "the stalled read was not taken");
        assert!(offsets.iter().all(|o| o.offset_ms.abs() < 100), "{offsets:?}");
        stalls.store(1, Ordering::SeqCst);
        let verdict = watch.verdict(1, &[1, 2, 3], &clock);
        assert!(verdict.may_stamp(), "a stall judged this node's clock: {verdict:?}");
        // Every try stalled: the spread widens the uncertainty, so the
        // true offset (none) stays within it and the node is not judged
        // skewed.
        stalls.store(3, Ordering::SeqCst);
        let offsets = watch.offsets(&clock);
        assert_eq!(stalls.load(Ordering::SeqCst), 0, "not every try was taken");
        assert!(
            offsets.iter().all(|o| o.uncertainty_ms >= 200 && o.offset_ms.abs() <= 250),
            "{offsets:?}"
        );
        stalls.store(3, Ordering::SeqCst);
        let verdict = watch.verdict(1, &[1, 2, 3], &clock);
        assert!(!verdict.is_skewed(), "{verdict:?}");
    }

    #[test]
    fn stale_measurements_do_not_count() {
        let clock = Clock::system();
        let watch = ClockWatch::new(500, Duration::from_millis(1));
        let sent_at = Instant::now();
        watch.record(2, clock.now_ms(), sent_at, sent_at, clock.now_ms());
        std::thread::sleep(Duration::from_millis(5));
        assert!(watch.offsets(&clock).is_empty());
        assert!(!watch.verdict(1, &[1, 2], &clock).may_stamp());
    }
}
