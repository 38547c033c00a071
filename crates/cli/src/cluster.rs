//! `leasehold cluster …`: cluster inspection.

use std::process::ExitCode;

use leasehold_client::Client;

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
    Status {
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Drain a node: it stops taking claims, lets running commands finish,
    /// releases what it holds, hands leadership over, and exits.
    Drain {
        /// The node's id.
        id: u64,
    },
    /// Remove a member (the leader included: it hands over once the change commits).
    Remove {
        /// The member's node id.
        id: u64,
    },
}

/// Runs a cluster subcommand.
pub async fn run(args: ClusterArgs) -> anyhow::Result<ExitCode> {
    let client = Client::connect(&args.connection.addr)?;
    match args.command {
        ClusterCommand::Status { output } => {
            let status = client.status().await?;
            match output {
                Output::Json => render::print_json(&render::status(&status)),
                Output::Text => {
                    println!("leader: {}", status.leader);
                    for node in &status.nodes {
                        println!(
                            "node {} {} role={} voter={} term={} commit={} applied={} digest={:016x}",
                            node.id,
                            node.addr,
                            node.role,
                            node.voter,
                            node.term,
                            node.commit_index,
                            node.applied_index,
                            node.digest
                        );
                    }
                }
            }
        }
        ClusterCommand::Drain { id } => {
            client.drain(id).await?;
            println!("node {id} is draining");
        }
        ClusterCommand::Remove { id } => {
            let voters = client.remove_member(id).await?;
            println!("node {id} removed; voters now {voters:?}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
