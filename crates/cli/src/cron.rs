//! `leasehold cron …`: schedules from the command line.

use std::process::ExitCode;

use leasehold_proto::v1;
use serde_json::{Value, json};

use crate::render::say;
use crate::{Connection, Output, render};

/// `leasehold cron` arguments.
#[derive(clap::Args, Debug)]
pub struct CronArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: CronCommand,
}

#[derive(clap::Subcommand, Debug)]
enum CronCommand {
    /// Create a schedule or replace its spec.
    #[command(after_help = "Examples:
  leasehold cron put nightly-backup --cron '0 3 * * *' --timezone Europe/Paris --command 'backup.sh'
  leasehold cron put heartbeat --cron '@every 30s' --queue pings --payload ping
  leasehold cron put rotate-logs --cron '@hourly' --command 'logrotate /etc/app.conf' --target each --tag web")]
    Put {
        /// Schedule name.
        name: String,
        /// Cron expression: 5 fields, 6 (seconds first), @hourly..., "@every 30s".
        #[arg(long)]
        cron: String,
        /// IANA timezone (default UTC).
        #[arg(long, default_value = "")]
        timezone: String,
        /// Shell command run by the built-in executor.
        #[arg(long, conflicts_with = "payload")]
        command: Option<String>,
        /// Payload of the job (for external workers).
        #[arg(long)]
        payload: Option<String>,
        /// Queue (with --command, default "exec", the built-in executor's;
        /// without one, required).
        #[arg(long)]
        queue: Option<String>,
        /// Tags of the job; with --target each, the node tags that must match.
        #[arg(long = "tag")]
        tags: Vec<String>,
        /// Priority of the job.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        priority: i32,
        /// Lease length of the job.
        #[arg(long)]
        lease_ttl_ms: Option<u64>,
        /// Attempts of the job.
        #[arg(long)]
        max_attempts: Option<u32>,
        /// skip: no new run while the previous is unfinished; allow.
        #[arg(long, default_value = "skip")]
        overlap: OverlapArg,
        /// coalesce, skip or all.
        #[arg(long, default_value = "coalesce")]
        catchup: CatchupArg,
        /// Coalesce: how recent a missed tick must be to still run.
        #[arg(long, default_value_t = 3_600_000)]
        catchup_window_ms: u64,
        /// All: most missed ticks run.
        #[arg(long, default_value_t = 10)]
        catchup_max: u32,
        /// any: one job anywhere; each: one job per matching node.
        #[arg(long, default_value = "any")]
        target: TargetArg,
        /// Create it paused.
        #[arg(long)]
        paused: bool,
    },
    /// Delete a schedule.
    #[command(after_help = "Examples:
  leasehold cron delete nightly-backup")]
    Delete {
        /// Schedule name.
        name: String,
    },
    /// Show a schedule.
    #[command(after_help = "Examples:
  leasehold cron get nightly-backup
  leasehold cron get nightly-backup --output json")]
    Get {
        /// Schedule name.
        name: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// List schedules.
    #[command(after_help = "Examples:
  leasehold cron list
  leasehold cron list --output json")]
    List {
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Pause a schedule (ticks are recorded as skipped).
    #[command(after_help = "Examples:
  leasehold cron pause nightly-backup")]
    Pause {
        /// Schedule name.
        name: String,
    },
    /// Resume a schedule from now (ticks due while it was paused are recorded as skipped).
    #[command(after_help = "Examples:
  leasehold cron resume nightly-backup")]
    Resume {
        /// Schedule name.
        name: String,
    },
    /// Run a schedule's job now (honours overlap unless --force).
    #[command(after_help = "Examples:
  leasehold cron trigger nightly-backup
  leasehold cron trigger nightly-backup --force")]
    Trigger {
        /// Schedule name.
        name: String,
        /// Run even if the previous instance is unfinished.
        #[arg(long)]
        force: bool,
    },
    /// Ticks fired, skipped (with reason) and late.
    #[command(after_help = "Examples:
  leasehold cron history nightly-backup
  leasehold cron history nightly-backup --output json")]
    History {
        /// Schedule name.
        name: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_show_as_put_takes_them() {
        let spec = v1::ScheduleSpec {
            overlap: v1::Overlap::Allow as i32,
            catchup: v1::Catchup::All as i32,
            target: v1::Target::Each as i32,
            template: Some(v1::JobTemplate {
                payload: b"report".to_vec(),
                priority: 3,
                max_attempts: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        };
        let shown = schedule_json(&v1::Schedule { spec: Some(spec), ..Default::default() });
        assert_eq!(
            (&shown["overlap"], &shown["catchup"], &shown["target"]),
            (&json!("allow"), &json!("all"), &json!("each"))
        );
        assert_eq!(shown["payload"], render::payload(b"report"));
        assert_eq!((&shown["priority"], &shown["max_attempts"]), (&json!(3), &json!(2)));
        use clap::ValueEnum;
        for shown in ["allow", "skip"] {
            assert!(OverlapArg::from_str(shown, false).is_ok(), "{shown}");
        }
        for shown in ["coalesce", "skip", "all"] {
            assert!(CatchupArg::from_str(shown, false).is_ok(), "{shown}");
        }
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum OverlapArg {
    Skip,
    Allow,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum CatchupArg {
    Coalesce,
    Skip,
    All,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum TargetArg {
    Any,
    Each,
}

fn tick_json(record: &v1::TickRecord) -> Value {
    json!({
        "bucket": record.bucket,
        "outcome": record.outcome,
        "job_ids": record.job_ids,
        "lag_ms": record.lag_ms,
        "skip_reason": record.skip_reason,
        "ticks": record.ticks,
        "late": record.late,
    })
}

fn schedule_json(schedule: &v1::Schedule) -> Value {
    let spec = schedule.spec.clone().unwrap_or_default();
    let template = spec.template.clone().unwrap_or_default();
    json!({
        "name": spec.name,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "command": template.command,
        "queue": template.queue,
        "tags": template.tags,
        // Without a command, the payload every job gets.
        "payload": template.command.is_none().then(|| render::payload(&template.payload)),
        "priority": template.priority,
        "lease_ttl_ms": template.lease_ttl_ms,
        "max_attempts": template.max_attempts,
        "overlap": flag_value(v1::Overlap::try_from(spec.overlap).map(|o| o.as_str_name())),
        "catchup": flag_value(v1::Catchup::try_from(spec.catchup).map(|c| c.as_str_name())),
        "catchup_window_ms": spec.catchup_window_ms,
        "catchup_max": spec.catchup_max,
        "target": flag_value(v1::Target::try_from(spec.target).map(|t| t.as_str_name())),
        "paused": spec.paused,
        "last_fired_bucket": schedule.last_fired_bucket,
        "next_tick_ms": schedule.next_tick_ms,
        "fired_count": schedule.fired_count,
        "skipped_count": schedule.skipped_count,
        "history": schedule.history.iter().map(tick_json).collect::<Vec<_>>(),
    })
}

/// A policy as `cron put` takes it (`OVERLAP_SKIP` → `skip`), so what
/// `cron get` shows can be put back; `unspecified` for a stored 0 (each
/// policy's default), `?` for a value this build does not know.
fn flag_value<E>(name: Result<&str, E>) -> String {
    match name {
        Ok(name) => name.split_once('_').map_or(name, |(_, value)| value).to_ascii_lowercase(),
        Err(_) => "?".to_string(),
    }
}

fn spec_timezone_empty(schedule: &v1::Schedule) -> bool {
    schedule.spec.as_ref().is_none_or(|spec| spec.timezone.is_empty())
}

/// `cron get` as text: the schedule's fields, then its newest ticks.
fn schedule_text(schedule: &v1::Schedule) -> String {
    let value = schedule_json(schedule);
    let text = |key: &str| match &value[key] {
        Value::String(s) if s.is_empty() => "-".to_string(),
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        Value::Array(items) if items.is_empty() => "-".to_string(),
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map_or(i.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    };
    let fields = [
        "name",
        "cron",
        "timezone",
        "command",
        "queue",
        "tags",
        "overlap",
        "catchup",
        "catchup_window_ms",
        "catchup_max",
        "target",
        "paused",
        "next_tick_ms",
        "last_fired_bucket",
        "fired_count",
        "skipped_count",
    ]
    .map(|key| match key {
        "timezone" if spec_timezone_empty(schedule) => (key, "UTC".to_string()),
        _ => (key, text(key)),
    });
    let mut out = render::fields_text(&fields);
    let newest: Vec<_> = schedule.history.iter().rev().take(5).rev().cloned().collect();
    if !newest.is_empty() {
        out.push_str("\nNewest ticks (all: cron history):\n");
        out.push_str(&render::ticks_text(&newest));
    }
    out
}

impl CronArgs {
    /// How this subcommand reaches a node.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Whether the subcommand writes (anything but a read).
    pub fn writes(&self) -> bool {
        !matches!(
            self.command,
            CronCommand::Get { .. } | CronCommand::List { .. } | CronCommand::History { .. }
        )
    }
}

/// Runs a cron subcommand.
pub async fn run(args: CronArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match args.command {
        CronCommand::Put {
            name,
            cron,
            timezone,
            command,
            payload,
            queue,
            tags,
            priority,
            lease_ttl_ms,
            max_attempts,
            overlap,
            catchup,
            catchup_window_ms,
            catchup_max,
            target,
            paused,
        } => {
            let spec = v1::ScheduleSpec {
                name: name.clone(),
                cron,
                timezone,
                template: Some(v1::JobTemplate {
                    queue,
                    payload: payload.map(String::into_bytes).unwrap_or_default(),
                    priority,
                    lease_ttl_ms,
                    max_attempts,
                    tags,
                    command,
                }),
                overlap: match overlap {
                    OverlapArg::Skip => v1::Overlap::Skip,
                    OverlapArg::Allow => v1::Overlap::Allow,
                } as i32,
                catchup: match catchup {
                    CatchupArg::Coalesce => v1::Catchup::Coalesce,
                    CatchupArg::Skip => v1::Catchup::Skip,
                    CatchupArg::All => v1::Catchup::All,
                } as i32,
                catchup_window_ms,
                catchup_max,
                target: match target {
                    TargetArg::Any => v1::Target::Any,
                    TargetArg::Each => v1::Target::Each,
                } as i32,
                paused,
            };
            client.put_schedule(spec).await?;
            say!("schedule {name} put");
        }
        CronCommand::Delete { name } => {
            client.delete_schedule(&name).await?;
            say!("schedule {name} deleted");
        }
        CronCommand::Get { name, output } => {
            let schedule = client.get_schedule(&name, false).await?;
            match output {
                Output::Json => render::print_json(&schedule_json(&schedule)),
                Output::Text => render::print_text(&schedule_text(&schedule)),
            }
        }
        CronCommand::List { output } => {
            let schedules = client.list_schedules(false).await?;
            match output {
                Output::Json => render::print_json(&json!(
                    schedules.iter().map(schedule_json).collect::<Vec<_>>()
                )),
                Output::Text => render::print_text(&render::schedules_text(&schedules)),
            }
        }
        CronCommand::Pause { name } => {
            client.pause_schedule(&name).await?;
            say!("schedule {name} paused");
        }
        CronCommand::Resume { name } => {
            client.resume_schedule(&name).await?;
            say!("schedule {name} resumed");
        }
        CronCommand::Trigger { name, force } => {
            // Retried on UNAVAILABLE under one request id: a retry after a
            // lost answer does not run the schedule twice.
            let reply = client.trigger(&name, force).await?;
            if reply.job_ids.is_empty() {
                say!("schedule {name} not run: {}", reply.skip_reason);
                return Ok(ExitCode::from(3));
            }
            say!("schedule {name} triggered: jobs {:?}", reply.job_ids);
        }
        CronCommand::History { name, output } => {
            let schedule = client.get_schedule(&name, false).await?;
            match output {
                Output::Json => render::print_json(&json!(
                    schedule.history.iter().map(tick_json).collect::<Vec<_>>()
                )),
                Output::Text => render::print_text(&render::ticks_text(&schedule.history)),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
