//! `leasehold cluster …`: cluster inspection.

use std::process::ExitCode;

use crate::render::say;
use crate::{Connection, Output, render};

/// `leasehold cluster` arguments.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand, Debug)]
enum ClusterCommand {
    /// Members, roles, leader and per-node progress.
    #[command(after_help = "Examples:
  leasehold cluster status
  leasehold cluster status --addr http://10.0.0.11:7070,http://10.0.0.12:7070
  leasehold cluster status --output json")]
    Status {
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Drain a node: it stops taking claims, lets running commands finish,
    /// releases what it holds, hands leadership over, and exits.
    #[command(after_help = "Examples:
  leasehold cluster drain 3")]
    Drain {
        /// The node's id.
        id: u64,
    },
    /// Remove a member (the leader included: it hands over once the change commits).
    #[command(after_help = "Examples:
  leasehold cluster remove 3")]
    Remove {
        /// The member's node id.
        id: u64,
    },
    /// Change a node's cutover-gate flags at run time (any member may be
    /// asked; it passes the change on). A change counts on every node from
    /// three heartbeat intervals after it is made.
    #[command(after_help = "Examples:
  leasehold cluster flags --node 2 --journal-lease on
  leasehold cluster flags --node 2 --dry-run off --output json")]
    Flags {
        /// The node whose flags change.
        #[arg(long = "node")]
        node: u64,
        /// Use the journal lease when every peer can: on or off.
        #[arg(long, value_parser = crate::serve::on_off)]
        journal_lease: Option<bool>,
        /// Stay on the bus and log the claims the journal would take: on or off.
        #[arg(long, value_parser = crate::serve::on_off)]
        dry_run: Option<bool>,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

impl ClusterArgs {
    /// How this subcommand reaches a node.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Whether the subcommand writes (anything but a read).
    pub fn writes(&self) -> bool {
        !matches!(self.command, ClusterCommand::Status { .. })
    }
}

/// Runs a cluster subcommand.
pub async fn run(args: ClusterArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match args.command {
        ClusterCommand::Status { output } => {
            let status = client.status().await?;
            match output {
                Output::Json => render::print_json(&render::status(&status)),
                Output::Text => render::print_text(&render::status_text(&status)),
            }
        }
        ClusterCommand::Drain { id } => {
            client.drain(id).await?;
            say!("node {id} is draining");
        }
        ClusterCommand::Flags { node, journal_lease, dry_run, output } => {
            if journal_lease.is_none() && dry_run.is_none() {
                anyhow::bail!("nothing to change: give --journal-lease and/or --dry-run");
            }
            let flags = client.set_flags(node, journal_lease, dry_run).await?;
            match output {
                Output::Json => render::print_json(&serde_json::json!({
                    "node": node,
                    "journal_lease": flags.journal_lease,
                    "dry_run": flags.dry_run,
                })),
                Output::Text => say!(
                    "node {node}: journal_lease={} dry_run={}",
                    on_off_name(flags.journal_lease),
                    on_off_name(flags.dry_run)
                ),
            }
        }
        ClusterCommand::Remove { id } => {
            let voters = client.remove_member(id).await?;
            say!("node {id} removed; voters now {voters:?}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn on_off_name(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}
