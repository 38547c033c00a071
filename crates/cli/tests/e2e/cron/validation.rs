//! Story 4 of the cron stories: invalid expressions and zones are refused
//! by name.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_cron_and_timezone_are_refused_by_name() -> Result<()> {
    let sandbox = Sandbox::new("cron-validation")?;
    sandbox.run(Duration::from_secs(60), validation_story(&sandbox)).await
}

/// One node with one valid schedule. Putting an out-of-range minute or an
/// unknown zone — as a new schedule or over the valid one — fails with
/// INVALID_ARGUMENT naming the field, through the CLI and over raw gRPC,
/// and leaves `cron list` as it was.
async fn validation_story(sandbox: &Sandbox) -> Result<()> {
    phase("start node 1 and put one valid schedule");
    let node = Node::start(sandbox).await?;
    let addr = node.addr();
    let valid = [
        "cron",
        "put",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Berlin",
        "--command",
        "true",
    ];
    cli(sandbox, &addr, &valid).await?.success()?;
    let before = schedule_specs(sandbox, &addr).await?;

    let cases: [(&str, &str, &str, &[&str]); 5] = [
        ("new", "61 * * * *", "", &["cron", "61"]),
        ("nightly", "61 * * * *", "", &["cron", "61"]),
        // Parses, but no February has a 30th: it would never fire.
        ("new", "0 0 30 2 *", "", &["cron", "matches no date"]),
        ("new", "0 3 * * *", "Mars/Base", &["timezone", "Mars/Base"]),
        ("nightly", "0 3 * * *", "Mars/Base", &["timezone", "Mars/Base"]),
    ];
    for (name, cron, zone, named) in cases {
        phase(&format!("put {name} --cron {cron:?} --timezone {zone:?}: refused by name"));
        let mut args = vec!["cron", "put", name, "--cron", cron, "--command", "true"];
        if !zone.is_empty() {
            args.extend(["--timezone", zone]);
        }
        let refused = cli(sandbox, &addr, &args).await?;
        let stderr = refused.stderr.to_lowercase();
        ensure!(
            !refused.status.success()
                && stderr.contains("(invalidargument)")
                && named.iter().all(|word| stderr.contains(&word.to_lowercase())),
            "cron put {args:?}: {}; stderr {:?} should name INVALID_ARGUMENT and {named:?}",
            refused.status,
            refused.stderr
        );

        let spec = v1::ScheduleSpec {
            name: name.to_string(),
            cron: cron.to_string(),
            timezone: zone.to_string(),
            template: Some(v1::JobTemplate {
                command: Some("true".to_string()),
                ..Default::default()
            }),
            catchup_window_ms: 3_600_000,
            catchup_max: 10,
            ..Default::default()
        };
        let mut request = tonic::Request::new(v1::PutScheduleRequest { spec: Some(spec) });
        request.set_timeout(RPC_TIMEOUT);
        let status = match node.client()?.schedules_stub().put(request).await {
            Ok(_) => bail!("gRPC Put of {name} with {cron:?} / {zone:?} was accepted"),
            Err(status) => status,
        };
        ensure!(
            status.code() == tonic::Code::InvalidArgument && status.message().starts_with(named[0]),
            "gRPC Put of {name} with {cron:?} / {zone:?}: {status:?}, expected INVALID_ARGUMENT \
             naming {}",
            named[0]
        );
    }

    phase("cron list is unchanged");
    let after = schedule_specs(sandbox, &addr).await?;
    ensure!(after == before, "schedules changed: before {before:?}, after {after:?}");
    Ok(())
}

/// `cron list --output json` without what the ticker moves on its own.
async fn schedule_specs(sandbox: &Sandbox, addr: &str) -> Result<Vec<Value>> {
    let list =
        cli(sandbox, addr, &["cron", "list", "--output", "json"]).await?.success()?.json()?;
    let schedules = list.as_array().context("cron list is not a JSON array")?;
    Ok(schedules
        .iter()
        .map(|schedule| {
            let mut spec = schedule.clone();
            if let Some(object) = spec.as_object_mut() {
                for volatile in
                    ["history", "last_fired_bucket", "next_tick_ms", "fired_count", "skipped_count"]
                {
                    object.remove(volatile);
                }
            }
            spec
        })
        .collect())
}
