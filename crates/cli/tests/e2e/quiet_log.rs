//! Goal: a node left at its default log filter logs what an operator reads
//! (its own events, warnings, errors) and not a line per write. raft-log
//! reports every flush at info; let through, a busy node wrote about one
//! line per write, burying the events docs/operations.md lists and costing
//! CPU on the log's flush thread.
//!
//! Method: one node started without `LEASEHOLD_LOG`, 300 enqueue calls one
//! at a time (each its own log entry and flush), then a drain; read the
//! node's whole log and bound it. One built-in executor command prints a
//! line made to look like the node's own: it must appear only inside the
//! executor's line, quoted, never as a line of its own.

use std::time::Duration;

use anyhow::{Context, Result, ensure};

use super::support::{Node, Sandbox, deadline_in, enqueue_job, phase, queue_stats};

const WRITES: usize = 300;
/// Far above what the node logs for starting, bootstrapping and draining
/// (about a dozen lines), far below one a write.
const MAX_LINES: usize = 60;
/// What the command prints to look like a log line of the node's own.
const FORGED: &str = "2026-01-01T00:00:00.000000Z  INFO leasehold_node: event=lease.acquire";
/// A built-in executor command that prints [`FORGED`] on a line of its own.
const FORGING_COMMAND: &str =
    "echo ok; echo '2026-01-01T00:00:00.000000Z  INFO leasehold_node: event=lease.acquire'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_node_logs_events_not_writes() -> Result<()> {
    let sandbox = Sandbox::new("quiet-log")?;
    sandbox.run(Duration::from_secs(60), story(&sandbox)).await
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start a node with the default log filter");
    let mut node = Node::start(sandbox).await?;
    let mut stub = node.stub()?;

    phase("300 writes, one at a time");
    for n in 0..WRITES {
        enqueue_job(&mut stub, "quiet", format!("job {n}").as_bytes()).await?;
    }

    phase("a command whose output reads as a log line of its own");
    enqueue_job(&mut stub, "exec", FORGING_COMMAND.as_bytes()).await?;
    let deadline = deadline_in(Duration::from_secs(20));
    while queue_stats(&mut stub, "exec").await?.acked < 1 {
        ensure!(tokio::time::Instant::now() < deadline, "the command was not acked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.stop(deadline_in(Duration::from_secs(20))).await?;

    let path = node.log().context("the node kept no log")?;
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let lines: Vec<&str> = text.lines().collect();
    ensure!(
        lines.iter().any(|line| line.contains("node started")),
        "the log misses the node's own start line: is it read at all?\n{text}"
    );
    let from_libraries: Vec<&&str> = lines
        .iter()
        .filter(|line| {
            line.split_once(" INFO ")
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with("leasehold"))
        })
        .take(5)
        .collect();
    ensure!(
        from_libraries.is_empty(),
        "libraries log at info by default, e.g. {from_libraries:#?}"
    );
    // The executor logs a command's output quoted, its line breaks
    // escaped: the forged line is in the log, inside the executor's line.
    ensure!(
        lines
            .iter()
            .any(|line| line.contains("executor command finished") && line.contains(FORGED)),
        "the command's output is not in the executor's line\n{text}"
    );
    let forged: Vec<&&str> = lines.iter().filter(|line| line.starts_with(FORGED)).collect();
    ensure!(forged.is_empty(), "a command's output forged log lines: {forged:#?}");
    ensure!(
        lines.len() <= MAX_LINES,
        "{} lines for {WRITES} writes (at most {MAX_LINES} wanted); the first: {:#?}",
        lines.len(),
        &lines[..lines.len().min(10)]
    );
    Ok(())
}
