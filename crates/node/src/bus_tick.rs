//! The claim seam of a cron tick on the broadcast (bus) path: claim, run
//! the schedule's command on this node, release.
//!
//! Which path a tick takes is decided once, by the driver, with
//! [`leasehold_replica::Gate::decide_for_claim`]; this module only carries a
//! bus decision out. Release goes only to the bus, the path that claimed:
//! a journal lease this node holds on a job with the same key is another
//! run of the same tick (the journal path's, taken by this node's
//! executor), and releasing it would hand that run to a second claimant
//! while it is still going (see docs/safety.md).

use std::time::Duration;

use leasehold_client::exec::{self, CommandLine};
use leasehold_core::schedule::Schedule;
use leasehold_replica::Gate;
use leasehold_replica::bus::Outcome;

/// What a bus tick needs from the node.
#[derive(Clone, Debug)]
pub struct BusRunner {
    /// A command running longer than this is killed.
    pub command_timeout: Duration,
}

/// Claims `key` (a tick of `schedule` at `bucket`) on the bus and, if this
/// node wins, runs the schedule's command here; then releases the bus
/// claim (a no-op unless this node won it).
pub async fn run_bus_tick(
    gate: Gate,
    runner: BusRunner,
    schedule: Schedule,
    bucket: u64,
    key: String,
) {
    let name = schedule.spec.name.clone();
    match gate.bus_claim(&key).await {
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
            let Some(script) = schedule.spec.template.command.clone() else {
                return;
            };
            let env = vec![
                ("LEASEHOLD_SCHEDULE".to_string(), name.clone()),
                ("LEASEHOLD_BUCKET".to_string(), bucket.to_string()),
                ("LEASEHOLD_CLAIM_PATH".to_string(), "bus".to_string()),
                ("LEASEHOLD_NODE_ID".to_string(), gate.node_id().to_string()),
            ];
            let command = CommandLine {
                argv: vec!["sh".to_string(), "-c".to_string(), script],
                env,
                timeout: Some(runner.command_timeout),
            };
            let run = exec::run(&command, Vec::new()).await;
            tracing::info!(
                event = "cron.fire",
                path = "bus",
                schedule = %name,
                bucket,
                outcome = ?run.outcome,
                stdout = %run.stdout.trim_end(),
                stderr = %run.stderr.trim_end(),
                "bus tick ran"
            );
        }
        Ok(Outcome::Lost { winner }) => {
            tracing::info!(
                event = "lease.contend",
                path = "bus",
                schedule = %name,
                bucket,
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
