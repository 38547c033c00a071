//! The fenced sink: the downstream store a worker writes its result to,
//! carrying the lease's fencing token. It is what SPEC §3 asks of a
//! downstream store: refuse a writer whose token is lower than one it has
//! already accepted for the same job, so a worker that lost its lease
//! (paused, partitioned, slow) cannot overwrite the current holder's work.
//!
//! The sink lives in the harness process and records every write, accepted
//! or refused, with the host's monotonic time; the log is written to
//! `sink.jsonl` and checked by `checkers::fencing`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// One write attempt, as the sink saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkWrite {
    /// Order in which the sink saw the writes (0-based).
    pub seq: u64,
    /// Host monotonic time, ns since the run began.
    pub time_ns: u64,
    /// The job written for.
    pub job_id: u64,
    /// The fencing token the writer presented.
    pub token: u64,
    /// The writer.
    pub worker: String,
    /// Whether the sink accepted it.
    pub accepted: bool,
}

#[derive(Default)]
struct SinkState {
    highest: BTreeMap<u64, u64>,
    log: Vec<SinkWrite>,
}

/// A shared fenced sink. Cheap to clone.
#[derive(Clone, Default)]
pub struct FencedSink {
    inner: Arc<Mutex<SinkState>>,
}

impl FencedSink {
    /// An empty sink.
    pub fn new() -> FencedSink {
        FencedSink::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SinkState> {
        match self.inner.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Writes for `job_id` under `token`: accepted unless a higher token was
    /// already accepted for that job (an equal token is the same holder
    /// writing again, which is allowed).
    pub fn write(&self, time_ns: u64, job_id: u64, token: u64, worker: &str) -> bool {
        let mut state = self.state();
        let highest = state.highest.get(&job_id).copied().unwrap_or(0);
        let accepted = token >= highest;
        if accepted {
            state.highest.insert(job_id, token);
        }
        let seq = state.log.len() as u64;
        state.log.push(SinkWrite {
            seq,
            time_ns,
            job_id,
            token,
            worker: worker.to_string(),
            accepted,
        });
        accepted
    }

    /// The highest token accepted for `job_id` so far.
    pub fn highest_token(&self, job_id: u64) -> Option<u64> {
        self.state().highest.get(&job_id).copied()
    }

    /// Every write so far, in order.
    pub fn log(&self) -> Vec<SinkWrite> {
        self.state().log.clone()
    }

    /// How many writes the sink refused.
    pub fn refusals(&self) -> u64 {
        self.state().log.iter().filter(|w| !w.accepted).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_lower_token_after_a_higher_one() {
        let sink = FencedSink::new();
        assert!(sink.write(1, 7, 3, "w1"));
        assert!(sink.write(2, 7, 3, "w1"), "the same holder may write again");
        assert!(sink.write(3, 7, 5, "w2"));
        assert!(!sink.write(4, 7, 3, "w1"), "a superseded token is refused");
        assert!(sink.write(5, 8, 1, "w1"), "tokens are per job");
        assert_eq!(sink.refusals(), 1);
        assert_eq!(sink.highest_token(7), Some(5));
        let log = sink.log();
        assert_eq!(log.len(), 5);
        assert!(!log[3].accepted);
    }
}
