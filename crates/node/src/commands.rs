//! How the node runs a command: the built-in executor's jobs and the bus
//! path's cron ticks both go through a [`RunCommand`]. The node runs them
//! as child processes ([`Shell`]); a simulation gives its own, which
//! records each run on simulated time instead of starting a process.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use leasehold_client::exec::{self, CommandLine, Run};

/// A run of one command, as a future.
pub type Running<'a> = Pin<Box<dyn Future<Output = Run> + Send + 'a>>;

/// Runs one command to its end (or its timeout) and tells how it ended.
pub trait RunCommand: Send + Sync + Debug + 'static {
    /// Runs `command`.
    fn run<'a>(&'a self, command: &'a CommandLine) -> Running<'a>;
}

/// Commands as child processes under `sh -c` (what the node runs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Shell;

impl RunCommand for Shell {
    fn run<'a>(&'a self, command: &'a CommandLine) -> Running<'a> {
        Box::pin(exec::run(command, Vec::new()))
    }
}

/// The node's runner: [`Shell`].
pub fn shell() -> Arc<dyn RunCommand> {
    Arc::new(Shell)
}
