//! Goal: `runtime_threads` sets how many worker threads a node's async
//! runtime has, from a flag or the config file, so nodes that share a
//! machine's cores need not each start one per core; a value out of range
//! is refused by name before anything starts.
//!
//! Method: real `leasehold serve` processes logging JSON. One with
//! `--runtime-threads 1`, one with `runtime_threads = 3` in its config file,
//! one with neither; each node's "node started" event reports the workers
//! of the runtime it runs on (tokio's own count, not the setting echoed),
//! so each must read what it was given, and the default one per core. Then
//! `--runtime-threads 0` must exit with an error naming the key and leave
//! no data directory.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use super::support::{Node, Sandbox, deadline_in, phase, run_cli};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_on_the_threads_it_is_given() -> Result<()> {
    let sandbox = Sandbox::new("runtime-threads")?;
    sandbox.run(Duration::from_secs(90), story(&sandbox)).await
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("a node started with --runtime-threads 1");
    let mut flag = Node::new(sandbox, 1, None, None)?;
    flag.data = sandbox.path().join("data-flag");
    flag.extra_args.extend(["--runtime-threads".into(), "1".into()]);
    ensure!(started_threads(sandbox, &mut flag).await? == 1, "--runtime-threads 1 not in force");

    phase("a node whose config file says runtime_threads = 3");
    let config = sandbox.path().join("threads.toml");
    std::fs::write(&config, "runtime_threads = 3\n").context("writing the config file")?;
    let mut file = Node::new(sandbox, 1, Some(config), None)?;
    file.data = sandbox.path().join("data-file");
    ensure!(started_threads(sandbox, &mut file).await? == 3, "runtime_threads = 3 not in force");

    phase("a node with neither: one thread per core");
    let cores =
        u64::try_from(std::thread::available_parallelism().context("counting cores")?.get())?;
    let mut default = Node::new(sandbox, 1, None, None)?;
    default.data = sandbox.path().join("data-default");
    let threads = started_threads(sandbox, &mut default).await?;
    ensure!(threads == cores, "{threads} runtime threads by default on {cores} cores");

    phase("--runtime-threads 0 is refused by name, before anything starts");
    let data = sandbox.path().join("data-refused");
    let data_arg = data.to_string_lossy().to_string();
    let run = run_cli(
        sandbox,
        &["serve", "--runtime-threads", "0", "--grpc", "127.0.0.1:1", "--data", &data_arg],
        &[],
    )
    .await?;
    ensure!(!run.status.success(), "a node with 0 runtime threads started: {:?}", run.stderr);
    ensure!(run.stderr.contains("runtime_threads"), "the error names no key: {:?}", run.stderr);
    ensure!(!data.exists(), "a refused node created its data directory");
    Ok(())
}

/// Starts `node` logging JSON, waits until it leads, and returns the
/// runtime workers its "node started" event reports; stops it again.
async fn started_threads(sandbox: &Sandbox, node: &mut Node) -> Result<u64> {
    node.extra_args.extend(["--log-format".into(), "json".into()]);
    node.launch(sandbox)?;
    node.wait_leading().await?;
    node.stop(deadline_in(Duration::from_secs(20))).await?;
    let log = node.log().context("the node kept no log")?;
    reported_threads(log)
}

fn reported_threads(log: &Path) -> Result<u64> {
    let text = std::fs::read_to_string(log).with_context(|| format!("{}", log.display()))?;
    let line = text
        .lines()
        .find(|line| line.contains("\"node started\""))
        .with_context(|| format!("no \"node started\" event in {}", log.display()))?;
    let event: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("not JSON: {line:?}"))?;
    event["fields"]["runtime_threads"]
        .as_u64()
        .with_context(|| format!("no runtime_threads in {line:?}"))
}
