//! The run's history in the Jepsen style: every operation a client process
//! performs is recorded as an `invoke` and then exactly one completion —
//! `ok` (it happened), `fail` (it certainly did not), or `info` (unknown: a
//! timeout, a lost answer, a retryable error after the write may have been
//! proposed). Times are the host's monotonic clock in nanoseconds since the
//! run began, so ordering between processes is real-time order on this host.
//!
//! The history is kept in memory for the checkers and streamed to
//! `history.jsonl` in the run directory, one operation per line, so a run can
//! be checked again offline (`leasehold-chaos check RUN_DIR`).
//!
//! Each process performs one operation at a time (Jepsen's rule), which is
//! what lets [`pairs`] match a completion to its invocation.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The four kinds of history entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    /// The operation began.
    Invoke,
    /// It took effect, and the answer says how.
    Ok,
    /// It certainly did not take effect.
    Fail,
    /// Unknown whether it took effect.
    Info,
}

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpFunction {
    /// Queue.Enqueue of one job.
    Enqueue,
    /// Queue.Claim; the completion lists the leases granted.
    Claim,
    /// Queue.Refresh of one lease; the completion lists renewed and lost.
    Refresh,
    /// Queue.Ack.
    Ack,
    /// Queue.Nack.
    Nack,
    /// Queue.Release.
    Release,
    /// A write to the fenced sink with the worker's token.
    SinkWrite,
    /// A fault injected by the nemesis (process "nemesis").
    Fault,
    /// The nemesis healing every fault.
    Heal,
    /// A write made only to time recovery after a heal.
    Probe,
    /// Schedules.Get of one schedule; the completion lists its tick records.
    ScheduleRead,
    /// A read of the leases a drained node still holds (process "drainer").
    LeaseRead,
    /// A flip of a node's gate flags (journal_lease, dry-run).
    GateFlip,
    /// A read of one node's own role and clock verdict while a clock fault
    /// holds (process "clock-watch").
    ClockRead,
}

/// One tick record of a schedule, as Schedules.Get reported it.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TickRecord {
    /// The tick's instant, Unix seconds.
    pub bucket: u64,
    /// "fired" or "skipped".
    pub outcome: String,
    /// Fired: the jobs enqueued.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub job_ids: Vec<u64>,
    /// Skipped: overlap, catchup, paused or no_target.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Skipped: how many ticks (ending at `bucket`) the record stands for.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ticks: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One lease as the server described it (a grant or a renewal).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The job.
    pub job_id: u64,
    /// The worker the lease names.
    pub holder: String,
    /// The fencing token.
    pub token: u64,
    /// Raft term of the leader that committed the claim.
    pub epoch: u64,
    /// Cluster time the lease (or its renewal) began, ms.
    pub granted_at_ms: u64,
    /// Cluster time it lapses, ms.
    pub expires_at_ms: u64,
    /// The job's payload (the workload's unique value); grants only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Failed attempts so far; grants only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
}

/// The payload of a history entry. One struct for every function keeps the
/// JSON flat; each function fills the fields it has.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpValue {
    /// The job concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<u64>,
    /// The fencing token presented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The workload's unique value (the job payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Whether the job is a poison job (always nacked, must end dead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poison: Option<bool>,
    /// Enqueue: the idempotency key matched an existing job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
    /// Claim: leases granted; Refresh: leases renewed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leases: Vec<LeaseRecord>,
    /// Refresh: jobs the server says the worker lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<u64>,
    /// Nack: the state the job went to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// fail/info: the gRPC code name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// fail/info: the error text, or a fault's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Fault/Heal: the fault kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// Fault: the nodes it hit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<u64>,
    /// Fault/Heal/Probe: the plan round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<usize>,
    /// ScheduleRead: the schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// ScheduleRead: its tick records, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ticks: Vec<TickRecord>,
    /// Fault (drain): the drained process's exit code (None: killed by a signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// LeaseRead: "exit" (right after a drained node exited) or "ttl" (a
    /// lease TTL and a sweep later); GateFlip: the path now asked for;
    /// Probe: "during" for a write tried while the fault held (none: after
    /// the heal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Claim: how long the node held the call before the claim that
    /// granted these (the node's own measure; the holder's local deadline
    /// counts from the send time plus this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    /// Fault (clock): how long after the injection the target's clock is
    /// off by more than the enforced bound (0: at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beyond_bound_after_ms: Option<u64>,
    /// ClockRead: the node's Raft role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// ClockRead: whether the node judged its own clock skewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_skewed: Option<bool>,
}

/// One history entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Position in the history (0-based).
    pub index: u64,
    /// Host monotonic time since the run began, ns.
    pub time_ns: u64,
    /// The process (a producer, a worker, a zombie, the nemesis).
    pub process: String,
    /// invoke, ok, fail or info.
    #[serde(rename = "type")]
    pub kind: OpType,
    /// What the operation does.
    pub f: OpFunction,
    /// Its arguments or results.
    pub value: OpValue,
}

struct Recorder {
    ops: Vec<Op>,
    file: Option<BufWriter<File>>,
    write_failed: bool,
}

/// A shared, append-only history. Cheap to clone.
#[derive(Clone)]
pub struct History {
    start: Instant,
    inner: Arc<Mutex<Recorder>>,
}

impl History {
    /// An in-memory history (tests).
    pub fn in_memory() -> History {
        History {
            start: Instant::now(),
            inner: Arc::new(Mutex::new(Recorder {
                ops: Vec::new(),
                file: None,
                write_failed: false,
            })),
        }
    }

    /// A history also streamed to `path` as JSON lines.
    pub fn to_file(path: &Path) -> anyhow::Result<History> {
        let file = File::create(path)
            .map_err(|e| anyhow::anyhow!("creating history {}: {e}", path.display()))?;
        Ok(History {
            start: Instant::now(),
            inner: Arc::new(Mutex::new(Recorder {
                ops: Vec::new(),
                file: Some(BufWriter::new(file)),
                write_failed: false,
            })),
        })
    }

    /// Nanoseconds since the run began on the host's monotonic clock.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Appends an entry and answers its index.
    pub fn record(&self, process: &str, kind: OpType, f: OpFunction, value: OpValue) -> u64 {
        let mut recorder = match self.inner.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Take the time under the lock so indexes and times agree in order.
        let time_ns = self.now_ns();
        let index = recorder.ops.len() as u64;
        let op = Op { index, time_ns, process: process.to_string(), kind, f, value };
        if let Some(file) = recorder.file.as_mut() {
            let written = serde_json::to_writer(&mut *file, &op)
                .map_err(std::io::Error::other)
                .and_then(|()| file.write_all(b"\n"));
            if written.is_err() {
                recorder.write_failed = true;
            }
        }
        recorder.ops.push(op);
        index
    }

    /// Records an invocation.
    pub fn invoke(&self, process: &str, f: OpFunction, value: OpValue) -> u64 {
        self.record(process, OpType::Invoke, f, value)
    }

    /// A copy of every entry so far.
    pub fn snapshot(&self) -> Vec<Op> {
        match self.inner.lock() {
            Ok(guard) => guard.ops.clone(),
            Err(poisoned) => poisoned.into_inner().ops.clone(),
        }
    }

    /// Flushes the JSONL stream; fails if any line could not be written.
    pub fn flush(&self) -> anyhow::Result<()> {
        let mut recorder = match self.inner.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(file) = recorder.file.as_mut() {
            file.flush()?;
        }
        if recorder.write_failed {
            anyhow::bail!("some history lines could not be written");
        }
        Ok(())
    }
}

/// Reads a `history.jsonl` back.
pub fn read_jsonl(path: &Path) -> anyhow::Result<Vec<Op>> {
    let file = File::open(path).map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
    let mut ops = Vec::new();
    for (number, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let op: Op = serde_json::from_str(&line)
            .map_err(|e| anyhow::anyhow!("{} line {}: {e}", path.display(), number + 1))?;
        ops.push(op);
    }
    Ok(ops)
}

/// An invocation and its completion (`None` while none was recorded: the run
/// ended with the operation outstanding, which counts as `info`).
#[derive(Clone, Copy, Debug)]
pub struct Pair<'a> {
    /// The invoke entry.
    pub invoke: &'a Op,
    /// The ok, fail or info entry.
    pub completion: Option<&'a Op>,
}

impl Pair<'_> {
    /// The completion's type; an outstanding operation counts as `info`.
    pub fn outcome(&self) -> OpType {
        self.completion.map(|c| c.kind).unwrap_or(OpType::Info)
    }

    /// When the operation completed; outstanding ones never did.
    pub fn completed_ns(&self) -> u64 {
        self.completion.map(|c| c.time_ns).unwrap_or(u64::MAX)
    }
}

/// Matches each invocation with the next completion of the same process.
/// Completions without an open invocation are ignored (they cannot occur in
/// a history this harness writes).
pub fn pairs(ops: &[Op]) -> Vec<Pair<'_>> {
    let mut open: BTreeMap<&str, usize> = BTreeMap::new();
    let mut result: Vec<Pair<'_>> = Vec::new();
    for op in ops {
        match op.kind {
            OpType::Invoke => {
                open.insert(op.process.as_str(), result.len());
                result.push(Pair { invoke: op, completion: None });
            }
            _ => {
                if let Some(position) = open.remove(op.process.as_str())
                    && let Some(pair) = result.get_mut(position)
                {
                    pair.completion = Some(op);
                }
            }
        }
    }
    result
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Builders for small synthetic histories used by the checkers' tests.

    use super::*;

    /// Builds a history with explicit times (ns), one call per entry.
    #[derive(Default)]
    pub struct Builder {
        /// The entries so far.
        pub ops: Vec<Op>,
    }

    impl Builder {
        pub fn op(
            &mut self,
            time_ns: u64,
            process: &str,
            kind: OpType,
            f: OpFunction,
            value: OpValue,
        ) -> &mut Self {
            let index = self.ops.len() as u64;
            self.ops.push(Op { index, time_ns, process: process.to_string(), kind, f, value });
            self
        }

        /// A claim by `process` invoked at `start`, granting `leases` at `end`.
        pub fn claim(
            &mut self,
            start: u64,
            end: u64,
            process: &str,
            leases: Vec<LeaseRecord>,
        ) -> &mut Self {
            self.op(start, process, OpType::Invoke, OpFunction::Claim, OpValue::default());
            self.op(
                end,
                process,
                OpType::Ok,
                OpFunction::Claim,
                OpValue { leases, ..OpValue::default() },
            )
        }

        /// A claim like [`Builder::claim`] whose answer says the node held
        /// it `waited_ms` before granting.
        pub fn claim_waited(
            &mut self,
            start: u64,
            end: u64,
            process: &str,
            waited_ms: u64,
            leases: Vec<LeaseRecord>,
        ) -> &mut Self {
            self.op(start, process, OpType::Invoke, OpFunction::Claim, OpValue::default());
            let value = OpValue { leases, waited_ms: Some(waited_ms), ..OpValue::default() };
            self.op(end, process, OpType::Ok, OpFunction::Claim, value)
        }

        /// An operation on (job, token) with the given outcome.
        #[allow(clippy::too_many_arguments)]
        pub fn token_op(
            &mut self,
            start: u64,
            end: u64,
            process: &str,
            f: OpFunction,
            job_id: u64,
            token: u64,
            outcome: OpType,
        ) -> &mut Self {
            let value = OpValue { job_id: Some(job_id), token: Some(token), ..OpValue::default() };
            self.op(start, process, OpType::Invoke, f, value.clone());
            let code = match outcome {
                OpType::Fail => Some("FailedPrecondition".to_string()),
                _ => None,
            };
            self.op(end, process, outcome, f, OpValue { code, ..value })
        }

        /// A refresh of (job, token) answered with `renewed` and `lost`.
        #[allow(clippy::too_many_arguments)]
        pub fn refresh(
            &mut self,
            start: u64,
            end: u64,
            process: &str,
            job_id: u64,
            token: u64,
            renewed: Vec<LeaseRecord>,
            lost: Vec<u64>,
        ) -> &mut Self {
            let value = OpValue { job_id: Some(job_id), token: Some(token), ..OpValue::default() };
            self.op(start, process, OpType::Invoke, OpFunction::Refresh, value.clone());
            self.op(
                end,
                process,
                OpType::Ok,
                OpFunction::Refresh,
                OpValue { leases: renewed, lost, ..value },
            )
        }

        /// An enqueue of `value` with the given outcome and job id.
        #[allow(clippy::too_many_arguments)]
        pub fn enqueue(
            &mut self,
            start: u64,
            end: u64,
            process: &str,
            value: &str,
            poison: bool,
            outcome: OpType,
            job_id: Option<u64>,
        ) -> &mut Self {
            let invoke = OpValue {
                value: Some(value.to_string()),
                poison: Some(poison),
                ..OpValue::default()
            };
            self.op(start, process, OpType::Invoke, OpFunction::Enqueue, invoke.clone());
            self.op(end, process, outcome, OpFunction::Enqueue, OpValue { job_id, ..invoke })
        }
    }

    /// A lease record.
    pub fn lease(job_id: u64, token: u64, holder: &str, granted: u64, expires: u64) -> LeaseRecord {
        LeaseRecord {
            job_id,
            holder: holder.to_string(),
            token,
            epoch: 1,
            granted_at_ms: granted,
            expires_at_ms: expires,
            value: None,
            attempts: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_through_jsonl() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("history.jsonl");
        let history = History::to_file(&path)?;
        let value = OpValue { job_id: Some(3), token: Some(9), ..OpValue::default() };
        history.invoke("worker-0", OpFunction::Ack, value.clone());
        history.record("worker-0", OpType::Ok, OpFunction::Ack, value);
        history.flush()?;
        let read = read_jsonl(&path)?;
        assert_eq!(read, history.snapshot());
        assert_eq!(read.len(), 2);
        assert!(read[0].time_ns <= read[1].time_ns);
        Ok(())
    }

    #[test]
    fn pairs_match_completions_per_process() {
        let mut b = test_support::Builder::default();
        b.op(1, "a", OpType::Invoke, OpFunction::Ack, OpValue::default())
            .op(2, "b", OpType::Invoke, OpFunction::Nack, OpValue::default())
            .op(3, "b", OpType::Fail, OpFunction::Nack, OpValue::default())
            .op(4, "a", OpType::Ok, OpFunction::Ack, OpValue::default())
            .op(5, "a", OpType::Invoke, OpFunction::Ack, OpValue::default());
        let pairs = pairs(&b.ops);
        assert_eq!(pairs.len(), 3);
        assert_eq!(pairs[0].outcome(), OpType::Ok);
        assert_eq!(pairs[0].completed_ns(), 4);
        assert_eq!(pairs[1].outcome(), OpType::Fail);
        // The last invocation never completed: unknown.
        assert_eq!(pairs[2].outcome(), OpType::Info);
        assert_eq!(pairs[2].completed_ns(), u64::MAX);
    }
}
