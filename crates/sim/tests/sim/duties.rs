//! Goal: the node's real driver and built-in executor run on the seeded
//! simulation, and when the nodes' views of their peers differ — the
//! leader on the journal path, a follower on the bus for the same ticks —
//! every tick still runs once, and no job is run by a second holder while
//! its first is still running; a leader crash and a power cut do not stop
//! the duties or run anything twice. Planted: a bus release that also
//! releases the journal lease of the same key (`ReleaseBothPaths`) is
//! found.
//!
//! Method: the three turmoil hosts of `journal_hosts` with the gate, each
//! running the node's driver (`leasehold_node::driver::run`); nodes 2 and
//! 3 also run the node's executor (`leasehold_node::executor::run`) with a
//! client of their own Queue service over simulated TCP. Commands are not
//! started: each run is recorded (start and end, with its schedule, bucket,
//! job, token and claim path) and takes 400 ms of simulated time. The
//! driver puts an every-second schedule whose ticks run a command and lets
//! the journal path run them; then it cuts one follower off from the
//! leader and turns that follower's journal-lease flag off behind the cut.
//! The leader never hears of it and keeps firing on the journal; the other
//! follower hears it and, from the settle point, claims the same ticks on
//! the bus — the split SPEC §7.8 guards against (docs/safety.md, "5 and
//! 6"). Six more seconds of ticks run so.
//!
//! Checks: the runs as the chaos harness's `journal_once` and `cron_once`
//! read an execution log (no tick on both paths, no bucket run as two
//! jobs, no token run twice); no two runs of one job overlap in simulated
//! time (leases last 30 s and every run 400 ms, so no lease can lapse
//! mid-run: an overlap is a lease taken from a running holder); every seed
//! runs ticks on the journal; across the seeds the bus runs some and the
//! journal records bus ticks and fires after the flag change (both paths
//! contended); a seed gives the same history twice.
//!
//! The crash story (skews either way, 2 s leases): after the journal has
//! run a while the leader crashes and comes back, then every host loses
//! power for 300 ms; ten seconds follow. A run the node cut off (lease
//! lost) or a crash ended counts as ended there. Checks: as above, no tick
//! recorded and not run, runs after the power cut, the same history twice.
//!
//! What fails if the feature goes: a bus tick that runs without the
//! journal admitting it runs ticks the leader fired too (`journal_once`);
//! with `ReleaseBothPaths` planted, the follower's executor loses its
//! running lease to the bus release and runs the job again (overlap).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_cluster_tests::checkers::{self, Checker, RunRecord, Severity};
use leasehold_cluster_tests::execlog::{ExecEvent, RunPhase};
use leasehold_cluster_tests::plan::CronSchedulePlan;
use leasehold_core::claim_path::ClaimPath;
use leasehold_core::schedule::{Catchup, JobTemplate, Overlap, ScheduleSpec, Target, TickOutcome};
use leasehold_core::{Command, Response};
use leasehold_raft::NodeId;
use leasehold_sim::net::host_name;

use crate::journal_hosts::{
    FaultQueue, HostFault, Hosts, NODES, Peers, Skews, WAIT, every_gate_decides, form_group,
    propose, real_ms, stamping_leader, start_with_duties, with_gate,
};
use crate::node_duties::{Duties, RunCut, RunLog};

/// The seeds the story runs on, each twice.
const SEEDS: std::ops::Range<u64> = 0..4;
/// The seeds the planted bug gets to be found in.
const PLANTED_SEEDS: std::ops::Range<u64> = 0..8;
/// The schedule every host's driver ticks.
const SCHEDULE: &str = "tick";
/// How long each command runs.
const RUN_FOR: Duration = Duration::from_millis(400);
/// The lease a tick's job is claimed with.
const LEASE_TTL_MS: u64 = 30_000;
/// The lease in the crash story: short, so a job whose holder crashed goes
/// out again within the run (still five runs long).
const CRASH_LEASE_TTL_MS: u64 = 2_000;
/// The seeds of the crash story, each twice.
const CRASH_SEEDS: std::ops::Range<u64> = 0..16;

/// What one run recorded.
#[derive(Debug, Default, PartialEq)]
struct Run {
    /// One line per event, simulated milliseconds first.
    history: Vec<String>,
    /// Every command run, by every node.
    runs: Vec<ExecEvent>,
    /// The leader's records of the ticks after the flag changed: fired on
    /// the journal, and recorded for the bus.
    fired_after_flip: usize,
    bus_records_after_flip: usize,
    /// Ticks the journal recorded as fired, or as run on the bus, that no
    /// node ran on that path.
    not_run: Vec<u64>,
    /// Which host crashed when (simulated ns): its runs stopped there.
    crashes: Vec<(NodeId, u64)>,
    /// The runs the node cut off (it lost the lease) and when.
    cuts: Vec<RunCut>,
    /// When the schedule was paused (the pause acknowledged) until it was
    /// resumed (the resume proposed), simulated ns.
    paused: Vec<(u64, u64)>,
}

/// What the driver does after the journal has run the schedule a while.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Story {
    /// One follower is cut off from the leader and turns its flag off
    /// behind the cut: the leader on the journal, the other follower on
    /// the bus, for the same ticks.
    Split,
    /// The leader crashes and comes back; later the whole cluster loses
    /// power and comes back; the duties go on.
    Crashes,
    /// A `target = each` schedule, and the leader cut off from one
    /// follower until that follower's advert is stale to it: the leader
    /// takes the ticks on the bus while the other follower, which hears
    /// everyone, decides the journal; every node runs commands.
    LeaderOnBus,
    /// The split, then the schedule paused and resumed again and again,
    /// each pause at another point of a second: a bus claim under way
    /// when a pause commits must not run its tick.
    PausedOnBus,
}

/// The schedule as the checkers' plan names it: every second, overlap
/// allowed, catch-up coalesced.
fn plan(story: Story) -> CronSchedulePlan {
    CronSchedulePlan {
        name: SCHEDULE.to_string(),
        period_s: 1,
        catchup: "coalesce".to_string(),
        overlap: "allow".to_string(),
        run_ms: u64::try_from(RUN_FOR.as_millis()).unwrap_or(u64::MAX),
        lease_ttl_ms: match story {
            Story::Split | Story::PausedOnBus | Story::LeaderOnBus => LEASE_TTL_MS,
            Story::Crashes => CRASH_LEASE_TTL_MS,
        },
    }
}

fn put_schedule(story: Story) -> Command {
    let plan = plan(story);
    let spec = ScheduleSpec {
        name: plan.name.clone(),
        cron: plan.cron(),
        template: JobTemplate {
            lease_ttl_ms: Some(plan.lease_ttl_ms),
            command: Some("work".to_string()),
            ..JobTemplate::default()
        },
        overlap: Overlap::Allow,
        catchup: Catchup::Coalesce,
        target: if story == Story::LeaderOnBus { Target::Each } else { Target::Any },
        ..ScheduleSpec::default()
    };
    Command::PutSchedule { spec }
}

/// The driver: forms the group, puts the schedule, lets the journal run
/// it for four seconds, then plays `story` and reads the leader's tick
/// records.
async fn drive(
    hosts: Hosts,
    runs: RunLog,
    faults: FaultQueue,
    story: Story,
    run: Arc<Mutex<Run>>,
) -> anyhow::Result<()> {
    let mut history = Vec::new();
    form_group(&hosts, Peers::Gate).await?;
    let (leader_id, leader) = stamping_leader(&hosts).await?;
    history.push(format!("{} node {leader_id} leads and may stamp", real_ms()));
    every_gate_decides(&hosts, ClaimPath::Journal, &mut history).await?;
    let answer = propose(&leader, put_schedule(story)).await??;
    history.push(format!("{} put schedule -> {answer:?}", real_ms()));
    anyhow::ensure!(answer == Response::ScheduleChanged, "put schedule: {answer:?}");
    tokio::time::sleep(Duration::from_secs(4)).await;

    // The bucket from which both paths contend (the split), or 0.
    let mut paused = Vec::new();
    let contended_from = match story {
        Story::Split => split(&hosts, leader_id, &mut history).await?,
        Story::Crashes => {
            crashes(&hosts, &faults, leader_id, &mut history).await?;
            0
        }
        Story::PausedOnBus => {
            let from = split(&hosts, leader_id, &mut history).await?;
            paused = pauses(&leader, &mut history).await?;
            from
        }
        Story::LeaderOnBus => {
            let followers: Vec<NodeId> = (1..=NODES).filter(|id| *id != leader_id).collect();
            let [_, cut] = followers.as_slice() else { anyhow::bail!("followers {followers:?}") };
            turmoil::partition(host_name(*cut), host_name(leader_id));
            history.push(format!("{} node {cut} cut off from node {leader_id}", real_ms()));
            // Past the 30 s after which the leader's copy of its advert is
            // stale (the leader then decides the bus), and 8 s of ticks.
            tokio::time::sleep(Duration::from_secs(38)).await;
            0
        }
    };
    let (_, leader) = stamping_leader(&hosts).await?;
    let records = leader.journal.read_stale(|state| {
        state.schedules().get(SCHEDULE).map(|schedule| schedule.history.clone()).unwrap_or_default()
    });
    let events = runs.events();
    let ran = |bucket: u64, path: &str| {
        events.iter().any(|event| {
            event.phase == RunPhase::Start && event.bucket == bucket && event.path == path
        })
    };
    // The newest two ticks may not have been claimed yet.
    let judged_until =
        records.iter().map(|record| record.bucket).max().unwrap_or(0).saturating_sub(2);
    let (mut fired_after_flip, mut bus_records_after_flip) = (0, 0);
    let mut not_run = Vec::new();
    for record in records {
        history.push(format!("record {}: {:?}", record.bucket, record.outcome));
        let path = match record.outcome {
            TickOutcome::Fired { .. } => "journal",
            TickOutcome::Skipped { reason, .. } if reason.as_str() == "bus" => "bus",
            TickOutcome::Skipped { .. } => continue,
        };
        if contended_from > 0 && record.bucket >= contended_from {
            if path == "bus" { bus_records_after_flip += 1 } else { fired_after_flip += 1 }
        }
        if record.bucket <= judged_until && !ran(record.bucket, path) {
            not_run.push(record.bucket);
        }
    }
    let mut run = run.lock().unwrap_or_else(PoisonError::into_inner);
    *run = Run {
        history,
        runs: events,
        fired_after_flip,
        bus_records_after_flip,
        not_run,
        crashes: Vec::new(),
        cuts: runs.cuts(),
        paused,
    };
    Ok(())
}

/// Pauses and resumes the schedule eight times, 1,125 ms a round, so the
/// pauses fall at eight points of a second (a bus claim takes 200 ms of
/// it); answers each pause's span, from its acknowledgement to the resume.
async fn pauses(
    leader: &crate::journal_hosts::Host,
    history: &mut Vec<String>,
) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut spans = Vec::new();
    for _ in 0..8 {
        let pause = Command::SetPaused { name: SCHEDULE.to_string(), paused: true };
        let answer = propose(leader, pause).await??;
        let paused_ns = crate::node_duties::sim_ns();
        history.push(format!("{} paused -> {answer:?}", real_ms()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let resumed_ns = crate::node_duties::sim_ns();
        // As `Schedules.Resume` forms it: the ticks due while paused that
        // the leader did not record go with it.
        let now_ms = leader.journal.cluster_now_ms();
        let schedule = leader.journal.read_stale(|state| state.schedule(SCHEDULE).cloned());
        let resume = leasehold_core::schedule::resume_command(SCHEDULE, schedule.as_ref(), now_ms);
        let answer = propose(leader, resume).await??;
        history.push(format!("{} resumed -> {answer:?}", real_ms()));
        spans.push((paused_ns, resumed_ns));
        tokio::time::sleep(Duration::from_millis(625)).await;
    }
    Ok(spans)
}

/// The split: one follower cut off from the leader turns its flag off;
/// six seconds of ticks past the settle point. Answers the first bucket
/// past the settle point.
async fn split(hosts: &Hosts, leader_id: NodeId, history: &mut Vec<String>) -> anyhow::Result<u64> {
    let followers: Vec<NodeId> = (1..=NODES).filter(|id| *id != leader_id).collect();
    let [other, muted] = followers.as_slice() else {
        anyhow::bail!("followers {followers:?}");
    };
    tracing::info!("--- node {muted} is cut off from the leader and turns its flag off");
    turmoil::partition(host_name(*muted), host_name(leader_id));
    let muted_host = hosts.get(*muted).ok_or_else(|| anyhow::anyhow!("node {muted} is down"))?;
    let (flipped_at_ms, settle_ms) = with_gate(&muted_host, |gate| {
        let at_ms = gate.now_ms();
        gate.set_flags(Some(false), None);
        (at_ms, gate.config().settle_ms())
    })
    .await?;
    history.push(format!(
        "{} node {muted} cut off from node {leader_id}, its flag off at {flipped_at_ms}; \
         node {other} hears it",
        real_ms()
    ));
    tokio::time::sleep(Duration::from_millis(settle_ms) + Duration::from_secs(6)).await;
    Ok((flipped_at_ms + settle_ms) / 1_000)
}

/// The crashes: the leader goes down for 1.5 s; three seconds later every
/// host loses power for 300 ms; then ten seconds (past the 5 s start
/// grace a new term gives earlier terms' leases, and a lease's lapse).
async fn crashes(
    hosts: &Hosts,
    faults: &FaultQueue,
    leader_id: NodeId,
    history: &mut Vec<String>,
) -> anyhow::Result<()> {
    faults.ask(HostFault::Crash(leader_id));
    history.push(format!("{} node {leader_id} (the leader) crashes", real_ms()));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    faults.ask(HostFault::Restart(leader_id));
    history.push(format!("{} node {leader_id} restarts", real_ms()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in 1..=NODES {
        faults.ask(HostFault::Crash(id));
    }
    history.push(format!("{} power cut", real_ms()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in 1..=NODES {
        faults.ask(HostFault::Restart(id));
    }
    history.push(format!("{} power back", real_ms()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while hosts.all().len() < NODES as usize {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the hosts did not come back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

fn run(seed: u64, skews: Skews, story: Story, release_both_paths: bool) -> anyhow::Result<Run> {
    let runs = RunLog::default();
    let duties =
        Duties { runs: runs.clone(), executors: vec![2, 3], run_for: RUN_FOR, release_both_paths };
    let mut simulation = start_with_duties(seed, skews, duties)?;
    let recorded = Arc::new(Mutex::new(Run::default()));
    let (hosts, faults, run) =
        (simulation.hosts.clone(), simulation.faults.clone(), recorded.clone());
    simulation.sim.client("driver", async move {
        drive(hosts, runs, faults, story, run).await.map_err(|error| error.into())
    });
    let crashes = simulation.run().map_err(|error| anyhow::anyhow!("seed {seed}: {error}"))?;
    let mut run = std::mem::take(&mut *recorded.lock().unwrap_or_else(PoisonError::into_inner));
    run.crashes = crashes;
    Ok(run)
}

/// Why `run` breaks safety: the checkers' safety anomalies, and runs of
/// one job that overlap.
fn violations(run: &Run, story: Story) -> Vec<String> {
    let record = RunRecord {
        history: Vec::new(),
        sink: Vec::new(),
        final_jobs: None,
        samples: Vec::new(),
        nodes: NODES,
        runs: run.runs.clone(),
        final_exec_jobs: None,
        cron: vec![plan(story)],
        clock_bound_ms: 500,
    };
    let mut found = Vec::new();
    let applicable: [&dyn Checker; 2] =
        [&checkers::journal_once::JournalOnce, &checkers::cron_once::CronOnce];
    for checker in applicable {
        let verdict = checker.check(&record);
        for anomaly in verdict.anomalies.iter().filter(|a| a.severity == Severity::Safety) {
            found.push(format!("{}: {}", verdict.checker, anomaly.message));
        }
    }
    found.extend(overlapping_runs(&run.runs, &run.crashes, &run.cuts));
    found
}

/// Runs of one job (on the journal path) whose spans overlap. A run the
/// node cut off, or its host's crash, ends there.
fn overlapping_runs(
    events: &[ExecEvent],
    crashes: &[(NodeId, u64)],
    cuts: &[RunCut],
) -> Vec<String> {
    let mut spans: BTreeMap<(u64, u64), (u64, Option<u64>, NodeId)> = BTreeMap::new();
    for event in events.iter().filter(|event| event.job_id != 0) {
        let span = spans.entry((event.job_id, event.token)).or_insert((0, None, event.node));
        match event.phase {
            RunPhase::Start => span.0 = event.wall_ns,
            RunPhase::End => span.1 = Some(event.wall_ns),
        }
    }
    for cut in cuts {
        if let Some(span) = spans.get_mut(&(cut.job_id, cut.token)) {
            span.1 = span.1.or(Some(cut.at_ns));
        }
    }
    for (start, end, node) in spans.values_mut() {
        if end.is_none() {
            *end = crashes
                .iter()
                .filter(|(crashed, at_ns)| crashed == node && at_ns >= start)
                .map(|(_, at_ns)| *at_ns)
                .min();
        }
    }
    let mut found = Vec::new();
    for ((job, token), (start, end, node)) in &spans {
        for ((other_job, other_token), (other_start, _, other_node)) in &spans {
            let still_running = end.is_none_or(|end| *other_start < end);
            if job == other_job && token != other_token && start <= other_start && still_running {
                found.push(format!(
                    "job {job} ran under token {other_token} on node {other_node} from \
                     {other_start} ns while its run under token {token} on node {node} \
                     (from {start} ns) was still going"
                ));
            }
        }
    }
    found
}

#[test]
fn both_paths_contend_for_ticks_and_each_runs_once() -> anyhow::Result<()> {
    let (mut bus_runs, mut fired, mut bus_records) = (0, 0, 0);
    let stories = SEEDS.flat_map(|seed| [(seed, Skews::FirstBehind), (seed, Skews::Either)]);
    for (seed, skews) in stories {
        let first = run(seed, skews, Story::Split, false)?;
        let text = first.history.join("\n");
        let violations = violations(&first, Story::Split);
        anyhow::ensure!(violations.is_empty(), "seed {seed}: {violations:#?}\n{text}");
        let starts = |path: &str| {
            first.runs.iter().filter(|e| e.phase == RunPhase::Start && e.path == path).count()
        };
        anyhow::ensure!(starts("journal") >= 2, "seed {seed}: runs {:?}\n{text}", first.runs);
        anyhow::ensure!(
            first.not_run.is_empty(),
            "seed {seed}: ticks recorded and not run: {:?}\n{text}",
            first.not_run
        );
        bus_runs += starts("bus");
        fired += first.fired_after_flip;
        bus_records += first.bus_records_after_flip;
        let again = run(seed, skews, Story::Split, false)?;
        anyhow::ensure!(first == again, "seed {seed} is not deterministic:\n{text}");
    }
    // Both paths took part: ticks ran on the bus, and after the settle
    // point the journal holds fires and bus records alike.
    anyhow::ensure!(bus_runs > 0, "no tick ran on the bus in {SEEDS:?}");
    anyhow::ensure!(fired > 0 && bus_records > 0, "fired {fired}, bus records {bus_records}");
    Ok(())
}

#[test]
fn each_member_runs_its_share_of_a_tick_the_leader_took_on_the_bus() -> anyhow::Result<()> {
    for seed in 0..2 {
        let runs = RunLog::default();
        let duties = Duties {
            runs: runs.clone(),
            executors: (1..=NODES).collect(),
            run_for: RUN_FOR,
            release_both_paths: false,
        };
        let mut simulation = start_with_duties(seed, Skews::Either, duties)?;
        let recorded = Arc::new(Mutex::new(Run::default()));
        let (hosts, faults, run) =
            (simulation.hosts.clone(), simulation.faults.clone(), recorded.clone());
        simulation.sim.client("driver", async move {
            drive(hosts, runs, faults, Story::LeaderOnBus, run).await.map_err(|e| e.into())
        });
        simulation.run().map_err(|error| anyhow::anyhow!("seed {seed}: {error}"))?;
        let run = std::mem::take(&mut *recorded.lock().unwrap_or_else(PoisonError::into_inner));
        let text = run.history.join("\n");
        // Each node runs its share of a bucket at most once.
        let mut starts: BTreeMap<(u64, u64), usize> = BTreeMap::new();
        for event in run.runs.iter().filter(|e| e.phase == RunPhase::Start) {
            *starts.entry((event.bucket, event.node)).or_default() += 1;
        }
        let twice: Vec<_> = starts.iter().filter(|(_, n)| **n > 1).collect();
        anyhow::ensure!(twice.is_empty(), "seed {seed}: shares run twice {twice:?}\n{text}");
        // Every bucket the leader recorded for the bus (up to the newest
        // two, which may still be under way) was run by the leader and by
        // the follower that hears everyone.
        let bus: Vec<u64> = run
            .history
            .iter()
            .filter_map(|line| {
                let rest = line.strip_prefix("record ")?;
                let (bucket, outcome) = rest.split_once(':')?;
                outcome.contains("Bus").then(|| bucket.parse().ok())?
            })
            .collect();
        anyhow::ensure!(bus.len() >= 3, "seed {seed}: bus records {bus:?}\n{text}");
        let judged = &bus[..bus.len() - 2];
        let ran_by = |bucket: u64| {
            let mut nodes: Vec<u64> = run
                .runs
                .iter()
                .filter(|e| e.phase == RunPhase::Start && e.bucket == bucket && e.path == "bus")
                .map(|e| e.node)
                .collect();
            nodes.sort_unstable();
            nodes
        };
        for bucket in judged {
            let nodes = ran_by(*bucket);
            anyhow::ensure!(
                nodes.len() >= 2,
                "seed {seed}: bus bucket {bucket} ran only on {nodes:?}\n{text}"
            );
        }
    }
    Ok(())
}

#[test]
fn a_bus_claim_under_way_when_its_schedule_is_paused_does_not_run() -> anyhow::Result<()> {
    let mut bus_runs = 0;
    for seed in SEEDS {
        let run = run(seed, Skews::FirstBehind, Story::PausedOnBus, false)?;
        let text = run.history.join("\n");
        let violations = violations(&run, Story::PausedOnBus);
        anyhow::ensure!(violations.is_empty(), "seed {seed}: {violations:#?}\n{text}");
        anyhow::ensure!(run.paused.len() == 8, "seed {seed}: pauses {:?}\n{text}", run.paused);
        let bus = || run.runs.iter().filter(|e| e.phase == RunPhase::Start && e.path == "bus");
        bus_runs += bus().count();
        for event in bus() {
            let in_pause =
                run.paused.iter().find(|(from, to)| (*from..*to).contains(&event.wall_ns));
            anyhow::ensure!(
                in_pause.is_none(),
                "seed {seed}: bucket {} ran on the bus at {} ns, paused {in_pause:?}\n{text}",
                event.bucket,
                event.wall_ns
            );
        }
    }
    anyhow::ensure!(bus_runs > 0, "no tick ran on the bus in {SEEDS:?}");
    Ok(())
}

#[test]
fn a_bus_release_that_releases_the_journal_lease_is_found() -> anyhow::Result<()> {
    for seed in PLANTED_SEEDS {
        let planted = run(seed, Skews::Either, Story::Split, true)?;
        let violations = violations(&planted, Story::Split);
        if !violations.is_empty() {
            eprintln!("release-both-paths: found on seed {seed}: {violations:#?}");
            return Ok(());
        }
    }
    anyhow::bail!("release-both-paths was not found in seeds {PLANTED_SEEDS:?}")
}

#[test]
fn the_duties_survive_a_leader_crash_and_a_power_cut() -> anyhow::Result<()> {
    for seed in CRASH_SEEDS {
        let first = run(seed, Skews::Either, Story::Crashes, false)?;
        let text = first.history.join("\n");
        let violations = violations(&first, Story::Crashes);
        anyhow::ensure!(violations.is_empty(), "seed {seed}: {violations:#?}\n{text}");
        anyhow::ensure!(
            first.crashes.len() == 1 + NODES as usize,
            "seed {seed}: crashes {:?}\n{text}",
            first.crashes
        );
        anyhow::ensure!(
            first.not_run.is_empty(),
            "seed {seed}: ticks recorded and not run: {:?}\n{text}",
            first.not_run
        );
        // The duties went on after the power cut: ticks ran after it.
        let power_back_ns = first.crashes.iter().map(|(_, at_ns)| *at_ns).max().unwrap_or(0);
        let later = first
            .runs
            .iter()
            .filter(|e| e.phase == RunPhase::End && e.wall_ns > power_back_ns)
            .count();
        anyhow::ensure!(later >= 3, "seed {seed}: {later} runs after the power cut\n{text}");
        let again = run(seed, Skews::Either, Story::Crashes, false)?;
        anyhow::ensure!(first == again, "seed {seed} is not deterministic:\n{text}");
    }
    Ok(())
}
