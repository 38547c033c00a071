//! The claim seam of a cron tick on the broadcast (bus) path: claim, run
//! the schedule's command on this node, release.
//!
//! Which path a tick takes is decided once per node, by the driver, with
//! [`leasehold_replica::Gate::decide_for_claim`]; this module only carries a
//! bus decision out. Nodes decide from their own peer registries, which may
//! differ (a node joining, adverts lost one way), so the leader may fire
//! the same tick on the journal. A bus winner therefore records the tick in
//! the journal (`Skip{bucket, reason: Bus}`) before it runs it, and runs it
//! only if the journal took that record
//! ([`leasehold_core::schedule::may_run_on_bus`]): the journal's
//! `bucket > last_fired_bucket` guard admits one record per bucket, a fire
//! or a bus record, so across all nodes and both paths a tick runs at most
//! once (SPEC §7.8; docs/safety.md, "5 and 6").
//!
//! Release goes only to the bus, the path that claimed:
//! a journal lease this node holds on a job with the same key is another
//! run of the same tick (the journal path's, taken by this node's
//! executor), and releasing it would hand that run to a second claimant
//! while it is still going (see docs/safety.md).

use std::sync::Arc;
use std::time::Duration;

use leasehold_client::exec::CommandLine;
use leasehold_core::schedule::{
    Schedule, SkipReason, Target, TickOutcome, TickRecord, may_run_on_bus, planned_tick, still_runs,
};
use leasehold_core::{Command, Response};
use leasehold_replica::bus::Outcome;
use leasehold_replica::{Gate, Journal};

use crate::commands::RunCommand;

/// What a bus tick needs from the node.
#[derive(Clone, Debug)]
pub struct BusRunner {
    /// A command running longer than this is killed.
    pub command_timeout: Duration,
    /// What runs the command.
    pub commands: Arc<dyn RunCommand>,
}

/// Records a bus tick this node won in the journal and answers whether it
/// may run here: the journal took this node's record, or (`target = each`)
/// holds a bus record of the bucket. Any failure answers no: a tick not run
/// is a tick missed, a tick run twice is what this prevents.
async fn journal_admits(journal: &Journal, schedule: &Schedule, bucket: u64, ticks: u64) -> bool {
    let name = schedule.spec.name.clone();
    let command = Command::Skip { schedule: name.clone(), bucket, reason: SkipReason::Bus, ticks };
    // A record planned from a schedule put anew or retimed since is
    // dropped (answered as a covered bucket): it runs nowhere.
    let command = planned_tick(schedule, command, journal.heard_log_format());
    let answer: Option<TickOutcome> = match journal.propose(command).await {
        Ok(Response::Tick(outcome)) => outcome,
        Ok(other) => {
            tracing::warn!(schedule = %name, bucket, response = ?other, "bus record refused");
            return false;
        }
        Err(error) => {
            tracing::warn!(schedule = %name, bucket, %error, "bus record not committed; not run");
            return false;
        }
    };
    // Read after the record committed, behind a read barrier: whatever
    // committed before it (a pause, a delete) is in the state read, so a
    // schedule paused while this node claimed its tick does not run it.
    let read = journal
        .read(false, |state| {
            let now = state.schedules().get(&name);
            let record = now
                .and_then(|s| s.history.iter().find(|r| r.bucket == bucket).cloned())
                .filter(|_| answer.is_none());
            (still_runs(schedule, now), record)
        })
        .await;
    let (running, recorded): (bool, Option<TickRecord>) = match read {
        Ok(read) => read,
        Err(error) => {
            // At most once: a tick whose record went in but whose schedule
            // cannot be read again is not run.
            tracing::warn!(event = "cron.skip", path = "bus", schedule = %name, bucket, reason = "unreadable", %error, "schedule unreadable after the bus record; not run");
            return false;
        }
    };
    if !running {
        tracing::info!(
            event = "cron.skip",
            path = "bus",
            schedule = %name,
            bucket,
            reason = "paused",
            "the schedule was paused, deleted, put anew or turned each while its tick was claimed; not run"
        );
        return false;
    }
    may_run_on_bus(schedule.spec.target, answer.as_ref(), recorded.as_ref(), bucket)
}

/// Runs `schedule`'s command here for the bus tick `bucket`.
async fn run_here(runner: &BusRunner, schedule: &Schedule, bucket: u64, node_id: u64) {
    let name = &schedule.spec.name;
    let Some(script) = schedule.spec.template.command.clone() else {
        return;
    };
    let env = vec![
        ("LEASEHOLD_SCHEDULE".to_string(), name.clone()),
        ("LEASEHOLD_BUCKET".to_string(), bucket.to_string()),
        ("LEASEHOLD_CLAIM_PATH".to_string(), "bus".to_string()),
        ("LEASEHOLD_NODE_ID".to_string(), node_id.to_string()),
    ];
    let command = CommandLine {
        argv: vec!["sh".to_string(), "-c".to_string(), script],
        env,
        timeout: Some(runner.command_timeout),
    };
    let run = runner.commands.run(&command).await;
    tracing::info!(
        event = "cron.fire",
        path = "bus",
        schedule = %name,
        bucket,
        outcome = run.outcome.name(),
        stdout = ?run.stdout.trim_end(),
        stderr = ?run.stderr.trim_end(),
        "bus tick ran"
    );
}

/// Runs this node's share of `schedule`'s `bucket`, a `target = each` tick
/// its copy of the journal holds as the bus's (see
/// [`crate::driver::tick_schedules`]): the node that recorded it took the
/// tick on the bus, and each member runs its share where it hears so. It
/// reads the journal again behind a read barrier first, as a bus winner
/// does: a pause or a delete acknowledged since is in that read.
pub async fn run_each_share(
    journal: Journal,
    runner: BusRunner,
    schedule: Schedule,
    bucket: u64,
    node_id: u64,
) {
    let name = schedule.spec.name.clone();
    let read = journal
        .read(false, |state| {
            let now = state.schedules().get(&name);
            let record = now.and_then(|s| s.history.iter().find(|r| r.bucket == bucket).cloned());
            (still_runs(&schedule, now), record)
        })
        .await;
    let (running, recorded) = match read {
        Ok(read) => read,
        Err(error) => {
            tracing::info!(event = "cron.skip", path = "bus", schedule = %name, bucket, reason = "unreadable", %error, "the journal could not be read behind a barrier; this node's share is not run");
            return;
        }
    };
    if !running || !may_run_on_bus(Target::Each, None, recorded.as_ref(), bucket) {
        tracing::info!(event = "cron.skip", path = "bus", schedule = %name, bucket, reason = "paused", "the schedule was paused, deleted or put anew since the bus took the tick; this node's share is not run");
        return;
    }
    tracing::info!(
        event = "lease.acquire",
        path = "bus",
        node = node_id,
        schedule = %name,
        bucket,
        "the journal holds this tick as the bus's; running this node's share"
    );
    run_here(&runner, &schedule, bucket, node_id).await;
}

/// Claims `key` (a tick of `schedule` at `bucket`) on the bus and, if this
/// node wins and the journal admits the tick to the bus (`ticks` ticks
/// since the journal's last record end at it), runs the schedule's command
/// here; then releases the bus claim (a no-op unless this node won it).
pub async fn run_bus_tick(
    gate: Gate,
    journal: Journal,
    runner: BusRunner,
    schedule: Schedule,
    tick: (u64, u64),
    key: String,
) {
    let name = schedule.spec.name.clone();
    let (bucket, ticks) = tick;
    match gate.bus_claim(&key).await {
        Ok(Outcome::Won) if !journal_admits(&journal, &schedule, bucket, ticks).await => {
            tracing::info!(
                event = "lease.contend",
                path = "bus",
                node = gate.node_id(),
                schedule = %name,
                bucket,
                key = %key,
                "won the bus claim, but the journal did not admit the tick to the bus; not run"
            );
        }
        Ok(Outcome::Won) => {
            tracing::info!(
                event = "lease.acquire",
                path = "bus",
                node = gate.node_id(),
                schedule = %name,
                bucket,
                key = %key,
                "won the bus claim; running the command here"
            );
            run_here(&runner, &schedule, bucket, gate.node_id()).await;
        }
        Ok(Outcome::Lost { winner }) => {
            tracing::info!(
                event = "lease.contend",
                path = "bus",
                node = gate.node_id(),
                schedule = %name,
                bucket,
                key = %key,
                winner = winner.unwrap_or(0),
                "another node won the bus claim"
            );
        }
        Err(error) => {
            tracing::warn!(path = "bus", schedule = %name, bucket, %error, "bus claim failed");
        }
    }
    if let Err(error) = gate.bus_release(&key).await {
        tracing::warn!(%error, key, "bus release failed");
    }
}
