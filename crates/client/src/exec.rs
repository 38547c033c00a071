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

/// Reads `stream` to its end, keeping its last [`OUTPUT_TAIL_BYTES`] in
/// `tail` as they come, so what was read survives if the read is given up.
async fn read_tail(stream: Option<impl AsyncRead + Unpin>, tail: &mut Vec<u8>) {
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
}

/// How long the output is still read once the command and its process
/// group are gone. Only a process that left the group (`setsid`, a
/// daemon, a tool that makes its own group) can still hold the pipes then;
/// the run does not wait for it.
pub const OUTPUT_GRACE: Duration = Duration::from_secs(1);

/// Most bytes of a nack's error: the `max_error_bytes` a node keeps by
/// default. The error ends with the tail of stderr, cut from the front to
/// fit, so a node that keeps only this much keeps the last line, where a
/// failing command usually says why.
pub const NACK_ERROR_BYTES: usize = 4 * 1024;

/// `prefix` then as much of the end of `stderr` as fits in
/// [`NACK_ERROR_BYTES`], cut at a character boundary.
fn nack_error(prefix: &str, stderr: &str) -> String {
    let stderr = stderr.trim();
    let room = NACK_ERROR_BYTES.saturating_sub(prefix.len());
    let mut from = stderr.len().saturating_sub(room);
    while !stderr.is_char_boundary(from) {
        from += 1;
    }
    format!("{prefix}{}", &stderr[from..])
}

/// How long a run waits, once its command is over, for what the command
/// left in its process group to be gone after the kill; and how long a
/// caller about to give back the lease of a dropped run waits for the
/// groups of this process's commands ([`commands_gone`]) before it leaves
/// the lease to lapse instead. A killed process is usually gone within
/// milliseconds.
pub const KILL_SETTLE: Duration = Duration::from_secs(2);

/// The first pause between two looks at a group still there; each next
/// pause doubles, up to [`GONE_POLL_MOST`].
const GONE_POLL_FIRST: Duration = Duration::from_millis(5);
/// The longest pause between two looks at a group still there.
const GONE_POLL_MOST: Duration = Duration::from_millis(100);

/// The process group of every command this process started, from its
/// start until its run saw the group gone: a run dropped mid-command (its
/// job abandoned at the end of a grace period, or its lease lost) leaves
/// its killed group here until a look finds it gone. See
/// [`commands_gone`].
static GROUPS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Whether process group `pgid` still has a process that has not exited
/// (see [`live_groups`]).
fn group_has_live_member(pgid: i32) -> bool {
    !live_groups(&[pgid]).is_empty()
}

/// Those of `groups` that still have a process that has not exited. A
/// SIGKILL takes effect when its target next runs, so a killed process
/// (one in an uninterruptible wait above all) can outlive the kill; a
/// zombie has exited, though it stays in its group until its parent reaps
/// it (a node that is process 1 reaps only its own children). A group no
/// signal reaches is gone; the others are looked up in one pass over
/// `/proc`. `/proc` unreadable counts as alive; a process hidden from this
/// one (`hidepid`, another user's) cannot be seen and counts as gone.
fn live_groups(groups: &[i32]) -> Vec<i32> {
    let reached: Vec<i32> = groups.iter().copied().filter(|pgid| reachable(*pgid)).collect();
    if reached.is_empty() {
        return reached;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else { return reached };
    let mut live = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and
        // parentheses, so the fields are read after the last ')'.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
        let (Some(state), Some(group)) =
            (fields.first(), fields.get(2).and_then(|group| group.parse::<i32>().ok()))
        else {
            continue;
        };
        let running = match *state {
            "X" => false,
            // A process whose first thread exited shows as a zombie while
            // its other threads still run.
            "Z" => threads(pid) > 1,
            _ => true,
        };
        if running && reached.contains(&group) && !live.contains(&group) {
            live.push(group);
        }
    }
    live
}

/// Whether a signal still reaches some process of group `pgid` (a zombie
/// included).
fn reachable(pgid: i32) -> bool {
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), None)
        != Err(nix::errno::Errno::ESRCH)
}

/// How many threads process `pid` has (0 when it cannot be read).
fn threads(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Threads:"))
                .and_then(|count| count.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Waits up to `within` for process group `pgid` to have no live process;
/// answers whether it has none.
async fn group_gone(pgid: i32, within: Duration) -> bool {
    looks_until(within, || !group_has_live_member(pgid)).await
}

/// Looks with `gone` until it answers yes or `within` has passed, the
/// pause between looks doubling from [`GONE_POLL_FIRST`] to
/// [`GONE_POLL_MOST`]; answers the last look.
async fn looks_until(within: Duration, mut gone: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut pause = GONE_POLL_FIRST;
    loop {
        if gone() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(GONE_POLL_MOST);
    }
}

/// Adds a started command's group to [`GROUPS`], dropping the entries
/// whose groups no signal can reach any more.
fn register(pgid: i32) {
    if let Ok(mut groups) = GROUPS.lock() {
        groups.retain(|pgid| reachable(*pgid));
        groups.push(pgid);
    }
}

/// Takes `pgid` out of [`GROUPS`].
fn unregister(pgid: i32) {
    if let Ok(mut groups) = GROUPS.lock()
        && let Some(index) = groups.iter().position(|known| *known == pgid)
    {
        groups.swap_remove(index);
    }
}

/// Waits up to `within` for the process group of every command this
/// process started to be gone, and answers whether they all are. A caller
/// that gives a job's lease back after dropping its run (a node's drain,
/// a worker's grace period) asks this first: a process of that run still
/// alive when the lease is given back would run beside the job's next
/// holder. Every command's group counts, running or killed: at those
/// points every run has ended or been dropped.
pub async fn commands_gone(within: Duration) -> bool {
    let mut left = 0;
    let gone = looks_until(within, || {
        // Looked at outside the lock: a look may read all of /proc.
        let Ok(known) = GROUPS.lock().map(|groups| groups.clone()) else { return false };
        let live = live_groups(&known);
        for pgid in known.iter().filter(|pgid| !live.contains(pgid)) {
            unregister(*pgid);
        }
        left = live.len();
        left == 0
    })
    .await;
    if !gone {
        tracing::warn!(groups = left, "process groups of commands still there");
    }
    gone
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

impl GroupGuard {
    /// Kills the group once the command has been reaped, and disarms the
    /// guard: from here on the group's id may be freed and given to an
    /// unrelated process group, which a later kill would hit.
    fn kill_last(&mut self) {
        self.kill();
        self.pgid = None;
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
    let mut group = GroupGuard { pgid: child.id().and_then(|id| i32::try_from(id).ok()) };
    // Known until seen gone, whenever this run ends or is dropped.
    let pgid = group.pgid;
    if let Some(pgid) = pgid {
        register(pgid);
    }
    let stdin = child.stdin.take();
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let feed = async move {
        if let Some(mut stdin) = stdin {
            // A command that ignores stdin closes the pipe; that is not an error.
            let _ = stdin.write_all(&payload).await;
        }
    };
    let waiting = async {
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
        group.kill_last();
        status
    };
    // One task: feeding stdin, reading both pipes and waiting run together
    // (and are dropped together, with a lost lease). The reading ends when
    // every writer of the pipes has closed them; once the command's group
    // is gone it gets a short grace, so a process that escaped the group
    // and holds them cannot keep the run, its lease and its slot for as
    // long as it lives (the timeout bounds only the group).
    let (mut out_tail, mut err_tail) = (Vec::new(), Vec::new());
    let status = {
        let reading = async {
            tokio::join!(read_tail(stdout, &mut out_tail), read_tail(stderr, &mut err_tail), feed);
        };
        let mut reading = std::pin::pin!(reading);
        let mut waiting = std::pin::pin!(waiting);
        let (status, read) = tokio::select! {
            status = &mut waiting => (status, false),
            () = &mut reading => (waiting.await, true),
        };
        if !read && tokio::time::timeout(OUTPUT_GRACE, &mut reading).await.is_err() {
            tracing::warn!(
                program = %program,
                "the command ended but a process outside its group still holds its output; \
                 not waiting for it"
            );
        }
        status
    };
    // What the command left in its group was killed above: the job is
    // finished (acked, or nacked and so free for its next attempt) once
    // that is gone too, so nothing of this run outlives its lease. A
    // process a SIGKILL cannot end within the settle time (one stuck in an
    // uninterruptible wait, or one this user may not signal) does not hold
    // the job forever: it stays known, for a drain to wait on.
    if let Some(pgid) = pgid {
        if group_gone(pgid, KILL_SETTLE).await {
            unregister(pgid);
        } else {
            tracing::warn!(
                program = %program,
                pgid,
                "a process of the command's group outlived the kill; finishing the job anyway"
            );
        }
    }
    let stdout = String::from_utf8_lossy(&out_tail).into_owned();
    let stderr = String::from_utf8_lossy(&err_tail).into_owned();
    let outcome = match status {
        Some(Ok(status)) if status.success() => {
            Outcome::Ack { result: stdout.clone().into_bytes() }
        }
        Some(Ok(status)) => Outcome::Nack {
            error: nack_error(&format!("{status}: "), &stderr),
            retry_after_ms: None,
        },
        Some(Err(error)) => {
            Outcome::Nack { error: format!("waiting for {program}: {error}"), retry_after_ms: None }
        }
        None => Outcome::Nack {
            error: nack_error(
                &format!(
                    "timed out after {} s: ",
                    command.timeout.map(|t| t.as_secs()).unwrap_or(0)
                ),
                &stderr,
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
    async fn the_last_kill_disarms_the_guard() -> std::io::Result<()> {
        // A group of its own whose leader the guard kills once reaped; no
        // later drop may signal that group id again (it may be reused).
        let mut child = tokio::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let mut guard = GroupGuard { pgid: child.id().and_then(|id| i32::try_from(id).ok()) };
        assert!(guard.pgid.is_some());
        guard.kill_last();
        assert!(!child.wait().await?.success(), "the group was killed");
        assert_eq!(guard.pgid, None, "the guard would kill that group id again on drop");
        Ok(())
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
    async fn a_process_that_escaped_the_group_does_not_hold_the_run() {
        // `setsid` takes the background sleep out of the command's process
        // group with the pipes still open: killing the group misses it. The
        // shell exits only once the sleep leads its own session (field 6
        // of its stat), so the kill cannot catch it before it escapes.
        let command = sh("setsid sleep 20 & pid=$!; \
             until [ \"$(cut -d' ' -f6 /proc/$pid/stat)\" = \"$pid\" ]; do sleep 0.01; done; \
             echo $pid; echo started >&2");
        let started = std::time::Instant::now();
        let run = run(&command, Vec::new()).await;
        let waited = started.elapsed();
        if let Ok(pid) = run.stdout.trim().parse::<i32>() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert!(waited < OUTPUT_GRACE + Duration::from_secs(3), "the run waited {waited:?}");
        assert!(matches!(run.outcome, Outcome::Ack { .. }), "{:?}", run.outcome);
        assert_eq!(run.stderr.trim(), "started", "the output read before the grace is kept");
    }

    #[tokio::test]
    async fn a_nack_keeps_the_end_of_a_long_stderr() {
        let run =
            run(&sh("head -c 6000 /dev/zero | tr '\\0' x >&2; echo why >&2; exit 1"), Vec::new())
                .await;
        let Outcome::Nack { error, .. } = run.outcome else {
            panic!("expected a nack, got {:?}", run.outcome);
        };
        assert!(error.len() <= NACK_ERROR_BYTES, "{} bytes", error.len());
        assert!(error.starts_with("exit status: 1: "), "{}", &error[..40]);
        assert!(error.ends_with("xxwhy"), "{}", &error[error.len() - 40..]);
    }

    #[test]
    fn a_nack_error_is_cut_at_a_character_boundary() {
        let stderr = "é".repeat(NACK_ERROR_BYTES);
        let error = nack_error("failed: ", &stderr);
        assert!(error.len() <= NACK_ERROR_BYTES);
        assert!(error.starts_with("failed: é"));
        assert_eq!(nack_error("p: ", " short \n"), "p: short");
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

    /// A zombie has exited: a group of zombies is gone, though its
    /// members stay in it until reaped.
    #[tokio::test]
    async fn a_group_of_zombies_has_no_live_member() -> std::io::Result<()> {
        let mut child = tokio::process::Command::new("sleep").arg("30").process_group(0).spawn()?;
        let pgid = child.id().and_then(|id| i32::try_from(id).ok()).expect("a pid");
        assert!(group_has_live_member(pgid), "a sleeping process is alive");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL)
            .map_err(std::io::Error::other)?;
        // Killed, not reaped: a zombie, still found by a signal to its group.
        let settled = tokio::time::Instant::now() + Duration::from_secs(5);
        while group_has_live_member(pgid) && tokio::time::Instant::now() < settled {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), None),
            Ok(()),
            "the zombie is still in its group"
        );
        assert!(!group_has_live_member(pgid), "a zombie is not alive");
        child.wait().await?;
        Ok(())
    }

    /// A run dropped while its command runs (an abandoned job) has its
    /// group killed and watched: a caller about to give the job's lease
    /// back waits for the group to be gone, and hears when it is not.
    #[tokio::test]
    async fn a_dropped_run_is_watched_until_its_group_is_gone() -> std::io::Result<()> {
        let dir = std::env::temp_dir().join(format!("leasehold-exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let pid_file = dir.join("pid");
        let script = format!("echo $$ > '{}'; sleep 30 & sleep 30", pid_file.display());
        let command = sh(&script);
        let running = tokio::spawn(async move { run(&command, Vec::new()).await });
        let started = tokio::time::Instant::now() + Duration::from_secs(5);
        let pgid = loop {
            let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
            if let Ok(pgid) = text.trim().parse::<i32>() {
                break pgid;
            }
            assert!(tokio::time::Instant::now() < started, "the command did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        running.abort();
        let _ = running.await;
        assert!(
            GROUPS.lock().is_ok_and(|groups| groups.contains(&pgid)),
            "the dropped run's group is watched"
        );
        assert!(commands_gone(Duration::from_secs(5)).await, "a killed group goes");
        assert!(!GROUPS.lock().is_ok_and(|groups| groups.contains(&pgid)), "and is forgotten");
        assert!(!group_has_live_member(pgid), "gone when the wait says so");
        // A group still alive keeps the answer no.
        let mut alive = tokio::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let alive_pgid = alive.id().and_then(|id| i32::try_from(id).ok()).expect("a pid");
        register(alive_pgid);
        assert!(!commands_gone(Duration::from_millis(50)).await, "a live group is waited for");
        alive.kill().await?;
        assert!(commands_gone(Duration::from_secs(5)).await);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    /// A group's wait ends when its last live process does, not before.
    #[tokio::test]
    async fn the_wait_for_a_group_ends_with_its_last_process() -> std::io::Result<()> {
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "sleep 0.3 & sleep 0.1"])
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let pgid = child.id().and_then(|id| i32::try_from(id).ok()).expect("a pid");
        let started = std::time::Instant::now();
        assert!(!group_gone(pgid, Duration::from_millis(20)).await, "a live group is not gone");
        let waited = tokio::spawn(async move { group_gone(pgid, Duration::from_secs(5)).await });
        child.wait().await?;
        assert!(waited.await.map_err(std::io::Error::other)?, "gone once its processes are");
        assert!(started.elapsed() >= Duration::from_millis(250), "{:?}", started.elapsed());
        assert!(!group_has_live_member(pgid));
        Ok(())
    }

    /// What a command leaves running in its group is killed when it exits,
    /// and the run ends (its job acked) only once that is gone.
    #[tokio::test]
    async fn a_run_ends_only_once_what_its_command_left_is_gone() {
        // Its output elsewhere, so the pipes close with the shell and do
        // not wait for it.
        let run = run(&sh("sleep 30 >/dev/null 2>&1 & echo $$"), Vec::new()).await;
        assert!(matches!(run.outcome, Outcome::Ack { .. }), "{run:?}");
        let pgid = run.stdout.trim().parse::<i32>().expect("the group's id");
        assert!(!group_has_live_member(pgid), "the background sleep outlived the run");
        assert!(!GROUPS.lock().is_ok_and(|groups| groups.contains(&pgid)), "seen gone, forgotten");
    }

    #[test]
    fn schedule_ticks_are_read_from_cron_keys() {
        assert_eq!(schedule_tick("cron:backup:1767225600"), Some(("backup", 1_767_225_600)));
        assert_eq!(schedule_tick("cron:backup:1767225600:3"), Some(("backup", 1_767_225_600)));
        assert_eq!(schedule_tick("manual:backup:1"), None);
        assert_eq!(schedule_tick("cron:backup:x"), None);
    }
}
