//! Goal: SIGKILL of the leader in the middle of a steady enqueue/claim/ack
//! load loses nothing and breaks no lease guarantee; a new leader takes
//! over and writes succeed again; the killed node restarts on its data
//! directory and catches up (issue 3 acceptance; SPEC §7 guarantees 1-3).
//!
//! Method: eight clients, each connected to all three addresses (starting
//! at different ones), loop: enqueue one job under a unique idempotency
//! key, claim up to two jobs with a 3 s lease, ack what they got — except
//! every tenth grant, which they hold back and ack 5 s later, after it has
//! lapsed and (usually) been redelivered to someone else, so superseded
//! tokens and redeliveries are part of every run. Every operation and its
//! answer is recorded (the load is `load.rs`, the rules checked are in
//! `history.rs`). Once 200 acks are in, SIGKILL the leader and probe with
//! small writes to the two survivors: the time from the kill to the first
//! successful write is the failover time. The load must then make progress
//! again (200 more acks), and some lease must lapse under the new leader
//! and be granted again — the new leader's lease grace (docs/safety.md)
//! holds that back up to 5 s, so on a fast machine the load could otherwise
//! end before any redelivery and the lease checks would compare nothing.
//! Restart the killed node on its data directory and wait until it has
//! applied what the leader had committed. Stop the load, work the queue
//! off, wait for equal digests on all three nodes, and check the records
//! against every job of the queue.

use std::time::Duration;

use anyhow::Result;
use leasehold_proto::v1;
use tokio::time::Instant;

use super::super::support::{
    CLUSTER_CONVERGE_TIMEOUT, Check, Cluster, Sandbox, deadline_in, job, phase, wait_until,
};
use super::cluster_slot;
use super::load::{self, Load};

const CLIENTS: usize = 8;
/// Acks before the kill, so the load is steady when it comes.
const ACKS_BEFORE_KILL: u64 = 200;
/// Acks after the first successful write, to show the load goes on.
const ACKS_AFTER_FAILOVER: u64 = 200;
/// Bound on the failover time in this debug build on a shared machine. The
/// issue's target (1.5 s median) is the benchmark's business; this only
/// catches a cluster that does not recover.
const FAILOVER_WITHIN: Duration = Duration::from_secs(10);
/// Deadline of one probe write after the kill.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on the wait for a redelivery under the new leader: its lease
/// grace (5 s), then a held-back lease lapsing (3 s) and being swept.
const REDELIVERY_WITHIN: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_sigkill_under_load_loses_nothing() -> Result<()> {
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("cluster-failover")?;
    sandbox.run(Duration::from_secs(150), story(&sandbox)).await
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a three-node cluster");
    let mut cluster = Cluster::start(sandbox, 3).await?;
    let first = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    let old_leader = first.leader;
    let survivors: Vec<u64> = cluster.ids().into_iter().filter(|id| *id != old_leader).collect();

    phase("start 8 load clients, each connected to all three nodes");
    let load = Load::start(&cluster, CLIENTS)?;
    load.wait_acks(ACKS_BEFORE_KILL, Duration::from_secs(60)).await?;

    phase("SIGKILL the leader");
    let killed_at = Instant::now();
    cluster.node_mut(old_leader)?.kill()?;
    eprintln!("killed leader {old_leader} (term {}) with {} acks in", first.term, load.acked());

    phase("probe the survivors until a write succeeds");
    let probes: Vec<_> =
        survivors.iter().map(|id| cluster.node(*id)?.stub()).collect::<Result<_>>()?;
    let mut attempt = 0_usize;
    let failover =
        wait_until("a write to succeed after the kill", deadline_in(FAILOVER_WITHIN), || {
            attempt += 1;
            let mut stub = probes[attempt % probes.len()].clone();
            async move {
                let request = v1::EnqueueRequest { jobs: vec![job("probe", b"failover")] };
                match tokio::time::timeout(PROBE_TIMEOUT, stub.enqueue(request)).await {
                    Ok(Ok(_)) => Ok(Check::Done(killed_at.elapsed())),
                    Ok(Err(status)) => {
                        Ok(Check::NotYet(format!("{:?}: {}", status.code(), status.message())))
                    }
                    Err(_) => Ok(Check::NotYet("no answer within 1 s".to_string())),
                }
            }
        })
        .await?;
    let new_leader = cluster.wait_leader_among(&survivors, Duration::from_secs(10)).await?;
    let failover_ms = failover.as_millis();
    eprintln!(
        "FAILOVER: {failover_ms} ms from SIGKILL of leader {old_leader} to a write; new leader {new_leader}"
    );

    phase("the load makes progress again");
    let redelivered_before = load.redelivered();
    load.wait_acks(load.acked() + ACKS_AFTER_FAILOVER, Duration::from_secs(60)).await?;

    phase("a lease lapsed under the new leader is granted again");
    load.wait_redelivered(redelivered_before + 1, REDELIVERY_WITHIN).await?;

    phase("restart the killed node on its data directory; it catches up under load");
    cluster.restart(sandbox, old_leader).await?;
    cluster.wait_caught_up(old_leader, Duration::from_secs(60)).await?;

    phase("stop the load and collect every client's record");
    let mut history = load.stop().await?;

    phase("work the queue off: claim and ack until nothing is ready or claimed");
    load::work_off(&cluster, CLIENTS, &mut history).await?;

    phase("all three nodes converge: equal digests at equal applied index");
    let converged = cluster.wait_converged(CLUSTER_CONVERGE_TIMEOUT).await?;
    eprintln!("converged after the restart: {converged:?}");

    phase("check the records against every job of the queue");
    load::check(&cluster, &history).await?;
    Ok(())
}
