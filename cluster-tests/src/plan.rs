//! One seed → one plan: the cluster size, the workload's shape and every
//! fault round, decided before the run starts and written to `plan.json`.
//! `--replay plan.json` runs the same plan again. Timing on a real machine
//! is not reproducible, so a replay repeats the same faults against the same
//! workload, not the same interleaving; targets that depend on the cluster's
//! state (the leader, a follower) are chosen when the fault is injected and
//! recorded in the history.

use std::path::Path;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Version of the plan format; a replay refuses other versions.
pub const PLAN_VERSION: u32 = 1;

/// Which checkers are enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// A quorum is kept through every fault: safety checkers, and liveness
    /// (every job ends acked or dead, replicas reach the same index).
    SafetyLiveness,
    /// Anything goes (a majority may die): only safety is enforced.
    SafetyOnly,
}

impl Mode {
    /// Whether liveness anomalies fail the run.
    pub fn enforces_liveness(self) -> bool {
        self == Mode::SafetyLiveness
    }

    /// The name used in summaries.
    pub fn name(self) -> &'static str {
        match self {
            Mode::SafetyLiveness => "safety+liveness",
            Mode::SafetyOnly => "safety-only",
        }
    }
}

/// A run profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// A few minutes: the five core fault kinds, bounded operation counts.
    Quick,
    /// About an hour: every fault kind, many rounds.
    Soak,
}

impl Profile {
    /// The name used in file names and summaries.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Quick => "quick",
            Profile::Soak => "soak",
        }
    }
}

/// Which node(s) a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// The current leader.
    Leader,
    /// One follower, chosen when the fault is injected.
    Follower,
    /// A given node.
    Node(u64),
    /// A majority including the leader (safety-only).
    Majority,
}

/// One fault. Every fault holds for the round's `hold_ms` and is then healed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Fault {
    /// SIGKILL; restarted at heal.
    Kill {
        /// Who.
        target: Target,
    },
    /// SIGTERM (the node drains and exits); restarted at heal.
    Terminate {
        /// Who.
        target: Target,
    },
    /// SIGSTOP; SIGCONT at heal.
    Pause {
        /// Who.
        target: Target,
    },
    /// The target is cut from every other node, both ways (clients still
    /// reach it: it must refuse to serve without a quorum).
    Isolate {
        /// Who.
        target: Target,
    },
    /// Messages from `from` to `to` are lost; `to` still reaches `from`.
    OneWay {
        /// The sender whose messages are lost.
        from: Target,
        /// The receiver.
        to: Target,
    },
    /// Every node sees the bridge node, but the others do not see each other.
    Bridge {
        /// The node both sides reach.
        bridge: Target,
    },
    /// Every node↔node link is delayed with jitter.
    Delay {
        /// Fixed part.
        base_ms: u64,
        /// Random extra.
        jitter_ms: u64,
    },
    /// Everything sent to the target by its peers is held, then delivered
    /// late at heal (stale votes and appends arrive after the fact).
    HoldRelease {
        /// Who.
        target: Target,
    },
    /// Every peer connection is reset, and new ones refused, for the hold.
    ResetLinks,
    /// The target's clock steps by `offset_ms` (ahead or behind; beyond the
    /// enforced bound it must stand aside, within it nothing changes).
    ClockBump {
        /// Who.
        target: Target,
        /// The jump (may be negative).
        offset_ms: i64,
    },
    /// The target's clock flips between `+offset_ms` and 0 every `period_ms`.
    ClockStrobe {
        /// Who.
        target: Target,
        /// The swing.
        offset_ms: i64,
        /// Half a cycle.
        period_ms: u64,
    },
    /// The target's clock runs at `rate` times real time.
    ClockDrift {
        /// Who.
        target: Target,
        /// 1.0 = real time.
        rate: f64,
    },
    /// Leadership moves between clocks that each agree with the cluster but
    /// not with each other: the leader's clock steps `offset_ms` behind, a
    /// holder claims jobs with a `lease_ttl_ms` lease (longer than a new
    /// term's lease grace), the leader is killed, and whichever node leads
    /// next steps `offset_ms` ahead while the third drifts at `drift_rate`.
    /// Within the bound no lease may be cut short by more than the bound,
    /// which a new leader's sweep ensures by honouring earlier terms'
    /// leases the bound past their expiry.
    ClockHandover {
        /// How far behind (old leader) and ahead (new leader), within the bound.
        offset_ms: i64,
        /// The holder's lease.
        lease_ttl_ms: u64,
        /// The third node's clock rate (1.0 = real time).
        drift_rate: f64,
    },
    /// Every durable write of the target fails like EIO (Raft stops there);
    /// at heal the node is killed and restarted.
    StoreFault {
        /// Who.
        target: Target,
    },
    /// SIGTERM: the node drains and exits; the harness reads the leases it
    /// still holds right after it exited and again a lease TTL and a sweep
    /// later, then restarts it at once.
    Drain {
        /// Who.
        target: Target,
    },
    /// Every node in turn: drain, wait for the exit, restart, wait until it
    /// serves again (a rolling restart).
    RollingDrain,
    /// Client connections to the target (the workload's, through its
    /// proxy) are blackholed, reset or delayed; node↔node links pass.
    ClientLinks {
        /// Whose proxy.
        target: Target,
        /// What happens to client bytes.
        mode: ClientLinkMode,
    },
    /// Everything the target node sends back to clients (through its
    /// proxy) is delayed by `delay_ms`: claim answers arrive after the
    /// lease they grant has lapsed. Requests, and node↔node links, pass.
    LateReplies {
        /// Whose proxy.
        target: Target,
        /// How late (longer than the workload's lease TTL).
        delay_ms: u64,
    },
    /// The target's `journal_lease` gate flag is turned off (the whole pool
    /// moves to the bus path once its advert is seen); on again at heal.
    GateFlip {
        /// Whose flag.
        target: Target,
    },
    /// Everything the target sends its peers is lost (its adverts among
    /// it: the proxies relay TLS streams and cannot single adverts out),
    /// while what they send it passes; then its `journal_lease` flag is
    /// turned off behind the cut. The target hears the others and decides
    /// the bus; they hear nothing new from it and decide by its last
    /// advert (the journal) until that is older than the nodes'
    /// `advert_stale_after_ms`, then the bus. Held past that: views of the
    /// peers differ for the whole round. Healed: links pass, flag on.
    AdvertLoss {
        /// The node whose messages are lost (a follower: a leader whose
        /// appends are lost is simply deposed).
        target: Target,
    },
    /// The target is killed, removed from the membership and its data dir
    /// wiped; at heal it starts again as a fresh node that `--join`s the
    /// leader. While it is out, the others hold its advert until it goes
    /// stale; as it joins, each node hears it at its own moment (heard by
    /// some, not yet by others) and its own registry starts empty.
    Rejoin {
        /// Who.
        target: Target,
    },
    /// The target's data dir (a size-limited tmpfs) is filled with a
    /// ballast file until writes fail with ENOSPC; at heal the ballast is
    /// removed, and the node is restarted if it did not recover by itself.
    DiskFull {
        /// Who.
        target: Target,
    },
}

/// What a client-link fault does to client bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientLinkMode {
    /// Swallowed silently, both ways.
    Blackhole,
    /// Connections reset, new ones refused.
    Reset,
    /// Delayed by a few hundred ms with jitter.
    Delay,
}

impl Fault {
    /// The fault's kind name, as the summary counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Kill { .. } => "kill",
            Fault::Terminate { .. } => "terminate",
            Fault::Pause { .. } => "pause",
            Fault::Isolate { .. } => "isolate",
            Fault::OneWay { .. } => "one-way",
            Fault::Bridge { .. } => "bridge",
            Fault::Delay { .. } => "delay",
            Fault::HoldRelease { .. } => "hold-release",
            Fault::ResetLinks => "reset-links",
            Fault::ClockBump { .. } => "clock-bump",
            Fault::ClockStrobe { .. } => "clock-strobe",
            Fault::ClockDrift { .. } => "clock-drift",
            Fault::ClockHandover { .. } => "clock-handover",
            Fault::LateReplies { .. } => "late-replies",
            Fault::StoreFault { .. } => "store-fault",
            Fault::Drain { .. } => "drain",
            Fault::RollingDrain => "rolling-drain",
            Fault::ClientLinks { .. } => "client-links",
            Fault::DiskFull { .. } => "disk-full",
            Fault::GateFlip { .. } => "gate-flip",
            Fault::AdvertLoss { .. } => "advert-loss",
            Fault::Rejoin { .. } => "rejoin",
        }
    }

    /// How long after injection one node's clock is off by more than
    /// `bound_ms` (so it must stand aside while the others serve), for a
    /// fault that skews one node's clock beyond the bound within the round;
    /// `None` for every other fault. A step is beyond at once; a drift
    /// once it has run that far off.
    pub fn beyond_bound_after_ms(&self, bound_ms: u64, hold_ms: u64) -> Option<u64> {
        let single = |target: &Target| !matches!(target, Target::Majority);
        match self {
            Fault::ClockBump { target, offset_ms }
                if single(target) && offset_ms.unsigned_abs() > bound_ms =>
            {
                Some(0)
            }
            Fault::ClockDrift { target, rate } if single(target) && rate.is_finite() => {
                let per_ms = (rate - 1.0).abs();
                if per_ms <= 0.0 {
                    return None;
                }
                let after_ms = (bound_ms as f64 / per_ms).ceil();
                // Beyond with time to spare for standing aside.
                (after_ms + 3_000.0 < hold_ms as f64).then_some(after_ms as u64)
            }
            _ => None,
        }
    }

    /// Whether this is one node's clock stepped by less than `bound_ms`,
    /// with [`WITHIN_MARGIN_MS`] to spare for the measurement's
    /// uncertainty: a step that must change nothing.
    pub fn within_bound(&self, bound_ms: u64) -> bool {
        matches!(self, Fault::ClockBump { target, offset_ms }
            if !matches!(target, Target::Majority)
                && *offset_ms != 0
                && offset_ms.unsigned_abs() + WITHIN_MARGIN_MS <= bound_ms)
    }
}

impl Fault {
    /// Whether a checker's expectation depends on this kind of round (a
    /// disk filled, a drain, a gate flip, a clock beyond the bound): such a
    /// round runs even after the fault phase's budget is spent, since
    /// skipping it would fail its checker as vacuous on a slow machine.
    pub fn feeds_expectation(&self, bound_ms: u64, hold_ms: u64) -> bool {
        matches!(self, Fault::DiskFull { .. } | Fault::RollingDrain | Fault::GateFlip { .. })
            || self.beyond_bound_after_ms(bound_ms, hold_ms).is_some()
    }
}

/// How far inside the bound a step must stay to count as within it: half
/// an advert round trip on loopback is a millisecond, a busy machine's
/// scheduling adds tens; a hundred is ample.
pub const WITHIN_MARGIN_MS: u64 = 100;

/// One fault round: inject, hold, heal, wait for a write to succeed, settle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Round {
    /// The fault.
    pub fault: Fault,
    /// How long it holds.
    pub hold_ms: u64,
    /// Quiet time after recovery before the next round.
    pub settle_ms: u64,
}

/// The workload's shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadPlan {
    /// Producer processes.
    pub producers: u32,
    /// Worker processes (each may spawn zombies).
    pub workers: u32,
    /// Most jobs each producer enqueues.
    pub jobs_per_producer: u32,
    /// Pause between a producer's enqueues.
    pub enqueue_interval_ms: u64,
    /// Poison jobs per thousand (always nacked; must end dead).
    pub poison_per_mille: u32,
    /// Attempts of a normal job.
    pub max_attempts: u32,
    /// Attempts of a poison job.
    pub poison_max_attempts: u32,
    /// Lease TTL asked by workers (cluster time).
    pub lease_ttl_ms: u64,
    /// Most jobs one claim asks for.
    pub claim_max: u32,
    /// Grants a worker abandons to a zombie (sleeps past the TTL, then
    /// writes, refreshes and acks with its stale token), per thousand.
    pub zombie_per_mille: u32,
    /// Grants nacked, per thousand.
    pub nack_per_mille: u32,
    /// Grants released, per thousand.
    pub release_per_mille: u32,
    /// Grants refreshed before the ack, per thousand.
    pub refresh_per_mille: u32,
    /// Most zombies one worker keeps at once.
    pub zombies_per_worker: u32,
}

/// Which exercised-path counters this plan must hit (a run that hits none
/// of what it should is vacuous and fails).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectations {
    /// Some ack, nack, release or refresh was refused for a stale token.
    pub stale_tokens_refused: bool,
    /// Some worker still running found its lease had lapsed.
    pub leases_expired_under_live_worker: bool,
    /// Some job was granted more than once.
    pub redeliveries: bool,
    /// The sink refused some write.
    pub sink_refusals: bool,
    /// Some poison job ended dead.
    pub poison_dead: bool,
    /// The plan drives cron schedules: ticks must fire and run, and some
    /// cron job must run more than once (redelivered after a lapse or a
    /// drain's release).
    #[serde(default)]
    pub cron: bool,
    /// The plan drains nodes: some drained node must have held a lease when
    /// its drain began.
    #[serde(default)]
    pub drains: bool,
    /// The plan fills a disk: some write must have been answered while a
    /// data dir was full.
    #[serde(default)]
    pub disk_full: bool,
    /// The plan flips gate flags: some flip must happen and some tick must
    /// run on the bus path.
    #[serde(default)]
    pub gate: bool,
    /// The plan puts one node's clock beyond the bound: some such round
    /// must have been checked, with a write served during it.
    #[serde(default)]
    pub clock: bool,
}

/// One cron schedule the workload puts. Its command appends a `start` and
/// an `end` line (schedule, bucket, node, token, job, attempt, path) to the
/// run's execution log, sleeping `run_ms` between them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronSchedulePlan {
    /// Schedule name.
    pub name: String,
    /// Ticks every this many seconds (a 6-field cron on the seconds).
    pub period_s: u64,
    /// "coalesce", "skip" or "all".
    pub catchup: String,
    /// "allow" or "skip".
    pub overlap: String,
    /// How long each run takes.
    pub run_ms: u64,
    /// The lease TTL of its jobs.
    pub lease_ttl_ms: u64,
}

impl CronSchedulePlan {
    /// The 6-field cron expression of the period.
    pub fn cron(&self) -> String {
        if self.period_s <= 1 {
            "* * * * * *".to_string()
        } else {
            format!("*/{} * * * * *", self.period_s)
        }
    }
}

/// The cron workload.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CronPlan {
    /// The schedules.
    pub schedules: Vec<CronSchedulePlan>,
    /// How often each schedule's tick records are read.
    pub poll_interval_ms: u64,
}

/// The node's own default of `max_clock_offset_ms` (a plan that does not
/// set it runs nodes with this bound).
pub const DEFAULT_CLOCK_BOUND_MS: u64 = 500;

/// Settings written to every node's config file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTuning {
    /// How long running commands may finish when a node drains.
    pub drain_grace_ms: u64,
    /// How often the leader looks for lapsed leases (unset: the node's
    /// default, 1 s). Finer than the default so that a lease taken back
    /// early shows in real time by less than a sweep's wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_interval_ms: Option<u64>,
    /// The enforced clock bound (unset: the node's default, 500 ms); the
    /// checkers judge real-time lease timing by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_clock_offset_ms: Option<u64>,
    /// How old a peer's advert may be before the gate stops trusting it
    /// (unset: the node's default, 30 s). Shorter, so an advert-loss round
    /// outlasts it within the quick profile's budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advert_stale_after_ms: Option<u64>,
}

impl Default for NodeTuning {
    fn default() -> Self {
        NodeTuning {
            drain_grace_ms: 30_000,
            sweep_interval_ms: None,
            max_clock_offset_ms: None,
            advert_stale_after_ms: None,
        }
    }
}

impl NodeTuning {
    /// The clock bound the nodes of this plan enforce.
    pub fn clock_bound_ms(&self) -> u64 {
        self.max_clock_offset_ms.unwrap_or(DEFAULT_CLOCK_BOUND_MS)
    }

    /// The node config file's text.
    pub fn config_text(&self) -> String {
        let mut text = format!("drain_grace_ms = {}\n", self.drain_grace_ms);
        if let Some(ms) = self.sweep_interval_ms {
            text.push_str(&format!("sweep_interval_ms = {ms}\n"));
        }
        if let Some(ms) = self.max_clock_offset_ms {
            text.push_str(&format!("max_clock_offset_ms = {ms}\n"));
        }
        if let Some(ms) = self.advert_stale_after_ms {
            text.push_str(&format!("advert_stale_after_ms = {ms}\n"));
        }
        text
    }
}

/// Everything a run does, decided by the seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Format version.
    pub version: u32,
    /// The seed everything derives from.
    pub seed: u64,
    /// The profile that made the plan.
    pub profile: Profile,
    /// Enforcement mode.
    pub mode: Mode,
    /// Cluster size.
    pub nodes: u64,
    /// The queue the workload uses.
    pub queue: String,
    /// The workload.
    pub workload: WorkloadPlan,
    /// Time with no fault before the first round.
    pub warmup_ms: u64,
    /// The fault rounds, in order.
    pub rounds: Vec<Round>,
    /// How long after heal a write may take to succeed again.
    pub recovery_timeout_ms: u64,
    /// How long the final drain (well-behaved workers, no faults) may take.
    pub drain_timeout_ms: u64,
    /// Wall-clock budget of the fault phase; rounds left when it is spent
    /// are skipped (and counted).
    pub fault_phase_budget_ms: u64,
    /// Counters this plan must hit.
    pub expect: Expectations,
    /// The cron workload (none in older plans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<CronPlan>,
    /// Node settings.
    #[serde(default)]
    pub tuning: NodeTuning,
    /// Size of each node's tmpfs data dir, MiB, when the plan fills disks
    /// (0: data dirs on the ordinary disk).
    #[serde(default)]
    pub disk_mb: u64,
}

impl Plan {
    /// The plan a seed makes for a profile and mode.
    pub fn generate(seed: u64, profile: Profile, mode: Mode) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let nodes = 3;
        let (workload, rounds, warmup_ms, budget_ms, drain_ms) = match profile {
            Profile::Quick => {
                let workload = WorkloadPlan {
                    producers: 2,
                    workers: 3,
                    // Enough to keep writing through every round (about 3 minutes
                    // of faults at one job every ~0.3 s each).
                    jobs_per_producer: 600,
                    // Slower than the workers drain, so a redelivered job
                    // is not stuck behind a backlog and zombies meet their
                    // successors.
                    enqueue_interval_ms: 300,
                    poison_per_mille: 40,
                    max_attempts: 10,
                    poison_max_attempts: 3,
                    lease_ttl_ms: 2_000,
                    claim_max: 2,
                    zombie_per_mille: 120,
                    nack_per_mille: 80,
                    release_per_mille: 40,
                    refresh_per_mille: 150,
                    zombies_per_worker: 3,
                };
                // 150 s for the thirteen rounds before advert-loss and
                // rejoin, about 30 s more for those two.
                (workload, quick_rounds(&mut rng, mode), 3_000, 185_000, 60_000)
            }
            Profile::Soak => {
                let workload = WorkloadPlan {
                    producers: 3,
                    workers: 4,
                    jobs_per_producer: 12_000,
                    enqueue_interval_ms: 400,
                    poison_per_mille: 30,
                    max_attempts: 12,
                    poison_max_attempts: 3,
                    lease_ttl_ms: 2_000,
                    claim_max: 3,
                    zombie_per_mille: 100,
                    nack_per_mille: 80,
                    release_per_mille: 40,
                    refresh_per_mille: 150,
                    zombies_per_worker: 3,
                };
                let budget_ms = 55 * 60 * 1_000;
                (workload, soak_rounds(&mut rng, mode, budget_ms), 5_000, budget_ms, 180_000)
            }
        };
        let mut plan = Plan {
            version: PLAN_VERSION,
            seed,
            profile,
            mode,
            nodes,
            queue: "chaos".to_string(),
            workload,
            warmup_ms,
            rounds,
            recovery_timeout_ms: 60_000,
            drain_timeout_ms: drain_ms,
            fault_phase_budget_ms: budget_ms,
            expect: Expectations {
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
            },
            cron: Some(cron_plan()),
            tuning: NodeTuning {
                // Shorter than the slow schedule's runs, so a drain cuts
                // some off and must release their leases.
                drain_grace_ms: 1_000,
                sweep_interval_ms: Some(100),
                max_clock_offset_ms: Some(DEFAULT_CLOCK_BOUND_MS),
                advert_stale_after_ms: Some(ADVERT_STALE_AFTER_MS),
            },
            disk_mb: 128,
        };
        plan.fit_expectations();
        plan
    }

    /// Shortens a soak plan to about `minutes` of faults (for a trial soak).
    pub fn limit_fault_phase(&mut self, minutes: u64) {
        let budget_ms = minutes * 60 * 1_000;
        self.fault_phase_budget_ms = budget_ms;
        let mut spent = 0;
        self.rounds.retain(|round| {
            spent += round.hold_ms + round.settle_ms + 2_000;
            spent <= budget_ms
        });
        self.fit_expectations();
    }

    /// Keeps only the rounds of the given fault kinds (a focused run: one
    /// kind of fault against a planted bug, say); answers how many are left.
    pub fn keep_only(&mut self, kinds: &[String]) -> usize {
        self.rounds.retain(|round| kinds.iter().any(|kind| kind == round.fault.kind()));
        self.fit_expectations();
        self.rounds.len()
    }

    /// The checkers that need a kind of round only expect it if the plan
    /// has one.
    fn fit_expectations(&mut self) {
        let has = |kinds: &[&str]| self.rounds.iter().any(|r| kinds.contains(&r.fault.kind()));
        self.expect.drains &= has(&["drain", "rolling-drain"]);
        self.expect.disk_full &= has(&["disk-full"]);
        self.expect.gate &= has(&["gate-flip", "advert-loss"]);
        let bound_ms = self.tuning.clock_bound_ms();
        self.expect.clock &= self
            .rounds
            .iter()
            .any(|r| r.fault.beyond_bound_after_ms(bound_ms, r.hold_ms).is_some());
    }

    /// The most a run of this plan may take in all: every phase at its
    /// limit, plus a margin for starting and stopping the cluster. The
    /// harness abandons (and fails) a run that exceeds it.
    pub fn time_limit_ms(&self) -> u64 {
        let rounds: u64 = self
            .rounds
            .iter()
            .map(|r| r.hold_ms + r.settle_ms + self.recovery_timeout_ms + 30_000)
            .sum();
        let fault_phase =
            rounds.min(self.fault_phase_budget_ms + 120_000 + self.recovery_timeout_ms);
        self.warmup_ms + fault_phase + self.drain_timeout_ms + 10 * 60 * 1_000
    }

    /// Reads a plan file; refuses other format versions.
    pub fn read(path: &Path) -> anyhow::Result<Plan> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading plan {}: {e}", path.display()))?;
        let plan: Plan = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("parsing plan {}: {e}", path.display()))?;
        if plan.version != PLAN_VERSION {
            anyhow::bail!(
                "plan {} has format version {}, this harness reads {PLAN_VERSION}",
                path.display(),
                plan.version
            );
        }
        Ok(plan)
    }

    /// Writes the plan as pretty JSON.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n")
            .map_err(|e| anyhow::anyhow!("writing plan {}: {e}", path.display()))
    }
}

/// The cron workload of both profiles: two every-second schedules (catch-up
/// coalesce and all, overlap allowed, short runs) and a slow one (every two
/// seconds, runs longer than a tick and than the drain grace, overlap skip).
fn cron_plan() -> CronPlan {
    let schedule = |name: &str, period_s, catchup: &str, overlap: &str, run_ms| CronSchedulePlan {
        name: name.to_string(),
        period_s,
        catchup: catchup.to_string(),
        overlap: overlap.to_string(),
        run_ms,
        lease_ttl_ms: 3_000,
    };
    CronPlan {
        schedules: vec![
            schedule("tick-coalesce", 1, "coalesce", "allow", 150),
            schedule("tick-all", 1, "all", "allow", 150),
            schedule("slow-skip", 2, "coalesce", "skip", 2_500),
        ],
        poll_interval_ms: 3_000,
    }
}

/// The quick profile: the core kinds (leader SIGKILL + restart, SIGSTOP
/// pause, minority partition, one-way cut, the leader's clock stepped
/// minutes ahead, beyond the bound, so it must stand aside) and the
/// workload's (rolling drain, full disk, client links, gate flip, claim
/// answers that arrive after their lease lapsed, and a leader change
/// between clocks spread within the bound) in a seeded order, plus one
/// seeded extra. Safety-only adds a majority kill.
fn quick_rounds(rng: &mut StdRng, mode: Mode) -> Vec<Round> {
    let one_way = if rng.gen_bool(0.5) {
        Fault::OneWay { from: Target::Leader, to: Target::Follower }
    } else {
        Fault::OneWay { from: Target::Follower, to: Target::Leader }
    };
    let mut faults = vec![
        Fault::Kill { target: Target::Leader },
        Fault::Pause { target: Target::Leader },
        Fault::Isolate {
            target: if rng.gen_bool(0.5) { Target::Leader } else { Target::Follower },
        },
        one_way,
        // Minutes ahead: far beyond the bound, and within the bus's
        // ten-minute window so no other check is tripped by it.
        Fault::ClockBump { target: Target::Leader, offset_ms: rng.gen_range(120_000..=300_000) },
        Fault::RollingDrain,
        Fault::DiskFull { target: Target::Leader },
        Fault::GateFlip { target: Target::Follower },
        // Views of the peers that differ: never-both must hold for the
        // pool, not only per node (SPEC §7.8).
        Fault::AdvertLoss { target: Target::Follower },
        Fault::Rejoin { target: Target::Follower },
        Fault::ClientLinks {
            target: Target::Leader,
            mode: if rng.gen_bool(0.5) { ClientLinkMode::Blackhole } else { ClientLinkMode::Reset },
        },
        Fault::LateReplies {
            target: if rng.gen_bool(0.5) { Target::Leader } else { Target::Follower },
            delay_ms: rng.gen_range(2_500..=3_000),
        },
        Fault::ClockHandover {
            offset_ms: HANDOVER_OFFSET_MS,
            lease_ttl_ms: HANDOVER_LEASE_TTL_MS,
            drift_rate: if rng.gen_bool(0.5) { 1.002 } else { 0.998 },
        },
        // A sub-second step within the bound, ahead or behind: nothing may
        // change (no node unready).
        Fault::ClockBump {
            target: if rng.gen_bool(0.5) { Target::Leader } else { Target::Follower },
            offset_ms: if rng.gen_bool(0.5) { WITHIN_STEP_MS } else { -WITHIN_STEP_MS },
        },
    ];
    if mode == Mode::SafetyOnly {
        faults.push(Fault::Kill { target: Target::Majority });
    }
    faults.shuffle(rng);
    let extra = match rng.gen_range(0..3) {
        0 => Fault::HoldRelease { target: Target::Leader },
        1 => Fault::Delay { base_ms: 30, jitter_ms: 40 },
        _ => Fault::ResetLinks,
    };
    faults.push(extra);
    faults
        .into_iter()
        .map(|fault| {
            let hold_ms = match &fault {
                // Long enough for the others to elect and serve while the
                // skewed leader stands aside, and to see that it did.
                Fault::ClockBump { offset_ms, .. }
                    if offset_ms.unsigned_abs() > DEFAULT_CLOCK_BOUND_MS =>
                {
                    rng.gen_range(6_000..=7_000)
                }
                // A few advert intervals: a step that would make a node
                // unready shows within two.
                Fault::ClockBump { .. } => 3_000,
                // Until the holder's lease has lapsed under the new leader.
                Fault::ClockHandover { lease_ttl_ms, .. } => *lease_ttl_ms,
                Fault::AdvertLoss { .. } | Fault::Rejoin { .. } => least_hold_ms(&fault),
                _ => rng.gen_range(4_000..=6_000),
            };
            Round { fault, hold_ms, settle_ms: 3_000 }
        })
        .collect()
}

/// How far quick's within-bound step moves a clock: sub-second, and
/// [`WITHIN_MARGIN_MS`] or more inside the default bound.
pub const WITHIN_STEP_MS: i64 = 300;

/// How far the clocks of a handover round's old and new leaders are set
/// behind and ahead: each within the default bound of every other node,
/// but more than the bound apart from each other.
pub const HANDOVER_OFFSET_MS: i64 = 400;
/// The handover holder's lease: it must outlast a new term's 5 s lease
/// grace (plus the election), or the grace, not the clock bound, decides
/// when it is taken back.
pub const HANDOVER_LEASE_TTL_MS: u64 = 9_000;

/// The soak profile: every kind, random targets, until the budget is spent.
fn soak_rounds(rng: &mut StdRng, mode: Mode, budget_ms: u64) -> Vec<Round> {
    let mut rounds = Vec::new();
    let mut spent = 0;
    while spent < budget_ms {
        let fault = soak_fault(rng, mode);
        let hold_ms = rng.gen_range(3_000..=15_000).max(least_hold_ms(&fault));
        let settle_ms = rng.gen_range(2_000..=6_000);
        // Recovery is not free: count a couple of seconds for it.
        spent += hold_ms + settle_ms + 2_000;
        rounds.push(Round { fault, hold_ms, settle_ms });
    }
    rounds
}

/// The shortest hold a fault needs to show what it tests: a clock beyond
/// the bound, time for the others to elect and serve; a handover, the
/// holder's lease.
fn least_hold_ms(fault: &Fault) -> u64 {
    match fault {
        Fault::ClockBump { offset_ms, .. } if offset_ms.unsigned_abs() > DEFAULT_CLOCK_BOUND_MS => {
            6_000
        }
        Fault::ClockHandover { lease_ttl_ms, .. } => *lease_ttl_ms,
        // Past the point where the others stop trusting the target's last
        // advert, with a few ticks decided on each side of it.
        Fault::AdvertLoss { .. } => ADVERT_STALE_AFTER_MS + 4_000,
        // Out long enough for its last advert to go stale everywhere.
        Fault::Rejoin { .. } => ADVERT_STALE_AFTER_MS + 1_000,
        _ => 0,
    }
}

/// The nodes' `advert_stale_after_ms` in generated plans: past three advert
/// intervals (the node refuses less), short enough that an advert-loss
/// round outlasts it within quick's budget.
pub const ADVERT_STALE_AFTER_MS: u64 = 8_000;

fn any_target(rng: &mut StdRng) -> Target {
    match rng.gen_range(0..3) {
        0 => Target::Leader,
        1 => Target::Follower,
        _ => Target::Node(rng.gen_range(1..=3)),
    }
}

fn soak_fault(rng: &mut StdRng, mode: Mode) -> Fault {
    let kinds = if mode == Mode::SafetyOnly { 24 } else { 22 };
    match rng.gen_range(0..kinds) {
        0 => Fault::Kill { target: any_target(rng) },
        1 => Fault::Terminate { target: any_target(rng) },
        2 => Fault::Pause { target: any_target(rng) },
        3 => Fault::Isolate { target: any_target(rng) },
        4 => {
            let leader_first = rng.gen_bool(0.5);
            let (from, to) = if leader_first {
                (Target::Leader, Target::Follower)
            } else {
                (Target::Follower, Target::Leader)
            };
            Fault::OneWay { from, to }
        }
        5 => Fault::Bridge { bridge: any_target(rng) },
        6 => Fault::Delay { base_ms: rng.gen_range(5..=80), jitter_ms: rng.gen_range(0..=80) },
        7 => Fault::HoldRelease { target: any_target(rng) },
        8 => Fault::ResetLinks,
        9 => {
            // Beyond the bound by minutes or seconds, or within it.
            let magnitude = match rng.gen_range(0..3) {
                0 => rng.gen_range(60_000..=300_000),
                1 => rng.gen_range(1_000..=8_000),
                _ => rng.gen_range(100..=300),
            };
            let offset_ms = if rng.gen_bool(0.6) { magnitude } else { -magnitude };
            Fault::ClockBump { target: any_target(rng), offset_ms }
        }
        10 => Fault::ClockStrobe {
            target: any_target(rng),
            offset_ms: rng.gen_range(500..=4_000),
            period_ms: rng.gen_range(200..=1_000),
        },
        11 => Fault::ClockDrift {
            target: any_target(rng),
            rate: match rng.gen_range(0..4) {
                0 => 2.0,
                1 => 0.5,
                2 => 1.002,
                _ => 0.998,
            },
        },
        12 => Fault::StoreFault {
            target: if rng.gen_bool(0.5) { Target::Follower } else { Target::Leader },
        },
        13 => Fault::Drain { target: any_target(rng) },
        14 => Fault::RollingDrain,
        15 => Fault::ClientLinks {
            target: any_target(rng),
            mode: match rng.gen_range(0..3) {
                0 => ClientLinkMode::Blackhole,
                1 => ClientLinkMode::Reset,
                _ => ClientLinkMode::Delay,
            },
        },
        16 => Fault::DiskFull { target: any_target(rng) },
        17 => Fault::GateFlip { target: any_target(rng) },
        18 => {
            Fault::LateReplies { target: any_target(rng), delay_ms: rng.gen_range(2_500..=4_000) }
        }
        19 => Fault::ClockHandover {
            offset_ms: HANDOVER_OFFSET_MS,
            lease_ttl_ms: HANDOVER_LEASE_TTL_MS,
            drift_rate: if rng.gen_bool(0.5) { 1.002 } else { 0.998 },
        },
        20 => Fault::AdvertLoss {
            target: if rng.gen_bool(0.8) { Target::Follower } else { any_target(rng) },
        },
        21 => Fault::Rejoin {
            target: if rng.gen_bool(0.5) { Target::Follower } else { any_target(rng) },
        },
        22 => Fault::Kill { target: Target::Majority },
        _ => Fault::StoreFault { target: Target::Majority },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn a_seed_makes_one_plan() {
        let a = Plan::generate(42, Profile::Quick, Mode::SafetyLiveness);
        let b = Plan::generate(42, Profile::Quick, Mode::SafetyLiveness);
        assert_eq!(a, b);
        let c = Plan::generate(43, Profile::Quick, Mode::SafetyLiveness);
        assert_ne!(a.rounds, c.rounds);
    }

    #[test]
    fn quick_covers_the_core_kinds_and_keeps_a_quorum() {
        for seed in 0..20 {
            let plan = Plan::generate(seed, Profile::Quick, Mode::SafetyLiveness);
            let kinds: Vec<&str> = plan.rounds.iter().map(|r| r.fault.kind()).collect();
            for kind in [
                "kill",
                "pause",
                "isolate",
                "one-way",
                "clock-bump",
                "rolling-drain",
                "disk-full",
                "client-links",
                "gate-flip",
                "late-replies",
                "clock-handover",
                "advert-loss",
                "rejoin",
            ] {
                assert!(kinds.contains(&kind), "seed {seed}: {kinds:?}");
            }
            // The advert loss outlasts the nodes' trust in the last advert.
            let stale_ms = plan.tuning.advert_stale_after_ms.unwrap_or(30_000);
            assert!(
                plan.rounds
                    .iter()
                    .any(|r| matches!(r.fault, Fault::AdvertLoss { .. }) && r.hold_ms > stale_ms)
            );
            // The leader's clock goes minutes ahead, beyond the bound, for
            // long enough to see it stand aside and the others serve.
            let bound_ms = plan.tuning.clock_bound_ms();
            assert!(plan.rounds.iter().any(|r| matches!(
                r.fault,
                Fault::ClockBump { target: Target::Leader, offset_ms } if offset_ms >= 120_000
            )
                && r.fault.beyond_bound_after_ms(bound_ms, r.hold_ms) == Some(0)
                && r.hold_ms >= 6_000));
            assert!(plan.expect.clock);
            // And a sub-second step within it, which must change nothing.
            assert!(plan.rounds.iter().any(|r| r.fault.within_bound(bound_ms)
                && matches!(r.fault, Fault::ClockBump { offset_ms, .. } if offset_ms.abs() < 1_000)));
            // The handover's clocks agree with the bound one by one but not
            // with each other, and its hold outlasts the holder's lease.
            for round in &plan.rounds {
                if let Fault::ClockHandover { offset_ms, lease_ttl_ms, .. } = round.fault {
                    assert!(offset_ms.unsigned_abs() < bound_ms);
                    assert!(2 * offset_ms.unsigned_abs() > bound_ms);
                    assert!(round.hold_ms >= lease_ttl_ms);
                }
            }
            assert!(
                !plan.rounds.iter().any(|r| matches!(
                    r.fault,
                    Fault::Kill { target: Target::Majority }
                        | Fault::StoreFault { target: Target::Majority }
                )),
                "safety+liveness keeps a quorum"
            );
        }
    }

    #[test]
    fn beyond_the_bound_means_off_by_more_than_it() {
        let bump = |offset_ms| Fault::ClockBump { target: Target::Follower, offset_ms };
        assert_eq!(bump(-180_000).beyond_bound_after_ms(500, 6_000), Some(0));
        assert_eq!(bump(501).beyond_bound_after_ms(500, 6_000), Some(0));
        assert_eq!(bump(300).beyond_bound_after_ms(500, 6_000), None);
        assert_eq!(bump(-500).beyond_bound_after_ms(500, 6_000), None);
        let drift = |rate| Fault::ClockDrift { target: Target::Leader, rate };
        // Twice real time is 500 ms off after 500 ms; 0.2 % takes 250 s.
        assert_eq!(drift(2.0).beyond_bound_after_ms(500, 6_000), Some(500));
        assert_eq!(drift(0.5).beyond_bound_after_ms(500, 6_000), Some(1_000));
        assert_eq!(drift(1.002).beyond_bound_after_ms(500, 6_000), None);
        assert_eq!(drift(1.0).beyond_bound_after_ms(500, 6_000), None);
        let handover =
            Fault::ClockHandover { offset_ms: 400, lease_ttl_ms: 9_000, drift_rate: 1.002 };
        assert_eq!(handover.beyond_bound_after_ms(500, 9_000), None);
        // Within: inside the bound with the margin to spare, one node.
        assert!(bump(300).within_bound(500) && bump(-400).within_bound(500));
        assert!(!bump(401).within_bound(500) && !bump(0).within_bound(500));
        assert!(!bump(-180_000).within_bound(500) && !handover.within_bound(500));
        let majority = Fault::ClockBump { target: Target::Majority, offset_ms: 300 };
        assert!(!majority.within_bound(500));
    }

    #[test]
    fn a_plan_can_be_narrowed_to_some_kinds() {
        let mut plan = Plan::generate(5, Profile::Quick, Mode::SafetyLiveness);
        assert_eq!(plan.keep_only(&["clock-handover".to_string()]), 1);
        assert!(!plan.expect.drains && !plan.expect.disk_full && !plan.expect.gate);
        assert!(!plan.expect.clock, "a handover keeps every clock within the bound");
        let mut plan = Plan::generate(5, Profile::Quick, Mode::SafetyLiveness);
        // Beyond the bound and within it, and the kill.
        assert_eq!(plan.keep_only(&["clock-bump".to_string(), "kill".to_string()]), 3);
        assert!(plan.expect.clock);
    }

    #[test]
    fn node_settings_reach_the_config_file() {
        let plan = Plan::generate(5, Profile::Quick, Mode::SafetyLiveness);
        let text = plan.tuning.config_text();
        assert!(text.contains("drain_grace_ms = 1000\n"), "{text}");
        assert!(text.contains("sweep_interval_ms = 100\n"), "{text}");
        assert!(text.contains("max_clock_offset_ms = 500\n"), "{text}");
        // An older plan's nodes run with the node's own defaults.
        assert_eq!(NodeTuning::default().config_text(), "drain_grace_ms = 30000\n");
        assert_eq!(NodeTuning::default().clock_bound_ms(), DEFAULT_CLOCK_BOUND_MS);
    }

    #[test]
    fn the_rounds_that_checkers_expect_outlive_the_budget() {
        let plan = Plan::generate(7, Profile::Quick, Mode::SafetyLiveness);
        let bound = plan.tuning.clock_bound_ms();
        let kept: BTreeSet<&str> = plan
            .rounds
            .iter()
            .filter(|r| r.fault.feeds_expectation(bound, r.hold_ms))
            .map(|r| r.fault.kind())
            .collect();
        assert_eq!(
            kept,
            BTreeSet::from(["clock-bump", "disk-full", "gate-flip", "rolling-drain"]),
            "{:?}",
            plan.rounds
        );
        let within = Fault::ClockBump { target: Target::Leader, offset_ms: WITHIN_STEP_MS };
        assert!(!within.feeds_expectation(bound, 5_000), "a step within the bound is not needed");
        assert!(!Fault::Kill { target: Target::Leader }.feeds_expectation(bound, 5_000));
    }

    #[test]
    fn soak_fills_its_budget_and_can_be_shortened() {
        let mut plan = Plan::generate(7, Profile::Soak, Mode::SafetyOnly);
        let total: u64 = plan.rounds.iter().map(|r| r.hold_ms + r.settle_ms + 2_000).sum();
        assert!(total >= plan.fault_phase_budget_ms);
        assert!(plan.rounds.len() > 100);
        plan.limit_fault_phase(5);
        let total: u64 = plan.rounds.iter().map(|r| r.hold_ms + r.settle_ms + 2_000).sum();
        assert!(total <= 5 * 60 * 1_000);
        assert!(!plan.rounds.is_empty());
    }

    #[test]
    fn plans_round_trip_through_json() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("plan.json");
        let plan = Plan::generate(9, Profile::Soak, Mode::SafetyLiveness);
        plan.write(&path)?;
        assert_eq!(Plan::read(&path)?, plan);
        // A plan written before the cron, drain and disk fields still reads.
        let mut older = serde_json::to_value(&plan)?;
        if let Some(fields) = older.as_object_mut() {
            fields.remove("cron");
            fields.remove("tuning");
            fields.remove("disk_mb");
        }
        if let Some(expect) = older.get_mut("expect").and_then(|e| e.as_object_mut()) {
            expect.remove("cron");
        }
        let older: Plan = serde_json::from_value(older)?;
        assert_eq!(older.cron, None);
        assert!(!older.expect.cron);
        // A plan written before the clock work reads with no clock
        // expectation and the nodes' own sweep and bound.
        let mut before_clocks =
            serde_json::to_value(Plan::generate(9, Profile::Quick, Mode::SafetyLiveness))?;
        if let Some(expect) = before_clocks.get_mut("expect").and_then(|e| e.as_object_mut()) {
            expect.remove("clock");
        }
        if let Some(tuning) = before_clocks.get_mut("tuning").and_then(|e| e.as_object_mut()) {
            tuning.remove("sweep_interval_ms");
            tuning.remove("max_clock_offset_ms");
        }
        let before_clocks: Plan = serde_json::from_value(before_clocks)?;
        assert!(!before_clocks.expect.clock);
        assert_eq!(before_clocks.tuning.sweep_interval_ms, None);
        assert_eq!(before_clocks.tuning.clock_bound_ms(), DEFAULT_CLOCK_BOUND_MS);
        let mut old = plan;
        old.version = 0;
        old.write(&path)?;
        assert!(Plan::read(&path).is_err());
        Ok(())
    }
}
