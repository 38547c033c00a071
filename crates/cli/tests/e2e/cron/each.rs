//! Story 5 of the cron stories: a `target = each` schedule on three nodes,
//! one of them SIGKILLed — the two live nodes go on running every tick, and
//! the dead member's ticks show in history as skipped with their reason
//! (`target_offline`), instead of its stuck job skipping everyone's later
//! ticks as an overlap.
//!
//! Method: the schedule's command appends `$LEASEHOLD_BUCKET
//! $LEASEHOLD_NODE_ID` to a file in the sandbox; that file judges who ran
//! what. The schedule keeps the default `overlap = skip`, which is what a
//! dead member's unrun job used to trip.
//!
//! Mutation check (run once against a deliberately broken build): the
//! driver proposing the old whole-schedule `Fire` with every registered
//! member (no liveness, one overlap for all) fails the story: after the
//! kill, no tick runs on the live nodes (each is skipped as an overlap).

use super::*;

/// Schedule of the story.
const FLEET: &str = "fleet";
/// Ticks in a row both live nodes must run after the kill.
const LIVE_TICKS: usize = 5;

/// `BUCKET NODE` lines of the runs file, as (bucket, node).
fn runs_by_node(file: &Path) -> Result<Vec<(u64, u64)>> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(error).with_context(|| format!("reading {}", file.display())),
    };
    text.lines()
        .map(|line| {
            let mut words = line.split_whitespace().map(str::parse::<u64>);
            match (words.next(), words.next()) {
                (Some(Ok(bucket)), Some(Ok(node))) => Ok((bucket, node)),
                _ => bail!("a runs line that is not 'BUCKET NODE': {line:?}"),
            }
        })
        .collect()
}

/// The buckets every one of `nodes` ran.
fn ran_by_all(runs: &[(u64, u64)], nodes: &[u64]) -> BTreeSet<u64> {
    let mut by_bucket: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for (bucket, node) in runs {
        by_bucket.entry(*bucket).or_default().insert(*node);
    }
    by_bucket
        .into_iter()
        .filter(|(_, ran)| nodes.iter().all(|node| ran.contains(node)))
        .map(|(bucket, _)| bucket)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_schedule_runs_on_the_live_nodes_when_one_is_killed() -> Result<()> {
    let _slot = super::super::cluster::cluster_slot().await?;
    let sandbox = Sandbox::new("cron-each")?;
    sandbox.run(Duration::from_secs(150), each_story(&sandbox)).await
}

async fn each_story(sandbox: &Sandbox) -> Result<()> {
    phase("three nodes; an every-second schedule with target = each");
    let mut cluster = Cluster::start(sandbox, 3).await?;
    let addr = cluster.node(1)?.addr();
    let runs = sandbox.path().join("runs");
    let command = format!(r#"echo "$LEASEHOLD_BUCKET $LEASEHOLD_NODE_ID" >> '{}'"#, runs.display());
    let put = ["cron", "put", FLEET, "--cron", "* * * * * *", "--target", "each", "--command"];
    let mut args: Vec<&str> = put.to_vec();
    args.push(&command);
    cli(sandbox, &addr, &args).await?.success()?;

    phase("every node runs the ticks");
    let all = [1, 2, 3];
    wait_until("a tick run on all three nodes", deadline_in(Duration::from_secs(30)), || {
        let seen = runs_by_node(&runs);
        async move {
            let ran = ran_by_all(&seen?, &all);
            Ok(match ran.len() {
                0 => Check::NotYet("no bucket ran everywhere yet".into()),
                _ => Check::Done(()),
            })
        }
    })
    .await?;

    phase("SIGKILL a follower");
    let leader = cluster.wait_leader_among(&all, Duration::from_secs(30)).await?;
    let dead = all.into_iter().rev().find(|id| *id != leader).context("a follower")?;
    let live: Vec<u64> = all.into_iter().filter(|id| *id != dead).collect();
    cluster.node_mut(dead)?.kill()?;
    let killed_at = unix_ms()? / 1_000;

    phase("the two live nodes run tick after tick");
    let within = Duration::from_secs(60);
    let what = format!("{LIVE_TICKS} ticks in a row run on nodes {live:?} after the kill");
    let streak = wait_until(&what, deadline_in(within), || {
        let seen = runs_by_node(&runs);
        let live = live.clone();
        async move {
            let ran: Vec<u64> =
                ran_by_all(&seen?, &live).into_iter().filter(|b| *b > killed_at + 4).collect();
            let longest = ran
                .windows(LIVE_TICKS)
                .find(|window| {
                    window
                        .last()
                        .zip(window.first())
                        .is_some_and(|(l, f)| l - f == (LIVE_TICKS as u64 - 1))
                })
                .map(<[u64]>::to_vec);
            Ok(match longest {
                Some(window) => Check::Done(window),
                None => Check::NotYet(format!("buckets run by both since: {ran:?}")),
            })
        }
    })
    .await?;
    let seen = runs_by_node(&runs)?;
    ensure!(
        !seen.iter().any(|(bucket, node)| *node == dead && streak.contains(bucket)),
        "the dead node ran a tick: {seen:?}"
    );

    phase("history names the dead member's ticks: skipped, target_offline");
    let live_addr = cluster.node(live[0])?.addr();
    let ticks = history(sandbox, &live_addr, FLEET).await?;
    for bucket in &streak {
        let records: Vec<&Tick> = ticks.iter().filter(|t| t.bucket == *bucket).collect();
        ensure!(
            records.iter().any(|t| t.is_fired() && t.job_ids.len() == live.len()),
            "bucket {bucket} did not fire once per live node: {records:?}"
        );
        ensure!(
            records.iter().any(|t| t.is_skipped("target_offline") && t.ticks == 1),
            "bucket {bucket} does not record the dead member: {records:?}"
        );
    }

    phase("the dead node comes back and runs again");
    let sandbox_ref = sandbox;
    cluster.restart(sandbox_ref, dead).await?;
    wait_until("a tick run on all three nodes again", deadline_in(Duration::from_secs(40)), || {
        let seen = runs_by_node(&runs);
        let after = streak.last().copied().unwrap_or(0);
        async move {
            let ran = ran_by_all(&seen?, &all);
            Ok(match ran.into_iter().find(|b| *b > after) {
                Some(bucket) => Check::Done(bucket),
                None => Check::NotYet("not yet".into()),
            })
        }
    })
    .await?;
    Ok(())
}
