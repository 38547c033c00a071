//! The run's summary: faults by kind, operations checked, anomalies per
//! invariant, recovery time after each heal, and the exercised-path
//! counters that keep a green run from being vacuous.
//!
//! A checker passes when it found no anomaly that the mode enforces *and*
//! the paths it guards were actually exercised: a plan that should have
//! produced stale tokens, lapsed leases, redeliveries, sink refusals and
//! dead poison jobs, but produced none, proves nothing, so the checker
//! guarding that path fails as vacuous. The closing line is
//! `N passed, N failed` over the checkers.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::checkers::{Anomaly, RunRecord, Severity, Verdict};
use crate::history::{OpFunction, OpType, pairs};
use crate::plan::{Expectations, Mode};
use crate::workload::POISON_PREFIX;

/// How often the risky paths were taken.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Acks, nacks and releases refused for a stale token, plus leases a
    /// refresh reported lost.
    pub stale_tokens_refused: u64,
    /// Leases whose holder was still acting on them after the job had been
    /// granted to someone else.
    pub leases_expired_under_live_worker: u64,
    /// Grants beyond a job's first.
    pub redeliveries: u64,
    /// Sink writes refused.
    pub sink_refusals: u64,
    /// Poison jobs that ended dead.
    pub poison_dead: u64,
    /// Jobs that ended acked.
    pub jobs_acked: u64,
    /// Jobs that ended dead.
    pub jobs_dead: u64,
    /// The cron workload's paths.
    #[serde(default)]
    pub cron: crate::checkers::cron_once::CronCounters,
    /// Claims run on the journal path.
    #[serde(default)]
    pub journal_claims: u64,
    /// Claims run on the bus path.
    #[serde(default)]
    pub bus_claims: u64,
    /// Gate flag flips.
    #[serde(default)]
    pub gate_flips: u64,
    /// The drains' paths.
    #[serde(default)]
    pub drain: crate::checkers::drained_leases::DrainCounters,
    /// The disk-full rounds' paths.
    #[serde(default)]
    pub disk: crate::checkers::durable_acks::DiskCounters,
    /// The clock rounds' paths.
    #[serde(default)]
    pub clock: crate::checkers::clock_bound::ClockCounters,
    /// Lease hand-overs judged in real time against the clock bound.
    #[serde(default)]
    pub real_time: crate::checkers::lease_exclusivity::RealTimeCounters,
    /// Harness calls a node refused as unauthenticated or not permitted:
    /// the harness gives each client the role its calls need, so anything
    /// but zero is a harness (or auth) bug to look at.
    #[serde(default)]
    pub auth_refused: u64,
}

/// Computes the counters from the record.
pub fn count(run: &RunRecord) -> Counters {
    let mut counters = Counters::default();
    let all = pairs(&run.history);
    // job → [(token, grant completion ns)]
    let mut grants: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    // (job, token) → latest invocation of any op by its holder
    let mut last_use: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for pair in &all {
        let completion = pair.completion;
        match pair.invoke.f {
            OpFunction::Claim => {
                if let Some(done) = completion.filter(|c| c.kind == OpType::Ok) {
                    for lease in &done.value.leases {
                        grants.entry(lease.job_id).or_default().push((lease.token, done.time_ns));
                    }
                }
            }
            OpFunction::Ack | OpFunction::Nack | OpFunction::Release => {
                if let Some(done) = completion
                    && done.kind == OpType::Fail
                    && done.value.code.as_deref() == Some("FailedPrecondition")
                {
                    counters.stale_tokens_refused += 1;
                }
            }
            OpFunction::Refresh => {
                if let Some(done) = completion.filter(|c| c.kind == OpType::Ok) {
                    counters.stale_tokens_refused += done.value.lost.len() as u64;
                }
            }
            _ => {}
        }
        if let Some(done) = completion
            && matches!(done.value.code.as_deref(), Some("PermissionDenied" | "Unauthenticated"))
        {
            counters.auth_refused += 1;
        }
        if matches!(
            pair.invoke.f,
            OpFunction::Ack
                | OpFunction::Nack
                | OpFunction::Release
                | OpFunction::Refresh
                | OpFunction::SinkWrite
        ) && let (Some(job), Some(token)) = (pair.invoke.value.job_id, pair.invoke.value.token)
        {
            let entry = last_use.entry((job, token)).or_insert(0);
            *entry = (*entry).max(pair.invoke.time_ns);
        }
    }
    for (job, job_grants) in &grants {
        let mut tokens: Vec<(u64, u64)> = job_grants.clone();
        tokens.sort_unstable();
        tokens.dedup_by_key(|g| g.0);
        counters.redeliveries += tokens.len().saturating_sub(1) as u64;
        for window in tokens.windows(2) {
            let [(old, _), (_, next_granted_ns)] = window else { continue };
            if last_use.get(&(*job, *old)).is_some_and(|used| used > next_granted_ns) {
                counters.leases_expired_under_live_worker += 1;
            }
        }
    }
    counters.sink_refusals = run.sink.iter().filter(|w| !w.accepted).count() as u64;
    counters.cron = crate::checkers::cron_once::counters(run);
    (counters.journal_claims, counters.bus_claims, counters.gate_flips) =
        crate::checkers::journal_once::counters(run);
    counters.drain = crate::checkers::drained_leases::counters(run);
    counters.disk = crate::checkers::durable_acks::counters(run);
    counters.clock = crate::checkers::clock_bound::counters(run);
    counters.real_time = crate::checkers::lease_exclusivity::counters(run);
    for job in run.final_jobs.iter().flatten() {
        match job.state.as_str() {
            "acked" => counters.jobs_acked += 1,
            "dead" => {
                counters.jobs_dead += 1;
                if job.value.starts_with(POISON_PREFIX) {
                    counters.poison_dead += 1;
                }
            }
            _ => {}
        }
    }
    counters
}

/// Which counters each checker needs to be non-vacuous.
pub fn vacuity(checker: &str, expect: &Expectations, counters: &Counters) -> Vec<String> {
    let mut missing = Vec::new();
    let mut need = |wanted: bool, value: u64, name: &str| {
        if wanted && value == 0 {
            missing.push(format!("{name} = 0"));
        }
    };
    match checker {
        "lease_exclusivity" => need(
            expect.leases_expired_under_live_worker,
            counters.leases_expired_under_live_worker,
            "leases expired under a live worker",
        ),
        "fencing" => need(expect.sink_refusals, counters.sink_refusals, "sink refusals"),
        "no_redelivery" => {
            need(
                expect.stale_tokens_refused,
                counters.stale_tokens_refused,
                "stale tokens refused",
            );
            need(expect.redeliveries, counters.redeliveries, "redeliveries");
        }
        "none_lost" => {
            need(expect.poison_dead, counters.poison_dead, "poison jobs dead");
            need(true, counters.jobs_acked, "jobs acked");
        }
        "cron_once" => {
            need(expect.cron, counters.cron.fires, "ticks fired");
            need(expect.cron, counters.cron.runs_finished, "cron runs finished");
            need(expect.cron, counters.cron.reruns, "cron jobs re-run");
        }
        "journal_once" => {
            need(expect.cron, counters.journal_claims, "claims on the journal path");
            need(expect.gate, counters.gate_flips, "gate flips");
            need(expect.gate, counters.bus_claims, "claims on the bus path");
        }
        "drained_leases" => {
            need(expect.drains, counters.drain.drains, "drains");
            need(expect.drains, counters.drain.held_at_start, "leases held when a drain began");
        }
        "durable_acks" => {
            need(expect.disk_full, counters.disk.full_rounds, "disks filled to ENOSPC");
            need(
                expect.disk_full,
                counters.disk.ok_writes,
                "writes acknowledged while a disk was full",
            );
        }
        "clock_bound" => need(
            expect.clock,
            counters.clock.beyond_rounds,
            "clock rounds beyond the bound judged with a write served",
        ),
        _ => {}
    }
    missing
}

/// Whether the plan drives what a checker checks (a checker the plan does
/// not feed checks nothing, and passes as not applicable).
pub fn applies(checker: &str, expect: &Expectations) -> bool {
    match checker {
        "cron_once" | "journal_once" => expect.cron,
        "drained_leases" => expect.drains,
        "durable_acks" => expect.disk_full,
        "clock_bound" => expect.clock,
        _ => true,
    }
}

/// Recovery after one heal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovery {
    /// Plan round.
    pub round: usize,
    /// Fault kind.
    pub fault: String,
    /// Nodes it hit.
    pub nodes: Vec<u64>,
    /// Time from heal until a write succeeded; `None`: none within the limit.
    pub recovery_ms: Option<u64>,
}

/// One checker's line in the summary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckerResult {
    /// The checker.
    pub name: String,
    /// Items checked.
    pub checked: u64,
    /// Safety anomalies.
    pub safety: usize,
    /// Liveness anomalies.
    pub liveness: usize,
    /// Counters that should be non-zero and are not.
    pub vacuous: Vec<String>,
    /// Passed in this mode.
    pub passed: bool,
    /// The anomalies (capped).
    pub anomalies: Vec<Anomaly>,
}

/// Everything about one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The seed.
    pub seed: u64,
    /// The profile.
    pub profile: String,
    /// The mode.
    pub mode: Mode,
    /// Cluster size.
    pub nodes: u64,
    /// The run directory (relative to where the harness ran).
    pub run_dir: String,
    /// Wall time of the run.
    pub duration_ms: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Planned rounds skipped because the fault-phase budget was spent.
    pub rounds_skipped: u64,
    /// Operations by function and outcome.
    pub operations: BTreeMap<String, BTreeMap<String, u64>>,
    /// Operations in all (completions).
    pub operations_total: u64,
    /// Recovery after each heal.
    pub recoveries: Vec<Recovery>,
    /// Exercised-path counters.
    pub counters: Counters,
    /// Proxy totals.
    pub network: BTreeMap<String, u64>,
    /// Node starts (restarts included).
    pub node_starts: BTreeMap<u64, u32>,
    /// How the nodes and the harness's clients authenticated, and the role
    /// checks made before the workload.
    #[serde(default)]
    pub security: String,
    /// Per checker.
    pub checkers: Vec<CheckerResult>,
    /// Checkers passed.
    pub passed: usize,
    /// Checkers failed.
    pub failed: usize,
}

/// Inputs of [`Summary::build`] that are not in the record.
pub struct RunFacts {
    /// The seed.
    pub seed: u64,
    /// The profile name.
    pub profile: String,
    /// The mode.
    pub mode: Mode,
    /// What the plan expects to exercise.
    pub expect: Expectations,
    /// The run directory.
    pub run_dir: String,
    /// Wall time.
    pub duration_ms: u64,
    /// Rounds skipped.
    pub rounds_skipped: u64,
    /// Recoveries.
    pub recoveries: Vec<Recovery>,
    /// Proxy totals.
    pub network: BTreeMap<String, u64>,
    /// Node starts.
    pub node_starts: BTreeMap<u64, u32>,
    /// The recovery limit, for the message when a heal never recovered.
    pub recovery_timeout_ms: u64,
    /// How the nodes and clients authenticated (empty when not known).
    pub security: String,
}

impl Summary {
    /// Builds the summary from the record and the checkers' verdicts.
    pub fn build(run: &RunRecord, mut verdicts: Vec<Verdict>, facts: RunFacts) -> Summary {
        let counters = count(run);
        let mut faults = BTreeMap::new();
        let mut operations: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        let mut operations_total = 0;
        for pair in pairs(&run.history) {
            let f = pair.invoke.f;
            if f == OpFunction::Fault && pair.outcome() == OpType::Ok {
                let kind = pair.invoke.value.fault.clone().unwrap_or_default();
                *faults.entry(kind).or_insert(0) += 1;
            }
            if matches!(f, OpFunction::Fault | OpFunction::Heal | OpFunction::Probe) {
                continue;
            }
            operations_total += 1;
            let name = serde_json::to_value(f)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let outcome = match pair.outcome() {
                OpType::Ok => "ok",
                OpType::Fail => "fail",
                _ => "info",
            };
            *operations.entry(name).or_default().entry(outcome.to_string()).or_insert(0) += 1;
        }
        // A heal after which no write succeeded is a liveness failure; it
        // shows in none_lost, whose jobs could not have finished either.
        for recovery in &facts.recoveries {
            if recovery.recovery_ms.is_none()
                && let Some(verdict) = verdicts.iter_mut().find(|v| v.checker == "none_lost")
            {
                verdict.anomalies.push(Anomaly::liveness(
                    format!(
                        "no write succeeded within {} ms after healing round {} ({})",
                        facts.recovery_timeout_ms, recovery.round, recovery.fault
                    ),
                    Vec::new(),
                ));
            }
        }
        let mut checkers = Vec::new();
        for verdict in verdicts {
            let safety =
                verdict.anomalies.iter().filter(|a| a.severity == Severity::Safety).count();
            let liveness = verdict.anomalies.len() - safety;
            let mut vacuous = vacuity(&verdict.checker, &facts.expect, &counters);
            if verdict.checked == 0 && applies(&verdict.checker, &facts.expect) {
                vacuous.push("nothing checked".to_string());
            }
            let passed = verdict.failures(facts.mode) == 0 && vacuous.is_empty();
            checkers.push(CheckerResult {
                name: verdict.checker,
                checked: verdict.checked,
                safety,
                liveness,
                vacuous,
                passed,
                anomalies: verdict.anomalies,
            });
        }
        let passed = checkers.iter().filter(|c| c.passed).count();
        let failed = checkers.len() - passed;
        Summary {
            seed: facts.seed,
            profile: facts.profile,
            mode: facts.mode,
            nodes: run.nodes,
            run_dir: facts.run_dir,
            duration_ms: facts.duration_ms,
            faults,
            rounds_skipped: facts.rounds_skipped,
            operations,
            operations_total,
            recoveries: facts.recoveries,
            counters,
            network: facts.network,
            node_starts: facts.node_starts,
            security: facts.security,
            checkers,
            passed,
            failed,
        }
    }

    /// The summary as text; the last line is `N passed, N failed`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "leasehold chaos run: seed {} profile {} mode {} nodes {} ({:.1} s)",
            self.seed,
            self.profile,
            self.mode.name(),
            self.nodes,
            self.duration_ms as f64 / 1_000.0
        );
        let _ = writeln!(out, "run dir: {}", self.run_dir);
        let faults: Vec<String> = self.faults.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            out,
            "faults: {}{}",
            if faults.is_empty() { "none".to_string() } else { faults.join(" ") },
            if self.rounds_skipped > 0 {
                format!(" ({} planned rounds skipped: budget spent)", self.rounds_skipped)
            } else {
                String::new()
            }
        );
        let ops: Vec<String> = self
            .operations
            .iter()
            .map(|(f, outcomes)| {
                let parts: Vec<String> = outcomes.iter().map(|(o, n)| format!("{o} {n}")).collect();
                format!("{f} [{}]", parts.join(", "))
            })
            .collect();
        let _ = writeln!(out, "operations: {} ({})", self.operations_total, ops.join("; "));
        let _ = writeln!(out, "recovery after heal (time until a write succeeds):");
        for r in &self.recoveries {
            let time = match r.recovery_ms {
                Some(ms) => format!("{ms} ms"),
                None => "NOT RECOVERED".to_string(),
            };
            let _ =
                writeln!(out, "  round {:>3} {:<13} nodes {:?}: {time}", r.round, r.fault, r.nodes);
        }
        let c = &self.counters;
        let _ = writeln!(
            out,
            "exercised: stale tokens refused {}, leases expired under a live worker {}, redeliveries {}, sink refusals {}, poison jobs dead {} (jobs acked {}, dead {})",
            c.stale_tokens_refused,
            c.leases_expired_under_live_worker,
            c.redeliveries,
            c.sink_refusals,
            c.poison_dead,
            c.jobs_acked,
            c.jobs_dead
        );
        let _ = writeln!(
            out,
            "exercised (cron): ticks fired {}, ticks coalesced {} (overstated {}), overlap skips {}, runs finished {}, jobs re-run {}, runs cut off {}; claims on the journal path {}, on the bus path {}, gate flips {}",
            c.cron.fires,
            c.cron.ticks_coalesced,
            c.cron.skips_overstated,
            c.cron.overlap_skips,
            c.cron.runs_finished,
            c.cron.reruns,
            c.cron.runs_cut_off,
            c.journal_claims,
            c.bus_claims,
            c.gate_flips
        );
        let _ = writeln!(
            out,
            "exercised (drain, disk): drains {} ({} clean), leases held when a drain began {}, left at exit {}; disks filled {}, writes while full: ok {}, failed or unknown {}",
            c.drain.drains,
            c.drain.clean,
            c.drain.held_at_start,
            c.drain.left_at_exit,
            c.disk.full_rounds,
            c.disk.ok_writes,
            c.disk.refused_writes
        );
        let closest =
            c.real_time.closest_ms.map_or_else(|| "none".to_string(), |ms| format!("{ms:+} ms"));
        let _ = writeln!(
            out,
            "exercised (clocks): rounds beyond the bound {} (reads standing aside {}), within it {}; hand-overs judged in real time {}, closest to the floor {}, inside the holder's own deadline {}",
            c.clock.beyond_rounds,
            c.clock.stood_aside,
            c.clock.within_rounds,
            c.real_time.handovers,
            closest,
            c.real_time.inside_holder_deadline
        );
        let network: Vec<String> = self.network.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "proxies: {}", network.join(", "));
        let starts: Vec<String> =
            self.node_starts.iter().map(|(id, n)| format!("n{id}={n}")).collect();
        let _ = writeln!(out, "node starts: {}", starts.join(" "));
        let _ = writeln!(
            out,
            "security: {}; harness calls refused by auth {}",
            if self.security.is_empty() { "not recorded" } else { self.security.as_str() },
            c.auth_refused
        );
        let _ = writeln!(
            out,
            "{:<18} {:<6} {:>8} {:>7} {:>9}  note",
            "checker", "result", "checked", "safety", "liveness"
        );
        for checker in &self.checkers {
            let note = if checker.vacuous.is_empty() {
                String::new()
            } else {
                format!("vacuous: {}", checker.vacuous.join(", "))
            };
            let _ = writeln!(
                out,
                "{:<18} {:<6} {:>8} {:>7} {:>9}  {note}",
                checker.name,
                if checker.passed { "pass" } else { "FAIL" },
                checker.checked,
                checker.safety,
                checker.liveness
            );
        }
        for checker in &self.checkers {
            for anomaly in checker.anomalies.iter().take(10) {
                let _ = writeln!(
                    out,
                    "  {} {:?}: {} (evidence {:?})",
                    checker.name, anomaly.severity, anomaly.message, anomaly.evidence
                );
            }
        }
        let _ = write!(out, "{} passed, {} failed", self.passed, self.failed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::FinalJob;
    use crate::history::test_support::{Builder, lease};
    use crate::sink::SinkWrite;

    fn facts(expect: Expectations) -> RunFacts {
        RunFacts {
            seed: 1,
            profile: "quick".to_string(),
            mode: Mode::SafetyLiveness,
            expect,
            run_dir: "run".to_string(),
            duration_ms: 1,
            rounds_skipped: 0,
            recoveries: Vec::new(),
            network: BTreeMap::new(),
            node_starts: BTreeMap::new(),
            recovery_timeout_ms: 1,
            security: String::new(),
        }
    }

    #[test]
    fn counters_see_the_risky_paths() {
        let mut b = Builder::default();
        b.claim(10, 20, "w1", vec![lease(1, 5, "w1", 1_000, 3_000)])
            .claim(30, 40, "w2", vec![lease(1, 6, "w2", 3_000, 5_000)])
            .token_op(50, 60, "w1/zombie-1", OpFunction::Ack, 1, 5, OpType::Fail)
            .token_op(70, 80, "w2", OpFunction::Ack, 1, 6, OpType::Ok);
        let run = RunRecord {
            history: b.ops.clone(),
            sink: vec![SinkWrite {
                seq: 0,
                time_ns: 55,
                job_id: 1,
                token: 5,
                worker: "w1".to_string(),
                accepted: false,
            }],
            final_jobs: Some(vec![FinalJob {
                id: 2,
                value: "poison-x".to_string(),
                state: "dead".to_string(),
                attempts: 3,
                lease_token: None,
                key: None,
            }]),
            ..RunRecord::default()
        };
        let counters = count(&run);
        assert_eq!(counters.stale_tokens_refused, 1);
        assert_eq!(counters.leases_expired_under_live_worker, 1);
        assert_eq!(counters.redeliveries, 1);
        assert_eq!(counters.sink_refusals, 1);
        assert_eq!(counters.poison_dead, 1);
    }

    #[test]
    fn a_quiet_run_is_vacuous_and_fails() {
        let run = RunRecord::default();
        let verdicts: Vec<Verdict> = crate::checkers::all().iter().map(|c| c.check(&run)).collect();
        let expect = Expectations {
            stale_tokens_refused: true,
            leases_expired_under_live_worker: true,
            redeliveries: true,
            sink_refusals: true,
            poison_dead: true,
            cron: true,
            drains: true,
            disk_full: true,
            gate: true,
            clock: true,
        };
        let summary = Summary::build(&run, verdicts.clone(), facts(expect));
        assert_eq!(summary.passed, 0);
        assert_eq!(summary.failed, 10);
        let text = summary.render();
        assert_eq!(text.lines().last(), Some("0 passed, 10 failed"));
        assert!(text.contains("vacuous"));
        // A plan without cron, drains or disk faults does not hold those
        // checkers to anything: they pass as not applicable.
        let queue_only = Expectations { stale_tokens_refused: true, ..Expectations::default() };
        let summary = Summary::build(&run, verdicts, facts(queue_only));
        // clock_bound among them: no clock round beyond the bound.
        assert_eq!(summary.passed, 5);
    }
}
