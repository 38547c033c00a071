//! The execution sink of the cron workload: every run of a cron job appends
//! a `start` line when it begins and an `end` line when it finishes to one
//! log file in the run directory (`exec.log`). The lines are written by the
//! command itself — run by a node's built-in executor under `sh -c`, with
//! the job's facts in its environment — so they record what really ran,
//! where, and under which fencing token:
//!
//! ```text
//! start <wall_ns> <schedule> <bucket> <node> <token> <job> <attempt> <path>
//! end   <wall_ns> <schedule> <bucket> <node> <token> <job> <attempt> <path>
//! ```
//!
//! `node` comes from `CHAOS_NODE_ID`, which the supervisor puts in each
//! node's environment (the executor's children inherit it); `path` from
//! `LEASEHOLD_CLAIM_PATH` (`bus` for a tick run on the broadcast path),
//! else `journal`. A bus run has no job or lease: its job, token and
//! attempt are written as 0. Each line is one `printf` to a file
//! opened for append, so lines from concurrent runs do not interleave; a
//! line cut short by a killed run is skipped and counted.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Start or end of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunPhase {
    /// The command began.
    Start,
    /// The command finished its work (and is about to exit 0).
    End,
}

/// One line of the execution log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecEvent {
    /// Start or end.
    pub phase: RunPhase,
    /// Wall clock of this host, ns since the Unix epoch.
    pub wall_ns: u64,
    /// The schedule (`LEASEHOLD_SCHEDULE`).
    pub schedule: String,
    /// The tick, Unix seconds (`LEASEHOLD_BUCKET`).
    pub bucket: u64,
    /// The node whose executor ran it.
    pub node: u64,
    /// The fencing token of the lease it ran under.
    pub token: u64,
    /// The job.
    pub job_id: u64,
    /// The run number (failed attempts + 1).
    pub attempt: u32,
    /// The claim path the node took (`journal` or `bus`).
    pub path: String,
}

/// The command a cron schedule of the workload runs: it appends a start
/// line, works for `run_ms`, appends an end line.
pub fn command(log: &Path, run_ms: u64) -> String {
    let line = |phase: &str| {
        format!(
            "printf '{phase} %s %s %s %s %s %s %s %s\\n' \"$(date +%s%N)\" \
             \"${{LEASEHOLD_SCHEDULE:-none}}\" \"${{LEASEHOLD_BUCKET:-0}}\" \"${{CHAOS_NODE_ID:-0}}\" \
             \"${{LEASEHOLD_FENCING_TOKEN:-0}}\" \"${{LEASEHOLD_JOB_ID:-0}}\" \"${{LEASEHOLD_ATTEMPT:-0}}\" \
             \"${{LEASEHOLD_CLAIM_PATH:-journal}}\" >> '{}'",
            log.display()
        )
    };
    format!("{}; sleep {}.{:03}; {}", line("start"), run_ms / 1_000, run_ms % 1_000, line("end"))
}

/// Parses one line; `None` if it is malformed (cut short).
pub fn parse_line(line: &str) -> Option<ExecEvent> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [phase, wall, schedule, bucket, node, token, job, attempt, path] = fields.as_slice() else {
        return None;
    };
    let phase = match *phase {
        "start" => RunPhase::Start,
        "end" => RunPhase::End,
        _ => return None,
    };
    Some(ExecEvent {
        phase,
        wall_ns: wall.parse().ok()?,
        schedule: schedule.to_string(),
        bucket: bucket.parse().ok()?,
        node: node.parse().ok()?,
        token: token.parse().ok()?,
        job_id: job.parse().ok()?,
        attempt: attempt.parse().ok()?,
        path: path.to_string(),
    })
}

/// Reads the log (missing file: no runs); answers the events and how many
/// lines were malformed.
pub fn read(path: &Path) -> anyhow::Result<(Vec<ExecEvent>, u64)> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(error) => anyhow::bail!("reading {}: {error}", path.display()),
    };
    let mut events = Vec::new();
    let mut malformed = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match parse_line(line) {
            Some(event) => events.push(event),
            None => malformed += 1,
        }
    }
    Ok((events, malformed))
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A run event.
    pub fn event(
        phase: RunPhase,
        wall_ns: u64,
        schedule: &str,
        bucket: u64,
        node: u64,
        token: u64,
        job_id: u64,
    ) -> ExecEvent {
        ExecEvent {
            phase,
            wall_ns,
            schedule: schedule.to_string(),
            bucket,
            node,
            token,
            job_id,
            attempt: 1,
            path: "journal".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_writes_lines_the_parser_reads() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("exec.log");
        let script = command(&log, 10);
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .env("LEASEHOLD_SCHEDULE", "tick")
            .env("LEASEHOLD_BUCKET", "1767225600")
            .env("CHAOS_NODE_ID", "2")
            .env("LEASEHOLD_FENCING_TOKEN", "17")
            .env("LEASEHOLD_JOB_ID", "5")
            .env("LEASEHOLD_ATTEMPT", "1")
            .status()?;
        assert!(status.success());
        std::fs::write(dir.path().join("torn.log"), "start 12 tick\n")?;
        let (events, malformed) = read(&log)?;
        assert_eq!(malformed, 0);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].phase, RunPhase::Start);
        assert_eq!(events[1].phase, RunPhase::End);
        assert_eq!(
            (events[0].schedule.as_str(), events[0].bucket, events[0].node, events[0].token),
            ("tick", 1_767_225_600, 2, 17)
        );
        assert_eq!(events[0].path, "journal");
        assert!(events[0].wall_ns <= events[1].wall_ns);
        let (torn, malformed) = read(&dir.path().join("torn.log"))?;
        assert!(torn.is_empty());
        assert_eq!(malformed, 1);
        Ok(())
    }
}
