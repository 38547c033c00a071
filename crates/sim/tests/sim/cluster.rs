//! Goal: a seeded cluster run is reproducible and the cluster survives its
//! faults. Method: run one short plan with every fault (three nodes, a
//! partitioned leader, a crashed and restarted follower, a clock set far
//! ahead on a follower, a power cut of the whole cluster, a workload of
//! enqueue, claim, ack, release, zombie acks and sweeps) twice on the same
//! seed and compare the histories line by line and by digest; check the
//! faults happened, writes committed, every replica ended at the same
//! applied index with the same state, and the chaos harness's checkers
//! find no safety anomaly in the simulated history.

use leasehold_cluster_tests::execlog::{ExecEvent, RunPhase};
use leasehold_cluster_tests::history::{OpFunction, OpType};
use leasehold_sim::cluster::{Plan, Run, run};

fn assert_healthy(plan: &Plan, record: &Run) {
    let text = record.history.join("\n");
    let mut needles = vec!["enqueue via=", "claim via=", "ack via=", "settle", "healed"];
    if plan.partition_leader {
        needles.extend(["partition leader", "repair leader"]);
    }
    if plan.crash_follower || plan.power_cut {
        needles.extend(["crashed", "restarted"]);
    }
    if plan.power_cut {
        needles.push("power cut");
    }
    if plan.clock_jump_ms.is_some() {
        needles.push("jumps");
    }
    if plan.one_way.is_some() {
        needles.extend(["cut one way", "repair one way"]);
    }
    for needle in needles {
        assert!(text.contains(needle), "seed {}: no {needle:?} in\n{text}", plan.seed);
    }
    assert!(text.contains(" ok node="), "seed {}: no write committed in\n{text}", plan.seed);
    assert_eq!(record.finals.len() as u64, plan.nodes, "seed {}: {:?}", plan.seed, record.finals);
    assert_eq!(record.failures(), Vec::<String>::new(), "seed {}", plan.seed);
}

#[test]
fn one_seed_gives_the_same_history_twice_byte_for_byte() -> anyhow::Result<()> {
    // A seed whose history has a stale ack refused (not every seed's has).
    let plan = Plan::every_fault(5);
    let first = run(&plan)?;
    let second = run(&plan)?;
    assert_healthy(&plan, &first);
    let text = first.history.join("\n");
    assert!(
        text.contains("Refused(StaleToken"),
        "seed {}: no stale ack refused in\n{text}",
        plan.seed
    );
    assert_eq!(first.history, second.history, "seed {} is not deterministic", plan.seed);
    assert_eq!(first.ops, second.ops, "seed {} is not deterministic", plan.seed);
    assert_eq!(first.digest(), second.digest());
    assert_eq!(first.finals, second.finals);
    Ok(())
}

#[test]
fn another_seed_gives_another_history() -> anyhow::Result<()> {
    let first = run(&Plan::every_fault(7))?;
    let other = run(&Plan::every_fault(8))?;
    assert_healthy(&Plan::every_fault(8), &other);
    assert_ne!(first.digest(), other.digest(), "the seed does not reach the run");
    Ok(())
}

#[test]
fn the_checkers_see_a_lost_acknowledged_enqueue_in_a_simulated_history() -> anyhow::Result<()> {
    // The checkers are the chaos harness's own; this shows they are fed:
    // drop an acknowledged job from the final read and none_lost must
    // report it as safety.
    let mut record = run(&Plan::every_fault(7))?;
    assert!(record.failures().is_empty());
    let jobs = record.final_jobs.as_mut().ok_or_else(|| anyhow::anyhow!("no final read"))?;
    jobs.remove(0);
    let failures = record.failures();
    assert!(
        failures.iter().any(|f| f.starts_with("none_lost") && f.contains("not in the final state")),
        "{failures:?}"
    );
    Ok(())
}

#[test]
fn the_fencing_checker_judges_the_simulated_sink() -> anyhow::Result<()> {
    // Workers write to the harness's fenced sink before they ack, zombies
    // too: the sink took writes, refused the zombies' stale ones once the
    // job's next holder had written, and fencing judged its log. A log in
    // which the sink took a token lower than one it had taken for the
    // same job must be a safety finding.
    let mut record = run(&Plan::every_fault(7))?;
    assert!(record.failures().is_empty());
    assert!(record.sink.iter().any(|write| write.accepted), "the sink took no write");
    let (job_id, token) = record
        .sink
        .iter()
        .filter(|write| write.accepted && write.token > 1)
        .map(|write| (write.job_id, write.token))
        .next()
        .ok_or_else(|| anyhow::anyhow!("no accepted write with a token above 1"))?;
    let mut stale = record.sink.last().cloned().ok_or_else(|| anyhow::anyhow!("empty sink"))?;
    stale.seq += 1;
    stale.job_id = job_id;
    stale.token = token - 1;
    stale.accepted = true;
    record.sink.push(stale);
    let failures = record.failures();
    assert!(
        failures.iter().any(|f| f.starts_with("fencing") && f.contains("sink accepted token")),
        "{failures:?}"
    );
    Ok(())
}

#[test]
fn a_drained_node_is_judged_by_the_drained_leases_checker() -> anyhow::Result<()> {
    // A drain plan: the node's executor held leases when its drain began,
    // and drained_leases judged its reads. Then a history in which those
    // leases are still held a TTL after the node stopped (as if the node
    // neither gave them back nor did the sweep return them) must be a
    // safety finding.
    let seed = (0..100)
        .find(|seed| Plan::short(*seed).drain && !Plan::short(*seed).partition_leader)
        .ok_or_else(|| anyhow::anyhow!("no drain plan among 100 seeds"))?;
    let mut record = run(&Plan::short(seed))?;
    assert!(record.drained, "seed {seed}: the drain did not happen");
    assert_eq!(record.failures(), Vec::<String>::new(), "seed {seed}");
    let reads: Vec<usize> = (0..record.ops.len())
        .filter(|i| record.ops[*i].f == OpFunction::LeaseRead && record.ops[*i].kind == OpType::Ok)
        .collect();
    let phase = |i: &usize| record.ops[*i].value.phase.clone().unwrap_or_default();
    let before = reads.iter().find(|i| phase(i) == "before").copied();
    let ttl = reads.iter().find(|i| phase(i) == "ttl").copied();
    let (Some(before), Some(ttl)) = (before, ttl) else {
        anyhow::bail!("seed {seed}: no before and ttl reads among {reads:?}");
    };
    let held = record.ops[before].value.leases.clone();
    assert!(!held.is_empty(), "seed {seed}: the drained node held no lease");
    assert!(record.ops[ttl].value.leases.is_empty(), "seed {seed}: leases held a TTL later");
    record.ops[ttl].value.leases = held;
    let failures = record.failures();
    assert!(
        failures.iter().any(|f| f.starts_with("drained_leases") && f.contains("a TTL later")),
        "seed {seed}: {failures:?}"
    );
    Ok(())
}

#[test]
fn a_short_plan_draws_its_faults_from_the_seed() {
    // Over a few dozen seeds every fault is on for some and off for others.
    let plans: Vec<Plan> = (0..40).map(Plan::short).collect();
    let partition = plans.iter().filter(|p| p.partition_leader).count();
    let crash = plans.iter().filter(|p| p.crash_follower).count();
    let cut = plans.iter().filter(|p| p.power_cut).count();
    let jump = plans.iter().filter(|p| p.clock_jump_ms.is_some()).count();
    for (fault, count) in [("partition", partition), ("crash", crash), ("cut", cut), ("jump", jump)]
    {
        assert!(count > 0 && count < plans.len(), "{fault} on {count} of {} plans", plans.len());
    }
    assert_eq!(Plan::short(3), Plan::short(3), "a plan is a function of its seed");
}

#[test]
fn a_clock_handover_plan_grants_a_long_lease_and_outlasts_it() -> anyhow::Result<()> {
    // The hand-over: node 1 (clock behind) grants a long lease, is cut
    // off, and the run lasts until the new leader (clock ahead) has swept
    // it and granted the job again, within the bound it owes the lease.
    let seed = (0..200)
        .find(|seed| Plan::short(*seed).handover)
        .ok_or_else(|| anyhow::anyhow!("no hand-over plan among 200 seeds"))?;
    let plan = Plan::short(seed);
    let record = run(&plan)?;
    assert_healthy(&plan, &record);
    let text = record.history.join("\n");
    assert!(text.contains("handover-claim via="), "seed {seed}: no hand-over claim in\n{text}");
    Ok(())
}

#[test]
fn the_cron_checkers_judge_the_simulated_schedule() -> anyhow::Result<()> {
    // The leader's ticker fires the every-second schedule, the executor
    // runs and acks what fired, and the schedule's records are read: the
    // cron checkers have ticks and runs to judge. A second run of a fired
    // bucket as another job — what a lost bucket guard would do — must be
    // reported as safety.
    let mut record = run(&Plan::every_fault(7))?;
    assert!(record.failures().is_empty(), "{:?}", record.failures());
    let reads = record
        .ops
        .iter()
        .filter(|op| op.f == OpFunction::ScheduleRead && !op.value.ticks.is_empty())
        .count();
    assert!(reads > 0, "no schedule read listed a tick");
    let first = record.runs.first().cloned().ok_or_else(|| anyhow::anyhow!("no cron run"))?;
    assert!(first.bucket > 0, "a run without its bucket: {first:?}");
    for phase in [RunPhase::Start, RunPhase::End] {
        record.runs.push(ExecEvent {
            phase,
            job_id: first.job_id + 1_000,
            token: first.token + 1_000,
            ..first.clone()
        });
    }
    let failures = record.failures();
    assert!(failures.iter().any(|f| f.starts_with("cron_once")), "{failures:?}");
    Ok(())
}
