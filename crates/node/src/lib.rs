//! The composition root of a leasehold node: configuration, wiring of
//! storage, Raft, the replica runtime, the services and HTTP, the driver
//! (lease sweeps, tombstone purges, cron ticks), the built-in executor, the
//! bus tick, the cluster secret, and orderly shutdown (drain).
//!
//! Nothing depends on it but the `leasehold` binary; it decides nothing
//! core could decide, and, like every library here, it never prints: it
//! logs through `tracing`.
//!
//! [`Node::start`] takes the listeners it serves on ([`Transport`]), so tests
//! bind port 0 and a simulation can pass its own.

pub mod bus_tick;
pub mod commands;
pub mod config;
pub mod driver;
pub mod executor;
pub mod node;
pub mod secret;

pub use config::Config;
pub use node::{Node, NodeError, NodeHandle, Transport};
