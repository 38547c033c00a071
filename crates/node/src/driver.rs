//! The driver: runs at its own pace. While this node leads it proposes
//! housekeeping (Sweep returns lapsed leases to ready; Purge drops
//! tombstones past retention; both idempotent, so a stale or duplicated
//! proposal from a deposed leader is harmless). On every node it runs the
//! cron tickers, and each due tick of a schedule with a command goes
//! through the cutover gate once (a schedule that enqueues a queue job has
//! the journal alone: `journal_only`):
//!
//! - **journal**: the leader proposes `Fire`/`Skip` (exactly once per tick
//!   through the journal's `last_fired_bucket`); the other nodes do nothing;
//! - **bus**: every node claims `(schedule, bucket)` on the bus and the
//!   winner records the tick in the journal (`Skip{reason: Bus}`) and runs
//!   the schedule's command itself only if the journal took that record
//!   ([`crate::bus_tick`]): nodes whose views of their peers differ may
//!   decide different paths for one tick, and the journal's bucket guard
//!   admits one of them.
//!
//! When the pool comes back from the bus to the journal, the leader first
//! records the ticks the bus ran as skipped (`SkipReason::Bus`), so the
//! journal's catch-up never runs them again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::claim_path::ClaimPath;
use leasehold_core::clock_bound::ClockVerdict;
use leasehold_core::cron::{self, CronSchedule};
use leasehold_core::schedule::{
    Schedule, ScheduleSpec, SkipReason, Target, TickOutcome, TickPlan, plan_ticks, planned_tick,
};
use leasehold_core::{Command, Response};
use leasehold_replica::metrics::TickLabels;
use leasehold_replica::{Gate, Journal};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::bus_tick::{BusRunner, run_bus_tick, run_each_share};
use crate::commands::RunCommand;

/// How often the leader looks for due ticks (the fire lag of a healthy
/// cluster is about half of this plus one commit).
pub const TICK_INTERVAL: Duration = Duration::from_millis(25);
/// A tick younger than this counts as current; older ones are missed and
/// follow the catch-up policy.
pub const TICK_TOLERANCE_MS: u64 = 5_000;

/// Most ticks read to find the newest due one before narrowing the span.
const MAX_TICKS_READ: usize = 1_000;

/// Settings of the driver.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// How often to check for lapsed leases.
    pub sweep_interval: Duration,
    /// How often to check for tombstones past retention.
    pub purge_interval: Duration,
    /// Whether this node runs commands (the built-in executor is on): only
    /// then does it take bus claims.
    pub run_commands: bool,
    /// The queues the executor serves: a bus tick runs here only if its
    /// job's queue is one of them, as the journal's job would.
    pub queues: Vec<String>,
    /// The tags the executor claims with (the node's and `node:ID`): a bus
    /// tick runs here only if its job's tags are among them, as the
    /// journal's job would.
    pub tags: Vec<String>,
    /// How long a bus-run command may take.
    pub command_timeout: Duration,
    /// How long running bus commands may finish when the driver stops.
    pub grace: Duration,
    /// What runs a bus tick's command ([`crate::commands::Shell`] on a node).
    pub commands: Arc<dyn RunCommand>,
}

/// The tickers' memory between rounds.
#[derive(Default)]
pub struct Ticker {
    parsed: HashMap<(String, String), Option<CronSchedule>>,
    /// Newest bucket of each schedule this node handled on the bus.
    bus_done: HashMap<String, u64>,
    /// Newest bucket of each schedule this node refused on the bus
    /// (warming up, too late, not its queue): it ran nowhere here,
    /// and a leader back on the journal fires it by its catch-up policy.
    bus_refused: HashMap<String, u64>,
    /// Newest bucket of each schedule a follower decided for the journal
    /// (nothing to do there; remembered so it is decided once).
    journal_seen: HashMap<String, u64>,
    /// Newest bucket of each `target = each` schedule whose share this
    /// node took on: by its own bus claim, or by watching for the leader's
    /// bus record. One or the other, once, so a share runs at most once here.
    each_shares: HashMap<String, u64>,
    /// The put instant of each `target = each` schedule as this node has
    /// seen it so far; a schedule seen as `each` for the first time (new,
    /// turned from `any`, or at start) is missing or differs.
    each_seen: HashMap<String, u64>,
    /// This node's clock when the driver first ran: shares of ticks before
    /// it are not taken from the journal's records.
    started_ms: Option<u64>,
    running: JoinSet<()>,
    /// The journal fires under way (a plan's ticks, proposed in order),
    /// and which schedule each is for: a schedule with one under way is
    /// not planned again until it ends, and the others, the sweeps and the
    /// purges do not wait for it (a catch-up of a thousand ticks is a
    /// thousand commits).
    fires: JoinSet<()>,
    firing: HashMap<String, tokio::task::AbortHandle>,
}

impl Ticker {
    /// Takes on this node's share of `schedule`'s `bucket`, if it has not.
    fn take_each_share(&mut self, schedule: &Schedule, bucket: u64) -> bool {
        if schedule.spec.target != Target::Each {
            return true;
        }
        let taken = self.each_shares.entry(schedule.spec.name.clone()).or_insert(0);
        if bucket <= *taken {
            return false;
        }
        *taken = bucket;
        true
    }
}

/// Runs until `shutdown` turns true; running bus commands then get the
/// grace period.
pub async fn run(
    journal: Journal,
    gate: Gate,
    config: DriverConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut sweep = tokio::time::interval(config.sweep_interval);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut purge = tokio::time::interval(config.purge_interval);
    purge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticker = tokio::time::interval(TICK_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut state = Ticker::default();
    loop {
        // Biased, so tokio's unseeded choice between branches ready at once
        // plays no part (a simulation replays the same order from its
        // seed). The ticks cannot starve one another: each interval, once
        // taken, is not ready again for its period, and the rare sweep and
        // purge come before the 25 ms ticker.
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            _ = sweep.tick() => sweep_once(&journal).await,
            _ = purge.tick() => purge_once(&journal).await,
            _ = ticker.tick() => tick_schedules(&journal, &gate, &config, &mut state).await,
        }
        if *shutdown.borrow() {
            break;
        }
        while state.running.try_join_next().is_some() {}
    }
    let running = std::mem::take(&mut state.running);
    if tokio::time::timeout(config.grace, running.join_all()).await.is_err() {
        tracing::warn!("bus commands did not finish within the grace period");
    }
}

/// Proposes a sweep when this node leads and some lease has lapsed by
/// cluster time, honouring earlier terms' leases the clock bound past their
/// expiry. Checking first keeps an idle cluster's log from growing.
pub async fn sweep_once(journal: &Journal) {
    if !journal.is_leader() {
        return;
    }
    let now_ms = journal.cluster_now_ms();
    let bound_ms = journal.clock_watch().bound_ms();
    let due =
        journal.read_stale(|state| state.next_expiry_ms(bound_ms).is_some_and(|at| at <= now_ms));
    if !due {
        return;
    }
    match journal.propose(Command::SweepBounded { max_clock_offset_ms: bound_ms }).await {
        Ok(Response::Swept { requeued, dead }) => {
            journal.metrics().sweeps.inc();
            journal.metrics().lease_expiries.inc_by((requeued.len() + dead.len()) as u64);
            tracing::info!(
                event = "sweep",
                requeued = requeued.len(),
                dead = dead.len(),
                "swept lapsed leases"
            );
            for job in requeued.iter().chain(dead.iter()) {
                tracing::info!(event = "lease.expire", job = *job, "lease lapsed");
            }
        }
        Ok(other) => {
            tracing::warn!(event = "sweep", response = ?other, "unexpected sweep response")
        }
        Err(error) => tracing::warn!(event = "sweep", %error, "sweep not committed"),
    }
}

async fn purge_once(journal: &Journal) {
    if !journal.is_leader() {
        return;
    }
    let now_ms = journal.cluster_now_ms();
    if !journal.read_stale(|state| state.has_purgeable(now_ms)) {
        return;
    }
    match journal.propose(Command::Purge).await {
        Ok(Response::Purged(count)) => tracing::info!(purged = count, "purged tombstones"),
        Ok(other) => tracing::warn!(response = ?other, "unexpected purge response"),
        Err(error) => tracing::warn!(%error, "purge not committed"),
    }
}

/// The newest tick of `cron` in `(after_ms, now_ms]`, if any.
fn newest_due(cron: &CronSchedule, after_ms: u64, now_ms: u64) -> Option<u64> {
    leasehold_core::schedule::newest_ticks(cron, after_ms, now_ms, 1, MAX_TICKS_READ)
        .1
        .last()
        .copied()
}

/// Runs the tickers once: finds every schedule with a due tick, decides its
/// claim path once (as of the tick's instant), and carries it out.
pub async fn tick_schedules(
    journal: &Journal,
    gate: &Gate,
    config: &DriverConfig,
    ticker: &mut Ticker,
) {
    while ticker.fires.try_join_next().is_some() {}
    ticker.firing.retain(|_, fire| !fire.is_finished());
    let leader = journal.is_leader();
    // The leader plans the journal's ticks by cluster time (what its Fire
    // will apply at); on the bus each node goes by its own clock.
    let now_ms = if leader { journal.cluster_now_ms() } else { journal.clock().now_ms() };
    // A leader on the journal plans from the journal's own records, not
    // from the ticks it last decided on the bus: a tick the bus refused
    // (warming up, too late, not its queue) ran nowhere and left no record,
    // and the schedule's catch-up policy decides it now.
    let journal_leader = leader && gate.decide_at(now_ms).path == ClaimPath::Journal;
    // Clone only the schedules with a tick due: this runs every 25 ms.
    let Ticker { parsed, bus_done, journal_seen, each_shares, each_seen, .. } = ticker;
    let due = journal.read_stale(|state| {
        each_seen.retain(|name, _| {
            state.schedules().get(name).is_some_and(|s| s.spec.target == Target::Each)
        });
        state
            .schedules()
            .values()
            .filter_map(|schedule| {
                see_each(schedule, each_seen, each_shares);
                let key = (schedule.spec.cron.clone(), schedule.spec.timezone.clone());
                let cron = parsed.entry(key).or_insert_with(|| {
                    // The proposer parsed it; a build whose parser or
                    // timezone data differs may not (a rolling upgrade).
                    // Such a leader leaves the schedule due for one that can.
                    cron::parse(&schedule.spec.cron, &schedule.spec.timezone)
                        .map_err(|error| {
                            tracing::warn!(
                                event = "cron.skip",
                                schedule = %schedule.spec.name,
                                reason = "unparseable_here",
                                %error,
                                "this build cannot parse the schedule; it is not planned here"
                            );
                        })
                        .ok()
                });
                // Never before the schedule was put (see `plan_ticks`).
                let mut after_ms = schedule.planned_after_ms();
                if !journal_leader
                    && !journal_only(schedule)
                    && let Some(done) = bus_done.get(&schedule.spec.name)
                {
                    after_ms = after_ms.max(cron::tick_ms(*done));
                }
                let newest_ms = newest_due(cron.as_ref()?, after_ms, now_ms)?;
                let seen = journal_seen.get(&schedule.spec.name).copied().unwrap_or(0);
                if !leader && cron::bucket_of(newest_ms) <= seen {
                    return None;
                }
                Some((schedule.clone(), newest_ms))
            })
            .collect::<Vec<_>>()
    });
    // The journal's fires of one round go out together: waiting for each
    // schedule's commit before proposing the next made the n-th schedule's
    // fire lag n commits long (about 16 ms each, 316 ms for the twentieth
    // of twenty on the benchmark). Concurrent proposals share a group
    // commit; each schedule still proposes its own ticks in order.
    for (schedule, newest_ms) in due {
        let name = schedule.spec.name.clone();
        if ticker.firing.contains_key(&name) {
            continue;
        }
        let bucket = cron::bucket_of(newest_ms);
        // A tick refused here on the bus went to the bus by its instant and
        // ran nowhere here; a leader now on the journal plans it by the
        // schedule's catch-up policy. (Had another node run it on the bus,
        // its record would be in the journal and the tick not due; one on
        // its way is ordered against the fire by the log.) Unless the bus
        // table holds a claim of it or a later tick: a node of an older
        // build may run a tick on the bus without a record in the journal,
        // so such a tick is left to the bus.
        let refused_here = ticker.bus_refused.get(&name).is_some_and(|refused| bucket <= *refused);
        let claimed_on_bus =
            || !matches!(gate.bus().high_water(&name, |claimed| claimed >= bucket), Ok(None));
        let take_on_journal =
            journal_only(&schedule) || (journal_leader && refused_here && !claimed_on_bus());
        // Any other tick decided on the bus already is done here (a journal
        // leader's plan does not skip them; see `journal_leader`).
        if !take_on_journal && ticker.bus_done.get(&name).is_some_and(|done| bucket <= *done) {
            continue;
        }
        // The one decision of this claim, reused for everything below.
        let path = if take_on_journal {
            ClaimPath::Journal
        } else {
            gate.decide_for_claim(&schedule.job_key(bucket, None), newest_ms).path
        };
        match path {
            ClaimPath::Journal if leader => {
                let cron_key = (schedule.spec.cron.clone(), schedule.spec.timezone.clone());
                let Some(Some(cron)) = ticker.parsed.get(&cron_key) else {
                    tracing::warn!(schedule = %name, "cron expression no longer parses");
                    continue;
                };
                let (journal, gate, cron) = (journal.clone(), gate.clone(), cron.clone());
                let fire = ticker.fires.spawn(async move {
                    // A proposal that did not commit ends this schedule's
                    // round; the next round plans again from the journal.
                    if skip_bus_ran(&journal, &gate, &schedule, &cron, bucket).await {
                        fire_on_journal(&journal, &gate, &schedule, &cron, now_ms).await;
                    }
                });
                ticker.firing.insert(name, fire);
            }
            ClaimPath::Journal => {
                ticker.journal_seen.insert(name, bucket);
            }
            ClaimPath::Bus => {
                ticker.bus_done.insert(name.clone(), bucket);
                let facts = BusFacts {
                    warmed_up: gate.warmed_up(),
                    clock: journal.clock_verdict(),
                    run_commands: config.run_commands,
                    queues: &config.queues,
                    tags: &config.tags,
                };
                if let Some(why) = bus_refusal(&facts, &schedule.spec, newest_ms, now_ms) {
                    ticker.bus_refused.insert(name.clone(), bucket);
                    tracing::info!(event = "cron.skip", path = "bus", schedule = %name, bucket, reason = why, "bus tick not claimed here");
                    continue;
                }
                let key = match schedule.spec.target {
                    Target::Any => schedule.job_key(bucket, None),
                    Target::Each => schedule.job_key(bucket, Some(gate.node_id())),
                };
                let runner = BusRunner {
                    command_timeout: config.command_timeout,
                    commands: config.commands.clone(),
                };
                // The ticks since the journal's last record that this bus
                // record stands for (as skip_bus_ran counts them).
                let ticks = ticker
                    .parsed
                    .get(&cron_key(&schedule))
                    .and_then(Option::as_ref)
                    .map_or(1, |cron| {
                        let after_ms = schedule.planned_after_ms();
                        cron.ticks_between(after_ms, newest_ms + 1, MAX_TICKS_READ).len().max(1)
                            as u64
                    });
                if !ticker.take_each_share(&schedule, bucket) {
                    continue;
                }
                ticker.running.spawn(run_bus_tick(
                    gate.clone(),
                    journal.clone(),
                    runner,
                    schedule,
                    (bucket, ticks),
                    key,
                ));
            }
        }
    }
    run_each_shares(journal, gate, config, ticker, now_ms);
}

/// This node's shares of `target = each` ticks its copy of the journal
/// holds as the bus's. Nodes decide a tick's path from their own views of
/// the pool, so the node that took a tick on the bus (the leader, say,
/// when it stopped hearing one member) may differ from this one, which
/// then waited for a journal fire that the bus record rules out, or saw
/// the record before its own clock reached the tick: each member runs its
/// share where it hears the bus took the tick. A share is taken once, by
/// this node's own bus claim or from the record, never both; ticks from
/// before the driver started are not taken (a restart must not run a
/// share again), nor stale ones, nor any this node would not claim.
fn run_each_shares(
    journal: &Journal,
    gate: &Gate,
    config: &DriverConfig,
    ticker: &mut Ticker,
    now_ms: u64,
) {
    let started_ms = *ticker.started_ms.get_or_insert(now_ms);
    let Ticker { each_shares, each_seen, .. } = ticker;
    let recorded = journal.read_stale(|state| {
        state
            .schedules()
            .values()
            .filter_map(|schedule| {
                // Again in this read: a change applied since the round's
                // first read must set its floor before a share is taken.
                see_each(schedule, each_seen, each_shares);
                let taken = each_shares.get(&schedule.spec.name).copied().unwrap_or(0);
                let bucket = share_from_record(schedule, taken, started_ms, now_ms)?;
                Some((schedule.clone(), bucket))
            })
            .collect::<Vec<_>>()
    });
    for (schedule, bucket) in recorded {
        let facts = BusFacts {
            warmed_up: gate.warmed_up(),
            clock: journal.clock_verdict(),
            run_commands: config.run_commands,
            queues: &config.queues,
            tags: &config.tags,
        };
        if bus_refusal(&facts, &schedule.spec, cron::tick_ms(bucket), now_ms).is_some() {
            continue;
        }
        if !ticker.take_each_share(&schedule, bucket) {
            continue;
        }
        let runner = BusRunner {
            command_timeout: config.command_timeout,
            commands: config.commands.clone(),
        };
        ticker.running.spawn(run_each_share(
            journal.clone(),
            runner,
            schedule,
            bucket,
            gate.node_id(),
        ));
    }
}

/// The bucket of `schedule` whose share this node may take from the
/// journal's record of it: a `target = each` schedule with a command whose
/// newest record is the bus's, newer than `taken` (the newest share this
/// node took), of a tick at or after this driver's start (`started_ms`: a
/// restart must not run a share again), at or before this node's clock
/// (`now_ms`: seen early, it waits, so the start guard holds), and at or
/// after the schedule was put (a record an earlier schedule of the name
/// left is not this one's).
fn share_from_record(schedule: &Schedule, taken: u64, started_ms: u64, now_ms: u64) -> Option<u64> {
    if schedule.spec.target != Target::Each || schedule.spec.template.command.is_none() {
        return None;
    }
    // The newest record of a tick this node's clock has reached (a node
    // behind the recorder's clock meets the record of its current tick
    // under newer ones).
    let last = schedule.history.iter().rev().find(|r| cron::tick_ms(r.bucket) <= now_ms)?;
    let on_bus = matches!(last.outcome, TickOutcome::Skipped { reason: SkipReason::Bus, .. });
    let tick_ms = cron::tick_ms(last.bucket);
    let new = last.bucket > taken && tick_ms >= started_ms && tick_ms >= schedule.created_at_ms;
    (on_bus && new).then_some(last.bucket)
}

/// Notes `schedule` as seen by this node's ticker. A `target = each`
/// schedule seen as such for the first time (put as `each`, turned from
/// `any`, or at the driver's start) takes no share of a tick the journal
/// already holds a record of: a bus record made while it was `any` is a
/// tick its winner ran for everyone, and every member taking a share of it
/// too would run it again (the winner twice). Records committed after the
/// change were made under `each`, or their `any` claimant does not run
/// them ([`leasehold_core::schedule::still_runs`]). Run in every read that
/// shares are taken from (a bus claim's, a record's) before taking one.
///
/// The floor is this node's: a node that first sees a new `each` schedule
/// only after its first tick was recorded (a lagging follower), or a
/// driver starting behind the recorder's clock, takes no share of that
/// tick. At most once holds; those shares are lost.
fn see_each(
    schedule: &Schedule,
    each_seen: &mut HashMap<String, u64>,
    each_shares: &mut HashMap<String, u64>,
) {
    if schedule.spec.target != Target::Each {
        return;
    }
    let name = &schedule.spec.name;
    if each_seen.get(name) == Some(&schedule.created_at_ms) {
        return;
    }
    each_seen.insert(name.clone(), schedule.created_at_ms);
    if let Some(newest) = schedule.history.iter().map(|r| r.bucket).max() {
        let taken = each_shares.entry(name.clone()).or_insert(0);
        *taken = (*taken).max(newest);
    }
}

/// Whether `schedule`'s ticks go to the journal whatever the pool's path:
/// a schedule that enqueues a queue job (no command) has no other path.
/// Its job can only be written through the journal, whose bucket guard
/// takes one record per tick however many leaders propose it, and no node
/// of any build runs such a tick on the bus, so there is no second path to
/// keep it apart from and the gate is not asked. A member down past
/// `advert_stale_after_ms`, or one node's `journal_lease` off, moves the
/// pool's command ticks to the bus but does not stop these (SPEC §4 is
/// about claims; see docs/decisions.md).
fn journal_only(schedule: &Schedule) -> bool {
    schedule.spec.template.command.is_none()
}

fn cron_key(schedule: &Schedule) -> (String, String) {
    (schedule.spec.cron.clone(), schedule.spec.timezone.clone())
}

/// What this node knows of itself when it decides on a bus tick.
struct BusFacts<'a> {
    /// Up for the gate's settle time (every online peer heard).
    warmed_up: bool,
    /// The voters' verdict on this node's clock.
    clock: ClockVerdict,
    /// The built-in executor is on.
    run_commands: bool,
    /// The queues it serves.
    queues: &'a [String],
    /// The tags it claims with.
    tags: &'a [String],
}

/// Why this node takes no bus claim for a tick, if it does not.
fn bus_refusal(
    facts: &BusFacts<'_>,
    spec: &ScheduleSpec,
    tick_ms: u64,
    now_ms: u64,
) -> Option<&'static str> {
    if !facts.warmed_up {
        // Not every online peer may have been heard yet.
        return Some("warming_up");
    }
    // On the bus a node judges a tick due by its own clock: one running
    // ahead would claim ticks early, and the record it makes would move the
    // schedule's mark past ticks that never ran. So a node claims only on a
    // clock a majority of the voters agree with, as a leader stamps only
    // on one: not while it is judged wrong, nor before it is measured (a
    // restarted node whose clock jumped an hour would otherwise claim in
    // the seconds before its peers' adverts measure it). Adverts measure
    // every reachable peer each second, within the gate's settle time, so
    // only a node cut off from most voters, or one among older builds that
    // report no time, goes without; the other nodes run its ticks, but
    // for `target = each` its own share is missed (docs/safety.md).
    match facts.clock {
        ClockVerdict::Agreed { .. } => {}
        ClockVerdict::Skewed { .. } => return Some("clock_skewed"),
        ClockVerdict::Unknown { .. } => return Some("clock_unverified"),
    }
    if spec.paused {
        return Some("paused");
    }
    if now_ms.saturating_sub(tick_ms) >= TICK_TOLERANCE_MS {
        // The bus runs current ticks only; missed ones are not caught up.
        return Some("missed");
    }
    if spec.template.command.is_none() {
        // A queue job can only be enqueued through the journal. The ticker
        // sends such ticks there (`journal_only`); kept as a guard.
        return Some("not_a_command");
    }
    if !facts.run_commands {
        return Some("no_executor");
    }
    // Only where the journal's job would run: an executor serving its
    // queue, with every tag it asks for (whatever the target).
    if !facts.queues.iter().any(|queue| queue == spec.template.queue_name()) {
        return Some("queue_not_served");
    }
    if !spec.template.tags.iter().all(|tag| facts.tags.contains(tag)) {
        return Some("no_target");
    }
    None
}

/// Before the journal fires anything, records as skipped (reason `bus`)
/// every tick the bus already ran, so the journal's catch-up does not run
/// them a second time. Answers whether the journal plan may go on in this
/// round (false after a skip was proposed: the next round plans from the
/// updated journal, and false when the bus table cannot be read).
///
/// Only claims of ticks before `planned` (the tick this round plans) count.
/// A claim of the tick being planned, or a later one, comes from a peer
/// whose view of the pool differs from this node's, claiming the same tick
/// at the same time: that claimant runs it only if the journal takes its
/// own record of it, so recording the tick for it here would refuse that
/// record and leave the tick run by nobody (found by the simulation: every
/// tick of such a split was lost). Earlier claims are kept counting: a
/// node of an older version may have run them on the bus without any
/// record in the journal.
async fn skip_bus_ran(
    journal: &Journal,
    gate: &Gate,
    schedule: &Schedule,
    cron: &CronSchedule,
    planned: u64,
) -> bool {
    // Claims of this schedule's ticks only: a schedule deleted and put
    // again under the same name left claims of ticks from before this one
    // was put, which it never had.
    let own = |bucket: u64| bucket < planned && cron::tick_ms(bucket) >= schedule.created_at_ms;
    let high = match gate.bus().high_water(&schedule.spec.name, own) {
        Ok(Some(high)) if high > schedule.last_fired_bucket => high,
        Ok(_) => return true,
        Err(error) => {
            tracing::warn!(schedule = %schedule.spec.name, %error, "bus table unreadable");
            return false;
        }
    };
    let after_ms = schedule.planned_after_ms();
    let ticks = cron.ticks_between(after_ms, cron::tick_ms(high) + 1, MAX_TICKS_READ).len().max(1);
    let command = Command::Skip {
        schedule: schedule.spec.name.clone(),
        bucket: high,
        reason: SkipReason::Bus,
        ticks: ticks as u64,
    };
    let command = planned_tick(schedule, command, journal.heard_log_format());
    match journal.propose(command).await {
        Ok(_) => {
            tracing::info!(
                event = "cron.skip",
                path = "journal",
                schedule = %schedule.spec.name,
                bucket = high,
                reason = "bus",
                ticks,
                "ticks the bus ran recorded in the journal"
            );
            false
        }
        Err(error) => {
            tracing::warn!(schedule = %schedule.spec.name, %error, "recording bus ticks not committed");
            false
        }
    }
}

/// Proposes `Fire` or `Skip` for every due tick of `schedule` (this node
/// leads, and the gate chose the journal or the schedule enqueues a queue
/// job). The plan comes from the journal's
/// `last_fired_bucket`, so a new leader picks up exactly where the last one
/// stopped; the journal refuses any bucket already covered, so a duplicate
/// proposal (a deposed leader, a retry) changes nothing. Answers false when
/// a proposal did not commit (the next round plans again).
async fn fire_on_journal(
    journal: &Journal,
    gate: &Gate,
    schedule: &Schedule,
    cron: &CronSchedule,
    now_ms: u64,
) -> bool {
    for step in plan_ticks(schedule, cron, now_ms, TICK_TOLERANCE_MS) {
        let name = schedule.spec.name.clone();
        // The plan is of the schedule as it was read: deleted, or put again
        // (anew or with another timing) while its steps were proposed, the
        // rest of it is not the schedule's any more.
        let planned_from =
            journal.read_stale(|state| state.schedule(&name).map(|s| s.created_at_ms));
        if planned_from != Some(schedule.created_at_ms) {
            tracing::info!(schedule = %name, "schedule put again or deleted; the rest of its plan is dropped");
            return true;
        }
        let command = match step {
            // A member that is down gets no job (nobody could run it, and
            // with overlap = skip it would block its later ticks); it is
            // recorded as skipped, and the live members run.
            TickPlan::Fire(bucket) if schedule.spec.target == Target::Each => {
                let (targets, offline) = gate.each_targets(&schedule.spec.template.tags);
                Command::FireEach { schedule: name, bucket, targets, offline }
            }
            TickPlan::Fire(bucket) => Command::Fire { schedule: name, bucket, targets: Vec::new() },
            TickPlan::Skip { bucket, reason, ticks } => {
                Command::Skip { schedule: name, bucket, reason, ticks }
            }
        };
        let bucket = match &command {
            Command::Fire { bucket, .. }
            | Command::FireEach { bucket, .. }
            | Command::Skip { bucket, .. } => *bucket,
            _ => 0,
        };
        // Planned from the schedule as read: the journal drops it if the
        // schedule was put anew or retimed before it applies, a window
        // the read above cannot close.
        let command = planned_tick(schedule, command, journal.heard_log_format());
        match journal.propose(command).await {
            Ok(Response::Tick(Some(TickOutcome::Fired { job_ids, lag_ms }))) => {
                tracing::info!(
                    event = "cron.fire",
                    path = "journal",
                    schedule = %schedule.spec.name,
                    bucket,
                    lag_ms,
                    jobs = ?job_ids,
                    "tick fired"
                );
                let metrics = journal.metrics();
                metrics.fire_lag_seconds.observe(lag_ms as f64 / 1_000.0);
                metrics
                    .ticks
                    .get_or_create(&TickLabels { outcome: "fired".into(), reason: String::new() })
                    .inc();
            }
            Ok(Response::Tick(Some(TickOutcome::Skipped { reason, ticks }))) => {
                tracing::info!(
                    event = "cron.skip",
                    path = "journal",
                    schedule = %schedule.spec.name,
                    bucket,
                    reason = reason.as_str(),
                    ticks,
                    "tick skipped"
                );
                journal
                    .metrics()
                    .ticks
                    .get_or_create(&TickLabels {
                        outcome: "skipped".into(),
                        reason: reason.as_str().into(),
                    })
                    .inc_by(ticks);
            }
            Ok(Response::Tick(None)) => {}
            Ok(other) => {
                tracing::warn!(schedule = %schedule.spec.name, response = ?other, "tick refused");
                break;
            }
            Err(error) => {
                // Not committed (no quorum, leadership moved): the next
                // round plans again from the journal.
                tracing::warn!(schedule = %schedule.spec.name, %error, "tick not committed");
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use leasehold_core::schedule::JobTemplate;

    use super::*;

    fn command_schedule() -> ScheduleSpec {
        ScheduleSpec {
            name: "nightly".into(),
            cron: "* * * * *".into(),
            template: JobTemplate { command: Some("true".into()), ..JobTemplate::default() },
            ..ScheduleSpec::default()
        }
    }

    #[test]
    fn a_schedule_turned_each_takes_no_share_of_a_tick_recorded_before() {
        use leasehold_core::schedule::TickRecord;
        const T_MS: u64 = 1_767_225_600_000;
        let bucket = T_MS / 1_000;
        let bus = TickOutcome::Skipped { reason: SkipReason::Bus, ticks: 1 };
        let record = |bucket| TickRecord { bucket, outcome: bus.clone(), late: false };
        let started = T_MS - 60_000;
        // Run as `any` on the bus by its winner, then turned `each`.
        let mut each = Schedule::new(
            ScheduleSpec { target: Target::Each, ..command_schedule() },
            T_MS - 120_000,
        );
        each.history.push_back(record(bucket));
        let (mut seen, mut shares) = (HashMap::new(), HashMap::new());
        see_each(&each, &mut seen, &mut shares);
        let taken = shares.get("nightly").copied().unwrap_or(0);
        assert_eq!(share_from_record(&each, taken, started, T_MS + 100), None, "run as any");
        // A record after the change is this node's share, once.
        each.history.push_back(record(bucket + 1));
        see_each(&each, &mut seen, &mut shares);
        let taken = shares.get("nightly").copied().unwrap_or(0);
        assert_eq!(share_from_record(&each, taken, started, T_MS + 1_100), Some(bucket + 1));
        // Put anew (another instant) under the same name: seen afresh.
        let mut anew = each.clone();
        anew.created_at_ms += 1_000;
        anew.history.push_back(record(bucket + 2));
        see_each(&anew, &mut seen, &mut shares);
        assert_eq!(shares.get("nightly").copied(), Some(bucket + 2));
        // An `any` schedule is not noted.
        let any = Schedule::new(command_schedule(), T_MS - 120_000);
        let (mut seen, mut shares) = (HashMap::new(), HashMap::new());
        see_each(&any, &mut seen, &mut shares);
        assert!(seen.is_empty() && shares.is_empty());
    }

    #[test]
    fn a_share_is_taken_from_a_bus_record_once_in_time_and_for_this_schedule_only() {
        use leasehold_core::schedule::TickRecord;
        const T_MS: u64 = 1_767_225_600_000;
        let bucket = T_MS / 1_000;
        let record = |outcome| TickRecord { bucket, outcome, late: false };
        let bus = TickOutcome::Skipped { reason: SkipReason::Bus, ticks: 1 };
        let mut each = Schedule::new(
            ScheduleSpec { target: Target::Each, ..command_schedule() },
            T_MS - 60_000,
        );
        each.history.push_back(record(bus.clone()));
        let started = T_MS - 10_000;
        // The record of a current tick, not taken yet: this node's share.
        assert_eq!(share_from_record(&each, 0, started, T_MS + 100), Some(bucket));
        // Taken already (by this node's own claim, or a round before).
        assert_eq!(share_from_record(&each, bucket, started, T_MS + 100), None);
        // Seen before this node's clock reaches the tick: it waits.
        assert_eq!(share_from_record(&each, 0, started, T_MS - 300), None);
        // Behind the recorder's clock by a tick: the record of the tick it
        // has reached is under a newer one, and still taken.
        let mut ahead = each.clone();
        ahead.history.push_back(TickRecord {
            bucket: bucket + 1,
            outcome: bus.clone(),
            late: false,
        });
        assert_eq!(share_from_record(&ahead, 0, started, T_MS + 100), Some(bucket));
        assert_eq!(share_from_record(&ahead, bucket, started, T_MS + 100), None);
        assert_eq!(share_from_record(&ahead, bucket, started, T_MS + 1_100), Some(bucket + 1));
        // A tick from before this driver started (a restart): not again.
        assert_eq!(share_from_record(&each, 0, T_MS + 50, T_MS + 100), None);
        // A record an earlier schedule of the same name left.
        let mut anew = each.clone();
        anew.created_at_ms = T_MS + 1;
        assert_eq!(share_from_record(&anew, 0, started, T_MS + 100), None);
        // A fired tick is the journal's (its jobs), and `any` has no shares.
        let mut fired = each.clone();
        fired.history.push_back(TickRecord {
            bucket: bucket + 1,
            outcome: TickOutcome::Fired { job_ids: vec![1], lag_ms: 0 },
            late: false,
        });
        assert_eq!(share_from_record(&fired, 0, started, T_MS + 1_100), None);
        let mut any = each.clone();
        any.spec.target = Target::Any;
        assert_eq!(share_from_record(&any, 0, started, T_MS + 100), None);
    }

    #[test]
    fn a_node_claims_bus_ticks_only_on_a_clock_the_voters_agree_with() {
        let tags = vec!["db".to_string(), "node:1".to_string()];
        let queues = vec![spec_queue()];
        let facts = |clock: ClockVerdict| BusFacts {
            warmed_up: true,
            clock,
            run_commands: true,
            queues: &queues,
            tags: &tags,
        };
        let agreed = || ClockVerdict::Agreed { agreeing: 2, voters: 3 };
        let spec = command_schedule();
        let (tick_ms, now_ms) = (60_000, 60_010);
        assert_eq!(
            bus_refusal(&facts(agreed()), &spec, tick_ms, now_ms),
            None,
            "claims when sound"
        );
        let skewed = facts(ClockVerdict::Skewed { disagreeing: vec![(2, 3_600_000)], voters: 3 });
        assert_eq!(bus_refusal(&skewed, &spec, tick_ms, now_ms), Some("clock_skewed"));
        // Not measured yet (a restarted node, or one a majority cannot
        // reach): its clock may be an hour fast, so it claims nothing.
        let unmeasured = facts(ClockVerdict::Unknown { agreeing: 1, disagreeing: 0, voters: 3 });
        assert_eq!(bus_refusal(&unmeasured, &spec, tick_ms, now_ms), Some("clock_unverified"));
        let split = facts(ClockVerdict::Unknown { agreeing: 1, disagreeing: 1, voters: 3 });
        assert_eq!(bus_refusal(&split, &spec, tick_ms, now_ms), Some("clock_unverified"));
        let cold = BusFacts { warmed_up: false, ..facts(agreed()) };
        assert_eq!(bus_refusal(&cold, &spec, tick_ms, now_ms), Some("warming_up"));
        let idle = BusFacts { run_commands: false, ..facts(agreed()) };
        assert_eq!(bus_refusal(&idle, &spec, tick_ms, now_ms), Some("no_executor"));
        let late = now_ms + TICK_TOLERANCE_MS;
        assert_eq!(bus_refusal(&facts(agreed()), &spec, tick_ms, late), Some("missed"));
    }

    fn spec_queue() -> String {
        command_schedule().template.queue_name().to_string()
    }

    #[test]
    fn a_bus_tick_runs_only_where_its_journal_job_could() {
        let tags = vec!["db".to_string(), "node:1".to_string()];
        let (served, other) = (vec![spec_queue()], vec!["exec.web".to_string()]);
        let facts = |queues| BusFacts {
            warmed_up: true,
            clock: ClockVerdict::Agreed { agreeing: 2, voters: 3 },
            run_commands: true,
            queues,
            tags: &tags,
        };
        let (tick_ms, now_ms) = (60_000, 60_010);
        let mut spec = command_schedule();
        assert_eq!(bus_refusal(&facts(&served), &spec, tick_ms, now_ms), None);
        assert_eq!(
            bus_refusal(&facts(&other), &spec, tick_ms, now_ms),
            Some("queue_not_served"),
            "an executor of other queues does not run it"
        );
        for (target, wanted, refused) in [
            (Target::Any, vec!["db"], None),
            (Target::Any, vec!["gpu"], Some("no_target")),
            (Target::Any, vec!["node:1"], None),
            (Target::Any, vec!["node:2"], Some("no_target")),
            (Target::Each, vec!["db"], None),
            (Target::Each, vec!["db", "gpu"], Some("no_target")),
        ] {
            spec.target = target;
            spec.template.tags = wanted.iter().map(|tag| tag.to_string()).collect();
            assert_eq!(
                bus_refusal(&facts(&served), &spec, tick_ms, now_ms),
                refused,
                "{target:?} {wanted:?}"
            );
        }
    }
}
