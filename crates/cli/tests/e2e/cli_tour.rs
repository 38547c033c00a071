//! Goal: the `leasehold` binary's client subcommands work against a real
//! node and their `--output json` documents carry the pinned fields (SPEC
//! §6): a job goes enqueue → claim → ack through the CLI alone, and a wrong
//! token is refused with a non-zero exit and a message saying "stale".
//!
//! Method: start a node, run each subcommand as its own process (address
//! from `LEASEHOLD_ADDR`, and once from `--addr` with the variable unset),
//! and parse what it prints.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use super::support::{self, Node, Sandbox, phase, run_cli};

const QUEUE: &str = "tour";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_tour_works() -> Result<()> {
    let sandbox = Sandbox::new("cli-tour")?;
    sandbox.run(Duration::from_secs(60), story(&sandbox)).await
}

fn u64_at(value: &Value, pointer: &str) -> Result<u64> {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .with_context(|| format!("no number at {pointer} in {value}"))
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> Result<&'a str> {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .with_context(|| format!("no text at {pointer} in {value}"))
}

async fn story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1");
    let node = Node::start(sandbox).await?;
    let addr = node.addr();
    let env = [("LEASEHOLD_ADDR", addr.as_str())];

    phase("job enqueue prints the new id");
    let enqueued =
        run_cli(sandbox, &["job", "enqueue", "--queue", QUEUE, "--payload", "hello"], &env)
            .await?
            .success()?;
    let job_id: u64 = enqueued
        .stdout
        .trim()
        .parse()
        .with_context(|| format!("enqueue printed {:?}, not an id", enqueued.stdout))?;
    ensure!(job_id >= 1, "job id {job_id}");

    phase("job claim --output json gives the lease and its token");
    let claimed = run_cli(sandbox, &["job", "claim", "--queue", QUEUE, "--output", "json"], &env)
        .await?
        .success()?
        .json()?;
    let grants =
        claimed.as_array().with_context(|| format!("claim output is not a list: {claimed}"))?;
    ensure!(grants.len() == 1, "claim output: {claimed}");
    ensure!(u64_at(&claimed, "/0/lease/job_id")? == job_id, "claimed another job: {claimed}");
    ensure!(str_at(&claimed, "/0/job/state")? == "claimed", "claim output: {claimed}");
    let token = u64_at(&claimed, "/0/lease/token")?;
    ensure!(token >= 1, "token {token}");

    phase("job ack with that token succeeds");
    let (job, token_text) = (job_id.to_string(), token.to_string());
    let acked =
        run_cli(sandbox, &["job", "ack", "--job", &job, "--fencing-token", &token_text], &env)
            .await?
            .success()?;
    ensure!(acked.stdout.contains("acked"), "ack printed {:?}", acked.stdout);

    phase("job get --output json shows the job acked");
    let got = run_cli(sandbox, &["job", "get", &job, "--output", "json"], &env)
        .await?
        .success()?
        .json()?;
    ensure!(u64_at(&got, "/id")? == job_id, "get: {got}");
    ensure!(str_at(&got, "/state")? == "acked", "get: {got}");
    // The tombstone keeps who finished the job and how, not its payload
    // (docs/architecture.md, "What a tombstone keeps").
    ensure!(str_at(&got, "/payload/text")?.is_empty(), "get: {got}");
    ensure!(u64_at(&got, "/lease/token")? == token, "get: {got}");

    phase("job stats --output json, reaching the node by --addr alone");
    let stats = run_cli(sandbox, &["job", "stats", "--addr", &addr, "--output", "json"], &[])
        .await?
        .success()?
        .json()?;
    ensure!(u64_at(&stats, "/last_job_id")? == job_id, "stats: {stats}");
    ensure!(u64_at(&stats, "/last_token")? == token, "stats: {stats}");
    let queues = stats.get("queues").and_then(Value::as_array).context("stats without queues")?;
    let tour = queues
        .iter()
        .find(|q| q.get("queue").and_then(Value::as_str) == Some(QUEUE))
        .with_context(|| format!("no {QUEUE} queue in {stats}"))?;
    for (count, expected) in
        [("ready", 0), ("delayed", 0), ("claimed", 0), ("acked", 1), ("dead", 0)]
    {
        ensure!(
            u64_at(tour, &format!("/{count}"))? == expected,
            "stats of {QUEUE}: {count} should be {expected}: {tour}"
        );
    }

    phase("cluster status --output json names node 1 leader");
    let status = run_cli(sandbox, &["cluster", "status", "--output", "json"], &env)
        .await?
        .success()?
        .json()?;
    ensure!(u64_at(&status, "/leader")? == 1, "status: {status}");
    let nodes = status.get("nodes").and_then(Value::as_array).context("status without nodes")?;
    ensure!(nodes.len() == 1, "single-node cluster lists {} nodes: {status}", nodes.len());
    ensure!(u64_at(&nodes[0], "/id")? == 1, "status: {status}");
    ensure!(str_at(&nodes[0], "/role")? == "leader", "status: {status}");

    phase("a second ack with a wrong token exits non-zero saying stale");
    let wrong = (token + 1).to_string();
    let refused =
        run_cli(sandbox, &["job", "ack", "--job", &job, "--fencing-token", &wrong], &env).await?;
    ensure!(!refused.status.success(), "ack with a wrong token exited 0: {:?}", refused.stdout);
    ensure!(
        refused.stderr.to_lowercase().contains("stale"),
        "refusal does not mention stale: {:?}",
        refused.stderr
    );
    let unchanged = run_cli(sandbox, &["job", "get", &job, "--output", "json"], &env)
        .await?
        .success()?
        .json()?;
    ensure!(unchanged == got, "the refused ack changed the job: {unchanged}");

    phase("LEASEHOLD_INSECURE takes 1, as the docs write it");
    let insecure = [("LEASEHOLD_ADDR", addr.as_str()), ("LEASEHOLD_INSECURE", "1")];
    run_cli(sandbox, &["job", "stats"], &insecure).await?.success()?;

    phase("cron commands move past an address that does not answer, as job commands do");
    let past_dead = format!("127.0.0.1:1,{addr}");
    let put = ["cron", "put", "tour", "--cron", "@daily", "--queue", QUEUE, "--addr", &past_dead];
    run_cli(sandbox, &put, &[]).await?.success()?;
    let listed = run_cli(sandbox, &["cron", "list", "--addr", &past_dead, "--output", "json"], &[])
        .await?
        .success()?
        .json()?;
    ensure!(str_at(&listed, "/0/name")? == "tour", "cron list: {listed}");

    phase("job get shows a producer's escape sequences, never sends them to the terminal");
    // A tag that would retitle the window and clear the screen.
    let hostile = "ops\u{1b}]0;pwned\u{7}\u{1b}[2J";
    let mut stub = node.stub()?;
    let spec = leasehold_proto::v1::JobSpec {
        tags: vec![hostile.to_string()],
        ..support::job(QUEUE, b"x")
    };
    let enqueued = stub.enqueue(leasehold_proto::v1::EnqueueRequest { jobs: vec![spec] }).await?;
    let id = enqueued.into_inner().results.first().map(|r| r.job_id).context("no job id")?;
    let shown = run_cli(sandbox, &["job", "get", &id.to_string()], &env).await?.success()?;
    ensure!(
        !shown.stdout.contains('\u{1b}') && !shown.stdout.contains('\u{7}'),
        "{:?}",
        shown.stdout
    );
    ensure!(
        shown.stdout.contains("ops\\u{1b}]0;pwned\\u{7}"),
        "the tag is not shown: {:?}",
        shown.stdout
    );
    Ok(())
}
