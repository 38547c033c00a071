//! Running one job as a child process: the fencing token and job facts in
//! its environment, the payload on stdin, stdout and stderr captured (tails
//! kept), a timeout, and the child killed if the run is abandoned (the lease
//! was lost). Shared by `leasehold worker` and the node's built-in executor.

use std::process::Stdio;
use std::time::Duration;

use leasehold_proto::v1;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::worker::Outcome;

/// Most bytes of each output stream kept.
pub const OUTPUT_TAIL_BYTES: usize = 4 * 1024;

/// What to run for a job.
#[derive(Clone, Debug)]
pub struct CommandLine {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Kill the command after this long; `None` = no limit.
    pub timeout: Option<Duration>,
}

/// How a run ended, with the output it left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Ack, or nack with the reason.
    pub outcome: Outcome,
    /// Tail of stdout (lossy UTF-8).
    pub stdout: String,
    /// Tail of stderr (lossy UTF-8).
    pub stderr: String,
}

/// Variables of this process's environment a command never sees: the
/// credentials a node or a worker was given (`leasehold serve`'s cluster
/// secret, a client's token). A command's output becomes its job's result,
/// which readers see, and a shell command that prints its environment
/// would otherwise hand them out.
pub const WITHHELD_ENV: [&str; 2] = ["LEASEHOLD_CLUSTER_SECRET", "LEASEHOLD_TOKEN"];

/// The environment every run gets: `LEASEHOLD_JOB_ID`,
/// `LEASEHOLD_FENCING_TOKEN`, `LEASEHOLD_ATTEMPT` (the run number, failed
/// attempts + 1), `LEASEHOLD_QUEUE`, `LEASEHOLD_LEASE_EXPIRES_AT_MS`, and for
/// a job fired by a schedule `LEASEHOLD_SCHEDULE` and `LEASEHOLD_BUCKET`
/// (the tick's instant, Unix seconds), read from its `cron:NAME:BUCKET` key.
pub fn job_env(job: &v1::Job, lease: &v1::Lease) -> Vec<(String, String)> {
    let mut env = vec![
        ("LEASEHOLD_JOB_ID".to_string(), job.id.to_string()),
        ("LEASEHOLD_FENCING_TOKEN".to_string(), lease.token.to_string()),
        ("LEASEHOLD_ATTEMPT".to_string(), (job.attempts + 1).to_string()),
        ("LEASEHOLD_QUEUE".to_string(), job.queue.clone()),
        ("LEASEHOLD_LEASE_EXPIRES_AT_MS".to_string(), lease.expires_at_ms.to_string()),
    ];
    if let Some((schedule, bucket)) = job.idempotency_key.as_deref().and_then(schedule_tick) {
        env.push(("LEASEHOLD_SCHEDULE".to_string(), schedule.to_string()));
        env.push(("LEASEHOLD_BUCKET".to_string(), bucket.to_string()));
    }
    env
}

/// The schedule name and bucket of a `cron:NAME:BUCKET[:NODE]` key.
pub fn schedule_tick(key: &str) -> Option<(&str, u64)> {
    let rest = key.strip_prefix("cron:")?;
    let mut parts = rest.split(':');
    let name = parts.next()?;
    let bucket = parts.next()?.parse().ok()?;
    Some((name, bucket))
}

async fn tail_of(stream: Option<impl AsyncRead + Unpin>) -> String {
    let mut tail = Vec::new();
    if let Some(mut stream) = stream {
        let mut buffer = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            tail.extend_from_slice(&buffer[..n]);
            if tail.len() > OUTPUT_TAIL_BYTES {
                tail.drain(..tail.len() - OUTPUT_TAIL_BYTES);
            }
        }
    }
    String::from_utf8_lossy(&tail).into_owned()
}

/// Kills a child's process group when dropped (the run was abandoned) or
/// when asked.
struct GroupGuard {
    pgid: Option<i32>,
}

impl GroupGuard {
    fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // The group may be gone already; that is the outcome wanted.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `command` for `job` with `payload` on stdin. Exit 0 acks; anything
/// else (a failure to start, a non-zero exit, a signal, the timeout) nacks
/// with a reason that ends with the tail of stderr. The child is killed if
/// this future is dropped.
pub async fn run(command: &CommandLine, payload: Vec<u8>) -> Run {
    let Some((program, arguments)) = command.argv.split_first() else {
        return Run {
            outcome: Outcome::Release,
            stdout: String::new(),
            stderr: "no command given".to_string(),
        };
    };
    let mut spawning = tokio::process::Command::new(program);
    spawning.args(arguments).envs(command.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    for name in WITHHELD_ENV {
        spawning.env_remove(name);
    }
    let spawned = spawning
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout or a lost lease kills the whole
        // tree (a shell's children too), not just the shell.
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            return Run {
                outcome: Outcome::Nack {
                    error: format!("cannot start {program}: {error}"),
                    retry_after_ms: None,
                },
                stdout: String::new(),
                stderr: String::new(),
            };
        }
    };
    let group = GroupGuard { pgid: child.id().and_then(|id| i32::try_from(id).ok()) };
    let stdin = child.stdin.take();
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let feed = async move {
        if let Some(mut stdin) = stdin {
            // A command that ignores stdin closes the pipe; that is not an error.
            let _ = stdin.write_all(&payload).await;
        }
    };
    let wait = async {
        let status = match command.timeout {
            Some(limit) => match tokio::time::timeout(limit, child.wait()).await {
                Ok(status) => Some(status),
                Err(_) => {
                    group.kill();
                    let _ = child.wait().await;
                    None
                }
            },
            None => Some(child.wait().await),
        };
        // Whatever the command left running in its group goes with it, and
        // with it the last writers of its pipes.
        group.kill();
        status
    };
    // One task: feeding stdin, reading both pipes and waiting run together
    // and end together (or are dropped together, with a lost lease).
    let (status, stdout, stderr, ()) = tokio::join!(wait, tail_of(stdout), tail_of(stderr), feed);
    let outcome = match status {
        Some(Ok(status)) if status.success() => {
            Outcome::Ack { result: stdout.clone().into_bytes() }
        }
        Some(Ok(status)) => {
            Outcome::Nack { error: format!("{status}: {}", stderr.trim()), retry_after_ms: None }
        }
        Some(Err(error)) => {
            Outcome::Nack { error: format!("waiting for {program}: {error}"), retry_after_ms: None }
        }
        None => Outcome::Nack {
            error: format!(
                "timed out after {} s: {}",
                command.timeout.map(|t| t.as_secs()).unwrap_or(0),
                stderr.trim()
            ),
            retry_after_ms: None,
        },
    };
    Run { outcome, stdout, stderr }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> CommandLine {
        CommandLine {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: vec![("GREETING".into(), "hi".into())],
            timeout: Some(Duration::from_secs(5)),
        }
    }

    #[tokio::test]
    async fn exit_zero_acks_and_captures_output_and_stdin() {
        let run = run(&sh("echo \"$GREETING $(cat)\""), b"there".to_vec()).await;
        assert_eq!(run.outcome, Outcome::Ack { result: b"hi there\n".to_vec() });
        assert_eq!(run.stdout.trim(), "hi there");
    }

    #[tokio::test]
    async fn failure_nacks_with_the_stderr_tail() {
        let run = run(&sh("echo boom >&2; exit 3"), Vec::new()).await;
        match run.outcome {
            Outcome::Nack { error, .. } => assert!(error.contains("boom"), "{error}"),
            other => panic!("expected a nack, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_timeout_kills_and_nacks() {
        let mut command = sh("sleep 30");
        command.timeout = Some(Duration::from_millis(200));
        let started = std::time::Instant::now();
        let run = run(&command, Vec::new()).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(run.outcome, Outcome::Nack { ref error, .. } if error.contains("timed out"))
        );
    }

    #[tokio::test]
    async fn a_command_never_sees_the_credentials_of_its_process() {
        // Removed whatever gave them: the process's own environment, as
        // for a node started with LEASEHOLD_CLUSTER_SECRET, or the run's.
        let mut command =
            sh("echo \"${LEASEHOLD_CLUSTER_SECRET-none} ${LEASEHOLD_TOKEN-none} $GREETING\"");
        command.env.push(("LEASEHOLD_CLUSTER_SECRET".into(), "secret".into()));
        command.env.push(("LEASEHOLD_TOKEN".into(), "lh_token".into()));
        let run = run(&command, Vec::new()).await;
        assert_eq!(run.stdout.trim(), "none none hi");
    }

    #[test]
    fn schedule_ticks_are_read_from_cron_keys() {
        assert_eq!(schedule_tick("cron:backup:1767225600"), Some(("backup", 1_767_225_600)));
        assert_eq!(schedule_tick("cron:backup:1767225600:3"), Some(("backup", 1_767_225_600)));
        assert_eq!(schedule_tick("manual:backup:1"), None);
        assert_eq!(schedule_tick("cron:backup:x"), None);
    }
}
