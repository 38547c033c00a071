//! The cron workload: every-second schedules whose runs report, from the
//! node that ran them, to the execution log (`execlog.rs`), and a poller
//! that reads every schedule's tick records into the history every few
//! seconds (the node keeps only the newest 100 records per schedule, so one
//! read at the end would not see them all). At the end the schedules are
//! paused, their last runs allowed to finish, and read once more.
//!
//! The schedules carry commands, so putting and pausing them needs the
//! `admin` role; the reads use a `reader` token.

use std::path::Path;
use std::time::Duration;

use leasehold_client::Client;
use leasehold_proto::v1;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::history::{History, OpFunction, OpType, OpValue, TickRecord};
use crate::plan::CronPlan;
use crate::security::{Role, Security};
use crate::workload::Phase;

/// The process name of the poller in the history.
pub const PROCESS: &str = "cron";
/// The queue command jobs go to when a template names none (the nodes'
/// built-in executors take theirs from it).
pub const COMMAND_QUEUE: &str = "exec";
/// Deadline of one schedule call.
const CALL_LIMIT: Duration = Duration::from_secs(8);
/// `catchup_max` of the `catchup = all` schedules: two minutes of
/// every-second ticks, longer than any fault round and its recovery. The
/// node's default (10) is shorter than the stalls that link faults cause
/// while every process lives (a soak saw 12 s of elections under
/// `reset-links`), and `cron_once` counts a catch-up skip on such a
/// schedule as a liveness failure: it should mean a stall of two minutes.
const CATCHUP_ALL_MAX: u32 = 120;

fn spec(schedule: &crate::plan::CronSchedulePlan, log: &Path) -> v1::ScheduleSpec {
    let catchup = match schedule.catchup.as_str() {
        "skip" => v1::Catchup::Skip,
        "all" => v1::Catchup::All,
        _ => v1::Catchup::Coalesce,
    };
    let overlap = if schedule.overlap == "skip" { v1::Overlap::Skip } else { v1::Overlap::Allow };
    v1::ScheduleSpec {
        name: schedule.name.clone(),
        cron: schedule.cron(),
        timezone: String::new(),
        template: Some(v1::JobTemplate {
            queue: None,
            payload: Vec::new(),
            priority: 0,
            lease_ttl_ms: Some(schedule.lease_ttl_ms),
            max_attempts: Some(20),
            tags: Vec::new(),
            command: Some(crate::execlog::command(log, schedule.run_ms)),
        }),
        overlap: overlap as i32,
        catchup: catchup as i32,
        catchup_window_ms: 0,
        catchup_max: if catchup == v1::Catchup::All { CATCHUP_ALL_MAX } else { 0 },
        target: v1::Target::Any as i32,
        paused: false,
    }
}

/// Puts every schedule of the plan as `admin` (retrying for up to `limit`).
pub async fn put_schedules(
    security: &Security,
    addrs: &[String],
    plan: &CronPlan,
    log: &Path,
    limit: Duration,
) -> anyhow::Result<()> {
    let client = security
        .client(&addrs.join(","), Role::Admin)
        .map_err(|e| anyhow::anyhow!("admin client: {e}"))?;
    let deadline = Instant::now() + limit;
    for schedule in &plan.schedules {
        loop {
            let mut stub = client.schedules_stub();
            let request = v1::PutScheduleRequest { spec: Some(spec(schedule, log)) };
            match tokio::time::timeout(CALL_LIMIT, stub.put(request)).await {
                Ok(Ok(_)) => break,
                Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => {
                    anyhow::bail!("schedule {} refused: {}", schedule.name, status.message());
                }
                other => {
                    if Instant::now() >= deadline {
                        anyhow::bail!("could not put schedule {}: {other:?}", schedule.name);
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }
    Ok(())
}

fn tick(record: &v1::TickRecord) -> TickRecord {
    TickRecord {
        bucket: record.bucket,
        outcome: record.outcome.clone(),
        job_ids: record.job_ids.clone(),
        reason: record.skip_reason.clone(),
        ticks: if record.outcome == "skipped" { record.ticks } else { 0 },
    }
}

/// Reads one schedule (linearizably) into the history; true when it answered.
pub async fn read_schedule(history: &History, client: &Client, name: &str) -> bool {
    let base = OpValue { schedule: Some(name.to_string()), ..OpValue::default() };
    history.invoke(PROCESS, OpFunction::ScheduleRead, base.clone());
    let mut stub = client.schedules_stub();
    let request = v1::GetScheduleRequest { name: name.to_string(), stale: false };
    match tokio::time::timeout(CALL_LIMIT, stub.get(request)).await {
        Ok(Ok(reply)) => {
            let ticks = reply.into_inner().history.iter().map(tick).collect();
            history.record(
                PROCESS,
                OpType::Ok,
                OpFunction::ScheduleRead,
                OpValue { ticks, ..base },
            );
            true
        }
        Ok(Err(status)) => {
            let value = OpValue {
                code: Some(format!("{:?}", status.code())),
                message: Some(status.message().to_string()),
                ..base
            };
            history.record(PROCESS, OpType::Info, OpFunction::ScheduleRead, value);
            false
        }
        Err(_) => {
            let value = OpValue { message: Some("timed out".to_string()), ..base };
            history.record(PROCESS, OpType::Info, OpFunction::ScheduleRead, value);
            false
        }
    }
}

/// Reads every schedule every `interval` until the phase is Stop. A client
/// per round, starting at the next address, so one node's trouble does not
/// blind it.
pub async fn poller(
    history: History,
    security: Security,
    addrs: Vec<String>,
    names: Vec<String>,
    interval: Duration,
    mut phase: watch::Receiver<Phase>,
) -> anyhow::Result<()> {
    let mut round = 0usize;
    loop {
        let rotated: Vec<String> =
            (0..addrs.len()).map(|i| addrs[(round + i) % addrs.len()].clone()).collect();
        if let Ok(client) = security.client(&rotated.join(","), Role::Reader) {
            for name in &names {
                if !read_schedule(&history, &client, name).await {
                    break;
                }
            }
        }
        round += 1;
        if tokio::time::timeout(interval, phase.wait_for(|p| *p == Phase::Stop)).await.is_ok() {
            return Ok(());
        }
    }
}

/// Pauses every schedule as `admin` (bounded retries), waits until the
/// command queue holds no ready or claimed job (or `limit` passes), and
/// reads every schedule once more.
pub async fn finish(
    history: &History,
    security: &Security,
    addrs: &[String],
    names: &[String],
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    let clients = (
        security.client(&addrs.join(","), Role::Admin),
        security.client(&addrs.join(","), Role::Reader),
    );
    let (admin, client): (Client, Client) = match clients {
        (Ok(admin), Ok(reader)) => (admin, reader),
        (Err(error), _) | (_, Err(error)) => {
            tracing::warn!(%error, "no client to finish the cron workload");
            return;
        }
    };
    for name in names {
        while Instant::now() < deadline {
            let mut stub = admin.schedules_stub();
            let request = v1::PauseScheduleRequest { name: name.clone() };
            if matches!(tokio::time::timeout(CALL_LIMIT, stub.pause(request)).await, Ok(Ok(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let queue = COMMAND_QUEUE.to_string();
    while Instant::now() < deadline {
        let open = match tokio::time::timeout(CALL_LIMIT, client.stats(Some(queue.clone()), false))
            .await
        {
            Ok(Ok(stats)) => stats
                .queues
                .iter()
                .filter(|q| q.queue == queue)
                .map(|q| q.ready + q.delayed + q.claimed)
                .sum::<u64>(),
            _ => u64::MAX,
        };
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for name in names {
        for _ in 0..5 {
            if read_schedule(history, &client, name).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
