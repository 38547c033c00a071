//! Story 2 of the cron stories: the catch-up policies after a long outage.

use super::*;

/// The schedule the issue names: every second. At a restart its newest due
/// tick is always *current* (less than a second old), so it fires on its
/// own right and every older tick is missed. Under `coalesce` the current
/// run stands for the missed ones, which makes `coalesce` and `skip` plan
/// alike for it: one skip record, then the current tick.
const EVERY_SECOND: &str = "every-second";
/// Every second of the first half of each minute. The tick-less half is
/// what lets a restart see *only* missed ticks, so `coalesce` (run the
/// newest missed tick once) and `skip` (run none) differ, and a test can
/// tell them apart.
const HALF_MINUTE: &str = "half-minute";
/// [`HALF_MINUTE`]'s expression.
const HALF_MINUTE_CRON: &str = "0-29 * * * * *";
/// Ticks per minute of [`HALF_MINUTE_CRON`].
const TICKS_PER_MINUTE: u64 = 30;
/// How far the node's clock jumps while it is down (plus up to a minute
/// to align it, below): five minutes, 300 missed every-second ticks —
/// three times Kubernetes' 100-missed-run cliff.
const OUTAGE_MS: i64 = 300_000;
/// Where in its minute the restarted node's clock starts: 8 s past the
/// last tick of the half-minute (second 29), so that tick is already
/// missed, with 22 s to spare before the next minute's first tick.
const RESTART_SECOND_MS: i64 = 37_000;
/// `--catchup-max` of the `all` story.
const CATCHUP_MAX: u64 = 20;

/// The catch-up policy under test.
#[derive(Clone, Copy, Debug)]
enum Policy {
    Coalesce,
    Skip,
    All,
}

impl Policy {
    fn flag(self) -> &'static str {
        match self {
            Policy::Coalesce => "coalesce",
            Policy::Skip => "skip",
            Policy::All => "all",
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catchup_coalesce_runs_the_newest_missed_tick_once() -> Result<()> {
    let sandbox = Sandbox::new("cron-catchup-coalesce")?;
    sandbox.run(Duration::from_secs(120), catchup_story(&sandbox, Policy::Coalesce)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catchup_skip_runs_none_of_the_missed_ticks() -> Result<()> {
    let sandbox = Sandbox::new("cron-catchup-skip")?;
    sandbox.run(Duration::from_secs(120), catchup_story(&sandbox, Policy::Skip)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catchup_all_runs_at_most_catchup_max_missed_ticks() -> Result<()> {
    let sandbox = Sandbox::new("cron-catchup-all")?;
    sandbox.run(Duration::from_secs(120), catchup_story(&sandbox, Policy::All)).await
}

/// One node and two schedules under `policy` ([`EVERY_SECOND`] and
/// [`HALF_MINUTE`]); a couple of ticks fire, the node drains and stops,
/// and comes back with its clock five minutes (and up to one more, to land
/// in the tick-less half of a minute) ahead. The restarted leader plans
/// every missed tick at once; the story checks each plan record by record
/// against what the policy promises, in history and in the commands' own
/// output: a bounded number of runs, never hundreds.
async fn catchup_story(sandbox: &Sandbox, policy: Policy) -> Result<()> {
    let runs_file = |name: &str| sandbox.path().join(format!("runs-{name}.txt"));

    phase("start node 1 with its clock at second 1 of a minute");
    let first_offset_ms = {
        let now_ms = unix_ms_signed()?;
        (61_000 - now_ms.rem_euclid(60_000)).rem_euclid(60_000)
    };
    let config = write_config(sandbox, "clock-1.toml", &clock_config(first_offset_ms))?;
    let mut node = Node::new(sandbox, 1, Some(config), None)?;
    node.launch(sandbox)?;
    wait_serving(&mut node, "node 1 to lead and serve reads", |l| l == 1).await?;

    phase(&format!("put both schedules with catch-up {}", policy.flag()));
    let catchup_max = CATCHUP_MAX.to_string();
    for (name, cron) in [(EVERY_SECOND, "* * * * * *"), (HALF_MINUTE, HALF_MINUTE_CRON)] {
        let command = append_run_command(&runs_file(name));
        let mut args = vec!["cron", "put", name, "--cron", cron, "--command", &command];
        args.extend(["--overlap", "allow", "--catchup", policy.flag()]);
        if let Policy::All = policy {
            args.extend(["--catchup-max", &catchup_max]);
        }
        cli(sandbox, &node.addr(), &args).await?.success()?;
    }

    phase("let two half-minute ticks fire, then stop the node (SIGTERM: drain, exit)");
    let client = quiet_client(&node.addr())?;
    wait_until("two fired half-minute ticks", deadline_in(Duration::from_secs(70)), || {
        let client = client.clone();
        async move {
            let schedule = match schedule_of(&client, HALF_MINUTE, false).await {
                Ok(schedule) => schedule,
                Err(error) => return Ok(Check::NotYet(format!("{error:#}"))),
            };
            Ok(if schedule.fired_count >= 2 {
                Check::Done(())
            } else {
                Check::NotYet(format!("fired {}", schedule.fired_count))
            })
        }
    })
    .await?;
    node.stop(deadline_in(STOP_TIMEOUT)).await?;
    let stopped_ms = unix_ms_signed()?;
    // Every bucket fired before the stop lies at or below this one; every
    // bucket of the restarted node lies five minutes beyond it.
    let stopped_bucket = u64::try_from((stopped_ms + first_offset_ms) / 1_000)?;

    phase("restart node 1 with its clock 5-6 minutes ahead, in a tick-less half-minute");
    let (second_offset_ms, newest_missed) = {
        let now_ms = unix_ms_signed()?;
        let jumped_ms = now_ms + first_offset_ms + OUTAGE_MS;
        let align_ms = (RESTART_SECOND_MS - jumped_ms.rem_euclid(60_000)).rem_euclid(60_000);
        let offset_ms = first_offset_ms + OUTAGE_MS + align_ms;
        let node_now_ms = now_ms + offset_ms;
        let minute_s = u64::try_from(node_now_ms.div_euclid(60_000) * 60)?;
        (offset_ms, minute_s + TICKS_PER_MINUTE - 1)
    };
    let config = write_config(sandbox, "clock-2.toml", &clock_config(second_offset_ms))?;
    node.config = Some(config);
    let restarted_ms = unix_ms_signed()?;
    node.launch(sandbox)?;
    wait_serving(&mut node, "node 1 to lead again", |l| l == 1).await?;
    eprintln!(
        "node clock offset {first_offset_ms} ms before the stop, {second_offset_ms} ms after"
    );

    phase("wait for the restarted leader to plan the missed ticks, then pause both");
    let client = quiet_client(&node.addr())?;
    for name in [EVERY_SECOND, HALF_MINUTE] {
        wait_until(
            &format!("{name}: the ticks up to bucket {newest_missed} to be planned"),
            deadline_in(Duration::from_secs(20)),
            || {
                let client = client.clone();
                async move {
                    let schedule = match schedule_of(&client, name, false).await {
                        Ok(schedule) => schedule,
                        Err(error) => return Ok(Check::NotYet(format!("{error:#}"))),
                    };
                    Ok(if schedule.last_fired_bucket >= newest_missed {
                        Check::Done(())
                    } else {
                        Check::NotYet(format!("last fired bucket {}", schedule.last_fired_bucket))
                    })
                }
            },
        )
        .await?;
    }
    // The restarted leader's first plan ran between these two instants of
    // its clock: its current tick lies between them.
    let planned_between = u64::try_from((restarted_ms + second_offset_ms) / 1_000)?
        ..=u64::try_from((unix_ms_signed()? + second_offset_ms) / 1_000)?;
    for name in [EVERY_SECOND, HALF_MINUTE] {
        cli(sandbox, &node.addr(), &["cron", "pause", name]).await?.success()?;
    }
    wait_for_paused_record(&client, EVERY_SECOND).await?;
    let jobs = wait_all_acked(&client).await?;

    let mut fired_jobs = 0;
    for name in [EVERY_SECOND, HALF_MINUTE] {
        phase(&format!("{name}: check the plan of the missed ticks, record by record"));
        let history = history(sandbox, &node.addr(), name).await?;
        let catchup = if name == HALF_MINUTE {
            half_minute_plan(policy, &history, stopped_bucket, newest_missed)?
        } else {
            every_second_plan(policy, &history, stopped_bucket, &planned_between)?
        };
        for tick in &catchup.records {
            eprintln!("  {tick:?}");
        }
        catchup.check(policy)?;

        phase(&format!("{name}: check the commands' own output: each fired tick ran once"));
        let runs = read_runs(&runs_file(name))?;
        let by_bucket = runs_by_bucket(&runs);
        let fired: Vec<u64> = history.iter().filter(|t| t.is_fired()).map(|t| t.bucket).collect();
        check_each_bucket_ran_once(&by_bucket, &fired)?;
        let ran_missed: Vec<u64> =
            by_bucket.keys().copied().filter(|b| catchup.missed.contains(b)).collect();
        let expected_runs: Vec<u64> = catchup
            .expected
            .iter()
            .filter_map(|e| match e {
                Expected::Fired { bucket, .. } => Some(*bucket),
                Expected::Skipped { .. } => None,
            })
            .collect();
        ensure!(
            ran_missed == expected_runs,
            "{name}, catch-up {}: of {} missed ticks, {} ran ({}); expected {}",
            policy.flag(),
            catchup.missed.len(),
            ran_missed.len(),
            describe_buckets(&ran_missed),
            describe_buckets(&expected_runs)
        );
        fired_jobs += fired.len() as u64;
    }
    ensure!(jobs == fired_jobs, "{jobs} jobs exist for {fired_jobs} fired ticks");
    Ok(())
}

/// What a restarted leader planned for one schedule: the ticks missed, the
/// records history holds for them, and the records the policy promises.
struct CatchupPlan {
    name: &'static str,
    missed: Vec<u64>,
    records: Vec<Tick>,
    expected: Vec<Expected>,
}

impl CatchupPlan {
    fn check(&self, policy: Policy) -> Result<()> {
        let count = self.missed.len() as u64;
        ensure!(
            self.records.len() == self.expected.len(),
            "{}, catch-up {} of {count} missed ticks: expected {} records {:?}, history has {:?}",
            self.name,
            policy.flag(),
            self.expected.len(),
            self.expected,
            self.records
        );
        for (tick, expected) in self.records.iter().zip(&self.expected) {
            expected.check(tick)?;
        }
        let accounted: u64 =
            self.records.iter().map(|t| if t.is_fired() { 1 } else { t.ticks }).sum();
        ensure!(accounted == count, "{}: history accounts for {accounted} of {count}", self.name);
        Ok(())
    }
}

/// The half-minute schedule restarts in its tick-less half: every due tick
/// up to `newest_missed` is missed, none is current.
fn half_minute_plan(
    policy: Policy,
    history: &[Tick],
    stopped_bucket: u64,
    newest_missed: u64,
) -> Result<CatchupPlan> {
    let last_before_stop = last_bucket_before(history, stopped_bucket)?;
    let missed: Vec<u64> =
        (last_before_stop + 1..=newest_missed).filter(|b| b % 60 < TICKS_PER_MINUTE).collect();
    let count = missed.len() as u64;
    eprintln!("{HALF_MINUTE}: {count} ticks missed after bucket {last_before_stop}, none current");
    ensure!(count > 100, "only {count} ticks were missed; the outage proves too little");
    let late = |bucket| Expected::Fired { bucket, min_lag_ms: TICK_TOLERANCE_MS };
    let skip = |bucket, ticks| Expected::Skipped { bucket, ticks };
    let expected = match policy {
        // One run, for the newest missed tick; the rest is one skip record.
        Policy::Coalesce => vec![skip(newest_missed - 1, count - 1), late(newest_missed)],
        // No run at all; one skip record for every missed tick.
        Policy::Skip => vec![skip(newest_missed, count)],
        // The newest `catchup_max` run, each once; the older ones are one
        // skip record.
        Policy::All => {
            let kept = &missed[missed.len() - CATCHUP_MAX as usize..];
            let mut plan = vec![skip(kept[0] - 1, count - CATCHUP_MAX)];
            plan.extend(kept.iter().map(|&bucket| late(bucket)));
            plan
        }
    };
    let records = history
        .iter()
        .filter(|t| t.bucket > last_before_stop && t.bucket <= newest_missed)
        .cloned()
        .collect();
    Ok(CatchupPlan { name: HALF_MINUTE, missed, records, expected })
}

/// The every-second schedule restarts with a current tick, the newest tick
/// of the restarted leader's first plan: it fires on its own right, and the
/// plan's records for the missed ticks come before it — one catch-up skip
/// record first, then (under `all`) the fired ones.
fn every_second_plan(
    policy: Policy,
    history: &[Tick],
    stopped_bucket: u64,
    planned_between: &std::ops::RangeInclusive<u64>,
) -> Result<CatchupPlan> {
    let last_before_stop = last_bucket_before(history, stopped_bucket)?;
    let after: Vec<&Tick> = history.iter().filter(|t| t.bucket > last_before_stop).collect();
    let skip_record = after.first().with_context(|| "no record after the restart")?;
    ensure!(
        skip_record.is_skipped("catchup"),
        "{EVERY_SECOND}: the first record after the outage is not a catch-up skip: {after:?}"
    );
    let fired_missed = match policy {
        Policy::Coalesce | Policy::Skip => 0,
        Policy::All => CATCHUP_MAX,
    };
    let current = skip_record.bucket + fired_missed + 1;
    ensure!(
        planned_between.contains(&current),
        "{EVERY_SECOND}: by its skip record the first plan's current tick is {current}, but \
         the plan ran between buckets {planned_between:?} of the node's clock: {after:?}"
    );
    let missed: Vec<u64> = (last_before_stop + 1..current).collect();
    let count = missed.len() as u64;
    eprintln!(
        "{EVERY_SECOND}: {count} ticks missed after bucket {last_before_stop}; {current} current"
    );
    ensure!(count >= 300, "only {count} ticks were missed; the outage proves too little");
    // A missed tick fires at least as late as it is older than the current one.
    let late = |bucket: u64| Expected::Fired { bucket, min_lag_ms: (current - bucket) * 1_000 };
    let skip = |bucket, ticks| Expected::Skipped { bucket, ticks };
    let expected = match policy {
        // The current run stands for the missed ones (coalesce), or they
        // are not run at all (skip): one skip record either way.
        Policy::Coalesce | Policy::Skip => vec![skip(current - 1, count)],
        // The newest `catchup_max` missed ticks run, each once; the older
        // ones are one skip record.
        Policy::All => {
            let first_kept = current - CATCHUP_MAX;
            let mut plan = vec![skip(first_kept - 1, count - CATCHUP_MAX)];
            plan.extend((first_kept..current).map(late));
            plan
        }
    };
    let on_time = after.iter().find(|t| t.bucket == current);
    ensure!(
        on_time.is_some_and(|t| t.is_fired() && t.lag_ms < TICK_TOLERANCE_MS),
        "{EVERY_SECOND}: the current tick {current} did not fire on time: {on_time:?}"
    );
    let records = after.iter().filter(|t| t.bucket < current).map(|t| (*t).clone()).collect();
    Ok(CatchupPlan { name: EVERY_SECOND, missed, records, expected })
}

/// The newest bucket recorded at or before `stopped_bucket`.
fn last_bucket_before(history: &[Tick], stopped_bucket: u64) -> Result<u64> {
    history
        .iter()
        .map(|t| t.bucket)
        .filter(|&b| b <= stopped_bucket)
        .max()
        .context("no tick recorded before the stop")
}

/// One record a catch-up plan must have produced.
#[derive(Debug)]
enum Expected {
    /// A missed tick fired, at least `min_lag_ms` after its instant.
    Fired { bucket: u64, min_lag_ms: u64 },
    /// A skip record standing for `ticks` missed ticks up to `bucket`.
    Skipped { bucket: u64, ticks: u64 },
}

impl Expected {
    fn check(&self, tick: &Tick) -> Result<()> {
        match *self {
            Expected::Fired { bucket, min_lag_ms } => ensure!(
                tick.bucket == bucket
                    && tick.is_fired()
                    && tick.job_ids.len() == 1
                    && tick.lag_ms >= min_lag_ms
                    && tick.late == (tick.lag_ms >= LATE_AFTER_MS),
                "expected bucket {bucket} fired once with lag >= {min_lag_ms} ms (late from \
                 {LATE_AFTER_MS} ms), got {tick:?}"
            ),
            Expected::Skipped { bucket, ticks } => ensure!(
                tick.bucket == bucket && tick.is_skipped("catchup") && tick.ticks == ticks,
                "expected one catch-up skip of {ticks} ticks up to bucket {bucket}, got {tick:?}"
            ),
        }
        Ok(())
    }
}

fn clock_config(offset_ms: i64) -> String {
    format!("fault_injection = true\nclock_offset_ms = {offset_ms}\n")
}
