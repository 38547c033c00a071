//! Goal: the CLI reads well to an operator (issue 16, item 3): tables a
//! person can scan, completions a shell accepts, bulk enqueue of a file
//! that ends with its counts (and changes nothing when a line is bad),
//! redrive with a count, and one clear line when no node answers.
//!
//! Method: the real `leasehold` binary as its own process each time,
//! against a real node where a node is needed; the shells are the real
//! bash, and the queue's counts are read back over gRPC, not from the CLI
//! that set them.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use leasehold_proto::v1;

use super::support::{Node, Sandbox, free_port, phase, queue_stats, run_cli};

/// How long one shell check may take.
const SHELL_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `bash -c SCRIPT`; its exit status and output.
async fn bash(script: &str) -> Result<std::process::Output> {
    let run = tokio::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", script])
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(SHELL_TIMEOUT, run)
        .await
        .context("bash did not finish in time")?
        .context("running bash")
}

/// Output that cannot be written fails the command, naming why, unless
/// its reader went away (`| head`): then the rest is dropped quietly and
/// the command ends as it would have, without a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_to_a_full_disk_fails_and_to_a_closed_pipe_ends_quietly() -> Result<()> {
    let sandbox = Sandbox::new("cli-stdout")?;
    sandbox.run(Duration::from_secs(60), stdout_story(&sandbox)).await
}

async fn stdout_story(sandbox: &Sandbox) -> Result<()> {
    let bin = super::support::binary();
    let dir = |name: &str| sandbox.path().join(name).display().to_string();
    phase("dev-certs with its stdout on a full disk: exit 1, the error named");
    let full = bash(&format!("'{bin}' dev-certs '{}' > /dev/full", dir("full"))).await?;
    let stderr = String::from_utf8_lossy(&full.stderr);
    ensure!(
        full.status.code() == Some(1) && stderr.contains("writing the output"),
        "{:?}: {stderr}",
        full.status
    );
    phase("stdout and stderr both on a full disk, and completions there: exit 1, no panic");
    let both = bash(&format!("'{bin}' dev-certs '{}' > /dev/full 2>&1", dir("both"))).await?;
    ensure!(both.status.code() == Some(1), "dev-certs with nowhere to write: {:?}", both.status);
    let script = bash(&format!("'{bin}' completions bash > /dev/full")).await?;
    ensure!(script.status.code() == Some(1), "completions to a full disk: {:?}", script.status);
    phase("dev-certs into a pipe whose reader is gone: exit 0, no panic");
    let gone =
        bash(&format!("set -o pipefail; '{bin}' dev-certs '{}' | true", dir("gone"))).await?;
    let stderr = String::from_utf8_lossy(&gone.stderr);
    ensure!(gone.status.success() && !stderr.contains("panicked"), "{:?}: {stderr}", gone.status);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_are_scripts_the_shells_take() -> Result<()> {
    let sandbox = Sandbox::new("cli-completions")?;
    sandbox.run(Duration::from_secs(60), completions_story(&sandbox)).await
}

async fn completions_story(sandbox: &Sandbox) -> Result<()> {
    phase("completions bash: bash parses it, and sourcing it completes leasehold");
    let script = run_cli(sandbox, &["completions", "bash"], &[]).await?.success()?.stdout;
    let path = sandbox.path().join("leasehold.bash");
    std::fs::write(&path, &script).context("writing the bash script")?;
    let parsed = bash(&format!("bash -n '{}'", path.display())).await?;
    ensure!(
        parsed.status.success(),
        "bash -n refused the script: {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let sourced = bash(&format!("source '{}' && complete -p leasehold", path.display())).await?;
    let registered = String::from_utf8_lossy(&sourced.stdout).to_string();
    ensure!(
        sourced.status.success(),
        "sourcing the script failed: {}",
        String::from_utf8_lossy(&sourced.stderr)
    );
    let function = registered
        .split_whitespace()
        .skip_while(|word| *word != "-F")
        .nth(1)
        .with_context(|| format!("complete -p names no function: {registered:?}"))?
        .to_string();
    let defined = bash(&format!("source '{}' && declare -F {function}", path.display())).await?;
    ensure!(defined.status.success(), "the completion function {function} is not defined");
    // The function offers the subcommands: ask it as bash would for `leasehold jo<TAB>`.
    let offered = bash(&format!(
        "source '{}' && COMP_WORDS=(leasehold jo) COMP_CWORD=1 COMP_LINE='leasehold jo' \
         COMP_POINT=12 && {function} leasehold jo leasehold && printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        path.display()
    ))
    .await?;
    let offered = String::from_utf8_lossy(&offered.stdout).to_string();
    ensure!(offered.lines().any(|l| l.trim() == "job"), "leasehold jo<TAB> offers {offered:?}");

    for shell in ["zsh", "fish"] {
        phase(&format!("completions {shell}: a script for leasehold"));
        let script = run_cli(sandbox, &["completions", shell], &[]).await?.success()?.stdout;
        ensure!(
            script.contains("leasehold") && script.contains("enqueue"),
            "{shell} script does not complete leasehold's subcommands: {script:?}"
        );
    }

    phase("an unknown shell is refused, naming the choices");
    let refused = run_cli(sandbox, &["completions", "tcsh"], &[]).await?;
    ensure!(!refused.status.success(), "completions tcsh exited 0");
    ensure!(refused.stderr.contains("bash"), "refusal does not list bash: {:?}", refused.stderr);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_node_answering_is_one_line_naming_the_addresses() -> Result<()> {
    let sandbox = Sandbox::new("cli-unreachable")?;
    sandbox.run(Duration::from_secs(60), unreachable_story(&sandbox)).await
}

async fn unreachable_story(sandbox: &Sandbox) -> Result<()> {
    // Free ports with nothing listening: a connection is refused at once.
    let (first, second) = (free_port()?, free_port()?);
    let one = format!("http://127.0.0.1:{first}");
    let both = format!("127.0.0.1:{first},127.0.0.1:{second}");
    for (args, env, named) in [
        (vec!["job", "stats", "--addr", one.as_str()], vec![], vec![format!("127.0.0.1:{first}")]),
        (
            vec!["cluster", "status"],
            vec![("LEASEHOLD_ADDR", both.as_str())],
            vec![format!("127.0.0.1:{first}"), format!("127.0.0.1:{second}")],
        ),
        (
            vec!["job", "enqueue", "--queue", "q", "--payload", "x", "--addr", one.as_str()],
            vec![],
            vec![format!("127.0.0.1:{first}")],
        ),
    ] {
        phase(&format!("leasehold {} with no node there", args.join(" ")));
        let run = run_cli(sandbox, &args, &env).await?;
        ensure!(!run.status.success(), "exited 0 with no node: {:?}", run.stdout);
        let stderr = run.stderr.trim_end();
        ensure!(stderr.lines().count() == 1, "not one line: {stderr:?}");
        for address in &named {
            ensure!(stderr.contains(address.as_str()), "{stderr:?} does not name {address}");
        }
        for hint in ["no node answered", "LEASEHOLD_ADDR", "--addr", "https://", "refused"] {
            ensure!(stderr.contains(hint), "{stderr:?} does not say {hint:?}");
        }
        // Refused: nothing was sent, so nothing may have been applied.
        ensure!(!stderr.contains("may have been applied"), "{stderr:?} doubts a refused call");
        for noise in ["panicked", "backtrace", "Status {", "tcp connect error"] {
            ensure!(!stderr.contains(noise), "{stderr:?} carries {noise:?}");
        }
    }

    phase("bulk enqueue with no node there: the summary still comes, naming what was not sent");
    let file = sandbox.path().join("three.jsonl");
    std::fs::write(&file, "{\"payload\": \"a\"}\n{\"payload\": \"b\"}\n{\"payload\": \"c\"}\n")?;
    let file = file.display().to_string();
    let args = [
        "job",
        "enqueue",
        "--file",
        &file,
        "--queue",
        "q",
        "--batch-size",
        "1",
        "--addr",
        &both,
        "--output",
        "json",
    ];
    let run = run_cli(sandbox, &args, &[]).await?;
    ensure!(run.status.code() == Some(1), "{:?}: {}", run.status, run.stderr);
    let summary = run.json()?;
    ensure!(
        summary["failed"] == 1
            && summary["unsent"] == 2
            && summary["unsent_lines"] == serde_json::json!({"first": 2, "last": 3}),
        "{summary}"
    );
    ensure!(run.stderr.contains("lines 2-3 were not sent"), "{}", run.stderr);
    Ok(())
}

/// The rows of a table the CLI printed: header words mapped to cells.
fn table_rows(text: &str) -> Result<Vec<Vec<(String, String)>>> {
    let mut lines = text.lines();
    let header: Vec<String> =
        lines.next().context("empty table")?.split_whitespace().map(str::to_string).collect();
    let mut rows = Vec::new();
    for line in lines {
        let cells: Vec<&str> = line.split_whitespace().collect();
        ensure!(cells.len() == header.len(), "row {line:?} does not match header {header:?}");
        rows.push(header.iter().cloned().zip(cells.iter().map(|c| c.to_string())).collect());
    }
    Ok(rows)
}

fn cell<'a>(row: &'a [(String, String)], column: &str) -> Result<&'a str> {
    row.iter()
        .find(|(name, _)| name == column)
        .map(|(_, value)| value.as_str())
        .with_context(|| format!("no column {column} in {row:?}"))
}

const BULK_QUEUE: &str = "bulk";
const BULK_JOBS: usize = 10_000;
/// Lines that repeat an idempotency key of an earlier line.
const REPEATED_KEYS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_enqueue_tables_and_redrive_against_a_node() -> Result<()> {
    let sandbox = Sandbox::new("cli-bulk")?;
    sandbox.run(Duration::from_secs(120), bulk_story(&sandbox)).await
}

async fn bulk_story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1");
    let node = Node::start(sandbox).await?;
    let addr = node.addr();
    let env = [("LEASEHOLD_ADDR", addr.as_str())];
    let mut stub = node.stub()?;

    phase("a file with bad lines is refused whole, naming each line and field");
    let bad = sandbox.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"payload\":\"fine\"}\n\n{\"payload\":\"x\",\"priority\":\"high\"}\n\
         {\"payload\":\"y\",\"prioriy\":1}\n{\"queue\":\"Not A Queue\"}\n",
    )
    .context("writing bad.jsonl")?;
    let bad_text = bad.to_string_lossy().to_string();
    let refused =
        run_cli(sandbox, &["job", "enqueue", "--file", &bad_text, "--queue", BULK_QUEUE], &env)
            .await?;
    ensure!(!refused.status.success(), "a bad file exited 0: {:?}", refused.stdout);
    for (line, field) in [(3, "priority"), (4, "prioriy"), (5, "queue")] {
        let named = refused.stderr.lines().any(|l| {
            l.contains(&format!("line {line}:")) && l.contains(&format!("{field}:"))
                || l.contains(&format!("line {line}:")) && l.contains(&format!("`{field}`"))
        });
        ensure!(named, "stderr does not name line {line} and {field}: {:?}", refused.stderr);
    }
    ensure!(refused.stderr.contains("nothing was enqueued"), "stderr: {:?}", refused.stderr);
    let untouched = queue_stats(&mut stub, BULK_QUEUE).await?;
    ensure!(untouched.ready == 0, "the refused file enqueued jobs: {untouched:?}");

    phase("10,000 jobs from a file, some repeating an idempotency key, end with the counts");
    let mut text = String::new();
    for n in 0..BULK_JOBS {
        text.push_str(&format!(
            "{{\"payload\":\"job-{n}\",\"priority\":{},\"idempotency_key\":\"k-{n}\"}}\n",
            n % 3
        ));
    }
    for n in 0..REPEATED_KEYS {
        text.push_str(&format!("{{\"payload\":\"again-{n}\",\"key\":\"k-{n}\"}}\n"));
    }
    let jobs = sandbox.path().join("jobs.jsonl");
    std::fs::write(&jobs, text).context("writing jobs.jsonl")?;
    let jobs_text = jobs.to_string_lossy().to_string();
    let started = std::time::Instant::now();
    let done =
        run_cli(sandbox, &["job", "enqueue", "--file", &jobs_text, "--queue", BULK_QUEUE], &env)
            .await?
            .success()?;
    eprintln!("bulk enqueue took {:?}", started.elapsed());
    let summary = done.stdout.trim();
    let expected = format!(
        "{BULK_JOBS} enqueued, {REPEATED_KEYS} duplicates, 0 failed, 0 unknown, 0 not sent ({} jobs in 11 batches)",
        BULK_JOBS + REPEATED_KEYS
    );
    ensure!(summary == expected, "summary {summary:?}, expected {expected:?}");
    ensure!(done.stderr.trim().is_empty(), "no progress bar off a terminal: {:?}", done.stderr);

    phase("the node's own counts: 10,000 ready");
    let stats = queue_stats(&mut stub, BULK_QUEUE).await?;
    ensure!(stats.ready == BULK_JOBS as u64, "stats after the bulk enqueue: {stats:?}");

    phase("job stats prints a table with that row");
    let printed = run_cli(sandbox, &["job", "stats"], &env).await?.success()?.stdout;
    let rows = table_rows(&printed)?;
    let bulk = rows
        .iter()
        .find(|row| cell(row, "QUEUE").ok() == Some(BULK_QUEUE))
        .with_context(|| format!("no {BULK_QUEUE} row in {printed:?}"))?;
    ensure!(cell(bulk, "READY")? == BULK_JOBS.to_string(), "stats table: {printed:?}");
    ensure!(cell(bulk, "DEAD")? == "0", "stats table: {printed:?}");

    phase("cluster status prints the member table");
    let printed = run_cli(sandbox, &["cluster", "status"], &env).await?.success()?.stdout;
    ensure!(printed.starts_with("Leader: node 1"), "status: {printed:?}");
    let members = printed.split("\n\n").nth(1).context("no member table")?;
    let rows = table_rows(members.split("\n\nGate:").next().unwrap_or(members))?;
    ensure!(rows.len() == 1, "one member expected: {printed:?}");
    ensure!(cell(&rows[0], "ID")? == "1", "status: {printed:?}");
    ensure!(cell(&rows[0], "ROLE")? == "leader", "status: {printed:?}");
    ensure!(cell(&rows[0], "READY")? == "yes", "status: {printed:?}");
    ensure!(cell(&rows[0], "ADDRESS")? == node.grpc.to_string(), "status: {printed:?}");
    ensure!(printed.contains("\nGate:\nNODE"), "no gate table: {printed:?}");

    phase("make three jobs of another queue dead, then redrive them with a count");
    let dead_queue = "doomed";
    let specs = (0..3)
        .map(|n| v1::JobSpec {
            queue: dead_queue.to_string(),
            payload: format!("d-{n}").into_bytes(),
            max_attempts: Some(1),
            ..Default::default()
        })
        .collect();
    stub.enqueue(v1::EnqueueRequest { jobs: specs }).await.context("enqueue doomed")?;
    let grants = stub
        .claim(v1::ClaimRequest {
            worker: "doom".into(),
            queue: dead_queue.into(),
            max: 3,
            ..Default::default()
        })
        .await
        .context("claim doomed")?
        .into_inner()
        .grants;
    ensure!(grants.len() == 3, "claimed {} of 3", grants.len());
    let mut ids = Vec::new();
    for grant in grants {
        let Some(lease) = grant.lease else { bail!("grant without lease") };
        ids.push(lease.job_id);
        stub.nack(v1::NackRequest {
            job_id: lease.job_id,
            token: lease.token,
            error: "boom".into(),
            retry_after_ms: None,
        })
        .await
        .context("nack")?;
    }
    ensure!(queue_stats(&mut stub, dead_queue).await?.dead == 3, "the jobs did not die");
    let redriven =
        run_cli(sandbox, &["job", "redrive", "--queue", dead_queue], &env).await?.success()?;
    ensure!(
        redriven.stdout.trim() == "3 redriven (3/3 dead jobs of doomed)",
        "redrive printed {:?}",
        redriven.stdout
    );
    let after = queue_stats(&mut stub, dead_queue).await?;
    ensure!(after.dead == 0 && after.ready == 3, "after redrive: {after:?}");

    phase("redrive by id counts the listed jobs that were dead");
    let grants = stub
        .claim(v1::ClaimRequest {
            worker: "doom".into(),
            queue: dead_queue.into(),
            max: 1,
            ..Default::default()
        })
        .await
        .context("claim one")?
        .into_inner()
        .grants;
    let lease = grants.into_iter().next().and_then(|g| g.lease).context("no grant")?;
    stub.nack(v1::NackRequest {
        job_id: lease.job_id,
        token: lease.token,
        error: "boom".into(),
        retry_after_ms: None,
    })
    .await
    .context("nack")?;
    let (dead, alive) = (lease.job_id.to_string(), ids.iter().find(|id| **id != lease.job_id));
    let alive = alive.context("another id")?.to_string();
    let redriven = run_cli(sandbox, &["job", "redrive", "--job", &dead, "--job", &alive], &env)
        .await?
        .success()?;
    ensure!(
        redriven.stdout.trim() == "1 redriven (1/2 listed jobs were dead)",
        "redrive printed {:?}",
        redriven.stdout
    );
    ensure!(
        redriven.stderr.contains("2/2 jobs asked, 1 redriven so far"),
        "no progress count: {:?}",
        redriven.stderr
    );
    Ok(())
}
